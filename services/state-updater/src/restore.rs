//! Restore: rebuild the states of newly assigned partitions from the asset-state
//! changelog before any of their events is folded.
//!
//! asset-events and asset-state are co-partitioned (same key, same partition count,
//! same partitioner), so asset-events partition p restores from asset-state
//! partition p only: a restore reads just what the instance owns.

use std::collections::BTreeSet;

use foldhash::{HashMap, HashMapExt};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::message::Message;
use sluice_core::AssetKey;
use sluice_kit::changelog::read_to_end;
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
    pub fn new(config: ClientConfig, topic: String, timeout: Duration) -> Self {
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
        let records = read_to_end(
            &self.config,
            &self.topic,
            partitions,
            self.timeout * 10,
            |msg| {
                let Some(key) = msg.key().and_then(|k| std::str::from_utf8(k).ok()) else {
                    tracing::warn!(
                        partition = msg.partition(),
                        offset = msg.offset(),
                        "asset-state record without a UTF-8 key; skipped"
                    );
                    return Ok(());
                };
                let Ok(key) = AssetKey::parse(key) else {
                    tracing::warn!(
                        partition = msg.partition(),
                        offset = msg.offset(),
                        key,
                        "asset-state record with an invalid key; skipped"
                    );
                    return Ok(());
                };
                let Some(payload) = msg.payload() else {
                    out.remove(&key);
                    return Ok(());
                };
                let at = || format!("asset-state {}@{}", msg.partition(), msg.offset());
                let record: StateRecord = runtime
                    .block_on(codec.decode(SchemaName::AssetState, payload))
                    .map_err(|e| format!("{}: {e}", at()))?;
                let (state, revision) =
                    record.into_state().map_err(|e| format!("{}: {e}", at()))?;
                out.insert(
                    key,
                    Entry {
                        state,
                        revision,
                        partition: msg.partition(),
                    },
                );
                Ok(())
            },
        )?;
        metrics::counter!(m::RESTORED_RECORDS_TOTAL).increment(records);
        metrics::histogram!(m::RESTORE_SECONDS).record(started.elapsed().as_secs_f64());
        Ok(out)
    }
}
