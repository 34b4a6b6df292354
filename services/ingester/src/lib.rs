//! The ingester: every way a lake commit enters Sluice, turned into canonical
//! AssetEvents on the asset-events topic (keyed by asset_key, the core's
//! deterministic event_id, so the same commit seen by two paths folds once).
//!
//! - `http`: push — the generic commit API and Hudi's HTTP write-commit callback;
//! - `hooks`: commit-hook topics (generic JSON, Hudi's Kafka callback, Avro) and
//!   Debezium CDC of a commit table, exactly once in the transactional loop;
//! - `poll`: the compensation path — each registered table's own metadata.
//!
//! `normalize` (pure) is where every format becomes an event; `sink` is the
//! acknowledged write to asset-events used by push and poll.

pub mod auth;
pub mod hooks;
pub mod http;
pub mod metrics;
pub mod normalize;
pub mod poll;
pub mod sink;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::producer::FutureProducer;
use sluice_kit::config::{Common, ConfigErrors, Env};
use sluice_kit::declared::SharedDeclared;
use sluice_kit::service::{self, StartError, Supervisor, TaskError};
use sluice_kit::txn;
use sluice_kit::{BlockingCodec, Codec, Shutdown, Topic};

pub const SERVICE: &str = "ingester";

/// What it reads and writes on the broker (bootstrap and ACLs).
pub const ACCESS: &sluice_kit::access::Access = &sluice_kit::access::INGESTER;

#[derive(Clone, Debug)]
pub struct Options {
    pub common: Common,
    /// `None`: no HTTP listener.
    pub http_addr: Option<SocketAddr>,
    pub tokens: auth::Tokens,
    pub max_body_bytes: usize,
    pub max_batch: usize,
    /// How long an HTTP request waits for the broker's acknowledgement.
    pub ack_timeout: Duration,
    pub hook_topics: Vec<hooks::HookTopic>,
    pub tables: Vec<poll::Table>,
    pub group_id: String,
    /// The hook loop's transactions.
    pub batch: txn::Batch,
}

impl Options {
    pub fn from_env() -> Result<Self, ConfigErrors> {
        Self::read(Env::from_process())
    }

