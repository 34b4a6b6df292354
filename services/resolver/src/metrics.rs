//! The resolver's metrics (the shared loop's are in `sluice_kit::metrics`).

pub const EVALUATIONS_TOTAL: &str = "sluice_resolver_evaluations_total";
pub const TRIGGERS_TOTAL: &str = "sluice_resolver_triggers_total";
pub const SUPPRESSED_TOTAL: &str = "sluice_resolver_duplicates_suppressed_total";
pub const SPECS_REFUSED_TOTAL: &str = "sluice_resolver_specs_refused_total";
pub const WITHHELD_BY_GRANTS_TOTAL: &str = "sluice_resolver_withheld_by_grants_total";
pub const WITHHELD_BY_PAUSE_TOTAL: &str = "sluice_resolver_withheld_by_pause_total";
pub const DEPENDENCIES: &str = "sluice_resolver_dependencies";
pub const TABLE_RESTORE_SECONDS: &str = "sluice_resolver_table_restore_seconds";
pub const TABLE_UNREADABLE_TOTAL: &str = "sluice_resolver_table_unreadable_total";

pub fn describe() {
    metrics::describe_counter!(
        EVALUATIONS_TOTAL,
        "Dependency evaluations (one per dependency reading a changed asset, timer or re-check)"
    );
    metrics::describe_counter!(TRIGGERS_TOTAL, "Trigger requests produced");
    metrics::describe_counter!(
        SUPPRESSED_TOTAL,
        "Fires whose trigger_key equalled the dependency's last one and were not sent again"
    );
    metrics::describe_counter!(
        SPECS_REFUSED_TOTAL,
        "Dependency specs found on the topic and refused (invalid, or a cycle)"
    );
    metrics::describe_counter!(
        WITHHELD_BY_GRANTS_TOTAL,
        "Evaluations skipped because no grant lets the dependency's project read an input or trigger its target"
    );
    metrics::describe_counter!(
        WITHHELD_BY_PAUSE_TOTAL,
        "Triggers a paused dependency would have fired (withheld; a resume fires the newest once)"
    );
    metrics::describe_gauge!(DEPENDENCIES, "Dependencies owned by this instance");
    metrics::describe_histogram!(
        TABLE_RESTORE_SECONDS,
        "Time for the global asset-state table to catch up at start"
    );
    metrics::describe_counter!(
        TABLE_UNREADABLE_TOTAL,
        "asset-state records the resolver could not decode (skipped, logged)"
    );
}
