//! The dispatcher's metrics.

pub const TRIGGERS_RECORDED_TOTAL: &str = "sluice_dispatcher_triggers_recorded_total";
pub const TRIGGERS_DUPLICATE_TOTAL: &str = "sluice_dispatcher_triggers_duplicate_total";
pub const TRIGGERS_DEAD_LETTERED_TOTAL: &str = "sluice_dispatcher_triggers_dead_lettered_total";
pub const SENDS_TOTAL: &str = "sluice_dispatcher_sends_total";
pub const SENDS_WITHHELD_TOTAL: &str = "sluice_dispatcher_sends_withheld_total";
pub const SWEPT_TOTAL: &str = "sluice_dispatcher_deadline_swept_total";
pub const BACKFILL_CANCELLED_TOTAL: &str = "sluice_dispatcher_backfill_cancelled_total";
pub const RECONCILED_TOTAL: &str = "sluice_dispatcher_reconciled_total";
pub const TRANSITIONS_LOST_TOTAL: &str = "sluice_dispatcher_transitions_lost_total";
pub const TRANSITIONS_PER_STATEMENT: &str = "sluice_dispatcher_transitions_per_statement";
pub const UNROUTABLE_TOTAL: &str = "sluice_dispatcher_unroutable_total";
pub const RUNS_PUBLISHED_TOTAL: &str = "sluice_dispatcher_runs_published_total";
pub const TARGETS: &str = "sluice_dispatcher_targets";
pub const TARGETS_INVALID: &str = "sluice_dispatcher_targets_invalid";
pub const COMMIT_TO_DISPATCH_SECONDS: &str = "sluice_dispatcher_commit_to_dispatch_seconds";

pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_gauge!(TARGETS, "Targets in force (bootstrap and declared)");
    describe_gauge!(
        TARGETS_INVALID,
        "Declared targets left out: not valid here (a secret reference this dispatcher cannot look up)"
    );
    describe_counter!(
        TRIGGERS_RECORDED_TOTAL,
        "Trigger keys seen for the first time (one job each)"
    );
    describe_counter!(
        TRIGGERS_DUPLICATE_TOTAL,
        "Trigger records whose key was already recorded (absorbed by the unique key)"
    );
    describe_counter!(
        TRIGGERS_DEAD_LETTERED_TOTAL,
        "Undecodable or malformed trigger records sent to the dead-letter topic"
    );
    describe_counter!(
        SENDS_TOTAL,
        "Sends to targets, by kind and outcome (accepted, failed, refused, unknown)"
    );
    describe_counter!(
        SENDS_WITHHELD_TOTAL,
        "Claimed jobs not sent because the pre-send check found them moved (or could not be made)"
    );
    describe_counter!(SWEPT_TOTAL, "RUNNING jobs past their deadline made UNKNOWN");
    describe_counter!(
        BACKFILL_CANCELLED_TOTAL,
        "PENDING jobs of cancelled backfills made CANCELLED"
    );
    describe_counter!(
        RECONCILED_TOTAL,
        "UNKNOWN jobs settled by asking the target"
    );
    describe_counter!(
        TRANSITIONS_LOST_TOTAL,
        "Transitions refused by the compare-and-set (the job had moved)"
    );
    describe_histogram!(
        TRANSITIONS_PER_STATEMENT,
        "Job transitions recorded together by one statement (group commit)"
    );
    describe_counter!(
        UNROUTABLE_TOTAL,
        "Job checks postponed because no target is configured for them"
    );
    describe_counter!(
        RUNS_PUBLISHED_TOTAL,
        "Job transitions published to the runs topic"
    );
    describe_histogram!(
        COMMIT_TO_DISPATCH_SECONDS,
        "From the newest input's commit to the send"
    );
}
