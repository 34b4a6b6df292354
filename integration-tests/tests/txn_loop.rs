//! The shared transactional loop against the real broker: many records per
//! transaction, exactly-once outputs across an abort-and-rewind, poison records
//! dead-lettered with their origin, fatal errors ending the loop, and a second
//! instance joining mid-run (cooperative-sticky rebalance) without loss or doubling.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use sluice_integration_tests::{committed_total, create_topic, kafka, unique};
use sluice_kit::Health;
use sluice_kit::dlq;
use sluice_kit::txn::{Input, Options, Output, ProcessError, Processor, TxnLoop};

const T: Duration = Duration::from_secs(30);

fn produce(topic: &str, partitions: i32, payloads: &[String]) {
    let p: BaseProducer = kafka()
        .producer_config("loop-test")
        .create()
        .expect("producer");
    for (i, v) in payloads.iter().enumerate() {
        let part = i as i32 % partitions;
        let key = format!("k{i}");
        p.send(BaseRecord::to(topic).partition(part).key(&key).payload(v))
            .expect("send");
    }
    p.flush(T).expect("flush");
}

/// Uppercases payloads; "poison…" is poison; "flaky…" fails once (an outage), then works.
struct Upper {
    out: String,
    flaky_failed: Arc<AtomicBool>,
    aborts: Arc<AtomicUsize>,
    commits: Arc<AtomicUsize>,
    fatal_on: Option<String>,
}

impl Processor for Upper {
    fn process(&mut self, input: &Input<'_>) -> Result<Vec<Output>, ProcessError> {
        let payload = String::from_utf8_lossy(input.payload.unwrap_or_default()).to_string();
        if self.fatal_on.as_deref() == Some(payload.as_str()) {
            return Err(ProcessError::fatal(format!(
                "invariant broken by {payload}"
            )));
        }
        if payload.starts_with("poison") {
            return Err(ProcessError::poison(format!("cannot parse {payload:?}")));
        }
        if payload.starts_with("flaky") && !self.flaky_failed.swap(true, Ordering::SeqCst) {
            return Err(ProcessError::Retriable("registry unavailable".into()));
        }
        Ok(vec![Output {
            topic: self.out.clone(),
            partition: None,
            key: input.key.unwrap_or_default().to_vec(),
            payload: Some(payload.to_uppercase().into_bytes()),
            headers: vec![],
        }])
    }
    fn committed(&mut self) {
        self.commits.fetch_add(1, Ordering::SeqCst);
    }
    fn aborted(&mut self) {
        self.aborts.fetch_add(1, Ordering::SeqCst);
    }
}

struct Harness {
    input: String,
    output: String,
    dlq: String,
    group: String,
    aborts: Arc<AtomicUsize>,
    commits: Arc<AtomicUsize>,
    flaky_failed: Arc<AtomicBool>,
}

impl Harness {
    async fn new(partitions: i32) -> Self {
        Harness {
            input: create_topic(partitions).await,
            output: create_topic(1).await,
            dlq: create_topic(1).await,
            group: unique("group"),
            aborts: Arc::default(),
            commits: Arc::default(),
            flaky_failed: Arc::default(),
        }
    }

    fn start(
        &self,
        instance: &str,
        fatal_on: Option<&str>,
    ) -> (Arc<AtomicBool>, std::thread::JoinHandle<Result<(), String>>) {
        let stop = Arc::new(AtomicBool::new(false));
        let processor = Upper {
            out: self.output.clone(),
            flaky_failed: self.flaky_failed.clone(),
            aborts: self.aborts.clone(),
            commits: self.commits.clone(),
            fatal_on: fatal_on.map(str::to_owned),
        };
        let options = Options {
            group_id: self.group.clone(),
            input_topics: vec![self.input.clone()],
            dead_letter_topic: self.dlq.clone(),
            max_records: 50,
            max_batch_time: Duration::from_millis(300),
            request_timeout: T,
            retry_backoff: Duration::from_millis(100),
        };
        let k = kafka();
        let consumer = k.consumer_config(&format!("loop-{instance}"), &self.group);
        let producer = k.transactional_producer_config(&format!("loop-{instance}"), &unique("txn"));
        let stop2 = stop.clone();
        let handle = std::thread::spawn(move || {
            let l = TxnLoop::new(
                &consumer,
                &producer,
                processor,
                options,
                Health::new(T),
                stop2,
            )
            .map_err(|e| e.to_string())?;
            l.run().map(|_| ()).map_err(|e| e.to_string())
        });
        (stop, handle)
    }
}

