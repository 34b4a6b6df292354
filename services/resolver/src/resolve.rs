//! The resolver's processor: owns the dependencies of its partitions, keeps an
//! inverted index asset → dependencies, and on every pass evaluates only the
//! dependencies that read a changed asset (plus due timers).
//!
//! Triggers and the progress they leave behind are produced in the same Kafka
//! transaction, so after any crash the restored progress says exactly which
//! combinations were already triggered. Progress of the open transaction is rolled
//! back on abort and every owned dependency is re-checked.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use foldhash::{HashMap, HashMapExt};
use rdkafka::ClientConfig;
use rdkafka::consumer::BaseConsumer;
use rdkafka::message::Message;
use sluice_core::decide::{self, Cause, Progress};
use sluice_core::{AssetKey, DependencySpec};
use sluice_kit::changelog::read_to_end;
use sluice_kit::grants::SharedGrants;
use sluice_kit::txn::{Input, Output, ProcessError, Processor};
use sluice_kit::wire::{ProgressRecord, TriggerRecord, WireSpec};
use sluice_kit::{Codec, SchemaName};

use crate::lineage::{Lineage, Order};
use crate::metrics as m;
use crate::table::GlobalTable;

/// One owned dependency.
struct Owned {
    spec: DependencySpec,
    /// dependencies (and resolver-progress) partition it lives on.
    partition: i32,
    /// Offset of the spec record it came from: an older record replayed by the
    /// loop must not bring an older version back.
    offset: i64,
    progress: Progress,
}

pub struct Topics {
    pub dependencies: String,
    pub progress: String,
    pub triggers: String,
}

pub struct Resolve {
    codec: Codec,
    runtime: tokio::runtime::Handle,
    topics: Topics,
    table: Arc<GlobalTable>,
    /// The whole dependency set's lineage, for cycle checks across instances.
    lineage: Arc<Lineage>,
    /// Asks the broker where the dependencies topic ends (built on first use).
    watermarks: Option<BaseConsumer>,
    reader: ClientConfig,
    timeout: Duration,
    clock: fn() -> i64,
    deps: HashMap<String, Owned>,
    index: HashMap<AssetKey, BTreeSet<String>>,
    /// Dependencies with a pending timer.
    timed: HashSet<String>,
    /// Dependencies to re-check on the next pass (after restore or abort).
    recheck: BTreeSet<String>,
    /// Progress as it was before the open transaction touched it (None: was absent).
    saved: HashMap<String, Option<Progress>>,
    /// Grants in force when they are enforced (`SLUICE_GRANTS=enforce`).
    grants: Option<Arc<SharedGrants>>,
    /// Dependencies whose refusal by the grants was logged (once per version).
    withheld: HashMap<String, i64>,
}

impl Resolve {
    pub fn new(
        codec: Codec,
        runtime: tokio::runtime::Handle,
        topics: Topics,
        table: Arc<GlobalTable>,
        lineage: Arc<Lineage>,
        reader: ClientConfig,
        timeout: Duration,
    ) -> Self {
        Resolve {
            codec,
            runtime,
            topics,
            table,
            lineage,
            watermarks: None,
            reader,
            timeout,
            clock: sluice_kit::clock::now_ms,
            deps: HashMap::new(),
            index: HashMap::new(),
            timed: HashSet::new(),
            recheck: BTreeSet::new(),
            saved: HashMap::new(),
            grants: None,
            withheld: HashMap::new(),
        }
    }

    /// Enforces `grants`: a dependency no grant allows is not evaluated (and so
    /// never fires) until one does; the API shows it refused with the reason.
    pub fn with_grants(mut self, grants: Arc<SharedGrants>) -> Self {
        self.grants = Some(grants);
        self
    }

    pub fn dependencies(&self) -> usize {
        self.deps.len()
    }

    fn index_add(&mut self, spec: &DependencySpec) {
        for a in spec.inputs() {
            self.index.entry(a).or_default().insert(spec.id.clone());
        }
    }

    fn index_remove(&mut self, spec: &DependencySpec) {
        for a in spec.inputs() {
            if let Some(ids) = self.index.get_mut(&a) {
                ids.remove(&spec.id);
                if ids.is_empty() {
                    self.index.remove(&a);
                }
            }
        }
    }

    /// Remembers the progress of `id` before the open transaction changes it.
    fn save(&mut self, id: &str) {
        if !self.saved.contains_key(id) {
            let before = self.deps.get(id).map(|o| o.progress.clone());
            self.saved.insert(id.to_owned(), before);
        }
    }

