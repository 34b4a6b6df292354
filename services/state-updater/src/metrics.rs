//! The state-updater's metrics (the shared loop's are in `sluice_kit::metrics`).

pub const STATES_PUBLISHED_TOTAL: &str = "sluice_state_updates_published_total";
pub const EVENTS_UNCHANGED_TOTAL: &str = "sluice_state_events_unchanged_total";
pub const COMMITS_FIRST_SEEN_TOTAL: &str = "sluice_state_commits_first_seen_total";
pub const ASSETS: &str = "sluice_state_assets";
pub const RESTORED_RECORDS_TOTAL: &str = "sluice_state_restored_records_total";
pub const RESTORE_SECONDS: &str = "sluice_state_restore_seconds";

pub fn describe() {
    metrics::describe_counter!(
        STATES_PUBLISHED_TOTAL,
        "Changed asset states published to asset-state"
    );
    metrics::describe_counter!(
        EVENTS_UNCHANGED_TOTAL,
        "Events that changed nothing, by reason (duplicate, not_newer, too_late)"
    );
    metrics::describe_counter!(
        COMMITS_FIRST_SEEN_TOTAL,
        "Commits counted, by the path whose copy reached the fold first (push, kafka_hook, cdc, \
         poll: source=\"poll\" is what a poll found before any push)"
    );
    metrics::describe_gauge!(ASSETS, "Assets held by this instance");
    metrics::describe_counter!(
        RESTORED_RECORDS_TOTAL,
        "asset-state records read while restoring"
    );
    metrics::describe_histogram!(
        RESTORE_SECONDS,
        "Time to restore the states of newly assigned partitions"
    );
}
