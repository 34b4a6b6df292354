//! Dependency specs: what a dependency reads, when it fires and what it triggers,
//! in the JSON form people write, with the validation a spec passes before it is
//! accepted and the cycle check over a whole set. The Avro form on the
//! dependencies topic is `sluice_kit::wire::dependency_spec`.
//!
//! A spec is accepted whole or not at all: [`DependencySpec::from_json`] and the
//! wire decoding return a spec only after every check passed.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::asset::AssetKey;
use crate::condition::{Condition, ConditionError};

/// The longest dependency id; ids are record keys, trigger-key fields and log labels.
pub const MAX_ID_LEN: usize = 200;
/// Windows evaluated per pass at most, so a watermark jump of years cannot stall a batch.
pub const MAX_WINDOWS_PER_PASS: usize = 1_000;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DependencySpec {
    pub id: String,
    pub version: i64,
    pub owner_project: String,
    pub target: Target,
    pub condition: Condition,
    /// What one trigger is for: a new snapshot combination (default), one partition,
    /// or one watermark window.
    #[serde(default)]
    pub mode: Mode,
    #[serde(default)]
    pub coalescing: Coalescing,
    /// The asset the target writes: an edge of the lineage graph, checked for cycles.
    #[serde(default)]
    pub produces: Option<AssetKey>,
    /// Evaluated but fires nothing; resumed, it fires once for the newest
    /// combination (its baselines did not move while paused).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// The schema an operator accepted for an input's `schema_unchanged`: taken by
    /// the resolver once, on this version's first evaluation, and only if the
    /// input's schema is still that one (a schema that moved again stays shut).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub schema_acknowledged: BTreeMap<AssetKey, i64>,
}

/// The target parameter that orders a target's queue: within one target, the
/// dispatcher starts jobs of a higher priority first (default 0).
pub const PRIORITY: &str = "priority";
pub const MAX_PRIORITY: i32 = 999_999;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    pub kind: TargetKind,
    /// The identity used in trigger keys, e.g. the DAG id.
    pub name: String,
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetKind {
    Airflow,
    Dolphinscheduler,
    Webhook,
    Command,
    Kafka,
}

impl TargetKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TargetKind::Airflow => "airflow",
            TargetKind::Dolphinscheduler => "dolphinscheduler",
            TargetKind::Webhook => "webhook",
            TargetKind::Command => "command",
            TargetKind::Kafka => "kafka",
        }
    }
}

impl Target {
    /// `kind:name`, the target part of every trigger key.
    pub fn identity(&self) -> String {
        format!("{}:{}", self.kind.as_str(), self.name)
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", deny_unknown_fields)]
pub enum Mode {
    #[default]
    Snapshots,
    /// One trigger per partition that every input has committed.
    PerPartition,
    /// One trigger per window of `size_ms` whose end every input's watermark reached.
    Window { size_ms: i64 },
}

/// Coalescing of snapshot-combination triggers (partition and window triggers are
/// one per key by construction).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Coalescing {
    /// At least this long between two triggers.
    #[serde(default)]
    pub min_interval_ms: i64,
    /// Fire only once no input changed for this long (debounce): a burst of commits
    /// collapses into one trigger with the newest combination.
    #[serde(default)]
    pub quiet_period_ms: i64,
}

/// Why a spec is refused. Each names the spec and the exact problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("spec is not valid JSON for a DependencySpec: {0}")]
    Json(String),
    #[error("spec {id:?}: {message}")]
    Field { id: String, message: String },
    #[error("spec {id:?}: condition: {source}")]
    Condition {
        id: String,
        #[source]
        source: ConditionError,
    },
    #[error("spec {id:?}: condition node at {path}: {message}")]
    Node {
        id: String,
        path: String,
        message: String,
    },
    #[error("cycle through produced assets: {path} (dependencies {deps})")]
    Cycle { path: String, deps: String },
}

impl DependencySpec {
    /// Parses and validates the JSON form (unknown fields are refused).
    pub fn from_json(text: &str) -> Result<Self, SpecError> {
        let spec: DependencySpec =
            serde_json::from_str(text).map_err(|e| SpecError::Json(e.to_string()))?;
        spec.validate()?;
        Ok(spec)
    }

