//! The dispatcher service: triggers topic → `trigger_history` (the unique
//! trigger_key makes a trigger's effect happen once), then every job through the
//! durable lifecycle of `lifecycle` against the targets of `targets`, with every
//! transition published to the runs topic.
//!
//! Three loops share one PostgreSQL pool: `intake` (consumer group on triggers),
//! `dispatch` (sweep, claim, send, follow, reconcile) and `publish` (outbox → runs).

pub mod adapters;
pub mod command;
pub mod dispatch;
pub mod group;
pub mod intake;
pub mod lifecycle;
pub mod metrics;
pub mod operator;
pub mod publish;
pub mod store;
pub mod targets;

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::producer::FutureProducer;
use sluice_kit::backoff::Backoff;
use sluice_kit::declared::SharedDeclared;
use sluice_kit::{BlockingCodec, Codec};

use sluice_kit::config::{Common, ConfigErrors, Env, Secret};
use sluice_kit::service::{self, StartError, Supervisor, TaskError};
use sluice_kit::{Shutdown, Topic};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

pub const SERVICE: &str = "dispatcher";

/// The allocator a process running the dispatcher declares (`#[global_allocator]`).
/// Each job allocates its document, its request and its statements' columns and
/// frees them a few milliseconds later, on whichever thread: with glibc's malloc,
/// allocating and freeing (arena locks, consolidation) took ~30 % of
/// bench-dispatcher's CPU samples at 2,000 jobs in flight. The services that hold
/// tables keep the system's allocator: with mimalloc the state-updater held 145
/// bytes per asset (132) and the resolver's global table 210 (132).
pub type Allocator = mimalloc::MiMalloc;

/// What it reads and writes on the broker (bootstrap and ACLs).
pub const ACCESS: &sluice_kit::access::Access = &sluice_kit::access::DISPATCHER;

/// The schema migrations, applied at start (embedded at build time).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

