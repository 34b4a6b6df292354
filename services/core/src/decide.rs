//! The pure decision of one dependency: given its spec, its progress and the
//! current asset states, what fires now and what the progress becomes.
//!
//! No I/O and no clock: `now_ms` is passed in, so the integration tests and the
//! benchmark can compute the expected triggers with this same code, and a replay
//! after a crash decides exactly what the first run would have decided.

use std::collections::{BTreeMap, VecDeque};

use crate::asset::AssetKey;
use crate::condition::{Baseline, Scope};
use crate::dependency::{DependencySpec, MAX_WINDOWS_PER_PASS, Mode};
use crate::state::AssetState;
use crate::trigger::{InputVersion, TriggerBasis, TriggerKey};

/// Partitions remembered per partition dependency (oldest forgotten first).
pub const MAX_REMEMBERED_PARTITIONS: usize = 4_096;

/// What a dependency has done so far; the value of the resolver-progress topic.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    pub version: i64,
    pub last_trigger_key: Option<TriggerKey>,
    pub last_triggered_ms: Option<i64>,
    /// Each input as it was at the last trigger.
    pub baselines: BTreeMap<AssetKey, Baseline>,
    /// Coalescing: when the first change not yet fired was seen.
    pub pending_since_ms: Option<i64>,
    /// Coalescing: when the pending trigger may fire.
    pub fire_at_ms: Option<i64>,
    pub last_window_end_ms: Option<i64>,
    pub triggered_partitions: VecDeque<String>,
    pub triggers_total: u64,
    pub suppressed_total: u64,
}

impl Progress {
    /// Acknowledges `asset`'s current schema for a `schema_unchanged` input (see
    /// [`Baseline::acknowledge_schema`]). An input the dependency never fired on has
    /// no baseline and nothing to acknowledge: false.
    pub fn acknowledge_schema(&mut self, asset: &AssetKey, state: &AssetState) -> bool {
        self.baselines
            .get_mut(asset)
            .is_some_and(|b| b.acknowledge_schema(state))
    }
}

/// Why the dependency is looked at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// An input's state changed (restarts the quiet period).
    Change,
    /// A timer came due, or a sweep after restore (does not restart the quiet period).
    Recheck,
}

/// One trigger to emit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fire {
    pub key: TriggerKey,
    pub inputs: Vec<FiredInput>,
    pub partition: Option<String>,
    pub window_end_ms: Option<i64>,
    pub reason: String,
    /// Commit time of the newest input: where commit-to-dispatch latency starts.
    pub first_commit_ms: i64,
    pub requested_ms: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FiredInput {
    pub asset: AssetKey,
    pub snapshot_id: i64,
    pub sequence: i64,
    pub watermark_ms: Option<i64>,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub fires: Vec<Fire>,
    /// The progress changed and must be published.
    pub progress_changed: bool,
    /// A fire was computed whose key equals the last one sent; it was not sent again.
    pub suppressed: bool,
}

/// Decides for one dependency. `states` looks up an asset's current state.
pub fn step<'s>(
    spec: &DependencySpec,
    progress: &mut Progress,
    states: &impl Fn(&AssetKey) -> Option<&'s AssetState>,
    now_ms: i64,
    cause: Cause,
) -> Outcome {
    let mut out = Outcome::default();
    if progress.version != spec.version {
        // A new version keeps baselines (the same combination must not fire again)
        // but its coalescing may differ: timers restart under the new rules.
        progress.version = spec.version;
        progress.pending_since_ms = None;
        progress.fire_at_ms = None;
        out.progress_changed = true;
        // Once per version: a later version that still carries the acknowledgement
        // takes it again only while the input's schema is the one acknowledged.
        for (asset, schema_id) in &spec.schema_acknowledged {
            if let Some(state) = states(asset)
                && state.schema.map(|(_, id)| id) == Some(*schema_id)
            {
                progress.acknowledge_schema(asset, state);
            }
        }
    }
    match spec.mode {
        Mode::Snapshots => snapshots(spec, progress, states, now_ms, cause, &mut out),
        Mode::PerPartition => per_partition(spec, progress, states, now_ms, &mut out),
        Mode::Window { size_ms } => window(spec, progress, states, now_ms, size_ms, &mut out),
    }
    out
}

