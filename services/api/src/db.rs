//! Reads of the dispatcher's tables (trigger history, jobs, run transitions) and
//! the audit log. PostgreSQL shapes each answer as JSON (`json_agg`), so a row
//! reaches the client with the column names the OpenAPI document gives.

use serde_json::Value;
use sqlx::PgPool;

fn parse(text: Option<String>) -> Result<Value, sqlx::Error> {
    match text {
        None => Ok(Value::Null),
        Some(t) => serde_json::from_str(&t).map_err(|e| sqlx::Error::Decode(Box::new(e))),
    }
}

/// One trigger as the run list shows it: the history row with its job (a macro
/// so every query stays a `'static` string).
macro_rules! run_columns {
    () => {
        "t.trigger_key, t.dependency_id, t.dependency_version, \
     t.target_kind, t.target_name, t.reason, t.partition_value AS partition, t.window_end_ms, \
     t.inputs, (extract(epoch FROM t.first_commit_at) * 1000)::bigint AS first_commit_ms, \
     (extract(epoch FROM t.requested_at) * 1000)::bigint AS requested_ms, \
     (extract(epoch FROM t.recorded_at) * 1000)::bigint AS recorded_ms, \
     t.origin, t.requested_by, t.request_id, t.rerun_of, \
     j.status, j.attempt, j.revision, j.invocation_id, j.external_id, j.reason AS status_reason, \
     (extract(epoch FROM j.updated_at) * 1000)::bigint AS updated_ms"
    };
}

/// Trigger history of one dependency, newest first; `before` is the cursor (the
/// `recorded_ms` and key of the last row of the previous page).
pub async fn triggers(
    pool: &PgPool,
    dependency: &str,
    before: Option<(i64, String)>,
    limit: i64,
) -> Result<Value, sqlx::Error> {
    let sql = concat!(
        "SELECT json_agg(x)::text FROM (SELECT ",
        run_columns!(),
        " FROM trigger_history t \
         LEFT JOIN jobs j USING (trigger_key) WHERE t.dependency_id = $1 \
         AND ($2::bigint IS NULL OR (t.recorded_at, t.trigger_key) < (to_timestamp($2::bigint / 1000.0), $3)) \
         ORDER BY t.recorded_at DESC, t.trigger_key DESC LIMIT $4) x"
    );
    let (ms, key) = before.unzip();
    let text: Option<String> = sqlx::query_scalar(sql)
        .bind(dependency)
        .bind(ms)
        .bind(key.unwrap_or_default())
        .bind(limit)
        .fetch_one(pool)
        .await?;
    Ok(parse(text)?.as_array().cloned().unwrap_or_default().into())
}

/// Filters of the run list.
#[derive(Debug, Default)]
pub struct RunFilter {
    pub status: Option<String>,
    pub dependency: Option<String>,
    pub target: Option<String>,
    /// Only this backfill's runs.
    pub backfill: Option<String>,
    /// Only these dependencies (the caller's projects); none: all.
    pub visible: Option<Vec<String>>,
}

/// Runs, UNKNOWN first (they wait for a person), then newest first.
pub async fn runs(
    pool: &PgPool,
    f: &RunFilter,
    offset: i64,
    limit: i64,
) -> Result<Value, sqlx::Error> {
    let sql = concat!(
        "SELECT json_agg(x)::text FROM (SELECT ",
        run_columns!(),
        " FROM jobs j \
         JOIN trigger_history t USING (trigger_key) \
         WHERE ($1::text IS NULL OR j.status = $1) AND ($2::text IS NULL OR t.dependency_id = $2) \
         AND ($3::text IS NULL OR t.target_name = $3) AND ($4::text[] IS NULL OR t.dependency_id = ANY($4)) \
         AND ($7::text IS NULL OR j.backfill_id = $7) \
         ORDER BY (j.status = 'UNKNOWN') DESC, j.updated_at DESC, j.trigger_key \
         OFFSET $5 LIMIT $6) x"
    );
    let text: Option<String> = sqlx::query_scalar(sql)
        .bind(&f.status)
        .bind(&f.dependency)
        .bind(&f.target)
        .bind(&f.visible)
        .bind(offset)
        .bind(limit)
        .bind(&f.backfill)
        .fetch_one(pool)
        .await?;
    Ok(parse(text)?.as_array().cloned().unwrap_or_default().into())
}

