//! The one factory for Kafka clients, with Sluice's defaults made explicit.
//!
//! Raw librdkafka settings pass through from `SLUICE_RDKAFKA_<NAME>` (`_` → `.`,
//! `__` → `_`), e.g. `SLUICE_RDKAFKA_SECURITY_PROTOCOL=SASL_SSL`; they override
//! the defaults below.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::AdminClient;
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::FromClientConfigAndContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::BaseProducer;

use crate::config::Env;

#[derive(Clone, Debug)]
pub struct KafkaOptions {
    pub bootstrap: String,
    /// librdkafka properties from the environment, already mapped to dotted names.
    pub raw: BTreeMap<String, String>,
    /// Timeout of blocking client calls (init / commit transaction, metadata).
    pub request_timeout: Duration,
}

impl KafkaOptions {
    pub fn read(env: &mut Env) -> Self {
        let raw = env
            .with_prefix("SLUICE_RDKAFKA_")
            .into_iter()
            .map(|(k, v)| (rdkafka_name(&k), v))
            .collect();
        KafkaOptions {
            bootstrap: env.string("SLUICE_KAFKA_BOOTSTRAP", "127.0.0.1:19092"),
            raw,
            request_timeout: env.millis("SLUICE_KAFKA_REQUEST_TIMEOUT_MS", Duration::from_secs(30)),
        }
    }

    /// For tests and tools: just a bootstrap address.
    pub fn local(bootstrap: &str) -> Self {
        KafkaOptions {
            bootstrap: bootstrap.to_owned(),
            raw: BTreeMap::new(),
            request_timeout: Duration::from_secs(30),
        }
    }

    fn base(&self, client_id: &str) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.bootstrap)
            .set("client.id", client_id)
            .set("socket.keepalive.enable", "true")
            // Reconnect quickly after a broker restart, back off to 10 s.
            .set("reconnect.backoff.ms", "100")
            .set("reconnect.backoff.max.ms", "10000");
        c
    }

    fn finish(&self, mut c: ClientConfig) -> ClientConfig {
        for (k, v) in &self.raw {
            c.set(k, v);
        }
        c
    }

    /// An idempotent producer: acks=all, no duplicates on retry, order kept per partition.
    pub fn producer_config(&self, client_id: &str) -> ClientConfig {
        self.finish(self.producer_defaults(client_id))
    }

    fn producer_defaults(&self, client_id: &str) -> ClientConfig {
        let mut c = self.base(client_id);
        // murmur2 as the Java client does, so a key lands on the same partition
        // whichever client wrote it (asset-events and asset-state must co-partition).
        c.set("enable.idempotence", "true")
            .set("partitioner", "murmur2_random")
            .set("acks", "all")
            .set("linger.ms", "5")
            .set("message.timeout.ms", "120000")
            .set("compression.type", "none");
        c
    }

    /// A transactional producer. `transactional_id` must be stable per input
    /// partition set / instance, so a restarted instance fences its zombie.
    pub fn transactional_producer_config(
        &self,
        client_id: &str,
        transactional_id: &str,
    ) -> ClientConfig {
        let mut c = self.producer_defaults(client_id);
        // librdkafka requires message.timeout.ms <= transaction.timeout.ms.
        c.set("transactional.id", transactional_id)
            .set("transaction.timeout.ms", "60000")
            .set("message.timeout.ms", "55000")
            // A transaction that begins while the broker still writes the last
            // one's markers is refused (CONCURRENT_TRANSACTIONS) and retried after
            // this backoff: at the default 100 ms, every other commit of a busy
            // stage waited 100 ms (bench-pipeline: commit → state p50 139 ms, 10 ms
            // with 5; the Java client lowered this backoff for the same reason,
            // KAFKA-5477). Failures still back off exponentially to retry.backoff.max.ms.
            .set("retry.backoff.ms", "5")
            // The loop commits as soon as its input has nothing more ready; what a
            // batch produced is already queued, so lingering only delays the commit.
            .set("linger.ms", "1");
        self.finish(c)
    }

    /// A consumer that sees only committed data and never commits on its own.
    pub fn consumer_config(&self, client_id: &str, group_id: &str) -> ClientConfig {
        let mut c = self.base(client_id);
        // Static membership (KIP-345): a restarted instance (same client id) takes its
        // partitions back at once instead of after the dead member's session times
        // out, which after a kill -9 stalled its partitions for the session timeout.
        c.set("group.id", group_id)
            .set("group.instance.id", client_id)
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set("session.timeout.ms", "15000")
            .set("heartbeat.interval.ms", "1000")
            .set("max.poll.interval.ms", "300000");
        self.finish(c)
    }

    /// A consumer with no group, for reading a topic as a table (restore, global state).
    pub fn reader_config(&self, client_id: &str) -> ClientConfig {
        let mut c = self.base(client_id);
        c.set("group.id", format!("{client_id}-reader"))
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest");
        self.finish(c)
    }

    pub fn admin(&self, client_id: &str) -> Result<AdminClient<DefaultClientContext>, KafkaError> {
        AdminClient::from_config_and_context(
            &self.finish(self.base(client_id)),
            DefaultClientContext,
        )
    }

    /// A client that only connects, so that [`Refusals`] sees the broker refuse
    /// our credentials: poll it (an admin client serves no callbacks).
    pub fn probe(&self, client_id: &str) -> Result<BaseProducer<Refusals>, KafkaError> {
        BaseProducer::from_config_and_context(
            &self.finish(self.base(client_id)),
            Refusals::default(),
        )
    }
}

