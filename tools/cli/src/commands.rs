//! The commands that speak to `sluice-api`.

use std::path::Path;

use serde_json::{Value, json};

use crate::Command;
use crate::client::{Client, Config, Context, Failure, config_path, path};
use crate::output::{self, Format, col};

/// Lists go this far at the most.
const MAX_ITEMS: usize = 10_000;

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Kind {
    Asset,
    #[value(alias = "dependency", alias = "deps")]
    Dep,
    Run,
    Grant,
    Backfill,
    /// A declared target, named `KIND/NAME` (webhook/reports).
    Target,
    /// A declared polled table, named by its asset key.
    Table,
    /// A notification rule, by its name.
    #[value(alias = "notifications")]
    Notification,
}

#[derive(clap::Subcommand)]
pub enum Get {
    /// Assets and their latest commit.
    Assets {
        /// Only keys starting with this.
        #[arg(long)]
        prefix: Option<String>,
    },
    /// Dependencies, their status and last trigger.
    #[command(alias = "dependencies")]
    Deps {
        #[arg(long)]
        project: Option<String>,
        /// accepted or refused
        #[arg(long)]
        status: Option<String>,
    },
    /// Runs, UNKNOWN first.
    Runs {
        #[arg(long)]
        status: Option<String>,
        #[arg(long)]
        dependency: Option<String>,
        #[arg(long)]
        target: Option<String>,
    },
    Grants,
    /// Declared targets (the dispatcher's SLUICE_TARGETS bootstrap is not listed).
    Targets,
    /// Declared polled tables (the ingester's SLUICE_POLL_TABLES is not listed).
    Tables,
    /// Notification rules you may see.
    Notifications {
        #[arg(long)]
        project: Option<String>,
    },
    /// Notifications sent, waiting to be sent again, or DEAD, newest first.
    #[command(alias = "notification-deliveries")]
    Deliveries {
        /// PENDING, DELIVERED or DEAD
        #[arg(long)]
        status: Option<String>,
        #[arg(long)]
        rule: Option<String>,
    },
    /// Backfills and their progress, newest first.
    Backfills {
        #[arg(long)]
        dependency: Option<String>,
    },
    /// The audit log (admins).
    Audit,
}

/// `sluice backfill`: the dependency, exactly one range, and the pace.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("range").required(true).multiple(false)
    .args(["partitions", "from", "windows_from_ms", "input"])))]
pub struct BackfillArgs {
    pub dependency: String,
    /// These partitions, comma-separated: dt=2026-11-01,dt=2026-11-02
    #[arg(long, value_delimiter = ',')]
    pub partitions: Option<Vec<String>>,
    /// A partition range's first partition (dates: one a day; integers: one each).
    #[arg(long, requires = "to")]
    pub from: Option<String>,
    /// A partition range's last partition (included).
    #[arg(long, requires = "from")]
    pub to: Option<String>,
    /// A window dependency's windows that overlap from this time (epoch ms)…
    #[arg(long, requires = "windows_to_ms")]
    pub windows_from_ms: Option<i64>,
    /// …and before this one.
    #[arg(long, requires = "windows_from_ms")]
    pub windows_to_ms: Option<i64>,
    /// One input's commits, from the evidence log, by sequence…
    #[arg(long, requires_all = ["from_sequence", "to_sequence"])]
    pub input: Option<String>,
    #[arg(long, requires = "input")]
    pub from_sequence: Option<i64>,
    /// …to this one (included).
    #[arg(long, requires = "input")]
    pub to_sequence: Option<i64>,
    /// At most this many of its runs at once (never more than half the target's slots).
    #[arg(long)]
    pub max_in_flight: Option<u32>,
    /// At most this many of its runs started a minute.
    #[arg(long)]
    pub per_minute: Option<u32>,
    /// The same id is the same backfill; without one, the same range is.
    #[arg(long)]
    pub request_id: Option<String>,
    #[arg(long)]
    pub reason: Option<String>,
    /// Show the items; submit nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Follow its progress until every item ended (a bar on a terminal); exit 1
    /// if any failed or it was cancelled.
    #[arg(long)]
    pub wait: bool,
}

