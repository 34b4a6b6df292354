//! The outbox publisher: job transitions (written by a PostgreSQL trigger on
//! every job change) go to the compacted runs topic, oldest first, and are deleted
//! once the broker has acknowledged them. A crash between the two publishes a
//! transition twice (same revision), never loses one.

use std::time::Duration;

use rdkafka::producer::{FutureProducer, FutureRecord};
use sluice_core::JobStatus;
use sluice_kit::wire::RunRecord;
use sluice_kit::{Codec, SchemaName, Shutdown};
use sqlx::PgPool;

use crate::metrics as m;
use crate::store::{self, TransitionRow};

/// Why a batch of transitions did not go out (it is taken again next time).
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("runs topic: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("encoding a run: {0}")]
    Codec(#[from] sluice_kit::CodecError),
    #[error("transition {id} has status {status:?}")]
    UnknownStatus { id: i64, status: String },
}

fn record(row: &TransitionRow) -> Result<RunRecord, PublishError> {
    let status = JobStatus::parse(&row.status).ok_or_else(|| PublishError::UnknownStatus {
        id: row.id,
        status: row.status.clone(),
    })?;
    Ok(RunRecord {
        trigger_key: row.trigger_key.clone(),
        dependency_id: row.dependency_id.clone(),
        target_kind: row.target_kind.clone(),
        target_name: row.target_name.clone(),
        status,
        revision: row.revision,
        attempt: row.attempt,
        invocation_id: row.invocation_id.clone(),
        external_id: row.external_id.clone(),
        reason: row.reason.clone(),
        updated_ms: row.at_ms,
    })
}

pub struct Publisher {
    pub pool: PgPool,
    pub producer: FutureProducer,
    pub codec: Codec,
    pub topic: String,
    pub every: Duration,
}

impl Publisher {
    /// Runs until shutdown; an outage is retried, never an end.
    pub async fn run(self, shutdown: Shutdown) -> Result<(), std::convert::Infallible> {
        loop {
            let published = match self.publish_once().await {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %e, "publishing runs failed; retrying");
                    0
                }
            };
            if shutdown.is_stopping() {
                return Ok(());
            }
            if published == 0 {
                tokio::select! {
                    _ = shutdown.clone().wait_stopped() => {
                        // One last pass: what the final sends recorded goes out too.
                        let _ = self.publish_once().await;
                        return Ok(());
                    }
                    _ = tokio::time::sleep(self.every) => {}
                }
            }
        }
    }

    /// Publishes one batch; returns how many transitions went out.
    pub async fn publish_once(&self) -> Result<usize, PublishError> {
        let mut tx = self.pool.begin().await?;
        let rows = store::outbox_take(&mut tx, 500).await?;
        if rows.is_empty() {
            return Ok(0);
        }
        let mut pending = Vec::with_capacity(rows.len());
        for row in &rows {
            let bytes = self
                .codec
                .encode(SchemaName::RunStatus, &self.topic, &record(row)?)
                .await?;
            pending.push((row.trigger_key.clone(), bytes));
        }
        let sends = pending.iter().map(|(k, v)| {
            self.producer.send(
                FutureRecord::to(&self.topic).key(k).payload(v),
                Duration::from_secs(30),
            )
        });
        for r in futures::future::join_all(sends).await {
            r.map_err(|(e, _)| e)?;
        }
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        store::outbox_done(&mut tx, &ids).await?;
        tx.commit().await?;
        metrics::counter!(m::RUNS_PUBLISHED_TOTAL).increment(rows.len() as u64);
        Ok(rows.len())
    }
}
