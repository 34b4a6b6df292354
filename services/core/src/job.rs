//! The dispatch job state machine (the durable dispatcher of the seeds).
//!
//! ```text
//!   PENDING ──start──► RUNNING ──succeeded──► SUCCEEDED
//!      ▲                  │ ├───failed─────► FAILED ──retry──► PENDING
//!      │                  │ └─deadline/lost► UNKNOWN ──reconcile──► SUCCEEDED | FAILED
//!      └──────────────────┴─────────────────────────── operator requeue (UNKNOWN only)
//! ```
//!
//! Every transition names the revision it expects and the invocation it is about;
//! it is refused if either moved on. The dispatcher executes the same rule as
//! `UPDATE … WHERE revision = $expected`, so a sweep and a late result, or two
//! instances, can never both win.

use serde::{Deserialize, Serialize};

use crate::trigger::TriggerKey;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobStatus {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

impl JobStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Pending => "PENDING",
            JobStatus::Running => "RUNNING",
            JobStatus::Succeeded => "SUCCEEDED",
            JobStatus::Failed => "FAILED",
            JobStatus::Unknown => "UNKNOWN",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Pending,
            Self::Running,
            Self::Succeeded,
            Self::Failed,
            Self::Unknown,
        ]
        .into_iter()
        .find(|st| st.as_str() == s)
    }

    /// No transition leaves a terminal status (FAILED only by an explicit retry).
    pub fn is_terminal(self) -> bool {
        matches!(self, JobStatus::Succeeded | JobStatus::Failed)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub trigger_key: TriggerKey,
    pub status: JobStatus,
    /// Bumped by every transition; the compare-and-set token.
    pub revision: i64,
    /// Sends made so far (each with its own invocation).
    pub attempt: u32,
    pub invocation_id: Option<String>,
    /// The dispatcher instance epoch that owns the current invocation.
    pub epoch: Option<i64>,
    pub deadline_ms: Option<i64>,
    pub reason: Option<String>,
}

/// A requested change of a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transition {
    /// PENDING → RUNNING, recorded before the first byte is sent.
    Start {
        invocation_id: String,
        epoch: i64,
        deadline_ms: i64,
    },
    /// RUNNING|UNKNOWN → SUCCEEDED for that invocation.
    Succeed { invocation_id: String },
    /// RUNNING|UNKNOWN → FAILED for that invocation.
    Fail {
        invocation_id: String,
        reason: String,
    },
    /// RUNNING → UNKNOWN: deadline passed or the outcome was lost.
    MarkUnknown {
        invocation_id: String,
        reason: String,
    },
    /// FAILED → PENDING for another attempt, if attempts remain.
    Retry { max_attempts: u32 },
    /// UNKNOWN → PENDING by an operator who checked the target by hand.
    Requeue,
}

impl Transition {
    pub fn name(&self) -> &'static str {
        match self {
            Transition::Start { .. } => "start",
            Transition::Succeed { .. } => "succeed",
            Transition::Fail { .. } => "fail",
            Transition::MarkUnknown { .. } => "mark_unknown",
            Transition::Retry { .. } => "retry",
            Transition::Requeue => "requeue",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    #[error(
        "job {trigger_key}: revision is {actual}, the transition expected {expected} (another actor moved it)"
    )]
    Conflict {
        trigger_key: TriggerKey,
        expected: i64,
        actual: i64,
    },
    #[error("job {trigger_key}: cannot {transition} from {from}")]
    NotAllowed {
        trigger_key: TriggerKey,
        transition: &'static str,
        from: &'static str,
    },
    #[error("job {trigger_key}: result for invocation {got} but the job is on {current:?}")]
    StaleInvocation {
        trigger_key: TriggerKey,
        got: String,
        current: Option<String>,
    },
    #[error("job {trigger_key}: {attempts} attempt(s) made, the limit is {max_attempts}")]
    AttemptsExhausted {
        trigger_key: TriggerKey,
        attempts: u32,
        max_attempts: u32,
    },
}

impl Job {
    pub fn new(trigger_key: TriggerKey) -> Self {
        Job {
            trigger_key,
            status: JobStatus::Pending,
            revision: 0,
            attempt: 0,
            invocation_id: None,
            epoch: None,
            deadline_ms: None,
            reason: None,
        }
    }

