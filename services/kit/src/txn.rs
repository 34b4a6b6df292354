//! The transactional consume-transform-produce loop every Kafka-to-Kafka service runs.
//!
//! One Kafka transaction covers many input records: their outputs, their dead
//! letters and their consumer offsets commit together or not at all, so a crash at
//! any point replays exactly the uncommitted records and `read_committed` readers
//! never see a half-done batch.
//!
//! * Records are pulled until nothing more is ready, `max_records` or
//!   `max_batch_time`, then the batch commits: a lone record commits at once, a
//!   burst (already queued by the client) fills batches.
//! * Abortable errors abort, rewind the consumer to the committed offsets and tell the
//!   processor to drop uncommitted changes; fatal errors end the loop with an error.
//! * On revoke the open transaction commits inside the rebalance callback, before
//!   the partitions move (drain on rebalance); the processor then drops their state.
//! * A record the processor calls poison goes to the dead-letter topic, inside the
//!   same transaction, with its origin in headers: nothing is dropped, nothing stops.
//!
//! The loop is blocking (librdkafka's transactional calls block); run it on a
//! dedicated thread (`tokio::task::spawn_blocking`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use crate::dlq;
use crate::health::Health;
use crate::metrics as m;

/// Polled by its own thread, so delivery reports are served while a commit or an
/// abort flushes (librdkafka refuses to abort otherwise).
type TxnProducer = ThreadedProducer<DefaultProducerContext>;

/// One consumed record as a processor sees it.
pub struct Input<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<&'a [u8]>,
    pub payload: Option<&'a [u8]>,
    pub timestamp_ms: Option<i64>,
    pub headers: Vec<(&'a str, &'a [u8])>,
}

/// A record to produce in the current transaction. `payload: None` is a tombstone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Output {
    pub topic: String,
    /// An explicit partition (co-partitioned changelogs); `None`: by key.
    pub partition: Option<i32>,
    pub key: Vec<u8>,
    pub payload: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
}

pub use crate::BoxError;

