//! What an operator does about a job the dispatcher could not settle: an UNKNOWN
//! job (the outcome of its last send cannot be told and the target cannot be asked)
//! is listed, and settled by a person who checked the target — as succeeded, as
//! failed, or sent again. Same compare-and-set as every other transition, so a
//! reconcile that settles the job meanwhile wins and the operator is told.
//!
//! Operators use `sluice settle` (the API's `POST /v1/runs/{key}/settle`, which
//! calls [`settle`] with the caller's role checked and the change audited); the
//! binary's own commands are the break-glass path when the API is down:
//!
//!   sluice-dispatcher unknown
//!   sluice-dispatcher settle <trigger_key> succeeded|failed|retry "<why>"

use sqlx::PgPool;

use crate::lifecycle::Status;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    /// The operator saw the run succeed.
    Succeeded,
    /// The operator saw it fail (or decided it must not run).
    Failed,
    /// The operator checked that nothing ran: send it again (a new invocation).
    Retry,
}

impl Settle {
    pub fn parse(s: &str) -> Option<Settle> {
        match s {
            "succeeded" => Some(Settle::Succeeded),
            "failed" => Some(Settle::Failed),
            "retry" => Some(Settle::Retry),
            _ => None,
        }
    }

    fn status(self) -> Status {
        match self {
            Settle::Succeeded => Status::Succeeded,
            Settle::Failed => Status::Failed,
            Settle::Retry => Status::Pending,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SettleError {
    #[error("no job has trigger_key {0}")]
    NotFound(String),
    #[error("job {key} is {status}, not UNKNOWN: only an UNKNOWN job is settled by hand")]
    NotUnknown { key: String, status: String },
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

/// Settles one UNKNOWN job; returns its new revision.
///
/// One statement guarded by the status alone: the operator states what became of an
/// UNKNOWN job, whoever holds its reconcile lease. The revision bump fences that
/// holder: its late result names the old revision and is refused.
pub async fn settle(
    pool: &PgPool,
    trigger_key: &str,
    how: Settle,
    why: &str,
) -> Result<i64, SettleError> {
    let settled: Option<i64> = sqlx::query_scalar(
        r#"
UPDATE jobs SET status = $1, revision = revision + 1, reason = $2, next_attempt_at = now(),
       lease_owner = NULL, lease_until = NULL, updated_at = now()
WHERE trigger_key = $3 AND status = 'UNKNOWN'
RETURNING revision"#,
    )
    .bind(how.status().as_str())
    .bind(format!("settled by an operator: {why}"))
    .bind(trigger_key)
    .fetch_optional(pool)
    .await?;
    if let Some(revision) = settled {
        return Ok(revision);
    }
    let status: Option<String> =
        sqlx::query_scalar("SELECT status FROM jobs WHERE trigger_key = $1")
            .bind(trigger_key)
            .fetch_optional(pool)
            .await?;
    Err(match status {
        None => SettleError::NotFound(trigger_key.to_owned()),
        Some(status) => SettleError::NotUnknown {
            key: trigger_key.to_owned(),
            status,
        },
    })
}

/// An UNKNOWN job as an operator sees it.
#[derive(Debug, sqlx::FromRow)]
pub struct UnknownJob {
    pub trigger_key: String,
    pub target_kind: String,
    pub target_name: String,
    pub attempt: i32,
    pub invocation_id: Option<String>,
    pub reason: Option<String>,
    /// When it became UNKNOWN (UTC, RFC 3339).
    pub since: String,
}

pub async fn unknown(pool: &PgPool, limit: i64) -> sqlx::Result<Vec<UnknownJob>> {
    sqlx::query_as(
        "SELECT trigger_key, target_kind, target_name, attempt, invocation_id, reason, \
         to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') AS since \
         FROM jobs WHERE status = 'UNKNOWN' ORDER BY updated_at LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// The operator commands of the binary; `None` when `args` is not one (run the service).
pub fn command(args: &[String]) -> Option<std::process::ExitCode> {
    use std::process::ExitCode;
    let usage = "usage: sluice-dispatcher unknown\n       sluice-dispatcher settle <trigger_key> succeeded|failed|retry \"<why>\"";
    let cmd = args.first()?.as_str();
    if !matches!(cmd, "unknown" | "settle" | "help" | "--help") {
        eprintln!("unknown command {cmd:?}\n{usage}");
        return Some(ExitCode::from(2));
    }
    if matches!(cmd, "help" | "--help") {
        println!("{usage}\n(no command: run the service)");
        return Some(ExitCode::SUCCESS);
    }
    let settle_args = match (cmd, args.len()) {
        ("settle", 4) => match Settle::parse(&args[2]) {
            Some(how) if !args[3].trim().is_empty() => {
                Some((args[1].clone(), how, args[3].clone()))
            }
            _ => {
                eprintln!(
                    "settle: the outcome is succeeded, failed or retry, and a reason is required\n{usage}"
                );
                return Some(ExitCode::from(2));
            }
        },
        ("settle", _) => {
            eprintln!("{usage}");
            return Some(ExitCode::from(2));
        }
        _ => None,
    };
    let Ok(url) = std::env::var("SLUICE_DATABASE_URL") else {
        eprintln!("SLUICE_DATABASE_URL is required (postgres://user@host:port/db)");
        return Some(ExitCode::from(2));
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    Some(runtime.block_on(async move {
        let pool = match PgPool::connect(&url).await {
            Ok(p) => p,
            Err(e) => {
                eprintln!("cannot connect to PostgreSQL: {e}");
                return ExitCode::FAILURE;
            }
        };
        match settle_args {
            Some((key, how, why)) => match settle(&pool, &key, how, &why).await {
                Ok(revision) => {
                    println!("{key}: settled as {how:?} (revision {revision})");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::FAILURE
                }
            },
            None => match unknown(&pool, 1_000).await {
                Ok(jobs) => {
                    for j in &jobs {
                        println!(
                            "{}\t{}/{}\tattempt {}\tinvocation {}\tsince {}\t{}",
                            j.trigger_key,
                            j.target_kind,
                            j.target_name,
                            j.attempt,
                            j.invocation_id.as_deref().unwrap_or("-"),
                            j.since,
                            j.reason.as_deref().unwrap_or("")
                        );
                    }
                    eprintln!("{} UNKNOWN job(s)", jobs.len());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("database: {e}");
                    ExitCode::FAILURE
                }
            },
        }
    }))
}
