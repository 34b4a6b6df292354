//! PostgreSQL: trigger_history (the unique trigger_key), jobs and their
//! compare-and-set transitions, the outbox of transitions for the runs topic.
//!
//! Every transition names the revision it expects; a job that moved meanwhile
//! (a sweep, a late result, another instance) makes it a no-op that reports
//! `false`. Transitions out of RUNNING also name the invocation and the epoch that
//! owns it, so an instance that lost the job cannot touch it.

use std::time::Duration;

use sqlx::{PgPool, Postgres, Row, Transaction};

use crate::lifecycle::{Status, Transition};

/// A trigger as read from the triggers topic, ready for trigger_history.
#[derive(Clone, Debug)]
pub struct NewTrigger {
    pub trigger_key: String,
    pub dependency_id: String,
    pub dependency_version: i64,
    pub target_kind: String,
    pub target_name: String,
    /// JSON object of strings.
    pub target_parameters: String,
    /// JSON array of the input combination.
    pub inputs: String,
    pub partition: Option<String>,
    pub window_end_ms: Option<i64>,
    pub reason: String,
    pub first_commit_ms: i64,
    pub requested_ms: i64,
    pub source_partition: i32,
    pub source_offset: i64,
    /// `data`, `manual`, `rerun` or `backfill`.
    pub origin: String,
    pub requested_by: Option<String>,
    pub request_id: Option<String>,
    pub rerun_of: Option<String>,
}

/// Inserts a batch in one statement; only keys never seen before create a job.
/// Returns the keys that were new.
pub async fn record_triggers(pool: &PgPool, batch: &[NewTrigger]) -> sqlx::Result<Vec<String>> {
    if batch.is_empty() {
        return Ok(Vec::new());
    }
    macro_rules! col {
        ($f:ident) => {
            batch.iter().map(|t| t.$f.clone()).collect::<Vec<_>>()
        };
    }
    sqlx::query_scalar(
        r#"
WITH input AS (
    SELECT * FROM UNNEST($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[],
                         $7::text[], $8::text[], $9::bigint[], $10::text[], $11::bigint[], $12::bigint[],
                         $13::int[], $14::bigint[], $15::text[], $16::text[], $17::text[], $18::text[])
      AS t(trigger_key, dependency_id, dependency_version, target_kind, target_name, target_parameters,
           inputs, partition_value, window_end_ms, reason, first_commit_ms, requested_ms,
           source_partition, source_offset, origin, requested_by, request_id, rerun_of)
), new AS (
    INSERT INTO trigger_history (trigger_key, dependency_id, dependency_version, target_kind, target_name,
                                 target_parameters, inputs, partition_value, window_end_ms, reason,
                                 first_commit_at, requested_at, source_partition, source_offset,
                                 origin, requested_by, request_id, rerun_of)
    SELECT DISTINCT ON (i.trigger_key) i.trigger_key, i.dependency_id, i.dependency_version, i.target_kind,
           i.target_name, i.target_parameters::jsonb, i.inputs::jsonb, i.partition_value, i.window_end_ms,
           i.reason, to_timestamp(i.first_commit_ms / 1000.0), to_timestamp(i.requested_ms / 1000.0),
           i.source_partition, i.source_offset, i.origin, i.requested_by, i.request_id,
           -- a re-run of a run this database never saw is recorded without the link
           (SELECT h.trigger_key FROM trigger_history h WHERE h.trigger_key = i.rerun_of)
    FROM input i ORDER BY i.trigger_key, i.source_offset
    ON CONFLICT (trigger_key) DO NOTHING
    RETURNING trigger_key, dependency_id, target_kind, target_name, origin, request_id, target_parameters
)
INSERT INTO jobs (trigger_key, dependency_id, status, target_kind, target_name, backfill_id, priority)
SELECT n.trigger_key, n.dependency_id, 'PENDING', n.target_kind, n.target_name,
       -- a backfill item is paced as its backfill; one this database never saw
       -- (written to the topic by hand) is dispatched as a live trigger
       (SELECT b.backfill_id FROM backfills b WHERE n.origin = 'backfill' AND b.backfill_id = n.request_id),
       -- the spec's validation admits only such integers; anything else written
       -- to the topic by hand is priority 0, never a failed insert
       CASE WHEN n.target_parameters->>'priority' ~ '^-?[0-9]{1,6}$'
            THEN (n.target_parameters->>'priority')::int ELSE 0 END
FROM new n
RETURNING trigger_key"#,
    )
    .bind(col!(trigger_key))
    .bind(col!(dependency_id))
    .bind(col!(dependency_version))
    .bind(col!(target_kind))
    .bind(col!(target_name))
    .bind(col!(target_parameters))
    .bind(col!(inputs))
    .bind(col!(partition))
    .bind(col!(window_end_ms))
    .bind(col!(reason))
    .bind(col!(first_commit_ms))
    .bind(col!(requested_ms))
    .bind(col!(source_partition))
    .bind(col!(source_offset))
    .bind(col!(origin))
    .bind(col!(requested_by))
    .bind(col!(request_id))
    .bind(col!(rerun_of))
    .fetch_all(pool)
    .await
}