/// Everything committed on `topic`, as (key, payload, headers).
fn read_committed(
    topic: &str,
    partitions: i32,
    expect: usize,
    wait: Duration,
) -> Vec<(String, String, BTreeMap<String, String>)> {
    let c: BaseConsumer = kafka()
        .reader_config(&unique("reader"))
        .create()
        .expect("reader");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("tpl");
    }
    c.assign(&tpl).expect("assign");
    let mut out = Vec::new();
    let deadline = Instant::now() + wait;
    // Keep reading a little past `expect` so duplicates would show up.
    let mut settle = None;
    while Instant::now() < deadline {
        if out.len() >= expect && settle.is_none() {
            settle = Some(Instant::now() + Duration::from_secs(2));
        }
        if settle.is_some_and(|s| Instant::now() > s) {
            break;
        }
        if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
            let headers = m
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|x| {
                            (
                                x.key.to_owned(),
                                String::from_utf8_lossy(x.value.unwrap_or_default()).to_string(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            out.push((
                String::from_utf8_lossy(m.key().unwrap_or_default()).to_string(),
                String::from_utf8_lossy(m.payload().unwrap_or_default()).to_string(),
                headers,
            ));
        }
    }
    out
}

fn wait_until(timeout: Duration, f: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    false
}

#[tokio::test(flavor = "multi_thread")]
async fn outputs_are_exactly_once_across_an_abort_and_poison_is_dead_lettered() {
    let h = Harness::new(2).await;
    let mut payloads: Vec<String> = (0..300).map(|i| format!("rec-{i}")).collect();
    payloads[120] = "flaky-120".into();
    payloads[200] = "poison-200".into();
    produce(&h.input, 2, &payloads);
    let (stop, handle) = h.start("a", None);
    assert!(
        wait_until(Duration::from_secs(60), || committed_total(
            &h.group, &h.input, 2
        )
        .unwrap_or(0)
            == 300),
        "all 300 offsets committed"
    );
    stop.store(true, Ordering::SeqCst);
    handle.join().expect("thread").expect("loop ended cleanly");

    let out = read_committed(&h.output, 1, 299, Duration::from_secs(30));
    let mut payloads_out: Vec<String> = out.iter().map(|(_, p, _)| p.clone()).collect();
    payloads_out.sort();
    let mut expected: Vec<String> = payloads
        .iter()
        .filter(|p| !p.starts_with("poison"))
        .map(|p| p.to_uppercase())
        .collect();
    expected.sort();
    assert_eq!(
        payloads_out, expected,
        "every good record exactly once, none from the aborted batch twice"
    );
    assert!(
        h.aborts.load(Ordering::SeqCst) >= 1,
        "the flaky record aborted a batch"
    );
    assert!(
        h.commits.load(Ordering::SeqCst) >= 2,
        "many records per transaction, several transactions"
    );
    assert!(
        h.commits.load(Ordering::SeqCst) < 300,
        "not one transaction per record"
    );

    let dead = read_committed(&h.dlq, 1, 1, Duration::from_secs(20));
    assert_eq!(dead.len(), 1, "one dead letter: {dead:?}");
    let (key, payload, headers) = &dead[0];
    assert_eq!(
        (key.as_str(), payload.as_str()),
        ("k200", "poison-200"),
        "original bytes kept"
    );
    assert_eq!(headers.get(dlq::HEADER_TOPIC), Some(&h.input));
    assert_eq!(
        headers.get(dlq::HEADER_PARTITION).map(String::as_str),
        Some("0")
    );
    assert_eq!(
        headers.get(dlq::HEADER_OFFSET).map(String::as_str),
        Some("100"),
        "record 200 is the 101st on partition 0"
    );
    assert!(
        headers
            .get(dlq::HEADER_ERROR)
            .is_some_and(|e| e.contains("cannot parse"))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fatal_error_ends_the_loop_and_commits_nothing_of_its_batch() {
    let h = Harness::new(1).await;
    let payloads: Vec<String> = (0..20).map(|i| format!("rec-{i}")).collect();
    produce(&h.input, 1, &payloads);
    let (_stop, handle) = h.start("a", Some("rec-10"));
    let result = handle.join().expect("thread");
    let err = result.expect_err("fatal ends the loop");
    assert!(err.contains("invariant broken by rec-10"), "{err}");
    let committed = committed_total(&h.group, &h.input, 1).unwrap_or(0);
    assert!(
        committed <= 10,
        "nothing at or after the fatal record is committed ({committed})"
    );
    let out = read_committed(&h.output, 1, committed as usize, Duration::from_secs(10));
    assert_eq!(
        out.len() as i64,
        committed,
        "outputs match committed offsets exactly"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_instance_joining_mid_run_loses_and_doubles_nothing() {
    let h = Harness::new(4).await;
    let payloads: Vec<String> = (0..4000).map(|i| format!("rec-{i}")).collect();
    produce(&h.input, 4, &payloads);
    let (stop_a, a) = h.start("a", None);
    assert!(wait_until(Duration::from_secs(60), || committed_total(
        &h.group, &h.input, 4
    )
    .unwrap_or(0)
        > 200));
    let (stop_b, b) = h.start("b", None);
    assert!(
        wait_until(Duration::from_secs(120), || committed_total(
            &h.group, &h.input, 4
        )
        .unwrap_or(0)
            == 4000),
        "all offsets committed by the pair"
    );
    stop_a.store(true, Ordering::SeqCst);
    stop_b.store(true, Ordering::SeqCst);
    a.join().expect("thread").expect("a ended cleanly");
    b.join().expect("thread").expect("b ended cleanly");
    let out = read_committed(&h.output, 1, 4000, Duration::from_secs(60));
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for (_, p, _) in &out {
        *counts.entry(p.clone()).or_default() += 1;
    }
    let doubled: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(doubled.is_empty(), "doubled outputs: {doubled:?}");
    assert_eq!(counts.len(), 4000, "lost outputs: {}", 4000 - counts.len());
}
