//! `sluice-api`: the control plane. It holds no state of its own: it follows
//! asset-state, dependencies and resolver-progress whole ([`view`]), reads trigger
//! history, jobs and run transitions from PostgreSQL ([`db`]), and changes the
//! engine only by publishing declarations to their compacted topics. So any number
//! of instances serve the same answers.
//!
//! * [`auth`] — principals from hashed tokens, roles per project.
//! * [`jwt`] — principals from the identity provider's JWTs (JWKS).
//! * [`routes`] — the HTTP API (`services/api/openapi.json` documents it).
//! * [`commits`] — an asset's recent commits, read from the evidence log.
//! * [`notify`] — notification rules and their bodies; [`notifier`] finds the
//!   events, routes and delivers them (PostgreSQL claims make N instances one).

pub mod auth;
pub mod commits;
pub mod db;
pub mod jwt;
pub mod layout;
pub mod notifier;
pub mod notify;
pub mod routes;
pub mod view;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sluice_kit::config::{Common, ConfigErrors, Env, Secret};
use sluice_kit::grants::{GrantsMode, SharedGrants};
use sluice_kit::service::{self, StartError};
use sluice_kit::{BlockingCodec, Codec, Shutdown, Topic};
use sqlx::postgres::PgPoolOptions;

pub const SERVICE: &str = "api";

/// What it reads and writes on the broker (bootstrap and ACLs).
pub const ACCESS: &sluice_kit::access::Access = &sluice_kit::access::API;

#[derive(Clone, Debug)]
pub struct Options {
    pub common: Common,
    pub listen: SocketAddr,
    /// PostgreSQL with a role that may read trigger_history, jobs and
    /// run_transitions and insert into api_audit.
    pub database_url: Secret,
    pub tokens_file: Option<PathBuf>,
    /// The identity provider's keys (a file or a URL) and the rules its JWTs meet.
    pub jwt: Option<(jwt::Source, jwt::Rules)>,
    /// Most items one page may hold.
    pub max_page: usize,
    /// `SLUICE_GRANTS`: set it as the resolvers have it.
    pub grants: GrantsMode,
    /// `SLUICE_API_NOTIFY` (on by default): run the notifier in this instance.
    pub notify: bool,
    /// `SLUICE_API_NOTIFY_INTERVAL_MS`: how often the notifier looks for work.
    pub notify_interval: Duration,
    /// `SLUICE_API_NOTIFY_DEAD_LETTER_MAX_AGE_S`: older dead letters are not notified.
    pub dead_letter_max_age: Duration,
}

impl Options {
    pub fn from_env() -> Result<Self, ConfigErrors> {
        Self::read(Env::from_process())
    }

