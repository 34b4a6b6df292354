//! API benchmark: `sluice-api` (the release binary, as its own process) over a
//! large engine state on the real broker and PostgreSQL — its catch-up beside the
//! raw consume of the same topics, its memory per asset, and the latency of
//! explain, one asset, and list pages.
//!
//!   eval "$(compose/stack.sh env)"; cargo build --release -p sluice-api
//!   cargo run --release -p sluice-integration-tests --bin bench-api -- [assets] [dependencies]
//!
//! Default 1,000,000 assets and 100,000 dependencies; dependency d reads assets 2d
//! and 2d+1 (ALL). Goal: explain p99 ≤ 50 ms.

use std::process::{Child, Command, Stdio};
use std::time::Instant;

use sha2::{Digest, Sha256};
use sluice_core::{AssetEvent, AssetKey, AssetState, DependencySpec, EventSource, TableFormat};
use sluice_integration_tests::{
    bootstrap, database_url, free_port, fresh_database, produce_all, raw_consume, unique,
};
use sluice_kit::topics::TopicNames;
use sluice_kit::wire::{StateRecord, WireSpec};
use sluice_kit::{Codec, SchemaName, Topic};

const PARTITIONS: i32 = 4;
const TOKEN: &str = "bench-api-token-0123456789";

fn key(i: usize) -> AssetKey {
    AssetKey::parse(&format!("lake.bench.t{i:07}")).expect("valid")
}

fn rss_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or(0.0)
}

struct Api {
    child: Child,
    port: u16,
    admin: u16,
}

impl Drop for Api {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the release `sluice-api` on `names` (ready later: [`http::ready`]).
fn start_api(names: &TopicNames, database: &str, tokens: &str) -> Api {
    let binary =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/sluice-api");
    assert!(
        binary.exists(),
        "{} is missing: cargo build --release -p sluice-api",
        binary.display()
    );
    let (port, admin) = (free_port(), free_port());
    let child = Command::new(binary)
        .env("SLUICE_KAFKA_BOOTSTRAP", bootstrap())
        .env("SLUICE_TOPIC_PREFIX", &names.prefix)
        .env("SLUICE_TOPIC_PARTITIONS", PARTITIONS.to_string())
        .env("SLUICE_API_ADDR", format!("127.0.0.1:{port}"))
        .env("SLUICE_ADMIN_ADDR", format!("127.0.0.1:{admin}"))
        .env("SLUICE_API_DATABASE_URL", database)
        .env("SLUICE_API_TOKENS_FILE", tokens)
        .env("SLUICE_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn sluice-api");
    Api { child, port, admin }
}

mod http {
    //! Plain HTTP/1.1 over TCP: one connection per request, as a CLI or a page
    //! load makes them (the bench stays synchronous).
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};

