//! The resolver: evaluates dependency specs against the global asset-state table
//! and produces exactly-once trigger requests.
//!
//! The dependency model and its decision are pure and live in `sluice-core`
//! (`dependency`, `decide`); the topic records in `sluice_kit::wire`.
//!
//! * [`lineage`] — the whole applied dependency set, in append order, for cycles.
//! * [`table`] — the global asset-state table every instance reads whole.
//! * [`resolve`] — the transactional processor: ownership of dependencies by
//!   consumer group, the inverted index, triggers and progress in one transaction.

pub mod lineage;
pub mod metrics;
pub mod resolve;
pub mod table;

use std::time::Duration;

use sluice_kit::config::{Common, ConfigErrors, Env};
use sluice_kit::grants::{GrantsMode, SharedGrants};
use sluice_kit::service::{self, StartError};
use sluice_kit::txn::{self, TxnLoop};
use sluice_kit::{Codec, Shutdown, Topic};

pub const SERVICE: &str = "resolver";

/// The topics this service reads or writes; bootstrap creates and checks them.
pub const TOPICS: &[Topic] = &[
    Topic::AssetState,
    Topic::Dependencies,
    Topic::ResolverProgress,
    Topic::Triggers,
    Topic::DeadLetter,
    Topic::Grants,
];

#[derive(Clone, Debug)]
pub struct Options {
    pub common: Common,
    pub group_id: String,
    pub max_batch_records: usize,
    pub max_batch_time: Duration,
    pub grants: GrantsMode,
}

impl Options {
    pub fn from_env() -> Result<Self, ConfigErrors> {
        Self::read(Env::from_process())
    }

    pub fn read(mut env: Env) -> Result<Self, ConfigErrors> {
        let common = Common::read(&mut env, SERVICE, "127.0.0.1:9103");
        let group_id = env.string(
            "SLUICE_RESOLVER_GROUP",
            &format!("{}resolver", common.topics.prefix),
        );
        let max_batch_records = env.parse("SLUICE_BATCH_MAX_RECORDS", 1_000usize);
        let max_batch_time = env.millis("SLUICE_BATCH_MAX_MS", Duration::from_millis(100));
        let grants = env.parse("SLUICE_GRANTS", GrantsMode::Off);
        if max_batch_records == 0 {
            env.problem("SLUICE_BATCH_MAX_RECORDS must be at least 1");
        }
        env.finish(Options {
            common,
            group_id,
            max_batch_records,
            max_batch_time,
            grants,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("transactional loop: {0}")]
    Loop(#[from] txn::Error),
    #[error("{0}")]
    Topology(String),
    #[error("the work loop panicked: {0}")]
    Panicked(String),
}

pub async fn run(options: Options, shutdown: Shutdown) -> Result<(), Error> {
    metrics::describe();
    let started = service::start(&options.common, TOPICS, &shutdown).await?;
    let c = &options.common;
    let deps = c.topics.name(Topic::Dependencies);
    let progress = c.topics.name(Topic::ResolverProgress);
    sluice_kit::topics::check_copartitioned(&c.kafka, &deps, &progress).map_err(Error::Topology)?;
    let client_id = format!("sluice-{SERVICE}-{}", c.instance);
    let codec = Codec::new(c.schema_registry_url.as_deref());
    let runtime = tokio::runtime::Handle::current();
    let table = table::GlobalTable::new();
    let reader = table.spawn_reader(
        c.kafka.reader_config(&format!("{client_id}-table")),
        c.topics.name(Topic::AssetState),
        Codec::new(c.schema_registry_url.as_deref()),
        runtime.clone(),
        shutdown.flag(),
        c.kafka.request_timeout,
    );
    let lineage = lineage::Lineage::new();
    let follower = lineage.spawn_follower(
        c.kafka.reader_config(&format!("{client_id}-lineage")),
        deps.clone(),
        Codec::new(c.schema_registry_url.as_deref()),
        runtime.clone(),
        shutdown.flag(),
    );
    let grants = (options.grants == GrantsMode::Enforce).then(|| {
        let g = SharedGrants::new();
        let follower = g.spawn_follower(
            c.kafka.reader_config(&format!("{client_id}-grants")),
            c.topics.name(Topic::Grants),
            Codec::new(c.schema_registry_url.as_deref()),
            runtime.clone(),
            shutdown.flag(),
            c.kafka.request_timeout,
        );
        (g, follower)
    });
    let mut processor = resolve::Resolve::new(
        codec,
        runtime,
        resolve::Topics {
            dependencies: deps.clone(),
            progress,
            triggers: c.topics.name(Topic::Triggers),
        },
        table,
        lineage,
        c.kafka.reader_config(&format!("{client_id}-restore")),
        c.kafka.request_timeout,
    );
    if let Some((g, _)) = &grants {
        processor = processor.with_grants(g.clone());
    }
    let loop_options = txn::Options {
        group_id: options.group_id.clone(),
        input_topics: vec![deps],
        dead_letter_topic: c.topics.name(Topic::DeadLetter),
        max_records: options.max_batch_records,
        max_batch_time: options.max_batch_time,
        request_timeout: c.kafka.request_timeout,
        retry_backoff: Duration::from_millis(200),
    };
    let consumer = c.kafka.consumer_config(&client_id, &options.group_id);
    let producer = c.kafka.transactional_producer_config(
        &client_id,
        &format!("{}{SERVICE}-{}", c.topics.prefix, c.instance),
    );
    let health = started.health.clone();
    let stop = shutdown.flag();
    let work = tokio::task::spawn_blocking(move || {
        let l = TxnLoop::new(
            &consumer,
            &producer,
            processor,
            loop_options,
            health.clone(),
            stop,
        )?;
        health.set_ready(true);
        l.run().map(|_| ())
    });
    tracing::info!(service = SERVICE, admin = %started.admin_addr, "running");
    let result = work.await;
    started.health.set_stopping();
    shutdown.trigger();
    let _ = started.admin_task.await;
    let _ = tokio::task::spawn_blocking(move || reader.join()).await;
    let _ = tokio::task::spawn_blocking(move || follower.join()).await;
    if let Some((_, f)) = grants {
        let _ = tokio::task::spawn_blocking(move || f.join()).await;
    }
    match result {
        Ok(r) => r.map_err(Error::from),
        Err(join) => Err(Error::Panicked(join.to_string())),
    }
}
