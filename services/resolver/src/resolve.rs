//! The resolver's processor: owns the dependencies of its partitions, keeps an
//! inverted index asset → dependencies, and on every pass evaluates only the
//! dependencies that read a changed asset (plus due timers).
//!
//! Triggers and the progress they leave behind are produced in the same Kafka
//! transaction, so after any crash the restored progress says exactly which
//! combinations were already triggered. Progress of the open transaction is rolled
//! back on abort and every owned dependency is re-checked.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use foldhash::{HashMap, HashMapExt};
use rdkafka::ClientConfig;
use rdkafka::consumer::BaseConsumer;
use sluice_core::decide::{self, Cause, Progress};
use sluice_core::{AssetKey, AssetState, DependencySpec};
use sluice_kit::changelog::Changelog;
use sluice_kit::grants::SharedGrants;
use sluice_kit::txn::{Input, Output, ProcessError, Processor};
use sluice_kit::wire::{ProgressRecord, TriggerRecord, WireSpec};
use sluice_kit::{BlockingCodec, SchemaName};

use crate::lineage::{Lineage, Order};
use crate::metrics as m;
use crate::registry::Registry;
use crate::table::GlobalTable;

/// The changelogs a resolver restores its partitions from (co-partitioned).
pub struct Changelogs {
    pub dependencies: Box<dyn Changelog>,
    pub progress: Box<dyn Changelog>,
}

pub struct Resolve {
    codec: BlockingCodec,
    changelogs: Changelogs,
    triggers: String,
    table: Arc<GlobalTable>,
    /// The whole dependency set's lineage, for cycle checks across instances.
    lineage: Arc<Lineage>,
    /// Asks the broker where the dependencies topic ends (built on first use).
    watermarks: Option<BaseConsumer>,
    reader: ClientConfig,
    timeout: Duration,
    clock: fn() -> i64,
    registry: Registry,
    /// Grants in force when they are enforced (`SLUICE_GRANTS=enforce`).
    grants: Option<Arc<SharedGrants>>,
    /// Dependencies whose refusal by the grants was logged (once per version).
    withheld: HashMap<String, i64>,
}

impl Resolve {
    /// `reader`: a client config for asking where the dependencies topic ends
    /// (only a spec that produces an asset needs it, for the cycle check).
    pub fn new(
        codec: BlockingCodec,
        changelogs: Changelogs,
        triggers: String,
        table: Arc<GlobalTable>,
        lineage: Arc<Lineage>,
        reader: ClientConfig,
        timeout: Duration,
    ) -> Self {
        Resolve {
            codec,
            changelogs,
            triggers,
            table,
            lineage,
            watermarks: None,
            reader,
            timeout,
            clock: sluice_kit::clock::now_ms,
            registry: Registry::new(),
            grants: None,
            withheld: HashMap::new(),
        }
    }

    /// Reads time from `clock` (epoch ms) instead of the system clock (tests).
    pub fn with_clock(mut self, clock: fn() -> i64) -> Self {
        self.clock = clock;
        self
    }

    /// Enforces `grants`: a dependency no grant allows is not evaluated (and so
    /// never fires) until one does; the API shows it refused with the reason.
    pub fn with_grants(mut self, grants: Arc<SharedGrants>) -> Self {
        self.grants = Some(grants);
        self
    }

    pub fn dependencies(&self) -> usize {
        self.registry.len()
    }

    fn progress_output(
        &self,
        id: &str,
        partition: i32,
        p: Option<&Progress>,
    ) -> Result<Output, ProcessError> {
        let topic = self.changelogs.progress.topic();
        let out = match p {
            None => Output::tombstone(topic, id),
            Some(p) => {
                let bytes = self
                    .codec
                    .encode(
                        SchemaName::ResolverProgress,
                        topic,
                        &ProgressRecord::new(id, p),
                    )
                    .map_err(|e| ProcessError::unencodable("a resolver progress", &e))?;
                Output::keyed(topic, id, bytes)
            }
        };
        Ok(out.on_partition(partition))
    }