#[derive(clap::Subcommand)]
pub enum ConfigCmd {
    /// The contexts of the config file; `*` marks the current one.
    GetContexts,
    /// Make NAME the current context.
    UseContext { name: String },
    /// Add or replace a context.
    SetContext {
        name: String,
        #[arg(long)]
        server: String,
        #[arg(long, conflicts_with_all = ["token_file", "token_env"])]
        token: Option<String>,
        #[arg(long)]
        token_file: Option<std::path::PathBuf>,
        #[arg(long)]
        token_env: Option<String>,
    },
}

fn query(pairs: &[(&str, &Option<String>)]) -> String {
    let q: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| {
            v.as_ref()
                .map(|v| format!("{k}={}", sluice_kit::uri::component(v)))
        })
        .collect();
    if q.is_empty() {
        String::new()
    } else {
        format!("?{}", q.join("&"))
    }
}

pub async fn run(client: &Client, command: Command, format: Format) -> Result<(), Failure> {
    match command {
        Command::Get { what } => get(client, what, format).await,
        Command::Describe { kind, name } => {
            let path = match kind {
                Kind::Asset => path(&["v1", "assets", &name]),
                Kind::Dep => path(&["v1", "dependencies", &name]),
                Kind::Run => path(&["v1", "runs", &name]),
                Kind::Backfill => path(&["v1", "backfills", &name]),
                Kind::Target => target_path(&name, None)?,
                Kind::Table => path(&["v1", "tables", &name]),
                Kind::Notification => path(&["v1", "notifications", &name]),
                Kind::Grant => {
                    let all = client.list("/v1/grants", MAX_ITEMS).await?;
                    let one = all
                        .into_iter()
                        .find(|g| g["id"] == name.as_str())
                        .ok_or_else(|| Failure::Refused(format!("no grant {name:?}")))?;
                    return show(format, &one);
                }
            };
            show(format, &client.get(&path).await?)
        }
        Command::Explain { dependency, at_ms } => {
            let at = at_ms.map(|a| a.to_string());
            let e = client
                .get(&format!(
                    "{}{}",
                    path(&["v1", "dependencies", &dependency, "explain"]),
                    query(&[("at_ms", &at)])
                ))
                .await?;
            if !output::structured(format, &e) {
                output::explain(&e);
            }
            Ok(())
        }
        Command::Diff { files } => apply(client, &files, true, format).await,
        Command::Delete {
            kind,
            name,
            dry_run,
        } => {
            let path = match kind {
                Kind::Dep => path(&["v1", "dependencies", &name]),
                Kind::Grant => path(&["v1", "grants", &name]),
                Kind::Target => target_path(&name, None)?,
                Kind::Table => path(&["v1", "tables", &name]),
                Kind::Notification => path(&["v1", "notifications", &name]),
                other => {
                    return Err(Failure::Usage(format!("{other:?} cannot be deleted")));
                }
            };
            let dry = dry_run.then(|| "true".to_owned());
            let (_, v) = client
                .call(
                    "DELETE",
                    &format!("{path}{}", query(&[("dry_run", &dry)])),
                    None,
                )
                .await?;
            if !output::structured(format, &v) {
                let what = if dry_run {
                    "would be deleted"
                } else {
                    "deleted"
                };
                println!("{}/{name} {what}", kind_name(kind));
            }
            Ok(())
        }
        Command::Pause {
            dependency,
            target,
            reason,
        } => {
            paused(
                client,
                pausable(dependency, target)?,
                "pause",
                reason,
                format,
            )
            .await
        }
        Command::Resume {
            dependency,
            target,
            reason,
        } => {
            paused(
                client,
                pausable(dependency, target)?,
                "resume",
                reason,
                format,
            )
            .await
        }
        Command::Run {
            dependency,
            request_id,
            reason,
        } => {
            let path = path(&["v1", "dependencies", &dependency, "runs"]);
            trigger(client, &path, request_id, reason, format).await
        }
        Command::Rerun {
            trigger_key,
            request_id,
            reason,
        } => {
            let path = path(&["v1", "runs", &trigger_key, "rerun"]);
            trigger(client, &path, request_id, reason, format).await
        }
        Command::Settle {
            trigger_key,
            outcome,
            reason,
            dry_run,
        } => {
            let v = post(
                client,
                &["v1", "runs", &trigger_key, "settle"],
                dry_run,
                Some(json!({"outcome": outcome.as_str(), "reason": reason})),
            )
            .await?;
            if !output::structured(format, &v) {
                let status = v["status"].as_str().unwrap_or("?");
                let how = if dry_run { "would become" } else { "is now" };
                println!("run/{trigger_key} {how} {status}");
            }
            Ok(())
        }
        Command::Redeliver { key } => {
            let v = post(
                client,
                &["v1", "notification-deliveries", &key, "retry"],
                false,
                None,
            )
            .await?;
            if !output::structured(format, &v) {
                println!("notification {key} is PENDING again");
            }
            Ok(())
        }
        Command::AckSchema {
            dependency,
            input,
            schema_id,
            reason,
            dry_run,
        } => {
            let v = post(
                client,
                &["v1", "dependencies", &dependency, "acknowledge-schema"],
                dry_run,
                Some(json!({"input": input, "schema_id": schema_id, "reason": reason})),
            )
            .await?;
            if !output::structured(format, &v) {
                let schema = &v["schema_id"];
                if v["changed"] == json!(true) {
                    let how = if dry_run { "would accept" } else { "accepts" };
                    println!(
                        "dependency/{dependency} {how} schema {schema} of {input} (version {})",
                        v["version"]
                    );
                } else {
                    println!(
                        "dependency/{dependency}: schema {schema} of {input} shuts nothing (it is the schema at the last trigger, or it never triggered)"
                    );
                }
            }
            Ok(())
        }
        Command::Backfill(args) => backfill(client, args, format).await,
        Command::Cancel {
            backfill_id,
            reason,
        } => {
            let (_, v) = client
                .call(
                    "POST",
                    &path(&["v1", "backfills", &backfill_id, "cancel"]),
                    Some(&json!({"reason": reason})),
                )
                .await?;
            if !output::structured(format, &v) {
                let how = if v["changed"] == Value::Bool(true) {
                    "cancelled"
                } else {
                    "was already cancelled"
                };
                println!("backfill/{backfill_id} {how}; {}", output::progress(&v));
            }
            Ok(())
        }
        Command::Apply { .. }
        | Command::Watch { .. }
        | Command::Acls { .. }
        | Command::Config { .. }
        | Command::Completions { .. } => Err(Failure::Usage("handled before".into())),
    }
}