/// What a processor's failure means to the loop. Each carries the processor's own
/// error (a codec error, a spec error, …) with its sources; a dead letter's
/// `error` header is its whole chain.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// This record can never be processed: dead-letter it and go on.
    #[error("poison record: {0}")]
    Poison(#[source] BoxError),
    /// An outage (a registry, a database): abort the batch and retry it after a backoff.
    #[error("retriable: {0}")]
    Retriable(#[source] BoxError),
    /// A bug or a broken invariant: stop the service.
    #[error("fatal: {0}")]
    Fatal(#[source] BoxError),
}

impl ProcessError {
    pub fn poison(e: impl Into<BoxError>) -> Self {
        ProcessError::Poison(e.into())
    }

    pub fn retriable(e: impl Into<BoxError>) -> Self {
        ProcessError::Retriable(e.into())
    }

    pub fn fatal(e: impl Into<BoxError>) -> Self {
        ProcessError::Fatal(e.into())
    }

    /// The error and its sources, `: `-joined (a log line, a dead letter's header).
    pub fn chain(&self) -> String {
        let (ProcessError::Poison(e) | ProcessError::Retriable(e) | ProcessError::Fatal(e)) = self;
        let mut text = e.to_string();
        let mut next = e.source();
        while let Some(s) = next {
            let s_text = s.to_string();
            if !text.contains(&s_text) {
                text.push_str(": ");
                text.push_str(&s_text);
            }
            next = s.source();
        }
        text
    }

    /// An input that does not decode is poison; a schema-registry outage is retriable.
    pub fn undecodable(e: &crate::CodecError) -> Self {
        if e.is_retriable() {
            ProcessError::retriable(e.to_string())
        } else {
            ProcessError::poison(e.to_string())
        }
    }

    /// An output this service made that does not encode is a bug (fatal); a
    /// schema-registry outage is retriable. `what` names the record.
    pub fn unencodable(what: &str, e: &crate::CodecError) -> Self {
        if e.is_retriable() {
            ProcessError::retriable(e.to_string())
        } else {
            ProcessError::fatal(format!("{what} does not encode: {e}"))
        }
    }
}

impl Output {
    /// A record keyed by `key`, partitioned by the key.
    pub fn keyed(topic: &str, key: impl Into<Vec<u8>>, payload: Vec<u8>) -> Output {
        Output {
            topic: topic.to_owned(),
            partition: None,
            key: key.into(),
            payload: Some(payload),
            headers: Vec::new(),
        }
    }

    /// A tombstone for `key` (compaction removes the key).
    pub fn tombstone(topic: &str, key: impl Into<Vec<u8>>) -> Output {
        Output {
            topic: topic.to_owned(),
            partition: None,
            key: key.into(),
            payload: None,
            headers: Vec::new(),
        }
    }

    /// The same record on an explicit partition (a co-partitioned changelog).
    pub fn on_partition(mut self, partition: i32) -> Output {
        self.partition = Some(partition);
        self
    }
}

/// The service-specific part of the loop.
pub trait Processor: Send {
    fn process(&mut self, input: &Input<'_>) -> Result<Vec<Output>, ProcessError>;
    /// Partitions were assigned; restore their state before their first record.
    fn assigned(&mut self, _partitions: &[(String, i32)]) -> Result<(), ProcessError> {
        Ok(())
    }
    /// Partitions were revoked (after their open transaction was committed or aborted).
    fn revoked(&mut self, _partitions: &[(String, i32)]) {}
    /// The changes made since the last commit are now durable.
    fn committed(&mut self) {}
    /// The changes made since the last commit were aborted: forget them.
    fn aborted(&mut self) {}
    /// Called between records (at least every poll interval): work not driven by an
    /// input record — timers, changes seen elsewhere. Its outputs join the open
    /// transaction (one is opened if needed) and commit with it.
    fn tick(&mut self) -> Result<Vec<Output>, ProcessError> {
        Ok(Vec::new())
    }
}

#[derive(Clone, Debug)]
pub struct Options {
    pub group_id: String,
    pub input_topics: Vec<String>,
    pub dead_letter_topic: String,
    pub max_records: usize,
    pub max_batch_time: Duration,
    pub request_timeout: Duration,
    /// Backoff after a retriable error, doubled up to 32× while errors repeat.
    pub retry_backoff: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    #[error("processor: {0}")]
    Fatal(BoxError),
    #[error("consumer has no group metadata (not in a group)")]
    NoGroupMetadata,
    #[error(
        "the broker's ACLs do not let this service's principal Write transactional-id {0}; grant it (deploy/kafka/acls.sh or `sluice acls` give the whole set of each service)"
    )]
    TransactionalIdForbidden(String),
}

/// What happened inside a rebalance callback, for the loop to act on afterwards.
enum Event {
    Assigned(Vec<(String, i32)>),
    Revoked(Vec<(String, i32)>),
    Committed,
    Aborted,
    Fatal(String),
}

/// The open transaction, shared with the rebalance callback so it can commit it.
struct Open {
    producer: Arc<TxnProducer>,
    timeout: Duration,
    /// Next offsets to commit; `None` when no transaction is open.
    offsets: Option<Offsets>,
    events: Vec<Event>,
}

pub struct LoopContext {
    open: Mutex<Open>,
}

impl LoopContext {
    /// Runs `f` on the open-transaction state shared with the rebalance callbacks.
    fn with_open<R>(&self, f: impl FnOnce(&mut Open) -> R) -> R {
        f(&mut self.open.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl ClientContext for LoopContext {}

impl ConsumerContext for LoopContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else {
            return;
        };
        self.with_open(|open| {
            if let Some(offsets) = open.offsets.take().map(|o| o.to_list()) {
                // Drain: commit what was processed before the partitions move on.
                let outcome = consumer
                    .group_metadata()
                    .ok_or(KafkaError::Subscription("no group metadata".into()))
                    .and_then(|cgm| send_offsets(&open.producer, &offsets, &cgm, open.timeout))
                    .and_then(|()| commit(&open.producer, open.timeout));
                let event = match outcome {
                    Ok(()) => Event::Committed,
                    Err(e) => match abort(&open.producer, open.timeout, &e) {
                        Ok(()) => Event::Aborted,
                        Err(fatal) => Event::Fatal(fatal),
                    },
                };
                open.events.push(event);
            }
            open.events.push(Event::Revoked(partitions(tpl)));
        });
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            self.with_open(|open| open.events.push(Event::Assigned(partitions(tpl))));
        }
    }
}

fn partitions(tpl: &TopicPartitionList) -> Vec<(String, i32)> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_owned(), e.partition()))
        .collect()
}

