//! Reading a table's own metadata on a local filesystem: every snapshot after a
//! position, oldest first. Pure apart from reading files; a file that does not
//! parse is an error for this poll (retried at the next), never a wrong event.

use std::path::{Path, PathBuf};

use serde_json::Value;
use sluice_core::{Operation, TableFormat};

/// One snapshot as the table's metadata states it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub snapshot_id: i64,
    pub sequence: i64,
    pub commit_time_ms: i64,
    pub operation: Operation,
    pub watermark_ms: Option<i64>,
    pub schema_id: Option<i64>,
    /// The partitions the commit wrote, as `k=v/k2=v2` paths (empty: unknown or unpartitioned).
    pub partitions: Vec<String>,
    /// The file listing what this commit changed, read for its partitions only for
    /// the snapshots emitted: Iceberg's manifest list (when the summary names no
    /// partitions), Paimon's delta manifest list.
    pub manifest_list: Option<String>,
    /// e.g. `hudi.action=deltacommit`, `paimon.commit_kind=APPEND`.
    pub attributes: Vec<(String, String)>,
}

/// What a poll learns besides commits, emitted as events of their own kinds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    /// (sequence, snapshot id, schema id): a schema changed without a commit.
    pub schema: Option<(i64, i64, i64)>,
    /// (sequence, snapshot id) of the newest version expired.
    pub expired: Option<(i64, i64)>,
}

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    /// Unparsable, half-written or inconsistent metadata: retried, reported.
    #[error("{path}: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("{0}: no table metadata here (yet)")]
    NoTable(PathBuf),
}

fn corrupt(t: &dyn Tree, path: &Path, reason: impl Into<String>) -> ScanError {
    ScanError::Corrupt {
        path: t.full(path),
        reason: reason.into(),
    }
}

fn read_json(t: &dyn Tree, path: &Path) -> Result<Value, ScanError> {
    let bytes = t.read(path)?;
    serde_json::from_slice(&bytes).map_err(|e| corrupt(t, path, format!("not complete JSON: {e}")))
}

/// Where a table's files are read from: a local directory or an object store
/// prefix. Paths are relative to the table's base; a directory that does not
/// exist lists as [`ScanError::NoTable`], a file that does not exist reads as an
/// `Io` error of kind `NotFound`.
pub trait Tree: Send + Sync {
    fn list(&self, dir: &Path) -> Result<Vec<String>, ScanError>;
    fn read(&self, path: &Path) -> Result<Vec<u8>, ScanError>;
    fn mtime_ms(&self, path: &Path) -> i64;
    fn exists(&self, path: &Path) -> bool;
    fn is_dir(&self, path: &Path) -> bool;
    /// The path as a user would name it (for errors).
    fn full(&self, path: &Path) -> PathBuf;
}

/// A table on the local filesystem.
pub struct LocalTree(pub PathBuf);

impl Tree for LocalTree {
    fn list(&self, dir: &Path) -> Result<Vec<String>, ScanError> {
        let full = self.0.join(dir);
        match std::fs::read_dir(&full) {
            Ok(rd) => Ok(rd
                .filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(ScanError::NoTable(full)),
            Err(error) => Err(ScanError::Io { path: full, error }),
        }
    }

    fn read(&self, path: &Path) -> Result<Vec<u8>, ScanError> {
        let full = self.0.join(path);
        std::fs::read(&full).map_err(|error| ScanError::Io { path: full, error })
    }

    fn mtime_ms(&self, path: &Path) -> i64 {
        std::fs::metadata(self.0.join(path))
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as i64)
    }

    fn exists(&self, path: &Path) -> bool {
        self.0.join(path).exists()
    }

    fn is_dir(&self, path: &Path) -> bool {
        self.0.join(path).is_dir()
    }

    fn full(&self, path: &Path) -> PathBuf {
        self.0.join(path)
    }
}

/// Snapshots with `sequence > after` (all when `after` is None), oldest first.
pub fn scan(
    format: TableFormat,
    t: &dyn Tree,
    after: Option<i64>,
) -> Result<Vec<Snapshot>, ScanError> {
    let all = match format {
        // Read through its catalog (`iceberg::current`), then `iceberg::snapshots`.
        TableFormat::Iceberg => return Err(ScanError::NoTable(t.full(Path::new("")))),
        TableFormat::Paimon => paimon(t, after)?,
        TableFormat::Delta => delta(t, after)?,
        TableFormat::Hudi => hudi(t, after)?,
        TableFormat::Other => return Err(ScanError::NoTable(t.full(Path::new("")))),
    };
    Ok(after_position(all, after))
}

