//! Ingester benchmark (real broker, measured in the same run): accepted HTTP
//! commits/s — one commit per request at 64 concurrent requests, and batches of 500
//! — and Kafka commit-hook events/s through the exactly-once loop (JSON notices, and
//! Debezium Avro change events read through a schema registry), beside the raw
//! produce rate of the same events and the raw consume of each hook topic.
//!
//!   eval "$(compose/stack.sh env)"; cargo run --release -p sluice-integration-tests --bin bench-ingester -- [single] [batched] [hook] [cdc]
//!
//! Defaults: 20,000 single-commit requests, 200,000 commits in batches, 200,000
//! JSON hook records, 100,000 Debezium Avro records (written by confluent-kafka from
//! the lake venv, `compose/ensure-venv.sh`; the registry is the test stand-in). The ingester runs in process; clients share its two cores.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sluice_core::{AssetEvent, AssetKey, EventSource, TableFormat};
use sluice_integration_tests::{
    committed_total, create_topic, free_port, produce_all, raw_consume, unique,
};
use sluice_kit::config::Env;
use sluice_kit::topics::TopicNames;
use sluice_kit::{Codec, SchemaName, Shutdown};

const PARTITIONS: i32 = 4;
const TOKEN: &str = "bench-token-0123456789";

fn notice(i: usize) -> serde_json::Value {
    serde_json::json!({"asset_key": format!("lake.bench.t{:05}", i % 10_000), "format": "paimon",
        "snapshot_id": i, "sequence": i, "commit_time_ms": 1_700_000_000_000i64 + i as i64})
}