/// The same batch one statement per trigger: the benchmark's baseline.
pub async fn record_trigger_one_by_one(pool: &PgPool, t: &NewTrigger) -> sqlx::Result<bool> {
    Ok(!record_triggers(pool, std::slice::from_ref(t))
        .await?
        .is_empty())
}

/// A job claimed for one invocation (RUNNING, durable), with what the send needs.
#[derive(Clone, Debug)]
pub struct Claimed {
    pub trigger_key: String,
    pub revision: i64,
    pub attempt: i32,
    pub invocation_id: String,
    pub external_id: Option<String>,
    pub status: Status,
    /// The instance that claimed the invocation (where a command target ran it).
    pub owner: Option<String>,
    pub dependency_id: String,
    pub dependency_version: i64,
    pub target_kind: String,
    pub target_name: String,
    pub target_parameters: serde_json::Value,
    pub inputs: serde_json::Value,
    pub partition: Option<String>,
    pub window_end_ms: Option<i64>,
    pub reason: String,
    pub first_commit_ms: i64,
}

/// The columns a [`Claimed`] is read from (a macro so the SQL stays `'static`).
macro_rules! claimed_columns {
    () => {
        "j.trigger_key, j.revision, j.attempt, j.invocation_id, j.external_id, j.status, j.lease_owner, \
     h.dependency_id, h.dependency_version, h.target_kind, h.target_name, h.target_parameters::text AS params, \
     h.inputs::text AS inputs, h.partition_value, h.window_end_ms, h.reason, \
     (extract(epoch FROM h.first_commit_at) * 1000)::bigint AS first_commit_ms"
    };
}

fn claimed(row: &sqlx::postgres::PgRow) -> sqlx::Result<Claimed> {
    let json = |c: &str| -> sqlx::Result<serde_json::Value> {
        let s: String = row.try_get(c)?;
        serde_json::from_str(&s).map_err(|e| sqlx::Error::Decode(Box::new(e)))
    };
    let status: String = row.try_get("status")?;
    Ok(Claimed {
        trigger_key: row.try_get("trigger_key")?,
        revision: row.try_get("revision")?,
        attempt: row.try_get("attempt")?,
        invocation_id: row
            .try_get::<Option<String>, _>("invocation_id")?
            .unwrap_or_default(),
        external_id: row.try_get("external_id")?,
        owner: row.try_get("lease_owner")?,
        status: Status::parse(&status)
            .ok_or_else(|| sqlx::Error::Decode(format!("unknown job status {status:?}").into()))?,
        dependency_id: row.try_get("dependency_id")?,
        dependency_version: row.try_get("dependency_version")?,
        target_kind: row.try_get("target_kind")?,
        target_name: row.try_get("target_name")?,
        target_parameters: json("params")?,
        inputs: json("inputs")?,
        partition: row.try_get("partition_value")?,
        window_end_ms: row.try_get("window_end_ms")?,
        reason: row.try_get("reason")?,
        first_commit_ms: row.try_get("first_commit_ms")?,
    })
}

