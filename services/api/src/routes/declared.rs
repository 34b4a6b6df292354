//! Resources declared live: **targets** (the systems the dispatcher calls),
//! **tables** (what the ingester's pollers read) and **notification rules** (what
//! the API's notifier sends where), each on a compacted topic of its own that its
//! service applies without a restart. A declared target or table replaces a
//! bootstrap one (`SLUICE_TARGETS`, `SLUICE_POLL_TABLES`) of the same id; deleting
//! it restores that one. Targets and tables serve every project, so changing one
//! needs admin of every project (`*`); any reader may look. A notification rule
//! belongs to its project: its editors change it, its viewers see it.
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
    Notification,
}

impl Resource {
    fn noun(self) -> &'static str {
        match self {
            Resource::Target => "target",
            Resource::Table => "table",
            Resource::Notification => "notification",
        }
    }

    /// The owner's check: the id the document must be published under.
    fn check(self, document: &str) -> Result<String, Vec<String>> {
        match self {
            Resource::Target => sluice_dispatcher::targets::check_declared(document),
            Resource::Table => sluice_ingester::poll::check_declared(document),
            Resource::Notification => crate::notify::Rule::parse(document).map(|r| r.name),
        }
    }

    fn shared(self, app: &App) -> &Arc<SharedDeclared> {
        match self {
            Resource::Target => &app.targets,
            Resource::Table => &app.tables,
            Resource::Notification => &app.notifications,
        }
    }

    fn topic(self, app: &App) -> &str {
        match self {
            Resource::Target => &app.targets_topic,
            Resource::Table => &app.tables_topic,
            Resource::Notification => &app.notifications_topic,
        }
    }

    /// Why a resource may be missing here though it is in use.
    fn bootstrap(self) -> &'static str {
        match self {
            Resource::Target => {
                " (a SLUICE_TARGETS bootstrap target is the dispatcher's configuration, not listed here)"
            }
            Resource::Table => {
                " (a SLUICE_POLL_TABLES bootstrap table is the ingester's configuration, not listed here)"
            }
            Resource::Notification => "",
        }
    }

    /// The project a document belongs to: a rule's own; `*` for what serves all.
    fn project(self, document: &str) -> String {
        match self {
            Resource::Notification => serde_json::from_str::<Value>(document)
                .ok()
                .and_then(|v| v["project"].as_str().map(str::to_owned))
                .unwrap_or_else(|| "*".to_owned()),
            Resource::Target | Resource::Table => "*".to_owned(),
        }
    }

    /// Who may change a document of `project`.
    fn writer(self) -> Role {
        match self {
            Resource::Notification => Role::Editor,
            Resource::Target | Resource::Table => Role::Admin,
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
/// project (`*`) changes one. A notification rule is its project's: this only
/// authenticates, and [`may_change`] checks the rule's project once it is read.
async fn declared_writer(
    app: &App,
    headers: &HeaderMap,
    r: Resource,
) -> Result<Principal, ApiError> {
    if r == Resource::Notification {
        return app.reader(headers).await;
    }
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

/// Whether `p` may change a document of these projects (a rule that moves has
/// two): an editor in each.
fn may_change(p: &Principal, r: Resource, projects: &[String]) -> Result<(), ApiError> {
    for project in projects {
        if r == Resource::Notification && !p.may(r.writer(), project) {
            return Err(forbidden(p.lacks(r.writer(), project)));
        }
    }
    Ok(())
}

/// Whether `p` may see a declared document (a rule: a viewer of its project).
fn may_see(p: &Principal, r: Resource, doc: &Result<String, String>) -> bool {
    match (r, doc) {
        (Resource::Notification, Ok(d)) => p.may(Role::Viewer, &r.project(d)),
        (Resource::Notification, Err(_)) => p.may(Role::Viewer, "*"),
        _ => true,
    }
}

/// The declared resources `p` may see that `keep` keeps.
async fn list(
    app: App,
    headers: HeaderMap,
    r: Resource,
    keep: impl Fn(&str, &Result<String, String>) -> bool,
) -> Answer {
    let p = app.reader(&headers).await?;
    app.declared_ready(r)?;
    let items: Vec<Value> = r
        .shared(&app)
        .snapshot()
        .iter()
        .filter(|(id, doc)| keep(id, doc) && may_see(&p, r, doc))
        .map(|(id, doc)| shown(r, id, doc))
        .collect();
    ok(json!({"items": items}))
}

async fn get_one(app: App, headers: HeaderMap, r: Resource, id: String) -> Answer {
    let p = app.reader(&headers).await?;
    app.declared_ready(r)?;
    let missing = || not_found(format!("no declared {} {id:?}{}", r.noun(), r.bootstrap()));
    let doc = r.shared(&app).get(&id).ok_or_else(missing)?;
    if !may_see(&p, r, &doc) {
        return Err(missing());
    }
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
    list(app, headers, Resource::Target, |id, _| {
        prefix.as_deref().is_none_or(|p| id.starts_with(p))
    })
    .await
}

pub(super) async fn list_tables(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let q = Params::new(q, &["prefix"])?;
    let prefix = q.get("prefix").map(str::to_owned);
    list(app, headers, Resource::Table, |id, _| {
        prefix.as_deref().is_none_or(|p| id.starts_with(p))
    })
    .await
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
        Resource::Notification => "invalid_notification",
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
            project: &r.project(&after),
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
    let p = declared_writer(&app, &headers, r).await?;
    app.declared_ready(r)?;
    let q = Params::new(q, &["dry_run"])?;
    let dry_run = q.flag("dry_run")?;
    let text = std::str::from_utf8(&body).map_err(|_| bad("the body is not UTF-8"))?;
    let after = checked(r, &id, text)?;
    let current = r.shared(&app).get(&id).and_then(Result::ok);
    let mut projects = vec![r.project(&after)];
    projects.extend(current.as_deref().map(|c| r.project(c)));
    may_change(&p, r, &projects)?;
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
        (Resource::Notification, true) => (StatusCode::OK, "notification.replace"),
        (Resource::Notification, false) => (StatusCode::CREATED, "notification.create"),
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
    let p = declared_writer(&app, &headers, r).await?;
    app.declared_ready(r)?;
    let dry_run = Params::new(q, &["dry_run"])?.flag("dry_run")?;
    let current = r
        .shared(&app)
        .get(&id)
        .ok_or_else(|| not_found(format!("no declared {} {id:?}", r.noun())))?;
    let project = match &current {
        Ok(d) => r.project(d),
        Err(_) => "*".to_owned(),
    };
    may_change(&p, r, std::slice::from_ref(&project))?;
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
                Resource::Notification => "notification.delete",
            },
            resource: &format!("{}s/{id}", r.noun()),
            project: &project,
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
    let p = declared_writer(&app, &headers, r).await?;
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

pub(super) async fn list_notifications(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let q = Params::new(q, &["project"])?;
    let project = q.get("project").map(str::to_owned);
    let r = Resource::Notification;
    list(app, headers, r, |_, doc| {
        project
            .as_deref()
            .is_none_or(|want| doc.as_deref().is_ok_and(|d| r.project(d) == want))
    })
    .await
}

pub(super) async fn get_notification(
    State(app): State<App>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Answer {
    get_one(app, headers, Resource::Notification, name).await
}

pub(super) async fn put_notification(
    State(app): State<App>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Answer {
    put(app, headers, Resource::Notification, name, q, body).await
}

pub(super) async fn delete_notification(
    State(app): State<App>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    delete(app, headers, Resource::Notification, name, q).await
}

/// The rules whose deliveries `p` may see; `None`: every one (a viewer of `*`
/// also sees those of deleted rules).
fn visible_rules(app: &App, p: &Principal) -> Option<Vec<String>> {
    if p.may(Role::Viewer, "*") {
        return None;
    }
    let r = Resource::Notification;
    Some(
        r.shared(app)
            .snapshot()
            .into_iter()
            .filter(|(_, doc)| may_see(p, r, doc))
            .map(|(id, _)| id)
            .collect(),
    )
}

/// `GET /v1/notification-deliveries`: what was sent, is waiting to be sent again,
/// or is DEAD (the notifications' dead-letter), newest first.
pub(super) async fn list_deliveries(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let p = app.reader(&headers).await?;
    let q = Params::new(q, &["status", "rule", "limit", "cursor"])?;
    let limit = q.limit(app.max_page, 100)?;
    let offset = q.offset()?;
    let status = q.get("status").map(str::to_ascii_uppercase);
    if let Some(s) = &status
        && !["PENDING", "DELIVERED", "DEAD"].contains(&s.as_str())
    {
        return Err(bad(format!(
            "status must be one of PENDING, DELIVERED, DEAD; got {s:?}"
        )));
    }
    let mut rules = visible_rules(&app, &p);
    if let Some(want) = q.get("rule") {
        rules = Some(match rules {
            Some(v) => v.into_iter().filter(|r| r == want).collect(),
            None => vec![want.to_owned()],
        });
    }
    let rows = db::deliveries(
        &app.pool,
        status.as_deref(),
        rules.as_deref(),
        offset,
        limit as i64 + 1,
    )
    .await?;
    let mut items = rows.as_array().cloned().unwrap_or_default();
    let next = (items.len() > limit).then(|| (offset + limit as i64).to_string());
    items.truncate(limit);
    ok(page(items, next))
}

/// `POST /v1/notification-deliveries/{key}/retry`: a DEAD notification is sent
/// again from its first attempt (an editor of its rule's project).
pub(super) async fn retry_delivery(
    State(app): State<App>,
    headers: HeaderMap,
    Path(key): Path<String>,
) -> Answer {
    let r = Resource::Notification;
    let p = declared_writer(&app, &headers, r).await?;
    let rule = db::delivery_rule(&app.pool, &key)
        .await?
        .ok_or_else(|| not_found(format!("no notification delivery {key:?}")))?;
    let project = match r.shared(&app).get(&rule) {
        Some(Ok(d)) => r.project(&d),
        _ => "*".to_owned(),
    };
    may_change(&p, r, std::slice::from_ref(&project))?;
    if !db::retry_delivery(&app.pool, &key).await? {
        return Err(err(
            StatusCode::CONFLICT,
            "not_dead",
            format!("delivery {key:?} is not DEAD; only a DEAD one is sent again"),
        ));
    }
    db::audit(
        &app.pool,
        db::Audit {
            principal: &p.name,
            action: "notification.retry",
            resource: &format!("notification-deliveries/{key}"),
            project: &project,
            before: Some(json!({"status": "DEAD"})),
            after: Some(json!({"status": "PENDING"})),
        },
    )
    .await?;
    ok(json!({"delivery_key": key, "status": "PENDING"}))
}
