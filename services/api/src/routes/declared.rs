//! Resources declared live: **targets** (the systems the dispatcher calls) and
//! **tables** (what the ingester's pollers read), each on a compacted topic of its
//! own that every dispatcher / ingester applies without a restart. A declared one
//! replaces a bootstrap one (`SLUICE_TARGETS`, `SLUICE_POLL_TABLES`) of the same
//! id; deleting it restores that one. Both serve every project, so changing one
//! needs admin of every project (`*`); any reader may look.
//!
//! Each document is its owner's format (`docs/control-plane.md`), checked by the
//! owner's own code before it is published; a secret in it is a reference
//! (`{"env": …}`, `{"file": …}`), never a value, so nothing secret is ever in a
//! topic or in an answer.

use serde::Deserialize;
use sluice_dispatcher::targets::declared_id;
use sluice_kit::declared::SharedDeclared;
use sluice_kit::wire::DeclaredResource;

use super::*;

/// What kind of declared resource a route is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Resource {
    Target,
    Table,
}

impl Resource {
    fn noun(self) -> &'static str {
        match self {
            Resource::Target => "target",
            Resource::Table => "table",
        }
    }

    /// The owner's check: the id the document must be published under.
    fn check(self, document: &str) -> Result<String, Vec<String>> {
        match self {
            Resource::Target => sluice_dispatcher::targets::check_declared(document),
            Resource::Table => sluice_ingester::poll::check_declared(document),
        }
    }

    fn shared(self, app: &App) -> &Arc<SharedDeclared> {
        match self {
            Resource::Target => &app.targets,
            Resource::Table => &app.tables,
        }
    }

    fn topic(self, app: &App) -> &str {
        match self {
            Resource::Target => &app.targets_topic,
            Resource::Table => &app.tables_topic,
        }
    }

    fn bootstrap(self) -> &'static str {
        match self {
            Resource::Target => {
                "a SLUICE_TARGETS bootstrap target is the dispatcher's configuration"
            }
            Resource::Table => {
                "a SLUICE_POLL_TABLES bootstrap table is the ingester's configuration"
            }
        }
    }
}

/// `kind/name` from the path, as the topic keys it.
fn path_id(kind: &str, name: &str) -> Result<String, ApiError> {
    let k =
        sluice_dispatcher::targets::Kind::parse(&kind.to_ascii_uppercase()).ok_or_else(|| {
            bad(format!(
                "{kind:?} is not a target kind: airflow, dolphinscheduler, webhook, command, kafka"
            ))
        })?;
    Ok(declared_id(k, name))
}

/// A declared resource as the API shows it (a target with whether it is paused).
fn shown(r: Resource, id: &str, doc: &Result<String, String>) -> Value {
    match doc {
        Ok(d) => {
            let document: Value = serde_json::from_str(d).unwrap_or(Value::String(d.clone()));
            let mut v = json!({"id": id, "document": document});
            if r == Resource::Target {
                v["paused"] = Value::Bool(
                    document
                        .get("paused")
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                );
            }
            v
        }
        Err(e) => json!({"id": id, "invalid": e}),
    }
}

impl App {
    fn declared_ready(&self, r: Resource) -> Result<(), ApiError> {
        self.ready()?;
        if r.shared(self).caught_up() {
            Ok(())
        } else {
            Err(unavailable(format!(
                "still reading the {}s topic; retry in a moment",
                r.noun()
            )))
        }
    }

