//! Dependency specs: the JSON form people write, the Avro form on the dependencies
//! topic, and the validation a spec passes before it is accepted.
//!
//! A spec is accepted whole or not at all: [`DependencySpec::from_wire`] and
//! [`DependencySpec::from_json`] return a spec only after every check passed.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};
use sluice_core::condition::ConditionError;
use sluice_core::{AssetKey, Condition, InputCondition, Predicate};
pub use sluice_kit::wire::WireTargetKind;

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
}

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

// ---- the Avro form (schemas/dependency-spec.avsc) ----
//
// Serde names match the Avro record and enum names: the schema-aware serializer
// checks them.

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename = "DependencySpec")]
pub struct WireSpec {
    pub id: String,
    pub version: i64,
    pub owner_project: String,
    pub target: WireTarget,
    pub condition: WireNode,
    pub min_interval_ms: i64,
    pub quiet_period_ms: i64,
    pub produces: Option<String>,
    pub mode: WireMode,
    pub window_ms: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename = "Target")]
pub struct WireTarget {
    pub kind: WireTargetKind,
    pub name: String,
    pub parameters: BTreeMap<String, String>,
}

impl From<TargetKind> for WireTargetKind {
    fn from(k: TargetKind) -> Self {
        match k {
            TargetKind::Airflow => WireTargetKind::Airflow,
            TargetKind::Dolphinscheduler => WireTargetKind::Dolphinscheduler,
            TargetKind::Webhook => WireTargetKind::Webhook,
            TargetKind::Command => WireTargetKind::Command,
            TargetKind::Kafka => WireTargetKind::Kafka,
        }
    }
}

