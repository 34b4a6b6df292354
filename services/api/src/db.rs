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
