//! Iceberg: a table's state is what its catalog committed. The current metadata
//! file is the one the catalog points to — a SQL / JDBC catalog's
//! `iceberg_tables.metadata_location` row, a REST catalog's loadTable answer,
//! `metadata/version-hint.text` for Hadoop tables — never the highest-numbered
//! file in `metadata/`: a writer that crashed before the pointer swap, or lost the
//! optimistic-concurrency race, leaves a file that never committed. The directory
//! scan survives only as the explicit `directory` catalog.
//!
//! History comes from the current metadata alone: the ancestry of the followed
//! ref (`main` unless the table names another branch or tag). Commits to other
//! branches are not commits of the table.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use sluice_core::Operation;
use sluice_kit::uri::component;

use super::formats::{Facts, ScanError, Snapshot, Tree};

/// Where the current metadata of a table is found (`catalog` of a polled table).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Catalog {
    /// A SQL / JDBC catalog (pyiceberg's SqlCatalog, Iceberg's JdbcCatalog): the
    /// `metadata_location` of the `iceberg_tables` row.
    Sql {
        /// The URI pyiceberg's SqlCatalog is given (SQLAlchemy form):
        /// `sqlite:////abs/catalog.db` (three slashes for a relative path) or
        /// `postgresql://user@host:port/db` (a `+driver` suffix is ignored).
        uri: String,
        /// The catalog's name (`catalog_name` column).
        name: String,
        /// `namespace.table` (a nested namespace is `a.b.table`).
        table: String,
    },
    /// A Hadoop table: `metadata/version-hint.text` names `v<N>.metadata.json`.
    Hadoop,
    /// An Iceberg REST catalog: `GET {uri}/v1/{prefix}/namespaces/{ns}/tables/{table}`.
    Rest {
        uri: String,
        /// `namespace.table`.
        table: String,
        /// The catalog's path prefix; when unset, `GET /v1/config`'s
        /// `overrides.prefix` (none if it has none).
        #[serde(default)]
        prefix: Option<String>,
        /// Name of an environment variable holding a bearer token.
        #[serde(default)]
        token_env: Option<String>,
    },
    /// Fallback for a catalog Sluice cannot ask: the highest-numbered metadata
    /// file in `metadata/`. It can name a commit that never happened; documented.
    Directory,
}

impl Catalog {
    /// Problems with the settings, for the start-up check (and the ingester's
    /// own environment: a token variable must be set).
    pub fn problems(&self) -> Vec<String> {
        self.problems_where(true)
    }

    /// Problems with the settings; `here`: whether this process is the one that
    /// reads the catalog (the API checks a declared table without its environment).
    pub fn problems_where(&self, here: bool) -> Vec<String> {
        let mut out = Vec::new();
        match self {
            Catalog::Sql { uri, name, table } => {
                if !here && uri_has_password(uri) {
                    out.push(
                        "catalog uri: a declared table holds no password; give the ingester \
                         PGPASSWORD or a ~/.pgpass instead"
                            .into(),
                    );
                }
                if sql_backend(uri).is_none() {
                    out.push(format!(
                        "catalog uri {uri:?}: sqlite:///… or postgresql://… expected"
                    ));
                }
                if name.is_empty() {
                    out.push("catalog name is empty".into());
                }
                if split_table(table).is_none() {
                    out.push(format!("catalog table {table:?}: namespace.table expected"));
                }
            }
            Catalog::Rest {
                uri,
                table,
                token_env,
                ..
            } => {
                if !(uri.starts_with("http://") || uri.starts_with("https://")) {
                    out.push(format!("catalog uri {uri:?}: http(s):// expected"));
                }
                if split_table(table).is_none() {
                    out.push(format!("catalog table {table:?}: namespace.table expected"));
                }
                if let Some(var) = token_env
                    && here
                    && std::env::var(var).is_err()
                {
                    out.push(format!("catalog token_env {var}: not set"));
                }
            }
            Catalog::Hadoop | Catalog::Directory => {}
        }
        out
    }
}

