//! Reading compacted changelog partitions to their end: state restore on
//! assignment (state-updater, resolver) is the same loop with another decoder.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// Reads `partitions` of `topic` from the beginning to their end (the last stable
/// offset under `read_committed`), handing each record to `on_record`. The read
/// fails if it has not reached the end within `deadline`, or if `on_record` fails.
pub fn read_to_end(
    config: &ClientConfig,
    topic: &str,
    partitions: &BTreeSet<i32>,
    deadline: Duration,
    mut on_record: impl FnMut(&BorrowedMessage<'_>) -> Result<(), String>,
) -> Result<u64, String> {
    if partitions.is_empty() {
        return Ok(0);
    }
    let consumer = crate::kafka::reader(config).map_err(|e| format!("{topic} reader: {e}"))?;
    let mut tpl = TopicPartitionList::new();
    for p in partitions {
        tpl.add_partition_offset(topic, *p, Offset::Beginning)
            .map_err(|e| e.to_string())?;
    }
    consumer
        .assign(&tpl)
        .map_err(|e| format!("{topic} assign: {e}"))?;
    let mut open = partitions.clone();
    let mut records = 0u64;
    let until = Instant::now() + deadline;
    while !open.is_empty() {
        if Instant::now() > until {
            return Err(format!(
                "reading {topic} partitions {open:?} did not reach the end within {deadline:?}"
            ));
        }
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                open.remove(&p);
            }
            Some(Err(e)) => return Err(format!("{topic} read: {e}")),
            Some(Ok(msg)) => {
                records += 1;
                on_record(&msg)?;
            }
        }
    }
    Ok(records)
}

/// Follows every partition of `topic` from the beginning until `stop` (a blocking
/// loop, for a table every instance reads whole): `on_record` for each record,
/// `on_caught_up` once, when every partition first reached its end. Read errors
/// are logged and the read goes on (the client reconnects by itself).
pub fn follow(
    config: &ClientConfig,
    topic: &str,
    timeout: Duration,
    stop: &AtomicBool,
    mut on_caught_up: impl FnMut(),
    mut on_record: impl FnMut(&BorrowedMessage<'_>),
) -> Result<(), String> {
    let consumer = crate::kafka::reader(config).map_err(|e| e.to_string())?;
    let md = consumer
        .fetch_metadata(Some(topic), timeout)
        .map_err(|e| format!("metadata of {topic}: {e}"))?;
    let count = md.topics().first().map_or(0, |t| t.partitions().len()) as i32;
    let mut tpl = TopicPartitionList::new();
    for p in 0..count {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .map_err(|e| e.to_string())?;
    }
    consumer
        .assign(&tpl)
        .map_err(|e| format!("{topic} assign: {e}"))?;
    let mut behind: BTreeSet<i32> = (0..count).collect();
    if behind.is_empty() {
        on_caught_up();
    }
    while !stop.load(Ordering::Relaxed) {
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) if behind.remove(&p) && behind.is_empty() => {
                on_caught_up();
            }
            Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Err(e)) => tracing::warn!(topic, error = %e, "read error"),
            Some(Ok(msg)) => on_record(&msg),
        }
    }
    Ok(())
}
