//! Targets declared live: the systems the dispatcher calls, as resources on the
//! compacted targets topic, which every dispatcher applies without a restart (a
//! declared target replaces a `SLUICE_TARGETS` bootstrap one of the same kind and
//! name; deleting it restores that one). A target serves every project, so
//! changing one needs admin of every project (`*`); any reader may look.
//!
//! The document is the dispatcher's target format (`docs/control-plane.md`); a
//! secret in it is a reference (`{"env": …}`, `{"file": …}`), never a value, so
//! nothing secret is ever in a topic or in an answer.

use serde::Deserialize;
use sluice_dispatcher::targets::{check_declared, declared_id};
use sluice_kit::wire::DeclaredResource;

use super::*;

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

/// A declared target as the API shows it.
fn shown(id: &str, doc: &Result<String, String>) -> Value {
    match doc {
        Ok(d) => {
            let document: Value = serde_json::from_str(d).unwrap_or(Value::String(d.clone()));
            json!({"id": id, "paused": document.get("paused").and_then(Value::as_bool).unwrap_or(false),
                   "document": document})
        }
        Err(e) => json!({"id": id, "invalid": e}),
    }
}

impl App {
    fn targets_ready(&self) -> Result<(), ApiError> {
        self.ready()?;
        if self.targets.caught_up() {
            Ok(())
        } else {
            Err(unavailable(
                "still reading the targets topic; retry in a moment",
            ))
        }
    }