/// Targets with PENDING jobs due now: skip scans of `jobs_live_pending` (one
/// probe per target with live jobs waiting, one for whether any is due) and of
/// `jobs_backfill_pending` (one per backfill with items waiting, never the
/// finished ones, which are kept). A `SELECT DISTINCT` over the jobs read every
/// waiting job each round (11 ms with 60,000 waiting).
pub async fn due_targets(pool: &PgPool) -> sqlx::Result<Vec<(String, String)>> {
    sqlx::query_as(
        r#"
WITH RECURSIVE waiting(target_kind, target_name) AS (
    (SELECT target_kind, target_name FROM jobs WHERE status = 'PENDING' AND backfill_id IS NULL
     ORDER BY target_kind, target_name LIMIT 1)
    UNION ALL
    SELECT next.target_kind, next.target_name FROM waiting w CROSS JOIN LATERAL (
        SELECT target_kind, target_name FROM jobs
        WHERE status = 'PENDING' AND backfill_id IS NULL
          AND (target_kind, target_name) > (w.target_kind, w.target_name)
        ORDER BY target_kind, target_name LIMIT 1
    ) next
), backfilling(backfill_id) AS (
    (SELECT backfill_id FROM jobs WHERE status = 'PENDING' AND backfill_id IS NOT NULL
     ORDER BY backfill_id LIMIT 1)
    UNION ALL
    SELECT next.backfill_id FROM backfilling f CROSS JOIN LATERAL (
        SELECT backfill_id FROM jobs
        WHERE status = 'PENDING' AND backfill_id IS NOT NULL AND backfill_id > f.backfill_id
        ORDER BY backfill_id LIMIT 1
    ) next
)
SELECT w.target_kind, w.target_name FROM waiting w CROSS JOIN LATERAL (
    SELECT 1 FROM jobs j
    WHERE j.status = 'PENDING' AND j.backfill_id IS NULL AND j.target_kind = w.target_kind
      AND j.target_name = w.target_name AND j.next_attempt_at <= now()
    LIMIT 1
) due
UNION
SELECT b.target_kind, b.target_name FROM backfilling f
JOIN backfills b USING (backfill_id) CROSS JOIN LATERAL (
    SELECT 1 FROM jobs j
    WHERE j.backfill_id = f.backfill_id AND j.status = 'PENDING' AND j.next_attempt_at <= now()
    LIMIT 1
) due
WHERE b.cancelled_at IS NULL"#,
    )
    .fetch_all(pool)
    .await
}

pub struct ClaimLimits {
    pub max_in_flight: u32,
    pub max_per_round: u32,
    pub deadline: Duration,
}

impl ClaimLimits {
    /// The most of the target's slots one backfill may hold: half (at least one),
    /// so live triggers always find a slot free when the target has two or more.
    pub fn backfill_share(&self) -> u32 {
        (self.max_in_flight / 2).max(1)
    }
}