/// One run by trigger key with every transition it went through (attempts and
/// invocations included), oldest first; none if the key is unknown.
pub async fn run(pool: &PgPool, trigger_key: &str) -> Result<Option<Value>, sqlx::Error> {
    let sql = concat!(
        "SELECT row_to_json(x)::text FROM (SELECT ",
        run_columns!(),
        " , t.target_parameters, \
         t.source_partition, t.source_offset, \
         (SELECT coalesce(json_agg(r ORDER BY r.id), '[]'::json) FROM (SELECT id, status, revision, \
           attempt, invocation_id, external_id, reason, (extract(epoch FROM at) * 1000)::bigint AS at_ms \
           FROM run_transitions WHERE trigger_key = t.trigger_key) r) AS transitions \
         FROM trigger_history t LEFT JOIN jobs j USING (trigger_key) WHERE t.trigger_key = $1) x"
    );
    let text: Option<String> = sqlx::query_scalar(sql)
        .bind(trigger_key)
        .fetch_optional(pool)
        .await?
        .flatten();
    text.map(|t| parse(Some(t))).transpose()
}

/// The newest trigger of each of `dependencies`, for the dependency list.
pub async fn last_runs(pool: &PgPool, dependencies: &[String]) -> Result<Value, sqlx::Error> {
    let sql = concat!(
        "SELECT json_object_agg(x.dependency_id, row_to_json(x))::text FROM (SELECT DISTINCT ON \
         (t.dependency_id) ",
        run_columns!(),
        " FROM trigger_history t LEFT JOIN jobs j USING (trigger_key) \
         WHERE t.dependency_id = ANY($1) ORDER BY t.dependency_id, t.recorded_at DESC) x"
    );
    let text: Option<String> = sqlx::query_scalar(sql)
        .bind(dependencies)
        .fetch_one(pool)
        .await?;
    Ok(match parse(text)? {
        Value::Null => Value::Object(Default::default()),
        v => v,
    })
}

/// One change made through the API.
pub struct Audit<'a> {
    pub principal: &'a str,
    pub action: &'a str,
    pub resource: &'a str,
    pub project: &'a str,
    pub before: Option<Value>,
    pub after: Option<Value>,
}

pub async fn audit(pool: &PgPool, a: Audit<'_>) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO api_audit (principal, action, resource, project, before, after) \
         VALUES ($1, $2, $3, $4, $5::text::jsonb, $6::text::jsonb)",
    )
    .bind(a.principal)
    .bind(a.action)
    .bind(a.resource)
    .bind(a.project)
    .bind(a.before.map(|v| v.to_string()))
    .bind(a.after.map(|v| v.to_string()))
    .execute(pool)
    .await?;
    Ok(())
}

/// The audit log, newest first; `before_id` is the cursor.
pub async fn audit_log(
    pool: &PgPool,
    before_id: Option<i64>,
    limit: i64,
) -> Result<Value, sqlx::Error> {
    let text: Option<String> = sqlx::query_scalar(
        "SELECT json_agg(x)::text FROM (SELECT id, (extract(epoch FROM at) * 1000)::bigint AS at_ms, \
         principal, action, resource, project, before, after FROM api_audit \
         WHERE ($1::bigint IS NULL OR id < $1) ORDER BY id DESC LIMIT $2) x",
    )
    .bind(before_id)
    .bind(limit)
    .fetch_one(pool)
    .await?;
    Ok(parse(text)?.as_array().cloned().unwrap_or_default().into())
}