/// What an operator found at the target for an UNKNOWN run.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Outcome {
    Succeeded,
    Failed,
    Retry,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Retry => "retry",
        }
    }
}

/// POSTs an action to the API path made of `segments` (`?dry_run=true` when
/// asked) and returns its answer.
async fn post(
    client: &Client,
    segments: &[&str],
    dry_run: bool,
    body: Option<Value>,
) -> Result<Value, Failure> {
    let dry = dry_run.then(|| "true".to_owned());
    let url = format!("{}{}", path(segments), query(&[("dry_run", &dry)]));
    let (_, v) = client.call("POST", &url, body.as_ref()).await?;
    Ok(v)
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Asset => "asset",
        Kind::Dep => "dependency",
        Kind::Run => "run",
        Kind::Grant => "grant",
        Kind::Backfill => "backfill",
        Kind::Target => "target",
        Kind::Table => "table",
        Kind::Notification => "notification",
    }
}

/// `/v1/targets/KIND/NAME[/action]` from `KIND/NAME`.
fn target_path(id: &str, action: Option<&str>) -> Result<String, Failure> {
    let (kind, name) = id.split_once('/').ok_or_else(|| {
        Failure::Usage(format!(
            "{id:?}: a target is named KIND/NAME (webhook/reports)"
        ))
    })?;
    let mut segments = vec!["v1", "targets", kind, name];
    segments.extend(action);
    Ok(path(&segments))
}

/// What `pause` / `resume` act on: a dependency, or a target with `--target`.
pub enum Pausable {
    Dependency(String),
    Target(String),
}

fn pausable(dependency: Option<String>, target: Option<String>) -> Result<Pausable, Failure> {
    match (dependency, target) {
        (Some(d), None) => Ok(Pausable::Dependency(d)),
        (None, Some(t)) => Ok(Pausable::Target(t)),
        _ => Err(Failure::Usage(
            "name a dependency, or a target with --target KIND/NAME".into(),
        )),
    }
}

