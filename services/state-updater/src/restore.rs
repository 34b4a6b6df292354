//! Restore: rebuild the states of newly assigned partitions from the asset-state
//! changelog before any of their events is folded.
//!
//! asset-events and asset-state are co-partitioned (same key, same partition count,
//! same partitioner), so asset-events partition p restores from asset-state
//! partition p only: a restore reads just what the instance owns.

use std::collections::BTreeSet;
use std::time::Instant;

use foldhash::{HashMap, HashMapExt};

use sluice_core::AssetKey;
use sluice_kit::changelog::{Changelog, ChangelogError};
use sluice_kit::wire::StateRecord;
use sluice_kit::{BlockingCodec, SchemaName};

use crate::fold::Entry;
use crate::metrics as m;

/// The latest committed state of every asset on `partitions`.
pub fn restore(
    changelog: &dyn Changelog,
    codec: &BlockingCodec,
    partitions: &BTreeSet<i32>,
) -> Result<HashMap<AssetKey, Entry>, ChangelogError> {
    let mut out = HashMap::new();
    if partitions.is_empty() {
        return Ok(out);
    }
    let started = Instant::now();
    let topic = changelog.topic();
    let records = changelog.read_to_end(partitions, &mut |r| {
        let Some(key) = r.key.and_then(|k| std::str::from_utf8(k).ok()) else {
            tracing::warn!(
                topic,
                partition = r.partition,
                offset = r.offset,
                "asset-state record without a UTF-8 key; skipped"
            );
            return Ok(());
        };
        let Ok(key) = AssetKey::parse(key) else {
            tracing::warn!(
                topic,
                partition = r.partition,
                offset = r.offset,
                key,
                "asset-state record with an invalid key; skipped"
            );
            return Ok(());
        };
        let Some(payload) = r.payload else {
            out.remove(&key);
            return Ok(());
        };
        let record: StateRecord = codec.decode(SchemaName::AssetState, payload)?;
        let (state, revision) = record.into_state()?;
        out.insert(
            key,
            Entry {
                state,
                revision,
                partition: r.partition,
            },
        );
        Ok(())
    })?;
    metrics::counter!(m::RESTORED_RECORDS_TOTAL).increment(records);
    metrics::histogram!(m::RESTORE_SECONDS).record(started.elapsed().as_secs_f64());
    Ok(out)
}
