//! `sluice apply`: every spec validated, the set checked for cycles, then all
//! published (idempotent producer, acks=all) — none if any is refused.

use std::process::ExitCode;
use std::time::Duration;

use rdkafka::producer::{FutureProducer, FutureRecord};
use sluice_core::DependencySpec;
use sluice_core::dependency::check_cycles;
use sluice_kit::config::Common;
use sluice_kit::wire::WireSpec;
use sluice_kit::{Codec, SchemaName, Topic};

fn read(path: &str) -> Result<Vec<DependencySpec>, Vec<String>> {
    let text = std::fs::read_to_string(path).map_err(|e| vec![format!("{path}: {e}")])?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| vec![format!("{path}: not JSON: {e}")])?;
    let items = match value {
        serde_json::Value::Array(items) => items,
        one => vec![one],
    };
    let mut specs = Vec::new();
    let mut problems = Vec::new();
    for (i, item) in items.iter().enumerate() {
        match DependencySpec::from_json(&item.to_string()) {
            Ok(s) => specs.push(s),
            Err(e) => problems.push(format!("{path}[{i}]: {e}")),
        }
    }
    if problems.is_empty() {
        Ok(specs)
    } else {
        Err(problems)
    }
}

pub async fn run(common: &Common, files: &[String]) -> ExitCode {
    let mut specs = Vec::new();
    let mut problems = Vec::new();
    for f in files {
        match read(f) {
            Ok(s) => specs.extend(s),
            Err(p) => problems.extend(p),
        }
    }
    if problems.is_empty()
        && let Err(e) = check_cycles(specs.iter())
    {
        problems.push(e.to_string());
    }
    if !problems.is_empty() {
        for p in problems {
            eprintln!("{p}");
        }
        eprintln!("nothing applied");
        return ExitCode::from(2);
    }
    let topic = common.topics.name(Topic::Dependencies);
    let producer: FutureProducer = match common.kafka.producer_config("sluice-cli").create() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("kafka: {e}");
            return ExitCode::FAILURE;
        }
    };
    let codec = Codec::new(common.schema_registry_url.as_deref());
    for s in &specs {
        let bytes = match codec
            .encode(SchemaName::DependencySpec, &topic, &WireSpec::from(s))
            .await
        {
            Ok(b) => b,
            Err(e) => {
                eprintln!("{}: encoding: {e}", s.id);
                return ExitCode::FAILURE;
            }
        };
        let record = FutureRecord::to(&topic).key(&s.id).payload(&bytes);
        if let Err((e, _)) = producer.send(record, Duration::from_secs(30)).await {
            eprintln!("{}: not acknowledged: {e}", s.id);
            return ExitCode::FAILURE;
        }
        println!(
            "applied {} v{} → {}:{}",
            s.id, s.version, topic, s.target.name
        );
    }
    ExitCode::SUCCESS
}