/// markRunning for up to the target's free capacity: PENDING → RUNNING with a
/// fresh invocation id, this epoch and a deadline, committed before any send.
/// The target's advisory lock makes the in-flight cap hold across instances;
/// RUNNING and UNKNOWN jobs both count against it.
pub async fn claim(
    pool: &PgPool,
    kind: &str,
    name: &str,
    limits: &ClaimLimits,
    epoch: i64,
    instance: &str,
) -> sqlx::Result<Vec<Claimed>> {
    let mut tx: Transaction<'_, Postgres> = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2, 7))")
        .bind(kind)
        .bind(name)
        .execute(&mut *tx)
        .await?;
    let pick = r#"
WITH running AS (
    -- An UNKNOWN job may still be running at the target: it holds its slot until
    -- its outcome is known (settled, reconciled or proven dead).
    -- At most the cap is counted: more leaves no room either way.
    SELECT count(*) AS n FROM (
        SELECT 1 FROM jobs
        WHERE status IN ('RUNNING', 'UNKNOWN') AND target_kind = $1 AND target_name = $2
        LIMIT $4
    ) holding
), room AS (
    SELECT GREATEST(0, LEAST($3::bigint, $4::bigint - (SELECT n FROM running))) AS n
), live AS (
    -- Live triggers first: a backfill's backlog never stands in front of them.
    SELECT trigger_key, revision FROM jobs
    WHERE status = 'PENDING' AND backfill_id IS NULL AND target_kind = $1 AND target_name = $2
      AND next_attempt_at <= now()
    ORDER BY priority DESC, next_attempt_at, trigger_key
    LIMIT (SELECT n FROM room)
), share AS (
    -- What each backfill on this target may start now: its slots (the request's,
    -- at most the target's share) less its jobs under way, and its pace less its
    -- claims of the last minute.
    SELECT b.backfill_id, b.created_at,
           LEAST(LEAST(coalesce(b.max_in_flight, $5::int), $5::int)
                   - (SELECT count(*) FROM jobs r WHERE r.backfill_id = b.backfill_id
                                                    AND r.status IN ('RUNNING', 'UNKNOWN')),
                 CASE WHEN b.per_minute IS NULL THEN $3::bigint
                      ELSE b.per_minute - (SELECT count(*) FROM jobs r
                                           WHERE r.backfill_id = b.backfill_id
                                             AND r.claimed_at > now() - interval '1 minute')
                 END) AS n
    FROM backfills b
    WHERE b.target_kind = $1 AND b.target_name = $2 AND b.cancelled_at IS NULL
      AND EXISTS (SELECT 1 FROM jobs p WHERE p.backfill_id = b.backfill_id AND p.status = 'PENDING')
), backfill AS (
    -- The room live triggers left, oldest backfill first.
    SELECT p.trigger_key, p.revision FROM share s CROSS JOIN LATERAL (
        SELECT j.trigger_key, j.revision, j.next_attempt_at FROM jobs j
        WHERE j.backfill_id = s.backfill_id AND j.status = 'PENDING' AND j.next_attempt_at <= now()
        ORDER BY j.next_attempt_at, j.trigger_key
        LIMIT GREATEST(0, s.n)
    ) p
    ORDER BY s.created_at, s.backfill_id, p.next_attempt_at, p.trigger_key
    LIMIT GREATEST(0, (SELECT n FROM room) - (SELECT count(*) FROM live))
)
SELECT trigger_key, revision FROM live UNION ALL SELECT trigger_key, revision FROM backfill"#;
    let picked: Vec<(String, i64)> = sqlx::query_as(pick)
        .bind(kind)
        .bind(name)
        .bind(i64::from(limits.max_per_round))
        .bind(i64::from(limits.max_in_flight))
        .bind(limits.backfill_share() as i32)
        .fetch_all(&mut *tx)
        .await?;
    if picked.is_empty() {
        tx.commit().await?;
        return Ok(Vec::new());
    }
    let (keys, revisions): (Vec<String>, Vec<i64>) = picked.into_iter().unzip();
    // The picked jobs are marked by key in a statement of their own: joined to the
    // pick, whose size the planner cannot know, it chose by statistics a sudden
    // backlog makes wrong (a hash of every PENDING job, or a scan of them all by
    // status: 2–16 ms for 64). The revision guard: a job an operator or a cancel
    // moved since the pick stays where it is.
    let sql = concat!(
        r#"
UPDATE jobs j SET status = 'RUNNING', revision = j.revision + 1, attempt = j.attempt + 1,
       invocation_id = gen_random_uuid()::text, epoch = $3, lease_owner = $4,
       deadline_at = now() + $5 * interval '1 millisecond', lease_until = NULL,
       external_id = NULL, reason = NULL, updated_at = now(), claimed_at = now()
FROM unnest($1::text[], $2::bigint[]) AS p(trigger_key, revision), trigger_history h
WHERE j.trigger_key = p.trigger_key AND j.revision = p.revision AND h.trigger_key = j.trigger_key
RETURNING "#,
        claimed_columns!()
    );
    let rows = sqlx::query(sql)
        .bind(&keys)
        .bind(&revisions)
        .bind(epoch)
        .bind(instance)
        .bind(millis(limits.deadline))
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    rows.iter().map(claimed).collect()
}

/// A cancelled backfill's jobs still PENDING become CANCELLED (never sent); its
/// jobs under way finish. Returns how many were cancelled.
pub async fn cancel_backfill_jobs(pool: &PgPool) -> sqlx::Result<u64> {
    let done = sqlx::query(
        r#"
UPDATE jobs j SET status = 'CANCELLED', revision = j.revision + 1, updated_at = now(),
       reason = 'backfill ' || b.backfill_id || ' cancelled by ' || coalesce(b.cancelled_by, 'an operator')
FROM backfills b
WHERE j.backfill_id = b.backfill_id AND b.cancelled_at IS NOT NULL AND j.status = 'PENDING'"#,
    )
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}

/// Of `(trigger key, revision, invocation)` claims, which the durable record
/// still names (RUNNING under this invocation and `epoch`): one statement for a
/// batch, an answer per claim in order.
pub async fn still_claimed(
    pool: &PgPool,
    jobs: &[(&str, i64, &str)],
    epoch: i64,
) -> sqlx::Result<Vec<bool>> {
    let keys: Vec<&str> = jobs.iter().map(|j| j.0).collect();
    let revisions: Vec<i64> = jobs.iter().map(|j| j.1).collect();
    let invocations: Vec<&str> = jobs.iter().map(|j| j.2).collect();
    let held: Vec<i64> = sqlx::query_scalar(
        r#"
SELECT k.i FROM unnest($1::text[], $2::bigint[], $3::text[]) WITH ORDINALITY AS k(key, rev, inv, i)
WHERE EXISTS (SELECT 1 FROM jobs j WHERE j.trigger_key = k.key AND j.revision = k.rev
                AND j.status = 'RUNNING' AND j.invocation_id = k.inv AND j.epoch = $4)"#,
    )
    .bind(&keys)
    .bind(&revisions)
    .bind(&invocations)
    .bind(epoch)
    .fetch_all(pool)
    .await?;
    let mut out = vec![false; jobs.len()];
    for i in held {
        if let Some(slot) = usize::try_from(i - 1).ok().and_then(|i| out.get_mut(i)) {
            *slot = true;
        }
    }
    Ok(out)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Where a transition comes from: its guard.
#[derive(Clone, Debug)]
pub struct Expect<'a> {
    pub trigger_key: &'a str,
    pub revision: i64,
    pub status: Status,
    /// For a job leaving RUNNING: the invocation and the epoch that own it.
    pub owner: Option<(&'a str, i64)>,
}

/// Applies `t` if the job is still where `from` says. Returns whether it won.
/// `follow_for` is the deadline of an external run being followed.
pub async fn transition(
    pool: &PgPool,
    from: &Expect<'_>,
    t: &Transition,
    follow_for: Duration,
    epoch: i64,
) -> sqlx::Result<bool> {
    Ok(transitions(pool, &[(from.clone(), t, follow_for)], epoch)
        .await?
        .first()
        .copied()
        .unwrap_or(false))
}

/// Applies many transitions in one statement (one round trip, one commit), each
/// under its own guard; returns, in order, whether each won. The jobs must be
/// distinct: one row is matched by at most one guard.
pub async fn transitions(
    pool: &PgPool,
    batch: &[(Expect<'_>, &Transition, Duration)],
    epoch: i64,
) -> sqlx::Result<Vec<bool>> {
    let mut cols = Columns::default();
    for (from, t, follow_for) in batch {
        let (status, reason, external_id, delay_ms) = match t {
            // Nothing to record: the job stays as it is.
            Transition::Stay => continue,
            Transition::Retry { delay, reason } => {
                (Status::Pending, Some(reason.clone()), None, millis(*delay))
            }
            Transition::Succeed { external_id } => {
                (Status::Succeeded, None, external_id.clone(), 0)
            }
            Transition::Fail { reason } => (Status::Failed, Some(reason.clone()), None, 0),
            Transition::Follow { external_id } => (Status::Running, None, external_id.clone(), 0),
            Transition::Unknown { reason } => (Status::Unknown, Some(reason.clone()), None, 0),
        };
        let (inv, owner_epoch) = from.owner.unwrap_or(("", -1));
        cols.status.push(status.as_str());
        cols.reason.push(reason);
        cols.external_id.push(external_id);
        cols.delay_ms.push(delay_ms);
        cols.follow_ms.push(millis(*follow_for));
        cols.trigger_key.push(from.trigger_key);
        cols.revision.push(from.revision);
        cols.from_status.push(from.status.as_str());
        cols.inv.push(inv);
        cols.owner_epoch.push(owner_epoch);
    }
    let won: std::collections::HashSet<String> = if cols.status.is_empty() {
        Default::default()
    } else {
        sqlx::query_scalar(
            r#"
UPDATE jobs j SET status = t.status, revision = j.revision + 1, reason = COALESCE(t.reason, j.reason),
       external_id = COALESCE(t.external_id, j.external_id),
       next_attempt_at = now() + t.delay_ms * interval '1 millisecond',
       deadline_at = CASE WHEN t.status = 'RUNNING' THEN now() + t.follow_ms * interval '1 millisecond' ELSE j.deadline_at END,
       epoch = CASE WHEN t.status = 'RUNNING' THEN $11 ELSE j.epoch END,
       updated_at = now()
FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::text[], $7::bigint[],
            $8::text[], $9::text[], $10::bigint[])
     AS t(status, reason, external_id, delay_ms, follow_ms, trigger_key, revision, from_status, inv, owner_epoch)
WHERE j.trigger_key = t.trigger_key AND j.revision = t.revision AND j.status = t.from_status
  AND (t.inv = '' OR (j.invocation_id = t.inv AND j.epoch = t.owner_epoch))
RETURNING j.trigger_key"#,
        )
        .bind(&cols.status)
        .bind(&cols.reason)
        .bind(&cols.external_id)
        .bind(&cols.delay_ms)
        .bind(&cols.follow_ms)
        .bind(&cols.trigger_key)
        .bind(&cols.revision)
        .bind(&cols.from_status)
        .bind(&cols.inv)
        .bind(&cols.owner_epoch)
        .bind(epoch)
        .fetch_all(pool)
        .await?
        .into_iter()
        .collect()
    };
    Ok(batch
        .iter()
        .map(|(from, t, _)| **t == Transition::Stay || won.contains(from.trigger_key))
        .collect())
}

/// The transitions of a batch, column by column, for `unnest`.
#[derive(Default)]
struct Columns<'a> {
    status: Vec<&'static str>,
    reason: Vec<Option<String>>,
    external_id: Vec<Option<String>>,
    delay_ms: Vec<i64>,
    follow_ms: Vec<i64>,
    trigger_key: Vec<&'a str>,
    revision: Vec<i64>,
    from_status: Vec<&'static str>,
    inv: Vec<&'a str>,
    owner_epoch: Vec<i64>,
}

/// Deadline sweep: RUNNING past its deadline → UNKNOWN, one row at a time under
/// the same revision guard a result uses (a late result and the sweep never both win).
pub async fn sweep_deadlines(pool: &PgPool) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar(
        r#"
UPDATE jobs SET status = 'UNKNOWN', revision = revision + 1,
       reason = 'deadline passed without a trusted result', next_attempt_at = now(), updated_at = now()
WHERE status = 'RUNNING' AND deadline_at < now()
RETURNING trigger_key"#,
    )
    .fetch_all(pool)
    .await
}

/// RUNNING jobs whose sender is gone for certain: claimed by an earlier epoch of
/// `instance`, which this start (`epoch`) replaces. They go to UNKNOWN at once,
/// to be reconciled by asking the target (a command's run directory, Airflow's
/// dag run), instead of waiting out a deadline that a long table service makes
/// long. Never resent: the reconcile follows a run still going.
pub async fn release_predecessors(
    pool: &PgPool,
    instance: &str,
    epoch: i64,
) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar(
        r#"
UPDATE jobs SET status = 'UNKNOWN', revision = revision + 1,
       reason = 'its dispatcher restarted before an outcome was recorded', next_attempt_at = now(),
       lease_owner = NULL, lease_until = NULL, updated_at = now()
WHERE status = 'RUNNING'
  AND epoch IN (SELECT epoch FROM dispatcher_epochs WHERE instance = $1 AND epoch < $2)
RETURNING trigger_key"#,
    )
    .bind(instance)
    .bind(epoch)
    .fetch_all(pool)
    .await
}

