//! The state-updater's processor: decode an event, fold it, emit the changed state.
//!
//! Committed states live in `committed`, packed (an updater holds every asset of
//! its partitions); changes of the open transaction in `pending`, unpacked once per
//! transaction, packed back on commit and dropped on abort, so memory always
//! equals what the asset-state topic holds after the last committed transaction.

use std::collections::BTreeSet;

// foldhash: SipHash of the asset key was a visible share of the per-event cost.
use foldhash::{HashMap, HashMapExt};

use sluice_core::packed::{PackedState, StateTable};
use sluice_core::state::Stale;
use sluice_core::{AssetEvent, AssetKey, AssetState, FoldOutcome};
use sluice_kit::changelog::Changelog;
use sluice_kit::txn::{Input, Output, ProcessError, Processor};
use sluice_kit::wire::StateRecord;
use sluice_kit::{BlockingCodec, SchemaName};

use crate::metrics as m;

/// An asset's state, its last published revision, and the partition it lives on.
#[derive(Clone, Debug)]
pub struct Entry {
    pub state: AssetState,
    pub revision: i64,
    pub partition: i32,
}

impl Entry {
    pub fn pack(&self) -> PackedState {
        PackedState::pack(&self.state, self.revision, self.partition)
    }

    pub fn unpack(packed: &PackedState) -> Self {
        let (state, revision) = packed.unpack();
        Entry {
            state,
            revision,
            partition: packed.partition(),
        }
    }
}

pub struct Fold {
    codec: BlockingCodec,
    /// The asset-state changelog: where states are published and restored from.
    states: Box<dyn Changelog>,
    committed: StateTable,
    pending: HashMap<AssetKey, Entry>,
}

impl Fold {
    pub fn new(codec: BlockingCodec, states: Box<dyn Changelog>) -> Self {
        Fold {
            codec,
            states,
            committed: StateTable::new(),
            pending: HashMap::new(),
        }
    }

    /// Assets held, committed.
    pub fn assets(&self) -> usize {
        self.committed.len()
    }

    /// The committed state of `key`, if this instance owns it.
    pub fn committed_state(&self, key: &str) -> Option<Entry> {
        self.committed.get(key).map(Entry::unpack)
    }

    fn decode(&self, input: &Input<'_>) -> Result<AssetEvent, ProcessError> {
        let payload = input
            .payload
            .ok_or_else(|| ProcessError::poison("asset event without a value (tombstone)"))?;
        let event: AssetEvent = self
            .codec
            .decode(SchemaName::AssetEvent, payload)
            .map_err(|e| ProcessError::undecodable(&e))?;
        let key = input.key.map(String::from_utf8_lossy).unwrap_or_default();
        if key != event.asset_key.as_str() {
            return Err(ProcessError::poison(format!(
                "record key {key:?} is not the event's asset key {}",
                event.asset_key
            )));
        }
        if !event.id_is_consistent() {
            return Err(ProcessError::poison(format!(
                "event_id {} is not the id derived from its fields",
                event.event_id
            )));
        }
        Ok(event)
    }
}

impl Processor for Fold {
    fn process(&mut self, input: &Input<'_>) -> Result<Vec<Output>, ProcessError> {
        let event = self.decode(input)?;
        let Fold {
            codec,
            states,
            committed,
            pending,
        } = self;
        // The asset's state for this transaction: copied from `committed` once per
        // transaction, then folded in place.
        let entry = pending.entry(event.asset_key.clone()).or_insert_with(|| {
            committed
                .get(event.asset_key.as_str())
                .map(Entry::unpack)
                .unwrap_or_else(|| Entry {
                    state: AssetState::new(event.asset_key.clone(), event.format),
                    revision: 0,
                    partition: input.partition,
                })
        });
        let commits_before = entry.state.commit_count;
        let outcome = entry.state.apply(&event);
        if entry.state.commit_count > commits_before {
            // Copies of one commit (push, poll, …) count it once: the first to
            // arrive is the path that saw it first.
            metrics::counter!(m::COMMITS_FIRST_SEEN_TOTAL, "source" => event.source.as_str())
                .increment(1);
        }
        match outcome {
            FoldOutcome::Unchanged(why) => {
                metrics::counter!(m::EVENTS_UNCHANGED_TOTAL, "reason" => why.as_str()).increment(1);
                if why == Stale::WrongAsset {
                    return Err(ProcessError::fatal(format!(
                        "state for {} received an event of another asset",
                        entry.state.asset_key
                    )));
                }
                Ok(Vec::new())
            }
            FoldOutcome::Changed => {
                entry.revision += 1;
                metrics::counter!(m::STATES_PUBLISHED_TOTAL).increment(1);

                let record = StateRecord::new(&entry.state, entry.revision);
                let bytes = codec
                    .encode(SchemaName::AssetState, states.topic(), &record)
                    .map_err(|e| ProcessError::unencodable("a folded state", &e))?;
                Ok(vec![Output::keyed(
                    states.topic(),
                    event.asset_key.as_str(),
                    bytes,
                )])
            }
        }
    }

