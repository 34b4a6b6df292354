//! The triggers topic's value (`schemas/trigger-request.avsc`): written by the
//! resolver, one per fire, read by the dispatcher.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sluice_core::{DependencySpec, Fire};

use super::WireTargetKind;

/// One trigger request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename = "TriggerRequest")]
pub struct TriggerRecord {
    pub trigger_key: String,
    pub dependency_id: String,
    pub dependency_version: i64,
    pub target: TriggerTarget,
    pub inputs: Vec<TriggerInput>,
    pub partition: Option<String>,
    pub window_end_ms: Option<i64>,
    pub reason: String,
    pub first_commit_ms: i64,
    pub requested_ms: i64,
    pub origin: TriggerOrigin,
    /// The principal who asked (a manual run, a re-run).
    pub requested_by: Option<String>,
    pub request_id: Option<String>,
    /// The trigger_key this one re-runs.
    pub rerun_of: Option<String>,
}

/// Why a trigger exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename = "TriggerOrigin", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TriggerOrigin {
    /// The dependency's condition held on new data.
    Data,
    /// Run now, asked by an operator.
    Manual,
    /// A re-run of an earlier run.
    Rerun,
    /// One item of a backfill (its id is the record's `request_id`).
    Backfill,
}

impl TriggerOrigin {
    pub fn as_str(self) -> &'static str {
        match self {
            TriggerOrigin::Data => "data",
            TriggerOrigin::Manual => "manual",
            TriggerOrigin::Rerun => "rerun",
            TriggerOrigin::Backfill => "backfill",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename = "TriggerTarget")]
pub struct TriggerTarget {
    pub kind: WireTargetKind,
    pub name: String,
    pub parameters: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename = "TriggerInput")]
pub struct TriggerInput {
    pub asset_key: String,
    pub snapshot_id: i64,
    pub sequence: i64,
    pub watermark_ms: Option<i64>,
}

impl From<&sluice_core::dependency::Target> for TriggerTarget {
    fn from(t: &sluice_core::dependency::Target) -> Self {
        TriggerTarget {
            kind: t.kind.into(),
            name: t.name.clone(),
            parameters: t.parameters.clone(),
        }
    }
}

impl TriggerRecord {
    /// The trigger request of one fire of `spec`.
    pub fn of_fire(spec: &DependencySpec, fire: &Fire) -> TriggerRecord {
        TriggerRecord {
            trigger_key: fire.key.as_str().to_owned(),
            dependency_id: spec.id.clone(),
            dependency_version: spec.version,
            target: TriggerTarget::from(&spec.target),
            inputs: fire
                .inputs
                .iter()
                .map(|i| TriggerInput {
                    asset_key: i.asset.as_str().to_owned(),
                    snapshot_id: i.snapshot_id,
                    sequence: i.sequence,
                    watermark_ms: i.watermark_ms,
                })
                .collect(),
            partition: fire.partition.clone(),
            window_end_ms: fire.window_end_ms,
            reason: fire.reason.clone(),
            first_commit_ms: fire.first_commit_ms,
            requested_ms: fire.requested_ms,
            origin: TriggerOrigin::Data,
            requested_by: None,
            request_id: None,
            rerun_of: None,
        }
    }
}