    /// Evaluates the given dependencies; returns their triggers and progress.
    fn evaluate(&mut self, ids: &[(String, Cause)]) -> Result<Vec<Output>, ProcessError> {
        let now = (self.clock)();
        let mut outputs = Vec::new();
        let mut changed: Vec<String> = Vec::new();
        {
            // Only the assets this pass reads are unpacked, each once, under one
            // read of the table (a consistent view; writers wait only for this).
            let mut inputs: HashMap<AssetKey, AssetState> = HashMap::new();
            {
                let states = self.table.read();
                for (id, _) in ids {
                    let Some(owned) = self.registry.get(id) else {
                        continue;
                    };
                    owned.spec.condition.for_each_input(|a| {
                        if !inputs.contains_key(a)
                            && let Some((state, _)) = states.state(a.as_str())
                        {
                            inputs.insert(a.clone(), state);
                        }
                    });
                }
            }
            let lookup = |a: &AssetKey| inputs.get(a);
            for (id, cause) in ids {
                let Some(owned) = self.registry.get(id) else {
                    continue;
                };
                if let Some(grants) = &self.grants
                    && let Err(e) = grants.check(&owned.spec)
                {
                    metrics::counter!(m::WITHHELD_BY_GRANTS_TOTAL).increment(1);
                    let version = owned.spec.version;
                    if self.withheld.insert(id.clone(), version) != Some(version) {
                        tracing::warn!(dependency = %id, error = %e, "dependency withheld: no grant allows it");
                    }
                    continue;
                }
                self.withheld.remove(id);
                metrics::counter!(m::EVALUATIONS_TOTAL).increment(1);
                if owned.spec.paused {
                    // Judged on a copy: what it would fire is counted, its progress
                    // (baselines, timers) does not move, so a resume fires once, for
                    // the newest combination.
                    let mut would = owned.progress.clone();
                    let outcome = decide::step(&owned.spec, &mut would, &lookup, now, *cause);
                    if !outcome.fires.is_empty() {
                        metrics::counter!(m::WITHHELD_BY_PAUSE_TOTAL)
                            .increment(outcome.fires.len() as u64);
                        tracing::debug!(dependency = %id, withheld = outcome.fires.len(), "paused: trigger withheld");
                    }
                    continue;
                }
                let Some(outcome) = self.registry.step(id, |spec, progress| {
                    let outcome = decide::step(spec, progress, &lookup, now, *cause);
                    let records: Vec<_> = outcome
                        .fires
                        .iter()
                        .map(|fire| (fire.key.clone(), TriggerRecord::of_fire(spec, fire)))
                        .collect();
                    (outcome, records)
                }) else {
                    continue;
                };
                let (outcome, records) = outcome;
                if outcome.suppressed {
                    metrics::counter!(m::SUPPRESSED_TOTAL).increment(1);
                }
                for (key, record) in records {
                    metrics::counter!(m::TRIGGERS_TOTAL).increment(1);
                    // Counted by the metric; one line per trigger only when asked for.
                    tracing::debug!(dependency = %id, trigger_key = %key, reason = %record.reason, "trigger");
                    let payload = self
                        .codec
                        .encode(SchemaName::TriggerRequest, &self.triggers, &record)
                        .map_err(|e| ProcessError::unencodable("a trigger request", &e))?;
                    outputs.push(Output::keyed(&self.triggers, key.as_str(), payload));
                }
                if outcome.progress_changed {
                    changed.push(id.clone());
                }
            }
        }
        for id in changed {
            if let Some(o) = self.registry.get(&id) {
                outputs.push(self.progress_output(&id, o.partition, Some(&o.progress))?);
            }
        }
        Ok(outputs)
    }

