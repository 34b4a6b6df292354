//! Benchmark of the state-updater (a program that prints figures, not a test).
//!
//!   eval "$(compose/stack.sh env)"; cargo run --release -p sluice-integration-tests --bin bench-state-updater [events] [assets] [largest]
//!
//! Against the real broker, in one run, it measures and prints as ratios:
//! * fold throughput (events/s through the state-updater, exactly-once transactions)
//!   beside the raw `read_committed` consume rate of the same asset-events topic;
//! * restore rate of asset-state beside the raw `read_committed` consume rate of it
//!   (alternated five times: the best and the median of each);
//! * resident memory per asset with 1,000,000 assets held as the updater holds them,
//!   and with 10,000,000 (`[largest]`, the third argument).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use sluice_core::packed::StateTable;
use sluice_core::{AssetEvent, AssetKey, AssetState, EventSource, TableFormat};
use sluice_integration_tests::{
    best_and_median, bootstrap, committed_total, produce_all, raw_consume, rss_bytes, unique,
};
use sluice_kit::changelog::KafkaChangelog;
use sluice_kit::config::Env;
use sluice_kit::kafka::KafkaOptions;
use sluice_kit::topics::{self, Topic, TopicNames};
use sluice_kit::{BlockingCodec, Codec, SchemaName, Shutdown};
use sluice_state_updater::fold::Entry;
use sluice_state_updater::restore::restore;

const PARTITIONS: i32 = 4;
const T: Duration = Duration::from_secs(30);