/// `hooks`: the `SLUICE_HOOK_TOPICS` JSON, if any.
fn options(names: &TopicNames, http: u16, hooks: Option<String>) -> sluice_ingester::Options {
    let mut env: BTreeMap<String, String> = [
        (
            "SLUICE_KAFKA_BOOTSTRAP",
            sluice_integration_tests::bootstrap(),
        ),
        ("SLUICE_TOPIC_PREFIX", names.prefix.clone()),
        ("SLUICE_TOPIC_PARTITIONS", PARTITIONS.to_string()),
        ("SLUICE_ADMIN_ADDR", format!("127.0.0.1:{}", free_port())),
        ("SLUICE_INGEST_HTTP_ADDR", format!("127.0.0.1:{http}")),
        (
            "SLUICE_INGEST_TOKENS",
            format!(r#"[{{"name": "bench", "token": "{TOKEN}", "namespaces": ["lake.bench"]}}]"#),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    if let Some(hooks) = hooks {
        env.insert("SLUICE_HOOK_TOPICS".into(), hooks);
    }
    sluice_ingester::Options::read(Env::from_map(env)).expect("options")
}

async fn wait_http(url: &str) {
    let c = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while c.post(url).send().await.is_err() {
        assert!(Instant::now() < deadline, "ingester HTTP not up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn http(single: usize, batched: usize) -> (f64, f64) {
    let names = TopicNames::with_prefix(&format!("{}.", unique("bi")), PARTITIONS);
    let port = free_port();
    let shutdown = Shutdown::new();
    let service = tokio::spawn(sluice_ingester::run(
        options(&names, port, None),
        shutdown.clone(),
    ));
    let url = format!("http://127.0.0.1:{port}/v1/commits");
    wait_http(&url).await;
    let client = reqwest::Client::new();

    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    const CONCURRENCY: usize = 64;
    for w in 0..CONCURRENCY {
        let (client, url) = (client.clone(), url.clone());
        tasks.spawn(async move {
            let mut ok = 0usize;
            for i in (w..single).step_by(CONCURRENCY) {
                let r = client
                    .post(&url)
                    .bearer_auth(TOKEN)
                    .json(&notice(i))
                    .send()
                    .await;
                ok += usize::from(r.is_ok_and(|r| r.status() == 200));
            }
            ok
        });
    }
    let mut ok = 0;
    while let Some(n) = tasks.join_next().await {
        ok += n.expect("client task");
    }
    let single_rate = ok as f64 / started.elapsed().as_secs_f64();
    assert_eq!(ok, single, "every request accepted");

    let started = Instant::now();
    let mut accepted = 0;
    let mut tasks = tokio::task::JoinSet::new();
    let chunks: Vec<Vec<usize>> = (single..single + batched)
        .collect::<Vec<_>>()
        .chunks(500)
        .map(<[usize]>::to_vec)
        .collect();
    for group in chunks.chunks(chunks.len().div_ceil(8).max(1)) {
        let (client, url, group) = (client.clone(), url.clone(), group.to_vec());
        tasks.spawn(async move {
            let mut ok = 0usize;
            for c in group {
                let body = serde_json::json!({"commits": c.iter().map(|i| notice(*i)).collect::<Vec<_>>()});
                let r = client.post(&url).bearer_auth(TOKEN).json(&body).send().await.expect("post");
                assert_eq!(r.status(), 200);
                ok += c.len();
            }
            ok
        });
    }
    while let Some(n) = tasks.join_next().await {
        accepted += n.expect("client task");
    }
    let batched_rate = accepted as f64 / started.elapsed().as_secs_f64();
    shutdown.trigger();
    let _ = service.await;
    (single_rate, batched_rate)
}

/// JSON commit notices on a hook topic.
async fn json_hook(n: usize) -> (f64, f64) {
    let topic = create_topic(PARTITIONS).await;
    let records: Vec<(String, Vec<u8>)> = (0..n)
        .map(|i| {
            let v = notice(i);
            (
                v["asset_key"].as_str().unwrap_or_default().to_owned(),
                v.to_string().into_bytes(),
            )
        })
        .collect();
    produce_all(&topic, &records);
    let hooks = format!(r#"[{{"topic": "{topic}", "format": "json"}}]"#);
    hook(&topic, n, hooks).await
}

/// Debezium Avro change events written by Confluent's serializer through the
/// registry stand-in (`lake/debezium_avro.py`); returns (loop, raw consume, Python
/// produce) rates.
async fn debezium_avro_hook(n: usize) -> (f64, f64, f64) {
    let topic = create_topic(PARTITIONS).await;
    let registry = sluice_integration_tests::registry::StandIn::default();
    let url = registry.listen(0).await;
    let args = [
        sluice_integration_tests::bootstrap(),
        topic.clone(),
        url.clone(),
        n.to_string(),
    ];
    let out = tokio::task::spawn_blocking(move || {
        sluice_integration_tests::lake_script("debezium_avro.py", &args)
    })
    .await
    .expect("join");
    let produced: f64 = out.trim().parse().expect("a rate");
    let hooks =
        format!(r#"[{{"topic": "{topic}", "format": "debezium", "schema_registry": "{url}"}}]"#);
    let (rate, raw) = hook(&topic, n, hooks).await;
    (rate, raw, produced)
}

/// Runs the ingester over a filled hook topic until its group committed all `n`.
async fn hook(topic: &str, n: usize, hooks: String) -> (f64, f64) {
    let names = TopicNames::with_prefix(&format!("{}.", unique("bh")), PARTITIONS);
    let (read, secs) = raw_consume(topic, PARTITIONS);
    let raw = read as f64 / secs;
    let shutdown = Shutdown::new();
    let opts = options(&names, free_port(), Some(hooks));
    let group = opts.group_id.clone();
    let started = Instant::now();
    let service = tokio::spawn(sluice_ingester::run(opts, shutdown.clone()));
    loop {
        let done = tokio::task::spawn_blocking({
            let (g, t) = (group.clone(), topic.to_owned());
            move || committed_total(&g, &t, PARTITIONS).unwrap_or(0)
        })
        .await
        .unwrap_or(0);
        if done as usize >= n {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "hook loop too slow"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    shutdown.trigger();
    let _ = service.await;
    (rate, raw)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args()
        .skip(1)
        .map(|a| a.parse::<usize>().expect("a count"));
    let single = args.next().unwrap_or(20_000);
    let batched = args.next().unwrap_or(200_000);
    let hook_n = args.next().unwrap_or(200_000);
    let cdc_n = args.next().unwrap_or(100_000);

    // The raw broker reference: the same events, encoded, produced as fast as it goes.
    let codec = Codec::new(None);
    let topic = create_topic(PARTITIONS).await;
    let mut records = Vec::with_capacity(batched);
    for i in 0..batched {
        let e = AssetEvent::committed(
            AssetKey::parse(&format!("lake.bench.t{:05}", i % 10_000)).expect("key"),
            TableFormat::Paimon,
            i as i64,
            i as i64,
            1_700_000_000_000,
            EventSource::Push,
        );
        let bytes = codec
            .encode(SchemaName::AssetEvent, &topic, &e)
            .await
            .expect("encode");
        records.push((e.asset_key.as_str().to_owned(), bytes));
    }
    let raw_produce = produce_all(&topic, &records);
    let (single_rate, batched_rate) = http(single, batched).await;
    let (hook_rate, raw_consume_rate) = json_hook(hook_n).await;
    let (cdc_rate, cdc_raw, cdc_produced) = debezium_avro_hook(cdc_n).await;
    println!("raw produce of encoded AssetEvents (idempotent, acks=all): {raw_produce:>10.0} /s");
    println!(
        "HTTP, 1 commit per request, 64 concurrent ({single}):     {single_rate:>10.0} /s  {:.3}x raw produce",
        single_rate / raw_produce
    );
    println!(
        "HTTP, 500 commits per request, 8 concurrent ({batched}):   {batched_rate:>10.0} /s  {:.3}x raw produce",
        batched_rate / raw_produce
    );
    println!(
        "raw read_committed consume of the hook topic ({hook_n}):    {raw_consume_rate:>10.0} /s"
    );
    println!(
        "hook topic → asset-events, exactly once ({hook_n}):         {hook_rate:>10.0} /s  {:.3}x raw consume",
        hook_rate / raw_consume_rate
    );
    println!(
        "Debezium Avro produced by confluent-kafka (Python) ({cdc_n}): {cdc_produced:>10.0} /s"
    );
    println!("raw read_committed consume of the CDC topic ({cdc_n}):     {cdc_raw:>10.0} /s");
    println!(
        "Debezium Avro → asset-events, exactly once ({cdc_n}):       {cdc_rate:>10.0} /s  {:.3}x raw consume",
        cdc_rate / cdc_raw
    );
}
