//! The whole pipeline's benchmark: the four services as release processes on the
//! local stack (exactly once everywhere), commits pushed to the ingester at fixed
//! rates over 10,000 assets read by 1,000 dependencies (one in ten commits fires
//! one), measuring from the commit's push to each hop — the asset event, the
//! asset state, the trigger (each read `read_committed` as it appears) and the
//! dispatch at a webhook — p50 / p99 / max, then the sustained end-to-end rate of
//! commits pushed as fast as the pipeline takes them; beside, in the same run, the
//! physical floor: a record produced and read back `read_committed` through three
//! topics (two relays, the services' producer settings) at the same rates, and raw
//! produce throughput.
//!
//!   eval "$(compose/stack.sh env)"; cargo build --release --bins
//!   cargo run --release -p sluice-integration-tests --bin bench-pipeline -- [seconds per rate] [commits at full speed]
//!
//! Defaults: 10 s at 100/s, 1,000/s and 10,000/s; 100,000 commits at full speed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::post;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde_json::{Value, json};
use sluice_core::AssetEvent;
use sluice_integration_tests::pipeline::{Pipeline, TOKEN};
use sluice_integration_tests::{create_topic, kafka, produce_all, unique};
use sluice_kit::wire::{StateRecord, TriggerRecord};
use sluice_kit::{BlockingCodec, SchemaName, Topic};

const ASSETS: usize = 10_000;
const DEPENDENCIES: usize = 1_000;
const PARTITIONS: i32 = 4;
/// The fixed commit rates, each beside the floor measured at the same rate.
const RATES: [u64; 3] = [100, 1_000, 10_000];

fn asset(i: usize) -> String {
    format!("lake.bench.a{i:05}")
}

/// When each (asset, snapshot) was seen somewhere.
type Seen = Arc<Mutex<HashMap<(String, i64), Instant>>>;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

struct Latency {
    p50: f64,
    p99: f64,
    max: f64,
    n: usize,
}