/// How far a table's history was expired, as (sequence, snapshot id) of the newest
/// version gone: Paimon snapshots before the oldest `snapshot-N` left, Delta
/// versions before the oldest `_delta_log` JSON left once a checkpoint covers them.
/// None when nothing was expired (or the format has no such notion here).
pub fn expired(format: TableFormat, t: &dyn Tree) -> Result<Option<(i64, i64)>, ScanError> {
    let oldest = |dir: &str, id: &dyn Fn(&str) -> Option<i64>| -> Result<Option<i64>, ScanError> {
        Ok(t.list(Path::new(dir))?.iter().filter_map(|n| id(n)).min())
    };
    Ok(match format {
        TableFormat::Paimon => oldest("snapshot", &|n| n.strip_prefix("snapshot-")?.parse().ok())?
            .filter(|first| *first > 1)
            .map(|first| (first - 1, first - 1)),
        TableFormat::Delta => {
            let first = oldest("_delta_log", &|n| {
                n.strip_suffix(".json")
                    .filter(|v| v.len() == 20)?
                    .parse()
                    .ok()
            })?;
            first
                .filter(|f| *f > 0 && t.exists(Path::new("_delta_log/_last_checkpoint")))
                .map(|f| (f - 1, f - 1))
        }
        _ => None,
    })
}

/// The snapshots newer than `after`, oldest first, one per sequence.
pub fn after_position(mut all: Vec<Snapshot>, after: Option<i64>) -> Vec<Snapshot> {
    all.retain(|s| after.is_none_or(|a| s.sequence > a));
    all.sort_by_key(|s| s.sequence);
    all.dedup_by_key(|s| s.sequence);
    all
}

// ---- Paimon: `snapshot/snapshot-N`, scanned forward (LATEST / EARLIEST are hints
// that can be wrong, so the directory is listed instead of trusting them).

fn paimon(t: &dyn Tree, after: Option<i64>) -> Result<Vec<Snapshot>, ScanError> {
    let dir = PathBuf::from("snapshot");
    let mut ids: Vec<i64> = t
        .list(&dir)?
        .iter()
        .filter_map(|n| n.strip_prefix("snapshot-")?.parse().ok())
        .filter(|id| after.is_none_or(|a| *id > a))
        .collect();
    ids.sort_unstable();
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let path = dir.join(format!("snapshot-{id}"));
        let s = match read_json(t, &path) {
            Ok(s) => s,
            // Expired between the listing and the read: it is gone, not corrupt.
            Err(ScanError::Io { error, .. }) if error.kind() == std::io::ErrorKind::NotFound => {
                continue;
            }
            Err(e) => return Err(e),
        };
        if s.get("id").and_then(Value::as_i64) != Some(id) {
            return Err(corrupt(t, &path, "its `id` is not the number in its name"));
        }
        let kind = s
            .get("commitKind")
            .and_then(Value::as_str)
            .unwrap_or("APPEND")
            .to_owned();
        out.push(Snapshot {
            snapshot_id: id,
            sequence: id,
            commit_time_ms: s
                .get("timeMillis")
                .and_then(Value::as_i64)
                .ok_or_else(|| corrupt(t, &path, "no timeMillis"))?,
            operation: match kind.as_str() {
                "APPEND" => Operation::Append,
                "OVERWRITE" => Operation::Overwrite,
                "COMPACT" => Operation::Compact,
                _ => Operation::Other, // ANALYZE
            },
            // Long.MIN_VALUE means "no watermark".
            watermark_ms: s
                .get("watermark")
                .and_then(Value::as_i64)
                .filter(|w| *w != i64::MIN),
            schema_id: s.get("schemaId").and_then(Value::as_i64),
            partitions: Vec::new(),
            manifest_list: s
                .get("deltaManifestList")
                .and_then(Value::as_str)
                .map(str::to_owned),
            attributes: vec![("paimon.commit_kind".into(), kind)],
        });
    }
    Ok(out)
}

// ---- Delta: `_delta_log/<20-digit version>.json` with its commitInfo; a version
// only in a checkpoint (older JSON cleaned up) is taken from `_last_checkpoint`.