    pub fn read(mut env: Env) -> Result<Self, ConfigErrors> {
        let common = Common::read(&mut env, SERVICE, "127.0.0.1:9101");
        let http_addr = match env
            .string("SLUICE_INGEST_HTTP_ADDR", "127.0.0.1:8088")
            .as_str()
        {
            "off" => None,
            raw => raw
                .parse()
                .map_err(|_| {
                    env.problem(format!(
                        "SLUICE_INGEST_HTTP_ADDR={raw:?} is not host:port or off"
                    ))
                })
                .ok(),
        };
        let tokens = match env.value_or_file("SLUICE_INGEST_TOKENS") {
            Some(json) => auth::Tokens::parse(&json).unwrap_or_else(|ps| {
                ps.into_iter().for_each(|p| env.problem(p));
                auth::Tokens::default()
            }),
            None => auth::Tokens::default(),
        };
        if http_addr.is_some() && tokens.is_empty() {
            env.problem("SLUICE_INGEST_TOKENS is required while HTTP is on (SLUICE_INGEST_HTTP_ADDR=off turns it off)");
        }
        let max_body_bytes = env.parse("SLUICE_INGEST_MAX_BODY_BYTES", 1usize << 20);
        let max_batch = env.parse("SLUICE_INGEST_MAX_BATCH", 1_000usize);
        let ack_timeout = env.millis("SLUICE_INGEST_ACK_TIMEOUT_MS", Duration::from_secs(10));
        let hook_topics = env
            .value_or_file("SLUICE_HOOK_TOPICS")
            .map(|json| {
                hooks::parse_topics(&json).unwrap_or_else(|ps| {
                    ps.into_iter().for_each(|p| env.problem(p));
                    Vec::new()
                })
            })
            .unwrap_or_default();
        let tables = env
            .value_or_file("SLUICE_POLL_TABLES")
            .map(|json| {
                poll::parse_tables(&json).unwrap_or_else(|ps| {
                    ps.into_iter().for_each(|p| env.problem(p));
                    Vec::new()
                })
            })
            .unwrap_or_default();
        let group_id = env.string(
            "SLUICE_INGESTER_GROUP",
            &format!("{}{SERVICE}", common.topics.prefix),
        );
        let batch = txn::Batch::read(&mut env, 1_000);
        env.finish(Options {
            batch,
            common,
            http_addr,
            tokens,
            max_body_bytes,
            max_batch,
            ack_timeout,
            hook_topics,
            tables,
            group_id,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("codec: {0}")]
    Codec(#[from] sluice_kit::CodecError),
    #[error("http listener: {0}")]
    Listen(std::io::Error),
    #[error(transparent)]
    Task(#[from] TaskError),
}

pub async fn run(options: Options, shutdown: Shutdown) -> Result<(), Error> {
    metrics::describe();
    let started = service::start(
        &options.common,
        // The group is the hook loop's, which runs only when there are hook topics.
        if options.hook_topics.is_empty() {
            service::KafkaNeeds::of(ACCESS)
        } else {
            service::KafkaNeeds::of(ACCESS)
                .group(&options.group_id)
                .reading(
                    options
                        .hook_topics
                        .iter()
                        .map(|h| h.topic.clone())
                        .collect(),
                )
        },
        &shutdown,
    )
    .await?;
    let c = &options.common;
    let events_topic = c.topics.name(Topic::AssetEvents);
    let registry = c.schema_registry_url.as_deref();
    let mut producer_config = c.kafka.producer_config(&c.client_id(""));
    producer_config.set(
        "message.timeout.ms",
        options.ack_timeout.as_millis().to_string(),
    );
    let producer: FutureProducer = producer_config.create()?;
    let sink = sink::Sink::new(producer, Codec::new(registry), events_topic.clone());
    let mut supervisor = Supervisor::new(&shutdown);
    supervisor.heartbeat(&started.health);

    if let Some(addr) = options.http_addr {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(Error::Listen)?;
        tracing::info!(addr = %listener.local_addr().map_err(Error::Listen)?, "HTTP push listening");
        let app = http::router(Arc::new(http::Http {
            sink: sink.clone(),
            tokens: options.tokens.clone(),
            max_body_bytes: options.max_body_bytes,
            max_batch: options.max_batch,
        }));
        let stop = shutdown.clone();
        supervisor.spawn("http push", async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { stop.wait_stopped().await })
                .await
        });
    }

    if !options.hook_topics.is_empty() {
        let processor =
            hooks::Hooks::new(options.hook_topics.clone(), registry, events_topic.clone())?;
        txn::spawn(
            &mut supervisor,
            c,
            &started.health,
            shutdown.flag(),
            txn::LoopSpec {
                task: "hook loop",
                group_id: options.group_id.clone(),
                input_topics: options
                    .hook_topics
                    .iter()
                    .map(|t| t.topic.clone())
                    .collect(),
                batch: options.batch,
            },
            processor,
        );
    }

    // Pollers: the bootstrap tables and those declared on the tables topic, both
    // live; the positions follower reads asset-state for the polled assets.
    let known = Arc::new(poll::Known::new(
        &options
            .tables
            .iter()
            .map(|t| t.asset.clone())
            .collect::<Vec<_>>(),
    ));
    let declared = SharedDeclared::new();
    let declared_follower = declared.spawn_follower(
        c.kafka.reader_config(&c.client_id("tables")),
        c.topics.name(Topic::Tables),
        BlockingCodec::new(registry)?,
        shutdown.flag(),
        c.kafka.request_timeout,
    );
    let watched = declared.clone();
    supervisor.spawn_blocking("tables follower", move || {
        let _ = declared_follower.join();
        match watched.failure() {
            Some(e) => Err(format!("tables topic: {e}")),
            None => Ok(()),
        }
    });
    let (reader, topic) = (
        c.kafka.reader_config(&c.client_id("positions")),
        c.topics.name(Topic::AssetState),
    );
    let positions = Arc::new(poll::Positions {
        config: reader.clone(),
        topic: topic.clone(),
        registry: registry.map(str::to_owned),
    });
    let (k, codec, stop) = (
        known.clone(),
        BlockingCodec::new(registry)?,
        shutdown.flag(),
    );
    supervisor.spawn_blocking("poll positions", move || {
        k.follow(reader, &topic, &codec, &stop)
    });
    let poller = poll::Poller {
        bootstrap: options.tables.clone(),
        declared,
        known,
        positions,
        sink: sink.clone(),
    };
    supervisor.spawn("poller", poller.run(shutdown.clone()));

    started.health.set_ready(true);
    tracing::info!(
        service = SERVICE,
        admin = %started.admin_addr,
        http = ?options.http_addr,
        hook_topics = options.hook_topics.len(),
        bootstrap_tables = options.tables.len(),
        "ready"
    );
    Ok(supervisor.run(started).await?)
}