/// Adds the consumed offsets to the transaction; a transaction opened by `tick`
/// alone has none.
fn send_offsets(
    producer: &TxnProducer,
    offsets: &TopicPartitionList,
    cgm: &rdkafka::consumer::ConsumerGroupMetadata,
    timeout: Duration,
) -> Result<(), KafkaError> {
    if offsets.count() == 0 {
        return Ok(());
    }
    producer.send_offsets_to_transaction(offsets, cgm, timeout)
}

/// Commits the open transaction once every produced record is acknowledged.
///
/// rust-rdkafka's `commit_transaction` flushes first by polling the producer in
/// slices of up to 100 ms; the ThreadedProducer's own thread serves the delivery
/// reports, so that poll sat out its full slice on almost every commit (100 ms per
/// transaction, measured with bench-state-updater). Waiting here for the queue to
/// drain, in 1 ms steps, makes that flush return at once.
///
/// A retriable failure (a timeout while the broker is away) is retried: the commit
/// may already be under way, and librdkafka allows only another commit then, not an
/// abort. Only an error that requires an abort, or a fatal one, is returned.
fn commit(producer: &TxnProducer, timeout: Duration) -> Result<(), KafkaError> {
    let deadline = Instant::now() + timeout;
    while producer.in_flight_count() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let give_up = Instant::now() + OUTAGE_PATIENCE;
    loop {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(timeout / 4);
        match producer.commit_transaction(left) {
            Err(KafkaError::Transaction(e))
                if e.is_retriable() && !e.txn_requires_abort() && Instant::now() < give_up =>
            {
                tracing::warn!(error = %e, "transaction commit not confirmed yet; retrying the commit");
                std::thread::sleep(Duration::from_millis(200));
            }
            other => return other,
        }
    }
}

/// How long a commit or an abort keeps retrying through a broker outage before
/// the loop gives up (and the service exits to be restarted).
const OUTAGE_PATIENCE: Duration = Duration::from_secs(300);

/// Aborts the open transaction, retrying a retriable failure (the broker away).
fn abort_retrying(producer: &TxnProducer, timeout: Duration) -> Result<(), KafkaError> {
    let give_up = Instant::now() + OUTAGE_PATIENCE;
    loop {
        match producer.abort_transaction(timeout) {
            Err(KafkaError::Transaction(e)) if e.is_retriable() && Instant::now() < give_up => {
                tracing::warn!(error = %e, "transaction abort not confirmed yet; retrying the abort");
                std::thread::sleep(Duration::from_millis(200));
            }
            other => return other,
        }
    }
}

/// Aborts after `cause`; a fatal cause or a failed abort is returned as fatal.
fn abort(producer: &TxnProducer, timeout: Duration, cause: &KafkaError) -> Result<(), String> {
    if let KafkaError::Transaction(e) = cause
        && e.is_fatal()
    {
        return Err(format!("fatal transaction error: {cause}"));
    }
    abort_retrying(producer, timeout).map_err(|e| format!("abort after {cause} failed: {e}"))
}

/// A consumer of the loop's inputs whose rebalance callbacks share `producer`.
fn subscribed(
    config: &rdkafka::ClientConfig,
    producer: &Arc<TxnProducer>,
    options: &Options,
) -> Result<BaseConsumer<LoopContext>, Error> {
    let ctx = LoopContext {
        open: Mutex::new(Open {
            producer: producer.clone(),
            timeout: options.request_timeout,
            offsets: None,
            events: Vec::new(),
        }),
    };
    let consumer: BaseConsumer<LoopContext> = config.create_with_context(ctx)?;
    let topics: Vec<&str> = options.input_topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics)?;
    Ok(consumer)
}

/// A consumer and a transactional producer wired together.
pub struct TxnLoop<P: Processor> {
    consumer: BaseConsumer<LoopContext>,
    /// Kept to build a new consumer after a fatal consumer error.
    consumer_config: rdkafka::ClientConfig,
    producer: Arc<TxnProducer>,
    processor: P,
    options: Options,
    health: Health,
    stop: Arc<AtomicBool>,
}

