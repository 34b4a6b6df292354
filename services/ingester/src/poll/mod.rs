//! The compensation path of the seeds: push can be lost, so registered tables are
//! polled. Each table's own metadata is read (`formats`) and every snapshot after
//! the known position is emitted as an event with the id a push of the same commit
//! would have, so the fold takes it once whichever path came first.
//!
//! The position of a table is the newest sequence the asset-state topic holds for
//! it (followed live, so a restart resumes where the fold is and re-emits no
//! history), or what this poller emitted since, if newer. The seed's heartbeat
//! rule: a table whose state has not advanced for `push_timeout_ms` is polled now;
//! otherwise every `interval_ms`. A snapshot a poll emits that the state did not
//! yet hold counts in `sluice_ingester_poll_emitted_total`; whether push had only
//! lagged or missed it, the fold tells: the first copy of a commit to reach it is
//! counted in `sluice_state_commits_first_seen_total` by source, so `source="poll"` is
//! what a poll found first.

pub mod formats;
pub mod iceberg;
pub mod object;
pub mod paimon;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::{ClientConfig, Message};
use serde::Deserialize;
use sluice_core::{AssetEvent, AssetKey, EventKind, EventSource, TableFormat};
use sluice_kit::wire::StateRecord;
use sluice_kit::{BlockingCodec, SchemaName, Shutdown};