    fn progress_output(
        &self,
        id: &str,
        partition: i32,
        p: Option<&Progress>,
    ) -> Result<Output, ProcessError> {
        let payload = match p {
            None => None,
            Some(p) => Some(
                self.runtime
                    .block_on(self.codec.encode(
                        SchemaName::ResolverProgress,
                        &self.topics.progress,
                        &ProgressRecord::new(id, p),
                    ))
                    .map_err(encode_error)?,
            ),
        };
        Ok(Output {
            topic: self.topics.progress.clone(),
            partition: Some(partition),
            key: id.as_bytes().to_vec(),
            payload,
            headers: Vec::new(),
        })
    }

    /// Evaluates the given dependencies; returns their triggers and progress.
    fn evaluate(&mut self, ids: &[(String, Cause)]) -> Result<Vec<Output>, ProcessError> {
        let now = (self.clock)();
        let mut outputs = Vec::new();
        let mut changed: Vec<String> = Vec::new();
        {
            let table = self.table.clone();
            let states = table.read();
            let lookup = |a: &AssetKey| states.get(a).map(|(s, _)| s);
            for (id, cause) in ids {
                if !self.deps.contains_key(id) {
                    continue;
                }
                if let (Some(grants), Some(owned)) = (&self.grants, self.deps.get(id))
                    && let Err(e) = grants.check(&owned.spec)
                {
                    metrics::counter!(m::WITHHELD_BY_GRANTS_TOTAL).increment(1);
                    if self.withheld.insert(id.clone(), owned.spec.version)
                        != Some(owned.spec.version)
                    {
                        tracing::warn!(dependency = %id, error = %e, "dependency withheld: no grant allows it");
                    }
                    continue;
                }
                self.withheld.remove(id);
                self.save(id);
                let Some(owned) = self.deps.get_mut(id) else {
                    continue;
                };
                metrics::counter!(m::EVALUATIONS_TOTAL).increment(1);
                let outcome = decide::step(&owned.spec, &mut owned.progress, &lookup, now, *cause);
                if outcome.suppressed {
                    metrics::counter!(m::SUPPRESSED_TOTAL).increment(1);
                }
                for fire in &outcome.fires {
                    metrics::counter!(m::TRIGGERS_TOTAL).increment(1);
                    // Counted by the metric; one line per trigger only when asked for.
                    tracing::debug!(
                        dependency = %owned.spec.id,
                        trigger_key = %fire.key,
                        reason = %fire.reason,
                        "trigger"
                    );
                    let record = TriggerRecord::of_fire(&owned.spec, fire);
                    let payload = self
                        .runtime
                        .block_on(self.codec.encode(
                            SchemaName::TriggerRequest,
                            &self.topics.triggers,
                            &record,
                        ))
                        .map_err(encode_error)?;
                    outputs.push(Output {
                        topic: self.topics.triggers.clone(),
                        partition: None,
                        key: fire.key.as_str().as_bytes().to_vec(),
                        payload: Some(payload),
                        headers: Vec::new(),
                    });
                }
                if owned.progress.fire_at_ms.is_some() {
                    self.timed.insert(id.clone());
                } else {
                    self.timed.remove(id);
                }
                if outcome.progress_changed {
                    changed.push(id.clone());
                }
            }
        }
        for id in changed {
            let o = &self.deps[&id];
            outputs.push(self.progress_output(&id, o.partition, Some(&o.progress))?);
        }
        Ok(outputs)
    }

