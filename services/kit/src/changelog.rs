//! Reading compacted changelog partitions to their end: state restore on
//! assignment (state-updater, resolver) is the same loop with another decoder.
//!
//! A restore reads through the [`Changelog`] trait: [`KafkaChangelog`] in a
//! service, [`MemoryChangelog`] in a unit test, so a processor's restore and its
//! commit / abort bookkeeping are tested without a broker.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// One record of a changelog as a restore sees it.
#[derive(Clone, Copy, Debug)]
pub struct Record<'a> {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<&'a [u8]>,
    /// `None`: a tombstone.
    pub payload: Option<&'a [u8]>,
}

impl Record<'_> {
    /// Where the record is, for an error message: `topic partition@offset`.
    pub fn at(&self, topic: &str) -> String {
        format!("{topic} {}@{}", self.partition, self.offset)
    }
}

/// A compacted topic a processor restores its state from.
pub trait Changelog: Send {
    fn topic(&self) -> &str;
    /// Hands every record of `partitions`, from the beginning to the current end,
    /// to `on_record`; the number of records read.
    fn read_to_end(
        &self,
        partitions: &BTreeSet<i32>,
        on_record: &mut dyn FnMut(Record<'_>) -> Result<(), String>,
    ) -> Result<u64, String>;
}

/// A changelog topic on the broker.
pub struct KafkaChangelog {
    config: ClientConfig,
    topic: String,
    deadline: Duration,
}

impl KafkaChangelog {
    /// `deadline`: how long a restore may take before it fails (and is retried).
    pub fn new(config: ClientConfig, topic: String, deadline: Duration) -> Self {
        KafkaChangelog {
            config,
            topic,
            deadline,
        }
    }
}

impl Changelog for KafkaChangelog {
    fn topic(&self) -> &str {
        &self.topic
    }

    fn read_to_end(
        &self,
        partitions: &BTreeSet<i32>,
        on_record: &mut dyn FnMut(Record<'_>) -> Result<(), String>,
    ) -> Result<u64, String> {
        read_to_end(
            &self.config,
            &self.topic,
            partitions,
            self.deadline,
            |msg| {
                on_record(Record {
                    partition: msg.partition(),
                    offset: msg.offset(),
                    key: msg.key(),
                    payload: msg.payload(),
                })
            },
        )
    }
}

/// partition, key, value (`None`: a tombstone).
type MemoryRecord = (i32, Vec<u8>, Option<Vec<u8>>);

/// An in-memory changelog for unit tests: records appended by the test (or by the
/// processor's committed outputs) and read back in order, partition by partition.
#[derive(Clone, Default)]
pub struct MemoryChangelog {
    topic: String,
    records: Arc<Mutex<Vec<MemoryRecord>>>,
}

impl MemoryChangelog {
    pub fn new(topic: &str) -> Self {
        MemoryChangelog {
            topic: topic.to_owned(),
            records: Arc::default(),
        }
    }

    pub fn append(&self, partition: i32, key: &[u8], payload: Option<&[u8]>) {
        if let Ok(mut r) = self.records.lock() {
            r.push((partition, key.to_vec(), payload.map(<[u8]>::to_vec)));
        }
    }
}

impl Changelog for MemoryChangelog {
    fn topic(&self) -> &str {
        &self.topic
    }

    fn read_to_end(
        &self,
        partitions: &BTreeSet<i32>,
        on_record: &mut dyn FnMut(Record<'_>) -> Result<(), String>,
    ) -> Result<u64, String> {
        let records = self
            .records
            .lock()
            .map_err(|_| "memory changelog poisoned".to_owned())?
            .clone();
        let mut read = 0;
        for (offset, (partition, key, payload)) in records.iter().enumerate() {
            if partitions.contains(partition) {
                read += 1;
                on_record(Record {
                    partition: *partition,
                    offset: offset as i64,
                    key: Some(key),
                    payload: payload.as_deref(),
                })?;
            }
        }
        Ok(read)
    }
}

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