    fn assigned(&mut self, partitions: &[(String, i32)]) -> Result<(), ProcessError> {
        let parts: BTreeSet<i32> = partitions.iter().map(|(_, p)| *p).collect();
        let restored = crate::restore::restore(self.states.as_ref(), &self.codec, &parts)
            .map_err(ProcessError::retriable)?;
        tracing::info!(partitions = ?parts, assets = restored.len(), "restored asset-state");
        self.committed.extend(restored);
        metrics::gauge!(m::ASSETS).set(self.committed.len() as f64);
        Ok(())
    }

    fn revoked(&mut self, partitions: &[(String, i32)]) {
        let parts: BTreeSet<i32> = partitions.iter().map(|(_, p)| *p).collect();
        self.committed.retain(|p| !parts.contains(&p.partition()));
        self.pending.retain(|_, e| !parts.contains(&e.partition));
        metrics::gauge!(m::ASSETS).set(self.committed.len() as f64);
    }

    fn committed(&mut self) {
        self.committed
            .extend(self.pending.drain().map(|(_, e)| e.pack()));
        metrics::gauge!(m::ASSETS).set(self.committed.len() as f64);
    }

    fn aborted(&mut self) {
        self.pending.clear();
    }
}

#[cfg(test)]
mod tests {
    //! The fold's commit / abort bookkeeping without a broker: inputs are handed to
    //! the processor as the loop would, restore reads an in-memory changelog.
    use super::*;
    use sluice_core::{EventSource, TableFormat};
    use sluice_kit::changelog::MemoryChangelog;

    const TOPIC: &str = "asset-state";

    fn codec() -> BlockingCodec {
        BlockingCodec::new(None).expect("single-object codec")
    }

    fn event_bytes(asset: &str, sequence: i64) -> Vec<u8> {
        let e = AssetEvent::committed(
            AssetKey::parse(asset).expect("key"),
            TableFormat::Paimon,
            sequence,
            sequence,
            1_000 * sequence,
            EventSource::Push,
        );
        codec()
            .encode(SchemaName::AssetEvent, "asset-events", &e)
            .expect("encode")
    }

    fn process(fold: &mut Fold, asset: &str, sequence: i64) -> Result<Vec<Output>, ProcessError> {
        let payload = event_bytes(asset, sequence);
        fold.process(&Input {
            topic: "asset-events",
            partition: 0,
            offset: sequence,
            key: Some(asset.as_bytes()),
            payload: Some(&payload),
            timestamp_ms: None,
            headers: Vec::new(),
        })
    }

    fn published(out: &[Output]) -> (i64, i64) {
        let payload = out[0].payload.as_deref().expect("a state, not a tombstone");
        let record: StateRecord = codec()
            .decode(SchemaName::AssetState, payload)
            .expect("decode");
        let (state, revision) = record.into_state().expect("state");
        (state.latest.map_or(0, |c| c.sequence), revision)
    }

    fn fold_on(changelog: &MemoryChangelog) -> Fold {
        let mut fold = Fold::new(codec(), Box::new(changelog.clone()));
        fold.assigned(&[(TOPIC.into(), 0)]).expect("restore");
        fold
    }

    #[test]
    fn an_aborted_batch_is_forgotten_and_its_replay_publishes_the_same_revisions() {
        let log = MemoryChangelog::new(TOPIC);
        let mut fold = fold_on(&log);
        let first = process(&mut fold, "lake.sales.a", 1).expect("fold");
        assert_eq!(published(&first), (1, 1));
        fold.committed();

        // The next batch folds two commits and aborts; replayed after the rewind,
        // the same commits publish the same revisions, never one skipped.
        for round in ["aborted", "replayed"] {
            for seq in 2..=3 {
                let out = process(&mut fold, "lake.sales.a", seq).expect("fold");
                assert_eq!(published(&out), (seq, seq), "{round}");
            }
            if round == "aborted" {
                fold.aborted();
                let revision = fold.committed_state("lake.sales.a").map(|e| e.revision);
                assert_eq!(revision, Some(1));
            }
        }
        fold.committed();
        assert_eq!(
            fold.committed_state("lake.sales.a").map(|e| e.revision),
            Some(3)
        );
    }

