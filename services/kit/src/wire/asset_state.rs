//! The asset-state topic's value (`schemas/asset-state.avsc`): the folded state of
//! one table with the updater's revision. Avro has no tuples and no non-string map
//! keys, so the core state is reshaped here.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use sluice_core::state::{CommitInfo, QualityMark};
use sluice_core::{AssetKey, AssetState, TableFormat};

use super::{WireError, count};

/// Value of the asset-state topic. Serde names match the Avro record names: the
/// schema-aware (de)serializer checks them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename = "AssetState")]
pub struct StateRecord {
    pub asset_key: AssetKey,
    pub revision: i64,
    pub format: TableFormat,
    pub latest: Option<WireCommit>,
    pub latest_data: Option<WireCommit>,
    pub commit_count: i64,
    pub data_commit_count: i64,
    pub watermark_ms: Option<i64>,
    pub schema_sequence: Option<i64>,
    pub schema_id: Option<i64>,
    pub quality: Option<QualityMark>,
    pub expired_through: Option<i64>,
    pub recent: Vec<WireCommit>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename = "CommitInfo")]
pub struct WireCommit {
    pub event_id: sluice_core::EventId,
    pub snapshot_id: i64,
    pub sequence: i64,
    pub commit_time_ms: i64,
    pub operation: sluice_core::Operation,
    pub partitions: Vec<String>,
}

impl From<&CommitInfo> for WireCommit {
    fn from(c: &CommitInfo) -> Self {
        WireCommit {
            event_id: c.event_id.clone(),
            snapshot_id: c.snapshot_id,
            sequence: c.sequence,
            commit_time_ms: c.commit_time_ms,
            operation: c.operation,
            partitions: c.partitions.iter().cloned().collect(),
        }
    }
}

impl From<WireCommit> for CommitInfo {
    fn from(c: WireCommit) -> Self {
        CommitInfo {
            event_id: c.event_id,
            snapshot_id: c.snapshot_id,
            sequence: c.sequence,
            commit_time_ms: c.commit_time_ms,
            operation: c.operation,
            partitions: c.partitions.into_iter().collect::<BTreeSet<_>>(),
        }
    }
}

impl StateRecord {
    pub fn new(state: &AssetState, revision: i64) -> Self {
        StateRecord {
            asset_key: state.asset_key.clone(),
            revision,
            format: state.format,
            latest: state.latest.as_ref().map(WireCommit::from),
            latest_data: state.latest_data.as_ref().map(WireCommit::from),
            // Counters fit i64 for any realistic table (2^63 commits).
            commit_count: i64::try_from(state.commit_count).unwrap_or(i64::MAX),
            data_commit_count: i64::try_from(state.data_commit_count).unwrap_or(i64::MAX),
            watermark_ms: state.watermark_ms,
            schema_sequence: state.schema.map(|(seq, _)| seq),
            schema_id: state.schema.map(|(_, id)| id),
            quality: state.quality,
            expired_through: state.expired_through,
            recent: state.recent.values().map(WireCommit::from).collect(),
        }
    }

    /// Back to the core state; a record whose counters went negative is refused.
    pub fn into_state(self) -> Result<(AssetState, i64), WireError> {
        let schema = match (self.schema_sequence, self.schema_id) {
            (Some(seq), Some(id)) => Some((seq, id)),
            (None, None) => None,
            _ => {
                return Err(WireError::Inconsistent(
                    "schema_sequence and schema_id must be both set or both null",
                ));
            }
        };
        let state = AssetState {
            asset_key: self.asset_key,
            format: self.format,
            latest: self.latest.map(CommitInfo::from),
            latest_data: self.latest_data.map(CommitInfo::from),
            commit_count: count("commit_count", self.commit_count)?,
            data_commit_count: count("data_commit_count", self.data_commit_count)?,
            watermark_ms: self.watermark_ms,
            schema,
            quality: self.quality,
            expired_through: self.expired_through,
            recent: self
                .recent
                .into_iter()
                .map(|c| (c.sequence, CommitInfo::from(c)))
                .collect::<BTreeMap<_, _>>(),
        };
        Ok((state, self.revision))
    }
}
