//! The resolver-progress topic's value (`schemas/resolver-progress.avsc`), keyed by
//! dependency id: what a dependency has done so far (its baselines, timers and
//! counters), so a restarted resolver decides exactly what the first would have.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sluice_core::condition::Baseline;
use sluice_core::{AssetKey, Progress, TriggerKey};

use super::{WireError, count};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename = "ResolverProgress")]
pub struct ProgressRecord {
    pub dependency_id: String,
    pub dependency_version: i64,
    pub last_trigger_key: Option<String>,
    pub last_triggered_ms: Option<i64>,
    pub baselines: Vec<InputBaseline>,
    pub pending_since_ms: Option<i64>,
    pub fire_at_ms: Option<i64>,
    pub last_window_end_ms: Option<i64>,
    pub triggered_partitions: Vec<String>,
    pub triggers_total: i64,
    pub suppressed_total: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename = "InputBaseline")]
pub struct InputBaseline {
    pub asset_key: String,
    pub sequence: Option<i64>,
    pub data_sequence: Option<i64>,
    pub commit_count: i64,
    pub data_commit_count: i64,
    pub schema_id: Option<i64>,
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl ProgressRecord {
    pub fn new(id: &str, p: &Progress) -> Self {
        ProgressRecord {
            dependency_id: id.to_owned(),
            dependency_version: p.version,
            last_trigger_key: p.last_trigger_key.as_ref().map(|k| k.as_str().to_owned()),
            last_triggered_ms: p.last_triggered_ms,
            baselines: p
                .baselines
                .iter()
                .map(|(a, b)| InputBaseline {
                    asset_key: a.as_str().to_owned(),
                    sequence: b.sequence,
                    data_sequence: b.data_sequence,
                    commit_count: to_i64(b.commit_count),
                    data_commit_count: to_i64(b.data_commit_count),
                    schema_id: b.schema_id,
                })
                .collect(),
            pending_since_ms: p.pending_since_ms,
            fire_at_ms: p.fire_at_ms,
            last_window_end_ms: p.last_window_end_ms,
            triggered_partitions: p.triggered_partitions.iter().cloned().collect(),
            triggers_total: to_i64(p.triggers_total),
            suppressed_total: to_i64(p.suppressed_total),
        }
    }

    /// Back to the pure progress; a record with a bad asset key or a negative
    /// counter is refused whole.
    pub fn into_progress(self) -> Result<Progress, WireError> {
        let mut baselines = BTreeMap::new();
        for b in self.baselines {
            let asset = AssetKey::parse(&b.asset_key).map_err(|source| WireError::Key {
                field: "baselines.asset_key",
                source,
            })?;
            baselines.insert(
                asset,
                Baseline {
                    sequence: b.sequence,
                    data_sequence: b.data_sequence,
                    commit_count: count("commit_count", b.commit_count)?,
                    data_commit_count: count("data_commit_count", b.data_commit_count)?,
                    schema_id: b.schema_id,
                },
            );
        }
        Ok(Progress {
            version: self.dependency_version,
            last_trigger_key: self.last_trigger_key.map(TriggerKey::from_wire),
            last_triggered_ms: self.last_triggered_ms,
            baselines,
            pending_since_ms: self.pending_since_ms,
            fire_at_ms: self.fire_at_ms,
            last_window_end_ms: self.last_window_end_ms,
            triggered_partitions: self.triggered_partitions.into(),
            triggers_total: count("triggers_total", self.triggers_total)?,
            suppressed_total: count("suppressed_total", self.suppressed_total)?,
        })
    }
}
