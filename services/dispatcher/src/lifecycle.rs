//! The job lifecycle as pure decisions (the Doris dispatcher design): what a
//! send's outcome, an observation of the target, or an expired deadline make of
//! a job. The store carries these out with compare-and-set updates; nothing
//! here does I/O.
//!
//! ```text
//! PENDING ──markRunning (durable before send)──► RUNNING ──result──► SUCCEEDED
//!    ▲                                             │  │                FAILED (final)
//!    └──── refused, attempts left (new invocation) ┘  └─deadline / lost answer─► UNKNOWN
//!    └──── reconcile: the target proves nothing started ◄──────────────────────┘
//! ```

use std::time::Duration;

/// The job statuses are the core's (`sluice_core::JobStatus`, also the Avro enum).
pub use sluice_core::JobStatus as Status;

/// What one send told us.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SendOutcome {
    /// The target took it; `done` when taking it is the whole job (a webhook's
    /// 2xx, a command's exit 0), else the external run is followed.
    Accepted {
        external_id: Option<String>,
        done: bool,
    },
    /// The target ran it and it failed (a command's non-zero exit): known, final
    /// for this invocation, retried per policy.
    Failed { reason: String },
    /// The target ran it and found nothing to do (a command's void exit code: a
    /// table service Hudi declined to plan, the INVALID instance of Hudi's
    /// table-service plan): final, never retried.
    Void { reason: String },
    /// A clean refusal that proves nothing started (a 4xx): retried per policy.
    Refused { reason: String },
    /// The send may or may not have reached the target (timeout, reset, 5xx).
    Unknown { reason: String },
}

/// What asking the target about a job told us.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observed {
    /// The target has no run for this job: nothing started.
    Absent,
    Running {
        external_id: Option<String>,
    },
    Succeeded {
        external_id: Option<String>,
    },
    Failed {
        external_id: Option<String>,
        reason: String,
    },
    /// It ran and had nothing to do: final, never retried (see [`SendOutcome::Void`]).
    Void {
        reason: String,
    },
    /// The target cannot be asked (or did not answer): nothing is concluded.
    CannotTell {
        reason: String,
    },
}

/// Retry policy of a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Invocations in all, the first included.
    pub max_attempts: u32,
    pub backoff: Duration,
    pub max_backoff: Duration,
}

impl RetryPolicy {
    /// Delay before the attempt after `attempt` (1-based): doubling, capped.
    pub fn delay_after(&self, attempt: u32) -> Duration {
        let factor = 1u32 << attempt.saturating_sub(1).min(20);
        self.backoff.saturating_mul(factor).min(self.max_backoff)
    }
}

/// The transition a job makes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transition {
    /// Back to PENDING for a new invocation after `delay`.
    Retry {
        delay: Duration,
        reason: String,
    },
    Succeed {
        external_id: Option<String>,
    },
    /// Final failure (attempts exhausted, or the run itself failed).
    Fail {
        reason: String,
    },
    /// Stays RUNNING, now following the external run.
    Follow {
        external_id: Option<String>,
    },
    Unknown {
        reason: String,
    },
    /// Nothing changes.
    Stay,
}

/// After the one send of invocation number `attempt`.
pub fn after_send(outcome: SendOutcome, attempt: u32, policy: &RetryPolicy) -> Transition {
    match outcome {
        SendOutcome::Accepted {
            external_id,
            done: true,
        } => Transition::Succeed { external_id },
        SendOutcome::Accepted {
            external_id,
            done: false,
        } => Transition::Follow { external_id },
        SendOutcome::Refused { reason } | SendOutcome::Failed { reason } => {
            retry_or_fail(attempt, policy, reason)
        }
        SendOutcome::Void { reason } => void(reason),
        // Never resend blindly: the outcome is settled by asking, or by an operator.
        SendOutcome::Unknown { reason } => Transition::Unknown { reason },
    }
}

fn void(reason: String) -> Transition {
    Transition::Fail {
        reason: format!("void, not retried: {reason}"),
    }
}

fn retry_or_fail(attempt: u32, policy: &RetryPolicy, reason: String) -> Transition {
    if attempt < policy.max_attempts {
        Transition::Retry {
            delay: policy.delay_after(attempt),
            reason,
        }
    } else {
        Transition::Fail {
            reason: format!("{reason} (attempt {attempt} of {})", policy.max_attempts),
        }
    }
}

/// Following a RUNNING job's external run.
pub fn after_follow(observed: Observed, attempt: u32, policy: &RetryPolicy) -> Transition {
    match observed {
        Observed::Running { .. } | Observed::CannotTell { .. } => Transition::Stay,
        Observed::Succeeded { external_id } => Transition::Succeed { external_id },
        Observed::Failed { reason, .. } => retry_or_fail(attempt, policy, reason),
        Observed::Void { reason } => void(reason),
        // The target accepted it and then forgot it: we cannot tell what ran.
        Observed::Absent => Transition::Unknown {
            reason: "the target no longer knows the run it accepted".into(),
        },
    }
}

