//! The dependencies topic's value (`schemas/dependency-spec.avsc`), keyed by the
//! spec id. Serde names match the Avro record and enum names: the schema-aware
//! serializer checks them. A record becomes a [`DependencySpec`] only through
//! [`WireSpec::into_spec`], which validates it whole.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sluice_core::dependency::{Coalescing, Mode, SpecError, Target};
use sluice_core::table_service::{Policy, Service, Strategy};
use sluice_core::{AssetKey, Condition, DependencySpec, InputCondition, Predicate};

use super::WireTargetKind;

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
    pub paused: bool,
    pub schema_acknowledged: BTreeMap<String, i64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename = "Target")]
pub struct WireTarget {
    pub kind: WireTargetKind,
    pub name: String,
    pub parameters: BTreeMap<String, String>,
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
    #[serde(default)]
    pub service: Option<String>,
    #[serde(default)]
    pub delta_seconds: Option<i64>,
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
    TableService,
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
            paused: s.paused,
            schema_acknowledged: s
                .schema_acknowledged
                .iter()
                .map(|(a, id)| (a.as_str().to_owned(), *id))
                .collect(),
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
        Predicate::TableService(p) => {
            return WirePredicate {
                kind: K::TableService,
                long_value: Some(i64::try_from(p.num_commits).unwrap_or(i64::MAX)),
                string_value: Some(p.strategy.as_str().to_owned()),
                include_compaction: false,
                service: Some(p.service.as_str().to_owned()),
                delta_seconds: Some(p.delta_seconds),
            };
        }
    };
    WirePredicate {
        kind,
        long_value,
        string_value,
        include_compaction,
        service: None,
        delta_seconds: None,
    }
}

impl WireSpec {
    /// The spec a topic record carries, validated; `key` is the record key, which
    /// must be the spec's id (compaction and ownership go by it).
    pub fn into_spec(self, key: &str) -> Result<DependencySpec, SpecError> {
        let w = self;
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
        let schema_acknowledged = w
            .schema_acknowledged
            .iter()
            .map(|(a, id)| {
                AssetKey::parse(a)
                    .map(|a| (a, *id))
                    .map_err(|e| field(format!("schema_acknowledged: {e}")))
            })
            .collect::<Result<_, _>>()?;
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
            paused: w.paused,
            schema_acknowledged,
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
        K::TableService => {
            let service = p
                .service
                .as_deref()
                .ok_or("predicate TABLE_SERVICE needs service")?;
            let strategy = string("TABLE_SERVICE")?;
            Predicate::TableService(Policy {
                service: Service::parse(service)
                    .ok_or_else(|| format!("TABLE_SERVICE service {service:?} is not known"))?,
                strategy: Strategy::parse(&strategy).ok_or_else(|| {
                    format!("TABLE_SERVICE strategy {strategy:?} is not one of Hudi's")
                })?,
                num_commits: u64::try_from(long("TABLE_SERVICE")?)
                    .map_err(|_| "TABLE_SERVICE long_value must not be negative".to_owned())?,
                delta_seconds: p
                    .delta_seconds
                    .ok_or("predicate TABLE_SERVICE needs delta_seconds")?,
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BlockingCodec, SchemaName};

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

    /// The spec as the resolver reads it back from the topic.
    fn through_avro(spec: &DependencySpec) -> DependencySpec {
        let codec = BlockingCodec::new(None).expect("codec");
        let bytes = codec
            .encode(SchemaName::DependencySpec, "t", &WireSpec::from(spec))
            .expect("encodes");
        let wire: WireSpec = codec
            .decode(SchemaName::DependencySpec, &bytes)
            .expect("decodes");
        wire.into_spec(&spec.id).expect("valid")
    }

    #[test]
    fn a_good_spec_round_trips_through_avro() {
        let spec = DependencySpec::from_json(GOOD).expect("valid");
        assert_eq!(through_avro(&spec), spec);
    }

    #[test]
    fn a_table_service_policy_round_trips_through_avro() {
        let spec = DependencySpec::from_json(
            r#"{"id": "orders-compaction", "version": 2, "owner_project": "gmv",
                "target": {"kind": "command", "name": "hudi-spark"},
                "condition": {"input": {"asset": "lake.ods.orders", "predicates": [
                    {"kind": "table_service", "service": "compaction",
                     "strategy": "NUM_OR_TIME", "num_commits": 4, "delta_seconds": 600}]}}}"#,
        )
        .expect("valid");
        assert_eq!(through_avro(&spec), spec);
        let mut w = WireSpec::from(&spec);
        w.condition.predicates[0].string_value = Some("NUM_DELTAS".into());
        assert!(
            w.into_spec("orders-compaction")
                .expect_err("strategy")
                .to_string()
                .contains("\"NUM_DELTAS\" is not one of Hudi's")
        );
    }

    #[test]
    fn wire_mismatches_are_refused() {
        let spec = DependencySpec::from_json(GOOD).expect("valid");
        let mut w = WireSpec::from(&spec);
        assert!(
            w.clone()
                .into_spec("other")
                .expect_err("key")
                .to_string()
                .contains("record key")
        );
        w.condition.children[0].asset = None;
        assert!(
            w.into_spec("dwd-trade")
                .expect_err("asset")
                .to_string()
                .contains("$.all[0]: an input needs an asset")
        );
    }
}
