//! Triggers topic → trigger_history. A consumer group spreads the partitions over
//! instances; a batch is one INSERT, and offsets are committed only after it.
//! A crash between the two replays the batch, and the unique trigger_key makes the
//! replay a no-op: the only effect of a trigger is the job its first row created.
//!
//! A consumer that hits a fatal error (a static member fenced after its session
//! timed out — seen after a broker restart) never delivers again: the intake
//! builds a new one, which resumes at the committed offsets (the batch in hand
//! was not recorded, so it is read again).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use sluice_kit::backoff::Backoff;
use sluice_kit::wire::TriggerRecord;
use sluice_kit::{Codec, SchemaName, Shutdown};
use sqlx::PgPool;

use crate::metrics as m;
use crate::store::{self, NewTrigger};

/// Builds (and subscribes) the intake's consumer: at start and after a fatal error.
pub type ConsumerFactory = Box<dyn Fn() -> Result<StreamConsumer, KafkaError> + Send + Sync>;

pub struct Intake {
    pub consumer: StreamConsumer,
    pub new_consumer: ConsumerFactory,
    pub producer: FutureProducer,
    pub codec: Codec,
    pub pool: PgPool,
    pub dead_letter: String,
    pub batch_max: usize,
    pub batch_wait: Duration,
    /// Rung when new jobs are recorded: the dispatch loop claims them at once.
    pub wake: std::sync::Arc<tokio::sync::Notify>,
}

/// Why a triggers record cannot become a row: it goes to the dead-letter topic.
fn to_row(msg: &BorrowedMessage<'_>, t: TriggerRecord) -> Result<NewTrigger, String> {
    let key = msg.key().map(String::from_utf8_lossy);
    if key.as_deref() != Some(t.trigger_key.as_str()) {
        return Err(format!(
            "record key {key:?} is not its trigger_key {:?}",
            t.trigger_key
        ));
    }
    if !t.trigger_key.starts_with("tk1-") || t.trigger_key.len() != 36 {
        return Err(format!("malformed trigger_key {:?}", t.trigger_key));
    }
    let inputs: Vec<serde_json::Value> = t
        .inputs
        .iter()
        .map(|i| {
            serde_json::json!({"asset": i.asset_key, "snapshot_id": i.snapshot_id,
                               "sequence": i.sequence, "watermark_ms": i.watermark_ms})
        })
        .collect();
    Ok(NewTrigger {
        trigger_key: t.trigger_key,
        dependency_id: t.dependency_id,
        dependency_version: t.dependency_version,
        target_kind: t.target.kind.as_str().to_owned(),
        target_name: t.target.name,
        target_parameters: serde_json::to_string(&t.target.parameters)
            .map_err(|e| e.to_string())?,
        inputs: serde_json::Value::Array(inputs).to_string(),
        partition: t.partition,
        window_end_ms: t.window_end_ms,
        reason: t.reason,
        first_commit_ms: t.first_commit_ms,
        requested_ms: t.requested_ms,
        source_partition: msg.partition(),
        source_offset: msg.offset(),
        origin: t.origin.as_str().to_owned(),
        requested_by: t.requested_by,
        request_id: t.request_id,
        rerun_of: t.rerun_of,
    })
}

/// A trigger not in hand this soon after the last one is not part of the batch.
const READY_GAP: Duration = Duration::from_millis(1);

/// How one consuming stretch ended.
enum Ended {
    Stopped,
    /// The consumer is unusable (a fatal librdkafka error): build another.
    ConsumerDead(KafkaError),
}

impl Intake {
    /// Runs until shutdown: a consumer that fails fatally is rebuilt, an outage
    /// retried; nothing ends it but the shutdown.
    pub async fn run(mut self, shutdown: Shutdown) -> Result<(), std::convert::Infallible> {
        loop {
            match self.consume(&shutdown).await {
                Ended::Stopped => return Ok(()),
                Ended::ConsumerDead(e) => {
                    metrics::counter!(sluice_kit::metrics::CONSUMERS_REBUILT_TOTAL).increment(1);
                    tracing::warn!(error = %e, "triggers consumer failed fatally; building a new one (it resumes at the committed offsets)");
                    let mut backoff =
                        Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
                    self.consumer = loop {
                        match (self.new_consumer)() {
                            Ok(c) => break c,
                            Err(e) if !shutdown.is_stopping() => {
                                tracing::warn!(error = %e, "triggers consumer not built; retrying");
                                tokio::time::sleep(backoff.next_wait()).await;
                            }
                            Err(_) => return Ok(()),
                        }
                    };
                }
            }
        }
    }

