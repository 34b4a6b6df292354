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
pub mod registry;
pub mod resolve;
pub mod table;

use sluice_kit::changelog::KafkaChangelog;
use sluice_kit::config::{Common, ConfigErrors, Env};
use sluice_kit::grants::{GrantsMode, SharedGrants};
use sluice_kit::service::{self, StartError, Supervisor, TaskError};
use sluice_kit::txn;
use sluice_kit::{BlockingCodec, Shutdown, Topic};

pub const SERVICE: &str = "resolver";

/// What it reads and writes on the broker (bootstrap and ACLs).
pub const ACCESS: &sluice_kit::access::Access = &sluice_kit::access::RESOLVER;

#[derive(Clone, Debug)]
pub struct Options {
    pub common: Common,
    pub group_id: String,
    pub batch: txn::Batch,
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
        let batch = txn::Batch::read(&mut env, 1_000usize);
        let grants = env.parse("SLUICE_GRANTS", GrantsMode::Off);
        env.finish(Options {
            common,
            group_id,
            batch,
            grants,
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
    let deps = c.topics.name(Topic::Dependencies);
    let progress = c.topics.name(Topic::ResolverProgress);
    sluice_kit::topics::check_copartitioned(&c.kafka, &deps, &progress)?;
    let registry = c.schema_registry_url.as_deref();
    // The followers read whole topics on threads of their own; they end with `stop`.
    let table = table::GlobalTable::new();
    let reader = table.spawn_reader(
        c.kafka.reader_config(&c.client_id("table")),
        c.topics.name(Topic::AssetState),
        BlockingCodec::new(registry)?,
        shutdown.flag(),
        c.kafka.request_timeout,
    );
    let lineage = lineage::Lineage::new();
    let follower = lineage.spawn_follower(
        c.kafka.reader_config(&c.client_id("lineage")),
        deps.clone(),
        BlockingCodec::new(registry)?,
        shutdown.flag(),
    );
    let grants = match options.grants {
        GrantsMode::Off => None,
        GrantsMode::Enforce => {
            let g = SharedGrants::new();
            let follower = g.spawn_follower(
                c.kafka.reader_config(&c.client_id("grants")),
                c.topics.name(Topic::Grants),
                BlockingCodec::new(registry)?,
                shutdown.flag(),
                c.kafka.request_timeout,
            );
            Some((g, follower))
        }
    };
    let restore = |topic: &str| {
        Box::new(KafkaChangelog::new(
            c.kafka.reader_config(&c.client_id("restore")),
            topic.to_owned(),
            c.kafka.request_timeout * 10,
        ))
    };
    let mut processor = resolve::Resolve::new(
        BlockingCodec::new(registry)?,
        resolve::Changelogs {
            dependencies: restore(&deps),
            progress: restore(&progress),
        },
        c.topics.name(Topic::Triggers),
        table,
        lineage,
        c.kafka.reader_config(&c.client_id("restore")),
        c.kafka.request_timeout,
    );
    if let Some((g, _)) = &grants {
        processor = processor.with_grants(g.clone());
    }
    let mut supervisor = Supervisor::new(&shutdown);
    txn::spawn(
        &mut supervisor,
        c,
        &started.health,
        shutdown.flag(),
        txn::LoopSpec {
            task: "resolve loop",
            group_id: options.group_id.clone(),
            input_topics: vec![deps],
            batch: options.batch,
        },
        processor,
    );
    tracing::info!(service = SERVICE, admin = %started.admin_addr, "running");
    let result = supervisor.run(started).await;
    let _ = tokio::task::spawn_blocking(move || reader.join()).await;
    let _ = tokio::task::spawn_blocking(move || follower.join()).await;
    if let Some((_, f)) = grants {
        let _ = tokio::task::spawn_blocking(move || f.join()).await;
    }
    Ok(result?)
}