    /// Checks a spec on its own (cycles need the other specs: [`check_cycles`]).
    pub fn validate(&self) -> Result<(), SpecError> {
        let bad = |message: String| SpecError::Field {
            id: self.id.clone(),
            message,
        };
        if self.id.is_empty() || self.id.len() > MAX_ID_LEN {
            return Err(bad(format!("id must be 1..={MAX_ID_LEN} bytes")));
        }
        if let Some(c) = self
            .id
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        {
            return Err(bad(format!(
                "id may hold only ASCII letters, digits, '-', '_' and '.', found {c:?}"
            )));
        }
        if self.version < 1 {
            return Err(bad(format!(
                "version must be at least 1, got {}",
                self.version
            )));
        }
        if self.owner_project.trim().is_empty() {
            return Err(bad("owner_project must not be empty".into()));
        }
        if self.target.name.trim().is_empty() {
            return Err(bad("target.name must not be empty".into()));
        }
        if let Some(p) = self.target.parameters.get(PRIORITY)
            && !p
                .parse::<i32>()
                .is_ok_and(|p| (-MAX_PRIORITY..=MAX_PRIORITY).contains(&p))
        {
            return Err(bad(format!(
                "target.parameters.priority must be an integer from -{MAX_PRIORITY} to {MAX_PRIORITY}, got {p:?}"
            )));
        }
        if self.coalescing.min_interval_ms < 0 || self.coalescing.quiet_period_ms < 0 {
            return Err(bad("coalescing intervals must not be negative".into()));
        }
        if let Mode::Window { size_ms } = self.mode
            && size_ms <= 0
        {
            return Err(bad(format!("mode window needs size_ms > 0, got {size_ms}")));
        }
        self.condition
            .validate()
            .map_err(|source| SpecError::Condition {
                id: self.id.clone(),
                source,
            })?;
        if let Some(a) = self
            .schema_acknowledged
            .keys()
            .find(|a| !self.condition.watches_schema(a))
        {
            return Err(bad(format!(
                "schema_acknowledged names {a}, which is not an input with schema_unchanged"
            )));
        }
        if let Some(p) = &self.produces
            && self.condition.inputs().contains(p)
        {
            return Err(SpecError::Cycle {
                path: format!("{p} → {p}"),
                deps: self.id.clone(),
            });
        }
        Ok(())
    }

    pub fn inputs(&self) -> BTreeSet<AssetKey> {
        self.condition.inputs().into_iter().cloned().collect()
    }
}

/// Refuses a set of specs whose produced assets feed back into their own inputs.
/// `specs` is every accepted spec plus the candidate.
pub fn check_cycles<'a>(
    specs: impl IntoIterator<Item = &'a DependencySpec>,
) -> Result<(), SpecError> {
    // Edge input → produced asset, labelled with the dependency that makes it.
    let mut edges: BTreeMap<&AssetKey, Vec<(&AssetKey, &str)>> = BTreeMap::new();
    for s in specs {
        if let Some(out) = &s.produces {
            for i in s.condition.inputs() {
                edges.entry(i).or_default().push((out, &s.id));
            }
        }
    }
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    let mut marks: BTreeMap<&AssetKey, Mark> = BTreeMap::new();
    // Iterative DFS keeping the path, so the error can show the cycle itself.
    for &start in edges.keys() {
        if marks.contains_key(start) {
            continue;
        }
        let mut path: Vec<(&AssetKey, &str)> = vec![(start, "")];
        let mut next: Vec<usize> = vec![0];
        marks.insert(start, Mark::Open);
        while let Some(&(node, _)) = path.last() {
            let i = next.last_mut().expect("same length as path");
            let out = edges.get(node).map_or(&[][..], Vec::as_slice);
            if *i == out.len() {
                marks.insert(node, Mark::Done);
                path.pop();
                next.pop();
                continue;
            }
            let (to, dep) = out[*i];
            *i += 1;
            match marks.get(to) {
                Some(Mark::Done) => {}
                Some(Mark::Open) => {
                    let from = path.iter().position(|(n, _)| *n == to).unwrap_or(0);
                    let cycle = &path[from..];
                    let mut names: Vec<String> = cycle.iter().map(|(n, _)| n.to_string()).collect();
                    names.push(to.to_string());
                    let mut deps: Vec<&str> = cycle.iter().skip(1).map(|(_, d)| *d).collect();
                    deps.push(dep);
                    return Err(SpecError::Cycle {
                        path: names.join(" → "),
                        deps: deps.join(", "),
                    });
                }
                None => {
                    marks.insert(to, Mark::Open);
                    path.push((to, dep));
                    next.push(0);
                }
            }
        }
    }
    Ok(())
}

/// The verdict on `spec` in the append order of the dependencies topic:
/// `earlier` are the producing specs appended before it, oldest first. Each of
/// them stands unless it closed a cycle with those standing before it; `spec` is
/// refused when it closes one with those that stand. Every reader of the topic
/// (each resolver instance, the API) reaches the same verdict from the same log.
pub fn cycle_verdict<'a>(
    earlier: impl IntoIterator<Item = &'a DependencySpec>,
    spec: &'a DependencySpec,
) -> Result<(), SpecError> {
    if spec.produces.is_none() {
        return Ok(());
    }
    let mut standing = Standing::default();
    for s in earlier {
        standing.offer(s);
    }
    standing.verdict(spec)
}