fn latency(sent: &HashMap<(String, i64), Instant>, seen: &Seen) -> Latency {
    let seen = seen.lock().expect("lock");
    let mut ms: Vec<f64> = sent
        .iter()
        .filter_map(|(k, t0)| {
            seen.get(k)
                .map(|t| t.saturating_duration_since(*t0).as_secs_f64() * 1e3)
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    Latency {
        p50: percentile(&ms, 0.5),
        p99: percentile(&ms, 0.99),
        max: ms.last().copied().unwrap_or(f64::NAN),
        n: ms.len(),
    }
}

/// Notes when a measured floor record (its number as the payload) arrives.
fn note_arrival(last: &BaseConsumer, wait: Duration, seen: &Seen) {
    if let Some(Ok(m)) = last.poll(wait)
        && let Some(n) = std::str::from_utf8(m.payload().unwrap_or_default())
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
    {
        seen.lock()
            .expect("lock")
            .insert((String::new(), n), Instant::now());
    }
}

/// The floor: produce to A; a relay reads A and writes B, another B → C; a reader
/// of C sees it. Every reader is `read_committed`, every producer the services'.
fn floor_round_trip(topics: &[String], records: usize, rate: u64) -> Latency {
    let stop = Arc::new(AtomicBool::new(false));
    let reader = |topic: &str| {
        let c: BaseConsumer = kafka().reader_config(&unique("floor")).create().expect("c");
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, 0, Offset::End)
            .expect("tpl");
        c.assign(&tpl).expect("assign");
        c
    };
    let mut relays = Vec::new();
    for hop in 0..2 {
        let (from, to) = (topics[hop].clone(), topics[hop + 1].clone());
        let c = reader(&from);
        let stop = stop.clone();
        relays.push(std::thread::spawn(move || {
            let p: BaseProducer = kafka().producer_config("floor").create().expect("p");
            while !stop.load(Ordering::Relaxed) {
                if let Some(Ok(m)) = c.poll(Duration::from_millis(10)) {
                    let payload = m.payload().unwrap_or_default().to_vec();
                    let _ = p.send(BaseRecord::<(), _>::to(&to).payload(&payload));
                }
                p.poll(Duration::ZERO);
            }
        }));
    }
    let last = reader(&topics[2]);
    std::thread::sleep(Duration::from_secs(2)); // the relays' assignments take effect
    let p: BaseProducer = kafka().producer_config("floor").create().expect("p");
    // Warm-up, not measured: metadata and connections of every client in the path.
    let warm_until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < warm_until {
        let _ = p.send(BaseRecord::<(), _>::to(&topics[0]).payload("warm-up"));
        p.poll(Duration::ZERO);
        let next = Instant::now() + Duration::from_millis(10);
        while Instant::now() < next {
            let _ = last.poll(Duration::from_millis(1));
        }
    }
    let started = Instant::now();
    let mut sent = HashMap::new();
    let seen: Seen = Arc::default();
    for i in 0..records {
        let due = started + Duration::from_micros(i as u64 * 1_000_000 / rate);
        while Instant::now() < due {
            note_arrival(&last, Duration::from_micros(200), &seen);
            p.poll(Duration::ZERO);
        }
        let payload = i.to_string();
        sent.insert((String::new(), i as i64), Instant::now());
        let _ = p.send(BaseRecord::<(), _>::to(&topics[0]).payload(&payload));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.lock().expect("lock").len() < records && Instant::now() < deadline {
        note_arrival(&last, Duration::from_millis(10), &seen);
        p.poll(Duration::ZERO);
    }
    let _ = p.flush(Duration::from_secs(5));
    stop.store(true, Ordering::Relaxed);
    for r in relays {
        let _ = r.join();
    }
    latency(&sent, &seen)
}

/// Where a record says it carries (asset, snapshot) pairs.
type Keys = fn(&BlockingCodec, &[u8]) -> Vec<(String, i64)>;

fn event_keys(codec: &BlockingCodec, bytes: &[u8]) -> Vec<(String, i64)> {
    codec
        .decode::<AssetEvent>(SchemaName::AssetEvent, bytes)
        .map(|e| vec![(e.asset_key.to_string(), e.snapshot_id)])
        .unwrap_or_default()
}

fn state_keys(codec: &BlockingCodec, bytes: &[u8]) -> Vec<(String, i64)> {
    codec
        .decode::<StateRecord>(SchemaName::AssetState, bytes)
        .ok()
        .and_then(|s| Some((s.asset_key.to_string(), s.latest?.snapshot_id)))
        .into_iter()
        .collect()
}

fn trigger_keys(codec: &BlockingCodec, bytes: &[u8]) -> Vec<(String, i64)> {
    codec
        .decode::<TriggerRecord>(SchemaName::TriggerRequest, bytes)
        .map(|t| {
            t.inputs
                .into_iter()
                .map(|i| (i.asset_key, i.snapshot_id))
                .collect()
        })
        .unwrap_or_default()
}

/// Reads a topic `read_committed`, noting when each (asset, snapshot) first appears.
/// Returns, for each record, how long after its producer wrote it (CreateTime) it
/// became visible: the cost of the producing transaction's commit.
fn follow(
    topic: String,
    keys: Keys,
    seen: Seen,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<f64>> {
    std::thread::spawn(move || {
        let c: BaseConsumer = kafka()
            .reader_config(&unique("bp-follow"))
            .create()
            .expect("c");
        let mut tpl = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            tpl.add_partition_offset(&topic, p, Offset::End)
                .expect("tpl");
        }
        c.assign(&tpl).expect("assign");
        let codec = BlockingCodec::new(None).expect("codec");
        let mut visible_after = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            if let Some(Ok(m)) = c.poll(Duration::from_millis(50)) {
                let at = Instant::now();
                if let Some(created) = m.timestamp().to_millis() {
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_secs_f64() * 1e3)
                        .unwrap_or_default();
                    visible_after.push(now - created as f64);
                }
                let Some(bytes) = m.payload() else { continue };
                let mut seen = seen.lock().expect("lock");
                for k in keys(&codec, bytes) {
                    seen.entry(k).or_insert(at);
                }
            }
        }
        visible_after
    })
}

