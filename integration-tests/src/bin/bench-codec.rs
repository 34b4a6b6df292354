//! Benchmark of the Avro codecs (a program that prints figures, not a test).
//!
//!   cargo run --release -p sluice-integration-tests --bin bench-codec [records]

use std::time::Instant;

use sluice_core::{AssetEvent, AssetKey, AssetState, EventSource, TableFormat};
use sluice_kit::wire::StateRecord;
use sluice_kit::{Codec, SchemaName};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(50_000);
    let codec = Codec::new(None);
    let key = AssetKey::parse("lake.bench.table").expect("valid");
    let event = AssetEvent::committed(
        key,
        TableFormat::Iceberg,
        10,
        1,
        1_700_000_000_000,
        EventSource::Poll,
    );
    let state = StateRecord::new(&AssetState::fold_all([&event]).expect("state"), 1);
    let started = Instant::now();
    let mut bytes = Vec::new();
    for _ in 0..n {
        bytes = codec
            .encode(SchemaName::AssetEvent, "t", &event)
            .await
            .expect("encode");
    }
    let enc = started.elapsed().as_secs_f64();
    let started = Instant::now();
    for _ in 0..n {
        let _: AssetEvent = codec
            .decode(SchemaName::AssetEvent, &bytes)
            .await
            .expect("decode");
    }
    let dec = started.elapsed().as_secs_f64();
    let sbytes = codec
        .encode(SchemaName::AssetState, "t", &state)
        .await
        .expect("encode");
    let started = Instant::now();
    for _ in 0..n {
        let _: StateRecord = codec
            .decode(SchemaName::AssetState, &sbytes)
            .await
            .expect("decode");
    }
    let sdec = started.elapsed().as_secs_f64();
    println!("codec benchmark, {n} records, single-object encoding");
    println!(
        "  encode AssetEvent  {:>10.0} records/s ({} bytes)",
        n as f64 / enc,
        bytes.len()
    );
    println!("  decode AssetEvent  {:>10.0} records/s", n as f64 / dec);
    println!(
        "  decode AssetState  {:>10.0} records/s ({} bytes)",
        n as f64 / sdec,
        sbytes.len()
    );
}