/// Takes up to `limit` jobs in `status` that are due for a look (a RUNNING job
/// being followed, an UNKNOWN job to reconcile) and not leased by a live peer:
/// bumps their revision (fencing any previous holder) and leases them to `epoch`.
pub async fn lease_due(
    pool: &PgPool,
    status: Status,
    limit: i64,
    epoch: i64,
    lease: Duration,
    next_look: Duration,
) -> sqlx::Result<Vec<Claimed>> {
    let sql = concat!(
        r#"
WITH due AS (
    SELECT trigger_key FROM jobs
    WHERE status = $1 AND next_attempt_at <= now()
      AND (status <> 'RUNNING' OR external_id IS NOT NULL)
      AND (lease_until IS NULL OR lease_until < now() OR epoch = $3)
    ORDER BY next_attempt_at LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs j SET revision = j.revision + 1, epoch = $3,
       lease_until = now() + $4 * interval '1 millisecond',
       next_attempt_at = now() + $5 * interval '1 millisecond'
FROM due, trigger_history h
WHERE j.trigger_key = due.trigger_key AND h.trigger_key = j.trigger_key
RETURNING "#,
        claimed_columns!()
    );
    let rows = sqlx::query(sql)
        .bind(status.as_str())
        .bind(limit)
        .bind(epoch)
        .bind(millis(lease))
        .bind(millis(next_look))
        .fetch_all(pool)
        .await?;
    rows.iter().map(claimed).collect()
}

/// A PENDING job whose target is not configured waits (it is kept, not failed):
/// a configuration fix picks it up.
pub async fn postpone_unroutable(
    pool: &PgPool,
    kind: &str,
    name: &str,
    wait: Duration,
) -> sqlx::Result<u64> {
    Ok(sqlx::query(
        r#"
UPDATE jobs SET next_attempt_at = now() + $3 * interval '1 millisecond',
       reason = 'no target configured for ' || $1 || '/' || $2
WHERE status = 'PENDING' AND target_kind = $1 AND target_name = $2 AND next_attempt_at <= now()"#,
    )
    .bind(kind)
    .bind(name)
    .bind(millis(wait))
    .execute(pool)
    .await?
    .rows_affected())
}

/// Makes jobs postponed for want of a target due now (a target was declared).
pub async fn wake_unroutable(pool: &PgPool) -> sqlx::Result<u64> {
    Ok(sqlx::query(
        r#"
UPDATE jobs SET next_attempt_at = now()
WHERE status = 'PENDING' AND next_attempt_at > now() AND reason LIKE 'no target configured for %'"#,
    )
    .execute(pool)
    .await?
    .rows_affected())
}

/// One transition from the outbox, for the runs topic.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct TransitionRow {
    pub id: i64,
    pub trigger_key: String,
    pub dependency_id: String,
    pub target_kind: String,
    pub target_name: String,
    pub status: String,
    pub revision: i64,
    pub attempt: i32,
    pub invocation_id: Option<String>,
    pub external_id: Option<String>,
    pub reason: Option<String>,
    pub at_ms: i64,
}

/// The oldest unpublished transitions, if this transaction is the one publisher
/// (one at a time across instances keeps each job's transitions in order on the
/// runs topic); empty when another instance is publishing.
pub async fn outbox_take(
    tx: &mut Transaction<'_, Postgres>,
    limit: i64,
) -> sqlx::Result<Vec<TransitionRow>> {
    let publisher: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(7, 1)")
        .fetch_one(&mut **tx)
        .await?;
    if !publisher {
        return Ok(Vec::new());
    }
    sqlx::query_as(
        r#"
SELECT id, trigger_key, dependency_id, target_kind, target_name, status, revision, attempt,
       invocation_id, external_id, reason, (extract(epoch FROM at) * 1000)::bigint AS at_ms
FROM job_transitions ORDER BY id LIMIT $1"#,
    )
    .bind(limit)
    .fetch_all(&mut **tx)
    .await
}

pub async fn outbox_done(tx: &mut Transaction<'_, Postgres>, ids: &[i64]) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM job_transitions WHERE id = ANY($1)")
        .bind(ids)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