fn delta(t: &dyn Tree, after: Option<i64>) -> Result<Vec<Snapshot>, ScanError> {
    let dir = PathBuf::from("_delta_log");
    let names = t.list(&dir)?;
    let mut versions: Vec<i64> = names
        .iter()
        .filter_map(|n| {
            n.strip_suffix(".json")
                .filter(|v| v.len() == 20)?
                .parse()
                .ok()
        })
        .filter(|v| after.is_none_or(|a| *v > a))
        .collect();
    versions.sort_unstable();
    let mut out = Vec::new();
    let checkpoint = dir.join("_last_checkpoint");
    if t.exists(&checkpoint) {
        let cp = read_json(t, &checkpoint)?;
        let v = cp
            .get("version")
            .and_then(Value::as_i64)
            .ok_or_else(|| corrupt(t, &checkpoint, "no version"))?;
        if !versions.contains(&v)
            && after.is_none_or(|a| v > a)
            && versions.first().is_none_or(|f| *f > v)
        {
            out.push(Snapshot {
                snapshot_id: v,
                sequence: v,
                commit_time_ms: t.mtime_ms(&checkpoint),
                operation: Operation::Other,
                watermark_ms: None,
                schema_id: None,
                partitions: Vec::new(),
                manifest_list: None,
                attributes: vec![("delta.from".into(), "checkpoint".into())],
            });
        }
    }
    for v in versions {
        let path = dir.join(format!("{v:020}.json"));
        let bytes = t.read(&path)?;
        let text = String::from_utf8_lossy(&bytes);
        let mut info = None;
        let mut schema_changed = false;
        let mut partitions = std::collections::BTreeSet::new();
        for (n, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let action: Value = serde_json::from_str(line).map_err(|e| {
                corrupt(t, &path, format!("line {}: not complete JSON: {e}", n + 1))
            })?;
            if let Some(ci) = action.get("commitInfo") {
                info = Some(ci.clone());
            }
            schema_changed |= action.get("metaData").is_some();
            for kind in ["add", "remove"] {
                if let Some(values) = action
                    .pointer(&format!("/{kind}/partitionValues"))
                    .and_then(Value::as_object)
                    .filter(|v| !v.is_empty())
                {
                    partitions.insert(partition_path(values));
                }
            }
        }
        let info = info.unwrap_or(Value::Null);
        let op = info
            .get("operation")
            .and_then(Value::as_str)
            .unwrap_or("WRITE")
            .to_owned();
        let mode = info
            .pointer("/operationParameters/mode")
            .and_then(Value::as_str)
            .unwrap_or("Append");
        let mut attributes = vec![("delta.operation".into(), op.clone())];
        if schema_changed {
            attributes.push(("delta.metadata".into(), "changed".into()));
        }
        out.push(Snapshot {
            snapshot_id: v,
            sequence: v,
            commit_time_ms: info
                .get("timestamp")
                .and_then(Value::as_i64)
                .unwrap_or_else(|| t.mtime_ms(&path)),
            operation: match (op.as_str(), mode) {
                (
                    "WRITE" | "CREATE TABLE" | "CREATE OR REPLACE TABLE" | "STREAMING UPDATE",
                    "Overwrite",
                ) => Operation::Overwrite,
                ("WRITE" | "CREATE TABLE" | "STREAMING UPDATE" | "CONVERT", _) => Operation::Append,
                ("CREATE OR REPLACE TABLE" | "MERGE" | "UPDATE" | "RESTORE", _) => {
                    Operation::Overwrite
                }
                ("DELETE" | "TRUNCATE", _) => Operation::Delete,
                ("OPTIMIZE" | "REORG" | "ZORDER", _) => Operation::Compact,
                _ => Operation::Other, // VACUUM, SET TBLPROPERTIES, …
            },
            watermark_ms: None,
            // Delta has no schema ids: the version whose metaData action changed the
            // schema stands for it, so `schema_unchanged` sees each change.
            schema_id: schema_changed.then_some(v),
            partitions: partitions.into_iter().collect(),
            manifest_list: None,
            attributes,
        });
    }
    Ok(out)
}

/// Delta `partitionValues` as a Hive-style path, columns in name order; a null
/// value is Hive's default partition.
fn partition_path(values: &serde_json::Map<String, Value>) -> String {
    let mut cols: Vec<(&String, &Value)> = values.iter().collect();
    cols.sort_by_key(|(k, _)| *k);
    cols.iter()
        .map(|(k, v)| match v {
            Value::String(s) => format!("{k}={s}"),
            Value::Null => format!("{k}=__HIVE_DEFAULT_PARTITION__"),
            other => format!("{k}={other}"),
        })
        .collect::<Vec<_>>()
        .join("/")
}

