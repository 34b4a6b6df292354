//! The runs topic's value (`schemas/run-status.avsc`), keyed by trigger key: each
//! transition of a dispatch job, published by the dispatcher's outbox.

use serde::{Deserialize, Serialize};
use sluice_core::JobStatus;

/// One job transition; `revision` orders the transitions of one trigger key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename = "RunStatus")]
pub struct RunRecord {
    pub trigger_key: String,
    pub dependency_id: String,
    pub target_kind: String,
    pub target_name: String,
    pub status: JobStatus,
    pub revision: i64,
    pub attempt: i32,
    pub invocation_id: Option<String>,
    pub external_id: Option<String>,
    pub reason: Option<String>,
    pub updated_ms: i64,
}