/// Whether `user:password@` is written into a URI.
fn uri_has_password(uri: &str) -> bool {
    uri.split_once("://")
        .and_then(|(_, rest)| rest.split_once('@'))
        .is_some_and(|(userinfo, _)| !userinfo.contains('/') && userinfo.contains(':'))
}

/// `a.b.table` → (["a", "b"], "table").
fn split_table(ident: &str) -> Option<(Vec<&str>, &str)> {
    let (ns, table) = ident.rsplit_once('.')?;
    let parts: Vec<&str> = ns.split('.').collect();
    (!table.is_empty() && parts.iter().all(|p| !p.is_empty())).then_some((parts, table))
}

enum Backend {
    Sqlite(String),
    Postgres(String),
}

fn sql_backend(uri: &str) -> Option<Backend> {
    let (scheme, rest) = uri.split_once("://")?;
    let scheme = scheme.split('+').next().unwrap_or(scheme);
    match scheme {
        // SQLAlchemy's form, as pyiceberg takes it: `sqlite:///rel.db`, `sqlite:////abs.db`.
        "sqlite" => rest
            .strip_prefix('/')
            .filter(|p| !p.is_empty())
            .map(|p| Backend::Sqlite(p.to_owned())),
        "postgres" | "postgresql" => Some(Backend::Postgres(format!("postgres://{rest}"))),
        _ => None,
    }
}

/// An open connection to a table's catalog, kept between polls.
pub enum Client {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
    Http(reqwest::Client),
    None,
}

impl Client {
    pub fn open(catalog: &Catalog) -> Result<Client, String> {
        match catalog {
            Catalog::Sql { uri, .. } => match sql_backend(uri) {
                Some(Backend::Sqlite(file)) => {
                    let opts = sqlx::sqlite::SqliteConnectOptions::new().filename(file);
                    Ok(Client::Sqlite(
                        sqlx::pool::PoolOptions::new()
                            .max_connections(1)
                            .acquire_timeout(Duration::from_secs(10))
                            .connect_lazy_with(opts.read_only(true)),
                    ))
                }
                Some(Backend::Postgres(url)) => {
                    let opts: sqlx::postgres::PgConnectOptions =
                        url.parse().map_err(|e| format!("catalog uri: {e}"))?;
                    Ok(Client::Postgres(
                        sqlx::pool::PoolOptions::new()
                            .max_connections(1)
                            .acquire_timeout(Duration::from_secs(10))
                            .connect_lazy_with(opts),
                    ))
                }
                None => Err(format!("catalog uri {uri:?} is not sqlite or postgresql")),
            },
            Catalog::Rest { .. } => reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(5))
                .timeout(Duration::from_secs(30))
                .build()
                .map(Client::Http)
                .map_err(|e| e.to_string()),
            Catalog::Hadoop | Catalog::Directory => Ok(Client::None),
        }
    }
}

/// What the catalog says the table is now: its metadata document, and the
/// file it came from (for errors).
pub struct Current {
    pub metadata: Value,
    pub location: String,
}

fn catalog_error(what: impl Into<String>, reason: impl std::fmt::Display) -> ScanError {
    ScanError::Corrupt {
        path: PathBuf::from(what.into()),
        reason: reason.to_string(),
    }
}