/// A backfill as submitted, before its triggers are published.
pub struct NewBackfill<'a> {
    pub backfill_id: &'a str,
    pub dependency_id: &'a str,
    pub project: &'a str,
    pub target_kind: &'a str,
    pub target_name: &'a str,
    pub request: &'a Value,
    pub items_total: i32,
    pub max_in_flight: Option<i32>,
    pub per_minute: Option<i32>,
    pub requested_by: &'a str,
    pub reason: Option<&'a str>,
}

/// Records a backfill once; returns false if its id was recorded before (a
/// resubmit), leaving the first record as it was.
pub async fn insert_backfill(pool: &PgPool, b: &NewBackfill<'_>) -> Result<bool, sqlx::Error> {
    let inserted: Option<String> = sqlx::query_scalar(
        "INSERT INTO backfills (backfill_id, dependency_id, project, target_kind, target_name, \
         request, items_total, max_in_flight, per_minute, requested_by, reason) \
         VALUES ($1, $2, $3, $4, $5, $6::text::jsonb, $7, $8, $9, $10, $11) \
         ON CONFLICT (backfill_id) DO NOTHING RETURNING backfill_id",
    )
    .bind(b.backfill_id)
    .bind(b.dependency_id)
    .bind(b.project)
    .bind(b.target_kind)
    .bind(b.target_name)
    .bind(b.request.to_string())
    .bind(b.items_total)
    .bind(b.max_in_flight)
    .bind(b.per_minute)
    .bind(b.requested_by)
    .bind(b.reason)
    .fetch_optional(pool)
    .await?;
    Ok(inserted.is_some())
}

/// A backfill with its progress: its jobs counted by status (`recorded` is how
/// many of its items the dispatcher has taken from the triggers topic so far).
macro_rules! backfill_columns {
    () => {
        "b.backfill_id, b.dependency_id, b.project, b.target_kind, b.target_name, b.request, \
         b.items_total, b.max_in_flight, b.per_minute, b.requested_by, b.reason, \
         (extract(epoch FROM b.created_at) * 1000)::bigint AS created_ms, \
         (extract(epoch FROM b.cancelled_at) * 1000)::bigint AS cancelled_ms, b.cancelled_by, \
         (SELECT json_build_object( \
            'recorded', count(*), \
            'pending', count(*) FILTER (WHERE j.status = 'PENDING'), \
            'running', count(*) FILTER (WHERE j.status IN ('RUNNING', 'UNKNOWN')), \
            'succeeded', count(*) FILTER (WHERE j.status = 'SUCCEEDED'), \
            'failed', count(*) FILTER (WHERE j.status = 'FAILED'), \
            'cancelled', count(*) FILTER (WHERE j.status = 'CANCELLED')) \
          FROM jobs j WHERE j.backfill_id = b.backfill_id) AS jobs"
    };
}

pub async fn backfill(pool: &PgPool, id: &str) -> Result<Option<Value>, sqlx::Error> {
    let sql = concat!(
        "SELECT row_to_json(x)::text FROM (SELECT ",
        backfill_columns!(),
        " FROM backfills b WHERE b.backfill_id = $1) x"
    );
    let text: Option<String> = sqlx::query_scalar(sql)
        .bind(id)
        .fetch_optional(pool)
        .await?;
    text.map(|t| parse(Some(t)).map(progress)).transpose()
}

/// Backfills newest first, of one dependency or of those visible (none: all).
pub async fn backfills(
    pool: &PgPool,
    dependency: Option<&str>,
    visible: Option<&[String]>,
    offset: i64,
    limit: i64,
) -> Result<Vec<Value>, sqlx::Error> {
    let sql = concat!(
        "SELECT json_agg(x)::text FROM (SELECT ",
        backfill_columns!(),
        " FROM backfills b WHERE ($1::text IS NULL OR b.dependency_id = $1) \
         AND ($2::text[] IS NULL OR b.dependency_id = ANY($2)) \
         ORDER BY b.created_at DESC, b.backfill_id OFFSET $3 LIMIT $4) x"
    );
    let text: Option<String> = sqlx::query_scalar(sql)
        .bind(dependency)
        .bind(visible)
        .bind(offset)
        .bind(limit)
        .fetch_one(pool)
        .await?;
    Ok(parse(text)?
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(progress)
        .collect())
}

