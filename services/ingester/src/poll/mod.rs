//! The compensation path of the seeds: push can be lost, so registered tables are
//! polled. Each table's own metadata is read (`formats`) and every snapshot after
//! the known position is emitted as an event with the id a push of the same commit
//! would have, so the fold takes it once whichever path came first.
//!
//! The position of a table is the newest sequence the asset-state topic holds for
//! it (followed live, so a restart resumes where the fold is and re-emits no
//! history), or what this poller emitted since, if newer. The heartbeat rule of
//! Hudi's table-service plan: a table whose state has not advanced for
//! `push_timeout_ms` is polled now; otherwise every `interval_ms`. A snapshot a
//! poll emits that the state did not yet hold counts in
//! `sluice_ingester_poll_emitted_total`; whether push had only lagged or missed
//! it, the fold tells: the first copy of a commit to reach it is counted in
//! `sluice_state_commits_first_seen_total` by source, so `source="poll"` is what
//! a poll found first.

pub mod formats;
pub mod iceberg;
pub mod object;
pub mod paimon;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::{ClientConfig, Message};
use serde::Deserialize;
use sluice_core::{AssetEvent, AssetKey, EventKind, EventSource, TableFormat};
use sluice_kit::declared::SharedDeclared;
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

#[derive(Clone, Debug, PartialEq)]
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
        match build(s, true) {
            Ok(t) => tables.push(t),
            Err(ps) => problems.extend(ps.into_iter().map(|p| format!("{at}: {p}"))),
        }
    }
    if problems.is_empty() {
        Ok(tables)
    } else {
        Err(problems)
    }
}

/// A declared table's document (the tables topic), as the API checks it before
/// publishing: its asset key, or every mistake. Nothing of the ingester's own
/// environment is looked at; a SQL catalog URI may not hold a password.
pub fn check_declared(document: &str) -> Result<String, Vec<String>> {
    let spec: TableSpec = serde_json::from_str(document).map_err(|e| vec![e.to_string()])?;
    build(spec, false).map(|t| t.asset.as_str().to_owned())
}

/// A declared table as this ingester polls it.
fn parse_declared(document: &str) -> Result<Table, Vec<String>> {
    let spec: TableSpec = serde_json::from_str(document).map_err(|e| vec![e.to_string()])?;
    build(spec, true)
}

/// One table from its spec; `here`: this process polls it (its environment counts).
fn build(s: TableSpec, here: bool) -> Result<Table, Vec<String>> {
    let mut problems = Vec::new();
    let asset = AssetKey::parse(&s.asset).map_err(|e| problems.push(e.to_string()));
    let format = s
        .format
        .parse::<TableFormat>()
        .map_err(|e| problems.push(e.to_string()));
    if matches!(format, Ok(TableFormat::Other)) {
        problems.push("format other has no metadata to poll".into());
    }
    let path = s.path.to_string_lossy();
    if (path.starts_with("s3://") || path.starts_with("s3a://"))
        && let Err(e) = object::locate(&path)
    {
        problems.push(format!("path: {e}"));
    } else if path.contains("://") && !path.starts_with("s3") {
        problems.push(format!(
            "path {path:?}: a local directory or s3://bucket/prefix"
        ));
    }
    if s.interval_ms < 100 || s.push_timeout_ms < 100 {
        problems.push("interval_ms and push_timeout_ms are at least 100".into());
    }
    match (&format, &s.catalog) {
        (Ok(TableFormat::Iceberg), None) => problems.push(
            "an Iceberg table needs its \"catalog\": {\"kind\": \"sql\", \"uri\", \"name\", \"table\"}, \
             {\"kind\": \"rest\", \"uri\", \"table\"}, {\"kind\": \"hadoop\"} or, as a fallback that can \
             read an uncommitted file, {\"kind\": \"directory\"}"
                .into(),
        ),
        (Ok(TableFormat::Iceberg), Some(c)) => problems.extend(c.problems_where(here)),
        (Ok(f), Some(_)) => problems.push(format!("\"catalog\" is for Iceberg tables, not {f}")),
        _ => {}
    }
    if s.follow.is_some() && !matches!(format, Ok(TableFormat::Iceberg)) {
        problems.push("\"ref\" is for Iceberg tables".into());
    }
    match (asset, format) {
        (Ok(asset), Ok(format)) if problems.is_empty() => Ok(Table {
            catalog: s.catalog,
            follow: s.follow.unwrap_or_else(|| "main".to_owned()),
            asset,
            format,
            path: s.path,
            interval: Duration::from_millis(s.interval_ms),
            push_timeout: Duration::from_millis(s.push_timeout_ms),
            start: s.start,
        }),
        _ => Err(problems),
    }
}

