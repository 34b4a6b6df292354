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

fn record(row: &TransitionRow) -> Result<RunRecord, String> {
    let status = JobStatus::parse(&row.status)
        .ok_or_else(|| format!("transition {} has status {:?}", row.id, row.status))?;
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
    pub async fn run(self, shutdown: Shutdown) -> Result<(), String> {
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
    pub async fn publish_once(&self) -> Result<usize, String> {
        let mut tx = self.pool.begin().await.map_err(|e| e.to_string())?;
        let rows = store::outbox_take(&mut tx, 500)
            .await
            .map_err(|e| e.to_string())?;
        if rows.is_empty() {
            return Ok(0);
        }
        let mut pending = Vec::with_capacity(rows.len());
        for row in &rows {
            let bytes = self
                .codec
                .encode(SchemaName::RunStatus, &self.topic, &record(row)?)
                .await
                .map_err(|e| e.to_string())?;
            pending.push((row.trigger_key.clone(), bytes));
        }
        let sends = pending.iter().map(|(k, v)| {
            self.producer.send(
                FutureRecord::to(&self.topic).key(k).payload(v),
                Duration::from_secs(30),
            )
        });
        for r in futures::future::join_all(sends).await {
            r.map_err(|(e, _)| format!("runs topic: {e}"))?;
        }
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        store::outbox_done(&mut tx, &ids)
            .await
            .map_err(|e| e.to_string())?;
        tx.commit().await.map_err(|e| e.to_string())?;
        metrics::counter!(m::RUNS_PUBLISHED_TOTAL).increment(rows.len() as u64);
        Ok(rows.len())
    }
}
