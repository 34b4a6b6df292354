//! "Why did / didn't it run": one dependency as of now, told by the evaluator the
//! resolver decides with ([`Condition::explain_in`]) under the same firing rules as
//! [`decide::step`](crate::decide::step) — coalescing timers, the last trigger key,
//! the partitions and windows still open. A property test holds the two together.

use serde::Serialize;

use crate::asset::AssetKey;
use crate::condition::{Explained, Scope};
use crate::decide::{
    Progress, combination, newest_window_end, partition_candidates, snapshots_key,
};
use crate::dependency::{DependencySpec, MAX_WINDOWS_PER_PASS, Mode};
use crate::state::AssetState;
use crate::trigger::{TriggerBasis, TriggerKey};

/// Pending partitions listed at most (the count is always exact).
pub const MAX_LISTED_PARTITIONS: usize = 100;

/// Where a dependency stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The condition does not hold; `unmet` says what is missing.
    Waiting,
    /// The condition holds; a coalescing timer holds the trigger until `fire_at_ms`.
    Pending,
    /// The condition holds and nothing holds it back: the resolver fires on its
    /// next look (a change or a timer).
    Ready,
    /// The condition holds, but for the combination that already triggered: one
    /// combination fires once.
    UpToDate,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Explanation {
    pub dependency_id: String,
    pub version: i64,
    pub mode: String,
    pub now_ms: i64,
    /// Paused: `status` is what the evaluation says, but nothing fires until a resume.
    pub paused: bool,
    pub status: Status,
    /// One line for people: the status and its reasons.
    pub summary: String,
    /// Every failed check, `asset: predicate — values`, in tree order.
    pub unmet: Vec<String>,
    /// The condition tree evaluated in the scope shown: the next combination, the
    /// first pending partition, or the next window.
    pub condition: Explained,
    pub last_trigger_key: Option<String>,
    pub last_triggered_ms: Option<i64>,
    /// The key the next trigger would carry, where the condition holds.
    pub next_trigger_key: Option<String>,
    pub timers: Timers,
    /// Per-partition mode: the partitions some input committed that have not yet
    /// triggered.
    pub partitions: Option<Partitions>,
    /// Window mode: the next window to trigger.
    pub window_end_ms: Option<i64>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Timers {
    pub min_interval_ms: i64,
    pub quiet_period_ms: i64,
    /// When the first change not yet fired was seen.
    pub pending_since_ms: Option<i64>,
    /// When the held trigger fires.
    pub fire_at_ms: Option<i64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Partitions {
    pub pending: usize,
    pub ready: usize,
    /// The first [`MAX_LISTED_PARTITIONS`] pending, in key order.
    pub listed: Vec<PendingPartition>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PendingPartition {
    pub partition: String,
    pub ready: bool,
    pub unmet: Vec<String>,
}

/// Explains `spec` with `progress` over the current `states` at `now_ms`.
pub fn explain<'s>(
    spec: &DependencySpec,
    progress: &Progress,
    states: &impl Fn(&AssetKey) -> Option<&'s AssetState>,
    now_ms: i64,
) -> Explanation {
    let baselines = |a: &AssetKey| progress.baselines.get(a);
    // A new version restarts the timers (as `step` does) but keeps the baselines.
    let timers_apply = progress.version == spec.version;
    let mut out = Explanation {
        dependency_id: spec.id.clone(),
        version: spec.version,
        mode: spec.mode.to_string(),
        now_ms,
        paused: spec.paused,
        status: Status::Waiting,
        summary: String::new(),
        unmet: Vec::new(),
        condition: spec
            .condition
            .explain_in(states, &baselines, &Scope::snapshots(now_ms)),
        last_trigger_key: progress
            .last_trigger_key
            .as_ref()
            .map(|k| k.as_str().to_owned()),
        last_triggered_ms: progress.last_triggered_ms,
        next_trigger_key: None,
        timers: Timers {
            min_interval_ms: spec.coalescing.min_interval_ms,
            quiet_period_ms: spec.coalescing.quiet_period_ms,
            pending_since_ms: progress.pending_since_ms.filter(|_| timers_apply),
            fire_at_ms: progress.fire_at_ms.filter(|_| timers_apply),
        },
        partitions: None,
        window_end_ms: None,
    };
    match spec.mode {
        Mode::Snapshots => snapshots(spec, progress, states, now_ms, &mut out),
        Mode::PerPartition => per_partition(spec, progress, states, now_ms, &mut out),
        Mode::Window { size_ms } => window(spec, progress, states, now_ms, size_ms, &mut out),
    }
    if spec.paused {
        let withheld = if matches!(out.status, Status::Ready | Status::Pending) {
            "; it would fire now and is withheld (a resume fires the newest combination once)"
        } else {
            ""
        };
        out.summary = format!("paused — {}{withheld}", out.summary);
    }
    out
}

fn snapshots<'s>(
    spec: &DependencySpec,
    progress: &Progress,
    states: &impl Fn(&AssetKey) -> Option<&'s AssetState>,
    now_ms: i64,
    out: &mut Explanation,
) {
    let verdict = out.condition.verdict();
    if !verdict.satisfied {
        out.summary = format!("waiting: {}", verdict.unmet.join("; "));
        if let Some(due) = verdict.recheck_in_ms {
            out.summary += &format!(
                "; looked at again at {} ({due} ms from now), when its time comes due",
                now_ms.saturating_add(due)
            );
        }
        out.unmet = verdict.unmet;
        return;
    }
    let key = snapshots_key(spec, &combination(spec, states));
    out.next_trigger_key = Some(key.as_str().to_owned());
    // The firing time exactly as `step` computes it on a recheck.
    let c = spec.coalescing;
    let earliest = progress
        .last_triggered_ms
        .map_or(i64::MIN, |t| t.saturating_add(c.min_interval_ms));
    let fire_at = if c.quiet_period_ms > 0 {
        match out.timers.fire_at_ms {
            Some(at) => at,
            None => now_ms.saturating_add(c.quiet_period_ms).max(earliest),
        }
    } else {
        now_ms.max(earliest)
    };
    if now_ms < fire_at {
        out.status = Status::Pending;
        out.timers.fire_at_ms = Some(fire_at);
        let why = if c.quiet_period_ms > 0 && out.timers.pending_since_ms.is_some() {
            format!("quiet period of {} ms", c.quiet_period_ms)
        } else if c.quiet_period_ms > 0 {
            format!(
                "a quiet period of {} ms starts on the next look",
                c.quiet_period_ms
            )
        } else {
            format!(
                "min interval of {} ms since the last trigger",
                c.min_interval_ms
            )
        };
        out.summary = format!(
            "pending: the condition holds; fires at {fire_at} ({} ms from now, {why})",
            fire_at - now_ms
        );
    } else if progress.last_trigger_key.as_ref() == Some(&key) {
        out.status = Status::UpToDate;
        out.summary = format!(
            "up to date: the current combination already triggered as {}",
            key.as_str()
        );
    } else {
        out.status = Status::Ready;
        out.summary = format!(
            "ready: the condition holds ({}); fires as {}",
            verdict.reasons.join("; "),
            key.as_str()
        );
    }
}

fn per_partition<'s>(
    spec: &DependencySpec,
    progress: &Progress,
    states: &impl Fn(&AssetKey) -> Option<&'s AssetState>,
    now_ms: i64,
    out: &mut Explanation,
) {
    let baselines = |a: &AssetKey| progress.baselines.get(a);
    let mut parts = Partitions {
        pending: 0,
        ready: 0,
        listed: Vec::new(),
    };
    let mut first: Option<(Explained, String)> = None;
    for part in partition_candidates(spec, states) {
        if progress.triggered_partitions.contains(&part) {
            continue;
        }
        let explained =
            spec.condition
                .explain_in(states, &baselines, &Scope::partition(&part, now_ms));
        let verdict = explained.verdict();
        parts.pending += 1;
        parts.ready += usize::from(verdict.satisfied);
        if parts.listed.len() < MAX_LISTED_PARTITIONS {
            parts.listed.push(PendingPartition {
                partition: part.clone(),
                ready: verdict.satisfied,
                unmet: verdict.unmet,
            });
        }
        // Show the tree of the first partition that fires, else of the first pending.
        if first
            .as_ref()
            .is_none_or(|(e, _)| !e.satisfied() && verdict.satisfied)
        {
            first = Some((explained, part));
        }
    }
    match first {
        Some((explained, part)) => {
            out.condition = explained;
            let verdict = out.condition.verdict();
            if verdict.satisfied {
                out.status = Status::Ready;
                out.next_trigger_key = Some(
                    TriggerKey::derive(
                        &spec.target.identity(),
                        &spec.id,
                        &TriggerBasis::Partition(part.clone()),
                    )
                    .as_str()
                    .to_owned(),
                );
                out.summary = format!(
                    "ready: {} of {} pending partitions can fire, first {part}",
                    parts.ready, parts.pending
                );
            } else {
                out.summary = format!(
                    "waiting: {} partitions pending, none complete; {part}: {}",
                    parts.pending,
                    verdict.unmet.join("; ")
                );
                out.unmet = verdict.unmet;
            }
        }
        None => {
            out.status = Status::UpToDate;
            out.summary = "up to date: every partition the inputs committed has triggered".into();
        }
    }
    out.partitions = Some(parts);
}