    /// Applies `t` if the job is still at `expected_revision`; returns the new job.
    pub fn transition(
        &self,
        expected_revision: i64,
        t: Transition,
    ) -> Result<Job, TransitionError> {
        if self.revision != expected_revision {
            return Err(TransitionError::Conflict {
                trigger_key: self.trigger_key.clone(),
                expected: expected_revision,
                actual: self.revision,
            });
        }
        let not_allowed = || TransitionError::NotAllowed {
            trigger_key: self.trigger_key.clone(),
            transition: t.name(),
            from: self.status.as_str(),
        };
        let check_invocation = |got: &str| {
            if self.invocation_id.as_deref() == Some(got) {
                Ok(())
            } else {
                Err(TransitionError::StaleInvocation {
                    trigger_key: self.trigger_key.clone(),
                    got: got.to_owned(),
                    current: self.invocation_id.clone(),
                })
            }
        };
        let mut next = self.clone();
        next.revision += 1;
        match (&t, self.status) {
            (
                Transition::Start {
                    invocation_id,
                    epoch,
                    deadline_ms,
                },
                JobStatus::Pending,
            ) => {
                next.status = JobStatus::Running;
                next.attempt += 1;
                next.invocation_id = Some(invocation_id.clone());
                next.epoch = Some(*epoch);
                next.deadline_ms = Some(*deadline_ms);
                next.reason = None;
            }
            (Transition::Succeed { invocation_id }, JobStatus::Running | JobStatus::Unknown) => {
                check_invocation(invocation_id)?;
                next.status = JobStatus::Succeeded;
                next.reason = None;
            }
            (
                Transition::Fail {
                    invocation_id,
                    reason,
                },
                JobStatus::Running | JobStatus::Unknown,
            ) => {
                check_invocation(invocation_id)?;
                next.status = JobStatus::Failed;
                next.reason = Some(reason.clone());
            }
            (
                Transition::MarkUnknown {
                    invocation_id,
                    reason,
                },
                JobStatus::Running,
            ) => {
                check_invocation(invocation_id)?;
                next.status = JobStatus::Unknown;
                next.reason = Some(reason.clone());
            }
            (Transition::Retry { max_attempts }, JobStatus::Failed) => {
                if self.attempt >= *max_attempts {
                    return Err(TransitionError::AttemptsExhausted {
                        trigger_key: self.trigger_key.clone(),
                        attempts: self.attempt,
                        max_attempts: *max_attempts,
                    });
                }
                next.status = JobStatus::Pending;
                next.invocation_id = None;
                next.deadline_ms = None;
            }
            (Transition::Requeue, JobStatus::Unknown) => {
                next.status = JobStatus::Pending;
                next.invocation_id = None;
                next.deadline_ms = None;
            }
            _ => return Err(not_allowed()),
        }
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Job {
        Job::new(TriggerKey::from_wire("tk1-test".into()))
    }

    fn start(inv: &str) -> Transition {
        Transition::Start {
            invocation_id: inv.into(),
            epoch: 1,
            deadline_ms: 10_000,
        }
    }

    #[test]
    fn happy_path_bumps_revision_each_step() {
        let j = job();
        let r = j.transition(0, start("i1")).expect("start");
        assert_eq!(
            (r.status, r.revision, r.attempt),
            (JobStatus::Running, 1, 1)
        );
        let s = r
            .transition(
                1,
                Transition::Succeed {
                    invocation_id: "i1".into(),
                },
            )
            .expect("succeed");
        assert_eq!((s.status, s.revision), (JobStatus::Succeeded, 2));
        assert!(s.status.is_terminal());
    }

    #[test]
    fn sweep_and_late_result_cannot_both_win() {
        let running = job().transition(0, start("i1")).expect("start");
        // Both read revision 1; the sweep commits first.
        let unknown = running
            .transition(
                1,
                Transition::MarkUnknown {
                    invocation_id: "i1".into(),
                    reason: "deadline".into(),
                },
            )
            .expect("sweep");
        let late = unknown.transition(
            1,
            Transition::Succeed {
                invocation_id: "i1".into(),
            },
        );
        assert!(matches!(
            late,
            Err(TransitionError::Conflict {
                expected: 1,
                actual: 2,
                ..
            })
        ));
        // Reconcile re-reads and settles it.
        let settled = unknown
            .transition(
                2,
                Transition::Succeed {
                    invocation_id: "i1".into(),
                },
            )
            .expect("reconcile");
        assert_eq!(settled.status, JobStatus::Succeeded);
    }

    #[test]
    fn results_for_an_old_invocation_are_refused() {
        let failed = job()
            .transition(0, start("i1"))
            .and_then(|j| {
                j.transition(
                    1,
                    Transition::Fail {
                        invocation_id: "i1".into(),
                        reason: "400".into(),
                    },
                )
            })
            .expect("fail");
        let pending = failed
            .transition(2, Transition::Retry { max_attempts: 3 })
            .expect("retry");
        let running2 = pending.transition(3, start("i2")).expect("start 2");
        assert_eq!(running2.attempt, 2);
        let stale = running2.transition(
            4,
            Transition::Succeed {
                invocation_id: "i1".into(),
            },
        );
        assert!(matches!(
            stale,
            Err(TransitionError::StaleInvocation { .. })
        ));
    }

    #[test]
    fn retries_stop_at_the_limit_and_unknown_is_never_restarted_blindly() {
        let failed = job()
            .transition(0, start("i1"))
            .and_then(|j| {
                j.transition(
                    1,
                    Transition::Fail {
                        invocation_id: "i1".into(),
                        reason: "x".into(),
                    },
                )
            })
            .expect("fail");
        assert!(matches!(
            failed.transition(2, Transition::Retry { max_attempts: 1 }),
            Err(TransitionError::AttemptsExhausted { .. })
        ));
        let unknown = job()
            .transition(0, start("i1"))
            .and_then(|j| {
                j.transition(
                    1,
                    Transition::MarkUnknown {
                        invocation_id: "i1".into(),
                        reason: "timeout".into(),
                    },
                )
            })
            .expect("unknown");
        assert!(matches!(
            unknown.transition(2, start("i2")),
            Err(TransitionError::NotAllowed { .. })
        ));
        assert_eq!(
            unknown.transition(2, Transition::Requeue).map(|j| j.status),
            Ok(JobStatus::Pending)
        );
    }

    #[test]
    fn status_names_round_trip() {
        for s in [
            JobStatus::Pending,
            JobStatus::Running,
            JobStatus::Succeeded,
            JobStatus::Failed,
            JobStatus::Unknown,
        ] {
            assert_eq!(JobStatus::parse(s.as_str()), Some(s));
        }
        assert_eq!(JobStatus::parse("running"), None);
    }
}