use crate::metrics as m;
use crate::sink::Sink;
use formats::{ScanError, Snapshot};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Start {
    /// A table never seen before: emit only its newest snapshot.
    #[default]
    Latest,
    /// A table never seen before: emit its whole retained history.
    Earliest,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableSpec {
    pub asset: String,
    pub format: String,
    /// The table's base: a local directory, or `s3://bucket/prefix` on an
    /// S3-compatible store (endpoint and credentials from the AWS_* variables).
    pub path: PathBuf,
    #[serde(default = "default_interval")]
    pub interval_ms: u64,
    #[serde(default = "default_push_timeout")]
    pub push_timeout_ms: u64,
    #[serde(default)]
    pub start: Start,
    /// Iceberg only, required: where the table's current metadata is found.
    #[serde(default)]
    pub catalog: Option<iceberg::Catalog>,
    /// Iceberg only: the branch or tag whose commits are the table's (default `main`).
    #[serde(default, rename = "ref")]
    pub follow: Option<String>,
}

fn default_interval() -> u64 {
    300_000
}
fn default_push_timeout() -> u64 {
    60_000
}

#[derive(Clone, Debug)]
pub struct Table {
    pub asset: AssetKey,
    pub format: TableFormat,
    pub path: PathBuf,
    pub interval: Duration,
    pub push_timeout: Duration,
    pub start: Start,
    /// Set for Iceberg tables (required there), None for the others.
    pub catalog: Option<iceberg::Catalog>,
    /// The Iceberg ref followed.
    pub follow: String,
}

pub fn parse_tables(json: &str) -> Result<Vec<Table>, Vec<String>> {
    let specs: Vec<TableSpec> =
        serde_json::from_str(json).map_err(|e| vec![format!("SLUICE_POLL_TABLES: {e}")])?;
    let mut problems = Vec::new();
    let mut tables = Vec::new();
    for (i, s) in specs.into_iter().enumerate() {
        let at = format!("SLUICE_POLL_TABLES[{i}] ({})", s.asset);
        let asset = AssetKey::parse(&s.asset).map_err(|e| problems.push(format!("{at}: {e}")));
        let format = s
            .format
            .parse::<TableFormat>()
            .map_err(|e| problems.push(format!("{at}: {e}")));
        if matches!(format, Ok(TableFormat::Other)) {
            problems.push(format!("{at}: format other has no metadata to poll"));
        }
        let path = s.path.to_string_lossy();
        if (path.starts_with("s3://") || path.starts_with("s3a://"))
            && let Err(e) = object::locate(&path)
        {
            problems.push(format!("{at}: path: {e}"));
        } else if path.contains("://") && !path.starts_with("s3") {
            problems.push(format!(
                "{at}: path {path:?}: a local directory or s3://bucket/prefix"
            ));
        }
        if s.interval_ms < 100 || s.push_timeout_ms < 100 {
            problems.push(format!(
                "{at}: interval_ms and push_timeout_ms are at least 100"
            ));
        }
        match (&format, &s.catalog) {
            (Ok(TableFormat::Iceberg), None) => problems.push(format!(
                "{at}: an Iceberg table needs its \"catalog\": {{\"kind\": \"sql\", \"uri\", \"name\", \"table\"}}, \
                 {{\"kind\": \"rest\", \"uri\", \"table\"}}, {{\"kind\": \"hadoop\"}} or, as a fallback that can \
                 read an uncommitted file, {{\"kind\": \"directory\"}}"
            )),
            (Ok(TableFormat::Iceberg), Some(c)) => {
                problems.extend(c.problems().into_iter().map(|p| format!("{at}: {p}")));
            }
            (Ok(f), Some(_)) => problems.push(format!("{at}: \"catalog\" is for Iceberg tables, not {f}")),
            _ => {}
        }
        if s.follow.is_some() && !matches!(format, Ok(TableFormat::Iceberg)) {
            problems.push(format!("{at}: \"ref\" is for Iceberg tables"));
        }
        if let (Ok(asset), Ok(format)) = (asset, format) {
            tables.push(Table {
                catalog: s.catalog,
                follow: s.follow.unwrap_or_else(|| "main".to_owned()),
                asset,
                format,
                path: s.path,
                interval: Duration::from_millis(s.interval_ms),
                push_timeout: Duration::from_millis(s.push_timeout_ms),
                start: s.start,
            });
        }
    }
    if problems.is_empty() {
        Ok(tables)
    } else {
        Err(problems)
    }
}

/// The newest commit the asset-state topic holds for a polled asset, and when it
/// last advanced.
#[derive(Clone, Copy, Debug)]
struct Held {
    sequence: i64,
    snapshot_id: i64,
    advanced: Instant,
}

/// The newest commit the asset-state topic holds per polled asset.
#[derive(Default)]
pub struct Known {
    seen: Mutex<HashMap<String, Held>>,
    caught_up: AtomicBool,
}

impl Known {
    fn advance(&self, asset: &str, sequence: i64, snapshot_id: i64) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let held = Held {
            sequence,
            snapshot_id,
            advanced: Instant::now(),
        };
        let e = seen.entry(asset.to_owned()).or_insert(held);
        if sequence > e.sequence {
            *e = held;
        }
    }

    fn get(&self, asset: &str) -> Option<Held> {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(asset)
            .copied()
    }

    /// Follows every partition of asset-state until `stop` (a blocking loop).
    pub fn follow(
        self: &Arc<Self>,
        config: ClientConfig,
        topic: &str,
        wanted: &[AssetKey],
        codec: &BlockingCodec,
        stop: &AtomicBool,
    ) -> Result<(), sluice_kit::changelog::ChangelogError> {
        let wanted: std::collections::HashSet<&str> = wanted.iter().map(AssetKey::as_str).collect();
        sluice_kit::changelog::follow(
            &config,
            topic,
            Duration::from_secs(30),
            stop,
            || self.caught_up.store(true, Ordering::Release),
            |msg| {
                let Some(key) = msg.key().and_then(|k| std::str::from_utf8(k).ok()) else {
                    return;
                };
                let Some(payload) = msg.payload().filter(|_| wanted.contains(key)) else {
                    return;
                };
                match codec.decode::<StateRecord>(SchemaName::AssetState, payload) {
                    Ok(r) => {
                        if let Some(latest) = r.latest {
                            self.advance(key, latest.sequence, latest.snapshot_id);
                        }
                    }
                    Err(e) => {
                        tracing::error!(asset = key, error = %e, "unreadable asset-state record skipped")
                    }
                }
            },
        )
    }

    pub fn caught_up(&self) -> bool {
        self.caught_up.load(Ordering::Acquire)
    }
}

fn event(t: &Table, s: &Snapshot) -> AssetEvent {
    let mut e = AssetEvent::committed(
        t.asset.clone(),
        t.format,
        s.snapshot_id,
        s.sequence,
        s.commit_time_ms,
        EventSource::Poll,
    );
    e.operation = s.operation;
    e.watermark_ms = s.watermark_ms;
    e.schema_id = s.schema_id;
    e.partitions = s.partitions.clone();
    e.attributes = s.attributes.iter().cloned().collect();
    e
}

