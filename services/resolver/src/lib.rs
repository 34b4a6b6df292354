//! The resolver service. Today it starts, checks its topics and serves its admin port;
//! its work loop lands with the resolver issue (#5).

use sluice_kit::config::{Common, ConfigErrors, Env};
use sluice_kit::service::{self, StartError};
use sluice_kit::{Shutdown, Topic};

pub const SERVICE: &str = "resolver";

/// The topics this service reads or writes; bootstrap creates and checks them.
pub const TOPICS: &[Topic] = &[
    Topic::AssetState,
    Topic::Dependencies,
    Topic::ResolverProgress,
    Topic::Triggers,
    Topic::DeadLetter,
];

#[derive(Clone, Debug)]
pub struct Options {
    pub common: Common,
}

impl Options {
    pub fn from_env() -> Result<Self, ConfigErrors> {
        Self::read(Env::from_process())
    }

    pub fn read(mut env: Env) -> Result<Self, ConfigErrors> {
        let common = Common::read(&mut env, SERVICE, "127.0.0.1:9103");
        env.finish(Options { common })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Start(#[from] StartError),
}

pub async fn run(options: Options, shutdown: Shutdown) -> Result<(), Error> {
    let started = service::start(&options.common, TOPICS, &shutdown).await?;
    started.hold_until_stopped(SERVICE, shutdown).await;
    Ok(())
}
