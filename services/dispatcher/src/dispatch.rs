//! The dispatch rounds: sweep deadlines, claim due jobs per target within its
//! caps (durable RUNNING before the send), send each invocation once, follow
//! accepted runs to their end, reconcile UNKNOWN jobs by asking the target.

use std::sync::Arc;
use std::time::Duration;

use sluice_kit::Shutdown;
use sluice_kit::backoff::Backoff;
use sluice_kit::clock::now_ms;
use sqlx::PgPool;
use tokio::task::JoinSet;

use crate::adapters::Adapters;
use crate::group::{Group, Keyed};
use crate::lifecycle::{self, Observed, Status, Transition};
use crate::metrics as m;
use crate::store::{self, ClaimLimits, Claimed, Expect};
use crate::targets::{Kind, LiveTargets, Target};

/// Test-only fault injection (`SLUICE_DISPATCHER_FAULT=abort_after_mark_running`,
/// in a build with the `fault-injection` feature): the process dies like a
/// kill -9 between markRunning and the send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    None,
    #[cfg(feature = "fault-injection")]
    AbortAfterMarkRunning,
}

pub struct Dispatcher {
    pub pool: PgPool,
    pub targets: Arc<LiveTargets>,
    pub adapters: Arc<Adapters>,
    pub epoch: i64,
    pub instance: String,
    pub round: Duration,
    /// Rung when new jobs are recorded (by this instance's intake, or by any
    /// instance through PostgreSQL's `sluice_jobs` notice): the next round starts
    /// at once instead of after `round`.
    pub wake: Arc<tokio::sync::Notify>,
    /// How often a followed run or an UNKNOWN job is looked at.
    pub look_every: Duration,
    pub fault: Fault,
    /// Transitions waiting to be recorded together.
    pub outcomes: Group<Outcome>,
    /// Pre-send checks waiting to be made together.
    pub checks: Group<Check>,
}

/// The most transitions one statement records.
const RECORD_BATCH: usize = 500;
/// The most pre-send checks one statement makes.
const CHECK_BATCH: usize = 1_000;

/// A transition to record, from its guard.
pub struct Outcome {
    trigger_key: String,
    revision: i64,
    status: Status,
    owner: Option<(String, i64)>,
    transition: Transition,
    follow_for: Duration,
}

impl Keyed for Outcome {
    fn key(&self) -> &str {
        &self.trigger_key
    }
}

impl Default for Group<Outcome> {
    fn default() -> Self {
        Group::new(RECORD_BATCH)
    }
}

/// A claimed invocation to check before its send.
pub struct Check {
    trigger_key: String,
    revision: i64,
    invocation_id: String,
}

impl Keyed for Check {
    fn key(&self) -> &str {
        &self.trigger_key
    }
}

impl Default for Group<Check> {
    fn default() -> Self {
        Group::new(CHECK_BATCH)
    }
}

