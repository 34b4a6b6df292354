//! Dispatcher benchmark (real PostgreSQL and broker, measured in the same run):
//! trigger_history inserts/s batched (one statement per batch, as the intake does)
//! against one statement per trigger; then dispatches/s end to end — triggers on
//! the topic → intake → trigger_history → claim → send to an in-process webhook →
//! SUCCEEDED — beside the raw produce and consume rates of the same topic.
//!
//!   eval "$(compose/stack.sh env)"; cargo run --release -p sluice-integration-tests --bin bench-dispatcher -- [inserts] [dispatches] [max_in_flight]
//!
//! Defaults: 20,000 batched inserts (batches of 500; 5,000 one by one) and 20,000
//! dispatches through one dispatcher with the webhook's max_in_flight 64.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_dispatcher::store::{self, NewTrigger};
use sluice_integration_tests::{
    dispatcher_database, free_port, fresh_topics, produce_all, raw_consume,
};
use sluice_kit::config::Env;
use sluice_kit::topics::Topic;
use sluice_kit::wire::{TriggerInput, TriggerRecord, TriggerTarget, WireTargetKind};
use sluice_kit::{Codec, SchemaName, Shutdown};

// The dispatcher's own allocator, as its binary declares it.
#[global_allocator]
static ALLOCATOR: sluice_dispatcher::Allocator = sluice_dispatcher::Allocator {};

const PARTITIONS: i32 = 4;
const BATCH: usize = 500;

fn new_trigger(series: u64, n: usize) -> NewTrigger {
    NewTrigger {
        trigger_key: format!("tk1-{series:016x}{n:016x}"),
        dependency_id: format!("dep-{}", n % 1_000),
        dependency_version: 1,
        target_kind: "WEBHOOK".into(),
        target_name: "bench".into(),
        target_parameters: "{}".into(),
        inputs: format!(
            r#"[{{"asset": "lake.ods.orders", "snapshot_id": {n}, "sequence": {n}, "watermark_ms": null}}]"#
        ),
        partition: None,
        window_end_ms: None,
        reason: "advanced".into(),
        first_commit_ms: 1_700_000_000_000,
        requested_ms: 1_700_000_000_100,
        source_partition: (n % 4) as i32,
        source_offset: n as i64,
        origin: "data".into(),
        requested_by: None,
        request_id: None,
        rerun_of: None,
    }
}

fn trigger_record(n: usize) -> TriggerRecord {
    TriggerRecord {
        trigger_key: format!("tk1-{:016x}{n:016x}", 2),
        dependency_id: format!("dep-{}", n % 1_000),
        dependency_version: 1,
        target: TriggerTarget {
            kind: WireTargetKind::Webhook,
            name: "bench".into(),
            parameters: BTreeMap::new(),
        },
        inputs: vec![TriggerInput {
            asset_key: "lake.ods.orders".into(),
            snapshot_id: n as i64,
            sequence: n as i64,
            watermark_ms: None,
        }],
        partition: None,
        window_end_ms: None,
        reason: "advanced".into(),
        first_commit_ms: 1_700_000_000_000,
        requested_ms: 1_700_000_000_100,
        origin: sluice_kit::wire::TriggerOrigin::Data,
        requested_by: None,
        request_id: None,
        rerun_of: None,
    }
}

async fn inserts(n: usize) {
    let (_, pool) = dispatcher_database().await;
    let batch: Vec<NewTrigger> = (0..n).map(|i| new_trigger(0, i)).collect();
    let started = Instant::now();
    let mut new = 0;
    for chunk in batch.chunks(BATCH) {
        new += store::record_triggers(&pool, chunk)
            .await
            .expect("insert")
            .len();
    }
    let batched = n as f64 / started.elapsed().as_secs_f64();
    assert_eq!(new, n);
    // The same keys again: every one is a duplicate, nothing new.
    let started = Instant::now();
    for chunk in batch.chunks(BATCH) {
        assert!(
            store::record_triggers(&pool, chunk)
                .await
                .expect("insert")
                .is_empty()
        );
    }
    let duplicates = n as f64 / started.elapsed().as_secs_f64();
    let one_n = (n / 4).max(1);
    let single: Vec<NewTrigger> = (0..one_n).map(|i| new_trigger(1, i)).collect();
    let started = Instant::now();
    for t in &single {
        assert!(
            store::record_trigger_one_by_one(&pool, t)
                .await
                .expect("insert")
        );
    }
    let one = one_n as f64 / started.elapsed().as_secs_f64();
    println!("trigger_history + jobs inserts (one new key = one row + one job):");
    println!("  batched ({BATCH}/statement), {n} new keys:   {batched:>10.0} /s");
    println!("  batched, the same {n} keys again (all dup): {duplicates:>10.0} /s");
    println!("  one by one, {one_n} new keys:                {one:>10.0} /s");
    println!(
        "  batched / one by one:                       {:>10.2}x",
        batched / one
    );
}