// ---- Hudi: completed instants of the `.hoodie` timeline, in both layouts:
//   0.x (timeline layout 1, e.g. Hudi 0.15.0): `.hoodie/<instant>.<action>`, pending
//       ones end in `.requested` / `.inflight`; completed commit files hold the
//       HoodieCommitMetadata as JSON.
//   1.x (timeline layout 2, e.g. Hudi 1.0.2): `.hoodie/timeline/<instant>_<completion>.<action>`;
//       completed commit files hold the HoodieCommitMetadata (or, for replacecommit,
//       HoodieReplaceCommitMetadata) as an Avro data file, schema embedded.

const HUDI_ACTIONS: [&str; 5] = [
    "commit",
    "deltacommit",
    "replacecommit",
    "clean",
    "rollback",
];

/// Magic of an Avro object container file.
const AVRO_FILE_MAGIC: &[u8] = b"Obj\x01";

/// A completed commit's metadata, from JSON (0.x) or an Avro data file (1.x), as JSON.
fn hudi_commit_metadata(t: &dyn Tree, path: &Path) -> Result<Value, ScanError> {
    let bytes = t.read(path)?;
    commit_metadata_of(&bytes).map_err(|e| corrupt(t, path, e))
}

fn commit_metadata_of(bytes: &[u8]) -> Result<Value, String> {
    if !bytes.starts_with(AVRO_FILE_MAGIC) {
        return serde_json::from_slice(bytes)
            .map_err(|e| format!("neither an Avro data file nor JSON: {e}"));
    }
    let avro = |e: apache_avro::Error| format!("Avro data file: {e}");
    let record = apache_avro::Reader::new(bytes)
        .map_err(avro)?
        .next()
        .ok_or("an Avro data file without a record")?
        .map_err(avro)?;
    Value::try_from(record).map_err(avro)
}

/// The snapshot of one completed instant, `metadata` its commit metadata (none
/// for a clean or a rollback, whose metadata names no written partitions).
fn hudi_snapshot(instant: &str, action: &str, metadata: Option<&Value>) -> Option<Snapshot> {
    let (sequence, commit_ms) = crate::normalize::hudi_instant(instant).ok()?;
    let mut partitions: Vec<String> = metadata
        .and_then(|m| m.get("partitionToWriteStats"))
        .and_then(Value::as_object)
        .map(|m| m.keys().filter(|k| !k.is_empty()).cloned().collect())
        .unwrap_or_default();
    partitions.sort();
    let operation_type = metadata
        .and_then(|m| m.get("operationType"))
        .and_then(Value::as_str);
    let mut attributes = vec![("hudi.action".into(), action.to_owned())];
    if let Some(op) = operation_type {
        attributes.push(("hudi.operation_type".into(), op.to_owned()));
    }
    Some(Snapshot {
        snapshot_id: sequence,
        sequence,
        commit_time_ms: commit_ms,
        operation: crate::normalize::hudi_operation(Some(action), operation_type),
        watermark_ms: None,
        schema_id: None,
        partitions,
        manifest_list: None,
        attributes,
    })
}

/// Whether an action's completed metadata names the partitions it wrote.
fn hudi_writes(action: &str) -> bool {
    action != "clean" && action != "rollback"
}

