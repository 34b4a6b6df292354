//! The statuses of a dispatch job (the durable dispatcher of the seeds), shared by
//! the dispatcher, the runs topic's Avro enum and its readers. The lifecycle that
//! moves a job between them is the dispatcher's (`sluice_dispatcher::lifecycle`,
//! carried out as compare-and-set updates in `store`).
//!
//! ```text
//!   PENDING ──claim──► RUNNING ──succeeded──► SUCCEEDED
//!      ▲                  │ ├───failed─────► FAILED (or PENDING again: retry)
//!      │                  │ └─deadline/lost► UNKNOWN ──reconcile──► PENDING | SUCCEEDED | FAILED
//!      └──────────────────┴─────────────────────────── operator settle (UNKNOWN)
//!   PENDING ──its backfill cancelled──► CANCELLED (never sent)
//! ```

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobStatus {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
    /// A backfill's job that was still PENDING when the backfill was cancelled.
    Cancelled,
}

impl JobStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Pending => "PENDING",
            JobStatus::Running => "RUNNING",
            JobStatus::Succeeded => "SUCCEEDED",
            JobStatus::Failed => "FAILED",
            JobStatus::Unknown => "UNKNOWN",
            JobStatus::Cancelled => "CANCELLED",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Pending,
            Self::Running,
            Self::Succeeded,
            Self::Failed,
            Self::Unknown,
            Self::Cancelled,
        ]
        .into_iter()
        .find(|st| st.as_str() == s)
    }

    /// No transition leaves a terminal status (FAILED only by an explicit retry).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobStatus::Succeeded | JobStatus::Failed | JobStatus::Cancelled
        )
    }
}