/// A client context that keeps the first refusal of our credentials or of the
/// TLS handshake (a wrong SASL password, an unknown mechanism, a certificate the CA
/// does not sign). librdkafka reports these through the error callback and keeps
/// retrying, so a start-up that waits for the broker would wait for ever; the
/// services' start fails with this reason instead.
#[derive(Default)]
pub struct Refusals {
    first: Mutex<Option<String>>,
}

impl Refusals {
    pub fn refusal(&self) -> Option<String> {
        self.first.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl rdkafka::producer::ProducerContext for Refusals {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: ()) {}
}

impl ClientContext for Refusals {
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::error!(error = %error, "librdkafka: {reason}");
        if matches!(
            error.rdkafka_error_code(),
            Some(RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SSL)
        ) {
            self.first
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert_with(|| reason.to_owned());
        }
    }
}

/// `SECURITY_PROTOCOL` → `security.protocol`; `__` keeps an underscore.
fn rdkafka_name(env_suffix: &str) -> String {
    env_suffix
        .to_ascii_lowercase()
        .replace("__", "\u{0}")
        .replace('_', ".")
        .replace('\u{0}', "_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_settings_pass_through_and_win() {
        let mut env = Env::from_map([
            ("SLUICE_RDKAFKA_SESSION_TIMEOUT_MS", "6000"),
            ("SLUICE_RDKAFKA_SASL_OAUTHBEARER_CLIENT__ID", "x"),
        ]);
        let k = KafkaOptions::read(&mut env);
        let c = k.consumer_config("c", "g");
        assert_eq!(c.get("session.timeout.ms"), Some("6000"));
        assert_eq!(c.get("sasl.oauthbearer.client_id"), Some("x"));
        assert_eq!(c.get("isolation.level"), Some("read_committed"));
    }
}

/// The context of a reader that asks for end-of-partition events: reaching the
/// end is how a reader knows it caught up, not an error, so librdkafka's report
/// of it is logged at DEBUG (the default context logs it at ERROR on every start).
pub struct ReaderContext;

impl rdkafka::ClientContext for ReaderContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if matches!(
            error,
            KafkaError::PartitionEOF(_)
                | KafkaError::Global(rdkafka::types::RDKafkaErrorCode::PartitionEOF)
        ) {
            tracing::debug!(reason, "end of partition");
        } else {
            tracing::error!(error = %error, reason, "librdkafka error");
        }
    }
}

impl rdkafka::consumer::ConsumerContext for ReaderContext {}

/// A group-less reader over `config` with end-of-partition events on.
///
/// Tuned to read a topic to its end as fast as the broker serves it (measured with
/// bench-resolver's restore, which took ~1 s or ~2 s for the same records):
/// librdkafka stops fetching a partition for `fetch.queue.backoff.ms` (1 s) each
/// time its local queue holds `queued.min.messages`, which stalled a restore a
/// whole second mid-read; and the last partition's end was reported only when its
/// long-poll fetch returned, up to `fetch.wait.max.ms` (500 ms by default) late.
pub fn reader(
    config: &ClientConfig,
) -> Result<rdkafka::consumer::BaseConsumer<ReaderContext>, KafkaError> {
    let mut config = config.clone();
    config
        .set("enable.partition.eof", "true")
        .set("fetch.queue.backoff.ms", "10")
        .set("fetch.wait.max.ms", "100");
    config.create_with_context(ReaderContext)
}

/// The partition the producers (librdkafka `murmur2_random`, the Java client's
/// default) put `key` on: `(murmur2(key) & 0x7fffffff) % partitions`. Lets a
/// reader go straight to one key's partition (the API reading an asset's commits).
pub fn partition_for(key: &[u8], partitions: i32) -> i32 {
    if partitions <= 0 {
        return 0;
    }
    (murmur2(key) & 0x7fff_ffff) as i32 % partitions
}

/// Kafka's murmur2 (seed 0x9747b28c), as `org.apache.kafka.common.utils.Utils`.
fn murmur2(data: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = 0x9747_b28c ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if let Some(&b) = rest.first() {
        h ^= u32::from(b);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

#[cfg(test)]
mod partition_tests {
    use super::partition_for;

    /// Vectors from the Java client (`Utils.toPositive(Utils.murmur2(key)) % n`).
    #[test]
    fn keys_land_where_the_java_client_puts_them() {
        // Utils.murmur2("21".getBytes()) == -973932308, ("foobar") == -790332482
        // (Kafka's UtilsTest.testMurmur2).
        assert_eq!(
            partition_for(b"21", 1_000_000),
            (-973_932_308i32 & 0x7fff_ffff) % 1_000_000
        );
        assert_eq!(
            partition_for(b"foobar", 1_000_000),
            (-790_332_482i32 & 0x7fff_ffff) % 1_000_000
        );
        assert_eq!(
            partition_for(b"a-little-bit-long-string", 1_000_000),
            (-985_981_536i32 & 0x7fff_ffff) % 1_000_000
        );
    }
}