/// The verdicts on every spec of `ordered` (the append order, oldest first), as
/// [`cycle_verdict`] reaches each, in one pass: each spec is checked once against
/// those standing before it, so the whole set costs about one walk per spec.
pub fn cycle_verdicts(ordered: &[&DependencySpec]) -> Vec<Result<(), SpecError>> {
    let mut standing = Standing::default();
    ordered
        .iter()
        .map(|s| {
            let verdict = standing.verdict(s);
            if verdict.is_ok() {
                standing.add(s);
            }
            verdict
        })
        .collect()
}

/// The producing specs that stand, as the asset graph they make (input → produced
/// asset). A spec closes a cycle when its produced asset already reaches one of
/// its inputs: a walk from that asset, not a check of the whole set.
#[derive(Default)]
struct Standing<'a> {
    edges: BTreeMap<&'a AssetKey, Vec<&'a AssetKey>>,
    specs: Vec<&'a DependencySpec>,
}

impl<'a> Standing<'a> {
    fn closes_cycle(&self, spec: &DependencySpec) -> bool {
        let Some(out) = &spec.produces else {
            return false;
        };
        let inputs = spec.condition.inputs();
        let mut seen = BTreeSet::new();
        let mut todo = vec![out];
        while let Some(a) = todo.pop() {
            if inputs.contains(a) {
                return true;
            }
            if seen.insert(a) {
                todo.extend(self.edges.get(a).into_iter().flatten().copied());
            }
        }
        false
    }

    fn add(&mut self, spec: &'a DependencySpec) {
        if let Some(out) = &spec.produces {
            for i in spec.condition.inputs() {
                self.edges.entry(i).or_default().push(out);
            }
            self.specs.push(spec);
        }
    }

    /// Adds `spec` unless it closes a cycle with those standing.
    fn offer(&mut self, spec: &'a DependencySpec) {
        if spec.produces.is_some() && !self.closes_cycle(spec) {
            self.add(spec);
        }
    }