impl<P: Processor> TxnLoop<P> {
    /// Builds the clients; `consumer_config` and `producer_config` come from the
    /// factory in [`crate::kafka`].
    pub fn new(
        consumer_config: &rdkafka::ClientConfig,
        producer_config: &rdkafka::ClientConfig,
        processor: P,
        options: Options,
        health: Health,
        stop: Arc<AtomicBool>,
    ) -> Result<Self, Error> {
        let producer: Arc<TxnProducer> = Arc::new(producer_config.create()?);
        producer
            .init_transactions(options.request_timeout)
            .map_err(|e| match e.rdkafka_error_code() {
                // The one ACL the start-up check cannot ask the broker about.
                Some(RDKafkaErrorCode::TransactionalIdAuthorizationFailed) => {
                    Error::TransactionalIdForbidden(
                        producer_config
                            .get("transactional.id")
                            .unwrap_or_default()
                            .to_owned(),
                    )
                }
                _ => Error::Kafka(e),
            })?;
        let consumer = subscribed(consumer_config, &producer, &options)?;
        Ok(TxnLoop {
            consumer,
            consumer_config: consumer_config.clone(),
            producer,
            processor,
            options,
            health,
            stop,
        })
    }

    /// Runs until `stop` is set (then commits and returns) or a fatal error.
    pub fn run(mut self) -> Result<P, Error> {
        let mut backoff = self.backoff();
        tracing::info!(group = %self.options.group_id, topics = ?self.options.input_topics, "transactional loop started");
        while !self.stop.load(Ordering::Relaxed) {
            match self.batch() {
                Ok(()) => backoff.reset(),
                Err(BatchError::Retry(why)) => {
                    let wait = backoff.next_wait();
                    tracing::warn!(error = %why, backoff_ms = wait.as_millis() as u64, "batch aborted; retrying");
                    metrics::counter!(m::TXN_ABORTED_TOTAL).increment(1);
                    rewind(&self.consumer, self.options.request_timeout)?;
                    self.wait(wait);
                }
                Err(BatchError::Fatal(e)) => {
                    self.health.set_ready(false);
                    return Err(e);
                }
                Err(BatchError::ConsumerDead(e)) => self.rebuild_consumer(&e)?,
            }
        }
        tracing::info!("transactional loop stopping: last batch committed");
        self.consumer.unsubscribe();
        Ok(self.processor)
    }

