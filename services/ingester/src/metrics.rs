//! The ingester's metric names, in one place for the dashboards and alerts.

pub const ACCEPTED_TOTAL: &str = "sluice_ingester_http_accepted_total";
pub const HTTP_REJECTED_TOTAL: &str = "sluice_ingester_http_rejected_total";
pub const HOOK_EVENTS_TOTAL: &str = "sluice_ingester_hook_events_total";
pub const POLL_EMITTED_TOTAL: &str = "sluice_ingester_poll_emitted_total";
pub const POLL_ERRORS_TOTAL: &str = "sluice_ingester_poll_errors_total";
pub const POLL_TABLES: &str = "sluice_ingester_poll_tables";
pub const POLL_TABLES_INVALID: &str = "sluice_ingester_poll_tables_invalid";

pub fn describe() {
    metrics::describe_counter!(
        ACCEPTED_TOTAL,
        "Events accepted over HTTP (acknowledged by the broker), by path"
    );
    metrics::describe_counter!(HTTP_REJECTED_TOTAL, "HTTP requests refused, by status code");
    metrics::describe_counter!(
        HOOK_EVENTS_TOTAL,
        "Events read from commit-hook topics, by topic"
    );
    metrics::describe_counter!(
        POLL_EMITTED_TOTAL,
        "Events a metadata poller emitted (the state did not hold them when it polled), by format"
    );
    metrics::describe_counter!(
        POLL_ERRORS_TOTAL,
        "Polls that failed (unreadable or half-written metadata), by format"
    );
    metrics::describe_gauge!(POLL_TABLES, "Tables polled (bootstrap and declared)");
    metrics::describe_gauge!(
        POLL_TABLES_INVALID,
        "Declared tables left out: not valid here (e.g. a token variable this ingester lacks)"
    );
}