async fn dispatches(n: usize, max_in_flight: usize) {
    let (url, pool) = dispatcher_database().await;
    let names = fresh_topics("bd", PARTITIONS, &sluice_dispatcher::ACCESS.topics()).await;
    let topic = names.name(Topic::Triggers);
    let codec = Codec::new(None);
    let mut records = Vec::with_capacity(n);
    for i in 0..n {
        let t = trigger_record(i);
        let bytes = codec
            .encode(SchemaName::TriggerRequest, &topic, &t)
            .await
            .expect("encode");
        records.push((t.trigger_key, bytes));
    }
    let produced = produce_all(&topic, &records);
    let (read, secs) = raw_consume(&topic, PARTITIONS);
    let consumed = read as f64 / secs;

    // The in-process webhook: answers 200 at once and counts.
    let calls = Arc::new(AtomicU64::new(0));
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post({
            let calls = calls.clone();
            move || {
                let calls = calls.clone();
                async move {
                    calls.fetch_add(1, Ordering::Relaxed);
                    "ok"
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let env: BTreeMap<String, String> = [
        (
            "SLUICE_KAFKA_BOOTSTRAP",
            sluice_integration_tests::bootstrap(),
        ),
        ("SLUICE_DATABASE_URL", url),
        ("SLUICE_TOPIC_PREFIX", names.prefix.clone()),
        ("SLUICE_TOPIC_PARTITIONS", PARTITIONS.to_string()),
        ("SLUICE_INSTANCE", "bench".into()),
        ("SLUICE_ADMIN_ADDR", format!("127.0.0.1:{}", free_port())),
        (
            "SLUICE_TARGETS",
            format!(
                r#"[{{"kind": "webhook", "name": "bench", "url": "http://127.0.0.1:{port}/hook",
                     "max_in_flight": {max_in_flight}, "max_per_round": 1000}}]"#
            ),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let options = sluice_dispatcher::Options::read(Env::from_map(env)).expect("options");
    let shutdown = Shutdown::new();
    let started = Instant::now();
    let service = tokio::spawn(sluice_dispatcher::run(options, shutdown.clone()));
    let deadline = started + Duration::from_secs(600);
    let mut first_send = None;
    let succeeded = loop {
        if first_send.is_none() && calls.load(Ordering::Relaxed) > 0 {
            first_send = Some(started.elapsed().as_secs_f64());
        }
        // Counting SUCCEEDED jobs reads the whole table: every 50 ms it took a tenth
        // of PostgreSQL's time from the dispatcher. Counted once every job was sent.
        if (calls.load(Ordering::Relaxed) as usize) < n && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        let done: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE status = 'SUCCEEDED'")
            .fetch_one(&pool)
            .await
            .expect("count");
        if done as usize >= n || Instant::now() > deadline {
            break done;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let secs = started.elapsed().as_secs_f64();
    shutdown.trigger();
    let _ = service.await;
    let sent = calls.load(Ordering::Relaxed);
    let rate = succeeded as f64 / secs;
    // Start-up (connecting, migrating, joining the group) is in `rate`; this is the
    // pace once the first job went out.
    let first_send = first_send.unwrap_or(0.0);
    let steady = succeeded as f64 / (secs - first_send);
    println!(
        "dispatch end to end ({n} triggers on {PARTITIONS} partitions, one dispatcher, webhook max_in_flight {max_in_flight}):"
    );
    println!("  raw produce of the triggers:   {produced:>10.0} rec/s");
    println!("  raw read_committed consume:    {consumed:>10.0} rec/s");
    println!(
        "  dispatched to SUCCEEDED:       {rate:>10.0} /s  ({succeeded} jobs, {sent} sends, {secs:.2} s)"
    );
    println!(
        "  from the first send:           {steady:>10.0} /s  (first send {:.0} ms after start)",
        first_send * 1000.0
    );
    println!(
        "  dispatch / raw consume:        {:>10.3}x",
        rate / consumed
    );
    assert_eq!(succeeded as usize, n, "every trigger dispatched");
    assert_eq!(sent as usize, n, "one send per trigger");
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args()
        .skip(1)
        .map(|a| a.parse::<usize>().expect("a count"));
    let n_inserts = args.next().unwrap_or(20_000);
    let n_dispatches = args.next().unwrap_or(20_000);
    let max_in_flight = args.next().unwrap_or(64);
    inserts(n_inserts).await;
    dispatches(n_dispatches, max_in_flight).await;
}