fn show(format: Format, v: &Value) -> Result<(), Failure> {
    // A description is a document: YAML unless JSON is asked for.
    let f = if format == Format::Table {
        Format::Yaml
    } else {
        format
    };
    output::structured(f, v);
    Ok(())
}

async fn get(client: &Client, what: Get, format: Format) -> Result<(), Failure> {
    let (path, columns) = match &what {
        Get::Assets { prefix } => (
            format!("/v1/assets{}", query(&[("prefix", prefix)])),
            vec![
                col("ASSET", "asset_key"),
                col("FORMAT", "format"),
                col("SEQUENCE", "latest.sequence"),
                col("SNAPSHOT", "latest.snapshot_id"),
                col("COMMITS", "commit_count"),
                col("WATERMARK", "watermark_ms"),
            ],
        ),
        Get::Deps { project, status } => (
            format!(
                "/v1/dependencies{}",
                query(&[("project", project), ("status", status)])
            ),
            vec![
                col("ID", "id"),
                col("PROJECT", "owner_project"),
                col("VERSION", "version"),
                col("STATUS", "status"),
                col("PAUSED", "paused"),
                col("LAST TRIGGER", "last_trigger_key"),
            ],
        ),
        Get::Runs {
            status,
            dependency,
            target,
        } => (
            format!(
                "/v1/runs{}",
                query(&[
                    ("status", status),
                    ("dependency", dependency),
                    ("target", target)
                ])
            ),
            vec![
                col("TRIGGER KEY", "trigger_key"),
                col("DEPENDENCY", "dependency_id"),
                col("STATUS", "status"),
                col("ORIGIN", "origin"),
                col("ATTEMPT", "attempt"),
                col("TARGET", "target_name"),
                col("RERUN OF", "rerun_of"),
            ],
        ),
        Get::Grants => (
            "/v1/grants".to_owned(),
            vec![
                col("ID", "id"),
                col("PROJECT", "project"),
                col("KIND", "kind"),
                col("NAMESPACE", "namespace"),
                col("TARGET", "target"),
            ],
        ),
        Get::Targets => (
            "/v1/targets".to_owned(),
            vec![
                col("TARGET", "id"),
                col("PAUSED", "paused"),
                col("URL", "document.url"),
                col("MAX IN FLIGHT", "document.max_in_flight"),
                col("INVALID", "invalid"),
            ],
        ),
        Get::Tables => (
            "/v1/tables".to_owned(),
            vec![
                col("ASSET", "id"),
                col("FORMAT", "document.format"),
                col("PATH", "document.path"),
                col("INTERVAL MS", "document.interval_ms"),
                col("INVALID", "invalid"),
            ],
        ),
        Get::Notifications { project } => (
            format!("/v1/notifications{}", query(&[("project", project)])),
            vec![
                col("RULE", "id"),
                col("PROJECT", "document.project"),
                col("DEPENDENCY", "document.dependency"),
                col("ON", "document.on"),
                col("FORMAT", "document.webhook.format"),
                col("INVALID", "invalid"),
            ],
        ),
        Get::Deliveries { status, rule } => (
            format!(
                "/v1/notification-deliveries{}",
                query(&[("status", status), ("rule", rule)])
            ),
            vec![
                col("KEY", "delivery_key"),
                col("STATUS", "status"),
                col("ATTEMPTS", "attempts"),
                col("EVENT", "event"),
                col("DEPENDENCY", "dependency_id"),
                col("LAST ERROR", "last_error"),
            ],
        ),
        Get::Backfills { dependency } => (
            format!("/v1/backfills{}", query(&[("dependency", dependency)])),
            vec![
                col("ID", "backfill_id"),
                col("DEPENDENCY", "dependency_id"),
                col("STATE", "state"),
                col("ITEMS", "progress.total"),
                col("SUCCEEDED", "progress.succeeded"),
                col("RUNNING", "progress.running"),
                col("FAILED", "progress.failed"),
                col("PENDING", "progress.pending"),
                col("CANCELLED", "progress.cancelled"),
                col("BY", "requested_by"),
            ],
        ),
        Get::Audit => (
            "/v1/audit".to_owned(),
            vec![
                col("AT", "at_ms"),
                col("PRINCIPAL", "principal"),
                col("ACTION", "action"),
                col("RESOURCE", "resource"),
                col("PROJECT", "project"),
            ],
        ),
    };
    let items = client.list(&path, MAX_ITEMS).await?;
    if !output::structured(format, &Value::Array(items.clone())) {
        output::table(&items, &columns);
    }
    Ok(())
}