/// Reconciling an UNKNOWN job by asking the target. `attempt` is the invocation
/// whose outcome is unknown.
pub fn after_reconcile(observed: Observed, attempt: u32, policy: &RetryPolicy) -> Transition {
    match observed {
        // Proof that the invocation never started: sending now is a first send.
        Observed::Absent => {
            if attempt < policy.max_attempts {
                Transition::Retry {
                    delay: Duration::ZERO,
                    reason: "reconciled: the target has no run, the send never arrived".into(),
                }
            } else {
                Transition::Fail {
                    reason: "reconciled: never arrived, and no attempts left".into(),
                }
            }
        }
        Observed::Running { external_id } => Transition::Follow { external_id },
        Observed::Succeeded { external_id } => Transition::Succeed { external_id },
        Observed::Failed { reason, .. } => retry_or_fail(attempt, policy, reason),
        Observed::Void { reason } => void(reason),
        Observed::CannotTell { .. } => Transition::Stay,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: RetryPolicy = RetryPolicy {
        max_attempts: 3,
        backoff: Duration::from_millis(100),
        max_backoff: Duration::from_millis(250),
    };

    #[test]
    fn a_void_run_fails_at_once_wherever_it_is_seen() {
        let reason = || "exited with 3: Hudi planned no compaction".to_owned();
        for t in [
            after_send(SendOutcome::Void { reason: reason() }, 1, &POLICY),
            after_follow(Observed::Void { reason: reason() }, 1, &POLICY),
            after_reconcile(Observed::Void { reason: reason() }, 1, &POLICY),
        ] {
            assert_eq!(
                t,
                Transition::Fail {
                    reason: format!("void, not retried: {}", reason())
                }
            );
        }
    }

    #[test]
    fn a_refusal_retries_until_the_last_attempt_then_fails() {
        let refused = || SendOutcome::Refused {
            reason: "400".into(),
        };
        assert_eq!(
            after_send(refused(), 1, &POLICY),
            Transition::Retry {
                delay: Duration::from_millis(100),
                reason: "400".into()
            }
        );
        assert!(matches!(
            after_send(refused(), 2, &POLICY),
            Transition::Retry { delay, .. } if delay == Duration::from_millis(200)
        ));
        assert!(
            matches!(after_send(refused(), 3, &POLICY), Transition::Fail { reason } if reason.contains("attempt 3 of 3"))
        );
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        assert_eq!(POLICY.delay_after(1), Duration::from_millis(100));
        assert_eq!(POLICY.delay_after(2), Duration::from_millis(200));
        assert_eq!(POLICY.delay_after(3), Duration::from_millis(250));
        assert_eq!(POLICY.delay_after(u32::MAX), Duration::from_millis(250));
    }

    #[test]
    fn an_unknown_send_is_never_retried_blindly() {
        let t = after_send(
            SendOutcome::Unknown {
                reason: "timeout".into(),
            },
            1,
            &POLICY,
        );
        assert_eq!(
            t,
            Transition::Unknown {
                reason: "timeout".into()
            }
        );
    }

    #[test]
    fn accepted_is_done_or_followed() {
        let id = Some("run-1".to_owned());
        assert_eq!(
            after_send(
                SendOutcome::Accepted {
                    external_id: id.clone(),
                    done: true
                },
                1,
                &POLICY
            ),
            Transition::Succeed {
                external_id: id.clone()
            }
        );
        assert_eq!(
            after_send(
                SendOutcome::Accepted {
                    external_id: id.clone(),
                    done: false
                },
                1,
                &POLICY
            ),
            Transition::Follow { external_id: id }
        );
    }

    #[test]
    fn reconcile_resends_only_on_proof_that_nothing_started() {
        assert!(matches!(
            after_reconcile(Observed::Absent, 1, &POLICY),
            Transition::Retry { .. }
        ));
        assert!(matches!(
            after_reconcile(Observed::Absent, 3, &POLICY),
            Transition::Fail { .. }
        ));
        assert_eq!(
            after_reconcile(
                Observed::CannotTell {
                    reason: "no API".into()
                },
                1,
                &POLICY
            ),
            Transition::Stay
        );
        assert_eq!(
            after_reconcile(Observed::Running { external_id: None }, 1, &POLICY),
            Transition::Follow { external_id: None }
        );
    }

    #[test]
    fn following_settles_on_the_runs_end() {
        assert_eq!(
            after_follow(Observed::Running { external_id: None }, 1, &POLICY),
            Transition::Stay
        );
        assert!(matches!(
            after_follow(
                Observed::Failed {
                    external_id: None,
                    reason: "failed".into()
                },
                3,
                &POLICY
            ),
            Transition::Fail { .. }
        ));
        assert!(matches!(
            after_follow(Observed::Absent, 1, &POLICY),
            Transition::Unknown { .. }
        ));
    }
}