    /// Loads the specs and progress of `partitions` from their changelogs.
    fn restore(&mut self, partitions: &BTreeSet<i32>) -> Result<(), String> {
        let mut specs: HashMap<String, (i32, i64, Option<DependencySpec>)> = HashMap::new();
        let (runtime, codec) = (&self.runtime, &self.codec);
        read_to_end(
            &self.reader,
            &self.topics.dependencies,
            partitions,
            self.timeout * 10,
            |msg| {
                let key = String::from_utf8_lossy(msg.key().unwrap_or_default()).into_owned();
                let spec = match msg.payload() {
                    None => None,
                    Some(bytes) => match decode_spec(runtime, codec, &key, bytes) {
                        Ok(s) => Some(s),
                        Err(ProcessError::Retriable(e)) => return Err(e),
                        Err(e) => {
                            // Refused when first consumed too (and dead-lettered then);
                            // the last valid version stays in force.
                            metrics::counter!(m::SPECS_REFUSED_TOTAL).increment(1);
                            tracing::warn!(dependency = %key, offset = msg.offset(), error = %e, "invalid spec skipped on restore");
                            return Ok(());
                        }
                    },
                };
                specs.insert(key, (msg.partition(), msg.offset(), spec));
                Ok(())
            },
        )?;
        let mut progress: HashMap<String, Progress> = HashMap::new();
        read_to_end(
            &self.reader,
            &self.topics.progress,
            partitions,
            self.timeout * 10,
            |msg| {
                let key = String::from_utf8_lossy(msg.key().unwrap_or_default()).into_owned();
                match msg.payload() {
                    None => {
                        progress.remove(&key);
                    }
                    Some(bytes) => {
                        let at =
                            || format!("resolver-progress {}@{}", msg.partition(), msg.offset());
                        let record: ProgressRecord = runtime
                            .block_on(codec.decode(SchemaName::ResolverProgress, bytes))
                            .map_err(|e| format!("{}: {e}", at()))?;
                        progress.insert(
                            key,
                            record
                                .into_progress()
                                .map_err(|e| format!("{}: {e}", at()))?,
                        );
                    }
                }
                Ok(())
            },
        )?;
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
                    self.lineage_read_to_end().map_err(|e| e.to_string())?;
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
            self.index_add(&spec);
            if progress.fire_at_ms.is_some() {
                self.timed.insert(id.clone());
            }
            self.recheck.insert(id.clone());
            self.deps.insert(
                id,
                Owned {
                    spec,
                    partition,
                    offset,
                    progress,
                },
            );
            loaded += 1;
        }
        metrics::gauge!(m::DEPENDENCIES).set(self.deps.len() as f64);
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
        self.lineage_verdict(spec, order)
    }

    fn lineage_read_to_end(&mut self) -> Result<(), ProcessError> {
        if self.watermarks.is_none() {
            let c: BaseConsumer = self
                .reader
                .create()
                .map_err(|e| ProcessError::Retriable(format!("watermark reader: {e}")))?;
            self.watermarks = Some(c);
        }
        if let Some(c) = &self.watermarks {
            self.lineage
                .wait_read_to_end(c, &self.topics.dependencies, self.timeout)
                .map_err(ProcessError::Retriable)?;
        }
        Ok(())
    }

    fn lineage_verdict(&self, spec: &DependencySpec, order: Order) -> Result<(), ProcessError> {
        self.lineage.verdict(spec, order).map_err(|e| {
            metrics::counter!(m::SPECS_REFUSED_TOTAL).increment(1);
            ProcessError::Poison(e.to_string())
        })
    }
}

fn encode_error(e: sluice_kit::CodecError) -> ProcessError {
    if e.is_retriable() {
        ProcessError::Retriable(e.to_string())
    } else {
        ProcessError::Fatal(format!("a resolver record does not encode: {e}"))
    }
}

fn decode_spec(
    runtime: &tokio::runtime::Handle,
    codec: &Codec,
    key: &str,
    bytes: &[u8],
) -> Result<DependencySpec, ProcessError> {
    let wire: WireSpec = runtime
        .block_on(codec.decode(SchemaName::DependencySpec, bytes))
        .map_err(|e| ProcessError::undecodable(&e))?;
    wire.into_spec(key)
        .map_err(|e| ProcessError::Poison(e.to_string()))
}