/// Marks a backfill cancelled (the dispatcher then cancels its PENDING jobs);
/// false if it already was.
pub async fn cancel_backfill(pool: &PgPool, id: &str, by: &str) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE backfills SET cancelled_at = now(), cancelled_by = $2 \
         WHERE backfill_id = $1 AND cancelled_at IS NULL",
    )
    .bind(id)
    .bind(by)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// Adds the progress a person reads: items not yet recorded count as pending;
/// the state is `cancelled` (its jobs under way may still finish), `done` (every
/// item ended, failed ones included), or `running`.
fn progress(mut b: Value) -> Value {
    let n = |v: &Value, k: &str| v["jobs"][k].as_i64().unwrap_or(0);
    let total = b["items_total"].as_i64().unwrap_or(0);
    let pending = n(&b, "pending") + (total - n(&b, "recorded")).max(0);
    let ended = n(&b, "succeeded") + n(&b, "failed") + n(&b, "cancelled");
    let state = if !b["cancelled_ms"].is_null() {
        "cancelled"
    } else if ended >= total {
        "done"
    } else {
        "running"
    };
    b["progress"] = serde_json::json!({
        "total": total,
        "pending": pending,
        "running": n(&b, "running"),
        "succeeded": n(&b, "succeeded"),
        "failed": n(&b, "failed"),
        "cancelled": n(&b, "cancelled"),
    });
    b["state"] = state.into();
    if let Some(o) = b.as_object_mut() {
        o.remove("jobs");
    }
    b
}

/// Notification deliveries, newest first: each with its event (`rules`: only
/// these rules' ones; `None`, all).
pub async fn deliveries(
    pool: &PgPool,
    status: Option<&str>,
    rules: Option<&[String]>,
    offset: i64,
    limit: i64,
) -> Result<Value, sqlx::Error> {
    let text: Option<String> = sqlx::query_scalar(
        "SELECT json_agg(x)::text FROM (
             SELECT d.delivery_key, d.rule, d.status, d.attempts, d.last_error,
                    (extract(epoch FROM d.created_at) * 1000)::bigint AS created_ms,
                    (extract(epoch FROM d.next_attempt_at) * 1000)::bigint AS next_attempt_ms,
                    (extract(epoch FROM d.finished_at) * 1000)::bigint AS finished_ms,
                    e.event_key, e.kind AS event, e.dependency_id, e.asset_key AS asset,
                    e.trigger_key, e.backfill_id, e.detail
             FROM notification_deliveries d JOIN notification_events e USING (event_key)
             WHERE ($1::text IS NULL OR d.status = $1)
               AND ($2::text[] IS NULL OR d.rule = ANY($2))
             ORDER BY d.created_at DESC, d.delivery_key LIMIT $4 OFFSET $3) x",
    )
    .bind(status)
    .bind(rules)
    .bind(offset)
    .bind(limit)
    .fetch_one(pool)
    .await?;
    Ok(parse(text)?.as_array().cloned().unwrap_or_default().into())
}

/// Sends a DEAD delivery again from its first attempt; false when it is not DEAD.
pub async fn retry_delivery(pool: &PgPool, key: &str) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE notification_deliveries
         SET status = 'PENDING', attempts = 0, next_attempt_at = clock_timestamp(), finished_at = NULL
         WHERE delivery_key = $1 AND status = 'DEAD'",
    )
    .bind(key)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The rule a delivery belongs to.
pub async fn delivery_rule(pool: &PgPool, key: &str) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT rule FROM notification_deliveries WHERE delivery_key = $1")
        .bind(key)
        .fetch_optional(pool)
        .await
}