    pub fn get(port: u16, path: &str, token: &str) -> (u16, String) {
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
        )
        .expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read");
        let status = out
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
        (status, body)
    }

    pub fn ready(admin: u16) {
        let until = Instant::now() + Duration::from_secs(900);
        loop {
            if TcpStream::connect(("127.0.0.1", admin)).is_ok()
                && get(admin, "/health/ready", "").0 == 200
            {
                return;
            }
            assert!(Instant::now() < until, "sluice-api not ready in 900 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Times `n` GETs of `path(i)`; returns (p50, p99, max) in ms.
fn timed(port: u16, n: usize, path: impl Fn(usize) -> String) -> (f64, f64, f64) {
    let mut ms = Vec::with_capacity(n);
    for i in 0..n {
        let p = path(i);
        let t = Instant::now();
        let (status, body) = http::get(port, &p, TOKEN);
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(status, 200, "GET {p}: {body}");
    }
    let max = ms.iter().copied().fold(0.0, f64::max);
    (percentile(&mut ms, 0.5), percentile(&mut ms, 0.99), max)
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let assets = args.first().copied().unwrap_or(1_000_000);
    let deps = args.get(1).copied().unwrap_or(100_000).min(assets / 2);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let database = rt.block_on(fresh_database());
    let _ = database_url();
    let tokens = std::env::temp_dir().join(format!("{}.json", unique("bench-api-tokens")));
    std::fs::write(
        &tokens,
        format!(
            r#"[{{"name": "bench", "sha256": "{}", "roles": {{"*": "admin"}}}}]"#,
            hex::encode(Sha256::digest(TOKEN.as_bytes()))
        ),
    )
    .expect("tokens");
    let tokens = tokens.to_string_lossy().into_owned();

    // The API on empty topics: its own footprint.
    let empty = TopicNames::with_prefix(&format!("{}.", unique("bench-api-empty")), PARTITIONS);
    let api = start_api(&empty, &database, &tokens);
    http::ready(api.admin);
    let rss_empty = rss_of(api.child.id());
    drop(api);

    let names = TopicNames::with_prefix(&format!("{}.", unique("bench-api")), PARTITIONS);
    // Topics with the service's own configs: let a short-lived API bootstrap them.
    let api = start_api(&names, &database, &tokens);
    http::ready(api.admin);
    drop(api);
    let codec = Codec::new(None);
    let state_topic = names.name(Topic::AssetState);
    let deps_topic = names.name(Topic::Dependencies);
    println!("bench-api: {assets} assets, {deps} dependencies, {PARTITIONS} partitions");
    let t = Instant::now();
    let records: Vec<(String, Vec<u8>)> = (0..assets)
        .map(|i| {
            let k = key(i);
            let mut s = AssetState::new(k.clone(), TableFormat::Iceberg);
            let mut e = AssetEvent::committed(
                k.clone(),
                TableFormat::Iceberg,
                10,
                1,
                1_000,
                EventSource::Push,
            );
            e.partitions = vec!["dt=2026-12-04".into()];
            s.apply(&e);
            let bytes = rt
                .block_on(codec.encode(
                    SchemaName::AssetState,
                    &state_topic,
                    &StateRecord::new(&s, 1),
                ))
                .expect("encodes");
            (k.as_str().to_owned(), bytes)
        })
        .collect();
    let rate = produce_all(&state_topic, &records);
    drop(records);
    let specs: Vec<(String, Vec<u8>)> = (0..deps)
        .map(|d| {
            let spec = DependencySpec::from_json(&format!(
                r#"{{"id": "dep-{d:06}", "version": 1, "owner_project": "p{}", "target": {{"kind": "webhook", "name": "hook"}},
                   "condition": {{"all": [{{"input": {{"asset": "{}"}}}}, {{"input": {{"asset": "{}"}}}}]}}}}"#,
                d % 50,
                key(2 * d),
                key(2 * d + 1)
            ))
            .expect("valid");
            let bytes = rt
                .block_on(codec.encode(SchemaName::DependencySpec, &deps_topic, &WireSpec::from(&spec)))
                .expect("encodes");
            (spec.id, bytes)
        })
        .collect();
    produce_all(&deps_topic, &specs);
    drop(specs);
    println!(
        "produced in {:.1} s (asset-state at {:.0} records/s)",
        t.elapsed().as_secs_f64(),
        rate
    );

    let (raw_records, raw_secs) = raw_consume(&state_topic, PARTITIONS);
    let api = start_api(&names, &database, &tokens);
    let t = Instant::now();
    http::ready(api.admin);
    let catch_up = t.elapsed().as_secs_f64();
    let rss = rss_of(api.child.id());
    let per_asset = rss.saturating_sub(rss_empty) as f64 / assets as f64;

    let n = 1_000;
    let stride = (deps / n).max(1);
    let explain = timed(api.port, n, |i| {
        format!("/v1/dependencies/dep-{:06}/explain", (i * stride) % deps)
    });
    let asset = timed(api.port, n, |i| {
        format!("/v1/assets/{}", key((i * 997) % assets))
    });
    let dep = timed(api.port, n, |i| {
        format!("/v1/dependencies/dep-{:06}", (i * stride) % deps)
    });
    let list_deps = timed(api.port, 200, |i| {
        format!(
            "/v1/dependencies?limit=100&cursor=dep-{:06}",
            (i * stride * 5) % deps
        )
    });
    let list_assets = timed(api.port, 200, |i| {
        format!("/v1/assets?limit=100&cursor={}", key((i * 4_999) % assets))
    });
    let by_project = timed(api.port, 50, |i| {
        format!("/v1/dependencies?limit=100&project=p{}", i % 50)
    });

    println!();
    println!(
        "catch-up (asset-state + dependencies to ready): {catch_up:.1} s; raw consume of asset-state alone: {raw_secs:.1} s ({raw_records} records) → {:.2}× raw",
        catch_up / raw_secs.max(1e-9)
    );
    println!(
        "memory: {:.0} MiB resident ({:.0} MiB empty) → {per_asset:.0} bytes per asset (assets and dependencies together)",
        rss as f64 / 1_048_576.0,
        rss_empty as f64 / 1_048_576.0
    );
    println!(
        "{:<44} {:>9} {:>9} {:>9}",
        "request", "p50 ms", "p99 ms", "max ms"
    );
    for (name, (p50, p99, max)) in [
        ("GET /v1/dependencies/{id}/explain", explain),
        ("GET /v1/assets/{key}", asset),
        ("GET /v1/dependencies/{id}", dep),
        ("GET /v1/dependencies?limit=100&cursor=…", list_deps),
        ("GET /v1/assets?limit=100&cursor=…", list_assets),
        ("GET /v1/dependencies?limit=100&project=…", by_project),
    ] {
        println!("{name:<44} {p50:>9.2} {p99:>9.2} {max:>9.2}");
    }
    let goal = explain.1 <= 50.0;
    println!(
        "explain p99 {:.2} ms: goal ≤ 50 ms {}",
        explain.1,
        if goal { "met" } else { "NOT met" }
    );
}
