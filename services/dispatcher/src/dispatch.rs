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
    /// Outcomes waiting to be recorded together.
    pub outcomes: Outcomes,
}

/// Group commit of the jobs' transitions: while one statement records a batch,
/// the outcomes that arrive meanwhile wait and go in the next, so a busy
/// dispatcher pays one round trip and one commit for many jobs, an idle one
/// nothing more than before (one statement per job was what bounded dispatch).
#[derive(Default)]
pub struct Outcomes {
    queue: std::sync::Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Outcome>,
    /// A caller is recording batches: new outcomes only wait for it.
    recording: bool,
}

struct Outcome {
    trigger_key: String,
    revision: i64,
    status: Status,
    owner: Option<(String, i64)>,
    transition: Transition,
    follow_for: Duration,
    /// Whether the transition won, or why it could not be recorded.
    done: tokio::sync::oneshot::Sender<Result<bool, String>>,
}

/// The most transitions one statement records.
const RECORD_BATCH: usize = 500;

impl Outcomes {
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `t` from `from` with the outcomes that wait beside it; returns
    /// whether it won its guard. The first caller to find nobody recording
    /// records every batch until none waits.
    async fn record(
        &self,
        pool: &PgPool,
        from: &Expect<'_>,
        t: &Transition,
        follow_for: Duration,
        epoch: i64,
    ) -> Result<bool, String> {
        if *t == Transition::Stay {
            return Ok(true); // nothing to record, nothing to wait for
        }
        let (done, result) = tokio::sync::oneshot::channel();
        let lead = {
            let mut q = self.queue();
            q.waiting.push(Outcome {
                trigger_key: from.trigger_key.to_owned(),
                revision: from.revision,
                status: from.status,
                owner: from.owner.map(|(inv, e)| (inv.to_owned(), e)),
                transition: t.clone(),
                follow_for,
                done,
            });
            !std::mem::replace(&mut q.recording, true)
        };
        if lead {
            // Cancelled mid-way, the leader hands the role on: the next caller leads.
            let mut handover = Handover {
                outcomes: self,
                done: false,
            };
            while let Some(batch) = self.next_batch() {
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
                let outcome = store::transitions(pool, &rows, epoch).await;
                drop(rows);
                metrics::histogram!(m::TRANSITIONS_PER_STATEMENT).record(batch.len() as f64);
                for (i, o) in batch.into_iter().enumerate() {
                    let _ = o.done.send(match &outcome {
                        Ok(won) => Ok(won[i]),
                        Err(e) => Err(e.to_string()),
                    });
                }
            }
            handover.done = true;
        }
        result
            .await
            .unwrap_or_else(|_| Err("the recording caller went away".into()))
    }

    /// The next batch: distinct jobs, oldest first; `None` ends the lead.
    fn next_batch(&self) -> Option<Vec<Outcome>> {
        let mut q = self.queue();
        if q.waiting.is_empty() {
            q.recording = false;
            return None;
        }
        let mut keys = std::collections::HashSet::new();
        let end = q
            .waiting
            .iter()
            .take(RECORD_BATCH)
            .position(|o| !keys.insert(o.trigger_key.clone()))
            .unwrap_or(q.waiting.len().min(RECORD_BATCH));
        Some(q.waiting.drain(..end).collect())
    }
}

/// Gives up the recording role if its holder is dropped before it is done (a
/// cancelled send): its waiters see their outcome gone, retry, and one leads.
struct Handover<'a> {
    outcomes: &'a Outcomes,
    done: bool,
}

impl Drop for Handover<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.outcomes.queue().recording = false;
        }
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
        let mut checked = store::still_claimed(&self.pool, &job, self.epoch).await;
        let mut delay = Duration::from_millis(100);
        while checked.is_err() && delay <= Duration::from_secs(2) {
            tokio::time::sleep(delay).await;
            delay *= 2;
            checked = store::still_claimed(&self.pool, &job, self.epoch).await;
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

    /// Applies a transition, retrying while PostgreSQL is away; a lost
    /// compare-and-set means another path (a sweep, a peer) settled the job first.
    async fn apply(&self, from: &Expect<'_>, t: &Transition, target: &Target) {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        for _ in 0..20 {
            match self
                .outcomes
                .record(&self.pool, from, t, target.timing.run_timeout, self.epoch)
                .await
            {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(outcomes: &Outcomes, key: &str) {
        let (done, _) = tokio::sync::oneshot::channel();
        outcomes.queue().waiting.push(Outcome {
            trigger_key: key.into(),
            revision: 1,
            status: Status::Running,
            owner: None,
            transition: Transition::Stay,
            follow_for: Duration::ZERO,
            done,
        });
    }

    fn keys(batch: Option<Vec<Outcome>>) -> Vec<String> {
        batch
            .unwrap_or_default()
            .into_iter()
            .map(|o| o.trigger_key)
            .collect()
    }

    /// One statement matches a row by one guard only: a job's second outcome
    /// waits for the next batch, in order.
    #[test]
    fn a_batch_holds_each_job_once_and_keeps_the_order() {
        let outcomes = Outcomes::default();
        for k in ["a", "b", "a", "c"] {
            waiting(&outcomes, k);
        }
        outcomes.queue().recording = true;
        assert_eq!(keys(outcomes.next_batch()), ["a", "b"]);
        assert_eq!(keys(outcomes.next_batch()), ["a", "c"]);
        assert!(outcomes.next_batch().is_none());
        assert!(!outcomes.queue().recording, "an empty queue ends the lead");
    }

    #[test]
    fn a_batch_is_at_most_a_statement_long() {
        let outcomes = Outcomes::default();
        for k in 0..RECORD_BATCH + 3 {
            waiting(&outcomes, &k.to_string());
        }
        assert_eq!(keys(outcomes.next_batch()).len(), RECORD_BATCH);
        assert_eq!(keys(outcomes.next_batch()).len(), 3);
    }
}