fn snapshots<'s>(
    spec: &DependencySpec,
    p: &mut Progress,
    states: &impl Fn(&AssetKey) -> Option<&'s AssetState>,
    now_ms: i64,
    cause: Cause,
    out: &mut Outcome,
) {
    let verdict = {
        let baselines = &p.baselines;
        spec.condition
            .evaluate_in(states, &|a| baselines.get(a), &Scope::snapshots(now_ms))
    };
    if !verdict.satisfied {
        // A check waiting only for time is looked at again when it comes due.
        let recheck = verdict.recheck_in_ms.map(|d| now_ms.saturating_add(d));
        if p.pending_since_ms.take().is_some() | (p.fire_at_ms != recheck) {
            p.fire_at_ms = recheck;
            out.progress_changed = true;
        }
        return;
    }
    let c = spec.coalescing;
    let earliest = p
        .last_triggered_ms
        .map_or(i64::MIN, |t| t.saturating_add(c.min_interval_ms));
    let fire_at = if c.quiet_period_ms > 0 {
        match (cause, p.fire_at_ms) {
            (Cause::Recheck, Some(at)) => at,
            _ => now_ms.saturating_add(c.quiet_period_ms).max(earliest),
        }
    } else {
        now_ms.max(earliest)
    };
    if now_ms < fire_at {
        if p.pending_since_ms.is_none() {
            p.pending_since_ms = Some(now_ms);
            out.progress_changed = true;
        }
        if p.fire_at_ms != Some(fire_at) {
            p.fire_at_ms = Some(fire_at);
            out.progress_changed = true;
        }
        return;
    }
    let inputs = combination(spec, states);
    let key = snapshots_key(spec, &inputs);
    // The trigger leaves every input's state behind as its baseline.
    for asset in spec.inputs() {
        if let Some(s) = states(&asset) {
            p.baselines.insert(asset, Baseline::of(s));
        }
    }
    p.pending_since_ms = None;
    p.fire_at_ms = None;
    out.progress_changed = true;
    if p.last_trigger_key.as_ref() == Some(&key) {
        // Predicates without `advanced` hold on and on; one combination fires once.
        p.suppressed_total += 1;
        out.suppressed = true;
        return;
    }
    let fire = Fire {
        first_commit_ms: newest_commit(&inputs, states),
        key: key.clone(),
        inputs,
        partition: None,
        window_end_ms: None,
        reason: verdict.reasons.join("; "),
        requested_ms: now_ms,
    };
    record(p, key, now_ms);
    out.fires.push(fire);
}

fn per_partition<'s>(
    spec: &DependencySpec,
    p: &mut Progress,
    states: &impl Fn(&AssetKey) -> Option<&'s AssetState>,
    now_ms: i64,
    out: &mut Outcome,
) {
    for part in partition_candidates(spec, states) {
        if p.triggered_partitions.contains(&part) {
            continue;
        }
        let baselines = &p.baselines;
        let verdict = spec.condition.evaluate_in(
            states,
            &|a| baselines.get(a),
            &Scope::partition(&part, now_ms),
        );
        if !verdict.satisfied {
            continue;
        }
        let key = TriggerKey::derive(
            &spec.target.identity(),
            &spec.id,
            &TriggerBasis::Partition(part.clone()),
        );
        let inputs = combination(spec, states);
        out.fires.push(Fire {
            first_commit_ms: newest_commit(&inputs, states),
            key: key.clone(),
            inputs,
            partition: Some(part.clone()),
            window_end_ms: None,
            reason: format!("partition {part}: {}", verdict.reasons.join("; ")),
            requested_ms: now_ms,
        });
        p.triggered_partitions.push_back(part);
        if p.triggered_partitions.len() > MAX_REMEMBERED_PARTITIONS {
            p.triggered_partitions.pop_front();
        }
        record(p, key, now_ms);
        out.progress_changed = true;
    }
}