/// The table's current metadata per its catalog. `tree` reads the table's files
/// (blocking: called on a blocking thread by `read_current`).
pub async fn current(
    catalog: &Catalog,
    client: &Client,
    tree: std::sync::Arc<dyn Tree>,
    table_path: &Path,
) -> Result<Current, ScanError> {
    match (catalog, client) {
        (Catalog::Sql { name, table, .. }, Client::Sqlite(_) | Client::Postgres(_)) => {
            let (ns, tbl) = split_table(table)
                .ok_or_else(|| catalog_error(table.clone(), "namespace.table expected"))?;
            let ns = ns.join(".");
            const Q: &str = "SELECT metadata_location FROM iceberg_tables \
                             WHERE catalog_name = $1 AND table_namespace = $2 AND table_name = $3";
            macro_rules! location {
                ($pool:expr) => {
                    sqlx::query_scalar(Q)
                        .bind(name)
                        .bind(&ns)
                        .bind(tbl)
                        .fetch_optional($pool)
                        .await
                };
            }
            let row: Result<Option<Option<String>>, sqlx::Error> = match client {
                Client::Sqlite(pool) => location!(pool),
                Client::Postgres(pool) => location!(pool),
                _ => return Err(catalog_error(table.clone(), "no SQL connection")),
            };
            let what = format!("catalog {name} table {table}");
            let location = match row {
                Err(e) => return Err(catalog_error(what, format!("catalog query failed: {e}"))),
                Ok(None) => return Err(ScanError::NoTable(PathBuf::from(what))),
                Ok(Some(None)) => return Err(catalog_error(what, "metadata_location is NULL")),
                Ok(Some(Some(l))) => l,
            };
            read_located(tree, table_path, location).await
        }
        (Catalog::Hadoop, _) => {
            let t = tree.clone();
            let hint = tokio::task::spawn_blocking(move || {
                t.read(Path::new("metadata/version-hint.text"))
            })
            .await
            .map_err(|e| catalog_error("version-hint.text", e))??;
            let text = String::from_utf8_lossy(&hint);
            let version: i64 = text.trim().parse().map_err(|_| ScanError::Corrupt {
                path: tree.full(Path::new("metadata/version-hint.text")),
                reason: format!("{:?} is not a version number", text.trim()),
            })?;
            let rel = PathBuf::from(format!("metadata/v{version}.metadata.json"));
            read_relative(tree, rel).await
        }
        (
            Catalog::Rest {
                uri,
                table,
                prefix,
                token_env,
            },
            Client::Http(http),
        ) => {
            let token = token_env.as_ref().and_then(|v| std::env::var(v).ok());
            rest_load(http, uri, table, prefix.as_deref(), token.as_deref()).await
        }
        (Catalog::Directory, _) => {
            let t = tree.clone();
            let newest = tokio::task::spawn_blocking(move || newest_in_directory(t.as_ref()))
                .await
                .map_err(|e| catalog_error("metadata/", e))??;
            read_relative(tree, newest).await
        }
        _ => Err(catalog_error("catalog", "no client for this catalog")),
    }
}

/// `00003-<uuid>.metadata.json` (catalogs) or `v3.metadata.json` (Hadoop) → 3.
fn metadata_version(name: &str) -> Option<i64> {
    let stem = name.strip_suffix(".metadata.json")?;
    let n = stem.strip_prefix('v').unwrap_or(stem);
    n.split('-').next()?.parse().ok()
}

/// The `directory` fallback: the highest-numbered metadata file.
pub fn newest_in_directory(t: &dyn Tree) -> Result<PathBuf, ScanError> {
    let dir = PathBuf::from("metadata");
    let newest = t
        .list(&dir)?
        .into_iter()
        .filter_map(|n| metadata_version(&n).map(|v| (v, n)))
        .max()
        .ok_or_else(|| ScanError::NoTable(t.full(&dir)))?;
    Ok(dir.join(newest.1))
}

async fn read_relative(tree: std::sync::Arc<dyn Tree>, rel: PathBuf) -> Result<Current, ScanError> {
    let location = tree.full(&rel).display().to_string();
    let metadata = tokio::task::spawn_blocking(move || {
        let bytes = tree.read(&rel)?;
        serde_json::from_slice::<Value>(&bytes).map_err(|e| ScanError::Corrupt {
            path: tree.full(&rel),
            reason: format!("not complete JSON: {e}"),
        })
    })
    .await
    .map_err(|e| catalog_error(location.clone(), e))??;
    Ok(Current { metadata, location })
}