    /// A consumer that failed fatally (a static member fenced after its session
    /// timed out) never delivers again. The open transaction is aborted, the
    /// processor gives up every partition, and a new consumer joins the group: its
    /// assignment restores state and resumes at the committed offsets.
    fn rebuild_consumer(&mut self, cause: &KafkaError) -> Result<(), Error> {
        metrics::counter!(m::CONSUMERS_REBUILT_TOTAL).increment(1);
        tracing::warn!(error = %cause, "consumer failed fatally; building a new one");
        let open = self
            .consumer
            .context()
            .with_open(|o| o.offsets.take().is_some());
        if open {
            abort_retrying(&self.producer, self.options.request_timeout)?;
            metrics::counter!(m::TXN_ABORTED_TOTAL).increment(1);
            self.processor.aborted();
        }
        let owned = self
            .consumer
            .assignment()
            .map(|tpl| partitions(&tpl))
            .unwrap_or_default();
        self.processor.revoked(&owned);
        let mut backoff = self.backoff();
        loop {
            match subscribed(&self.consumer_config, &self.producer, &self.options) {
                Ok(c) => {
                    // The old consumer's callbacks must not reach the processor again.
                    let old = std::mem::replace(&mut self.consumer, c);
                    old.context().with_open(|o| o.events.clear());
                    drop(old);
                    return Ok(());
                }
                Err(e) if !self.stop.load(Ordering::Relaxed) => {
                    tracing::warn!(error = %e, "consumer not built; retrying");
                    self.wait(backoff.next_wait());
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// From `retry_backoff`, doubled up to 32× while errors repeat.
    fn backoff(&self) -> crate::backoff::Backoff {
        crate::backoff::Backoff::new(self.options.retry_backoff, self.options.retry_backoff * 32)
    }

    fn wait(&self, d: Duration) {
        // Keep serving the group (heartbeats come from librdkafka's thread; this only
        // keeps rebalance callbacks timely) while backing off.
        let until = Instant::now() + d;
        while Instant::now() < until && !self.stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50).min(d));
        }
    }

    /// Records that `next` is the next offset of (topic, partition), for the revoke callback too.
    fn advance(&self, topic: &str, partition: i32, next: i64) {
        self.consumer.context().with_open(|o| {
            o.offsets
                .get_or_insert_with(Offsets::default)
                .advance(topic, partition, next)
        });
    }

    /// Takes the open transaction's offsets (None if a rebalance already committed them).
    fn take_offsets(&self) -> Option<TopicPartitionList> {
        self.consumer
            .context()
            .with_open(|o| o.offsets.take())
            .map(|o| o.to_list())
    }

    fn batch(&mut self) -> Result<(), BatchError> {
        let started = Instant::now();
        // The first iteration ticks: a transaction opened by `tick` gets a full batch.
        let mut last_tick = started.checked_sub(TICK_EVERY).unwrap_or(started);
        let mut open = false;
        let mut records = 0usize;
        while records < self.options.max_records && started.elapsed() < self.options.max_batch_time
        {
            self.health.beat();
            if last_tick.elapsed() >= TICK_EVERY {
                last_tick = Instant::now();
                self.tick(&mut open)?;
            }
            // Once a transaction is open, take only what is ready: when nothing
            // more is, commit at once, so a lone record does not wait out the batch
            // window; a burst is already queued and still fills the batch.
            // Idle, poll no longer than a tick, so processor timers fire on time.
            let polled = self
                .consumer
                .poll(if open { Duration::ZERO } else { TICK_EVERY });
            if handle_events(
                &self.consumer,
                &mut self.processor,
                self.options.request_timeout,
            )? && open
            {
                // The rebalance committed (or aborted and rewound) our transaction.
                return Ok(());
            }
            let msg = match polled {
                None => {
                    if self.stop.load(Ordering::Relaxed) || open {
                        break;
                    }
                    continue;
                }
                Some(Err(e @ KafkaError::MessageConsumptionFatal(_))) => {
                    return Err(BatchError::ConsumerDead(e));
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "consumer error");
                    continue;
                }
                Some(Ok(msg)) => msg,
            };
            self.begin(&mut open)?;
            let outputs = match self.processor.process(&input(&msg)) {
                Ok(outs) => outs,
                Err(e @ ProcessError::Poison(_)) => {
                    let reason = e.chain();
                    metrics::counter!(m::DEAD_LETTERS_TOTAL, "topic" => msg.topic().to_owned())
                        .increment(1);
                    tracing::warn!(
                        topic = msg.topic(),
                        partition = msg.partition(),
                        offset = msg.offset(),
                        error = %reason,
                        "record dead-lettered"
                    );
                    vec![dlq::dead_letter(
                        &self.options.dead_letter_topic,
                        &msg,
                        &reason,
                    )]
                }
                Err(ProcessError::Retriable(why)) => {
                    abort_open(
                        &self.producer,
                        &mut self.processor,
                        self.consumer.context(),
                        self.options.request_timeout,
                    )?;
                    return Err(BatchError::Retry(why.to_string()));
                }
                Err(ProcessError::Fatal(why)) => {
                    let _ = abort_open(
                        &self.producer,
                        &mut self.processor,
                        self.consumer.context(),
                        self.options.request_timeout,
                    );
                    return Err(BatchError::Fatal(Error::Fatal(why)));
                }
            };
            for out in &outputs {
                self.send(out)?;
            }
            self.advance(msg.topic(), msg.partition(), msg.offset() + 1);
            records += 1;
        }
        if records > 0 {
            metrics::counter!(m::RECORDS_PROCESSED_TOTAL).increment(records as u64);
        }
        if !open {
            return Ok(());
        }
        let Some(offsets) = self.take_offsets() else {
            return Ok(());
        };
        let committing = Instant::now();
        let result = self
            .consumer
            .group_metadata()
            .ok_or(KafkaError::Subscription("no group metadata".into()))
            .and_then(|cgm| {
                send_offsets(&self.producer, &offsets, &cgm, self.options.request_timeout)
            })
            .and_then(|()| commit(&self.producer, self.options.request_timeout));
        match result {
            Ok(()) => {
                metrics::counter!(m::TXN_COMMITTED_TOTAL).increment(1);
                metrics::histogram!(m::TXN_RECORDS).record(records as f64);
                metrics::histogram!(m::TXN_COMMIT_SECONDS)
                    .record(committing.elapsed().as_secs_f64());
                self.processor.committed();
                Ok(())
            }
            Err(e) => {
                abort(&self.producer, self.options.request_timeout, &e)
                    .map_err(|f| BatchError::Fatal(Error::Fatal(f.into())))?;
                self.processor.aborted();
                Err(BatchError::Retry(format!("commit failed: {e}")))
            }
        }
    }