/// Completed instants after `after` (all with none), from the active timeline and,
/// in layout 2, from the archived one: Hudi 1.x moves old instants out of
/// `.hoodie/timeline` into the LSM timeline's Parquet files under `history/`,
/// so a poller that was down while they were archived still finds them there.
fn hudi(t: &dyn Tree, after: Option<i64>) -> Result<Vec<Snapshot>, ScanError> {
    let hoodie = PathBuf::from(".hoodie");
    let v2 = hoodie.join(sluice_kit::hudi::LAYOUT2_DIR);
    let (dir, layout2) = if t.is_dir(&v2) {
        (v2, true)
    } else {
        (hoodie.clone(), false)
    };
    let newer = |sequence: i64| after.is_none_or(|a| sequence > a);
    let mut out = Vec::new();
    for name in t.list(&dir)? {
        let Some((instant, action)) = sluice_kit::hudi::completed_instant(&name, layout2) else {
            continue; // pending, `hoodie.properties`, …
        };
        if !HUDI_ACTIONS.contains(&action) {
            continue;
        }
        let Ok((sequence, _)) = crate::normalize::hudi_instant(instant) else {
            continue;
        };
        if !newer(sequence) {
            continue; // read only what is new: the metadata of every instant, every poll, is not
        }
        let meta = if hudi_writes(action) {
            Some(hudi_commit_metadata(t, &dir.join(&name))?)
        } else {
            None
        };
        out.extend(hudi_snapshot(instant, action, meta.as_ref()));
    }
    if out.is_empty() && !t.exists(&hoodie.join("hoodie.properties")) {
        return Err(ScanError::NoTable(hoodie));
    }
    if layout2 {
        let active: std::collections::BTreeSet<i64> = out.iter().map(|s| s.sequence).collect();
        let archived = hudi_archived(t, &dir.join(hudi_history_dir(t)), after)?;
        out.extend(
            archived
                .into_iter()
                .filter(|s| !active.contains(&s.sequence)),
        );
        out.sort_by_key(|s| s.sequence);
    }
    Ok(out)
}

/// The archived timeline's directory under `.hoodie/timeline`
/// (`hoodie.timeline.history.path`, `history` unless the table says otherwise).
fn hudi_history_dir(t: &dyn Tree) -> String {
    let props = t
        .read(Path::new(".hoodie/hoodie.properties"))
        .unwrap_or_default();
    String::from_utf8_lossy(&props)
        .lines()
        .find_map(|l| l.strip_prefix("hoodie.timeline.history.path="))
        .map(str::trim)
        .filter(|p| !p.is_empty() && !p.contains(".."))
        .unwrap_or("history")
        .to_owned()
}

/// Hudi 1.x's LSM timeline: `_version_` names the manifest in force
/// (`manifest_<version>`, JSON: the Parquet files that make up the archive now —
/// files merged into a higher level are dropped from it), each file
/// `<min instant>_<max instant>_<level>.parquet` with one row per archived
/// instant (`instantTime`, `completionTime`, `action`, `metadata`: the commit
/// metadata as the active timeline held it). Files whose newest instant is not
/// after `after` are not opened.
fn hudi_archived(
    t: &dyn Tree,
    history: &Path,
    after: Option<i64>,
) -> Result<Vec<Snapshot>, ScanError> {
    let version_file = history.join("_version_");
    if !t.exists(&version_file) {
        return Ok(Vec::new()); // nothing archived yet
    }
    let version = String::from_utf8_lossy(&t.read(&version_file)?)
        .trim()
        .to_owned();
    if version.is_empty() || !version.bytes().all(|b| b.is_ascii_digit()) {
        return Err(corrupt(
            t,
            &version_file,
            format!("not a version: {version:?}"),
        ));
    }
    let manifest_path = history.join(format!("manifest_{version}"));
    let manifest = read_json(t, &manifest_path)?;
    let files = manifest["files"]
        .as_array()
        .ok_or_else(|| corrupt(t, &manifest_path, "no `files` list"))?;
    let mut out = Vec::new();
    for f in files {
        let name = f["fileName"]
            .as_str()
            .ok_or_else(|| corrupt(t, &manifest_path, "a file without `fileName`"))?;
        let newest = name
            .split('_')
            .nth(1)
            .and_then(|max| crate::normalize::hudi_instant(max).ok())
            .map(|(seq, _)| seq);
        if newest.is_some_and(|n| after.is_some_and(|a| n <= a)) {
            continue;
        }
        let path = history.join(name);
        for (instant, action, metadata) in archived_rows(t, &path)? {
            if !HUDI_ACTIONS.contains(&action.as_str()) {
                continue;
            }
            let meta = match metadata.filter(|_| hudi_writes(&action)) {
                Some(bytes) => Some(commit_metadata_of(&bytes).map_err(|e| {
                    corrupt(t, &path, format!("instant {instant}'s metadata: {e}"))
                })?),
                None => None,
            };
            if let Some(s) = hudi_snapshot(&instant, &action, meta.as_ref())
                && after.is_none_or(|a| s.sequence > a)
            {
                out.push(s);
            }
        }
    }
    Ok(out)
}

/// One archived instant: `(instantTime, action, metadata)`.
type ArchivedRow = (String, String, Option<Vec<u8>>);

