//! The state-updater's processor: decode an event, fold it, emit the changed state.
//!
//! Committed states live in `committed`; changes of the open transaction in
//! `pending`, merged on commit and dropped on abort, so memory always equals what
//! the asset-state topic holds after the last committed transaction.

use std::collections::BTreeSet;

// foldhash: SipHash of the asset key was a visible share of the per-event cost.
use foldhash::{HashMap, HashMapExt};

use sluice_core::state::Stale;
use sluice_core::{AssetEvent, AssetKey, AssetState, FoldOutcome};
use sluice_kit::txn::{Input, Output, ProcessError, Processor};
use sluice_kit::wire::StateRecord;
use sluice_kit::{Codec, SchemaName};

use crate::metrics as m;
use crate::restore::Restorer;

/// An asset's state, its last published revision, and the partition it lives on.
#[derive(Clone, Debug)]
pub struct Entry {
    pub state: AssetState,
    pub revision: i64,
    pub partition: i32,
}

pub struct Fold {
    codec: Codec,
    runtime: tokio::runtime::Handle,
    state_topic: String,
    committed: HashMap<AssetKey, Entry>,
    pending: HashMap<AssetKey, Entry>,
    restorer: Restorer,
}

impl Fold {
    pub fn new(
        codec: Codec,
        runtime: tokio::runtime::Handle,
        state_topic: String,
        restorer: Restorer,
    ) -> Self {
        Fold {
            codec,
            runtime,
            state_topic,
            committed: HashMap::new(),
            pending: HashMap::new(),
            restorer,
        }
    }

    pub fn assets(&self) -> usize {
        self.committed.len()
    }

    fn decode(&self, input: &Input<'_>) -> Result<AssetEvent, ProcessError> {
        let payload = input.payload.ok_or_else(|| {
            ProcessError::Poison("asset event without a value (tombstone)".into())
        })?;
        let event: AssetEvent = self
            .runtime
            .block_on(self.codec.decode(SchemaName::AssetEvent, payload))
            .map_err(|e| ProcessError::undecodable(&e))?;
        let key = input.key.map(String::from_utf8_lossy).unwrap_or_default();
        if key != event.asset_key.as_str() {
            return Err(ProcessError::Poison(format!(
                "record key {key:?} is not the event's asset key {}",
                event.asset_key
            )));
        }
        if !event.id_is_consistent() {
            return Err(ProcessError::Poison(format!(
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
            runtime,
            state_topic,
            committed,
            pending,
            ..
        } = self;
        // The asset's state for this transaction: copied from `committed` once per
        // transaction, then folded in place.
        let entry = pending.entry(event.asset_key.clone()).or_insert_with(|| {
            committed
                .get(&event.asset_key)
                .cloned()
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
                    return Err(ProcessError::Fatal(format!(
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
                let bytes = runtime
                    .block_on(codec.encode(SchemaName::AssetState, state_topic, &record))
                    .map_err(|e| {
                        if e.is_retriable() {
                            ProcessError::Retriable(e.to_string())
                        } else {
                            ProcessError::Fatal(format!("a folded state does not encode: {e}"))
                        }
                    })?;
                Ok(vec![Output {
                    topic: state_topic.clone(),
                    partition: None,
                    key: event.asset_key.as_str().as_bytes().to_vec(),
                    payload: Some(bytes),
                    headers: Vec::new(),
                }])
            }
        }
    }

    fn assigned(&mut self, partitions: &[(String, i32)]) -> Result<(), ProcessError> {
        let parts: BTreeSet<i32> = partitions.iter().map(|(_, p)| *p).collect();
        let restored = self
            .restorer
            .restore(&self.runtime, &self.codec, &parts)
            .map_err(ProcessError::Retriable)?;
        tracing::info!(partitions = ?parts, assets = restored.len(), "restored asset-state");
        for (key, entry) in restored {
            self.committed.insert(key, entry);
        }
        metrics::gauge!(m::ASSETS).set(self.committed.len() as f64);
        Ok(())
    }

    fn revoked(&mut self, partitions: &[(String, i32)]) {
        let parts: BTreeSet<i32> = partitions.iter().map(|(_, p)| *p).collect();
        self.committed.retain(|_, e| !parts.contains(&e.partition));
        self.pending.retain(|_, e| !parts.contains(&e.partition));
        metrics::gauge!(m::ASSETS).set(self.committed.len() as f64);
    }

    fn committed(&mut self) {
        self.committed.extend(self.pending.drain());
        metrics::gauge!(m::ASSETS).set(self.committed.len() as f64);
    }

    fn aborted(&mut self) {
        self.pending.clear();
    }
}