async fn paused(
    client: &Client,
    what: Pausable,
    action: &str,
    reason: Option<String>,
    format: Format,
) -> Result<(), Failure> {
    let (url, shown) = match &what {
        Pausable::Dependency(d) => (
            path(&["v1", "dependencies", d, action]),
            format!("dependency/{d}"),
        ),
        Pausable::Target(t) => (target_path(t, Some(action))?, format!("target/{t}")),
    };
    let (_, v) = client
        .call("POST", &url, Some(&json!({"reason": reason})))
        .await?;
    if !output::structured(format, &v) {
        let state = if v["paused"] == Value::Bool(true) {
            "paused"
        } else {
            "resumed"
        };
        let changed = match (&v["changed"], &v["version"]) {
            (Value::Bool(true), Value::Null) => String::new(),
            (Value::Bool(true), version) => format!(" (version {version})"),
            _ => " (unchanged)".to_owned(),
        };
        println!("{shown} {state}{changed}");
    }
    Ok(())
}

async fn trigger(
    client: &Client,
    path: &str,
    request_id: Option<String>,
    reason: Option<String>,
    format: Format,
) -> Result<(), Failure> {
    let made_up = request_id.is_none();
    let request_id = request_id.unwrap_or_else(|| {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        format!("cli-{ms}-{}", std::process::id())
    });
    let (_, v) = client
        .call(
            "POST",
            path,
            Some(&json!({"request_id": request_id, "reason": reason})),
        )
        .await?;
    if !output::structured(format, &v) {
        println!(
            "run {} requested ({})",
            v["trigger_key"].as_str().unwrap_or("?"),
            v["origin"].as_str().unwrap_or("?")
        );
        if made_up {
            eprintln!(
                "request id {request_id}: give --request-id {request_id} to retry it as the same run"
            );
        }
    }
    Ok(())
}

/// Every spec in `paths`: files (JSON or YAML, one spec or a list) and the
/// `.json` / `.yaml` / `.yml` files of directories, in name order.
fn specs_in(paths: &[String]) -> Result<Vec<(String, Value)>, Failure> {
    let mut files = Vec::new();
    for p in paths {
        let path = Path::new(p);
        if path.is_dir() {
            let mut inside: Vec<_> = std::fs::read_dir(path)
                .map_err(|e| Failure::Usage(format!("{p}: {e}")))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| {
                    f.extension()
                        .and_then(|x| x.to_str())
                        .is_some_and(|x| matches!(x, "json" | "yaml" | "yml"))
                })
                .collect();
            inside.sort();
            files.extend(inside);
        } else {
            files.push(path.to_path_buf());
        }
    }
    let mut out = Vec::new();
    for f in files {
        let name = f.display().to_string();
        let text =
            std::fs::read_to_string(&f).map_err(|e| Failure::Usage(format!("{name}: {e}")))?;
        let yaml = f
            .extension()
            .and_then(|x| x.to_str())
            .is_some_and(|x| x == "yaml" || x == "yml");
        let value: Value = if yaml {
            serde_norway::from_str(&text).map_err(|e| Failure::Usage(format!("{name}: {e}")))?
        } else {
            serde_json::from_str(&text).map_err(|e| Failure::Usage(format!("{name}: {e}")))?
        };
        match value {
            Value::Array(items) => {
                for (i, v) in items.into_iter().enumerate() {
                    out.push((format!("{name}[{i}]"), v));
                }
            }
            one => out.push((name, one)),
        }
    }
    Ok(out)
}