    /// Publishes a target document (or a tombstone) and waits until this
    /// instance has read it back, so the next GET shows it.
    async fn publish_target(&self, id: &str, document: Option<&str>) -> Result<(), ApiError> {
        let payload = match document {
            Some(d) => Some(
                self.codec
                    .encode(
                        SchemaName::DeclaredResource,
                        &self.targets_topic,
                        &DeclaredResource {
                            id: id.to_owned(),
                            document: d.to_owned(),
                        },
                    )
                    .await
                    .map_err(|e| unavailable(format!("encoding the target: {e}")))?,
            ),
            None => None,
        };
        self.publish(&self.targets_topic, id, payload).await?;
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.targets.get(id).and_then(Result::ok).as_deref() != document {
            if tokio::time::Instant::now() > until {
                tracing::warn!(id, "target published, but not yet read back");
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }
}

/// Targets are shared by every project: only an admin of every project (`*`)
/// changes one.
async fn target_admin(app: &App, headers: &HeaderMap) -> Result<Principal, ApiError> {
    let p = app.principal(headers).await?;
    if !p.may(Role::Admin, "*") {
        return Err(forbidden(format!(
            "{}; targets serve every project, so changing one needs admin of every project (\"*\")",
            p.lacks(Role::Admin, "*")
        )));
    }
    Ok(p)
}

pub(super) async fn list_targets(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    app.reader(&headers).await?;
    app.targets_ready()?;
    let q = Params::new(q, &["kind"])?;
    let prefix = q
        .get("kind")
        .map(|k| format!("{}/", k.to_ascii_lowercase()));
    let items: Vec<Value> = app
        .targets
        .snapshot()
        .iter()
        .filter(|(id, _)| prefix.as_deref().is_none_or(|p| id.starts_with(p)))
        .map(|(id, doc)| shown(id, doc))
        .collect();
    ok(json!({"items": items}))
}

pub(super) async fn get_target(
    State(app): State<App>,
    headers: HeaderMap,
    Path((kind, name)): Path<(String, String)>,
) -> Answer {
    app.reader(&headers).await?;
    app.targets_ready()?;
    let id = path_id(&kind, &name)?;
    let doc = app.targets.get(&id).ok_or_else(|| {
        not_found(format!(
            "no declared target {id:?} (a SLUICE_TARGETS bootstrap target is the dispatcher's configuration, not listed here)"
        ))
    })?;
    ok(shown(&id, &doc))
}

/// The checked document, compact, with `paused` as given.
fn checked(id: &str, text: &str) -> Result<String, ApiError> {
    let value: Value = serde_json::from_str(text).map_err(|e| {
        err(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_target",
            e.to_string(),
        )
    })?;
    let compact = value.to_string();
    let named = check_declared(&compact).map_err(|problems| {
        err(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_target",
            problems.join("; "),
        )
    })?;
    if named != id {
        return Err(bad(format!(
            "the path names {id:?} but the document is target {named:?}"
        )));
    }
    Ok(compact)
}

fn same(a: &str, b: &str) -> bool {
    serde_json::from_str::<Value>(a).ok() == serde_json::from_str::<Value>(b).ok()
}

/// Publishes `after` in place of `before`, audited; the answer of a change.
async fn change(
    app: &App,
    p: &Principal,
    id: &str,
    action: &'static str,
    before: Option<String>,
    after: String,
    audited_after: Option<Value>,
) -> Result<Value, ApiError> {
    app.publish_target(id, Some(&after)).await?;
    let parse = |d: &str| serde_json::from_str::<Value>(d).ok();
    db::audit(
        &app.pool,
        db::Audit {
            principal: &p.name,
            action,
            resource: &format!("targets/{id}"),
            project: "*",
            before: before.as_deref().and_then(parse),
            after: audited_after.or_else(|| parse(&after)),
        },
    )
    .await?;
    Ok(shown(id, &Ok(after)))
}

pub(super) async fn put_target(
    State(app): State<App>,
    headers: HeaderMap,
    Path((kind, name)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Answer {
    let p = target_admin(&app, &headers).await?;
    app.targets_ready()?;
    let q = Params::new(q, &["dry_run"])?;
    let dry_run = q.flag("dry_run")?;
    let id = path_id(&kind, &name)?;
    let text = std::str::from_utf8(&body).map_err(|_| bad("the body is not UTF-8"))?;
    let after = checked(&id, text)?;
    let current = app.targets.get(&id).and_then(Result::ok);
    if current.as_deref().is_some_and(|c| same(c, &after)) {
        return ok(json!({"id": id, "dry_run": dry_run, "changed": false}));
    }
    if dry_run {
        let parse = |d: &str| serde_json::from_str::<Value>(d).unwrap_or(Value::Null);
        return ok(json!({"id": id, "dry_run": true, "changed": true,
                         "before": current.as_deref().map(parse), "after": parse(&after)}));
    }
    let (status, action) = if current.is_some() {
        (StatusCode::OK, "target.replace")
    } else {
        (StatusCode::CREATED, "target.create")
    };
    let shown = change(&app, &p, &id, action, current, after, None).await?;
    Ok((status, axum::Json(shown)).into_response())
}

pub(super) async fn delete_target(
    State(app): State<App>,
    headers: HeaderMap,
    Path((kind, name)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let p = target_admin(&app, &headers).await?;
    app.targets_ready()?;
    let dry_run = Params::new(q, &["dry_run"])?.flag("dry_run")?;
    let id = path_id(&kind, &name)?;
    let current = app
        .targets
        .get(&id)
        .ok_or_else(|| not_found(format!("no declared target {id:?}")))?;
    if dry_run {
        return ok(
            json!({"id": id, "deleted": false, "dry_run": true, "before": shown(&id, &current)}),
        );
    }
    app.publish_target(&id, None).await?;
    db::audit(
        &app.pool,
        db::Audit {
            principal: &p.name,
            action: "target.delete",
            resource: &format!("targets/{id}"),
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
    let p = target_admin(&app, &headers).await?;
    app.targets_ready()?;
    let dry_run = Params::new(q, &["dry_run"])?.flag("dry_run")?;
    let why: PauseBody = if body.iter().all(u8::is_ascii_whitespace) {
        PauseBody::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| bad(format!("the body: {e}")))?
    };
    let id = path_id(&kind, &name)?;
    let current = match app.targets.get(&id) {
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
