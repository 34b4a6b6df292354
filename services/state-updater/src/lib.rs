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

use sluice_kit::changelog::KafkaChangelog;
use sluice_kit::config::{Common, ConfigErrors, Env};
use sluice_kit::service::{self, StartError, Supervisor, TaskError};
use sluice_kit::txn;
use sluice_kit::{BlockingCodec, Shutdown, Topic};

pub const SERVICE: &str = "state-updater";

/// What it reads and writes on the broker (bootstrap and ACLs).
pub const ACCESS: &sluice_kit::access::Access = &sluice_kit::access::STATE_UPDATER;

#[derive(Clone, Debug)]
pub struct Options {
    pub common: Common,
    /// Consumer group of all state-updater instances.
    pub group_id: String,
    pub batch: txn::Batch,
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
        let batch = txn::Batch::read(&mut env, 5_000usize);
        env.finish(Options {
            common,
            group_id,
            batch,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Start(#[from] StartError),
    #[error(transparent)]
    Topology(#[from] sluice_kit::topics::TopologyError),
    #[error("codec: {0}")]
    Codec(#[from] sluice_kit::CodecError),
    #[error(transparent)]
    Task(#[from] TaskError),
}

pub async fn run(options: Options, shutdown: Shutdown) -> Result<(), Error> {
    metrics::describe();
    let started = service::start(
        &options.common,
        service::KafkaNeeds::of(ACCESS).group(&options.group_id),
        &shutdown,
    )
    .await?;
    let c = &options.common;
    let events = c.topics.name(Topic::AssetEvents);
    let states = c.topics.name(Topic::AssetState);
    sluice_kit::topics::check_copartitioned(&c.kafka, &events, &states)?;
    let changelog = KafkaChangelog::new(
        c.kafka.reader_config(&c.client_id("restore")),
        states,
        c.kafka.request_timeout * 10,
    );
    let processor = fold::Fold::new(
        BlockingCodec::new(c.schema_registry_url.as_deref())?,
        Box::new(changelog),
    );
    let mut supervisor = Supervisor::new(&shutdown);
    txn::spawn(
        &mut supervisor,
        c,
        &started.health,
        shutdown.flag(),
        txn::LoopSpec {
            task: "fold loop",
            group_id: options.group_id.clone(),
            input_topics: vec![events],
            batch: options.batch,
        },
        processor,
    );
    tracing::info!(service = SERVICE, admin = %started.admin_addr, "running");
    Ok(supervisor.run(started).await?)
}