    /// Loads the specs and progress of `partitions` from their changelogs (an
    /// unreadable changelog is retriable: the assignment is tried again).
    fn restore(&mut self, partitions: &BTreeSet<i32>) -> Result<(), ProcessError> {
        let mut specs: HashMap<String, (i32, i64, Option<DependencySpec>)> = HashMap::new();
        let codec = &self.codec;
        self.changelogs
            .dependencies
            .read_to_end(partitions, &mut |r| {
                let key = String::from_utf8_lossy(r.key.unwrap_or_default()).into_owned();
                let spec = match r.payload {
                    None => None,
                    Some(bytes) => match decode_spec(codec, &key, bytes) {
                        Ok(s) => Some(s),
                        Err(ProcessError::Retriable(e)) => return Err(e),
                        Err(e) => {
                            // Refused when first consumed too (and dead-lettered then);
                            // the last valid version stays in force.
                            metrics::counter!(m::SPECS_REFUSED_TOTAL).increment(1);
                            tracing::warn!(dependency = %key, offset = r.offset, error = %e, "invalid spec skipped on restore");
                            return Ok(());
                        }
                    },
                };
                specs.insert(key, (r.partition, r.offset, spec));
                Ok(())
            })
            .map_err(ProcessError::retriable)?;
        let mut progress: HashMap<String, Progress> = HashMap::new();
        self.changelogs
            .progress
            .read_to_end(partitions, &mut |r| {
                let key = String::from_utf8_lossy(r.key.unwrap_or_default()).into_owned();
                match r.payload {
                    None => {
                        progress.remove(&key);
                    }
                    Some(bytes) => {
                        let record: ProgressRecord =
                            codec.decode(SchemaName::ResolverProgress, bytes)?;
                        progress.insert(key, record.into_progress()?);
                    }
                }
                Ok(())
            })
            .map_err(ProcessError::retriable)?;
        let mut loaded = 0usize;
        let mut lineage_read = false;
        // In log order, so a spec that closed a cycle is refused again, as it was
        // when first consumed.
        let mut specs: Vec<_> = specs.into_iter().collect();
        specs.sort_by_key(|(_, (p, offset, _))| (*p, *offset));
        for (id, (partition, offset, spec)) in specs {
            let Some(spec) = spec else { continue };
            if spec.produces.is_some() {
                if !lineage_read {
                    self.lineage_read_to_end()?;
                    lineage_read = true;
                }
                let order = self.lineage.order_of(&id).unwrap_or((0, partition, offset));
                if let Err(e) = self.lineage_verdict(&spec, order) {
                    tracing::warn!(dependency = %id, error = %e, "spec refused on restore");
                    continue;
                }
            }
            let progress = progress.remove(&id).unwrap_or_else(|| Progress {
                version: spec.version,
                ..Progress::default()
            });
            self.registry.load(spec, partition, offset, progress);
            loaded += 1;
        }
        metrics::gauge!(m::DEPENDENCIES).set(self.registry.len() as f64);
        tracing::info!(partitions = ?partitions, dependencies = loaded, "restored dependencies and progress");
        Ok(())
    }
}

impl Resolve {
    /// Refuses `spec` (Poison, with the cycle in the reason) when it closes a cycle
    /// in the whole dependency set; waits first until the lineage follower has read
    /// every partition to its current end (Retriable if it cannot).
    fn check_lineage(&mut self, spec: &DependencySpec, order: Order) -> Result<(), ProcessError> {
        self.lineage_read_to_end()?;
        // Its place in the order: where its current edges were first appended.
        let order = self.lineage.order_of(&spec.id).unwrap_or(order);
        self.lineage_verdict(spec, order)
    }

    fn lineage_read_to_end(&mut self) -> Result<(), ProcessError> {
        if self.watermarks.is_none() {
            let c: BaseConsumer = self
                .reader
                .create()
                .map_err(|e| ProcessError::retriable(format!("watermark reader: {e}")))?;
            self.watermarks = Some(c);
        }
        if let Some(c) = &self.watermarks {
            self.lineage
                .wait_read_to_end(c, self.changelogs.dependencies.topic(), self.timeout)
                .map_err(ProcessError::retriable)?;
        }
        Ok(())
    }

    fn lineage_verdict(&self, spec: &DependencySpec, order: Order) -> Result<(), ProcessError> {
        self.lineage.verdict(spec, order).map_err(|e| {
            metrics::counter!(m::SPECS_REFUSED_TOTAL).increment(1);
            ProcessError::poison(e.to_string())
        })
    }
}

fn decode_spec(
    codec: &BlockingCodec,
    key: &str,
    bytes: &[u8],
) -> Result<DependencySpec, ProcessError> {
    let wire: WireSpec = codec
        .decode(SchemaName::DependencySpec, bytes)
        .map_err(|e| ProcessError::undecodable(&e))?;
    wire.into_spec(key)
        .map_err(|e| ProcessError::poison(e.to_string()))
}