/// PUTs each spec (or its dry run) and reports what changed and the verdict:
/// `created`, `configured`, `unchanged`; `accepted`, or `refused: why`.
pub async fn apply(
    client: &Client,
    paths: &[String],
    dry_run: bool,
    format: Format,
) -> Result<(), Failure> {
    let specs = specs_in(paths)?;
    let mut answers = Vec::new();
    let mut refused = 0usize;
    for (origin, spec) in specs {
        // A dependency spec has an id; a target a kind and a name; a table an
        // asset; a notification rule a name and a webhook.
        let declared = match (&spec["id"], &spec["kind"], &spec["name"], &spec["asset"]) {
            (Value::Null, Value::Null, Value::String(name), _) if spec["webhook"].is_object() => {
                Some((
                    path(&["v1", "notifications", name]),
                    format!("notification/{name}"),
                ))
            }
            (Value::Null, Value::String(kind), Value::String(name), _) => {
                let id = format!("{kind}/{name}");
                Some((target_path(&id, None)?, format!("target/{id}")))
            }
            (Value::Null, _, _, Value::String(asset)) => {
                Some((path(&["v1", "tables", asset]), format!("table/{asset}")))
            }
            _ => None,
        };
        if let Some((at, shown)) = declared {
            let dry = dry_run.then(|| "true".to_owned());
            let url = format!("{at}{}", query(&[("dry_run", &dry)]));
            match client.call("PUT", &url, Some(&spec)).await {
                Ok((status, v)) => {
                    if format == Format::Table {
                        let what = match (dry_run, status, &v["changed"]) {
                            (_, _, Value::Bool(false)) => "unchanged",
                            (true, _, _) if v["before"].is_null() => "would be created",
                            (true, _, _) => "would be configured",
                            (false, 201, _) => "created",
                            (false, _, _) => "configured",
                        };
                        println!("{shown} {what}");
                    }
                    answers.push(v);
                }
                Err(f) => {
                    eprintln!("{origin}: {}", f.message());
                    refused += 1;
                }
            }
            continue;
        }
        let Some(id) = spec["id"].as_str() else {
            return Err(Failure::Usage(format!(
                "{origin}: not a dependency spec (id), a target (kind, name) or a table (asset)"
            )));
        };
        let dry = dry_run.then(|| "true".to_owned());
        let path = format!(
            "{}{}",
            path(&["v1", "dependencies", id]),
            query(&[("dry_run", &dry)])
        );
        match client.call("PUT", &path, Some(&spec)).await {
            Ok((status, v)) => {
                if v["status"] == "refused" {
                    refused += 1;
                }
                if format == Format::Table {
                    let what = match (dry_run, status, &v["changed"]) {
                        (_, _, Value::Bool(false)) => "unchanged",
                        (true, _, _) if v["created"] == Value::Bool(true) => "would be created",
                        (true, _, _) => "would be configured",
                        (false, 201, _) => "created",
                        (false, _, _) => "configured",
                    };
                    let verdict = match v["status"].as_str() {
                        Some("refused") => format!(
                            " — refused: {}",
                            v["refused_reason"].as_str().unwrap_or("?")
                        ),
                        Some(s) => format!(" — {s}"),
                        None => String::new(),
                    };
                    println!("dependency/{id} {what}{verdict}");
                    for d in v["diff"].as_array().into_iter().flatten() {
                        println!(
                            "  {}: {} → {}",
                            d["field"].as_str().unwrap_or("?"),
                            d["before"],
                            d["after"]
                        );
                    }
                }
                answers.push(v);
            }
            Err(f) => {
                eprintln!("{origin}: {}", f.message());
                refused += 1;
            }
        }
    }
    output::structured(format, &Value::Array(answers));
    if refused > 0 {
        return Err(Failure::Refused(format!("{refused} spec(s) refused")));
    }
    Ok(())
}

pub fn config(what: ConfigCmd, format: Format) -> Result<(), Failure> {
    let mut config = Config::load()?;
    match what {
        ConfigCmd::GetContexts => {
            let items: Vec<Value> = config
                .contexts
                .iter()
                .map(|c| {
                    let current = config.current_context.as_deref() == Some(c.name.as_str());
                    json!({"current": if current { "*" } else { "" }, "name": c.name, "server": c.server})
                })
                .collect();
            if !output::structured(format, &Value::Array(items.clone())) {
                output::table(
                    &items,
                    &[
                        col("CURRENT", "current"),
                        col("NAME", "name"),
                        col("SERVER", "server"),
                    ],
                );
            }
            Ok(())
        }
        ConfigCmd::UseContext { name } => {
            if !config.contexts.iter().any(|c| c.name == name) {
                return Err(Failure::Usage(format!(
                    "no context {name:?} in {}",
                    config_path().display()
                )));
            }
            config.current_context = Some(name.clone());
            config.save()?;
            println!("current context: {name}");
            Ok(())
        }
        ConfigCmd::SetContext {
            name,
            server,
            token,
            token_file,
            token_env,
        } => {
            config.contexts.retain(|c| c.name != name);
            config.contexts.push(Context {
                name: name.clone(),
                server,
                token,
                token_file,
                token_env,
            });
            if config.current_context.is_none() {
                config.current_context = Some(name.clone());
            }
            let path = config.save()?;
            println!("context {name} saved in {}", path.display());
            Ok(())
        }
    }
}