    /// Refused, with the cycle named, when `spec` closes one.
    fn verdict(&self, spec: &DependencySpec) -> Result<(), SpecError> {
        if !self.closes_cycle(spec) {
            return Ok(());
        }
        // Rare: the whole check, for the error that shows the cycle itself.
        check_cycles(self.specs.iter().copied().chain([spec]))?;
        Err(SpecError::Cycle {
            path: spec
                .produces
                .as_ref()
                .map(|a| a.to_string())
                .unwrap_or_default(),
            deps: spec.id.clone(),
        })
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Snapshots => f.write_str("snapshots"),
            Mode::PerPartition => f.write_str("per_partition"),
            Mode::Window { size_ms } => write!(f, "window({size_ms} ms)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{
        "id": "dwd-trade", "version": 1, "owner_project": "gmv",
        "target": {"kind": "airflow", "name": "dwd_trade"},
        "condition": {"all": [
            {"input": {"asset": "lake.ods.order"}},
            {"input": {"asset": "lake.ods.payment", "predicates": [{"kind": "quality_passed"}]}}
        ]},
        "coalescing": {"quiet_period_ms": 5000},
        "produces": "lake.dwd.trade"
    }"#;

    fn err(text: &str) -> String {
        DependencySpec::from_json(text)
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn each_validation_error_is_precise() {
        assert!(
            err(&GOOD.replace("\"owner_project\"", "\"colour\": 1, \"owner_project\""))
                .contains("unknown field `colour`")
        );
        assert!(err(&GOOD.replace("\"airflow\"", "\"oozie\"")).contains("unknown variant `oozie`"));
        assert!(
            err(&GOOD.replace(
                r#"{"input": {"asset": "lake.ods.order"}},"#,
                r#"{"any": []},"#
            ))
            .contains("any group at $.all[0] has no members")
        );
        let twice = GOOD.replace("lake.ods.payment", "lake.ods.order");
        assert!(
            err(&twice)
                .contains("input lake.ods.order is listed twice (at $.all[0] and at $.all[1])")
        );
        assert!(
            err(&GOOD.replace("\"version\": 1", "\"version\": 0"))
                .contains("version must be at least 1")
        );
        assert!(
            err(&GOOD.replace("lake.dwd.trade", "lake.ods.order"))
                .contains("cycle through produced assets: lake.ods.order → lake.ods.order")
        );
        let ack = |asset: &str| {
            GOOD.replace(
                "\"produces\"",
                &format!("\"schema_acknowledged\": {{\"{asset}\": 2}}, \"produces\""),
            )
        };
        assert!(err(&ack("lake.ods.payment")).contains(
            "schema_acknowledged names lake.ods.payment, which is not an input with schema_unchanged"
        ));
        let watched = ack("lake.ods.payment").replace(
            r#"{"kind": "quality_passed"}"#,
            r#"{"kind": "schema_unchanged"}"#,
        );
        assert!(DependencySpec::from_json(&watched).is_ok(), "{watched}");
        let priority = |p: &str| {
            GOOD.replace(
                r#""name": "dwd_trade"}"#,
                &format!(r#""name": "dwd_trade", "parameters": {{"priority": "{p}"}}}}"#),
            )
        };
        assert!(DependencySpec::from_json(&priority("-5")).is_ok());
        assert!(err(&priority("high")).contains(
            "target.parameters.priority must be an integer from -999999 to 999999, got \"high\""
        ));
        assert!(err(&priority("1000000")).contains("target.parameters.priority"));
        let policy = r#"{"kind": "table_service", "service": "compaction", "strategy": "NUM_COMMITS", "x": 1}"#;
        assert!(
            err(&GOOD.replace(r#"{"kind": "quality_passed"}"#, policy))
                .contains("unknown field `x`")
        );
        let extra = r#"{"kind": "fresh_within", "max_age_ms": 5, "x": 1}"#;
        assert!(
            err(&GOOD.replace(r#"{"kind": "quality_passed"}"#, extra))
                .contains("unknown field `x`")
        );
    }

    #[test]
    fn cycles_through_several_specs_are_found_and_named() {
        let mk = |id: &str, input: &str, out: &str| {
            DependencySpec::from_json(&format!(
                r#"{{"id": "{id}", "version": 1, "owner_project": "p", "target": {{"kind": "command", "name": "{id}"}},
                   "condition": {{"input": {{"asset": "{input}"}}}}, "produces": "{out}"}}"#
            ))
            .expect("valid alone")
        };
        let a = mk("a", "l.n.x", "l.n.y");
        let b = mk("b", "l.n.y", "l.n.z");
        assert!(check_cycles([&a, &b]).is_ok());
        let c = mk("c", "l.n.z", "l.n.x");
        let e = check_cycles([&a, &b, &c]).expect_err("cycle").to_string();
        assert!(e.contains("l.n.x → l.n.y → l.n.z → l.n.x"), "{e}");
        assert!(e.contains("a, b, c"), "{e}");
    }

    /// The verdicts as first defined: a spec stands when the whole set of those
    /// standing before it plus itself has no cycle.
    fn reference_verdicts(ordered: &[&DependencySpec]) -> Vec<bool> {
        let mut standing: Vec<&DependencySpec> = Vec::new();
        ordered
            .iter()
            .map(|s| {
                let ok = check_cycles(standing.iter().copied().chain([*s])).is_ok();
                if ok {
                    standing.push(s);
                }
                ok
            })
            .collect()
    }

    proptest::proptest! {
        #[test]
        fn one_pass_verdicts_are_the_whole_set_checks(
            edges in proptest::collection::vec((0u8..8, 0u8..8, 0u8..8), 1..24)
        ) {
            // Two distinct inputs; a spec refused on its own (reading what it
            // produces) is left out, as the topic's readers leave it out.
            let specs: Vec<DependencySpec> = edges
                .iter()
                .enumerate()
                .filter_map(|(n, (a, b, out))| {
                    let b = (a + 1 + b % 7) % 8;
                    DependencySpec::from_json(&format!(
                        r#"{{"id": "d{n}", "version": 1, "owner_project": "p",
                           "target": {{"kind": "command", "name": "d{n}"}},
                           "condition": {{"all": [{{"input": {{"asset": "l.n.a{a}"}}}},
                                                   {{"input": {{"asset": "l.n.a{b}"}}}}]}},
                           "produces": "l.n.a{out}"}}"#
                    ))
                    .ok()
                })
                .collect();
            let ordered: Vec<&DependencySpec> = specs.iter().collect();
            let fast: Vec<bool> = cycle_verdicts(&ordered).iter().map(Result::is_ok).collect();
            proptest::prop_assert_eq!(&fast, &reference_verdicts(&ordered));
            for i in 0..ordered.len() {
                let one = cycle_verdict(ordered[..i].iter().copied(), ordered[i]).is_ok();
                proptest::prop_assert_eq!(one, fast[i], "spec {}", i);
            }
        }
    }
}