#[derive(Clone, Debug)]
pub struct Options {
    pub common: Common,
    /// `postgres://user[:password]@host:port/db`; may hold a password, so it is a secret.
    pub database_url: Secret,
    pub max_connections: u32,
    /// The bootstrap targets (`SLUICE_TARGETS`); declared ones come from the topic.
    pub targets: targets::Targets,
    /// Pause between dispatch rounds.
    pub round: Duration,
    /// How often a followed run or an UNKNOWN job is looked at.
    pub look_every: Duration,
    pub batch_max: usize,
    pub batch_wait: Duration,
    pub fault: dispatch::Fault,
    /// Roots trusted for https targets besides the system's (`SLUICE_TLS_CA_FILE`).
    pub extra_roots: Vec<reqwest::Certificate>,
    /// Where command targets run (`SLUICE_COMMAND_DIR`): must outlive the process.
    pub command_dir: std::path::PathBuf,
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
        let targets_json = env
            .value_or_file("SLUICE_TARGETS")
            .unwrap_or_else(|| "[]".to_owned());
        let targets = targets::Targets::parse(&targets_json).unwrap_or_else(|problems| {
            for p in problems {
                env.problem(p);
            }
            targets::Targets::default()
        });
        let round = env.millis("SLUICE_DISPATCH_ROUND_MS", Duration::from_millis(100));
        let look_every = env.millis("SLUICE_DISPATCH_LOOK_MS", Duration::from_millis(1_000));
        let batch_max = env.parse("SLUICE_INTAKE_BATCH_MAX", 500usize);
        let batch_wait = env.millis("SLUICE_INTAKE_BATCH_WAIT_MS", Duration::from_millis(20));
        let fault = match env.optional("SLUICE_DISPATCHER_FAULT").as_deref() {
            None | Some("") => dispatch::Fault::None,
            #[cfg(feature = "fault-injection")]
            Some("abort_after_mark_running") => dispatch::Fault::AbortAfterMarkRunning,
            #[cfg(not(feature = "fault-injection"))]
            Some(_) => {
                env.problem(
                    "SLUICE_DISPATCHER_FAULT is for tests: this build has no fault injection \
                     (the dispatcher's fault-injection feature)",
                );
                dispatch::Fault::None
            }
            #[cfg(feature = "fault-injection")]
            Some(other) => {
                env.problem(format!(
                    "SLUICE_DISPATCHER_FAULT {other:?}: the only fault is abort_after_mark_running (tests)"
                ));
                dispatch::Fault::None
            }
        };
        if batch_max == 0 {
            env.problem("SLUICE_INTAKE_BATCH_MAX must be at least 1");
        }
        let extra_roots = match env.optional("SLUICE_TLS_CA_FILE") {
            None => Vec::new(),
            Some(path) => match std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|pem| {
                    reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| e.to_string())
                }) {
                Ok(certs) if !certs.is_empty() => certs,
                Ok(_) => {
                    env.problem(format!(
                        "SLUICE_TLS_CA_FILE {path}: no PEM certificate in it"
                    ));
                    Vec::new()
                }
                Err(e) => {
                    env.problem(format!("SLUICE_TLS_CA_FILE {path}: {e}"));
                    Vec::new()
                }
            },
        };
        let command_dir = env
            .optional("SLUICE_COMMAND_DIR")
            .map_or_else(|| std::env::temp_dir().join("sluice-commands"), Into::into);
        env.finish(Options {
            command_dir,
            common,
            database_url,
            max_connections,
            targets,
            round,
            look_every,
            batch_max,
            batch_wait,
            fault,
            extra_roots,
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
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error(transparent)]
    Loop(#[from] TaskError),
    #[error("http client: {0}")]
    Http(#[from] reqwest::Error),
    #[error("targets topic: {0}")]
    Targets(String),
    #[error(transparent)]
    Codec(#[from] sluice_kit::CodecError),
}

/// Connects (retrying while PostgreSQL is not up yet) and applies the migrations.
pub async fn connect(options: &Options, shutdown: &Shutdown) -> Result<PgPool, Error> {
    let connect = options
        .database_url
        .expose()
        .parse::<PgConnectOptions>()?
        .log_statements(tracing::log::LevelFilter::Trace);
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    let pool = loop {
        match PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(connect.clone())
            .await
        {
            Ok(pool) => break pool,
            Err(e) if !shutdown.is_stopping() => {
                let wait = backoff.next_wait();
                tracing::warn!(error = %e, retry_ms = wait.as_millis() as u64, "postgresql not reachable; retrying");
                tokio::time::sleep(wait).await;
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
    metrics::describe();
    let pool = connect(&options, &shutdown).await?;
    let epoch = take_epoch(&pool, &options.common.instance).await?;
    let released = store::release_predecessors(&pool, &options.common.instance, epoch).await?;
    if !released.is_empty() {
        tracing::warn!(
            jobs = released.len(),
            "RUNNING jobs of this instance's previous start → UNKNOWN, to be reconciled"
        );
    }
    tracing::info!(
        epoch,
        bootstrap_targets = options.targets.all().count(),
        "migrations applied; instance epoch taken"
    );
    let started = service::start(
        &options.common,
        service::KafkaNeeds::of(ACCESS).group(format!("{}{SERVICE}", options.common.topics.prefix)),
        &shutdown,
    )
    .await?;
    let c = &options.common;
    let client_id = format!("sluice-{SERVICE}-{}", c.instance);
    // Declared targets: read to the end before the first round, so a job is never
    // found unroutable for a target the topic holds.
    let declared = SharedDeclared::new();
    let follower = declared.spawn_follower(
        c.kafka.reader_config(&format!("{client_id}-targets")),
        c.topics.name(Topic::Targets),
        BlockingCodec::new(c.schema_registry_url.as_deref())?,
        shutdown.flag(),
        c.kafka.request_timeout,
    );
    while !declared.caught_up() {
        if let Some(e) = declared.failure() {
            return Err(Error::Targets(e));
        }
        if shutdown.is_stopping() {
            return Ok(());
        }
        started.health.beat();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let targets = Arc::new(targets::LiveTargets::new(options.targets.clone(), declared));
    targets.refresh();
    let producer: FutureProducer = c.kafka.producer_config(&client_id).create()?;
    let new_consumer: intake::ConsumerFactory = {
        let config = c
            .kafka
            .consumer_config(&client_id, &format!("{}{SERVICE}", c.topics.prefix));
        let topic = c.topics.name(Topic::Triggers);
        Box::new(move || {
            let consumer: StreamConsumer = config.create()?;
            consumer.subscribe(&[&topic])?;
            Ok(consumer)
        })
    };
    let consumer = new_consumer()?;
    let codec = Codec::new(c.schema_registry_url.as_deref());
    let wake = Arc::new(tokio::sync::Notify::new());
    let intake = intake::Intake {
        wake: wake.clone(),
        consumer,
        new_consumer,
        producer: producer.clone(),
        codec,
        pool: pool.clone(),
        dead_letter: c.topics.name(Topic::DeadLetter),
        batch_max: options.batch_max,
        batch_wait: options.batch_wait,
    };
    let dispatcher = Arc::new(dispatch::Dispatcher {
        pool: pool.clone(),
        targets: targets.clone(),
        adapters: adapters::Adapters::new(
            Some(producer.clone()),
            &options.extra_roots,
            command::Runs {
                root: options.command_dir.clone(),
                instance: c.instance.clone(),
            },
        )?,
        epoch,
        instance: c.instance.clone(),
        round: options.round,
        wake,
        look_every: options.look_every,
        fault: options.fault,
        outcomes: Default::default(),
        checks: Default::default(),
    });
    let publisher = publish::Publisher {
        pool: pool.clone(),
        producer,
        codec: Codec::new(c.schema_registry_url.as_deref()),
        topic: c.topics.name(Topic::Runs),
        every: Duration::from_millis(100),
    };
    started.health.set_ready(true);
    tracing::info!(service = SERVICE, admin = %started.admin_addr, "ready");
    // The loops end only together: one that ended on its own (an error, a panic)
    // stops the others, so the process exits instead of living on half-dead.
    let mut supervisor = Supervisor::new(&shutdown);
    supervisor.heartbeat(&started.health);
    supervisor.spawn("intake", intake.run(shutdown.clone()));
    supervisor.spawn("dispatch", dispatcher.clone().run(shutdown.clone()));
    supervisor.spawn("new-job listener", dispatcher.listen(shutdown.clone()));
    supervisor.spawn("run publisher", publisher.run(shutdown.clone()));
    // The follower's thread ends only on shutdown or on a failure, which ends the
    // service: a dispatcher blind to target changes must not live on.
    supervisor.spawn_blocking("targets follower", move || {
        let _ = follower.join();
        match targets.declared().failure() {
            Some(e) => Err(format!("targets topic: {e}")),
            None => Ok(()),
        }
    });
    let outcome = supervisor.run(started).await.map_err(Error::from);
    pool.close().await;
    outcome
}
