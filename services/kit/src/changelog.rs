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

/// The newest record of each key of a changelog read, kept undecoded.
///
/// Until the broker compacts it, a changelog's head holds every revision of a busy
/// key; a restore that decodes only the newest of each decodes each key once. A
/// record a newer one replaces is never decoded, so it cannot fail the restore
/// either: nothing would have kept it.
#[derive(Default)]
pub struct NewestByKey {
    newest: foldhash::HashMap<Box<[u8]>, Newest>,
}

struct Newest {
    partition: i32,
    offset: i64,
    tombstone: bool,
    /// Reused by the next revision of the key: most are as long.
    payload: Vec<u8>,
}

impl NewestByKey {
    /// Keeps `r` if it is the newest of its key so far (records are handed in
    /// offset order per partition, and a key lives on one partition). A record
    /// without a key names nothing: false, for the caller to report.
    pub fn keep(&mut self, r: Record<'_>) -> bool {
        let Some(key) = r.key else {
            return false;
        };
        let value = r.payload.unwrap_or_default();
        match self.newest.get_mut(key) {
            Some(slot) => {
                slot.partition = r.partition;
                slot.offset = r.offset;
                slot.tombstone = r.payload.is_none();
                slot.payload.clear();
                slot.payload.extend_from_slice(value);
            }
            None => {
                let newest = Newest {
                    partition: r.partition,
                    offset: r.offset,
                    tombstone: r.payload.is_none(),
                    payload: value.to_vec(),
                };
                self.newest.insert(Box::from(key), newest);
            }
        }
        true
    }

    /// Keys kept.
    pub fn len(&self) -> usize {
        self.newest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.newest.is_empty()
    }

    /// Maps each key's newest record with `f` on up to `threads` threads (a
    /// restore's decode, once its read is done and the broker idle: ~15 % of a
    /// state-updater restore on one core); what `f` keeps, in no particular
    /// order. The first error any thread meets is the answer.
    pub fn par_map<T: Send, E: Send>(
        self,
        threads: usize,
        f: impl Fn(Record<'_>) -> Result<Option<T>, E> + Sync,
    ) -> Result<Vec<T>, E> {
        let entries: Vec<(Box<[u8]>, Newest)> = self.newest.into_iter().collect();
        let chunk = entries.len().div_ceil(threads.max(1)).max(1);
        let map = |part: &[(Box<[u8]>, Newest)]| -> Result<Vec<T>, E> {
            let mut out = Vec::with_capacity(part.len());
            for (key, n) in part {
                out.extend(f(Record {
                    partition: n.partition,
                    offset: n.offset,
                    key: Some(key),
                    payload: (!n.tombstone).then_some(&n.payload[..]),
                })?);
            }
            Ok(out)
        };
        let parts: Vec<Result<Vec<T>, E>> = std::thread::scope(|scope| {
            let mut chunks = entries.chunks(chunk);
            let first = chunks.next();
            let others: Vec<_> = chunks.map(|c| scope.spawn(move || map(c))).collect();
            let mut parts = vec![first.map_or_else(|| Ok(Vec::new()), map)];
            parts.extend(
                others
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))),
            );
            parts
        });
        let mut out = Vec::with_capacity(entries.len());
        for part in parts {
            out.extend(part?);
        }
        Ok(out)
    }

    /// Hands each key's newest record to `f`, in no particular order.
    pub fn for_each<E>(self, mut f: impl FnMut(Record<'_>) -> Result<(), E>) -> Result<(), E> {
        for (key, n) in self.newest {
            f(Record {
                partition: n.partition,
                offset: n.offset,
                key: Some(&key),
                payload: (!n.tombstone).then_some(&n.payload[..]),
            })?;
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn record<'a>(offset: i64, key: Option<&'a [u8]>, payload: Option<&'a [u8]>) -> Record<'a> {
        Record {
            partition: 1,
            offset,
            key,
            payload,
        }
    }

    #[test]
    fn only_the_newest_record_of_each_key_is_handed_on() {
        let mut newest = NewestByKey::default();
        assert!(newest.keep(record(0, Some(b"a"), Some(b"a-long-first-revision"))));
        assert!(newest.keep(record(1, Some(b"b"), Some(b"b1"))));
        assert!(newest.keep(record(2, Some(b"a"), Some(b"a2"))));
        assert!(newest.keep(record(3, Some(b"b"), None)));
        assert!(!newest.keep(record(4, None, Some(b"nameless"))));
        assert_eq!(newest.len(), 2);
        let mut seen = Vec::new();
        newest
            .for_each(|r| {
                seen.push((
                    r.key.map(<[u8]>::to_vec),
                    r.offset,
                    r.payload.map(<[u8]>::to_vec),
                ));
                Ok::<(), ()>(())
            })
            .expect("no failure");
        seen.sort();
        assert_eq!(
            seen,
            vec![
                (Some(b"a".to_vec()), 2, Some(b"a2".to_vec())),
                (Some(b"b".to_vec()), 3, None),
            ]
        );
    }

    /// Every kept record is mapped once whatever the threads; what `f` drops is
    /// dropped; an error on any thread is the answer.
    #[test]
    fn newest_records_are_mapped_on_threads() {
        let keys: Vec<Vec<u8>> = (0..1_000)
            .map(|i: i32| i.to_string().into_bytes())
            .collect();
        let fill = || {
            let mut newest = NewestByKey::default();
            for (i, k) in keys.iter().enumerate() {
                newest.keep(record(i as i64, Some(k), Some(k)));
            }
            newest
        };
        for threads in [1, 2, 3, 8] {
            let mut got = fill()
                .par_map(threads, |r| {
                    let n: i64 = std::str::from_utf8(r.payload.unwrap_or_default())
                        .expect("utf-8")
                        .parse()
                        .expect("n");
                    Ok::<_, ()>((n % 10 != 0).then_some(n))
                })
                .expect("no failure");
            got.sort();
            let want: Vec<i64> = (0..1_000).filter(|n| n % 10 != 0).collect();
            assert_eq!(got, want, "{threads} threads");
        }
        let failed = fill().par_map(3, |r| {
            if r.offset == 777 {
                Err(r.offset)
            } else {
                Ok(Some(()))
            }
        });
        assert_eq!(failed.err(), Some(777));
        assert!(
            NewestByKey::default()
                .par_map(2, |_| Ok::<Option<()>, ()>(None))
                .expect("empty")
                .is_empty()
        );
    }

    #[test]
    fn an_empty_value_is_not_a_tombstone() {
        let mut newest = NewestByKey::default();
        newest.keep(record(0, Some(b"a"), Some(b"")));
        let mut payload = None;
        let _ = newest.for_each(|r| {
            payload = r.payload.map(<[u8]>::to_vec);
            Ok::<(), ()>(())
        });
        assert_eq!(payload, Some(Vec::new()));
    }
}