/// Where a table's files are read from: `s3://…` on the object store, else local.
fn open_tree(path: &std::path::Path) -> Result<Arc<dyn formats::Tree>, String> {
    let url = path.to_string_lossy();
    if url.starts_with("s3://") || url.starts_with("s3a://") {
        let tree = object::ObjectTree::open(&url, tokio::runtime::Handle::current())?;
        Ok(Arc::new(tree))
    } else {
        Ok(Arc::new(formats::LocalTree(path.to_owned())))
    }
}

/// Where a poll resumes: after the newest of what the state holds and what this
/// poller emitted since.
fn resume_after(held: Option<i64>, emitted_through: Option<i64>) -> Option<i64> {
    match (held, emitted_through) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// The sequence the held commit has in this scan, found by its snapshot id; the
/// held sequence when the scan does not have it (expired, another ref). An Iceberg
/// v1 table has no sequence numbers, and Sluice's derived order changed once (to
/// timestamps, which expiry cannot move): a state written under the old order
/// still resumes after its own snapshot instead of re-emitting the history.
fn held_sequence(scan: &[Snapshot], sequence: i64, snapshot_id: i64) -> i64 {
    scan.iter()
        .find(|s| s.snapshot_id == snapshot_id)
        .map_or(sequence, |s| s.sequence)
}

/// Pure: what to emit of a scan, given the known position and the start policy.
pub fn to_emit(found: Vec<Snapshot>, position: Option<i64>, start: Start) -> Vec<Snapshot> {
    match (position, start) {
        (None, Start::Latest) => found.into_iter().last().into_iter().collect(),
        (None, Start::Earliest) => found,
        (Some(p), _) => found.into_iter().filter(|s| s.sequence > p).collect(),
    }
}

struct Polled {
    table: Table,
    tree: Result<Arc<dyn formats::Tree>, String>,
    /// The Iceberg catalog's connection (None for the other formats).
    catalog: Option<Result<iceberg::Client, String>>,
    emitted_through: Option<i64>,
    emitted_schema: Option<(i64, i64, i64)>,
    emitted_expired: Option<(i64, i64)>,
    /// (sequence, snapshot id) of the Iceberg ref's ancestry at the last poll.
    last_chain: Vec<(i64, i64)>,
    last_poll: Option<Instant>,
}

pub struct Poller {
    pub tables: Vec<Table>,
    pub known: Arc<Known>,
    pub sink: Sink,
}

impl Poller {
    pub async fn run(self, shutdown: Shutdown) -> Result<(), std::convert::Infallible> {
        while !self.known.caught_up() {
            if shutdown.is_stopping() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut tables: Vec<Polled> = self
            .tables
            .iter()
            .map(|t| Polled {
                table: t.clone(),
                tree: open_tree(&t.path),
                catalog: t.catalog.as_ref().map(iceberg::Client::open),
                emitted_through: None,
                emitted_schema: None,
                emitted_expired: None,
                last_chain: Vec::new(),
                last_poll: None,
            })
            .collect();
        tracing::info!(
            tables = tables.len(),
            "pollers started at the asset-state positions"
        );
        while !shutdown.is_stopping() {
            for p in &mut tables {
                let state = self.known.get(p.table.asset.as_str());
                let due = match p.last_poll {
                    None => true,
                    Some(last) => {
                        let quiet =
                            state.is_none_or(|h| h.advanced.elapsed() >= p.table.push_timeout);
                        last.elapsed() >= p.table.interval
                            || (quiet && last.elapsed() >= p.table.push_timeout)
                    }
                };
                if due {
                    self.poll_one(p, state).await;
                }
            }
            tokio::select! {
                _ = shutdown.clone().wait_stopped() => break,
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
        Ok(())
    }

    async fn poll_one(&self, p: &mut Polled, held: Option<Held>) {
        p.last_poll = Some(Instant::now());
        let t = p.table.clone();
        let position = resume_after(held.map(|h| h.sequence), p.emitted_through);
        let format = t.format.as_str();
        let tree = match &p.tree {
            Ok(tree) => tree.clone(),
            Err(e) => {
                metrics::counter!(m::POLL_ERRORS_TOTAL, "format" => format).increment(1);
                tracing::warn!(asset = %t.asset, error = %e, "table store not usable; retried at the next poll");
                return;
            }
        };
        let scanned = match (&t.catalog, &p.catalog) {
            (Some(catalog), Some(client)) => match client {
                Ok(client) => iceberg::current(catalog, client, tree.clone(), &t.path)
                    .await
                    .and_then(|current| {
                        let all =
                            iceberg::snapshots(&current.metadata, &t.follow).map_err(|reason| {
                                ScanError::Corrupt {
                                    path: current.location.into(),
                                    reason,
                                }
                            })?;
                        let mut facts = iceberg::facts(&current.metadata, &t.follow, &all);
                        // Writers differ in whether the oldest retained snapshot keeps
                        // its parent's id: what the last poll saw and is gone now, older
                        // than every retained snapshot, was expired too.
                        let oldest = all.first().map(|s| s.sequence);
                        let gone = p
                            .last_chain
                            .iter()
                            .filter(|(seq, _)| oldest.is_some_and(|o| *seq < o))
                            .max()
                            .copied();
                        facts.expired = facts.expired.max(gone);
                        p.last_chain = all.iter().map(|s| (s.sequence, s.snapshot_id)).collect();
                        // The held snapshot, found by id, places the position in this
                        // scan's numbering (see `held_sequence`).
                        let held = held.map(|h| held_sequence(&all, h.sequence, h.snapshot_id));
                        let position = resume_after(held, p.emitted_through);
                        Ok((formats::after_position(all, position), facts))
                    }),
                Err(e) => Err(ScanError::Corrupt {
                    path: t.path.clone(),
                    reason: format!("catalog not usable: {e}"),
                }),
            },
            _ => tokio::task::spawn_blocking({
                let (fmt, tree) = (t.format, tree.clone());
                move || {
                    let found = formats::scan(fmt, tree.as_ref(), position)?;
                    let expired = formats::expired(fmt, tree.as_ref())?;
                    Ok((
                        found,
                        formats::Facts {
                            schema: None,
                            expired,
                        },
                    ))
                }
            })
            .await
            .map_err(|e| ScanError::Corrupt {
                path: t.path.clone(),
                reason: e.to_string(),
            })
            .and_then(|r| r),
        };
        let (found, facts) = match scanned {
            Ok(found) => found,
            Err(e) => {
                metrics::counter!(m::POLL_ERRORS_TOTAL, "format" => format).increment(1);
                tracing::warn!(asset = %t.asset, error = %e, "poll failed; retried at the next poll");
                return;
            }
        };
        let mut emit = to_emit(found, position, t.start);
        // Commits whose partitions are not known yet: read their manifests (only of
        // what is emitted now, never the whole history).
        if emit
            .iter()
            .any(|s| s.partitions.is_empty() && s.manifest_list.is_some())
        {
            let (tree, path, fmt) = (tree.clone(), t.path.clone(), t.format);
            let read = tokio::task::spawn_blocking(move || {
                for s in emit.iter_mut().filter(|s| s.partitions.is_empty()) {
                    let Some(list) = s.manifest_list.as_deref() else {
                        continue;
                    };
                    s.partitions = match fmt {
                        TableFormat::Iceberg => {
                            iceberg::manifest_partitions(tree.as_ref(), &path, s.snapshot_id, list)?
                        }
                        TableFormat::Paimon => paimon::commit_partitions(
                            tree.as_ref(),
                            s.schema_id.unwrap_or(0),
                            list,
                        )?,
                        _ => Vec::new(),
                    };
                }
                Ok::<_, ScanError>(emit)
            })
            .await
            .map_err(|e| ScanError::Corrupt {
                path: t.path.clone(),
                reason: e.to_string(),
            })
            .and_then(|r| r);
            emit = match read {
                Ok(emit) => emit,
                Err(e) => {
                    metrics::counter!(m::POLL_ERRORS_TOTAL, "format" => format).increment(1);
                    tracing::warn!(asset = %t.asset, error = %e, "manifests not read; retried at the next poll");
                    return;
                }
            };
        }
        let mut events: Vec<AssetEvent> = emit.iter().map(|s| event(&t, s)).collect();
        // A schema changed without a commit, and history expired: facts of their own
        // kinds, emitted when they differ from what this poller last emitted (the fold
        // ignores a repeat after a restart).
        let schema = facts.schema.filter(|f| p.emitted_schema != Some(*f));
        if let Some((sequence, snapshot_id, schema_id)) = schema {
            let mut e = fact(&t, EventKind::SchemaChanged, sequence, snapshot_id);
            e.schema_id = Some(schema_id);
            events.push(e);
        }
        let expired = facts.expired.filter(|f| p.emitted_expired != Some(*f));
        if let Some((sequence, snapshot_id)) = expired {
            events.push(fact(&t, EventKind::SnapshotExpired, sequence, snapshot_id));
        }
        if events.is_empty() {
            return;
        }
        match self.sink.publish(&events).await {
            Ok(()) => {
                let newest = emit.last().map(|s| s.sequence);
                p.emitted_through = newest.max(p.emitted_through);
                p.emitted_schema = schema.or(p.emitted_schema);
                p.emitted_expired = expired.or(p.emitted_expired);
                // The state had none of them when the poll began: push missed them or
                // lags (which one the fold tells: sluice_state_commits_first_seen_total).
                metrics::counter!(m::POLL_EMITTED_TOTAL, "format" => format)
                    .increment(events.len() as u64);
                tracing::info!(asset = %t.asset, events = events.len(), through = ?newest, "poll found commits push had not reported");
            }
            Err(e) => {
                tracing::warn!(asset = %t.asset, error = %e, "poll events not acknowledged; retried at the next poll")
            }
        }
    }
}

/// A polled fact that is not a commit (schema change, expiry).
fn fact(t: &Table, kind: EventKind, sequence: i64, snapshot_id: i64) -> AssetEvent {
    let now = sluice_kit::clock::now_ms();
    AssetEvent::new(
        t.asset.clone(),
        t.format,
        kind,
        snapshot_id,
        sequence,
        now,
        EventSource::Poll,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(seq: i64) -> Snapshot {
        Snapshot {
            snapshot_id: seq,
            sequence: seq,
            commit_time_ms: seq,
            operation: sluice_core::Operation::Append,
            watermark_ms: None,
            schema_id: None,
            partitions: Vec::new(),
            manifest_list: None,
            attributes: Vec::new(),
        }
    }

    #[test]
    fn position_and_start_policy() {
        let found = || vec![snap(1), snap(2), snap(3)];
        let seqs = |v: Vec<Snapshot>| v.iter().map(|s| s.sequence).collect::<Vec<_>>();
        assert_eq!(seqs(to_emit(found(), None, Start::Latest)), [3]);
        assert_eq!(seqs(to_emit(found(), None, Start::Earliest)), [1, 2, 3]);
        assert_eq!(seqs(to_emit(found(), Some(1), Start::Latest)), [2, 3]);
        assert!(to_emit(found(), Some(3), Start::Earliest).is_empty());
    }

    #[test]
    fn a_state_under_the_old_v1_order_resumes_after_its_own_snapshot() {
        // v1 snapshots 701, 702, 703, now numbered by timestamp; the state holds 702
        // under the order of an older Sluice (sequence 2).
        let scan: Vec<Snapshot> = [701, 702, 703]
            .into_iter()
            .enumerate()
            .map(|(i, id)| Snapshot {
                snapshot_id: id,
                sequence: 1_733_000_000_000_000 + i as i64 * 1000,
                ..snap(0)
            })
            .collect();
        let position = resume_after(Some(held_sequence(&scan, 2, 702)), None);
        let emitted = formats::after_position(scan.clone(), position);
        assert_eq!(
            emitted.iter().map(|s| s.snapshot_id).collect::<Vec<_>>(),
            [703]
        );
        // A held snapshot the scan lacks (expired, or of another ref) keeps its sequence.
        assert_eq!(
            held_sequence(&scan, 1_733_000_000_000_500, 42),
            1_733_000_000_000_500
        );
        assert_eq!(resume_after(Some(5), Some(9)), Some(9));
    }

    #[test]
    fn table_config_names_every_mistake() {
        let p = parse_tables(
            r#"[{"asset": "lake.ods", "format": "iceberg", "path": "/x"},
                {"asset": "lake.ods.b", "format": "orc", "path": "/x", "interval_ms": 5}]"#,
        )
        .expect_err("refused");
        // A bad asset key, an Iceberg table without its catalog, an unknown format,
        // an interval under 100 ms.
        assert_eq!(p.len(), 4, "{p:?}");
        assert!(p[1].contains("needs its \"catalog\""), "{p:?}");
        let p = parse_tables(
            r#"[{"asset": "lake.ods.a", "format": "delta", "path": "/x", "catalog": {"kind": "hadoop"}, "ref": "audit"}]"#,
        )
        .expect_err("refused");
        assert_eq!(p.len(), 2, "{p:?}");
    }
}
