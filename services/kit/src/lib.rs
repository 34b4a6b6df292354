//! Adapters every Sluice service shares. The domain lives in `sluice-core`;
//! this crate is where it meets Kafka, HTTP and the process.

pub mod access;
pub mod admin;
pub mod authorized;
pub mod backoff;
pub mod changelog;
pub mod clock;
pub mod codec;
pub mod config;
pub mod declared;
pub mod dlq;
pub mod grants;
pub mod health;
pub mod hudi;
pub mod kafka;
pub mod metrics;
pub mod schemas;
pub mod secret_ref;
pub mod service;
pub mod shutdown;
pub mod telemetry;
pub mod topics;
pub mod txn;
pub mod uri;
pub mod wire;

/// Any error, with its sources: what a processor's or a record handler's
/// typed errors become where the kit carries them.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub use codec::{BlockingCodec, Codec, CodecError, ForeignAvro};
pub use health::Health;
pub use schemas::SchemaName;
pub use shutdown::Shutdown;
pub use topics::{Topic, TopicNames};