impl Processor for Resolve {
    /// A record of the dependencies topic: a new or changed spec, or a tombstone.
    fn process(&mut self, input: &Input<'_>) -> Result<Vec<Output>, ProcessError> {
        let key = input
            .key
            .and_then(|k| std::str::from_utf8(k).ok())
            .ok_or_else(|| ProcessError::poison("dependency record without a UTF-8 key"))?
            .to_owned();
        if self.registry.holds_at_or_after(&key, input.offset) {
            return Ok(Vec::new()); // already loaded by restore
        }
        let Some(bytes) = input.payload else {
            // Tombstone: the dependency is gone and its progress with it.
            let Some(partition) = self.registry.remove(&key) else {
                return Ok(Vec::new());
            };
            metrics::gauge!(m::DEPENDENCIES).set(self.registry.len() as f64);
            tracing::info!(dependency = %key, "dependency deleted");
            return Ok(vec![self.progress_output(&key, partition, None)?]);
        };
        let spec = decode_spec(&self.codec, &key, bytes).inspect_err(|e| {
            if matches!(e, ProcessError::Poison(_)) {
                metrics::counter!(m::SPECS_REFUSED_TOTAL).increment(1);
            }
        })?;
        // Cycles are a property of the whole dependency set (`lineage`); only a spec
        // that produces an asset adds an edge, so only such a spec can close one.
        if spec.produces.is_some() {
            let order = (
                input.timestamp_ms.unwrap_or(0),
                input.partition,
                input.offset,
            );
            self.check_lineage(&spec, order)?;
        }
        tracing::info!(dependency = %key, version = spec.version, mode = %spec.mode, "dependency accepted");
        self.registry.upsert(spec, input.partition, input.offset);
        metrics::gauge!(m::DEPENDENCIES).set(self.registry.len() as f64);
        if !self.table.caught_up() {
            self.registry.recheck(Some(&key));
            return Ok(Vec::new());
        }
        self.evaluate(&[(key, Cause::Change)])
    }

    fn tick(&mut self) -> Result<Vec<Output>, ProcessError> {
        if !self.table.caught_up() {
            if let Some(why) = self.table.failure() {
                return Err(ProcessError::fatal(format!("asset-state reader: {why}")));
            }
            return Ok(Vec::new());
        }
        // A grant given or revoked: every owned dependency is judged again.
        if self.grants.as_ref().is_some_and(|g| g.take_changed()) {
            self.registry.recheck(None);
        }
        let work = self
            .registry
            .due(self.table.drain_changed(), (self.clock)());
        if work.is_empty() {
            return Ok(Vec::new());
        }
        self.evaluate(&work)
    }

    fn assigned(&mut self, partitions: &[(String, i32)]) -> Result<(), ProcessError> {
        // Judging dependencies on a partial table would fire on stale combinations.
        if !self.table.wait_caught_up(self.timeout * 10) {
            return Err(ProcessError::retriable(
                self.table
                    .failure()
                    .unwrap_or_else(|| "asset-state table not caught up yet".into()),
            ));
        }
        if let Some(g) = &self.grants
            && !g.wait_caught_up(self.timeout * 10)
        {
            return Err(ProcessError::retriable(
                g.failure()
                    .unwrap_or_else(|| "grants not read to their end yet".into()),
            ));
        }
        let parts: BTreeSet<i32> = partitions.iter().map(|(_, p)| *p).collect();
        self.restore(&parts)
    }

    fn revoked(&mut self, partitions: &[(String, i32)]) {
        let parts: BTreeSet<i32> = partitions.iter().map(|(_, p)| *p).collect();
        self.registry.revoke(&parts);
        metrics::gauge!(m::DEPENDENCIES).set(self.registry.len() as f64);
    }

    fn committed(&mut self) {
        self.registry.commit();
    }

    fn aborted(&mut self) {
        self.registry.abort();
        metrics::gauge!(m::DEPENDENCIES).set(self.registry.len() as f64);
    }
}

#[cfg(test)]
mod tests {
    //! The processor without a broker: spec records handed in as the loop would,
    //! the global table filled directly, restore from in-memory changelogs.
    use super::*;
    use sluice_core::{AssetEvent, AssetState, EventSource, TableFormat};
    use sluice_kit::changelog::MemoryChangelog;