/// Every row of an archived timeline file.
fn archived_rows(t: &dyn Tree, path: &Path) -> Result<Vec<ArchivedRow>, ScanError> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::Field;
    let bad = |e: parquet::errors::ParquetError| corrupt(t, path, format!("Parquet: {e}"));
    let reader = SerializedFileReader::new(bytes::Bytes::from(t.read(path)?)).map_err(bad)?;
    let mut rows = Vec::new();
    for row in reader.get_row_iter(None).map_err(bad)? {
        let row = row.map_err(bad)?;
        let (mut instant, mut action, mut metadata) = (None, None, None);
        for (name, field) in row.get_column_iter() {
            match (name.as_str(), field) {
                ("instantTime", Field::Str(s)) => instant = Some(s.clone()),
                ("action", Field::Str(s)) => action = Some(s.clone()),
                ("metadata", Field::Bytes(b)) => metadata = Some(b.data().to_vec()),
                _ => {}
            }
        }
        let (Some(instant), Some(action)) = (instant, action) else {
            return Err(corrupt(t, path, "a row without instantTime or action"));
        };
        rows.push((instant, action, metadata));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sluice-scan-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// A COPY_ON_WRITE table Hudi 1.0.2 wrote with Spark (ten upserts, a clean
    /// after each, `hoodie.keep.min.commits` 3 / `max` 4): its oldest instants
    /// are in the archived timeline's Parquet files, the rest active.
    #[test]
    fn hudi_archived_instants_are_read_from_the_lsm_history() {
        let t = LocalTree(PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/testdata/hudi-1.0.2-archived"
        )));
        let all = scan(TableFormat::Hudi, &t, None).expect("scan");
        let data: Vec<&Snapshot> = all
            .iter()
            .filter(|s| s.operation == Operation::Append)
            .collect();
        let active = t
            .list(Path::new(".hoodie/timeline"))
            .expect("list")
            .iter()
            .filter(|n| n.ends_with(".commit"))
            .count();
        assert_eq!(active, 4, "the fixture keeps four commits active");
        assert_eq!(data.len(), 10, "ten upserts, six of them archived");
        let seqs: Vec<i64> = all.iter().map(|s| s.sequence).collect();
        let mut sorted = seqs.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(seqs, sorted, "in order, each instant once");
        assert!(
            data.iter().all(|s| s.partitions.len() == 1
                && s.attributes
                    .iter()
                    .any(|(k, v)| k == "hudi.operation_type" && v == "UPSERT")),
            "archived commits carry their partitions and operation: {data:?}"
        );
        assert!(all.iter().any(|s| s.operation == Operation::Clean));
        // Resuming after the 5th upsert (archived): the five after it, once each.
        let fifth = data[4].sequence;
        let rest = scan(TableFormat::Hudi, &t, Some(fifth)).expect("scan");
        let rest: Vec<i64> = rest
            .iter()
            .filter(|s| s.operation == Operation::Append)
            .map(|s| s.sequence)
            .collect();
        let want: Vec<i64> = data[5..].iter().map(|s| s.sequence).collect();
        assert_eq!(rest, want);
    }

    #[test]
    fn expiry_of_paimon_snapshots_and_delta_logs() {
        let t = dir("expired");
        std::fs::create_dir_all(t.join("snapshot")).expect("dir");
        for n in ["snapshot-3", "snapshot-4", "LATEST", "EARLIEST"] {
            std::fs::write(t.join("snapshot").join(n), "{}").expect("w");
        }
        let tree = LocalTree(t.clone());
        assert_eq!(
            expired(TableFormat::Paimon, &tree).expect("ok"),
            Some((2, 2))
        );
        std::fs::write(t.join("snapshot/snapshot-1"), "{}").expect("w");
        assert_eq!(expired(TableFormat::Paimon, &tree).expect("ok"), None);
        let log = t.join("_delta_log");
        std::fs::create_dir_all(&log).expect("dir");
        std::fs::write(log.join(format!("{:020}.json", 5)), "").expect("w");
        assert_eq!(
            expired(TableFormat::Delta, &tree).expect("ok"),
            None,
            "no checkpoint"
        );
        std::fs::write(log.join("_last_checkpoint"), r#"{"version": 4}"#).expect("w");
        assert_eq!(
            expired(TableFormat::Delta, &tree).expect("ok"),
            Some((4, 4))
        );
        let _ = std::fs::remove_dir_all(&t);
    }

    #[test]
    fn hudi_both_layouts_completed_instants_only() {
        let t = dir("hudi0");
        let h = t.join(".hoodie");
        std::fs::create_dir_all(&h).expect("dir");
        std::fs::write(h.join("hoodie.properties"), "hoodie.table.name=orders\n").expect("w");
        std::fs::write(h.join("20241201120000000.commit"), r#"{"partitionToWriteStats": {}, "compacted": false, "extraMetadata": {}, "operationType": "UPSERT"}"#).expect("w");
        std::fs::write(h.join("20241201130000000.commit.requested"), "").expect("w");
        std::fs::write(h.join("20241201130000000.inflight"), "").expect("w");
        std::fs::write(
            h.join("20241201140000000.replacecommit"),
            r#"{"operationType": "CLUSTER"}"#,
        )
        .expect("w");
        let s = scan(TableFormat::Hudi, &LocalTree(t.clone()), None).expect("scan");
        assert_eq!(
            s.iter()
                .map(|s| (s.sequence, s.operation))
                .collect::<Vec<_>>(),
            [
                (20241201120000000, Operation::Append),
                (20241201140000000, Operation::Cluster)
            ]
        );
        // A completed file still being written is not turned into an event.
        std::fs::write(h.join("20241201150000000.commit"), r#"{"partitionToWr"#).expect("w");
        assert!(matches!(
            scan(TableFormat::Hudi, &LocalTree(t.clone()), None),
            Err(ScanError::Corrupt { .. })
        ));

        let t = dir("hudi1");
        let tl = t.join(".hoodie/timeline");
        std::fs::create_dir_all(&tl).expect("dir");
        let schema = apache_avro::Schema::parse_str(
            r#"{"type": "record", "name": "HoodieCommitMetadata", "namespace": "org.apache.hudi.avro.model",
                "fields": [{"name": "extraMetadata", "type": ["null", {"type": "map", "values": "string"}], "default": null},
                           {"name": "operationType", "type": ["null", "string"], "default": null}]}"#,
        )
        .expect("schema");
        let mut w = apache_avro::Writer::new(&schema, Vec::new()).expect("writer");
        let mut rec = apache_avro::types::Record::new(&schema).expect("record");
        rec.put(
            "extraMetadata",
            apache_avro::types::Value::Union(0, Box::new(apache_avro::types::Value::Null)),
        );
        rec.put(
            "operationType",
            apache_avro::types::Value::Union(1, Box::new("insert_overwrite".into())),
        );
        w.append_value(rec).expect("append");
        let file = w.into_inner().expect("avro file");
        let done = tl.join("20241201120000000_20241201120001000.replacecommit");
        std::fs::write(&done, &file[..file.len() / 2]).expect("w");
        assert!(
            matches!(
                scan(TableFormat::Hudi, &LocalTree(t.clone()), Some(0)),
                Err(ScanError::Corrupt { .. })
            ),
            "a cut-short Avro data file is retried, not an event"
        );
        std::fs::write(&done, &file).expect("w");
        std::fs::write(tl.join("20241201130000000.deltacommit.inflight"), "").expect("w");
        let s = scan(TableFormat::Hudi, &LocalTree(t.clone()), Some(0)).expect("scan");
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].sequence, 20241201120000000);
        assert_eq!(s[0].operation, Operation::Overwrite);
        assert!(
            s[0].attributes
                .contains(&("hudi.operation_type".into(), "insert_overwrite".into()))
        );
    }

    #[test]
    fn paimon_scans_forward_and_ignores_hints() {
        let t = dir("paimon");
        let d = t.join("snapshot");
        std::fs::create_dir_all(&d).expect("dir");
        for id in [3, 4, 5] {
            let kind = if id == 4 { "COMPACT" } else { "APPEND" };
            std::fs::write(d.join(format!("snapshot-{id}")), format!(
                r#"{{"version": 3, "id": {id}, "schemaId": 0, "commitKind": "{kind}", "timeMillis": {}, "watermark": -9223372036854775808}}"#, 1000 + id)).expect("w");
        }
        std::fs::write(d.join("LATEST"), "9").expect("w"); // a wrong hint
        let s = scan(TableFormat::Paimon, &LocalTree(t.clone()), Some(3)).expect("scan");
        assert_eq!(
            s.iter()
                .map(|s| (s.sequence, s.operation, s.watermark_ms))
                .collect::<Vec<_>>(),
            [(4, Operation::Compact, None), (5, Operation::Append, None)]
        );
    }
}