/// The tables polled now: the bootstrap set with the declared ones over it (a
/// declared table replaces a `SLUICE_POLL_TABLES` one of the same asset; deleting
/// it restores that one). A declared table not valid here is left out, logged.
pub fn tables_in_force(bootstrap: &[Table], declared: &SharedDeclared) -> Vec<Table> {
    let mut by_asset: std::collections::BTreeMap<String, Table> = bootstrap
        .iter()
        .map(|t| (t.asset.as_str().to_owned(), t.clone()))
        .collect();
    let mut invalid = 0u64;
    for (id, doc) in declared.snapshot() {
        let built = doc
            .map_err(|e| vec![e])
            .and_then(|d| parse_declared(&d))
            .and_then(|t| {
                if t.asset.as_str() == id {
                    Ok(t)
                } else {
                    Err(vec![format!(
                        "published under {id:?}, not {:?}",
                        t.asset.as_str()
                    )])
                }
            });
        match built {
            Ok(t) => {
                by_asset.insert(id, t);
            }
            Err(problems) => {
                invalid += 1;
                tracing::error!(table = %id, problems = %problems.join("; "),
                    "declared table not valid here: left out");
            }
        }
    }
    metrics::gauge!(m::POLL_TABLES_INVALID).set(invalid as f64);
    metrics::gauge!(m::POLL_TABLES).set(by_asset.len() as f64);
    by_asset.into_values().collect()
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
    /// The assets followed: the polled tables'. A table added later is read up
    /// once ([`Known::catch_up`]) and followed from then on.
    wanted: std::sync::RwLock<std::collections::HashSet<String>>,
    caught_up: AtomicBool,
}

/// Where the asset-state topic is read from, for a table added while running.
pub struct Positions {
    pub config: ClientConfig,
    pub topic: String,
    pub registry: Option<String>,
}

impl Known {
    pub fn new(wanted: &[AssetKey]) -> Self {
        Known {
            wanted: std::sync::RwLock::new(wanted.iter().map(|a| a.as_str().to_owned()).collect()),
            ..Known::default()
        }
    }

    fn wants(&self, asset: &str) -> bool {
        self.wanted
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(asset)
    }

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

    /// One asset-state record of a wanted asset.
    fn take(&self, key: &str, payload: &[u8], codec: &BlockingCodec) {
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
    }