fn window<'s>(
    spec: &DependencySpec,
    p: &mut Progress,
    states: &impl Fn(&AssetKey) -> Option<&'s AssetState>,
    now_ms: i64,
    size_ms: i64,
    out: &mut Outcome,
) {
    let Some(newest_end) = newest_window_end(spec, states, size_ms) else {
        return;
    };
    let mut end = match p.last_window_end_ms {
        Some(last) => last.saturating_add(size_ms),
        // A new dependency fires for the newest window already closed on its inputs
        // only: it does not replay history from the epoch.
        None => {
            let closed = (0..MAX_WINDOWS_PER_PASS as i64)
                .map(|i| newest_end.saturating_sub(i.saturating_mul(size_ms)))
                .find(|&end| {
                    let baselines = &p.baselines;
                    spec.condition
                        .evaluate_in(states, &|a| baselines.get(a), &Scope::window(end, now_ms))
                        .satisfied
                });
            match closed {
                Some(end) => end,
                None => return,
            }
        }
    };
    for _ in 0..MAX_WINDOWS_PER_PASS {
        if end > newest_end {
            break;
        }
        let baselines = &p.baselines;
        let verdict =
            spec.condition
                .evaluate_in(states, &|a| baselines.get(a), &Scope::window(end, now_ms));
        if !verdict.satisfied {
            break;
        }
        let key = TriggerKey::derive(
            &spec.target.identity(),
            &spec.id,
            &TriggerBasis::Window { end_ms: end },
        );
        let inputs = combination(spec, states);
        out.fires.push(Fire {
            first_commit_ms: newest_commit(&inputs, states),
            key: key.clone(),
            inputs,
            partition: None,
            window_end_ms: Some(end),
            reason: format!("window ending {end}: {}", verdict.reasons.join("; ")),
            requested_ms: now_ms,
        });
        p.last_window_end_ms = Some(end);
        record(p, key, now_ms);
        out.progress_changed = true;
        end = end.saturating_add(size_ms);
    }
}

/// The key of a snapshot-combination trigger.
pub(crate) fn snapshots_key(spec: &DependencySpec, inputs: &[FiredInput]) -> TriggerKey {
    let basis = TriggerBasis::Snapshots(
        inputs
            .iter()
            .map(|i| InputVersion {
                asset_key: i.asset.clone(),
                snapshot_id: i.snapshot_id,
                sequence: i.sequence,
            })
            .collect(),
    );
    TriggerKey::derive(&spec.target.identity(), &spec.id, &basis)
}

/// The candidates of a per-partition dependency: every partition some input
/// remembers committing, in a stable order.
pub(crate) fn partition_candidates<'s>(
    spec: &DependencySpec,
    states: &impl Fn(&AssetKey) -> Option<&'s AssetState>,
) -> Vec<String> {
    let mut candidates: Vec<String> = spec
        .inputs()
        .iter()
        .filter_map(states)
        .flat_map(|s| s.recent_partitions().into_iter().map(str::to_owned))
        .collect();
    candidates.sort();
    candidates.dedup();
    candidates
}

/// The end of the newest window closed on any input's watermark.
pub(crate) fn newest_window_end<'s>(
    spec: &DependencySpec,
    states: &impl Fn(&AssetKey) -> Option<&'s AssetState>,
    size_ms: i64,
) -> Option<i64> {
    spec.inputs()
        .iter()
        .filter_map(|a| states(a).and_then(|s| s.watermark_ms))
        .max()
        .map(|newest| newest.div_euclid(size_ms) * size_ms)
}

fn record(p: &mut Progress, key: TriggerKey, now_ms: i64) {
    p.last_trigger_key = Some(key);
    p.last_triggered_ms = Some(now_ms);
    p.triggers_total += 1;
}

/// The current snapshot of every input that has one, sorted by asset.
pub(crate) fn combination<'s>(
    spec: &DependencySpec,
    states: &impl Fn(&AssetKey) -> Option<&'s AssetState>,
) -> Vec<FiredInput> {
    spec.inputs()
        .into_iter()
        .filter_map(|asset| {
            let s = states(&asset)?;
            let c = s.latest.as_ref()?;
            Some(FiredInput {
                snapshot_id: c.snapshot_id,
                sequence: c.sequence,
                watermark_ms: s.watermark_ms,
                asset,
            })
        })
        .collect()
}

