//! Restore: rebuild the states of newly assigned partitions from the asset-state
//! changelog before any of their events is folded.
//!
//! asset-events and asset-state are co-partitioned (same key, same partition count,
//! same partitioner), so asset-events partition p restores from asset-state
//! partition p only: a restore reads just what the instance owns.
//!
//! Only the newest record of each key is decoded. Until the broker compacts it, the
//! topic's head holds every revision a busy asset published; the older ones are
//! replaced by the newer as they are read, undecoded (a record nobody would keep
//! cannot fail the restore either).

use std::collections::BTreeSet;
use std::time::Instant;

use foldhash::{HashMap, HashMapExt};
use sluice_core::AssetKey;
use sluice_core::packed::{PackedState, StateTable};
use sluice_kit::BlockingCodec;
use sluice_kit::changelog::{BoxError, Changelog, ChangelogError};

use crate::metrics as m;

/// The newest record of a key: where it was, and its value (`None`: a tombstone).
struct Newest {
    partition: i32,
    offset: i64,
    tombstone: bool,
    payload: Vec<u8>,
}

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
    let mut newest: HashMap<Box<[u8]>, Newest> = HashMap::new();
    let records = changelog.read_to_end(partitions, &mut |r| {
        let Some(key) = r.key else {
            tracing::warn!(
                topic,
                partition = r.partition,
                offset = r.offset,
                "asset-state record without a key; skipped"
            );
            return Ok(());
        };
        let value = r.payload.unwrap_or_default();
        match newest.get_mut(key) {
            Some(slot) => {
                // The buffer is reused: most revisions of a state are as long.
                slot.partition = r.partition;
                slot.offset = r.offset;
                slot.tombstone = r.payload.is_none();
                slot.payload.clear();
                slot.payload.extend_from_slice(value);
            }
            None => {
                let record = Newest {
                    partition: r.partition,
                    offset: r.offset,
                    tombstone: r.payload.is_none(),
                    payload: value.to_vec(),
                };
                newest.insert(Box::from(key), record);
            }
        }
        Ok(())
    })?;
    for (key, record) in newest {
        if record.tombstone {
            continue;
        }
        let at = |source: BoxError| ChangelogError::Record {
            topic: topic.to_owned(),
            partition: record.partition,
            offset: record.offset,
            source,
        };
        let Some(key) = std::str::from_utf8(&key)
            .ok()
            .and_then(|k| AssetKey::parse(k).ok())
        else {
            tracing::warn!(
                topic,
                partition = record.partition,
                offset = record.offset,
                key = %String::from_utf8_lossy(&key),
                "asset-state record with an invalid key; skipped"
            );
            continue;
        };
        let decoded = codec
            .decode_state(&record.payload)
            .map_err(|e| at(e.into()))?;
        let (state, revision) = decoded.into_state().map_err(|e| at(e.into()))?;
        if state.asset_key != key {
            // Folding into it would fail on the first event (another asset's state).
            tracing::warn!(
                topic,
                partition = record.partition,
                offset = record.offset,
                %key,
                asset = %state.asset_key,
                "asset-state record keyed by another asset; skipped"
            );
            continue;
        }
        out.insert(PackedState::pack(&state, revision, record.partition));
    }
    metrics::counter!(m::RESTORED_RECORDS_TOTAL).increment(records);
    metrics::histogram!(m::RESTORE_SECONDS).record(started.elapsed().as_secs_f64());
    Ok(out)
}
