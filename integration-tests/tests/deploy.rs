//! The dashboards and alert rules name only metrics a service records: a renamed
//! metric fails here instead of leaving a panel or an alert silently empty.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `sluice_…` word in a text (a metric name or a label value alike).
fn names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("sluice_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        out.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}

fn rust_sources(dir: &Path, out: &mut String) {
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push_str(&std::fs::read_to_string(&path).expect("read source"));
        }
    }
}

#[test]
fn every_metric_in_the_dashboard_and_rules_is_one_a_service_records() {
    let mut sources = String::new();
    rust_sources(&root().join("services"), &mut sources);
    let recorded: BTreeSet<String> = names(&sources)
        .into_iter()
        .filter(|n| sources.contains(&format!("\"{n}\"")))
        .collect();
    for file in [
        "deploy/grafana/sluice-dashboard.json",
        "deploy/prometheus/sluice-rules.yaml",
    ] {
        let text = std::fs::read_to_string(root().join(file)).expect("read deploy file");
        let used = names(&text);
        assert!(!used.is_empty(), "{file} names no metric");
        let unknown: Vec<&String> = used.difference(&recorded).collect();
        assert!(
            unknown.is_empty(),
            "{file} names metrics no service records: {unknown:?}"
        );
    }
}