    const SPEC: &str = r#"{"id": "d1", "version": 1, "owner_project": "p",
        "target": {"kind": "webhook", "name": "w"},
        "condition": {"input": {"asset": "lake.s.a"}}, "mode": {"kind": "snapshots"}}"#;

    fn codec() -> BlockingCodec {
        BlockingCodec::new(None).expect("codec")
    }

    struct Rig {
        resolve: Resolve,
        table: Arc<GlobalTable>,
        progress: MemoryChangelog,
        dependencies: MemoryChangelog,
    }

    fn resolve_on(
        table: Arc<GlobalTable>,
        dependencies: &MemoryChangelog,
        progress: &MemoryChangelog,
    ) -> Resolve {
        Resolve::new(
            codec(),
            Changelogs {
                dependencies: Box::new(dependencies.clone()),
                progress: Box::new(progress.clone()),
            },
            "triggers".into(),
            table,
            Lineage::new(),
            ClientConfig::new(),
            Duration::from_secs(1),
        )
        .with_clock(|| 1_000_000)
    }

    fn rig() -> Rig {
        let table = GlobalTable::new();
        table.mark_caught_up();
        let (dependencies, progress) = (
            MemoryChangelog::new("dependencies"),
            MemoryChangelog::new("resolver-progress"),
        );
        let resolve = resolve_on(table.clone(), &dependencies, &progress);
        Rig {
            resolve,
            table,
            progress,
            dependencies,
        }
    }

    fn spec_bytes() -> Vec<u8> {
        let spec = DependencySpec::from_json(SPEC).expect("spec");
        codec()
            .encode(
                SchemaName::DependencySpec,
                "dependencies",
                &WireSpec::from(&spec),
            )
            .expect("encode")
    }

    fn feed_spec(r: &mut Resolve, offset: i64, payload: Option<&[u8]>) -> Vec<Output> {
        r.process(&Input {
            topic: "dependencies",
            partition: 0,
            offset,
            key: Some(b"d1"),
            payload,
            timestamp_ms: Some(1),
            headers: Vec::new(),
        })
        .expect("processed")
    }

    fn commit(table: &GlobalTable, sequence: i64) {
        let key = AssetKey::parse("lake.s.a").expect("key");
        let mut state = AssetState::new(key.clone(), TableFormat::Paimon);
        for s in 1..=sequence {
            state.apply(&AssetEvent::committed(
                key.clone(),
                TableFormat::Paimon,
                s,
                s,
                s * 1_000,
                EventSource::Push,
            ));
        }
        table.apply(key, Some((state, sequence)));
    }

    fn trigger_keys(out: &[Output]) -> Vec<String> {
        out.iter()
            .filter(|o| o.topic == "triggers")
            .map(|o| String::from_utf8_lossy(&o.key).into_owned())
            .collect()
    }

    #[test]
    fn an_aborted_pass_fires_the_same_trigger_again_and_a_committed_one_never() {
        let Rig {
            mut resolve, table, ..
        } = rig();
        assert!(trigger_keys(&feed_spec(&mut resolve, 0, Some(&spec_bytes()))).is_empty());
        resolve.committed();
        commit(&table, 1);
        let first = resolve.tick().expect("tick");
        let keys = trigger_keys(&first);
        assert_eq!(keys.len(), 1, "{first:?}");
        assert!(
            first
                .iter()
                .any(|o| o.topic == "resolver-progress" && o.partition == Some(0)),
            "the progress goes with the trigger, on the spec's partition"
        );
        resolve.aborted();
        assert_eq!(
            trigger_keys(&resolve.tick().expect("tick")),
            keys,
            "the same key after an abort"
        );
        resolve.committed();
        assert!(trigger_keys(&resolve.tick().expect("tick")).is_empty());
        commit(&table, 2);
        let next = trigger_keys(&resolve.tick().expect("tick"));
        assert_eq!(next.len(), 1);
        assert_ne!(next, keys);
    }

    #[test]
    fn a_deletion_replayed_after_an_abort_still_deletes_the_progress() {
        let Rig {
            mut resolve, table, ..
        } = rig();
        feed_spec(&mut resolve, 0, Some(&spec_bytes()));
        commit(&table, 1);
        resolve.tick().expect("tick");
        resolve.committed();
        let deleted = feed_spec(&mut resolve, 1, None);
        assert_eq!(deleted.len(), 1);
        resolve.aborted();
        let replayed = feed_spec(&mut resolve, 1, None);
        assert_eq!(
            replayed, deleted,
            "the progress tombstone is produced again"
        );
        assert_eq!(replayed[0].payload, None);
    }

    #[test]
    fn a_restored_dependency_does_not_fire_a_combination_it_already_fired() {
        let Rig {
            mut resolve,
            table,
            progress,
            dependencies,
        } = rig();
        dependencies.append(0, b"d1", Some(&spec_bytes()));
        resolve
            .assigned(&[("dependencies".into(), 0)])
            .expect("restore");
        commit(&table, 1);
        let out = resolve.tick().expect("tick");
        assert_eq!(trigger_keys(&out).len(), 1);
        resolve.committed();
        for o in out.iter().filter(|o| o.topic == "resolver-progress") {
            progress.append(0, &o.key, o.payload.as_deref());
        }
        // The partition moves to a new instance (same table, same changelogs).
        let mut resolve = resolve_on(table, &dependencies, &progress);
        resolve
            .assigned(&[("dependencies".into(), 0)])
            .expect("restore");
        assert!(trigger_keys(&resolve.tick().expect("tick")).is_empty());
        assert_eq!(resolve.dependencies(), 1);
    }
}