    /// Opens a transaction unless one is open. Its offsets start empty, so the
    /// revoke callback commits it even if only `tick` wrote to it.
    fn begin(&self, open: &mut bool) -> Result<(), BatchError> {
        if !*open {
            self.producer.begin_transaction().map_err(classify)?;
            self.consumer
                .context()
                .with_open(|o| o.offsets.get_or_insert_with(Offsets::default).clear());
            *open = true;
        }
        Ok(())
    }

    fn tick(&mut self, open: &mut bool) -> Result<(), BatchError> {
        let outputs = match self.processor.tick() {
            Ok(outs) => outs,
            Err(e) => {
                if *open {
                    abort_open(
                        &self.producer,
                        &mut self.processor,
                        self.consumer.context(),
                        self.options.request_timeout,
                    )?;
                } else {
                    self.processor.aborted();
                }
                return Err(match e {
                    ProcessError::Retriable(why) => BatchError::Retry(why.to_string()),
                    other => BatchError::Fatal(Error::Fatal(other.into())),
                });
            }
        };
        if outputs.is_empty() {
            return Ok(());
        }
        self.begin(open)?;
        for out in &outputs {
            self.send(out)?;
        }
        Ok(())
    }

    fn send(&self, out: &Output) -> Result<(), BatchError> {
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&out.topic)
            .key(&out.key[..])
            .headers(crate::dlq::owned_headers(&out.headers));
        if let Some(p) = &out.payload {
            record = record.payload(&p[..]);
        }
        if let Some(p) = out.partition {
            record = record.partition(p);
        }
        loop {
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    // Backpressure: let the queue drain, then try again.
                    self.producer.poll(Duration::from_millis(100));
                    record = r;
                }
                Err((e, _)) => return Err(classify(e)),
            }
        }
    }
}

/// Acts on rebalance events. Returns true if the open transaction was closed by them.
fn handle_events<P: Processor>(
    consumer: &BaseConsumer<LoopContext>,
    processor: &mut P,
    timeout: Duration,
) -> Result<bool, BatchError> {
    let events = consumer
        .context()
        .with_open(|o| std::mem::take(&mut o.events));
    let mut closed = false;
    for ev in events {
        match ev {
            Event::Committed => {
                closed = true;
                metrics::counter!(m::TXN_COMMITTED_TOTAL).increment(1);
                processor.committed();
            }
            Event::Aborted => {
                closed = true;
                metrics::counter!(m::TXN_ABORTED_TOTAL).increment(1);
                processor.aborted();
                // Still-owned partitions must re-read what the aborted batch held.
                rewind(consumer, timeout).map_err(BatchError::Fatal)?;
            }
            Event::Fatal(why) => return Err(BatchError::Fatal(Error::Fatal(why.into()))),
            Event::Revoked(parts) => {
                tracing::info!(partitions = ?parts, "partitions revoked");
                processor.revoked(&parts);
            }
            Event::Assigned(parts) => {
                tracing::info!(partitions = ?parts, "partitions assigned");
                processor.assigned(&parts).map_err(|e| match e {
                    ProcessError::Fatal(s) => BatchError::Fatal(Error::Fatal(s)),
                    other => BatchError::Retry(other.chain()),
                })?;
            }
        }
    }
    Ok(closed)
}

/// Seeks every assigned partition back to its committed offset.
fn rewind(consumer: &BaseConsumer<LoopContext>, timeout: Duration) -> Result<(), Error> {
    let assignment = consumer.assignment()?;
    if assignment.count() == 0 {
        return Ok(());
    }
    let committed = consumer.committed_offsets(assignment, timeout)?;
    for e in committed.elements() {
        let to = match e.offset() {
            Offset::Offset(o) => Offset::Offset(o),
            _ => Offset::Beginning,
        };
        consumer.seek(e.topic(), e.partition(), to, timeout)?;
    }
    Ok(())
}

/// Next offset to commit per topic and partition (one entry each, however many records).
#[derive(Default)]
struct Offsets(std::collections::HashMap<String, std::collections::HashMap<i32, i64>>);

impl Offsets {
    fn clear(&mut self) {
        self.0.clear();
    }

    fn advance(&mut self, topic: &str, partition: i32, next: i64) {
        match self.0.get_mut(topic) {
            Some(parts) => {
                parts.insert(partition, next);
            }
            None => {
                self.0.insert(topic.to_owned(), [(partition, next)].into());
            }
        }
    }

