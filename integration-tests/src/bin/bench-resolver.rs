//! Resolver benchmark: the cost of one asset-state change through the real
//! processor (inverted index, pure decision, record encoding) with few and many
//! dependencies over many assets, and for a hot asset (in process); then the
//! restore of the global asset-state table beside the raw consume of the same
//! topic (real broker, measured in the same run).
//!
//!   eval "$(compose/stack.sh env)"; cargo run --release -p sluice-integration-tests --bin bench-resolver -- [assets] [state-records]
//!
//! Default 1,000,000 assets and 400,000 asset-state records. Dependencies read 2
//! assets each (ALL), dependency d reads assets 2d and 2d+1; the changes measured
//! are of assets 0..2,000, each read by exactly one dependency with 1k, 100k and
//! 1M dependencies, so the ratio shows what the other dependencies cost a change
//! that does not concern them: the median of five passes over the 2,000, each
//! started with the caches flushed. The hot asset is read by 10,000 more.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sluice_core::DependencySpec;
use sluice_core::{AssetEvent, AssetKey, AssetState, EventSource, TableFormat};
use sluice_integration_tests::{
    best_and_median, create_topic, kafka, produce_all, raw_consume, rss_bytes, unique,
};
use sluice_kit::changelog::MemoryChangelog;
use sluice_kit::txn::{Input, Processor};
use sluice_kit::wire::StateRecord;
use sluice_kit::wire::WireSpec;
use sluice_kit::{BlockingCodec, Codec, SchemaName};
use sluice_resolver::resolve::{Changelogs, Resolve};
use sluice_resolver::table::GlobalTable;

fn key(i: usize) -> AssetKey {
    AssetKey::parse(&format!("lake.bench.t{i:07}")).expect("valid")
}

fn state(k: &AssetKey, seq: i64) -> AssetState {
    let mut s = AssetState::new(k.clone(), TableFormat::Iceberg);
    s.apply(&AssetEvent::committed(
        k.clone(),
        TableFormat::Iceberg,
        seq * 10,
        seq,
        seq * 1_000,
        EventSource::Push,
    ));
    s
}

fn spec(id: &str, a: &AssetKey, b: &AssetKey) -> DependencySpec {
    DependencySpec::from_json(&format!(
        r#"{{"id": "{id}", "version": 1, "owner_project": "bench", "target": {{"kind": "webhook", "name": "{id}"}},
           "condition": {{"all": [{{"input": {{"asset": "{a}"}}}}, {{"input": {{"asset": "{b}"}}}}]}}}}"#
    ))
    .expect("valid spec")
}

struct Bench {
    resolver: Resolve,
    table: std::sync::Arc<GlobalTable>,
    offset: i64,
    codec: BlockingCodec,
    flush: CacheFlush,
}

impl Bench {
    fn add(&mut self, s: &DependencySpec) {
        let bytes = self
            .codec
            .encode(SchemaName::DependencySpec, "deps", &WireSpec::from(s))
            .expect("encode");
        self.offset += 1;
        let input = Input {
            topic: "deps",
            partition: 0,
            offset: self.offset,
            key: Some(s.id.as_bytes()),
            payload: Some(&bytes),
            timestamp_ms: None,
            headers: Vec::new(),
        };
        self.resolver.process(&input).expect("spec accepted");
        self.resolver.committed();
    }

    /// Applies a state change to each of `assets`, one pass each, starting with the
    /// caches flushed; returns (time per change, outputs per change).
    fn changes(&mut self, assets: &[AssetKey], seq: &mut i64) -> (Duration, f64) {
        self.flush.run();
        let mut outputs = 0usize;
        let started = Instant::now();
        for k in assets {
            *seq += 1;
            self.table.apply(k.clone(), Some((state(k, *seq), *seq)));
            outputs += self.resolver.tick().expect("tick").len();
            self.resolver.committed();
        }
        (
            started.elapsed() / assets.len() as u32,
            outputs as f64 / assets.len() as f64,
        )
    }
}

/// A buffer larger than the last-level cache (300 MiB on the development
/// machine), written through before every measured pass so that each starts from
/// memory. Without it, the 1k pass ran with the dependencies just added for it
/// still in cache and the larger passes did not: the ratio compared cache with
/// memory (1.14–1.34× on quiet cores), not what the other dependencies cost.
/// Allocated once: faulting in a fresh GiB for each of the sixteen passes took
/// seconds of the run.
struct CacheFlush(Vec<u8>);

impl CacheFlush {
    fn new() -> Self {
        Self(vec![0u8; 1 << 30])
    }