    #[test]
    fn a_restored_partition_continues_its_revisions_and_ignores_replayed_commits() {
        let log = MemoryChangelog::new(TOPIC);
        let mut fold = fold_on(&log);
        for seq in 1..=2 {
            let out = process(&mut fold, "lake.sales.a", seq).expect("fold");
            fold.committed();
            log.append(0, &out[0].key, out[0].payload.as_deref());
        }
        // Another instance takes the partition over: it restores from the changelog.
        let mut next = fold_on(&log);
        assert_eq!(next.assets(), 1);
        assert!(
            process(&mut next, "lake.sales.a", 2)
                .expect("fold")
                .is_empty(),
            "a commit already folded changes nothing"
        );
        assert_eq!(
            published(&process(&mut next, "lake.sales.a", 3).expect("fold")),
            (3, 3)
        );
    }

    #[test]
    fn a_revoked_partition_leaves_memory_with_its_uncommitted_changes() {
        let log = MemoryChangelog::new(TOPIC);
        let mut fold = fold_on(&log);
        process(&mut fold, "lake.sales.a", 1).expect("fold");
        fold.committed();
        process(&mut fold, "lake.sales.b", 1).expect("fold");
        fold.revoked(&[(TOPIC.into(), 0)]);
        fold.committed();
        assert_eq!(fold.assets(), 0);
    }

    #[test]
    fn bad_records_are_poison_and_change_nothing() {
        let log = MemoryChangelog::new(TOPIC);
        let mut fold = fold_on(&log);
        let payload = event_bytes("lake.sales.a", 1);
        let wrong_key = fold.process(&Input {
            topic: "asset-events",
            partition: 0,
            offset: 0,
            key: Some(b"lake.sales.b"),
            payload: Some(&payload),
            timestamp_ms: None,
            headers: Vec::new(),
        });
        assert!(
            matches!(wrong_key, Err(ProcessError::Poison(m)) if m.to_string().contains("lake.sales.b"))
        );
        let garbage = fold.process(&Input {
            topic: "asset-events",
            partition: 0,
            offset: 1,
            key: Some(b"lake.sales.a"),
            payload: Some(b"not avro"),
            timestamp_ms: None,
            headers: Vec::new(),
        });
        assert!(matches!(garbage, Err(ProcessError::Poison(_))));
        fold.committed();
        assert_eq!(fold.assets(), 0);
    }

    #[test]
    fn a_restore_reads_the_newest_record_of_each_key() {
        let log = MemoryChangelog::new(TOPIC);
        let mut fold = fold_on(&log);
        let mut outs = Vec::new();
        for (asset, seq) in [
            ("lake.sales.a", 1),
            ("lake.sales.b", 1),
            ("lake.sales.a", 2),
        ] {
            let out = process(&mut fold, asset, seq).expect("fold");
            fold.committed();
            outs.push(out);
        }
        // A record the newer one replaces does not decide the restore, even unreadable.
        log.append(0, b"lake.sales.a", Some(b"garbage"));
        for out in &outs {
            log.append(0, &out[0].key, out[0].payload.as_deref());
        }
        log.append(0, b"lake.sales.b", None);
        let next = fold_on(&log);
        assert_eq!(next.assets(), 1, "b's tombstone is the newest of b");
        let a = next.committed_state("lake.sales.a").expect("a restored");
        assert_eq!((a.revision, a.state.commit_count), (2, 2));
    }

    #[test]
    fn a_restore_that_cannot_decode_is_retried_not_skipped() {
        let log = MemoryChangelog::new(TOPIC);
        log.append(0, b"lake.sales.a", Some(b"garbage"));
        let mut fold = Fold::new(codec(), Box::new(log));
        let e = fold.assigned(&[(TOPIC.into(), 0)]);
        assert!(
            matches!(&e, Err(ProcessError::Retriable(m)) if m.to_string().contains("asset-state 0@0")),
            "{e:?}"
        );
    }
}
