//! Metric names are an API: constants here, described once at start-up.
//! Labels are bounded (a topic or a reason), never a key or an offset.

pub const RECORDS_PROCESSED_TOTAL: &str = "sluice_records_processed_total";
pub const DEAD_LETTERS_TOTAL: &str = "sluice_dead_letters_total";
pub const TXN_COMMITTED_TOTAL: &str = "sluice_transactions_committed_total";
pub const TXN_ABORTED_TOTAL: &str = "sluice_transactions_aborted_total";
pub const CONSUMERS_REBUILT_TOTAL: &str = "sluice_consumers_rebuilt_total";
pub const TXN_RECORDS: &str = "sluice_transaction_records";
pub const TXN_COMMIT_SECONDS: &str = "sluice_transaction_commit_seconds";
pub const SERVICE_INFO: &str = "sluice_service_info";

/// Describes the shared metrics (services add their own).
pub fn describe() {
    metrics::describe_counter!(RECORDS_PROCESSED_TOTAL, "Input records processed");
    metrics::describe_counter!(
        DEAD_LETTERS_TOTAL,
        "Records sent to the dead-letter topic, by origin topic"
    );
    metrics::describe_counter!(TXN_COMMITTED_TOTAL, "Kafka transactions committed");
    metrics::describe_counter!(
        TXN_ABORTED_TOTAL,
        "Kafka transactions aborted (batch replayed)"
    );
    metrics::describe_counter!(
        CONSUMERS_REBUILT_TOTAL,
        "Group consumers rebuilt after a fatal consumer error (e.g. a static member fenced after its session timed out)"
    );
    metrics::describe_histogram!(TXN_RECORDS, "Input records per committed transaction");
    metrics::describe_histogram!(
        TXN_COMMIT_SECONDS,
        metrics::Unit::Seconds,
        "Time to commit a transaction: its offsets, its records' acknowledgements and the commit"
    );
    metrics::describe_gauge!(SERVICE_INFO, "1, labelled with the service and its version");
}