fn window<'s>(
    spec: &DependencySpec,
    progress: &Progress,
    states: &impl Fn(&AssetKey) -> Option<&'s AssetState>,
    now_ms: i64,
    size_ms: i64,
    out: &mut Explanation,
) {
    let baselines = |a: &AssetKey| progress.baselines.get(a);
    let Some(newest_end) = newest_window_end(spec, states, size_ms) else {
        out.summary = "waiting: no input has a watermark yet".into();
        out.unmet = vec!["every input: no watermark yet".into()];
        return;
    };
    let scope = |end| Scope::window(end, now_ms);
    let end = match progress.last_window_end_ms {
        Some(last) => last.saturating_add(size_ms),
        // As `step`: a new dependency starts at the newest window already closed.
        None => (0..MAX_WINDOWS_PER_PASS as i64)
            .map(|i| newest_end.saturating_sub(i.saturating_mul(size_ms)))
            .find(|&end| {
                spec.condition
                    .explain_in(states, &baselines, &scope(end))
                    .satisfied()
            })
            .unwrap_or(newest_end),
    };
    out.window_end_ms = Some(end);
    out.condition = spec.condition.explain_in(states, &baselines, &scope(end));
    let verdict = out.condition.verdict();
    if verdict.satisfied && end <= newest_end {
        out.status = Status::Ready;
        out.next_trigger_key = Some(
            TriggerKey::derive(
                &spec.target.identity(),
                &spec.id,
                &TriggerBasis::Window { end_ms: end },
            )
            .as_str()
            .to_owned(),
        );
        out.summary = format!("ready: the window ending at {end} closed on every input");
    } else {
        let mut unmet = verdict.unmet;
        if end > newest_end {
            unmet.push(format!(
                "no input's watermark has reached {end} (newest closed window ends at {newest_end})"
            ));
        }
        out.summary = format!(
            "waiting for the window ending at {end}: {}",
            unmet.join("; ")
        );
        out.unmet = unmet;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::decide::{Cause, step};
    use crate::dependency::{Coalescing, Target, TargetKind};
    use crate::event::{EventKind, QualityStatus};
    use crate::{
        AssetEvent, Condition, EventSource, InputCondition, Operation, Predicate, TableFormat,
    };

    const ASSETS: [&str; 3] = ["l.o.a", "l.o.b", "l.o.c"];

    fn k(s: &str) -> AssetKey {
        AssetKey::parse(s).expect("valid key")
    }

    /// One thing that happens to the world between looks.
    #[derive(Clone, Debug)]
    enum Happening {
        Commit {
            asset: usize,
            part: u8,
            watermark: i64,
            compaction: bool,
        },
        Quality {
            asset: usize,
            passed: bool,
        },
        Schema {
            asset: usize,
            id: i64,
        },
        Look {
            after_ms: i64,
            change: bool,
        },
    }

    fn happening() -> impl Strategy<Value = Happening> {
        prop_oneof![
            4 => (0..3usize, 0..4u8, 0..50_000i64, any::<bool>()).prop_map(|(asset, part, watermark, compaction)| {
                Happening::Commit { asset, part, watermark, compaction }
            }),
            1 => (0..3usize, any::<bool>()).prop_map(|(asset, passed)| Happening::Quality { asset, passed }),
            1 => (0..3usize, 1..3i64).prop_map(|(asset, id)| Happening::Schema { asset, id }),
            3 => (0..3_000i64, any::<bool>()).prop_map(|(after_ms, change)| Happening::Look { after_ms, change }),
        ]
    }

    fn predicates() -> impl Strategy<Value = Vec<Predicate>> {
        prop::collection::vec(
            prop_oneof![
                any::<bool>().prop_map(|c| Predicate::Advanced {
                    include_compaction: c
                }),
                (0..50_000i64).prop_map(|w| Predicate::WatermarkAtLeast { watermark_ms: w }),
                Just(Predicate::QualityPassed),
                (1..3i64).prop_map(|id| Predicate::SchemaEquals { schema_id: id }),
                Just(Predicate::SchemaUnchanged),
                (0..4u8).prop_map(|p| Predicate::PartitionCommitted {
                    partition: format!("p={p}")
                }),
                (1..4u64, any::<bool>()).prop_map(|(n, c)| Predicate::CommitsSinceTrigger {
                    at_least: n,
                    include_compaction: c
                }),
                (1..5_000i64).prop_map(|m| Predicate::FreshWithin { max_age_ms: m }),
                (0..5usize, 1..4u64, 1..5i64).prop_map(|(s, n, t)| Predicate::TableService(
                    crate::table_service::Policy {
                        service: crate::table_service::Service::Compaction,
                        strategy: crate::table_service::Strategy::ALL[s],
                        num_commits: n,
                        delta_seconds: t,
                    }
                )),
            ],
            0..3,
        )
    }

    fn spec() -> impl Strategy<Value = DependencySpec> {
        (
            any::<bool>(),
            prop::collection::vec(predicates(), 2..=3),
            prop_oneof![
                Just(Mode::Snapshots),
                Just(Mode::PerPartition),
                (1..4i64).prop_map(|n| Mode::Window {
                    size_ms: n * 10_000
                })
            ],
            prop_oneof![Just(0i64), 1..2_000i64],
            prop_oneof![Just(0i64), 1..2_000i64],
        )
            .prop_map(|(all, inputs, mode, min_interval_ms, quiet_period_ms)| {
                let leaves = inputs
                    .into_iter()
                    .enumerate()
                    .map(|(i, mut predicates)| {
                        predicates.dedup_by(|a, b| a.name() == b.name());
                        Condition::Input(InputCondition {
                            asset: k(ASSETS[i]),
                            predicates,
                        })
                    })
                    .collect();
                DependencySpec {
                    id: "dep".into(),
                    version: 1,
                    owner_project: "p".into(),
                    target: Target {
                        kind: TargetKind::Command,
                        name: "t".into(),
                        parameters: BTreeMap::new(),
                    },
                    condition: if all {
                        Condition::All(leaves)
                    } else {
                        Condition::Any(leaves)
                    },
                    mode,
                    coalescing: Coalescing {
                        min_interval_ms,
                        quiet_period_ms,
                    },
                    produces: None,
                    paused: false,
                    schema_acknowledged: Default::default(),
                }
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// Whatever happened before, explain's status is what `step` does next: ready
        /// fires on a recheck (with the key shown), up to date suppresses, waiting and
        /// pending fire nothing.
        #[test]
        fn explain_agrees_with_the_resolvers_next_step(spec in spec(), story in prop::collection::vec(happening(), 1..40)) {
            let mut world: BTreeMap<AssetKey, AssetState> = BTreeMap::new();
            let mut progress = Progress::default();
            let mut now = 1_000_000i64;
            let mut seq = 0i64;
            for h in story {
                match h {
                    Happening::Commit { asset, part, watermark, compaction } => {
                        seq += 1;
                        let key = k(ASSETS[asset]);
                        let mut e = AssetEvent::committed(key.clone(), TableFormat::Paimon, seq, seq, now, EventSource::Push);
                        e.partitions = vec![format!("p={part}")];
                        e.watermark_ms = Some(watermark);
                        if compaction { e.operation = Operation::Compact; }
                        world.entry(key.clone()).or_insert_with(|| AssetState::new(key, TableFormat::Paimon)).apply(&e);
                    }
                    Happening::Quality { asset, passed } => {
                        let key = k(ASSETS[asset]);
                        if let Some(s) = world.get_mut(&key)
                            && let Some(c) = s.latest_data.clone()
                        {
                            let mut e = AssetEvent::new(key, TableFormat::Paimon, EventKind::QualityReported, c.snapshot_id, c.sequence, now, EventSource::Push);
                            e.quality = Some(if passed { QualityStatus::Passed } else { QualityStatus::Failed });
                            s.apply(&e);
                        }
                    }
                    Happening::Schema { asset, id } => {
                        seq += 1;
                        let key = k(ASSETS[asset]);
                        let mut e = AssetEvent::new(key.clone(), TableFormat::Paimon, EventKind::SchemaChanged, seq, seq, now, EventSource::Push);
                        e.schema_id = Some(id);
                        world.entry(key.clone()).or_insert_with(|| AssetState::new(key, TableFormat::Paimon)).apply(&e);
                    }
                    Happening::Look { after_ms, change } => {
                        now += after_ms;
                        let cause = if change { Cause::Change } else { Cause::Recheck };
                        step(&spec, &mut progress, &|a| world.get(a), now, cause);
                    }
                }
            }
            now += 7;
            let states = |a: &AssetKey| world.get(a);
            let e = explain(&spec, &progress, &states, now);
            let mut next = progress.clone();
            let o = step(&spec, &mut next, &states, now, Cause::Recheck);
            match e.status {
                Status::Ready => {
                    prop_assert!(!o.fires.is_empty(), "ready but nothing fired: {}", e.summary);
                    prop_assert_eq!(Some(o.fires[0].key.as_str().to_owned()), e.next_trigger_key.clone());
                }
                Status::UpToDate => {
                    prop_assert!(o.fires.is_empty(), "up to date but fired: {}", e.summary);
                    if spec.mode == Mode::Snapshots { prop_assert!(o.suppressed); }
                }
                Status::Waiting | Status::Pending => {
                    prop_assert!(o.fires.is_empty(), "{:?} but fired: {}", e.status, e.summary);
                }
            }
            if e.status == Status::Waiting {
                prop_assert!(!e.unmet.is_empty(), "waiting without a reason");
            }
            if let Some(parts) = &e.partitions {
                prop_assert_eq!(parts.ready, o.fires.len(), "every ready partition fires");
            }
        }
    }

    #[test]
    fn a_waiting_input_says_which_sequence_it_needs() {
        let spec = DependencySpec::from_json(
            r#"{"id": "d", "version": 1, "owner_project": "p", "target": {"kind": "command", "name": "t"},
                "condition": {"all": [{"input": {"asset": "l.o.order"}}, {"input": {"asset": "l.o.payment"}}]}}"#,
        )
        .expect("valid");
        let mut world: BTreeMap<AssetKey, AssetState> = BTreeMap::new();
        for (a, seq) in [("l.o.order", 40), ("l.o.payment", 41)] {
            let key = k(a);
            let e = AssetEvent::committed(
                key.clone(),
                TableFormat::Paimon,
                seq,
                seq,
                5,
                EventSource::Push,
            );
            world
                .entry(key.clone())
                .or_insert_with(|| AssetState::new(key, TableFormat::Paimon))
                .apply(&e);
        }
        let mut p = Progress::default();
        assert_eq!(
            step(&spec, &mut p, &|a| world.get(a), 10, Cause::Change)
                .fires
                .len(),
            1
        );
        let order = k("l.o.order");
        let e = AssetEvent::committed(
            order.clone(),
            TableFormat::Paimon,
            42,
            42,
            20,
            EventSource::Push,
        );
        world.get_mut(&order).expect("there").apply(&e);
        let e = explain(&spec, &p, &|a| world.get(a), 30);
        assert_eq!(e.status, Status::Waiting);
        assert_eq!(
            e.unmet,
            vec!["l.o.payment: advanced — at sequence 41, needs a data commit after 41".to_owned()]
        );
        let json = serde_json::to_value(&e).expect("serializes");
        assert_eq!(
            json["condition"]["children"][1]["checks"][0]["reason"],
            "at sequence 41, needs a data commit after 41"
        );
        assert_eq!(json["condition"]["children"][0]["satisfied"], true);
    }
}