    pub fn read(mut env: Env) -> Result<Self, ConfigErrors> {
        let common = Common::read(&mut env, SERVICE, "127.0.0.1:9105");
        let listen = env.addr("SLUICE_API_ADDR", "0.0.0.0:8090");
        let database_url = env
            .secret("SLUICE_API_DATABASE_URL")
            .or_else(|| env.secret("SLUICE_DATABASE_URL"));
        if database_url.is_none() {
            env.problem("SLUICE_API_DATABASE_URL (or SLUICE_DATABASE_URL) is required");
        }
        let tokens_file = env.optional("SLUICE_API_TOKENS_FILE").map(PathBuf::from);
        let jwt = env.optional("SLUICE_API_JWKS").map(|raw| {
            let rules = jwt::Rules {
                issuer: env.required("SLUICE_API_JWT_ISSUER"),
                audience: env.required("SLUICE_API_JWT_AUDIENCE"),
                name_claim: env.string("SLUICE_API_JWT_NAME_CLAIM", "sub"),
                roles_claim: env.string("SLUICE_API_JWT_ROLES_CLAIM", "sluice_roles"),
            };
            (jwt::Source::parse(&raw), rules)
        });
        if tokens_file.is_none() && jwt.is_none() {
            env.problem(
                "set SLUICE_API_TOKENS_FILE, SLUICE_API_JWKS or both: without them nobody can call the API",
            );
        }
        let max_page = env.parse("SLUICE_API_MAX_PAGE", 1_000usize);
        let grants = env.parse("SLUICE_GRANTS", GrantsMode::Off);
        if max_page == 0 {
            env.problem("SLUICE_API_MAX_PAGE must be at least 1");
        }
        let notify = env.parse("SLUICE_API_NOTIFY", true);
        let notify_interval =
            Duration::from_millis(env.parse("SLUICE_API_NOTIFY_INTERVAL_MS", 1_000u64));
        if notify_interval.is_zero() {
            env.problem("SLUICE_API_NOTIFY_INTERVAL_MS must be at least 1");
        }
        let dead_letter_max_age =
            Duration::from_secs(env.parse("SLUICE_API_NOTIFY_DEAD_LETTER_MAX_AGE_S", 3_600u64));
        env.finish(Options {
            common,
            listen,
            database_url: database_url.unwrap_or_else(|| Secret::new("")),
            tokens_file,
            jwt,
            max_page,
            grants,
            notify,
            notify_interval,
            dead_letter_max_age,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Start(#[from] StartError),
    #[error(transparent)]
    Tokens(#[from] auth::TokensError),
    #[error("identity provider: {0}")]
    IdentityProvider(#[from] jwt::JwksError),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("listening on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("a follower failed: {0}")]
    Follower(String),
    #[error("codec: {0}")]
    Codec(#[from] sluice_kit::CodecError),
}

pub async fn run(options: Options, shutdown: Shutdown) -> Result<(), Error> {
    let started = service::start(
        &options.common,
        // The group is the notifier's dead-letter reader.
        if options.notify {
            service::KafkaNeeds::of(ACCESS)
                .group(format!("{}notifier", options.common.topics.prefix))
        } else {
            service::KafkaNeeds::of(ACCESS)
        },
        &shutdown,
    )
    .await?;
    let c = &options.common;
    let tokens = match &options.tokens_file {
        Some(path) => Some(Arc::new(auth::TokenFile::open(path.clone())?)),
        None => None,
    };
    let idp = match options.jwt.clone() {
        Some((source, rules)) => Some(Arc::new(jwt::Provider::open(source, rules).await?)),
        None => None,
    };
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(10))
        .connect(options.database_url.expose())
        .await?;
    let client_id = format!("sluice-{SERVICE}-{}", c.instance);
    let registry = c.schema_registry_url.as_deref();
    let grants = SharedGrants::new();
    let mut followers = vec![grants.spawn_follower(
        c.kafka.reader_config(&format!("{client_id}-grants")),
        c.topics.name(Topic::Grants),
        BlockingCodec::new(registry)?,
        shutdown.flag(),
        c.kafka.request_timeout,
    )];
    let targets = sluice_kit::declared::SharedDeclared::new();
    followers.push(targets.spawn_follower(
        c.kafka.reader_config(&format!("{client_id}-targets")),
        c.topics.name(Topic::Targets),
        BlockingCodec::new(registry)?,
        shutdown.flag(),
        c.kafka.request_timeout,
    ));
    let tables = sluice_kit::declared::SharedDeclared::new();
    followers.push(tables.spawn_follower(
        c.kafka.reader_config(&format!("{client_id}-tables")),
        c.topics.name(Topic::Tables),
        BlockingCodec::new(registry)?,
        shutdown.flag(),
        c.kafka.request_timeout,
    ));
    let notifications = sluice_kit::declared::SharedDeclared::new();
    followers.push(notifications.spawn_follower(
        c.kafka.reader_config(&format!("{client_id}-notifications")),
        c.topics.name(Topic::Notifications),
        BlockingCodec::new(registry)?,
        shutdown.flag(),
        c.kafka.request_timeout,
    ));
    let view = view::View::with_grants(grants, options.grants == GrantsMode::Enforce);
    for (what, topic) in [
        (view::Followed::AssetState, Topic::AssetState),
        (view::Followed::Dependencies, Topic::Dependencies),
        (view::Followed::ResolverProgress, Topic::ResolverProgress),
        (view::Followed::Runs, Topic::Runs),
    ] {
        followers.push(
            view.spawn_follower(
                what,
                c.topics.name(topic),
                view::Follow {
                    config: c
                        .kafka
                        .reader_config(&format!("{client_id}-{}", topic.role())),
                    codec: BlockingCodec::new(registry)?,
                    stop: shutdown.flag(),
                    timeout: c.kafka.request_timeout,
                },
            ),
        );
    }
    let app = routes::App {
        view: view.clone(),
        tokens,
        idp,
        pool: pool.clone(),
        producer: Arc::new(c.kafka.producer_config(&client_id).create()?),
        codec: Arc::new(Codec::new(c.schema_registry_url.as_deref())),
        dependencies_topic: c.topics.name(Topic::Dependencies),
        grants_topic: c.topics.name(Topic::Grants),
        targets: targets.clone(),
        targets_topic: c.topics.name(Topic::Targets),
        tables: tables.clone(),
        tables_topic: c.topics.name(Topic::Tables),
        notifications: notifications.clone(),
        notifications_topic: c.topics.name(Topic::Notifications),
        triggers_topic: c.topics.name(Topic::Triggers),
        commits: Arc::new(commits::Commits {
            config: c.kafka.reader_config(&format!("{client_id}-commits")),
            topic: c.topics.name(Topic::AssetEvents),
            partitions: c.topics.partitions,
            codec: BlockingCodec::new(registry)?,
            timeout: c.kafka.request_timeout,
        }),
        max_page: options.max_page,
        layouts: Default::default(),
    };
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .map_err(|source| Error::Listen {
            addr: options.listen,
            source,
        })?;
    let bound = listener.local_addr().map_err(|source| Error::Listen {
        addr: options.listen,
        source,
    })?;
    // Ready once every followed table is read to its end: before that an answer
    // could say "unknown" about what exists.
    let health = started.health.clone();
    let watch = view.clone();
    let stop = shutdown.clone();
    let rules = notifications.clone();
    let readiness = tokio::spawn(async move {
        while !stop.is_stopping() {
            health.beat();
            let failure = watch
                .failure()
                .or_else(|| targets.failure())
                .or_else(|| tables.failure())
                .or_else(|| rules.failure());
            if let Some(e) = failure {
                return Err(Error::Follower(e));
            }
            health.set_ready(
                watch.ready() && targets.caught_up() && tables.caught_up() && rules.caught_up(),
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    });
    let mut background = Vec::new();
    if options.notify {
        let notifier = Arc::new(notifier::Notifier {
            pool,
            view: view.clone(),
            rules: notifications.clone(),
            http: reqwest::Client::new(),
            interval: options.notify_interval,
            dead_letter_max_age: options.dead_letter_max_age,
        });
        let (n, stop) = (notifier.clone(), shutdown.clone());
        background.push(tokio::spawn(async move { n.run(stop).await }));
        let config = c.kafka.consumer_config(
            &format!("{client_id}-notifier"),
            &format!("{}notifier", c.topics.prefix),
        );
        let (topic, stop) = (c.topics.name(Topic::DeadLetter), shutdown.clone());
        background.push(tokio::spawn(async move {
            if let Err(e) = notifier.follow_dead_letters(config, topic, stop).await {
                tracing::error!(error = %e, "the notifier cannot read dead letters");
            }
        }));
    }
    tracing::info!(service = SERVICE, listen = %bound, admin = %started.admin_addr, "serving");
    let serve = axum::serve(listener, routes::router(app))
        .with_graceful_shutdown(shutdown.clone().wait_stopped());
    let result = tokio::select! {
        r = serve => r.map_err(|source| Error::Listen { addr: bound, source }),
        r = readiness => match r {
            Ok(r) => r,
            Err(join) => Err(Error::Follower(join.to_string())),
        },
    };
    started.health.set_stopping();
    shutdown.trigger();
    let _ = started.admin_task.await;
    for b in background {
        let _ = b.await;
    }
    for f in followers {
        let _ = tokio::task::spawn_blocking(move || f.join()).await;
    }
    result
}
