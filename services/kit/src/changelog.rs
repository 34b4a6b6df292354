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

pub use crate::BoxError;

/// Why a changelog read failed.
#[derive(Debug, thiserror::Error)]
pub enum ChangelogError {
    #[error("{topic}: {source}")]
    Kafka { topic: String, source: KafkaError },
    #[error("reading {topic} partitions {open:?} did not reach the end within {deadline:?}")]
    Deadline {
        topic: String,
        open: BTreeSet<i32>,
        deadline: Duration,
    },
    /// A record the handler refused (it does not decode, it breaks a rule).
    #[error("{topic} {partition}@{offset}: {source}")]
    Record {
        topic: String,
        partition: i32,
        offset: i64,
        source: BoxError,
    },
}

fn kafka(topic: &str) -> impl FnOnce(KafkaError) -> ChangelogError + '_ {
    move |source| ChangelogError::Kafka {
        topic: topic.to_owned(),
        source,
    }
}

/// One record of a changelog as a restore sees it.
#[derive(Clone, Copy, Debug)]
pub struct Record<'a> {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<&'a [u8]>,
    /// `None`: a tombstone.
    pub payload: Option<&'a [u8]>,
}

/// A compacted topic a processor restores its state from.
pub trait Changelog: Send {
    fn topic(&self) -> &str;
    /// Hands every record of `partitions`, from the beginning to the current end,
    /// to `on_record`; the number of records read.
    fn read_to_end(
        &self,
        partitions: &BTreeSet<i32>,
        on_record: &mut dyn FnMut(Record<'_>) -> Result<(), BoxError>,
    ) -> Result<u64, ChangelogError>;
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
        on_record: &mut dyn FnMut(Record<'_>) -> Result<(), BoxError>,
    ) -> Result<u64, ChangelogError> {
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
        on_record: &mut dyn FnMut(Record<'_>) -> Result<(), BoxError>,
    ) -> Result<u64, ChangelogError> {
        let records = self
            .records
            .lock()
            .map_or_else(|p| p.into_inner().clone(), |r| r.clone());
        let mut read = 0;
        for (offset, (partition, key, payload)) in records.iter().enumerate() {
            if partitions.contains(partition) {
                read += 1;
                on_record(Record {
                    partition: *partition,
                    offset: offset as i64,
                    key: Some(key),
                    payload: payload.as_deref(),
                })
                .map_err(|source| ChangelogError::Record {
                    topic: self.topic.clone(),
                    partition: *partition,
                    offset: offset as i64,
                    source,
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
    mut on_record: impl FnMut(&BorrowedMessage<'_>) -> Result<(), BoxError>,
) -> Result<u64, ChangelogError> {
    if partitions.is_empty() {
        return Ok(0);
    }
    let consumer = crate::kafka::reader(config).map_err(kafka(topic))?;
    let mut tpl = TopicPartitionList::new();
    for p in partitions {
        tpl.add_partition_offset(topic, *p, Offset::Beginning)
            .map_err(kafka(topic))?;
    }
    consumer.assign(&tpl).map_err(kafka(topic))?;
    let mut open = partitions.clone();
    let mut records = 0u64;
    let until = Instant::now() + deadline;
    while !open.is_empty() {
        if Instant::now() > until {
            return Err(ChangelogError::Deadline {
                topic: topic.to_owned(),
                open,
                deadline,
            });
        }
        crate::health::progress();
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                open.remove(&p);
            }
            Some(Err(e)) => return Err(kafka(topic)(e)),
            Some(Ok(msg)) => {
                records += 1;
                on_record(&msg).map_err(|source| ChangelogError::Record {
                    topic: topic.to_owned(),
                    partition: msg.partition(),
                    offset: msg.offset(),
                    source,
                })?;
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
) -> Result<(), ChangelogError> {
    let consumer = crate::kafka::reader(config).map_err(kafka(topic))?;
    let md = consumer
        .fetch_metadata(Some(topic), timeout)
        .map_err(kafka(topic))?;
    let count = md.topics().first().map_or(0, |t| t.partitions().len()) as i32;
    let mut tpl = TopicPartitionList::new();
    for p in 0..count {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .map_err(kafka(topic))?;
    }
    consumer.assign(&tpl).map_err(kafka(topic))?;
    let mut behind: BTreeSet<i32> = (0..count).collect();
    if behind.is_empty() {
        on_caught_up();
    }
    while !stop.load(Ordering::Relaxed) {
        if !behind.is_empty() {
            crate::health::progress();
        }
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