/// The commits the driver pushes: every asset in turn (a stride co-prime with
/// 10,000), each with its next snapshot; one asset in ten is read by a dependency.
struct Commits {
    next: usize,
    seq: Vec<i64>,
}

impl Commits {
    fn new() -> Commits {
        Commits {
            next: 0,
            seq: vec![0; ASSETS],
        }
    }

    /// The next commit, and the (asset, snapshot) a dependency fires on if it fires one.
    fn next(&mut self) -> (Value, Option<(String, i64)>) {
        let i = self.next % ASSETS;
        self.next += 7;
        self.seq[i] += 1;
        let fires = i.is_multiple_of(ASSETS / DEPENDENCIES);
        (
            commit(i, self.seq[i]),
            fires.then(|| (asset(i), self.seq[i])),
        )
    }
}

fn commit(i: usize, seq: i64) -> Value {
    json!({"asset_key": asset(i), "format": "paimon", "snapshot_id": seq, "sequence": seq,
           "commit_time_ms": 1_764_633_600_000i64 + seq, "operation": "append"})
}

async fn push(client: &reqwest::Client, url: &str, commits: Vec<Value>) {
    loop {
        let r = client
            .post(url)
            .bearer_auth(TOKEN)
            .json(&json!({"commits": commits}))
            .send()
            .await;
        match r {
            Ok(r) if r.status().is_success() => return,
            Ok(r) if r.status().as_u16() == 429 || r.status().as_u16() == 503 => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(r) => panic!(
                "push: {} {}",
                r.status(),
                r.text().await.unwrap_or_default()
            ),
            Err(e) => panic!("push: {e}"),
        }
    }
}