impl Processor for Resolve {
    /// A record of the dependencies topic: a new or changed spec, or a tombstone.
    fn process(&mut self, input: &Input<'_>) -> Result<Vec<Output>, ProcessError> {
        let key = input
            .key
            .and_then(|k| std::str::from_utf8(k).ok())
            .ok_or_else(|| ProcessError::Poison("dependency record without a UTF-8 key".into()))?
            .to_owned();
        if self
            .deps
            .get(&key)
            .is_some_and(|o| o.offset >= input.offset)
        {
            return Ok(Vec::new()); // already loaded by restore
        }
        let Some(bytes) = input.payload else {
            // Tombstone: the dependency is gone and its progress with it.
            let Some(old) = self.deps.get(&key) else {
                return Ok(Vec::new());
            };
            let partition = old.partition;
            self.save(&key);
            if let Some(old) = self.deps.remove(&key) {
                self.index_remove(&old.spec);
            }
            self.timed.remove(&key);
            metrics::gauge!(m::DEPENDENCIES).set(self.deps.len() as f64);
            tracing::info!(dependency = %key, "dependency deleted");
            return Ok(vec![self.progress_output(&key, partition, None)?]);
        };
        let spec = decode_spec(&self.runtime, &self.codec, &key, bytes).inspect_err(|e| {
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
        self.save(&key);
        let progress = match self.deps.remove(&key) {
            Some(old) => {
                self.index_remove(&old.spec);
                old.progress
            }
            None => Progress {
                version: spec.version,
                ..Progress::default()
            },
        };
        tracing::info!(dependency = %key, version = spec.version, mode = %spec.mode, "dependency accepted");
        self.index_add(&spec);
        self.deps.insert(
            key.clone(),
            Owned {
                spec,
                partition: input.partition,
                offset: input.offset,
                progress,
            },
        );
        metrics::gauge!(m::DEPENDENCIES).set(self.deps.len() as f64);
        if !self.table.caught_up() {
            self.recheck.insert(key);
            return Ok(Vec::new());
        }
        self.evaluate(&[(key, Cause::Change)])
    }

    fn tick(&mut self) -> Result<Vec<Output>, ProcessError> {
        if !self.table.caught_up() {
            if let Some(why) = self.table.failure() {
                return Err(ProcessError::Fatal(format!("asset-state reader: {why}")));
            }
            return Ok(Vec::new());
        }
        let mut work: Vec<(String, Cause)> = Vec::new();
        let mut seen: HashSet<String> = HashSet::new();
        for asset in self.table.drain_changed() {
            if let Some(ids) = self.index.get(&asset) {
                for id in ids {
                    if seen.insert(id.clone()) {
                        work.push((id.clone(), Cause::Change));
                    }
                }
            }
        }
        // A grant given or revoked: every owned dependency is judged again.
        if self.grants.as_ref().is_some_and(|g| g.take_changed()) {
            self.recheck.extend(self.deps.keys().cloned());
        }
        for id in std::mem::take(&mut self.recheck) {
            if seen.insert(id.clone()) {
                work.push((id, Cause::Recheck));
            }
        }
        let now = (self.clock)();
        for id in &self.timed {
            let due = self
                .deps
                .get(id)
                .and_then(|o| o.progress.fire_at_ms)
                .is_some_and(|at| at <= now);
            if due && seen.insert(id.clone()) {
                work.push((id.clone(), Cause::Recheck));
            }
        }
        if work.is_empty() {
            return Ok(Vec::new());
        }
        self.evaluate(&work)
    }

    fn assigned(&mut self, partitions: &[(String, i32)]) -> Result<(), ProcessError> {
        // Judging dependencies on a partial table would fire on stale combinations.
        if !self.table.wait_caught_up(self.timeout * 10) {
            return Err(ProcessError::Retriable(
                self.table
                    .failure()
                    .unwrap_or_else(|| "asset-state table not caught up yet".into()),
            ));
        }
        if let Some(g) = &self.grants
            && !g.wait_caught_up(self.timeout * 10)
        {
            return Err(ProcessError::Retriable(
                g.failure()
                    .unwrap_or_else(|| "grants not read to their end yet".into()),
            ));
        }
        let parts: BTreeSet<i32> = partitions.iter().map(|(_, p)| *p).collect();
        self.restore(&parts).map_err(ProcessError::Retriable)
    }

    fn revoked(&mut self, partitions: &[(String, i32)]) {
        let parts: BTreeSet<i32> = partitions.iter().map(|(_, p)| *p).collect();
        let gone: Vec<String> = self
            .deps
            .iter()
            .filter(|(_, o)| parts.contains(&o.partition))
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            if let Some(o) = self.deps.remove(&id) {
                self.index_remove(&o.spec);
            }
            self.timed.remove(&id);
            self.recheck.remove(&id);
            self.saved.remove(&id);
        }
        metrics::gauge!(m::DEPENDENCIES).set(self.deps.len() as f64);
    }

    fn committed(&mut self) {
        self.saved.clear();
    }

    fn aborted(&mut self) {
        // Roll progress back; the changes drained in the aborted pass are lost, so
        // every owned dependency is checked again.
        for (id, before) in std::mem::take(&mut self.saved) {
            match (before, self.deps.get_mut(&id)) {
                (Some(p), Some(o)) => o.progress = p,
                (None, Some(_)) => {
                    if let Some(o) = self.deps.remove(&id) {
                        self.index_remove(&o.spec);
                    }
                }
                _ => {}
            }
        }
        self.recheck.extend(self.deps.keys().cloned());
    }
}