impl Dispatcher {
    /// Runs until shutdown; a failing round (PostgreSQL away) is retried, never an end.
    pub async fn run(self: Arc<Self>, shutdown: Shutdown) -> Result<(), std::convert::Infallible> {
        let mut sends: JoinSet<()> = JoinSet::new();
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        let mut failing;
        let mut chores_done: Option<tokio::time::Instant> = None;
        while !shutdown.is_stopping() {
            while sends.try_join_next().is_some() {}
            let chores = chores_done.is_none_or(|at| at.elapsed() >= self.round);
            let claimed = match self.round(&mut sends, chores).await {
                Ok(claimed) => {
                    if chores {
                        chores_done = Some(tokio::time::Instant::now());
                    }
                    failing = Duration::ZERO;
                    backoff.reset();
                    claimed
                }
                Err(e) => {
                    // PostgreSQL away: nothing is lost (all state is in it); try again.
                    failing = backoff.next_wait();
                    tracing::warn!(error = %e, retry_ms = failing.as_millis() as u64, "dispatch round failed");
                    0
                }
            };
            // A round that claimed work may have left more behind a cap: the next one
            // starts as soon as half the sends under way have freed their slots, not
            // only after the round pause (which bounded a backlog to cap / pause).
            let half = sends.len() / 2;
            let freed = async {
                while claimed > 0 && sends.len() > half && sends.join_next().await.is_some() {}
                if claimed == 0 {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                _ = shutdown.clone().wait_stopped() => break,
                _ = tokio::time::sleep(self.round.max(failing)) => {}
                _ = self.wake.notified(), if failing.is_zero() => {}
                _ = freed => {}
            }
        }
        // Sends under way finish and record their outcome; a send cut off by the
        // grace period leaves a RUNNING job for the sweep, never a resend.
        while sends.join_next().await.is_some() {}
        Ok(())
    }

    /// Rings `wake` on every `sluice_jobs` notice, so jobs recorded by another
    /// instance are claimed at once. A lost connection is made again; meanwhile
    /// the timed round goes on.
    pub async fn listen(
        self: Arc<Self>,
        shutdown: Shutdown,
    ) -> Result<(), std::convert::Infallible> {
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
        while !shutdown.is_stopping() {
            let listener = async {
                let mut l = sqlx::postgres::PgListener::connect_with(&self.pool).await?;
                l.listen("sluice_jobs").await?;
                loop {
                    l.recv().await?;
                    backoff.reset();
                    self.wake.notify_one();
                }
            };
            let result: sqlx::Result<()> = tokio::select! {
                _ = shutdown.clone().wait_stopped() => return Ok(()),
                r = listener => r,
            };
            if let Err(e) = result {
                let wait = backoff.next_wait();
                tracing::warn!(error = %e, retry_ms = wait.as_millis() as u64, "listening for new jobs failed; dispatching by timed rounds meanwhile");
                tokio::time::sleep(wait).await;
            }
        }
        Ok(())
    }

    /// One round; returns how many jobs it claimed. With `chores`, it also sweeps
    /// deadlines, cancels, and follows and reconciles jobs; a busy dispatcher's
    /// back-to-back rounds only claim (the chores cost as much as a claim).
    async fn round(self: &Arc<Self>, sends: &mut JoinSet<()>, chores: bool) -> sqlx::Result<usize> {
        if self.targets.refresh() {
            // A target declared or changed: jobs postponed for want of one go now.
            let woken = store::wake_unroutable(&self.pool).await?;
            if woken > 0 {
                tracing::info!(
                    jobs = woken,
                    "targets changed: unroutable jobs looked at again"
                );
            }
        }
        if chores {
            self.chores().await?;
        }
        let total = self.claim_due(sends).await?;
        if chores {
            self.look(Status::Running).await?;
            self.look(Status::Unknown).await?;
        }
        Ok(total)
    }

    /// Deadlines passed, backfills cancelled.
    async fn chores(&self) -> sqlx::Result<()> {
        let swept = store::sweep_deadlines(&self.pool).await?;
        if !swept.is_empty() {
            metrics::counter!(m::SWEPT_TOTAL).increment(swept.len() as u64);
            tracing::warn!(jobs = swept.len(), "RUNNING past deadline → UNKNOWN");
        }
        let cancelled = store::cancel_backfill_jobs(&self.pool).await?;
        if cancelled > 0 {
            metrics::counter!(m::BACKFILL_CANCELLED_TOTAL).increment(cancelled);
            tracing::info!(
                jobs = cancelled,
                "PENDING jobs of cancelled backfills → CANCELLED"
            );
        }
        Ok(())
    }

    /// Claims the due jobs of each target within its caps and starts their
    /// sends; returns how many it claimed.
    async fn claim_due(self: &Arc<Self>, sends: &mut JoinSet<()>) -> sqlx::Result<usize> {
        let mut total = 0;
        let targets = self.targets.current();
        for (kind, name) in store::due_targets(&self.pool).await? {
            let Some(target) = Kind::parse(&kind).and_then(|k| targets.get(k, &name)) else {
                let n =
                    store::postpone_unroutable(&self.pool, &kind, &name, Duration::from_secs(30))
                        .await?;
                metrics::counter!(m::UNROUTABLE_TOTAL).increment(n);
                tracing::warn!(kind, name, jobs = n, "no target configured; jobs wait");
                continue;
            };
            if target.paused {
                // No new sends; the jobs wait PENDING, those under way are followed.
                continue;
            }
            let limits = ClaimLimits {
                max_in_flight: target.limits.max_in_flight,
                max_per_round: target.limits.max_per_round,
                deadline: target.timing.deadline,
            };
            let claimed = store::claim(
                &self.pool,
                &kind,
                &name,
                &limits,
                self.epoch,
                &self.instance,
            )
            .await?;
            #[cfg(feature = "fault-injection")]
            if !claimed.is_empty() && self.fault == Fault::AbortAfterMarkRunning {
                tracing::error!(
                    jobs = claimed.len(),
                    "fault injection: abort after markRunning"
                );
                std::process::abort();
            }
            total += claimed.len();
            for job in claimed {
                let me = self.clone();
                let target = target.clone();
                sends.spawn(async move { me.send(target, job).await });
            }
        }
        Ok(total)
    }

    /// The one send of a claimed invocation, then its outcome under the invocation's guard.
    /// Nothing is sent unless the durable record still names this invocation (the
    /// pre-send check); a job whose check cannot be made is left RUNNING for the
    /// deadline sweep and the reconcile, never sent blind.
    pub async fn send(&self, target: Target, job: Claimed) {
        let mut checked = self.still_claimed(&job).await;
        let mut delay = Duration::from_millis(100);
        while checked.is_err() && delay <= Duration::from_secs(2) {
            tokio::time::sleep(delay).await;
            delay *= 2;
            checked = self.still_claimed(&job).await;
        }
        match checked {
            Ok(true) => {}
            Ok(false) => {
                metrics::counter!(m::SENDS_WITHHELD_TOTAL, "reason" => "moved").increment(1);
                tracing::warn!(trigger_key = %job.trigger_key, revision = job.revision,
                    "job moved since its claim; not sent");
                return;
            }
            Err(e) => {
                metrics::counter!(m::SENDS_WITHHELD_TOTAL, "reason" => "unchecked").increment(1);
                tracing::warn!(trigger_key = %job.trigger_key, error = %e,
                    "pre-send check failed; not sent (the deadline sweep takes the job)");
                return;
            }
        }
        let latency = (now_ms() - job.first_commit_ms).max(0) as f64 / 1000.0;
        metrics::histogram!(m::COMMIT_TO_DISPATCH_SECONDS).record(latency);
        let outcome = self.adapters.send(&target, &job).await;
        let label = match &outcome {
            lifecycle::SendOutcome::Accepted { .. } => "accepted",
            lifecycle::SendOutcome::Failed { .. } => "failed",
            lifecycle::SendOutcome::Void { .. } => "void",
            lifecycle::SendOutcome::Refused { .. } => "refused",
            lifecycle::SendOutcome::Unknown { .. } => "unknown",
        };
        metrics::counter!(m::SENDS_TOTAL, "kind" => job.target_kind.clone(), "outcome" => label)
            .increment(1);
        tracing::info!(trigger_key = %job.trigger_key, target = %job.target_name, attempt = job.attempt,
            invocation = %job.invocation_id, outcome = ?outcome, latency_s = latency, "dispatched");
        let t = lifecycle::after_send(outcome, job.attempt as u32, &target.policy);
        let from = Expect {
            trigger_key: &job.trigger_key,
            revision: job.revision,
            status: Status::Running,
            owner: Some((&job.invocation_id, self.epoch)),
        };
        self.apply(&from, &t, &target).await;
    }

    /// Records `t` from `from` with the transitions that wait beside it (one
    /// statement); returns whether it won its guard.
    async fn record(
        &self,
        from: &Expect<'_>,
        t: &Transition,
        follow_for: Duration,
    ) -> Result<bool, String> {
        if *t == Transition::Stay {
            return Ok(true); // nothing to record, nothing to wait for
        }
        let outcome = Outcome {
            trigger_key: from.trigger_key.to_owned(),
            revision: from.revision,
            status: from.status,
            owner: from.owner.map(|(inv, e)| (inv.to_owned(), e)),
            transition: t.clone(),
            follow_for,
        };
        let (pool, epoch) = (&self.pool, self.epoch);
        self.outcomes
            .submit(outcome, |batch: Vec<Outcome>| async move {
                let rows: Vec<_> = batch
                    .iter()
                    .map(|o| {
                        let from = Expect {
                            trigger_key: &o.trigger_key,
                            revision: o.revision,
                            status: o.status,
                            owner: o.owner.as_ref().map(|(inv, e)| (inv.as_str(), *e)),
                        };
                        (from, &o.transition, o.follow_for)
                    })
                    .collect();
                metrics::histogram!(m::TRANSITIONS_PER_STATEMENT).record(batch.len() as f64);
                store::transitions(pool, &rows, epoch)
                    .await
                    .map_err(|e| e.to_string())
            })
            .await
    }

    /// Whether the durable record still names this invocation, checked with the
    /// sends that wait beside it (one statement for a claim's burst of sends).
    async fn still_claimed(&self, job: &Claimed) -> Result<bool, String> {
        let check = Check {
            trigger_key: job.trigger_key.clone(),
            revision: job.revision,
            invocation_id: job.invocation_id.clone(),
        };
        let (pool, epoch) = (&self.pool, self.epoch);
        self.checks
            .submit(check, |batch: Vec<Check>| async move {
                let jobs: Vec<_> = batch
                    .iter()
                    .map(|c| (c.trigger_key.as_str(), c.revision, c.invocation_id.as_str()))
                    .collect();
                store::still_claimed(pool, &jobs, epoch)
                    .await
                    .map_err(|e| e.to_string())
            })
            .await
    }

    /// Applies a transition, retrying while PostgreSQL is away; a lost
    /// compare-and-set means another path (a sweep, a peer) settled the job first.
    async fn apply(&self, from: &Expect<'_>, t: &Transition, target: &Target) {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        for _ in 0..20 {
            match self.record(from, t, target.timing.run_timeout).await {
                Ok(true) => return,
                Ok(false) => {
                    metrics::counter!(m::TRANSITIONS_LOST_TOTAL).increment(1);
                    tracing::warn!(trigger_key = from.trigger_key, transition = ?t, "transition lost: the job moved meanwhile");
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, trigger_key = from.trigger_key, "recording a transition failed; retrying");
                    tokio::time::sleep(backoff.next_wait()).await;
                }
            }
        }
        // The deadline sweep converges a RUNNING job whose outcome could not be recorded.
        tracing::error!(
            trigger_key = from.trigger_key,
            "transition not recorded; the sweep will settle the job"
        );
    }

    /// Follows RUNNING jobs with an external run, or reconciles UNKNOWN jobs.
    async fn look(&self, status: Status) -> sqlx::Result<()> {
        let lease = self.look_every * 10;
        let jobs =
            store::lease_due(&self.pool, status, 200, self.epoch, lease, self.look_every).await?;
        let targets = self.targets.current();
        for job in jobs {
            let Some(target) = Kind::parse(&job.target_kind)
                .and_then(|k| targets.get(k, &job.target_name))
                .cloned()
            else {
                continue;
            };
            let attempt = job.attempt as u32;
            let t = match status {
                Status::Running => {
                    let seen = self.adapters.observe(&target, &job).await;
                    lifecycle::after_follow(seen, attempt, &target.policy)
                }
                _ => {
                    let seen = self.adapters.observe(&target, &job).await;
                    match seen {
                        Observed::CannotTell { reason } if Adapters::resend_is_safe(&target) => {
                            if attempt < target.policy.max_attempts {
                                Transition::Retry {
                                    delay: Duration::ZERO,
                                    reason: format!(
                                        "resent under the same trigger_key (the receiver deduplicates): {reason}"
                                    ),
                                }
                            } else {
                                Transition::Fail {
                                    reason: "outcome unknown and no attempts left".into(),
                                }
                            }
                        }
                        seen => lifecycle::after_reconcile(seen, attempt, &target.policy),
                    }
                }
            };
            if t == Transition::Stay {
                continue;
            }
            tracing::info!(trigger_key = %job.trigger_key, from = status.as_str(), transition = ?t, "settled by asking the target");
            if status == Status::Unknown {
                metrics::counter!(m::RECONCILED_TOTAL).increment(1);
            }
            let owner =
                (status == Status::Running).then_some((job.invocation_id.as_str(), self.epoch));
            let from = Expect {
                trigger_key: &job.trigger_key,
                revision: job.revision,
                status,
                owner,
            };
            self.apply(&from, &t, &target).await;
        }
        Ok(())
    }
}