async fn backfill(client: &Client, a: BackfillArgs, format: Format) -> Result<(), Failure> {
    let mut body = json!({
        "request_id": a.request_id,
        "reason": a.reason,
        "max_in_flight": a.max_in_flight,
        "per_minute": a.per_minute,
    });
    if let Some(p) = a.partitions {
        body["partitions"] = json!(p);
    } else if let (Some(from), Some(to)) = (a.from, a.to) {
        body["partition_range"] = json!({"from": from, "to": to});
    } else if let (Some(from), Some(to)) = (a.windows_from_ms, a.windows_to_ms) {
        body["windows"] = json!({"from_ms": from, "to_ms": to});
    } else if let (Some(input), Some(from), Some(to)) = (a.input, a.from_sequence, a.to_sequence) {
        body["snapshots"] = json!({"input": input, "from_sequence": from, "to_sequence": to});
    }
    // Absent options are left out, not sent as nulls the API would have to read.
    if let Some(o) = body.as_object_mut() {
        o.retain(|_, v| !v.is_null());
    }
    let dry = a.dry_run.then(|| "true".to_owned());
    let (_, v) = client
        .call(
            "POST",
            &format!(
                "{}{}",
                path(&["v1", "dependencies", &a.dependency, "backfills"]),
                query(&[("dry_run", &dry)])
            ),
            Some(&body),
        )
        .await?;
    if output::structured(format, &v) && !a.wait {
        return Ok(());
    }
    let id = v["backfill_id"].as_str().unwrap_or("?").to_owned();
    if format == Format::Table {
        if a.dry_run {
            println!("backfill/{id} would run {} items; the first:", v["items"]);
            for item in v["first"].as_array().into_iter().flatten() {
                println!("  {}", item["reason"].as_str().unwrap_or("?"));
            }
            return Ok(());
        }
        let how = if v["resubmitted"] == Value::Bool(true) {
            "resubmitted (nothing new runs)"
        } else {
            "submitted"
        };
        println!("backfill/{id} {how}: {} items", v["items"]);
    }
    if !a.wait || a.dry_run {
        return Ok(());
    }
    let last =
        output::follow(|| async { client.get(&path(&["v1", "backfills", &id])).await }).await?;
    let p = &last["progress"];
    if last["state"] == "done" && p["failed"] == json!(0) && p["cancelled"] == json!(0) {
        Ok(())
    } else {
        Err(Failure::Refused(format!(
            "backfill/{id} {}: {}",
            last["state"].as_str().unwrap_or("?"),
            output::progress(&last)
        )))
    }
}

/// `sluice acls`: every principal's rules under `prefix`, from the access table
/// the services check themselves against at start.
pub fn acls(prefix: &str, hook_topics: &[String], format: Format) {
    use sluice_kit::access::{ALL, INGESTER};
    let items: Vec<Value> = ALL
        .iter()
        .flat_map(|a| {
            let extra = if **a == INGESTER { hook_topics } else { &[] };
            a.acls(prefix, extra).into_iter().map(move |acl| {
                json!({"principal": a.principal(), "resource": acl.kind.to_string(),
                       "name": acl.name, "pattern": if acl.prefixed { "prefixed" } else { "literal" },
                       "operation": acl.operation.to_string()})
            })
        })
        .collect();
    if !output::structured(format, &Value::Array(items.clone())) {
        output::table(
            &items,
            &[
                col("PRINCIPAL", "principal"),
                col("OPERATION", "operation"),
                col("RESOURCE", "resource"),
                col("PATTERN", "pattern"),
                col("NAME", "name"),
            ],
        );
    }
}