/// Reads the metadata file a catalog points to, as a path inside the table.
async fn read_located(
    tree: std::sync::Arc<dyn Tree>,
    table_path: &Path,
    location: String,
) -> Result<Current, ScanError> {
    let rel = relative_to(table_path, &location).ok_or_else(|| {
        catalog_error(
            location.clone(),
            format!(
                "the catalog points outside the table's path {}",
                table_path.display()
            ),
        )
    })?;
    read_relative(tree, rel).await
}

/// `file:///w/db/t/metadata/x.json` under `/w/db/t` → `metadata/x.json`
/// (`s3a://` reads as `s3://`).
pub fn relative_to(table_path: &Path, location: &str) -> Option<PathBuf> {
    fn norm(s: &str) -> String {
        let s = s
            .strip_prefix("file://")
            .or_else(|| s.strip_prefix("file:"))
            .unwrap_or(s);
        let s = s
            .strip_prefix("s3a://")
            .map_or_else(|| s.to_owned(), |r| format!("s3://{r}"));
        s.trim_end_matches('/').to_owned()
    }
    let base = norm(&table_path.to_string_lossy());
    let loc = norm(location);
    let rest = loc.strip_prefix(&base)?.strip_prefix('/')?;
    (!rest.is_empty() && !rest.split('/').any(|p| p == "..")).then(|| PathBuf::from(rest))
}

/// Iceberg REST: loadTable. Errors keep the catalog's own message.
async fn rest_load(
    http: &reqwest::Client,
    uri: &str,
    table: &str,
    prefix: Option<&str>,
    token: Option<&str>,
) -> Result<Current, ScanError> {
    let base = uri.trim_end_matches('/');
    let get = |url: String| {
        let req = http.get(url);
        match token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    };
    let prefix = match prefix {
        Some(p) => Some(p.trim_matches('/').to_owned()),
        None => {
            let url = format!("{base}/v1/config");
            let config = rest_json(get(url.clone()), &url).await?;
            config
                .pointer("/overrides/prefix")
                .and_then(Value::as_str)
                .map(|p| p.trim_matches('/').to_owned())
        }
    };
    let (ns, tbl) = split_table(table)
        .ok_or_else(|| catalog_error(table.to_owned(), "namespace.table expected"))?;
    // Multi-level namespaces are joined by the unit separator (0x1F), escaped.
    let ns = ns
        .iter()
        .map(|p| component(p))
        .collect::<Vec<_>>()
        .join("%1F");
    let url = match prefix.as_deref().filter(|p| !p.is_empty()) {
        Some(p) => format!("{base}/v1/{p}/namespaces/{ns}/tables/{}", component(tbl)),
        None => format!("{base}/v1/namespaces/{ns}/tables/{}", component(tbl)),
    };
    let body = rest_json(get(url.clone()), &url).await?;
    let metadata = body
        .get("metadata")
        .filter(|m| m.is_object())
        .cloned()
        .ok_or_else(|| catalog_error(url.clone(), "loadTable answer has no `metadata` object"))?;
    let location = body
        .get("metadata-location")
        .and_then(Value::as_str)
        .map_or(url, str::to_owned);
    Ok(Current { metadata, location })
}

async fn rest_json(req: reqwest::RequestBuilder, url: &str) -> Result<Value, ScanError> {
    let resp = req
        .send()
        .await
        .map_err(|e| catalog_error(url, format!("REST catalog unreachable: {e}")))?;
    let status = resp.status();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    if status == reqwest::StatusCode::NOT_FOUND {
        return Err(ScanError::NoTable(PathBuf::from(url)));
    }
    if !status.is_success() {
        // The spec's ErrorModel: {"error": {"message", "type", "code"}}.
        let msg = body
            .pointer("/error/message")
            .and_then(Value::as_str)
            .unwrap_or("no error message");
        return Err(catalog_error(
            url,
            format!("REST catalog answered {status}: {msg}"),
        ));
    }
    Ok(body)
}

