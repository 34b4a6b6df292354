//! Restore: rebuild the states of newly assigned partitions from the asset-state
//! changelog before any of their events is folded.
//!
//! asset-events and asset-state are co-partitioned (same key, same partition count,
//! same partitioner), so asset-events partition p restores from asset-state
//! partition p only: a restore reads just what the instance owns. Only the newest
//! record of each key is decoded ([`NewestByKey`]), on every core once the read
//! is done.

use std::collections::BTreeSet;
use std::time::Instant;

use sluice_core::AssetKey;
use sluice_core::packed::{PackedState, StateTable};
use sluice_kit::BlockingCodec;
use sluice_kit::changelog::{BoxError, Changelog, ChangelogError, NewestByKey};

use crate::metrics as m;

/// The latest committed state of every asset on `partitions`.
pub fn restore(
    changelog: &dyn Changelog,
    codec: &BlockingCodec,
    partitions: &BTreeSet<i32>,
) -> Result<StateTable, ChangelogError> {
    let mut out = StateTable::new();
    if partitions.is_empty() {
        return Ok(out);
    }
    let started = Instant::now();
    let topic = changelog.topic();
    let mut newest = NewestByKey::default();
    let records = changelog.read_to_end(partitions, &mut |r| {
        if !newest.keep(r) {
            tracing::warn!(
                topic,
                partition = r.partition,
                offset = r.offset,
                "asset-state record without a key; skipped"
            );
        }
        Ok(())
    })?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let states = newest.par_map(threads, |r| {
        let at = |source: BoxError| ChangelogError::Record {
            topic: topic.to_owned(),
            partition: r.partition,
            offset: r.offset,
            source,
        };
        let raw = r.key.unwrap_or_default();
        let Some(key) = std::str::from_utf8(raw)
            .ok()
            .and_then(|k| AssetKey::parse(k).ok())
        else {
            tracing::warn!(
                topic,
                partition = r.partition,
                offset = r.offset,
                key = %String::from_utf8_lossy(raw),
                "asset-state record with an invalid key; skipped"
            );
            return Ok(None);
        };
        let Some(payload) = r.payload else {
            return Ok(None);
        };
        let decoded = codec.decode_state(payload).map_err(|e| at(e.into()))?;
        let (state, revision) = decoded.into_state().map_err(|e| at(e.into()))?;
        if state.asset_key != key {
            // Folding into it would fail on the first event (another asset's state).
            tracing::warn!(
                topic,
                partition = r.partition,
                offset = r.offset,
                %key,
                asset = %state.asset_key,
                "asset-state record keyed by another asset; skipped"
            );
            return Ok(None);
        }
        Ok(Some(PackedState::pack(&state, revision, r.partition)))
    })?;
    for state in states {
        out.insert(state);
    }
    metrics::counter!(m::RESTORED_RECORDS_TOTAL).increment(records);
    metrics::histogram!(m::RESTORE_SECONDS).record(started.elapsed().as_secs_f64());
    Ok(out)
}