    /// Follows every partition of asset-state until `stop` (a blocking loop).
    pub fn follow(
        self: &Arc<Self>,
        config: ClientConfig,
        topic: &str,
        codec: &BlockingCodec,
        stop: &AtomicBool,
    ) -> Result<(), sluice_kit::changelog::ChangelogError> {
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
                if let Some(payload) = msg.payload().filter(|_| self.wants(key)) {
                    self.take(key, payload, codec);
                }
            },
        )
    }

    /// Starts following `assets` (tables added while running): wanted from now on
    /// by the live follower, and what the topic held for them before read once, from
    /// their partitions only, so a new table resumes where the fold is.
    pub fn catch_up(&self, at: &Positions, assets: &[String]) -> Result<(), String> {
        self.wanted
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .extend(assets.iter().cloned());
        let codec = BlockingCodec::new(at.registry.as_deref()).map_err(|e| e.to_string())?;
        let reader = sluice_kit::kafka::reader(&at.config).map_err(|e| e.to_string())?;
        let md = reader
            .fetch_metadata(Some(&at.topic), Duration::from_secs(30))
            .map_err(|e| e.to_string())?;
        let count = md.topics().first().map_or(0, |t| t.partitions().len()) as i32;
        let partitions: std::collections::BTreeSet<i32> = assets
            .iter()
            .map(|a| sluice_kit::kafka::partition_for(a.as_bytes(), count))
            .collect();
        let new: std::collections::HashSet<&str> = assets.iter().map(String::as_str).collect();
        sluice_kit::changelog::read_to_end(
            &at.config,
            &at.topic,
            &partitions,
            Duration::from_secs(120),
            |msg| {
                if let (Some(key), Some(payload)) = (
                    msg.key().and_then(|k| std::str::from_utf8(k).ok()),
                    msg.payload(),
                ) && new.contains(key)
                {
                    self.take(key, payload, &codec);
                }
                Ok(())
            },
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
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

impl Polled {
    fn new(table: Table) -> Polled {
        Polled {
            tree: open_tree(&table.path),
            catalog: table.catalog.as_ref().map(iceberg::Client::open),
            table,
            emitted_through: None,
            emitted_schema: None,
            emitted_expired: None,
            last_chain: Vec::new(),
            last_poll: None,
        }
    }
}

pub struct Poller {
    /// `SLUICE_POLL_TABLES`, read at start.
    pub bootstrap: Vec<Table>,
    /// Tables declared through the API (the tables topic), applied live.
    pub declared: Arc<SharedDeclared>,
    pub known: Arc<Known>,
    pub positions: Arc<Positions>,
    pub sink: Sink,
}

impl Poller {
    pub async fn run(self, shutdown: Shutdown) -> Result<(), std::convert::Infallible> {
        while !(self.known.caught_up() && self.declared.caught_up()) {
            if shutdown.is_stopping() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut tables: Vec<Polled> = Vec::new();
        let mut generation = None;
        while !shutdown.is_stopping() {
            let now = self.declared.generation();
            if generation != Some(now) && self.apply_tables(&mut tables).await {
                generation = Some(now);
            }
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

    /// Brings the polled set to the tables in force: a new table is polled at once
    /// from the position the state holds for it; a changed one keeps what this
    /// poller emitted and is polled at once; a removed one stops. False if a new
    /// table's position could not be read (retried on the next turn).
    async fn apply_tables(&self, tables: &mut Vec<Polled>) -> bool {
        let want = tables_in_force(&self.bootstrap, &self.declared);
        let new: Vec<String> = want
            .iter()
            .map(|t| t.asset.as_str().to_owned())
            .filter(|a| !self.known.wants(a))
            .collect();
        if !new.is_empty() {
            let (known, at, assets) = (self.known.clone(), self.positions.clone(), new.clone());
            let read = tokio::task::spawn_blocking(move || known.catch_up(&at, &assets))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r);
            if let Err(e) = read {
                tracing::warn!(tables = ?new, error = %e, "positions of new tables not read; retrying");
                return false;
            }
        }
        let mut before: HashMap<String, Polled> = tables
            .drain(..)
            .map(|p| (p.table.asset.as_str().to_owned(), p))
            .collect();
        for t in want {
            let polled = match before.remove(t.asset.as_str()) {
                Some(p) if p.table == t => p,
                Some(p) => {
                    tracing::info!(asset = %t.asset, "table changed; polled now");
                    Polled {
                        emitted_through: p.emitted_through,
                        emitted_schema: p.emitted_schema,
                        emitted_expired: p.emitted_expired,
                        last_chain: p.last_chain,
                        ..Polled::new(t)
                    }
                }
                None => {
                    tracing::info!(asset = %t.asset, format = %t.format, "table added; polled now");
                    Polled::new(t)
                }
            };
            tables.push(polled);
        }
        for gone in before.keys() {
            tracing::info!(asset = %gone, "table no longer polled");
        }
        tracing::info!(tables = tables.len(), "polled tables in force");
        true
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

    #[test]
    fn a_declared_table_is_checked_without_the_ingesters_environment() {
        assert_eq!(
            check_declared(
                r#"{"asset": "lake.ods.orders", "format": "delta", "path": "/lake/orders"}"#
            ),
            Ok("lake.ods.orders".to_owned())
        );
        // A REST token variable the API does not have is not its to check.
        assert!(
            check_declared(
                r#"{"asset": "lake.ods.o", "format": "iceberg", "path": "/l/o",
                    "catalog": {"kind": "rest", "uri": "http://cat", "table": "ods.o",
                                "token_env": "SLUICE_TEST_SURELY_UNSET"}}"#
            )
            .is_ok()
        );
        let e = check_declared(
            r#"{"asset": "lake.ods.o", "format": "iceberg", "path": "/l/o",
                "catalog": {"kind": "sql", "uri": "postgresql://u:pw@db/cat", "name": "c", "table": "ods.o"}}"#,
        )
        .expect_err("a password in a declared table");
        assert!(e[0].contains("holds no password"), "{e:?}");
        let e =
            check_declared(r#"{"asset": "lake.ods.o", "format": "delta"}"#).expect_err("no path");
        assert!(e[0].contains("missing field `path`"), "{e:?}");
    }

    #[test]
    fn declared_tables_replace_bootstrap_ones_and_a_tombstone_restores_them() {
        let bootstrap =
            parse_tables(r#"[{"asset": "lake.ods.a", "format": "delta", "path": "/boot"}]"#)
                .expect("valid");
        let declared = SharedDeclared::new();
        let paths = |d: &SharedDeclared| {
            tables_in_force(&bootstrap, d)
                .into_iter()
                .map(|t| (t.asset.as_str().to_owned(), t.path.display().to_string()))
                .collect::<Vec<_>>()
        };
        declared.apply(
            "lake.ods.a",
            Some(Ok(
                r#"{"asset": "lake.ods.a", "format": "delta", "path": "/declared"}"#.into(),
            )),
        );
        declared.apply(
            "lake.ods.b",
            Some(Ok(
                r#"{"asset": "lake.ods.b", "format": "paimon", "path": "/b"}"#.into(),
            )),
        );
        // Under a key that is not its asset: left out, never guessed at.
        declared.apply(
            "lake.ods.c",
            Some(Ok(
                r#"{"asset": "lake.ods.z", "format": "paimon", "path": "/z"}"#.into(),
            )),
        );
        assert_eq!(
            paths(&declared),
            [
                ("lake.ods.a".to_owned(), "/declared".to_owned()),
                ("lake.ods.b".to_owned(), "/b".to_owned())
            ]
        );
        declared.apply("lake.ods.a", None);
        assert_eq!(
            paths(&declared)[0],
            ("lake.ods.a".to_owned(), "/boot".to_owned())
        );
    }
}