#[tokio::main]
async fn main() {
    if std::env::args().nth(1).as_deref() == Some("--memory") {
        // The child of `memory_curve`: a fresh process, so no other phase's
        // freed memory is counted and no other phase runs on its heap.
        let largest = std::env::args().nth(2).and_then(|a| a.parse().ok());
        for (n, per_asset, packed) in held_packed(largest.unwrap_or(10_000_000)) {
            println!("{n} {per_asset} {packed}");
        }
        return;
    }
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let events = args.first().copied().unwrap_or(200_000);
    let assets = args.get(1).copied().unwrap_or(50_000).max(1);
    let largest = args.get(2).copied().unwrap_or(10_000_000);
    let curve = memory_curve(largest);
    let kafka = KafkaOptions::local(&bootstrap());
    let names = TopicNames::with_prefix(&format!("{}.", unique("bench")), PARTITIONS);
    let admin = kafka.admin("bench").expect("admin");
    topics::bootstrap(
        &admin,
        &names,
        &[Topic::AssetEvents, Topic::AssetState, Topic::DeadLetter],
        T,
    )
    .await
    .expect("topics");
    let events_topic = names.name(Topic::AssetEvents);
    let state_topic = names.name(Topic::AssetState);

    // 1. The input, and the raw produce rate of the broker for it.
    let codec = Codec::new(None);
    let keys: Vec<AssetKey> = (0..assets)
        .map(|a| AssetKey::parse(&format!("lake.bench.t{a:07}")).expect("valid"))
        .collect();
    let mut payloads = Vec::with_capacity(events as usize);
    for i in 0..events {
        let key = &keys[(i % assets) as usize];
        let seq = (i / assets + 1) as i64;
        let e = AssetEvent::committed(
            key.clone(),
            TableFormat::Iceberg,
            seq * 10,
            seq,
            1_700_000_000_000 + seq,
            EventSource::Poll,
        );
        payloads.push((
            key.as_str().to_owned(),
            codec
                .encode(SchemaName::AssetEvent, &events_topic, &e)
                .await
                .expect("encode"),
        ));
    }
    let produce_rate = produce_all(&events_topic, &payloads);

    // 2. Raw read_committed consume of asset-events.
    let (n, secs) = raw_consume(&events_topic, PARTITIONS);
    let raw_rate = n as f64 / secs;

    // 3. The state-updater, in process, to the last committed offset.
    let group = format!("{}state-updater", names.prefix);
    let env = Env::from_map([
        ("SLUICE_KAFKA_BOOTSTRAP", bootstrap()),
        ("SLUICE_TOPIC_PREFIX", names.prefix.clone()),
        ("SLUICE_TOPIC_PARTITIONS", PARTITIONS.to_string()),
        ("SLUICE_ADMIN_ADDR", "127.0.0.1:0".to_owned()),
        ("SLUICE_INSTANCE", "bench".to_owned()),
        (
            "SLUICE_BATCH_MAX_MS",
            std::env::var("SLUICE_BATCH_MAX_MS").unwrap_or_else(|_| "100".into()),
        ),
        (
            "SLUICE_BATCH_MAX_RECORDS",
            std::env::var("SLUICE_BATCH_MAX_RECORDS").unwrap_or_else(|_| "5000".into()),
        ),
    ]);
    let options = sluice_state_updater::Options::read(env).expect("options");
    let shutdown = Shutdown::new();
    let service = tokio::spawn(sluice_state_updater::run(options, shutdown.clone()));
    let mut first: Option<(Instant, i64)> = None;
    let done;
    loop {
        let c = committed_total(&group, &events_topic, PARTITIONS).unwrap_or(0);
        if c > 0 && first.is_none() {
            first = Some((Instant::now(), c));
        }
        if c >= events as i64 {
            done = Instant::now();
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shutdown.trigger();
    service
        .await
        .expect("join")
        .expect("state-updater ran cleanly");
    let (t0, c0) = first.expect("progress");
    let fold_rate = (events as i64 - c0) as f64 / done.duration_since(t0).as_secs_f64().max(1e-3);

    // 4. Restore of asset-state beside its raw consume, alternated three times,
    // the best of each kept: one run of either swings by half on this machine.
    let (mut state_records, mut raw_state_secs, mut restore_secs) = (0, Vec::new(), Vec::new());
    for _ in 0..5 {
        let (records, secs) = raw_consume(&state_topic, PARTITIONS);
        state_records = records;
        raw_state_secs.push(secs);
        let changelog = KafkaChangelog::new(
            kafka.reader_config(&unique("restore")),
            state_topic.clone(),
            T * 10,
        );
        let all: BTreeSet<i32> = (0..PARTITIONS).collect();
        let started = Instant::now();
        let restored = tokio::task::spawn_blocking(move || {
            let codec = BlockingCodec::new(None).expect("codec");
            restore(&changelog, &codec, &all)
        })
        .await
        .expect("join")
        .expect("restore");
        restore_secs.push(started.elapsed().as_secs_f64());
        assert_eq!(
            restored.len() as u64,
            assets.min(events),
            "every asset restored"
        );
    }

    println!(
        "state-updater benchmark: {events} events over {assets} assets, {PARTITIONS} partitions, one broker on loopback"
    );
    println!("  raw broker produce (idempotent, acks=all)   {produce_rate:>12.0} events/s");
    println!("  raw read_committed consume of asset-events  {raw_rate:>12.0} events/s");
    println!(
        "  state-updater fold (exactly-once)           {fold_rate:>12.0} events/s   = {:.2} × raw consume",
        fold_rate / raw_rate
    );
    let ((raw_best, raw_median), (restore_best, restore_median)) = (
        best_and_median(raw_state_secs),
        best_and_median(restore_secs),
    );
    let raw_state_rate = state_records as f64 / raw_best;
    let restore_rate = state_records as f64 / restore_best;
    println!(
        "  raw read_committed consume of asset-state   {raw_state_rate:>12.0} records/s ({state_records} records)"
    );
    println!(
        "  restore of asset-state                      {restore_rate:>12.0} records/s  = {:.2} × raw consume, best of 5; median {:.2}×",
        restore_rate / raw_state_rate,
        raw_median / restore_median
    );
    for (n, per_asset, packed) in curve {
        println!(
            "  resident memory per asset ({n:>10} held) {per_asset:>12.0} bytes ({packed:.0} packed)"
        );
    }
}

/// [`held_packed`] in a process of its own (this program with `--memory`).
fn memory_curve(largest: u64) -> Vec<(u64, f64, f64)> {
    let out = std::process::Command::new(std::env::current_exe().expect("own path"))
        .args(["--memory", &largest.to_string()])
        .output()
        .expect("the memory child runs");
    assert!(out.status.success(), "memory child failed: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Some((
                f.first()?.parse().ok()?,
                f.get(1)?.parse().ok()?,
                f.get(2)?.parse().ok()?,
            ))
        })
        .collect()
}

/// Resident memory per asset, one commit each, held as the updater holds them
/// (packed), at 1,000,000 assets and grown on to `largest`: (assets, resident
/// bytes per asset, packed bytes per asset).
fn held_packed(largest: u64) -> Vec<(u64, f64, f64)> {
    let before = rss_bytes();
    let mut held = StateTable::new();
    let mut curve = Vec::new();
    let mut packed_bytes = 0usize;
    for a in 0..largest.max(1_000_000) {
        let key = AssetKey::parse(&format!("lake.mem.t{a:08}")).expect("valid");
        let e = AssetEvent::committed(
            key,
            TableFormat::Paimon,
            1,
            1,
            1_700_000_000_000,
            EventSource::Poll,
        );
        let state = AssetState::fold_all([&e]).expect("state");
        let entry = Entry {
            state,
            revision: 1,
            partition: 0,
        };
        let packed = entry.pack();
        packed_bytes += packed.packed_len();
        held.insert(packed);
        let n = a + 1;
        if n == 1_000_000 || n == largest {
            let per_asset = rss_bytes().saturating_sub(before) as f64 / n as f64;
            curve.push((n, per_asset, packed_bytes as f64 / n as f64));
        }
    }
    curve
}