/// The commits of the followed ref in the current metadata, oldest first.
///
/// Sequence: format v2+ carries `sequence-number`. Format v1 has none, so Sluice
/// derives an order that no expiry can change: `timestamp-ms × 1000` plus the
/// snapshot's rank among its ancestors committed in the same millisecond.
pub fn snapshots(meta: &Value, follow: &str) -> Result<Vec<Snapshot>, String> {
    let version = meta
        .get("format-version")
        .and_then(Value::as_i64)
        .ok_or("no format-version")?;
    let list = match meta.get("snapshots") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(_) => return Err("`snapshots` is not an array".into()),
    };
    let mut by_id: HashMap<i64, &Value> = HashMap::with_capacity(list.len());
    for (i, s) in list.iter().enumerate() {
        let id = s
            .get("snapshot-id")
            .and_then(Value::as_i64)
            .ok_or_else(|| format!("snapshots[{i}] has no snapshot-id"))?;
        by_id.insert(id, s);
    }
    // The head of the followed ref; v1 tables and old writers have only
    // `current-snapshot-id` (which is `main`).
    let head = match meta.pointer(&format!(
        "/refs/{}",
        follow.replace('~', "~0").replace('/', "~1")
    )) {
        Some(r) => r.get("snapshot-id").and_then(Value::as_i64),
        None if follow == "main" => meta
            .get("current-snapshot-id")
            .and_then(Value::as_i64)
            .filter(|id| *id >= 0),
        None => return Err(format!("no ref {follow:?} in the table")),
    };
    let mut chain = Vec::new();
    let mut at = head;
    while let Some(id) = at {
        let Some(s) = by_id.get(&id) else { break }; // older ancestors expired
        if chain.len() > list.len() {
            return Err("the snapshot ancestry has a cycle".into());
        }
        chain.push(*s);
        at = s.get("parent-snapshot-id").and_then(Value::as_i64);
    }
    chain.reverse();
    let mut out: Vec<Snapshot> = Vec::with_capacity(chain.len());
    let mut same_ms = 0i64;
    for s in chain {
        let id = s.get("snapshot-id").and_then(Value::as_i64).unwrap_or(0);
        let ts = s
            .get("timestamp-ms")
            .and_then(Value::as_i64)
            .ok_or_else(|| format!("snapshot {id} has no timestamp-ms"))?;
        let sequence = if version >= 2 {
            s.get("sequence-number")
                .and_then(Value::as_i64)
                .ok_or_else(|| {
                    format!("snapshot {id} of a v{version} table has no sequence-number")
                })?
        } else {
            same_ms = match out.last() {
                Some(prev) if prev.commit_time_ms == ts => same_ms + 1,
                _ => 0,
            };
            ts.checked_mul(1000)
                .and_then(|t| t.checked_add(same_ms.min(999)))
                .ok_or_else(|| format!("snapshot {id}: timestamp-ms {ts} out of range"))?
        };
        let op = s
            .pointer("/summary/operation")
            .and_then(Value::as_str)
            .unwrap_or("append");
        let mut partitions: Vec<String> = s
            .get("summary")
            .and_then(Value::as_object)
            .map(|m| {
                m.keys()
                    .filter_map(|k| k.strip_prefix("partitions."))
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        partitions.sort();
        out.push(Snapshot {
            snapshot_id: id,
            sequence,
            commit_time_ms: ts,
            operation: match op {
                "append" => Operation::Append,
                "overwrite" => Operation::Overwrite,
                "delete" => Operation::Delete,
                "replace" => Operation::Compact, // rewrites files, data unchanged
                _ => Operation::Other,
            },
            watermark_ms: None,
            schema_id: s.get("schema-id").and_then(Value::as_i64),
            partitions,
            manifest_list: s
                .get("manifest-list")
                .and_then(Value::as_str)
                .map(str::to_owned),
            attributes: vec![("iceberg.operation".into(), op.into())],
        });
    }
    Ok(out)
}

/// The partitions a snapshot added data files to, read from its manifests: the
/// fallback when the snapshot summary does not list them (a table without
/// `write.summary.partition-limit`). Manifests of other snapshots and files that
/// were not added by this one are skipped. Values are rendered as Iceberg renders
/// identity partitions (`dt=2024-12-01`); other transforms show their raw value.
pub fn manifest_partitions(
    tree: &dyn Tree,
    table_path: &Path,
    snapshot_id: i64,
    manifest_list: &str,
) -> Result<Vec<String>, ScanError> {
    use apache_avro::types::Value as Avro;
    let read_avro = |location: &str| -> Result<Vec<Avro>, ScanError> {
        let rel = relative_to(table_path, location).ok_or_else(|| {
            catalog_error(location.to_owned(), "a manifest outside the table's path")
        })?;
        let bytes = tree.read(&rel)?;
        let corrupt = |e: apache_avro::Error| ScanError::Corrupt {
            path: tree.full(&rel),
            reason: format!("Avro manifest: {e}"),
        };
        apache_avro::Reader::new(&bytes[..])
            .map_err(corrupt)?
            .map(|r| r.map_err(corrupt))
            .collect()
    };
    // A record's field (unions unwrapped), keeping the record's own field order.
    fn field<'a>(v: &'a Avro, name: &str) -> Option<&'a Avro> {
        match v {
            Avro::Union(_, inner) => field(inner, name),
            Avro::Record(fields) => fields.iter().find(|(n, _)| n == name).map(|(_, v)| v),
            _ => None,
        }
    }
    fn long(v: Option<&Avro>) -> Option<i64> {
        match v? {
            Avro::Union(_, inner) => long(Some(inner)),
            Avro::Long(n) => Some(*n),
            Avro::Int(n) => Some(i64::from(*n)),
            _ => None,
        }
    }
    fn text(v: &Avro) -> String {
        match v {
            Avro::Union(_, inner) => text(inner),
            Avro::Null => "null".into(),
            Avro::String(s) => s.clone(),
            Avro::Int(n) | Avro::Date(n) => n.to_string(),
            Avro::Long(n) => n.to_string(),
            Avro::Boolean(b) => b.to_string(),
            other => Value::try_from(other.clone()).map_or_else(|_| "?".into(), |j| j.to_string()),
        }
    }
    let mut out = std::collections::BTreeSet::new();
    for m in read_avro(manifest_list)? {
        let added_here = long(field(&m, "added_snapshot_id")) == Some(snapshot_id);
        let data = long(field(&m, "content")).unwrap_or(0) == 0;
        let path = match field(&m, "manifest_path") {
            Some(Avro::String(p)) => p.clone(),
            _ => continue,
        };
        if !(added_here && data) {
            continue;
        }
        for entry in read_avro(&path)? {
            // status 1 = ADDED; a null snapshot id is inherited from the manifest's.
            let added = long(field(&entry, "status")) == Some(1);
            let by_this = long(field(&entry, "snapshot_id")).is_none_or(|id| id == snapshot_id);
            let partition = field(&entry, "data_file").and_then(|d| field(d, "partition"));
            if let (true, true, Some(Avro::Record(fields))) = (added, by_this, partition)
                && !fields.is_empty()
            {
                out.insert(
                    fields
                        .iter()
                        .map(|(k, v)| format!("{k}={}", text(v)))
                        .collect::<Vec<_>>()
                        .join("/"),
                );
            }
        }
    }
    Ok(out.into_iter().collect())
}