    fn to_list(&self) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        for (topic, parts) in &self.0 {
            for (p, o) in parts {
                // Only fails for an invalid offset kind, and this is always a plain offset.
                let _ = tpl.add_partition_offset(topic, *p, Offset::Offset(*o));
            }
        }
        tpl
    }
}

/// Aborts the open transaction after a processor error.
fn abort_open<P: Processor>(
    producer: &TxnProducer,
    processor: &mut P,
    ctx: &LoopContext,
    timeout: Duration,
) -> Result<(), BatchError> {
    ctx.with_open(|o| o.offsets = None);
    abort_retrying(producer, timeout).map_err(|e| BatchError::Fatal(e.into()))?;
    processor.aborted();
    Ok(())
}

/// How often `Processor::tick` runs, and so the longest an idle poll waits.
const TICK_EVERY: Duration = Duration::from_millis(20);

enum BatchError {
    Retry(String),
    Fatal(Error),
    /// The consumer failed fatally: the loop builds a new one.
    ConsumerDead(KafkaError),
}

fn classify(e: KafkaError) -> BatchError {
    match &e {
        KafkaError::Transaction(t) if t.is_fatal() => BatchError::Fatal(Error::Kafka(e)),
        _ => BatchError::Retry(e.to_string()),
    }
}

fn input<'a>(msg: &'a BorrowedMessage<'a>) -> Input<'a> {
    let headers = msg
        .headers()
        .map(|h| {
            h.iter()
                .map(|x| (x.key, x.value.unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    Input {
        topic: msg.topic(),
        partition: msg.partition(),
        offset: msg.offset(),
        key: msg.key(),
        payload: msg.payload(),
        timestamp_ms: msg.timestamp().to_millis(),
        headers,
    }
}

/// How much one transaction takes: `SLUICE_BATCH_MAX_RECORDS` records or
/// `SLUICE_BATCH_MAX_MS`, whichever comes first.
#[derive(Clone, Copy, Debug)]
pub struct Batch {
    pub max_records: usize,
    pub max_time: Duration,
}

impl Batch {
    pub fn read(env: &mut crate::config::Env, default_records: usize) -> Batch {
        let max_records = env.parse("SLUICE_BATCH_MAX_RECORDS", default_records);
        let max_time = env.millis("SLUICE_BATCH_MAX_MS", Duration::from_millis(100));
        if max_records == 0 {
            env.problem("SLUICE_BATCH_MAX_RECORDS must be at least 1");
        }
        Batch {
            max_records,
            max_time,
        }
    }
}

/// What differs between the services that run the transactional loop.
pub struct LoopSpec {
    /// Names the loop in logs and in the service's error ("hook loop").
    pub task: &'static str,
    pub group_id: String,
    pub input_topics: Vec<String>,
    pub batch: Batch,
}

/// Runs `processor` on the transactional loop as a part of the service under
/// `supervisor`. Every service names its clients and its transactional id the
/// same way: one transactional id per instance (`<prefix><service>-<instance>`),
/// so a restarted instance fences its zombie; KIP-447 fencing across rebalances
/// uses the consumer's group metadata. The service is ready once the loop has
/// joined its group.
pub fn spawn<P: Processor + 'static>(
    supervisor: &mut crate::service::Supervisor,
    common: &crate::config::Common,
    health: &Health,
    stop: Arc<AtomicBool>,
    spec: LoopSpec,
    processor: P,
) {
    let client_id = common.client_id("");
    let consumer = common.kafka.consumer_config(&client_id, &spec.group_id);
    let producer = common.kafka.transactional_producer_config(
        &client_id,
        &format!(
            "{}{}-{}",
            common.topics.prefix, common.service, common.instance
        ),
    );
    let options = Options {
        group_id: spec.group_id,
        input_topics: spec.input_topics,
        dead_letter_topic: common.topics.name(crate::Topic::DeadLetter),
        max_records: spec.batch.max_records,
        max_batch_time: spec.batch.max_time,
        request_timeout: common.kafka.request_timeout,
        retry_backoff: Duration::from_millis(200),
    };
    let health = health.clone();
    supervisor.spawn_blocking(spec.task, move || {
        let l = TxnLoop::new(
            &consumer,
            &producer,
            processor,
            options,
            health.clone(),
            stop,
        )?;
        health.set_ready(true);
        l.run().map(|_| ())
    });
}