    async fn consume(&self, shutdown: &Shutdown) -> Ended {
        loop {
            let first = tokio::select! {
                _ = shutdown.clone().wait_stopped() => return Ended::Stopped,
                m = self.consumer.recv() => m,
            };
            let first = match first {
                Ok(m) => m,
                Err(e @ KafkaError::MessageConsumptionFatal(_)) => return Ended::ConsumerDead(e),
                Err(e) => {
                    tracing::warn!(error = %e, "triggers consume error");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            // Then what is ready: a lone trigger is recorded at once, a burst
            // (already queued by the client) fills the batch.
            let mut batch = vec![first];
            let until = Instant::now() + self.batch_wait;
            while batch.len() < self.batch_max {
                let left = until
                    .saturating_duration_since(Instant::now())
                    .min(READY_GAP);
                match tokio::time::timeout(left, self.consumer.recv()).await {
                    Ok(Ok(m)) => batch.push(m),
                    // The batch in hand is not recorded: the next consumer reads it again.
                    Ok(Err(e @ KafkaError::MessageConsumptionFatal(_))) => {
                        return Ended::ConsumerDead(e);
                    }
                    Ok(Err(e)) => tracing::warn!(error = %e, "triggers consume error"),
                    Err(_) => break,
                }
            }
            if !self.handle(&batch, shutdown).await {
                return Ended::Stopped; // stopping with the batch unrecorded: it is replayed
            }
        }
    }

    /// Records one batch; false if shutdown came first (nothing committed).
    async fn handle(&self, batch: &[BorrowedMessage<'_>], shutdown: &Shutdown) -> bool {
        let mut rows = Vec::with_capacity(batch.len());
        for msg in batch {
            let decoded = match msg.payload() {
                None => Err("a tombstone on the triggers topic".to_owned()),
                Some(bytes) => self
                    .codec
                    .decode::<TriggerRecord>(SchemaName::TriggerRequest, bytes)
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|t| to_row(msg, t)),
            };
            match decoded {
                Ok(row) => rows.push(row),
                Err(reason) => {
                    if !self.dead_letter(msg, &reason, shutdown).await {
                        return false;
                    }
                }
            }
        }
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            match store::record_triggers(&self.pool, &rows).await {
                Ok(new) => {
                    if !new.is_empty() {
                        self.wake.notify_one();
                    }
                    metrics::counter!(m::TRIGGERS_RECORDED_TOTAL).increment(new.len() as u64);
                    metrics::counter!(m::TRIGGERS_DUPLICATE_TOTAL)
                        .increment((rows.len() - new.len()) as u64);
                    break;
                }
                Err(e) if !shutdown.is_stopping() => {
                    // PostgreSQL down: hold the batch (offsets stay uncommitted) and retry.
                    let wait = backoff.next_wait();
                    tracing::warn!(error = %e, retry_ms = wait.as_millis() as u64, "recording triggers failed; retrying");
                    tokio::time::sleep(wait).await;
                }
                Err(_) => return false,
            }
        }
        let mut next: BTreeMap<(String, i32), i64> = BTreeMap::new();
        for msg in batch {
            let e = next
                .entry((msg.topic().to_owned(), msg.partition()))
                .or_insert(0);
            *e = (*e).max(msg.offset() + 1);
        }
        let mut tpl = TopicPartitionList::new();
        for ((topic, p), o) in next {
            let _ = tpl.add_partition_offset(&topic, p, Offset::Offset(o));
        }
        // A failed commit (a rebalance) replays the batch; the unique key absorbs it.
        if let Err(e) = self.consumer.commit(&tpl, CommitMode::Async) {
            tracing::warn!(error = %e, "offset commit failed; the batch may be replayed");
        }
        true
    }

    async fn dead_letter(
        &self,
        msg: &BorrowedMessage<'_>,
        reason: &str,
        shutdown: &Shutdown,
    ) -> bool {
        let out = sluice_kit::dlq::dead_letter(&self.dead_letter, msg, reason);
        tracing::warn!(
            partition = msg.partition(),
            offset = msg.offset(),
            error = reason,
            "trigger dead-lettered"
        );
        metrics::counter!(m::TRIGGERS_DEAD_LETTERED_TOTAL).increment(1);
        loop {
            let mut record = FutureRecord::to(&out.topic)
                .key(&out.key)
                .headers(sluice_kit::dlq::owned_headers(&out.headers));
            if let Some(p) = &out.payload {
                record = record.payload(p);
            }
            match self.producer.send(record, Duration::from_secs(30)).await {
                Ok(_) => return true,
                Err((e, _)) if !shutdown.is_stopping() => {
                    tracing::warn!(error = %e, "dead-letter send failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(_) => return false,
            }
        }
    }
}