/// What the current metadata says beyond its commits: a schema change made
/// without a snapshot (the head's sequence and snapshot id with the current schema
/// id), and how far history was expired (the oldest retained snapshot's parent is
/// gone, so everything before that snapshot is).
pub fn facts(meta: &Value, follow: &str, commits: &[Snapshot]) -> Facts {
    let mut out = Facts::default();
    let (Some(head), Some(oldest)) = (commits.last(), commits.first()) else {
        return out;
    };
    if let (Some(current), Some(written)) = (
        meta.get("current-schema-id").and_then(Value::as_i64),
        head.schema_id,
    ) && current > written
        && follow == "main"
    {
        out.schema = Some((head.sequence, head.snapshot_id, current));
    }
    let parent = meta
        .get("snapshots")
        .and_then(Value::as_array)
        .and_then(|all| {
            all.iter()
                .find(|s| s.get("snapshot-id").and_then(Value::as_i64) == Some(oldest.snapshot_id))
        })
        .and_then(|s| s.get("parent-snapshot-id"))
        .and_then(Value::as_i64);
    if let Some(parent) = parent {
        out.expired = Some((oldest.sequence - 1, parent));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn snap(id: i64, parent: Option<i64>, seq: Option<i64>, ts: i64) -> Value {
        let mut s =
            json!({"snapshot-id": id, "timestamp-ms": ts, "summary": {"operation": "append"}});
        if let Some(p) = parent {
            s["parent-snapshot-id"] = json!(p);
        }
        if let Some(q) = seq {
            s["sequence-number"] = json!(q);
        }
        s
    }

    #[test]
    fn only_the_ancestry_of_the_followed_ref_is_the_table() {
        // main: 1 ← 2 ← 4; branch audit: 1 ← 2 ← 3.
        let meta = json!({"format-version": 2, "current-snapshot-id": 4,
            "refs": {"main": {"snapshot-id": 4, "type": "branch"}, "audit": {"snapshot-id": 3, "type": "branch"}},
            "snapshots": [snap(1, None, Some(1), 10), snap(2, Some(1), Some(2), 20),
                          snap(3, Some(2), Some(3), 30), snap(4, Some(2), Some(4), 40)]});
        let ids = |r: &str| -> Vec<i64> {
            snapshots(&meta, r)
                .expect("ok")
                .iter()
                .map(|s| s.snapshot_id)
                .collect()
        };
        assert_eq!(ids("main"), [1, 2, 4]);
        assert_eq!(ids("audit"), [1, 2, 3]);
        assert!(snapshots(&meta, "nope").is_err());
    }

    #[test]
    fn a_v1_order_does_not_change_when_old_snapshots_expire() {
        let all = json!({"format-version": 1, "current-snapshot-id": 3,
            "snapshots": [snap(1, None, None, 100), snap(2, Some(1), None, 200), snap(3, Some(2), None, 200)]});
        let expired = json!({"format-version": 1, "current-snapshot-id": 4,
            "snapshots": [snap(2, Some(1), None, 200), snap(3, Some(2), None, 200), snap(4, Some(3), None, 300)]});
        let seq = |m: &Value| -> Vec<(i64, i64)> {
            snapshots(m, "main")
                .expect("ok")
                .iter()
                .map(|s| (s.snapshot_id, s.sequence))
                .collect()
        };
        assert_eq!(seq(&all), [(1, 100_000), (2, 200_000), (3, 200_001)]);
        // After snapshot 1 expired, 2 and 3 keep their sequences and 4 is newer.
        assert_eq!(seq(&expired), [(2, 200_000), (3, 200_001), (4, 300_000)]);
    }

    #[test]
    fn schema_changes_without_a_snapshot_and_expiry_are_facts() {
        let meta = json!({"format-version": 2, "current-snapshot-id": 3, "current-schema-id": 2,
            "snapshots": [snap(2, Some(1), Some(5), 20), snap(3, Some(2), Some(6), 30)]});
        let mut commits = snapshots(&meta, "main").expect("ok");
        for c in &mut commits {
            c.schema_id = Some(1);
        }
        assert_eq!(
            facts(&meta, "main", &commits),
            Facts {
                schema: Some((6, 3, 2)),
                expired: Some((4, 1)),
            }
        );
        commits[1].schema_id = Some(2);
        assert_eq!(facts(&meta, "main", &commits).schema, None);
    }

    #[test]
    fn summary_partitions_are_the_changed_partitions() {
        let mut s = snap(1, None, Some(1), 10);
        s["summary"]["partitions.dt=2024-12-02"] = json!("added-data-files=1");
        s["summary"]["partitions.dt=2024-12-01"] = json!("added-data-files=2");
        let meta = json!({"format-version": 2, "current-snapshot-id": 1, "snapshots": [s]});
        assert_eq!(
            snapshots(&meta, "main").expect("ok")[0].partitions,
            ["dt=2024-12-01", "dt=2024-12-02"]
        );
    }

    #[test]
    fn a_v2_snapshot_without_its_sequence_is_an_error_not_a_guess() {
        let meta = json!({"format-version": 2, "current-snapshot-id": 1, "snapshots": [snap(1, None, None, 10)]});
        assert!(snapshots(&meta, "main").is_err());
    }

    #[test]
    fn catalog_locations_map_into_the_table() {
        let t = Path::new("/w/db/t");
        assert_eq!(
            relative_to(t, "file:///w/db/t/metadata/00002-a.metadata.json"),
            Some(PathBuf::from("metadata/00002-a.metadata.json"))
        );
        assert_eq!(
            relative_to(t, "/w/db/t/metadata/x.json"),
            Some(PathBuf::from("metadata/x.json"))
        );
        assert_eq!(relative_to(t, "/w/db/other/metadata/x.json"), None);
        assert_eq!(relative_to(t, "/w/db/t/../u/x.json"), None);
        assert_eq!(
            relative_to(Path::new("s3://b/t"), "s3a://b/t/metadata/x.json"),
            Some(PathBuf::from("metadata/x.json"))
        );
    }

    /// A Hadoop table: the hint names v1 although v2 exists (a writer that has not
    /// swapped the hint yet); a hint to a file cut short is an error, not an event.
    #[tokio::test]
    async fn hadoop_tables_follow_their_version_hint() {
        let dir = std::env::temp_dir().join(format!("sluice-hadoop-{}", std::process::id()));
        let meta = dir.join("metadata");
        std::fs::create_dir_all(&meta).expect("dir");
        let doc = |head: i64| {
            json!({"format-version": 2, "current-snapshot-id": head,
                   "snapshots": [snap(1, None, Some(1), 10), snap(2, Some(1), Some(2), 20)]})
        };
        std::fs::write(meta.join("v1.metadata.json"), doc(1).to_string()).expect("w");
        std::fs::write(meta.join("v2.metadata.json"), doc(2).to_string()).expect("w");
        std::fs::write(meta.join("version-hint.text"), "1\n").expect("w");
        let tree: std::sync::Arc<dyn Tree> =
            std::sync::Arc::new(super::super::formats::LocalTree(dir.clone()));
        let read = async || current(&Catalog::Hadoop, &Client::None, tree.clone(), &dir).await;
        let now = read().await.expect("current");
        let ids: Vec<i64> = snapshots(&now.metadata, "main")
            .expect("ok")
            .iter()
            .map(|s| s.snapshot_id)
            .collect();
        assert_eq!(ids, [1], "only what the hint names");
        let directory = current(&Catalog::Directory, &Client::None, tree.clone(), &dir)
            .await
            .expect("current");
        assert_eq!(
            directory.metadata["current-snapshot-id"], 2,
            "the fallback takes the newest file"
        );
        std::fs::write(meta.join("v3.metadata.json"), &doc(2).to_string()[..20]).expect("w");
        std::fs::write(meta.join("version-hint.text"), "3").expect("w");
        assert!(matches!(read().await, Err(ScanError::Corrupt { .. })));
        std::fs::write(meta.join("version-hint.text"), "three").expect("w");
        assert!(matches!(read().await, Err(ScanError::Corrupt { .. })));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn catalog_settings_are_checked() {
        let c: Catalog = serde_json::from_value(
            json!({"kind": "sql", "uri": "mysql://x", "name": "", "table": "t"}),
        )
        .expect("parses");
        assert_eq!(c.problems().len(), 3, "{:?}", c.problems());
        assert!(serde_json::from_value::<Catalog>(json!({"kind": "glue"})).is_err());
    }
}
