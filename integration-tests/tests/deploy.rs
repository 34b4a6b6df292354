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

/// Every `SLUICE_*` name the services' code (outside its tests) reads or sets is in
/// `kit::config::KNOWN` or `COMMAND_ENV` — so a typo of it is reported at start —
/// and every one of those is documented in the README or `docs/`.
#[test]
fn every_variable_is_known_and_documented() {
    use sluice_kit::config::{COMMAND_ENV, KNOWN};
    let mut used = BTreeSet::new();
    for dir in ["services", "tools"] {
        let mut files = Vec::new();
        collect_rs(&root().join(dir), &mut files);
        for f in files {
            let text = std::fs::read_to_string(&f).expect("read source");
            // Test modules close each file; their made-up names are not settings.
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            let mut rest = code;
            while let Some(at) = rest.find("\"SLUICE_") {
                let tail = &rest[at + 1..];
                let end = tail
                    .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                    .unwrap_or(tail.len());
                used.insert(tail[..end].to_owned());
                rest = &tail[end..];
            }
        }
    }
    used.remove("SLUICE_RDKAFKA_");
    used.remove("SLUICE_TEST_"); // the test harness's prefix, never a setting
    used.remove("SLUICE_"); // the prefix itself, where unknown names are looked for
    let known: BTreeSet<String> = KNOWN
        .iter()
        .chain(COMMAND_ENV)
        .map(|s| (*s).to_owned())
        .collect();
    let unknown: Vec<&String> = used.difference(&known).collect();
    assert!(
        unknown.is_empty(),
        "read by the code but not in kit::config::KNOWN: {unknown:?}"
    );
    let mut docs = std::fs::read_to_string(root().join("README.md")).expect("README");
    for entry in std::fs::read_dir(root().join("docs"))
        .expect("docs")
        .flatten()
    {
        if entry.path().extension().is_some_and(|e| e == "md") {
            docs.push_str(&std::fs::read_to_string(entry.path()).expect("doc"));
        }
    }
    let undocumented: Vec<&String> = known
        .iter()
        .filter(|name| {
            // `NAME_FILE` is documented as `NAME` (`_FILE`).
            let base = name
                .strip_suffix("_FILE")
                .filter(|b| docs.contains(&format!("`{b}` (`_FILE`)")));
            !docs.contains(name.as_str()) && base.is_none()
        })
        .collect();
    assert!(
        undocumented.is_empty(),
        "not documented in the README or docs/: {undocumented:?}"
    );
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_rs(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}
