//! The dispatcher service. Today it starts, applies its PostgreSQL migrations,
//! takes an instance epoch, checks its topics and serves its admin port; the
//! trigger intake and job lifecycle land with the dispatcher issue (#7).

use std::time::Duration;

use sluice_kit::config::{Common, ConfigErrors, Env, Secret};
use sluice_kit::service::{self, StartError};
use sluice_kit::{Shutdown, Topic};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

pub const SERVICE: &str = "dispatcher";

pub const TOPICS: &[Topic] = &[Topic::Triggers, Topic::Runs, Topic::DeadLetter];

/// The schema migrations, applied at start (embedded at build time).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

#[derive(Clone, Debug)]
pub struct Options {
    pub common: Common,
    /// `postgres://user[:password]@host:port/db`; may hold a password, so it is a secret.
    pub database_url: Secret,
    pub max_connections: u32,
}

impl Options {
    pub fn from_env() -> Result<Self, ConfigErrors> {
        Self::read(Env::from_process())
    }

    pub fn read(mut env: Env) -> Result<Self, ConfigErrors> {
        let common = Common::read(&mut env, SERVICE, "127.0.0.1:9104");
        let database_url = env.secret("SLUICE_DATABASE_URL").unwrap_or_else(|| {
            env.problem("SLUICE_DATABASE_URL is required (postgres://user@host:port/db)");
            Secret::new("")
        });
        let url = database_url.expose();
        let scheme_ok = url.starts_with("postgres://") || url.starts_with("postgresql://");
        if !url.is_empty() && (!scheme_ok || url.parse::<PgConnectOptions>().is_err()) {
            // Do not echo the URL: it may contain a password.
            env.problem("SLUICE_DATABASE_URL is not a valid postgres:// URL");
        }
        let max_connections = env.parse("SLUICE_DATABASE_MAX_CONNECTIONS", 8u32);
        env.finish(Options {
            common,
            database_url,
            max_connections,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

/// Connects (retrying while PostgreSQL is not up yet) and applies the migrations.
pub async fn connect(options: &Options, shutdown: &Shutdown) -> Result<PgPool, Error> {
    let connect = options
        .database_url
        .expose()
        .parse::<PgConnectOptions>()?
        .log_statements(tracing::log::LevelFilter::Trace);
    let mut delay = Duration::from_millis(200);
    let pool = loop {
        match PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(connect.clone())
            .await
        {
            Ok(pool) => break pool,
            Err(e) if !shutdown.is_stopping() => {
                tracing::warn!(error = %e, retry_ms = delay.as_millis() as u64, "postgresql not reachable; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
            }
            Err(e) => return Err(e.into()),
        }
    };
    MIGRATOR.run(&pool).await?;
    Ok(pool)
}

/// Registers this instance and returns its epoch: every lease it takes names it.
pub async fn take_epoch(pool: &PgPool, instance: &str) -> Result<i64, Error> {
    let epoch: i64 =
        sqlx::query_scalar("INSERT INTO dispatcher_epochs (instance) VALUES ($1) RETURNING epoch")
            .bind(instance)
            .fetch_one(pool)
            .await?;
    Ok(epoch)
}

pub async fn run(options: Options, shutdown: Shutdown) -> Result<(), Error> {
    let pool = connect(&options, &shutdown).await?;
    let epoch = take_epoch(&pool, &options.common.instance).await?;
    tracing::info!(epoch, "migrations applied; instance epoch taken");
    let started = service::start(&options.common, TOPICS, &shutdown).await?;
    started.hold_until_stopped(SERVICE, shutdown).await;
    pool.close().await;
    Ok(())
}