    /// Publishes a document (or a tombstone) and waits until this instance has
    /// read it back, so the next GET shows it.
    async fn publish_declared(
        &self,
        r: Resource,
        id: &str,
        document: Option<&str>,
    ) -> Result<(), ApiError> {
        let payload = match document {
            Some(d) => Some(
                self.codec
                    .encode(
                        SchemaName::DeclaredResource,
                        r.topic(self),
                        &DeclaredResource {
                            id: id.to_owned(),
                            document: d.to_owned(),
                        },
                    )
                    .await
                    .map_err(|e| unavailable(format!("encoding the {}: {e}", r.noun())))?,
            ),
            None => None,
        };
        self.publish(r.topic(self), id, payload).await?;
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        while r.shared(self).get(id).and_then(Result::ok).as_deref() != document {
            if tokio::time::Instant::now() > until {
                tracing::warn!(id, "published, but not yet read back");
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }
}

/// Targets and tables are shared by every project: only an admin of every
/// project (`*`) changes one.
async fn declared_admin(
    app: &App,
    headers: &HeaderMap,
    r: Resource,
) -> Result<Principal, ApiError> {
    let p = app.principal(headers).await?;
    if !p.may(Role::Admin, "*") {
        return Err(forbidden(format!(
            "{}; {}s serve every project, so changing one needs admin of every project (\"*\")",
            p.lacks(Role::Admin, "*"),
            r.noun()
        )));
    }
    Ok(p)
}

async fn list(app: App, headers: HeaderMap, r: Resource, prefix: Option<String>) -> Answer {
    app.reader(&headers).await?;
    app.declared_ready(r)?;
    let items: Vec<Value> = r
        .shared(&app)
        .snapshot()
        .iter()
        .filter(|(id, _)| prefix.as_deref().is_none_or(|p| id.starts_with(p)))
        .map(|(id, doc)| shown(r, id, doc))
        .collect();
    ok(json!({"items": items}))
}

async fn get_one(app: App, headers: HeaderMap, r: Resource, id: String) -> Answer {
    app.reader(&headers).await?;
    app.declared_ready(r)?;
    let doc = r.shared(&app).get(&id).ok_or_else(|| {
        not_found(format!(
            "no declared {} {id:?} ({}, not listed here)",
            r.noun(),
            r.bootstrap()
        ))
    })?;
    ok(shown(r, &id, &doc))
}

pub(super) async fn list_targets(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let q = Params::new(q, &["kind"])?;
    let prefix = q
        .get("kind")
        .map(|k| format!("{}/", k.to_ascii_lowercase()));
    list(app, headers, Resource::Target, prefix).await
}

pub(super) async fn list_tables(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let q = Params::new(q, &["prefix"])?;
    let prefix = q.get("prefix").map(str::to_owned);
    list(app, headers, Resource::Table, prefix).await
}

pub(super) async fn get_target(
    State(app): State<App>,
    headers: HeaderMap,
    Path((kind, name)): Path<(String, String)>,
) -> Answer {
    let id = path_id(&kind, &name)?;
    get_one(app, headers, Resource::Target, id).await
}

pub(super) async fn get_table(
    State(app): State<App>,
    headers: HeaderMap,
    Path(asset): Path<String>,
) -> Answer {
    get_one(app, headers, Resource::Table, asset).await
}

/// The checked document, compact.
fn checked(r: Resource, id: &str, text: &str) -> Result<String, ApiError> {
    let code = match r {
        Resource::Target => "invalid_target",
        Resource::Table => "invalid_table",
    };
    let value: Value = serde_json::from_str(text)
        .map_err(|e| err(StatusCode::UNPROCESSABLE_ENTITY, code, e.to_string()))?;
    let compact = value.to_string();
    let named = r
        .check(&compact)
        .map_err(|problems| err(StatusCode::UNPROCESSABLE_ENTITY, code, problems.join("; ")))?;
    if named != id {
        return Err(bad(format!(
            "the path names {id:?} but the document is {} {named:?}",
            r.noun()
        )));
    }
    Ok(compact)
}

fn same(a: &str, b: &str) -> bool {
    serde_json::from_str::<Value>(a).ok() == serde_json::from_str::<Value>(b).ok()
}

/// Publishes `after` in place of `before`, audited; the answer of a change.
#[allow(clippy::too_many_arguments)]
async fn change(
    app: &App,
    p: &Principal,
    r: Resource,
    id: &str,
    action: &'static str,
    before: Option<String>,
    after: String,
    audited_after: Option<Value>,
) -> Result<Value, ApiError> {
    app.publish_declared(r, id, Some(&after)).await?;
    let parse = |d: &str| serde_json::from_str::<Value>(d).ok();
    db::audit(
        &app.pool,
        db::Audit {
            principal: &p.name,
            action,
            resource: &format!("{}s/{id}", r.noun()),
            project: "*",
            before: before.as_deref().and_then(parse),
            after: audited_after.or_else(|| parse(&after)),
        },
    )
    .await?;
    Ok(shown(r, id, &Ok(after)))
}

pub(super) async fn put_target(
    State(app): State<App>,
    headers: HeaderMap,
    Path((kind, name)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Answer {
    let id = path_id(&kind, &name)?;
    put(app, headers, Resource::Target, id, q, body).await
}

pub(super) async fn put_table(
    State(app): State<App>,
    headers: HeaderMap,
    Path(asset): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Answer {
    put(app, headers, Resource::Table, asset, q, body).await
}

async fn put(
    app: App,
    headers: HeaderMap,
    r: Resource,
    id: String,
    q: HashMap<String, String>,
    body: Bytes,
) -> Answer {
    let p = declared_admin(&app, &headers, r).await?;
    app.declared_ready(r)?;
    let q = Params::new(q, &["dry_run"])?;
    let dry_run = q.flag("dry_run")?;
    let text = std::str::from_utf8(&body).map_err(|_| bad("the body is not UTF-8"))?;
    let after = checked(r, &id, text)?;
    let current = r.shared(&app).get(&id).and_then(Result::ok);
    if current.as_deref().is_some_and(|c| same(c, &after)) {
        return ok(json!({"id": id, "dry_run": dry_run, "changed": false}));
    }
    if dry_run {
        let parse = |d: &str| serde_json::from_str::<Value>(d).unwrap_or(Value::Null);
        return ok(json!({"id": id, "dry_run": true, "changed": true,
                         "before": current.as_deref().map(parse), "after": parse(&after)}));
    }
    let (status, action) = match (r, current.is_some()) {
        (Resource::Target, true) => (StatusCode::OK, "target.replace"),
        (Resource::Target, false) => (StatusCode::CREATED, "target.create"),
        (Resource::Table, true) => (StatusCode::OK, "table.replace"),
        (Resource::Table, false) => (StatusCode::CREATED, "table.create"),
    };
    let shown = change(&app, &p, r, &id, action, current, after, None).await?;
    Ok((status, axum::Json(shown)).into_response())
}

pub(super) async fn delete_target(
    State(app): State<App>,
    headers: HeaderMap,
    Path((kind, name)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let id = path_id(&kind, &name)?;
    delete(app, headers, Resource::Target, id, q).await
}

pub(super) async fn delete_table(
    State(app): State<App>,
    headers: HeaderMap,
    Path(asset): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    delete(app, headers, Resource::Table, asset, q).await
}

async fn delete(
    app: App,
    headers: HeaderMap,
    r: Resource,
    id: String,
    q: HashMap<String, String>,
) -> Answer {
    let p = declared_admin(&app, &headers, r).await?;
    app.declared_ready(r)?;
    let dry_run = Params::new(q, &["dry_run"])?.flag("dry_run")?;
    let current = r
        .shared(&app)
        .get(&id)
        .ok_or_else(|| not_found(format!("no declared {} {id:?}", r.noun())))?;
    if dry_run {
        return ok(
            json!({"id": id, "deleted": false, "dry_run": true, "before": shown(r, &id, &current)}),
        );
    }
    app.publish_declared(r, &id, None).await?;
    db::audit(
        &app.pool,
        db::Audit {
            principal: &p.name,
            action: match r {
                Resource::Target => "target.delete",
                Resource::Table => "table.delete",
            },
            resource: &format!("{}s/{id}", r.noun()),
            project: "*",
            before: current.ok().and_then(|d| serde_json::from_str(&d).ok()),
            after: None,
        },
    )
    .await?;
    ok(json!({"id": id, "deleted": true}))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PauseBody {
    reason: Option<String>,
}

/// Pause (no new sends; sends under way finish and are followed) or resume: a
/// new version of the declared target with `paused` set.
async fn set_paused(
    app: App,
    headers: HeaderMap,
    (kind, name): (String, String),
    q: HashMap<String, String>,
    body: Bytes,
    paused: bool,
) -> Answer {
    let r = Resource::Target;
    let p = declared_admin(&app, &headers, r).await?;
    app.declared_ready(r)?;
    let dry_run = Params::new(q, &["dry_run"])?.flag("dry_run")?;
    let why: PauseBody = if body.iter().all(u8::is_ascii_whitespace) {
        PauseBody::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| bad(format!("the body: {e}")))?
    };
    let id = path_id(&kind, &name)?;
    let current = match r.shared(&app).get(&id) {
        Some(Ok(d)) => d,
        Some(Err(e)) => return Err(err(StatusCode::CONFLICT, "invalid_target", e)),
        None => {
            return Err(not_found(format!(
                "no declared target {id:?}: declare it (PUT) to pause it; a bootstrap target is paused in SLUICE_TARGETS"
            )));
        }
    };
    let mut doc: Value = serde_json::from_str(&current)
        .map_err(|e| err(StatusCode::CONFLICT, "invalid_target", e.to_string()))?;
    if doc.get("paused").and_then(Value::as_bool).unwrap_or(false) == paused {
        return ok(json!({"id": id, "paused": paused, "changed": false}));
    }
    doc["paused"] = Value::Bool(paused);
    if dry_run {
        return ok(json!({"id": id, "paused": paused, "changed": true, "dry_run": true}));
    }
    let action = if paused {
        "target.pause"
    } else {
        "target.resume"
    };
    let audited = json!({"paused": paused, "reason": why.reason});
    let mut shown = change(
        &app,
        &p,
        r,
        &id,
        action,
        Some(current),
        doc.to_string(),
        Some(audited),
    )
    .await?;
    shown["changed"] = Value::Bool(true);
    ok(shown)
}

pub(super) async fn pause_target(
    State(app): State<App>,
    headers: HeaderMap,
    Path(path): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Answer {
    set_paused(app, headers, path, q, body, true).await
}

pub(super) async fn resume_target(
    State(app): State<App>,
    headers: HeaderMap,
    Path(path): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Answer {
    set_paused(app, headers, path, q, body, false).await
}