/// Waits until `seen` holds every key of `sent` (or `within` passes).
async fn wait_for(sent: &HashMap<(String, i64), Instant>, seen: &Seen, within: Duration) {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let all = {
            let s = seen.lock().expect("lock");
            sent.keys().all(|k| s.contains_key(k))
        };
        if all {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args()
        .skip(1)
        .map(|a| a.parse::<u64>().expect("a number"));
    let seconds = args.next().unwrap_or(10);
    let full_speed = args.next().unwrap_or(100_000) as usize;

    // The floor first, on a quiet machine.
    let mut floor_topics = Vec::new();
    for _ in 0..3 * RATES.len() {
        floor_topics.push(create_topic(1).await);
    }
    let floors: Vec<Latency> = RATES
        .iter()
        .zip(floor_topics.chunks(3))
        .map(|(&rate, topics)| {
            let records = (rate * 5).max(1_000) as usize;
            tokio::task::block_in_place(|| floor_round_trip(topics, records, rate))
        })
        .collect();
    let raw_topic = create_topic(PARTITIONS).await;
    let raw: Vec<(String, Vec<u8>)> = (0..200_000)
        .map(|i| {
            (
                asset(i % ASSETS),
                commit(i % ASSETS, i as i64).to_string().into_bytes(),
            )
        })
        .collect();
    let raw_produce = produce_all(&raw_topic, &raw);

    // The pipeline, with a webhook that notes each dispatch.
    let dispatched: Seen = Arc::default();
    let d = dispatched.clone();
    let port = sluice_integration_tests::serve(axum::Router::new().route(
        "/hook",
        post(move |body: String| {
            let d = d.clone();
            async move {
                let at = Instant::now();
                if let Ok(v) = serde_json::from_str::<Value>(&body) {
                    for i in v["inputs"].as_array().into_iter().flatten() {
                        if let (Some(a), Some(s)) = (i["asset"].as_str(), i["snapshot_id"].as_i64())
                        {
                            d.lock().expect("lock").insert((a.to_owned(), s), at);
                        }
                    }
                }
                "ok"
            }
        }),
    ))
    .await;
    let mut p = Pipeline::new(PARTITIONS, &[]).await;
    p.set(
        "dispatcher",
        "SLUICE_TARGETS",
        format!(r#"[{{"kind": "webhook", "name": "*", "url": "http://127.0.0.1:{port}/hook", "idempotent": true, "max_in_flight": 256}}]"#),
    );
    p.start_all().await;
    let specs: Vec<Value> = (0..DEPENDENCIES)
        .map(|d| {
            json!({"id": format!("dep-{d:04}"), "version": 1, "owner_project": "bench",
                   "target": {"kind": "webhook", "name": "bench"},
                   "condition": {"input": {"asset": asset(d * ASSETS / DEPENDENCIES)}}})
        })
        .collect();
    let file = std::env::temp_dir().join(unique("bp-specs.json"));
    std::fs::write(&file, Value::Array(specs).to_string()).expect("specs");
    let out = p.cli(&["apply", &file.to_string_lossy()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (ingested, folded, triggered): (Seen, Seen, Seen) = Default::default();
    let stop = Arc::new(AtomicBool::new(false));
    let followers = [
        (Topic::AssetEvents, event_keys as Keys, &ingested),
        (Topic::AssetState, state_keys, &folded),
        (Topic::Triggers, trigger_keys, &triggered),
    ]
    .map(|(topic, keys, seen)| follow(p.names.name(topic), keys, seen.clone(), stop.clone()));
    let client = reqwest::Client::new();
    let url = p.push_url();
    let mut commits = Commits::new();

    // Warm-up: every asset once (every dependency fires once).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut warm = HashMap::new();
    for _ in 0..ASSETS / 500 {
        let batch = (0..500)
            .map(|_| {
                let (c, fired) = commits.next();
                warm.extend(fired.map(|k| (k, Instant::now())));
                c
            })
            .collect();
        push(&client, &url, batch).await;
    }
    wait_for(&warm, &dispatched, Duration::from_secs(120)).await;
    let warmed = latency(&warm, &dispatched).n;
    assert_eq!(
        warmed,
        DEPENDENCIES,
        "warm-up: every dependency dispatched once\n{}",
        p.log_tails(20)
    );

    // Fixed rates, on a schedule; one commit in ten fires.
    let mut rows = Vec::new();
    for rate in RATES {
        // One commit per request up to 1,000/s; above, a request a millisecond.
        let per_request = (rate / 1_000).max(1) as usize;
        let n = (rate * seconds) as usize;
        let mut sent = HashMap::new();
        let mut tasks = tokio::task::JoinSet::new();
        let started = Instant::now();
        for k in 0..n / per_request {
            let due = started + Duration::from_micros((k * per_request) as u64 * 1_000_000 / rate);
            tokio::time::sleep_until(due.into()).await;
            let batch = (0..per_request)
                .map(|_| {
                    let (c, fired) = commits.next();
                    sent.extend(fired.map(|k| (k, Instant::now())));
                    c
                })
                .collect();
            let (client, url) = (client.clone(), url.clone());
            tasks.spawn(async move { push(&client, &url, batch).await });
        }
        while tasks.join_next().await.is_some() {}
        wait_for(&sent, &dispatched, Duration::from_secs(60)).await;
        let hops = [&ingested, &folded, &triggered, &dispatched].map(|s| latency(&sent, s));
        assert_eq!(
            hops[3].n,
            sent.len(),
            "every firing commit dispatched at {rate}/s\n{}",
            p.log_tails(20)
        );
        rows.push((rate, hops));
    }

    // As fast as it takes: batches of 500, 8 requests in flight. Commits that
    // arrive together fold into one state (a dependency fires once for the newest
    // snapshot, not once per commit), so the pipeline has caught up when every
    // firing asset's last commit is dispatched.
    let mut last = HashMap::new();
    let mut batches = Vec::new();
    for _ in 0..full_speed.div_ceil(500) {
        let batch = (0..500)
            .map(|_| {
                let (c, fired) = commits.next();
                last.extend(fired);
                c
            })
            .collect::<Vec<_>>();
        batches.push(batch);
    }
    let sent: HashMap<(String, i64), Instant> =
        last.into_iter().map(|k| (k, Instant::now())).collect();
    batches.reverse(); // popped from the end: the oldest first
    let started = Instant::now();
    let queue = Arc::new(Mutex::new(batches));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (client, url, queue) = (client.clone(), url.clone(), queue.clone());
        tasks.spawn(async move {
            loop {
                let Some(b) = queue.lock().expect("lock").pop() else {
                    return;
                };
                push(&client, &url, b).await;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let accepted = started.elapsed().as_secs_f64();
    wait_for(&sent, &dispatched, Duration::from_secs(300)).await;
    let end = sent
        .keys()
        .filter_map(|k| dispatched.lock().expect("lock").get(k).copied())
        .max()
        .expect("dispatches");
    let total = end.saturating_duration_since(started).as_secs_f64();
    let done = latency(&sent, &dispatched).n;
    assert_eq!(
        done,
        sent.len(),
        "every dependency dispatched with its last commit at full speed\n{}",
        p.log_tails(20)
    );
    stop.store(true, Ordering::Relaxed);
    let visible_after = followers.map(|f| {
        let mut ms = f.join().unwrap_or_default();
        ms.sort_by(f64::total_cmp);
        ms
    });

    let commits = (full_speed.div_ceil(500) * 500) as f64;
    println!(
        "\nbench-pipeline: {ASSETS} assets, {DEPENDENCIES} dependencies, {PARTITIONS} partitions, exactly once; one in ten commits fires"
    );
    println!("| what | p50 | p99 | max | vs floor (p50) |");
    println!("| --- | --- | --- | --- | --- |");
    for (rate, floor) in RATES.iter().zip(&floors) {
        println!(
            "| floor at {rate}/s: produce → read_committed through 3 topics ({} records) | {:.1} ms | {:.1} ms | {:.1} ms | 1 |",
            floor.n, floor.p50, floor.p99, floor.max
        );
    }
    for ((rate, hops), floor) in rows.iter().zip(&floors) {
        let stages = [
            "commit → asset event (ingester)",
            "commit → asset state (state-updater)",
            "commit → trigger (resolver)",
            "commit → dispatch to a webhook (dispatcher)",
        ];
        for (what, l) in stages.iter().zip(hops) {
            println!(
                "| {rate} commits/s: {what}, {} commits | {:.1} ms | {:.1} ms | {:.1} ms | {:.1}× |",
                l.n,
                l.p50,
                l.p99,
                l.max,
                l.p50 / floor.p50
            );
        }
    }
    println!("\n| written → visible to read_committed (whole run) | p50 | p99 |");
    println!("| --- | --- | --- |");
    for (what, ms) in ["asset events", "asset state", "triggers"]
        .iter()
        .zip(&visible_after)
    {
        println!(
            "| {what} | {:.1} ms | {:.1} ms |",
            percentile(ms, 0.5),
            percentile(ms, 0.99)
        );
    }
    println!("\n| what | rate | vs raw produce |");
    println!("| --- | --- | --- |");
    println!(
        "| raw produce (idempotent, acks=all), 200,000 commit notices | {raw_produce:.0} /s | 1 |"
    );
    println!(
        "| {commits:.0} commits pushed at full speed, accepted by the ingester | {:.0} commits/s | {:.2}× |",
        commits / accepted,
        commits / accepted / raw_produce
    );
    println!(
        "| the same, end to end (until the {done} dependencies have the last commits dispatched) | {:.0} commits/s | {:.2}× |",
        commits / total,
        commits / total / raw_produce
    );
}