impl From<WireTargetKind> for TargetKind {
    fn from(k: WireTargetKind) -> Self {
        match k {
            WireTargetKind::Airflow => TargetKind::Airflow,
            WireTargetKind::Dolphinscheduler => TargetKind::Dolphinscheduler,
            WireTargetKind::Webhook => TargetKind::Webhook,
            WireTargetKind::Command => TargetKind::Command,
            WireTargetKind::Kafka => TargetKind::Kafka,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename = "SpecMode", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum WireMode {
    Snapshots,
    PerPartition,
    Window,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename = "ConditionNode")]
pub struct WireNode {
    pub op: WireOp,
    pub children: Vec<WireNode>,
    pub asset: Option<String>,
    pub predicates: Vec<WirePredicate>,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename = "ConditionOp", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum WireOp {
    All,
    Any,
    Input,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename = "PredicateSpec")]
pub struct WirePredicate {
    pub kind: WirePredicateKind,
    pub long_value: Option<i64>,
    pub string_value: Option<String>,
    pub include_compaction: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename = "PredicateKind", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum WirePredicateKind {
    Advanced,
    WatermarkAtLeast,
    QualityPassed,
    SchemaEquals,
    SchemaUnchanged,
    PartitionCommitted,
    CommitsSinceTrigger,
    FreshWithin,
}

impl From<&DependencySpec> for WireSpec {
    fn from(s: &DependencySpec) -> Self {
        let (mode, window_ms) = match s.mode {
            Mode::Snapshots => (WireMode::Snapshots, 0),
            Mode::PerPartition => (WireMode::PerPartition, 0),
            Mode::Window { size_ms } => (WireMode::Window, size_ms),
        };
        WireSpec {
            id: s.id.clone(),
            version: s.version,
            owner_project: s.owner_project.clone(),
            target: WireTarget {
                kind: s.target.kind.into(),
                name: s.target.name.clone(),
                parameters: s.target.parameters.clone(),
            },
            condition: node_to_wire(&s.condition),
            min_interval_ms: s.coalescing.min_interval_ms,
            quiet_period_ms: s.coalescing.quiet_period_ms,
            produces: s.produces.as_ref().map(|p| p.as_str().to_owned()),
            mode,
            window_ms,
        }
    }
}

fn node_to_wire(c: &Condition) -> WireNode {
    let group = |op, cs: &[Condition]| WireNode {
        op,
        children: cs.iter().map(node_to_wire).collect(),
        asset: None,
        predicates: Vec::new(),
    };
    match c {
        Condition::All(cs) => group(WireOp::All, cs),
        Condition::Any(cs) => group(WireOp::Any, cs),
        Condition::Input(i) => WireNode {
            op: WireOp::Input,
            children: Vec::new(),
            asset: Some(i.asset.as_str().to_owned()),
            predicates: i.predicates.iter().map(predicate_to_wire).collect(),
        },
    }
}

fn predicate_to_wire(p: &Predicate) -> WirePredicate {
    use WirePredicateKind as K;
    let (kind, long_value, string_value, include_compaction) = match p {
        Predicate::Advanced { include_compaction } => {
            (K::Advanced, None, None, *include_compaction)
        }
        Predicate::WatermarkAtLeast { watermark_ms } => {
            (K::WatermarkAtLeast, Some(*watermark_ms), None, false)
        }
        Predicate::QualityPassed => (K::QualityPassed, None, None, false),
        Predicate::SchemaEquals { schema_id } => (K::SchemaEquals, Some(*schema_id), None, false),
        Predicate::SchemaUnchanged => (K::SchemaUnchanged, None, None, false),
        Predicate::PartitionCommitted { partition } => {
            (K::PartitionCommitted, None, Some(partition.clone()), false)
        }
        Predicate::CommitsSinceTrigger {
            at_least,
            include_compaction,
        } => (
            K::CommitsSinceTrigger,
            Some(i64::try_from(*at_least).unwrap_or(i64::MAX)),
            None,
            *include_compaction,
        ),
        Predicate::FreshWithin { max_age_ms } => (K::FreshWithin, Some(*max_age_ms), None, false),
    };
    WirePredicate {
        kind,
        long_value,
        string_value,
        include_compaction,
    }
}

impl DependencySpec {
    /// The spec a topic record carries, validated; `key` is the record key, which
    /// must be the spec's id (compaction and ownership go by it).
    pub fn from_wire(key: &str, w: WireSpec) -> Result<Self, SpecError> {
        let field = |message: String| SpecError::Field {
            id: w.id.clone(),
            message,
        };
        if key != w.id {
            return Err(field(format!("record key {key:?} is not the spec id")));
        }
        let mode = match w.mode {
            WireMode::Snapshots => Mode::Snapshots,
            WireMode::PerPartition => Mode::PerPartition,
            WireMode::Window => Mode::Window {
                size_ms: w.window_ms,
            },
        };
        let produces = w
            .produces
            .as_deref()
            .map(AssetKey::parse)
            .transpose()
            .map_err(|e| field(format!("produces: {e}")))?;
        let condition = node_from_wire(&w.id, "$", &w.condition)?;
        let spec = DependencySpec {
            id: w.id.clone(),
            version: w.version,
            owner_project: w.owner_project,
            target: Target {
                kind: w.target.kind.into(),
                name: w.target.name,
                parameters: w.target.parameters,
            },
            condition,
            mode,
            coalescing: Coalescing {
                min_interval_ms: w.min_interval_ms,
                quiet_period_ms: w.quiet_period_ms,
            },
            produces,
        };
        spec.validate()?;
        Ok(spec)
    }
}

fn node_from_wire(id: &str, path: &str, n: &WireNode) -> Result<Condition, SpecError> {
    let bad = |message: &str| SpecError::Node {
        id: id.to_owned(),
        path: path.to_owned(),
        message: message.to_owned(),
    };
    match n.op {
        WireOp::All | WireOp::Any => {
            if n.asset.is_some() || !n.predicates.is_empty() {
                return Err(bad("a group takes children only, not asset or predicates"));
            }
            let name = if n.op == WireOp::All { "all" } else { "any" };
            let children = n
                .children
                .iter()
                .enumerate()
                .map(|(i, c)| node_from_wire(id, &format!("{path}.{name}[{i}]"), c))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(if n.op == WireOp::All {
                Condition::All(children)
            } else {
                Condition::Any(children)
            })
        }
        WireOp::Input => {
            if !n.children.is_empty() {
                return Err(bad("an input takes no children"));
            }
            let asset = n
                .asset
                .as_deref()
                .ok_or_else(|| bad("an input needs an asset"))?;
            let asset = AssetKey::parse(asset).map_err(|e| bad(&format!("asset: {e}")))?;
            let predicates = n
                .predicates
                .iter()
                .map(|p| predicate_from_wire(p).map_err(|m| bad(&m)))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Condition::Input(InputCondition { asset, predicates }))
        }
    }
}

fn predicate_from_wire(p: &WirePredicate) -> Result<Predicate, String> {
    use WirePredicateKind as K;
    let long = |what: &str| {
        p.long_value
            .ok_or_else(|| format!("predicate {what} needs long_value"))
    };
    let string = |what: &str| {
        p.string_value
            .clone()
            .ok_or_else(|| format!("predicate {what} needs string_value"))
    };
    Ok(match p.kind {
        K::Advanced => Predicate::Advanced {
            include_compaction: p.include_compaction,
        },
        K::WatermarkAtLeast => Predicate::WatermarkAtLeast {
            watermark_ms: long("WATERMARK_AT_LEAST")?,
        },
        K::QualityPassed => Predicate::QualityPassed,
        K::SchemaEquals => Predicate::SchemaEquals {
            schema_id: long("SCHEMA_EQUALS")?,
        },
        K::SchemaUnchanged => Predicate::SchemaUnchanged,
        K::PartitionCommitted => Predicate::PartitionCommitted {
            partition: string("PARTITION_COMMITTED")?,
        },
        K::CommitsSinceTrigger => Predicate::CommitsSinceTrigger {
            at_least: u64::try_from(long("COMMITS_SINCE_TRIGGER")?)
                .map_err(|_| "COMMITS_SINCE_TRIGGER long_value must not be negative".to_owned())?,
            include_compaction: p.include_compaction,
        },
        K::FreshWithin => Predicate::FreshWithin {
            max_age_ms: long("FRESH_WITHIN")?,
        },
    })
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
    fn a_good_spec_round_trips_through_avro() {
        let spec = DependencySpec::from_json(GOOD).expect("valid");
        let codec = sluice_kit::Codec::new(None);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let bytes = rt
            .block_on(codec.encode(
                sluice_kit::SchemaName::DependencySpec,
                "t",
                &WireSpec::from(&spec),
            ))
            .expect("encodes");
        let wire: WireSpec = rt
            .block_on(codec.decode(sluice_kit::SchemaName::DependencySpec, &bytes))
            .expect("decodes");
        assert_eq!(
            DependencySpec::from_wire("dwd-trade", wire).expect("valid"),
            spec
        );
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
        let extra = r#"{"kind": "fresh_within", "max_age_ms": 5, "x": 1}"#;
        assert!(
            err(&GOOD.replace(r#"{"kind": "quality_passed"}"#, extra))
                .contains("unknown field `x`")
        );
    }

    #[test]
    fn wire_mismatches_are_refused() {
        let spec = DependencySpec::from_json(GOOD).expect("valid");
        let mut w = WireSpec::from(&spec);
        assert!(
            DependencySpec::from_wire("other", w.clone())
                .expect_err("key")
                .to_string()
                .contains("record key")
        );
        w.condition.children[0].asset = None;
        assert!(
            DependencySpec::from_wire("dwd-trade", w)
                .expect_err("asset")
                .to_string()
                .contains("$.all[0]: an input needs an asset")
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
}
