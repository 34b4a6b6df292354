//! The asset-events topic as the ingester writes it: idempotent producer,
//! acks=all, keyed by asset_key. `publish` returns once the broker has
//! acknowledged every event — the HTTP 2xx waits for it, so an accepted commit is
//! never lost; an unreachable broker is an error within the ack timeout.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::producer::{FutureProducer, FutureRecord};
use sluice_core::AssetEvent;
use sluice_kit::{Codec, SchemaName};

#[derive(Clone)]
pub struct Sink {
    producer: FutureProducer,
    codec: Arc<Codec>,
    topic: String,
}

#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("the broker did not acknowledge the event: {0}")]
    NotAcknowledged(String),
    #[error("encoding the event: {0}")]
    Encode(String),
}

impl Sink {
    pub fn new(producer: FutureProducer, codec: Codec, topic: String) -> Sink {
        Sink {
            producer,
            codec: Arc::new(codec),
            topic,
        }
    }

    /// Encodes and produces every event, then waits for all acknowledgements.
    pub async fn publish(&self, events: &[AssetEvent]) -> Result<(), SinkError> {
        let mut encoded = Vec::with_capacity(events.len());
        for e in events {
            let bytes = self
                .codec
                .encode(SchemaName::AssetEvent, &self.topic, e)
                .await
                .map_err(|e| SinkError::Encode(e.to_string()))?;
            encoded.push((e.asset_key.as_str(), bytes));
        }
        let deliveries: Vec<_> = encoded
            .iter()
            .map(|(key, bytes)| {
                self.producer.send(
                    FutureRecord::to(&self.topic).key(*key).payload(bytes),
                    // A full local queue waits at most this long before failing.
                    Duration::from_secs(5),
                )
            })
            .collect();
        for d in futures::future::join_all(deliveries).await {
            d.map_err(|(e, _)| SinkError::NotAcknowledged(e.to_string()))?;
        }
        Ok(())
    }
}
