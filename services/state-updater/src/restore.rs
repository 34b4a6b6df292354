//! Restore: rebuild the states of newly assigned partitions from the asset-state
//! changelog before any of their events is folded.
//!
//! asset-events and asset-state are co-partitioned (same key, same partition count,
//! same partitioner), so asset-events partition p restores from asset-state
//! partition p only: a restore reads just what the instance owns.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use sluice_core::AssetKey;
use sluice_kit::wire::StateRecord;
use sluice_kit::{Codec, SchemaName};

use crate::fold::Entry;
use crate::metrics as m;

pub struct Restorer {
    config: ClientConfig,
    topic: String,
    timeout: Duration,
}

impl Restorer {
    pub fn new(mut config: ClientConfig, topic: String, timeout: Duration) -> Self {
        config.set("enable.partition.eof", "true");
        Restorer {
            config,
            topic,
            timeout,
        }
    }

    /// The latest committed state of every asset on `partitions`.
    pub fn restore(
        &self,
        runtime: &tokio::runtime::Handle,
        codec: &Codec,
        partitions: &BTreeSet<i32>,
    ) -> Result<HashMap<AssetKey, Entry>, String> {
        let mut out = HashMap::new();
        if partitions.is_empty() {
            return Ok(out);
        }
        let started = Instant::now();
        let consumer: BaseConsumer = self
            .config
            .create()
            .map_err(|e| format!("restore consumer: {e}"))?;
        let mut tpl = TopicPartitionList::new();
        for p in partitions {
            tpl.add_partition_offset(&self.topic, *p, Offset::Beginning)
                .map_err(|e| e.to_string())?;
        }
        consumer
            .assign(&tpl)
            .map_err(|e| format!("restore assign: {e}"))?;
        let mut open: BTreeSet<i32> = partitions.clone();
        let mut records = 0u64;
        let deadline = Instant::now() + self.timeout * 10;
        while !open.is_empty() {
            if Instant::now() > deadline {
                return Err(format!(
                    "restore of {} partitions {open:?} did not reach the end",
                    self.topic
                ));
            }
            match consumer.poll(Duration::from_millis(100)) {
                None => {}
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    open.remove(&p);
                }
                Some(Err(e)) => return Err(format!("restore read: {e}")),
                Some(Ok(msg)) => {
                    records += 1;
                    let Some(key) = msg.key().and_then(|k| std::str::from_utf8(k).ok()) else {
                        tracing::warn!(
                            partition = msg.partition(),
                            offset = msg.offset(),
                            "asset-state record without a UTF-8 key; skipped"
                        );
                        continue;
                    };
                    let Ok(key) = AssetKey::parse(key) else {
                        tracing::warn!(
                            partition = msg.partition(),
                            offset = msg.offset(),
                            key,
                            "asset-state record with an invalid key; skipped"
                        );
                        continue;
                    };
                    let Some(payload) = msg.payload() else {
                        out.remove(&key);
                        continue;
                    };
                    let record: StateRecord = runtime
                        .block_on(codec.decode(SchemaName::AssetState, payload))
                        .map_err(|e| {
                            format!("asset-state {}@{}: {e}", msg.partition(), msg.offset())
                        })?;
                    let (state, revision) = record.into_state().map_err(|e| {
                        format!("asset-state {}@{}: {e}", msg.partition(), msg.offset())
                    })?;
                    out.insert(
                        key,
                        Entry {
                            state,
                            revision,
                            partition: msg.partition(),
                        },
                    );
                }
            }
        }
        metrics::counter!(m::RESTORED_RECORDS_TOTAL).increment(records);
        metrics::histogram!(m::RESTORE_SECONDS).record(started.elapsed().as_secs_f64());
        Ok(out)
    }
}
