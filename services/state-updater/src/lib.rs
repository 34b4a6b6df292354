//! The state-updater: folds asset-events into the compacted asset-state topic,
//! exactly once.
//!
//! It runs the shared transactional loop (`sluice_kit::txn`) with the [`fold::Fold`]
//! processor: each batch's changed states and its consumed offsets commit in one
//! Kafka transaction, so after any crash the replayed events fold onto exactly the
//! states that were committed with their offsets, and every published state carries
//! a per-asset revision that is never repeated and never skipped.

pub mod fold;
pub mod metrics;
pub mod restore;

use std::time::Duration;

use sluice_kit::config::{Common, ConfigErrors, Env};
use sluice_kit::service::{self, StartError};
use sluice_kit::txn::{self, TxnLoop};
use sluice_kit::{Codec, Shutdown, Topic};

pub const SERVICE: &str = "state-updater";

pub const TOPICS: &[Topic] = &[Topic::AssetEvents, Topic::AssetState, Topic::DeadLetter];

#[derive(Clone, Debug)]
pub struct Options {
    pub common: Common,
    /// Consumer group of all state-updater instances.
    pub group_id: String,
    pub max_batch_records: usize,
    pub max_batch_time: Duration,
}

impl Options {
    pub fn from_env() -> Result<Self, ConfigErrors> {
        Self::read(Env::from_process())
    }

    pub fn read(mut env: Env) -> Result<Self, ConfigErrors> {
        let common = Common::read(&mut env, SERVICE, "127.0.0.1:9102");
        let group_id = env.string(
            "SLUICE_STATE_UPDATER_GROUP",
            &format!("{}state-updater", common.topics.prefix),
        );
        let max_batch_records = env.parse("SLUICE_BATCH_MAX_RECORDS", 5_000usize);
        let max_batch_time = env.millis("SLUICE_BATCH_MAX_MS", Duration::from_millis(100));
        if max_batch_records == 0 {
            env.problem("SLUICE_BATCH_MAX_RECORDS must be at least 1");
        }
        env.finish(Options {
            common,
            group_id,
            max_batch_records,
            max_batch_time,
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
    let events = c.topics.name(Topic::AssetEvents);
    let states = c.topics.name(Topic::AssetState);
    sluice_kit::topics::check_copartitioned(&c.kafka, &events, &states).map_err(Error::Topology)?;
    let client_id = format!("sluice-{SERVICE}-{}", c.instance);
    let restorer = restore::Restorer::new(
        c.kafka.reader_config(&format!("{client_id}-restore")),
        states.clone(),
        c.kafka.request_timeout,
    );
    let processor = fold::Fold::new(
        Codec::new(c.schema_registry_url.as_deref()),
        tokio::runtime::Handle::current(),
        states,
        restorer,
    );
    let loop_options = txn::Options {
        group_id: options.group_id.clone(),
        input_topics: vec![events],
        dead_letter_topic: c.topics.name(Topic::DeadLetter),
        max_records: options.max_batch_records,
        max_batch_time: options.max_batch_time,
        request_timeout: c.kafka.request_timeout,
        retry_backoff: Duration::from_millis(200),
    };
    // One transactional id per instance: KIP-447 fencing uses the group metadata, and a
    // restarted instance with the same id fences its zombie.
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
    match result {
        Ok(r) => r.map_err(Error::from),
        Err(join) => Err(Error::Panicked(join.to_string())),
    }
}