fn newest_commit<'s>(
    inputs: &[FiredInput],
    states: &impl Fn(&AssetKey) -> Option<&'s AssetState>,
) -> i64 {
    inputs
        .iter()
        .filter_map(|i| states(&i.asset).and_then(|s| s.latest.as_ref()))
        .map(|c| c.commit_time_ms)
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::{AssetEvent, EventSource, InputCondition, Operation, Predicate, TableFormat};

    use super::*;
    use crate::Condition;
    use crate::dependency::{Coalescing, Target, TargetKind};

    fn k(s: &str) -> AssetKey {
        AssetKey::parse(s).expect("valid key")
    }

    fn leaf(a: &str, predicates: Vec<Predicate>) -> Condition {
        Condition::Input(InputCondition {
            asset: k(a),
            predicates,
        })
    }

    fn spec(condition: Condition) -> DependencySpec {
        DependencySpec {
            id: "dep".into(),
            version: 1,
            owner_project: "p".into(),
            target: Target {
                kind: TargetKind::Airflow,
                name: "dag".into(),
                parameters: BTreeMap::new(),
            },
            condition,
            mode: Mode::Snapshots,
            coalescing: Coalescing::default(),
            produces: None,
            paused: false,
            schema_acknowledged: Default::default(),
        }
    }

    #[derive(Default)]
    struct World(BTreeMap<AssetKey, AssetState>);

    impl World {
        /// A data commit at `seq`, then a schema change to `schema` at the same sequence.
        fn schema(&mut self, a: &str, seq: i64, schema: i64) {
            self.data(a, seq);
            let key = k(a);
            let mut e = AssetEvent::new(
                key.clone(),
                TableFormat::Iceberg,
                crate::EventKind::SchemaChanged,
                seq * 10,
                seq,
                seq * 1000,
                EventSource::Poll,
            );
            e.schema_id = Some(schema);
            self.0.get_mut(&key).expect("state").apply(&e);
        }

        fn commit(&mut self, a: &str, seq: i64, part: &str, watermark: Option<i64>, op: Operation) {
            let key = k(a);
            let s = self
                .0
                .entry(key.clone())
                .or_insert_with(|| AssetState::new(key.clone(), TableFormat::Iceberg));
            let mut e = AssetEvent::committed(
                key,
                TableFormat::Iceberg,
                seq * 10,
                seq,
                seq * 1000,
                EventSource::Push,
            );
            e.partitions = vec![part.to_owned()];
            e.watermark_ms = watermark;
            e.operation = op;
            s.apply(&e);
        }
        fn data(&mut self, a: &str, seq: i64) {
            self.commit(a, seq, "dt=1", None, Operation::Append);
        }
        fn step(&self, spec: &DependencySpec, p: &mut Progress, now: i64, cause: Cause) -> Outcome {
            step(spec, p, &|a| self.0.get(a), now, cause)
        }
    }

    #[test]
    fn all_fires_once_per_combination_and_any_on_either() {
        let all = spec(Condition::All(vec![
            leaf("l.o.a", vec![]),
            leaf("l.o.b", vec![]),
        ]));
        let mut w = World::default();
        let mut p = Progress::default();
        w.data("l.o.a", 1);
        assert!(
            w.step(&all, &mut p, 0, Cause::Change).fires.is_empty(),
            "b unknown"
        );
        w.data("l.o.b", 1);
        let o = w.step(&all, &mut p, 0, Cause::Change);
        assert_eq!(o.fires.len(), 1);
        assert_eq!(o.fires[0].inputs.len(), 2);
        assert!(o.fires[0].reason.contains("l.o.a: advanced"));
        assert!(
            w.step(&all, &mut p, 0, Cause::Recheck).fires.is_empty(),
            "same combination"
        );
        w.data("l.o.a", 2);
        assert!(
            w.step(&all, &mut p, 0, Cause::Change).fires.is_empty(),
            "b did not advance"
        );
        w.data("l.o.b", 2);
        assert_eq!(w.step(&all, &mut p, 0, Cause::Change).fires.len(), 1);

        let any = spec(Condition::Any(vec![
            leaf("l.o.a", vec![]),
            leaf("l.o.b", vec![]),
        ]));
        let mut p = Progress::default();
        assert_eq!(w.step(&any, &mut p, 0, Cause::Change).fires.len(), 1);
        w.data("l.o.b", 3);
        let o = w.step(&any, &mut p, 0, Cause::Change);
        assert_eq!(o.fires.len(), 1);
        assert_eq!(o.fires[0].reason, "l.o.b: advanced");
    }

    #[test]
    fn a_persistent_condition_fires_one_combination_once() {
        let s = spec(leaf("l.o.a", vec![Predicate::SchemaUnchanged]));
        let mut w = World::default();
        w.data("l.o.a", 1);
        let mut p = Progress::default();
        assert_eq!(w.step(&s, &mut p, 0, Cause::Change).fires.len(), 1);
        let o = w.step(&s, &mut p, 0, Cause::Recheck);
        assert!(o.fires.is_empty() && o.suppressed);
        assert_eq!(p.suppressed_total, 1);
    }

    #[test]
    fn commits_since_trigger_counts_delta_commits() {
        let s = spec(leaf(
            "l.o.a",
            vec![Predicate::CommitsSinceTrigger {
                at_least: 3,
                include_compaction: false,
            }],
        ));
        let mut w = World::default();
        let mut p = Progress::default();
        let mut fired = 0;
        for seq in 1..=10 {
            w.data("l.o.a", seq);
            fired += w.step(&s, &mut p, 0, Cause::Change).fires.len();
        }
        assert_eq!(fired, 3, "after commits 3, 6 and 9");
    }

    #[test]
    fn a_compaction_policy_requests_one_compaction_at_a_time() {
        use crate::table_service::{Service, Strategy};
        let policy = spec(leaf(
            "l.o.t",
            vec![Predicate::TableService(crate::table_service::Policy {
                service: Service::Compaction,
                strategy: Strategy::NumCommits,
                num_commits: 4,
                delta_seconds: 3_600,
            })],
        ));
        let business = spec(leaf("l.o.t", vec![]));
        let mut w = World::default();
        let (mut pp, mut pb) = (Progress::default(), Progress::default());
        let mut run = |w: &World| {
            (
                w.step(&policy, &mut pp, 0, Cause::Change).fires.len(),
                w.step(&business, &mut pb, 0, Cause::Change).fires.len(),
            )
        };
        let mut fired = Vec::new();
        // Five delta commits: the fourth requests a compaction; the fifth finds
        // it in flight.
        for seq in 1..=5 {
            w.data("l.o.t", seq);
            fired.push(run(&w));
        }
        assert_eq!(fired, [(0, 1), (0, 1), (0, 1), (1, 1), (0, 1)]);
        // The compaction completes (sequence 6): the count starts again from it,
        // and the business dependency does not fire on it.
        w.commit("l.o.t", 6, "dt=1", None, Operation::Compact);
        assert_eq!(run(&w), (0, 0));
        let mut fired = Vec::new();
        for seq in 7..=10 {
            w.data("l.o.t", seq);
            fired.push(run(&w).0);
        }
        assert_eq!(fired, [0, 0, 0, 1], "four delta commits after it");
    }

    #[test]
    fn a_time_policy_fires_on_time_on_a_table_that_stopped_committing() {
        use crate::table_service::{Service, Strategy};
        let policy = spec(leaf(
            "l.o.t",
            vec![Predicate::TableService(crate::table_service::Policy {
                service: Service::Compaction,
                strategy: Strategy::TimeElapsed,
                num_commits: 5,
                delta_seconds: 10,
            })],
        ));
        let mut w = World::default();
        let mut p = Progress::default();
        w.data("l.o.t", 1); // committed at t = 1 s, then nothing more
        let o = w.step(&policy, &mut p, 3_000, Cause::Change);
        assert!(o.fires.is_empty());
        assert_eq!(p.fire_at_ms, Some(11_000), "looked at again 10 s after it");
        assert!(w.step(&policy, &mut p, 11_000, Cause::Recheck).fires.len() == 1);
        // Fired: the next request waits for a compaction (no timer meanwhile).
        let o = w.step(&policy, &mut p, 12_000, Cause::Recheck);
        assert!(o.fires.is_empty());
        assert_eq!(p.fire_at_ms, None);
    }

    #[test]
    fn per_partition_fires_once_per_partition_every_input_committed() {
        let mut s = spec(Condition::All(vec![
            leaf("l.o.a", vec![]),
            leaf("l.o.b", vec![]),
        ]));
        s.mode = Mode::PerPartition;
        let mut w = World::default();
        let mut p = Progress::default();
        w.commit("l.o.a", 1, "dt=1", None, Operation::Append);
        w.commit("l.o.a", 2, "dt=2", None, Operation::Append);
        w.commit("l.o.b", 1, "dt=1", None, Operation::Append);
        let o = w.step(&s, &mut p, 0, Cause::Change);
        assert_eq!(o.fires.len(), 1);
        assert_eq!(o.fires[0].partition.as_deref(), Some("dt=1"));
        let first = o.fires[0].key.clone();
        w.commit("l.o.b", 2, "dt=1", None, Operation::Append);
        assert!(
            w.step(&s, &mut p, 0, Cause::Change).fires.is_empty(),
            "dt=1 already fired"
        );
        w.commit("l.o.b", 3, "dt=2", None, Operation::Append);
        let o = w.step(&s, &mut p, 0, Cause::Change);
        assert_eq!(o.fires[0].partition.as_deref(), Some("dt=2"));
        assert_ne!(o.fires[0].key, first, "keyed by the partition");
    }

    #[test]
    fn window_fires_once_per_window_all_inputs_passed() {
        let mut s = spec(Condition::All(vec![
            leaf("l.o.a", vec![]),
            leaf("l.o.b", vec![]),
        ]));
        s.mode = Mode::Window { size_ms: 100 };
        let mut w = World::default();
        let mut p = Progress::default();
        w.commit("l.o.a", 1, "x", Some(250), Operation::Append);
        w.commit("l.o.b", 1, "x", Some(150), Operation::Append);
        let o = w.step(&s, &mut p, 0, Cause::Change);
        assert_eq!(
            o.fires.iter().map(|f| f.window_end_ms).collect::<Vec<_>>(),
            vec![Some(100)],
            "a new dependency starts at the newest window closed on every input"
        );
        w.commit("l.o.b", 2, "x", Some(420), Operation::Append);
        let o = w.step(&s, &mut p, 0, Cause::Change);
        assert_eq!(
            o.fires.iter().map(|f| f.window_end_ms).collect::<Vec<_>>(),
            vec![Some(200)],
            "a holds 300 back"
        );
        w.commit("l.o.a", 2, "x", Some(430), Operation::Append);
        let o = w.step(&s, &mut p, 0, Cause::Change);
        assert_eq!(
            o.fires.iter().map(|f| f.window_end_ms).collect::<Vec<_>>(),
            vec![Some(300), Some(400)],
            "one trigger per window, none skipped"
        );
    }

    #[test]
    fn quiet_period_collapses_a_burst_into_the_newest_combination() {
        let mut s = spec(leaf("l.o.a", vec![]));
        s.coalescing.quiet_period_ms = 1_000;
        let mut w = World::default();
        let mut p = Progress::default();
        for (seq, now) in [(1, 0), (2, 500), (3, 900)] {
            w.data("l.o.a", seq);
            assert!(w.step(&s, &mut p, now, Cause::Change).fires.is_empty());
        }
        assert_eq!(
            p.fire_at_ms,
            Some(1_900),
            "each change restarts the quiet period"
        );
        assert_eq!(p.pending_since_ms, Some(0));
        assert!(w.step(&s, &mut p, 1_800, Cause::Recheck).fires.is_empty());
        let o = w.step(&s, &mut p, 1_900, Cause::Recheck);
        assert_eq!(o.fires.len(), 1);
        assert_eq!(o.fires[0].inputs[0].sequence, 3, "the newest combination");
        assert_eq!(p.fire_at_ms, None);
    }

    #[test]
    fn min_interval_spaces_triggers() {
        let mut s = spec(leaf("l.o.a", vec![]));
        s.coalescing.min_interval_ms = 1_000;
        let mut w = World::default();
        let mut p = Progress::default();
        w.data("l.o.a", 1);
        assert_eq!(w.step(&s, &mut p, 0, Cause::Change).fires.len(), 1);
        w.data("l.o.a", 2);
        assert!(w.step(&s, &mut p, 400, Cause::Change).fires.is_empty());
        assert_eq!(p.fire_at_ms, Some(1_000));
        w.data("l.o.a", 3);
        let o = w.step(&s, &mut p, 1_000, Cause::Recheck);
        assert_eq!(o.fires.len(), 1);
        assert_eq!(o.fires[0].inputs[0].sequence, 3);
    }

    #[test]
    fn a_new_version_keeps_baselines_and_restarts_timers() {
        let mut s = spec(leaf("l.o.a", vec![]));
        let mut w = World::default();
        let mut p = Progress::default();
        w.data("l.o.a", 1);
        assert_eq!(w.step(&s, &mut p, 0, Cause::Change).fires.len(), 1);
        s.version = 2;
        s.coalescing.quiet_period_ms = 10;
        let o = w.step(&s, &mut p, 5, Cause::Change);
        assert!(
            o.fires.is_empty(),
            "the same combination does not fire again"
        );
        assert_eq!(p.version, 2);
        assert!(o.progress_changed);
    }

    #[test]
    fn a_schema_change_shuts_schema_unchanged_until_acknowledged() {
        let s = spec(leaf("l.o.a", vec![Predicate::SchemaUnchanged]));
        let mut w = World::default();
        let mut p = Progress::default();
        let with_schema = |w: &mut World, seq: i64, schema: i64| w.schema("l.o.a", seq, schema);
        with_schema(&mut w, 1, 0);
        assert_eq!(w.step(&s, &mut p, 0, Cause::Change).fires.len(), 1);
        with_schema(&mut w, 2, 1); // the schema changed
        assert!(w.step(&s, &mut p, 0, Cause::Change).fires.is_empty());
        w.data("l.o.a", 3);
        assert!(
            w.step(&s, &mut p, 0, Cause::Change).fires.is_empty(),
            "stays shut: the baseline moves only on a trigger"
        );
        let state = w.0[&k("l.o.a")].clone();
        assert!(p.acknowledge_schema(&k("l.o.a"), &state));
        assert!(!p.acknowledge_schema(&k("l.o.a"), &state), "once");
        assert_eq!(
            w.step(&s, &mut p, 0, Cause::Change).fires.len(),
            1,
            "acknowledged: the newest commit fires"
        );
        assert!(!p.acknowledge_schema(&k("l.o.b"), &state), "not an input");
    }

    #[test]
    fn a_version_acknowledging_the_current_schema_opens_once_and_a_stale_one_does_not() {
        let mut s = spec(leaf("l.o.a", vec![Predicate::SchemaUnchanged]));
        let mut w = World::default();
        let mut p = Progress::default();
        let with_schema = |w: &mut World, seq: i64, schema: i64| w.schema("l.o.a", seq, schema);
        with_schema(&mut w, 1, 0);
        assert_eq!(w.step(&s, &mut p, 0, Cause::Change).fires.len(), 1);
        with_schema(&mut w, 2, 1);
        assert!(w.step(&s, &mut p, 0, Cause::Change).fires.is_empty());

        // A version acknowledging a schema the input no longer has changes nothing.
        s.version = 2;
        s.schema_acknowledged = BTreeMap::from([(k("l.o.a"), 0)]);
        assert!(w.step(&s, &mut p, 0, Cause::Change).fires.is_empty());

        // One acknowledging the current schema opens it: the newest commit fires once.
        s.version = 3;
        s.schema_acknowledged = BTreeMap::from([(k("l.o.a"), 1)]);
        assert_eq!(w.step(&s, &mut p, 0, Cause::Change).fires.len(), 1);
        assert!(w.step(&s, &mut p, 0, Cause::Change).fires.is_empty());

        // The next change shuts it again: the acknowledgement was taken once.
        with_schema(&mut w, 3, 2);
        assert!(w.step(&s, &mut p, 0, Cause::Change).fires.is_empty());
    }

    #[test]
    fn a_predicate_that_stops_holding_cancels_the_pending_timer() {
        let mut s = spec(leaf(
            "l.o.a",
            vec![Predicate::FreshWithin { max_age_ms: 5_000 }],
        ));
        s.coalescing.quiet_period_ms = 10_000;
        let mut w = World::default();
        let mut p = Progress::default();
        w.data("l.o.a", 1); // committed at 1_000
        assert!(w.step(&s, &mut p, 2_000, Cause::Change).fires.is_empty());
        assert!(p.fire_at_ms.is_some());
        let o = w.step(&s, &mut p, 12_000, Cause::Recheck);
        assert!(
            o.fires.is_empty() && p.fire_at_ms.is_none(),
            "stale by then"
        );
    }
}