    fn run(&mut self) {
        for i in (0..self.0.len()).step_by(64) {
            self.0[i] = self.0[i].wrapping_add(1);
        }
        std::hint::black_box(&self.0);
    }
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let assets = args.first().copied().unwrap_or(1_000_000).max(2_000);
    let state_records = args.get(1).copied().unwrap_or(400_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let table = GlobalTable::new();
    let rss0 = rss_bytes();
    for i in 0..assets {
        let k = key(i);
        table.apply(k.clone(), Some((state(&k, 1), 1)));
    }
    table.drain_changed();
    table.mark_caught_up();
    let rss_assets = rss_bytes();
    println!("resolver benchmark (in process): {assets} assets in the global table");
    println!(
        "  resident memory per asset                  {:>8} bytes",
        (rss_assets - rss0) / assets as u64
    );
    let resolver = Resolve::new(
        BlockingCodec::new(None).expect("codec"),
        Changelogs {
            dependencies: Box::new(MemoryChangelog::new("deps")),
            progress: Box::new(MemoryChangelog::new("progress")),
        },
        "triggers".into(),
        table.clone(),
        sluice_resolver::lineage::Lineage::new(),
        rdkafka::ClientConfig::new(),
        Duration::from_secs(1),
    );
    let mut b = Bench {
        resolver,
        table,
        offset: 0,
        codec: BlockingCodec::new(None).expect("codec"),
        flush: CacheFlush::new(),
    };
    let mut seq = 1i64;
    let sample: Vec<AssetKey> = (0..2_000).map(key).collect();
    let mut added = 0usize;
    let mut base = None;
    for deps in [1_000usize, 100_000, 1_000_000] {
        let before = rss_bytes();
        for d in added..deps {
            // Past assets / 2 dependencies wrap around, away from the measured
            // assets 0..2,000: each of those stays read by exactly one dependency.
            let first = if d < assets / 2 {
                d * 2
            } else {
                2_000 + (d * 2) % (assets - 2_002)
            };
            let (a, c) = (key(first), key(first + 1));
            b.add(&spec(&format!("d{d:07}"), &a, &c));
        }
        let per_dep = (rss_bytes() - before) / (deps - added) as u64;
        added = deps;
        // The median of five passes, each from memory (2,000 changes take ~10 ms).
        let mut passes: Vec<(Duration, f64)> =
            (0..5).map(|_| b.changes(&sample, &mut seq)).collect();
        passes.sort_by_key(|p| p.0);
        let (t, outs) = passes[2];
        let base_t = *base.get_or_insert(t);
        println!(
            "  {deps:>7} dependencies: per state change {:>8.2} µs, {outs:.2} records out  ({:.2}× the 1k cost; ~{per_dep} bytes per dependency)",
            t.as_secs_f64() * 1e6,
            t.as_secs_f64() / base_t.as_secs_f64()
        );
    }
    let hot = key(assets / 2 + 1);
    for h in 0..10_000usize {
        b.add(&spec(&format!("hot{h:05}"), &hot, &key((h * 13) % assets)));
    }
    let (t, outs) = b.changes(&vec![hot; 20], &mut seq);
    println!(
        "  hot asset read by 10,000 dependencies: per state change {:>10.2} µs ({:.2} µs per dependency evaluated, {outs:.0} records out)",
        t.as_secs_f64() * 1e6,
        t.as_secs_f64() * 1e6 / 10_000.0
    );
    drop(b);
    restore(&rt, state_records);
}

/// Restore of the global table (every partition of asset-state, newest revision
/// wins) beside a raw read_committed consume of the same topic, alternated five
/// times: the best and the median of each.
fn restore(rt: &tokio::runtime::Runtime, records: usize) {
    const PARTITIONS: i32 = 4;
    let topic = rt.block_on(create_topic(PARTITIONS));
    let codec = Codec::new(None);
    let distinct = (records / 4).max(1);
    let payloads: Vec<(String, Vec<u8>)> = (0..records)
        .map(|i| {
            let k = key(i % distinct);
            let rev = (i / distinct + 1) as i64;
            let bytes = rt
                .block_on(codec.encode(
                    SchemaName::AssetState,
                    &topic,
                    &StateRecord::new(&state(&k, rev), rev),
                ))
                .expect("encode");
            (k.as_str().to_owned(), bytes)
        })
        .collect();
    let produce_rate = produce_all(&topic, &payloads);
    let (mut n, mut raw_secs, mut table_secs) = (0, Vec::new(), Vec::new());
    for _ in 0..5 {
        let (read, secs) = raw_consume(&topic, PARTITIONS);
        n = read;
        raw_secs.push(secs);
        let table = GlobalTable::new();
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let reader = table.spawn_reader(
            kafka().reader_config(&unique("table")),
            topic.clone(),
            BlockingCodec::new(None).expect("codec"),
            stop.clone(),
            Duration::from_secs(30),
        );
        assert!(
            table.wait_caught_up(Duration::from_secs(600)),
            "global table caught up"
        );
        table_secs.push(started.elapsed().as_secs_f64());
        stop.store(true, Ordering::Relaxed);
        let _ = reader.join();
        assert_eq!(table.read().len(), distinct, "every asset in the table");
    }
    let ((raw_best, raw_median), (table_best, table_median)) =
        (best_and_median(raw_secs), best_and_median(table_secs));
    let (raw_rate, table_rate) = (n as f64 / raw_best, records as f64 / table_best);
    println!(
        "restore of the global asset-state table ({records} records, {distinct} assets, real broker):"
    );
    println!("  raw broker produce (idempotent, acks=all)   {produce_rate:>10.0} records/s");
    println!("  raw read_committed consume                  {raw_rate:>10.0} records/s");
    println!(
        "  global table restore                        {table_rate:>10.0} records/s  = {:.2} × raw consume, best of 5 ({table_best:.2} s); median {:.2}× ({table_median:.2} s against {raw_median:.2} s)",
        table_rate / raw_rate,
        raw_median / table_median
    );
}
