//! The HTTP API, `/v1`. Every answer is JSON; every refusal is a 4xx with
//! `{"error": {"code", "message"}}` naming the exact problem. Lists take `limit`
//! (at most the configured page size) and `cursor` (from the previous page's
//! `next_cursor`); an unknown query parameter is refused, not ignored.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use futures::Stream;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::{Value, json};
use sluice_core::dependency::check_cycles;
use sluice_core::explain::explain;
use sluice_core::grants::Grant;
use sluice_core::packed::PackedState;
use sluice_core::{AssetKey, AssetState, DependencySpec, Progress};
use sluice_kit::wire::{WireGrant, WireSpec};
use sluice_kit::{Codec, SchemaName};
use sqlx::PgPool;

use crate::auth::{Principal, Role, TokenFile};
use crate::commits::Commits;
use crate::db;
use crate::jwt::Provider;
use crate::view::{Tables, View};

mod actions;
mod backfills;
mod declared;
mod ui;

/// Every route, as `openapi.json` documents it (a test holds the two together).
pub const ROUTES: &[(&str, &str)] = &[
    ("get", "/v1/whoami"),
    ("get", "/v1/assets"),
    ("get", "/v1/assets/{key}"),
    ("get", "/v1/assets/{key}/commits"),
    ("get", "/v1/assets/{key}/dependencies"),
    ("get", "/v1/dependencies"),
    ("get", "/v1/dependencies/{id}"),
    ("put", "/v1/dependencies/{id}"),
    ("delete", "/v1/dependencies/{id}"),
    ("get", "/v1/dependencies/{id}/explain"),
    ("get", "/v1/dependencies/{id}/triggers"),
    ("post", "/v1/dependencies/{id}/pause"),
    ("post", "/v1/dependencies/{id}/resume"),
    ("post", "/v1/dependencies/{id}/runs"),
    ("post", "/v1/dependencies/{id}/acknowledge-schema"),
    ("post", "/v1/runs/{trigger_key}/rerun"),
    ("post", "/v1/runs/{trigger_key}/settle"),
    ("post", "/v1/dependencies/{id}/backfills"),
    ("get", "/v1/backfills"),
    ("get", "/v1/backfills/{backfill_id}"),
    ("post", "/v1/backfills/{backfill_id}/cancel"),
    ("get", "/v1/runs"),
    ("get", "/v1/runs/{trigger_key}"),
    ("get", "/v1/lineage"),
    ("get", "/v1/events"),
    ("get", "/v1/audit"),
    ("get", "/v1/grants"),
    ("put", "/v1/grants/{id}"),
    ("delete", "/v1/grants/{id}"),
    ("get", "/v1/targets"),
    ("get", "/v1/targets/{kind}/{name}"),
    ("put", "/v1/targets/{kind}/{name}"),
    ("delete", "/v1/targets/{kind}/{name}"),
    ("post", "/v1/targets/{kind}/{name}/pause"),
    ("post", "/v1/targets/{kind}/{name}/resume"),
    ("get", "/v1/tables"),
    ("get", "/v1/tables/{asset}"),
    ("put", "/v1/tables/{asset}"),
    ("delete", "/v1/tables/{asset}"),
    ("get", "/v1/notifications"),
    ("get", "/v1/notifications/{name}"),
    ("put", "/v1/notifications/{name}"),
    ("delete", "/v1/notifications/{name}"),
    ("get", "/v1/notification-deliveries"),
    ("post", "/v1/notification-deliveries/{key}/retry"),
];

#[derive(Clone)]
pub struct App {
    pub view: Arc<View>,
    /// Callers by hashed token (`SLUICE_API_TOKENS_FILE`).
    pub tokens: Option<Arc<TokenFile>>,
    /// Callers by JWT from the identity provider (`SLUICE_API_JWKS`).
    pub idp: Option<Arc<Provider>>,
    pub pool: PgPool,
    pub producer: Arc<FutureProducer>,
    pub codec: Arc<Codec>,
    pub dependencies_topic: String,
    pub grants_topic: String,
    /// Declared targets, followed whole from `targets_topic`.
    pub targets: Arc<sluice_kit::declared::SharedDeclared>,
    pub targets_topic: String,
    /// Declared tables, followed whole from `tables_topic`.
    pub tables: Arc<sluice_kit::declared::SharedDeclared>,
    pub tables_topic: String,
    /// Declared notification rules, followed whole from `notifications_topic`.
    pub notifications: Arc<sluice_kit::declared::SharedDeclared>,
    pub notifications_topic: String,
    /// Where manual runs and re-runs go, for the dispatcher to record once.
    pub triggers_topic: String,
    pub commits: Arc<Commits>,
    pub max_page: usize,
    /// The lineage graph's last layout, kept while its nodes and edges stay the same.
    pub layouts: Arc<crate::layout::Cache>,
}

pub fn router(app: App) -> Router {
    Router::new()
        .route("/v1/whoami", get(whoami))
        .route("/v1/assets", get(list_assets))
        .route("/v1/assets/{key}", get(get_asset))
        .route("/v1/assets/{key}/commits", get(asset_commits))
        .route("/v1/assets/{key}/dependencies", get(asset_dependencies))
        .route("/v1/dependencies", get(list_dependencies))
        .route(
            "/v1/dependencies/{id}",
            get(get_dependency)
                .put(put_dependency)
                .delete(delete_dependency),
        )
        .route("/v1/dependencies/{id}/explain", get(explain_dependency))
        .route("/v1/dependencies/{id}/triggers", get(dependency_triggers))
        .route(
            "/v1/dependencies/{id}/pause",
            post(actions::pause_dependency),
        )
        .route(
            "/v1/dependencies/{id}/resume",
            post(actions::resume_dependency),
        )
        .route("/v1/dependencies/{id}/runs", post(actions::run_dependency))
        .route(
            "/v1/dependencies/{id}/acknowledge-schema",
            post(actions::acknowledge_schema),
        )
        .route("/v1/runs/{trigger_key}/rerun", post(actions::rerun))
        .route("/v1/runs/{trigger_key}/settle", post(actions::settle))
        .route(
            "/v1/dependencies/{id}/backfills",
            post(backfills::submit_backfill),
        )
        .route("/v1/backfills", get(backfills::list_backfills))
        .route("/v1/backfills/{backfill_id}", get(backfills::get_backfill))
        .route(
            "/v1/backfills/{backfill_id}/cancel",
            post(backfills::cancel_backfill),
        )
        .route("/v1/runs", get(list_runs))
        .route("/v1/runs/{trigger_key}", get(get_run))
        .route("/v1/lineage", get(lineage))
        .route("/v1/events", get(events))
        .route("/v1/audit", get(audit))
        .route("/v1/grants", get(list_grants))
        .route("/v1/grants/{id}", put(put_grant).delete(delete_grant))
        .route("/v1/targets", get(declared::list_targets))
        .route(
            "/v1/targets/{kind}/{name}",
            get(declared::get_target)
                .put(declared::put_target)
                .delete(declared::delete_target),
        )
        .route(
            "/v1/targets/{kind}/{name}/pause",
            post(declared::pause_target),
        )
        .route(
            "/v1/targets/{kind}/{name}/resume",
            post(declared::resume_target),
        )
        .route("/v1/tables", get(declared::list_tables))
        .route(
            "/v1/tables/{asset}",
            get(declared::get_table)
                .put(declared::put_table)
                .delete(declared::delete_table),
        )
        .route("/v1/notifications", get(declared::list_notifications))
        .route(
            "/v1/notifications/{name}",
            get(declared::get_notification)
                .put(declared::put_notification)
                .delete(declared::delete_notification),
        )
        .route(
            "/v1/notification-deliveries",
            get(declared::list_deliveries),
        )
        .route(
            "/v1/notification-deliveries/{key}/retry",
            post(declared::retry_delivery),
        )
        .route("/", get(ui::to_ui))
        .route("/ui", get(ui::to_ui))
        .route("/ui/", get(ui::index))
        .route("/ui/app.js", get(ui::script))
        .route("/ui/app.css", get(ui::style))
        .fallback(no_route)
        .method_not_allowed_fallback(no_method)
        .with_state(app)
}

// ---- errors ----

#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

type Answer = Result<Response, ApiError>;

fn err(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError {
        status,
        code,
        message: message.into(),
    }
}

fn bad(message: impl Into<String>) -> ApiError {
    err(StatusCode::BAD_REQUEST, "bad_request", message)
}

fn not_found(message: impl Into<String>) -> ApiError {
    err(StatusCode::NOT_FOUND, "not_found", message)
}

fn forbidden(message: impl Into<String>) -> ApiError {
    err(StatusCode::FORBIDDEN, "forbidden", message)
}

fn unavailable(message: impl Into<String>) -> ApiError {
    err(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        tracing::warn!(error = %e, "database read failed");
        unavailable(format!("the database did not answer: {e}"))
    }
}

impl From<crate::layout::LayoutFailed> for ApiError {
    fn from(e: crate::layout::LayoutFailed) -> Self {
        tracing::error!(error = %e, "lineage layout");
        unavailable(e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        (self.status, axum::Json(body)).into_response()
    }
}

async fn no_route() -> ApiError {
    not_found("no such route; see services/api/openapi.json")
}

async fn no_method() -> ApiError {
    err(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method; see services/api/openapi.json",
    )
}

fn ok(value: Value) -> Answer {
    Ok(axum::Json(value).into_response())
}

// ---- who is calling ----

impl App {
    async fn principal(&self, headers: &HeaderMap) -> Result<Principal, ApiError> {
        let unauthorized = |m: &str| err(StatusCode::UNAUTHORIZED, "unauthorized", m);
        let value = headers
            .get(header::AUTHORIZATION)
            .ok_or_else(|| unauthorized("no credentials: send Authorization: Bearer <token>"))?;
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or_else(|| unauthorized("Authorization must be `Bearer <token>`"))?;
        // A JWT has three dot-separated parts; a Sluice token has none.
        if token.split('.').count() == 3
            && let Some(idp) = &self.idp
        {
            return idp
                .principal(token)
                .await
                .map_err(|e| unauthorized(&e.to_string()));
        }
        self.tokens
            .as_ref()
            .and_then(|t| t.current().principal(token).cloned())
            .ok_or_else(|| unauthorized("the token is not valid"))
    }

    /// A reader of some project: assets and lineage are visible to any of them.
    async fn reader(&self, headers: &HeaderMap) -> Result<Principal, ApiError> {
        let p = self.principal(headers).await?;
        if !p.may_anywhere(Role::Viewer) {
            return Err(forbidden(format!("{} holds no role", p.name)));
        }
        Ok(p)
    }

    fn ready(&self) -> Result<(), ApiError> {
        if self.view.ready() {
            Ok(())
        } else {
            Err(unavailable(
                "still reading the engine's state; retry in a moment",
            ))
        }
    }
}

// ---- query parameters ----

/// The query string, every name checked against what the route takes.
struct Params(HashMap<String, String>);

impl Params {
    fn new(q: HashMap<String, String>, allowed: &[&str]) -> Result<Params, ApiError> {
        if let Some(k) = q.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(bad(format!(
                "unknown query parameter {k:?}; this route takes {}",
                if allowed.is_empty() {
                    "none".to_owned()
                } else {
                    allowed.join(", ")
                }
            )));
        }
        Ok(Params(q))
    }

    fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str).filter(|v| !v.is_empty())
    }

    fn limit(&self, max: usize, default: usize) -> Result<usize, ApiError> {
        match self.get("limit") {
            None => Ok(default.min(max)),
            Some(v) => match v.parse::<usize>() {
                Ok(n) if (1..=max).contains(&n) => Ok(n),
                _ => Err(bad(format!("limit must be 1..={max}, got {v:?}"))),
            },
        }
    }

    /// The row offset a `cursor` of an offset-paged list carries.
    fn offset(&self) -> Result<i64, ApiError> {
        match self.get("cursor") {
            None => Ok(0),
            Some(c) => c
                .parse::<i64>()
                .map_err(|_| bad(format!("cursor {c:?} is not one this API gave"))),
        }
    }

    fn flag(&self, k: &str) -> Result<bool, ApiError> {
        match self.get(k) {
            None | Some("false") => Ok(false),
            Some("true") => Ok(true),
            Some(v) => Err(bad(format!("{k} must be true or false, got {v:?}"))),
        }
    }
}

fn page(items: Vec<Value>, next_cursor: Option<String>) -> Value {
    json!({"items": items, "next_cursor": next_cursor})
}

fn asset_key(raw: &str) -> Result<AssetKey, ApiError> {
    AssetKey::parse(raw).map_err(|e| bad(format!("asset key {raw:?}: {e}")))
}

// ---- representations ----

fn asset_json(state: &AssetState, revision: i64) -> Value {
    let mut v = serde_json::to_value(state).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut v {
        m.insert("revision".into(), revision.into());
        // The remembered commits, newest first.
        m.insert(
            "recent".into(),
            state
                .recent
                .iter()
                .rev()
                .map(|c| serde_json::to_value(c).unwrap_or(Value::Null))
                .collect::<Vec<_>>()
                .into(),
        );
    }
    v
}

fn etag(spec: &DependencySpec) -> String {
    format!("\"v{}\"", spec.version)
}

fn dependency_json(t: &mut Tables, id: &str) -> Option<Value> {
    let refusal = t.refusal(id);
    let entry = t.specs.get(id)?.clone();
    let progress = t.progress.get(id);
    let mut v = match &entry.spec {
        Ok(spec) => json!({
            "id": id,
            "version": spec.version,
            "owner_project": spec.owner_project,
            "paused": spec.paused,
            "spec": spec,
            "etag": etag(spec),
        }),
        Err(_) => json!({"id": id}),
    };
    if let Value::Object(m) = &mut v {
        m.insert(
            "status".into(),
            if refusal.is_some() {
                "refused"
            } else {
                "accepted"
            }
            .into(),
        );
        m.insert("refused_reason".into(), refusal.into());
        m.insert(
            "last_trigger_key".into(),
            progress
                .and_then(|p| p.last_trigger_key.as_ref().map(|k| k.as_str().to_owned()))
                .into(),
        );
        m.insert(
            "last_triggered_ms".into(),
            progress.and_then(|p| p.last_triggered_ms).into(),
        );
        m.insert(
            "triggers_total".into(),
            progress.map_or(0, |p| p.triggers_total).into(),
        );
        m.insert(
            "pending_fire_at_ms".into(),
            progress.and_then(|p| p.fire_at_ms).into(),
        );
    }
    Some(v)
}

fn owner_of(t: &Tables, id: &str) -> Option<String> {
    t.specs
        .get(id)
        .and_then(|e| e.spec.as_ref().ok())
        .map(|s| s.owner_project.clone())
}

/// Whether the caller may see `id` (a record that is not a spec: only `*` viewers).
impl App {
    /// The dependencies `p` may see, for a database filter; none: all of them.
    fn visible_dependencies(&self, p: &Principal) -> Option<Vec<String>> {
        if p.may(Role::Viewer, "*") {
            return None;
        }
        let t = self.view.read();
        Some(
            t.specs
                .keys()
                .filter(|id| visible(p, &t, id))
                .cloned()
                .collect(),
        )
    }
}

fn visible(p: &Principal, t: &Tables, id: &str) -> bool {
    match owner_of(t, id) {
        Some(project) => p.may(Role::Viewer, &project),
        None => p.may(Role::Viewer, "*"),
    }
}

// ---- handlers ----

async fn whoami(State(app): State<App>, headers: HeaderMap) -> Answer {
    let p = app.principal(&headers).await?;
    ok(serde_json::to_value(p).unwrap_or(Value::Null))
}

async fn list_assets(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    app.reader(&headers).await?;
    app.ready()?;
    let q = Params::new(q, &["prefix", "namespace", "limit", "cursor"])?;
    let limit = q.limit(app.max_page, 100)?;
    let prefix = q.get("prefix").unwrap_or("");
    let namespace = q.get("namespace");
    let cursor = q.get("cursor").unwrap_or("");
    let t = app.view.read();
    // Keys are ordered: start at the cursor (or the prefix) and stop at the page end.
    let start = if cursor.is_empty() { prefix } else { cursor };
    let mut items = Vec::with_capacity(limit);
    let mut next = None;
    for (k, packed) in t.assets.range::<str, _>((
        if cursor.is_empty() {
            std::ops::Bound::Included(start)
        } else {
            std::ops::Bound::Excluded(start)
        },
        std::ops::Bound::Unbounded,
    )) {
        if !k.as_str().starts_with(prefix) {
            if k.as_str() > prefix {
                break;
            }
            continue;
        }
        if namespace.is_some_and(|n| format!("{}.{}", k.catalog(), k.namespace()) != n) {
            continue;
        }
        if items.len() == limit {
            next = items
                .last()
                .and_then(|v: &Value| v["asset_key"].as_str().map(str::to_owned));
            break;
        }
        let (s, r) = packed.unpack();
        items.push(asset_json(&s, r));
    }
    ok(page(items, next))
}

async fn get_asset(
    State(app): State<App>,
    headers: HeaderMap,
    Path(key): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    app.reader(&headers).await?;
    app.ready()?;
    Params::new(q, &[])?;
    let key = asset_key(&key)?;
    let t = app.view.read();
    let (s, r) = t
        .assets
        .get(&key)
        .map(PackedState::unpack)
        .ok_or_else(|| not_found(format!("no commit of asset {key} has been seen")))?;
    let tag = format!("\"r{r}\"");
    if headers
        .get(header::IF_NONE_MATCH)
        .is_some_and(|v| v.as_bytes() == tag.as_bytes())
    {
        return Ok(StatusCode::NOT_MODIFIED.into_response());
    }
    let mut resp = axum::Json(asset_json(&s, r)).into_response();
    if let Ok(v) = HeaderValue::from_str(&tag) {
        resp.headers_mut().insert(header::ETAG, v);
    }
    Ok(resp)
}

async fn asset_commits(
    State(app): State<App>,
    headers: HeaderMap,
    Path(key): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    app.reader(&headers).await?;
    let q = Params::new(q, &["limit"])?;
    let limit = q.limit(app.max_page, 20)?;
    let key = asset_key(&key)?;
    let commits = app.commits.clone();
    let found = tokio::task::spawn_blocking(move || commits.newest(&key, limit))
        .await
        .map_err(|e| unavailable(format!("reading the evidence log: {e}")))?
        .map_err(|e| unavailable(format!("reading the evidence log: {e}")))?;
    ok(json!({
        "items": found.events,
        "complete": found.complete,
    }))
}

async fn asset_dependencies(
    State(app): State<App>,
    headers: HeaderMap,
    Path(key): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let p = app.reader(&headers).await?;
    app.ready()?;
    Params::new(q, &[])?;
    let key = asset_key(&key)?;
    let t = app.view.read();
    let mut readers = Vec::new();
    let mut producers = Vec::new();
    for (id, e) in &t.specs {
        let Ok(s) = &e.spec else { continue };
        if !p.may(Role::Viewer, &s.owner_project) {
            continue;
        }
        if s.condition.inputs().contains(&key) {
            readers.push(id.clone());
        }
        if s.produces.as_ref() == Some(&key) {
            producers.push(id.clone());
        }
    }
    ok(json!({"asset": key, "read_by": readers, "produced_by": producers}))
}

async fn list_dependencies(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let p = app.principal(&headers).await?;
    app.ready()?;
    let q = Params::new(q, &["project", "status", "prefix", "limit", "cursor"])?;
    let limit = q.limit(app.max_page, 100)?;
    let status = q.get("status");
    if let Some(s) = status
        && !["accepted", "refused"].contains(&s)
    {
        return Err(bad(format!(
            "status must be accepted or refused, got {s:?}"
        )));
    }
    let project = q.get("project");
    let prefix = q.get("prefix").unwrap_or("");
    let cursor = q.get("cursor").unwrap_or("");
    let mut t = app.view.write();
    let mut items = Vec::with_capacity(limit);
    let mut next = None;
    let mut after = cursor.to_owned();
    // Ids in order from the cursor, a batch at a time, until the page is full.
    'pages: loop {
        let batch: Vec<String> = t
            .specs
            .range::<str, _>((
                std::ops::Bound::Excluded(after.as_str()),
                std::ops::Bound::Unbounded,
            ))
            .map(|(id, _)| id)
            .take(256)
            .cloned()
            .collect();
        let Some(last) = batch.last().cloned() else {
            break;
        };
        for id in batch {
            if !id.starts_with(prefix)
                || !visible(&p, &t, &id)
                || project.is_some_and(|pr| owner_of(&t, &id).as_deref() != Some(pr))
            {
                continue;
            }
            let Some(v) = dependency_json(&mut t, &id) else {
                continue;
            };
            if status.is_some_and(|s| v["status"] != s) {
                continue;
            }
            if items.len() == limit {
                next = items
                    .last()
                    .and_then(|v: &Value| v["id"].as_str().map(str::to_owned));
                break 'pages;
            }
            items.push(v);
        }
        after = last;
    }
    ok(page(items, next))
}

fn forbidden_or_missing(p: &Principal, t: &Tables, id: &str) -> Result<(), ApiError> {
    if !t.specs.contains_key(id) {
        return Err(not_found(format!("no dependency {id:?}")));
    }
    if !visible(p, t, id) {
        // Same answer as a missing one would leak existence; say what is lacking.
        let project = owner_of(t, id).unwrap_or_else(|| "*".into());
        return Err(forbidden(p.lacks(Role::Viewer, &project)));
    }
    Ok(())
}

async fn get_dependency(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let p = app.principal(&headers).await?;
    app.ready()?;
    Params::new(q, &[])?;
    let mut t = app.view.write();
    forbidden_or_missing(&p, &t, &id)?;
    let v =
        dependency_json(&mut t, &id).ok_or_else(|| not_found(format!("no dependency {id:?}")))?;
    let tag = v["etag"].as_str().map(str::to_owned);
    if let Some(tag) = &tag
        && headers
            .get(header::IF_NONE_MATCH)
            .is_some_and(|h| h.as_bytes() == tag.as_bytes())
    {
        return Ok(StatusCode::NOT_MODIFIED.into_response());
    }
    let mut resp = axum::Json(v).into_response();
    if let Some(v) = tag.and_then(|t| HeaderValue::from_str(&t).ok()) {
        resp.headers_mut().insert(header::ETAG, v);
    }
    Ok(resp)
}

/// Field by field, what a change would do.
fn diff(before: Option<&DependencySpec>, after: Option<&DependencySpec>) -> Vec<Value> {
    let as_map = |s: Option<&DependencySpec>| -> BTreeMap<String, Value> {
        match s.map(serde_json::to_value) {
            Some(Ok(Value::Object(m))) => m.into_iter().collect(),
            _ => BTreeMap::new(),
        }
    };
    let (b, a) = (as_map(before), as_map(after));
    let fields: BTreeSet<&String> = b.keys().chain(a.keys()).collect();
    fields
        .into_iter()
        .filter(|f| b.get(*f) != a.get(*f))
        .map(|f| json!({"field": f, "before": b.get(f), "after": a.get(f)}))
        .collect()
}

fn check_if_match(headers: &HeaderMap, current: Option<&DependencySpec>) -> Result<(), ApiError> {
    let Some(want) = headers.get(header::IF_MATCH) else {
        return Ok(());
    };
    let have = current.map(etag);
    if want.as_bytes() == b"*" && have.is_some() {
        return Ok(());
    }
    if have.as_deref().map(str::as_bytes) != Some(want.as_bytes()) {
        return Err(err(
            StatusCode::PRECONDITION_FAILED,
            "precondition_failed",
            format!(
                "If-Match {:?} but the applied version is {}",
                String::from_utf8_lossy(want.as_bytes()),
                have.unwrap_or_else(|| "absent".into())
            ),
        ));
    }
    Ok(())
}

impl App {
    /// Publishes a record (`None`: a tombstone) with an idempotent producer;
    /// returns where it landed.
    async fn publish(
        &self,
        topic: &str,
        key: &str,
        payload: Option<Vec<u8>>,
    ) -> Result<(i32, i64), ApiError> {
        let mut record = FutureRecord::<str, Vec<u8>>::to(topic).key(key);
        if let Some(p) = &payload {
            record = record.payload(p);
        }
        let delivery = self
            .producer
            .send(record, Duration::from_secs(30))
            .await
            .map_err(|(e, _)| unavailable(format!("the broker did not take the record: {e}")))?;
        Ok((delivery.partition, delivery.offset))
    }

    /// Publishes `spec` (or a tombstone) and waits until this instance has read it
    /// back, so the next GET shows it.
    async fn publish_spec(&self, id: &str, spec: Option<&DependencySpec>) -> Result<(), ApiError> {
        let payload = match spec {
            Some(s) => Some(
                self.codec
                    .encode(
                        SchemaName::DependencySpec,
                        &self.dependencies_topic,
                        &WireSpec::from(s),
                    )
                    .await
                    .map_err(|e| unavailable(format!("encoding the spec: {e}")))?,
            ),
            None => None,
        };
        let (partition, offset) = self.publish(&self.dependencies_topic, id, payload).await?;
        if !self
            .view
            .wait_spec_read(partition, offset, Duration::from_secs(10))
            .await
        {
            tracing::warn!(id, "published, but not yet read back");
        }
        Ok(())
    }

    /// Publishes a grant (or its revocation) and waits until it is in force here.
    async fn publish_grant(&self, id: &str, grant: Option<&Grant>) -> Result<(), ApiError> {
        let payload = match grant {
            Some(g) => Some(
                self.codec
                    .encode(SchemaName::Grant, &self.grants_topic, &WireGrant::from(g))
                    .await
                    .map_err(|e| unavailable(format!("encoding the grant: {e}")))?,
            ),
            None => None,
        };
        self.publish(&self.grants_topic, id, payload).await?;
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.view.grants.snapshot().0.get(id) != grant {
            if tokio::time::Instant::now() > until {
                tracing::warn!(id, "grant published, but not yet read back");
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }
}

async fn put_dependency(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Answer {
    let p = app.principal(&headers).await?;
    app.ready()?;
    let q = Params::new(q, &["dry_run"])?;
    let dry_run = q.flag("dry_run")?;
    let text = std::str::from_utf8(&body).map_err(|_| bad("the body is not UTF-8"))?;
    let spec = DependencySpec::from_json(text).map_err(|e| {
        err(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_spec",
            e.to_string(),
        )
    })?;
    if spec.id != id {
        return Err(bad(format!(
            "the path names {id:?} but the spec's id is {:?}",
            spec.id
        )));
    }
    if !p.may(Role::Editor, &spec.owner_project) {
        return Err(forbidden(p.lacks(Role::Editor, &spec.owner_project)));
    }
    let (current, others) = {
        let mut t = app.view.write();
        let current = t.specs.get(&id).and_then(|e| e.spec.as_ref().ok()).cloned();
        let others: Vec<DependencySpec> = t.accepted().into_iter().filter(|s| s.id != id).collect();
        (current, others)
    };
    if let Some(c) = &current
        && c.owner_project != spec.owner_project
        && !p.may(Role::Editor, &c.owner_project)
    {
        return Err(forbidden(format!(
            "{id:?} belongs to project {:?}: {}",
            c.owner_project,
            p.lacks(Role::Editor, &c.owner_project)
        )));
    }
    check_if_match(&headers, current.as_ref())?;
    check_cycles(others.iter().chain([&spec])).map_err(|e| {
        err(
            StatusCode::UNPROCESSABLE_ENTITY,
            "cycle",
            format!("{e} (against the applied dependencies)"),
        )
    })?;
    let enforced = app.view.read().enforced.clone();
    if let Some(grants) = enforced {
        grants.check(&spec).map_err(|e| {
            forbidden(format!(
                "{e}; an admin grants it with PUT /v1/grants/{{id}}"
            ))
        })?;
    }
    let changes = diff(current.as_ref(), Some(&spec));
    if let Some(c) = &current {
        if changes.is_empty() {
            return ok(json!({"id": id, "dry_run": dry_run, "changed": false, "diff": changes}));
        }
        if spec.version <= c.version {
            return Err(err(
                StatusCode::CONFLICT,
                "version_conflict",
                format!(
                    "version {} is applied with other content; send version {} or more",
                    c.version,
                    c.version + 1
                ),
            ));
        }
    }
    if dry_run {
        return ok(
            json!({"id": id, "dry_run": true, "changed": true, "created": current.is_none(), "diff": changes}),
        );
    }
    app.publish_spec(&id, Some(&spec)).await?;
    db::audit(
        &app.pool,
        db::Audit {
            principal: &p.name,
            action: if current.is_some() {
                "dependency.replace"
            } else {
                "dependency.create"
            },
            resource: &format!("dependencies/{id}"),
            project: &spec.owner_project,
            before: current.as_ref().and_then(|c| serde_json::to_value(c).ok()),
            after: serde_json::to_value(&spec).ok(),
        },
    )
    .await?;
    let status = if current.is_some() {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let body = {
        let mut t = app.view.write();
        dependency_json(&mut t, &id).unwrap_or_else(|| json!({"id": id, "status": "published"}))
    };
    let mut resp = (status, axum::Json(body)).into_response();
    if let Ok(v) = HeaderValue::from_str(&etag(&spec)) {
        resp.headers_mut().insert(header::ETAG, v);
    }
    Ok(resp)
}

async fn delete_dependency(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let p = app.principal(&headers).await?;
    app.ready()?;
    let q = Params::new(q, &["dry_run"])?;
    let dry_run = q.flag("dry_run")?;
    let (current, project) = {
        let t = app.view.read();
        if !t.specs.contains_key(&id) {
            return Err(not_found(format!("no dependency {id:?}")));
        }
        let current = t.specs.get(&id).and_then(|e| e.spec.as_ref().ok()).cloned();
        let project = owner_of(&t, &id).unwrap_or_else(|| "*".into());
        (current, project)
    };
    if !p.may(Role::Editor, &project) {
        return Err(forbidden(p.lacks(Role::Editor, &project)));
    }
    check_if_match(&headers, current.as_ref())?;
    let changes = diff(current.as_ref(), None);
    if dry_run {
        return ok(json!({"id": id, "dry_run": true, "deleted": false, "diff": changes}));
    }
    app.publish_spec(&id, None).await?;
    db::audit(
        &app.pool,
        db::Audit {
            principal: &p.name,
            action: "dependency.delete",
            resource: &format!("dependencies/{id}"),
            project: &project,
            before: current.as_ref().and_then(|c| serde_json::to_value(c).ok()),
            after: None,
        },
    )
    .await?;
    ok(json!({"id": id, "deleted": true}))
}

async fn explain_dependency(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let p = app.principal(&headers).await?;
    app.ready()?;
    let q = Params::new(q, &["at_ms"])?;
    let now = match q.get("at_ms") {
        None => sluice_kit::clock::now_ms(),
        Some(v) => v.parse::<i64>().map_err(|_| {
            bad(format!(
                "at_ms must be milliseconds since the epoch, got {v:?}"
            ))
        })?,
    };
    let mut t = app.view.write();
    forbidden_or_missing(&p, &t, &id)?;
    let refusal = t.refusal(&id);
    let spec = match &t.specs.get(&id).map(|e| &e.spec) {
        Some(Ok(s)) => s.clone(),
        _ => {
            return ok(json!({
                "dependency_id": id,
                "accepted": false,
                "refused_reason": refusal,
                "summary": format!("refused: {}", refusal.clone().unwrap_or_default()),
            }));
        }
    };
    let progress = t.progress.get(&id).cloned().unwrap_or_else(|| Progress {
        version: spec.version,
        ..Progress::default()
    });
    let inputs: BTreeMap<AssetKey, AssetState> = spec
        .inputs()
        .into_iter()
        .filter_map(|a| Some((a.clone(), t.assets.get(&a)?.unpack().0)))
        .collect();
    let e = explain(&spec, &progress, &|a| inputs.get(a), now);
    let mut v = serde_json::to_value(&e).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut v {
        m.insert("accepted".into(), refusal.is_none().into());
        if let Some(r) = &refusal {
            m.insert(
                "summary".into(),
                format!("refused, so never evaluated: {r}").into(),
            );
        }
        m.insert("refused_reason".into(), refusal.into());
    }
    ok(v)
}

async fn dependency_triggers(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let p = app.principal(&headers).await?;
    let q = Params::new(q, &["limit", "cursor"])?;
    let limit = q.limit(app.max_page, 50)?;
    {
        let t = app.view.read();
        if t.specs.contains_key(&id) {
            forbidden_or_missing(&p, &t, &id)?;
        } else if !p.may(Role::Viewer, "*") {
            // A deleted dependency's history: for viewers of every project only.
            return Err(not_found(format!("no dependency {id:?}")));
        }
    }
    let before = match q.get("cursor") {
        None => None,
        Some(c) => Some(
            c.split_once(':')
                .and_then(|(ms, key)| Some((ms.parse::<i64>().ok()?, key.to_owned())))
                .ok_or_else(|| bad(format!("cursor {c:?} is not one this API gave")))?,
        ),
    };
    let rows = db::triggers(&app.pool, &id, before, limit as i64 + 1).await?;
    let mut items = rows.as_array().cloned().unwrap_or_default();
    let next = if items.len() > limit {
        items.truncate(limit);
        items.last().map(|r| {
            format!(
                "{}:{}",
                r["recorded_ms"],
                r["trigger_key"].as_str().unwrap_or("")
            )
        })
    } else {
        None
    };
    ok(page(items, next))
}

async fn list_runs(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let p = app.principal(&headers).await?;
    let q = Params::new(
        q,
        &[
            "status",
            "dependency",
            "target",
            "backfill",
            "limit",
            "cursor",
        ],
    )?;
    let limit = q.limit(app.max_page, 100)?;
    let status = q.get("status").map(str::to_ascii_uppercase);
    if let Some(s) = &status
        && sluice_core::JobStatus::parse(s).is_none()
    {
        return Err(bad(format!(
            "status must be one of PENDING, RUNNING, SUCCEEDED, FAILED, UNKNOWN, CANCELLED; got {s:?}"
        )));
    }
    let offset = q.offset()?;
    let visible = app.visible_dependencies(&p);
    let filter = db::RunFilter {
        status,
        dependency: q.get("dependency").map(str::to_owned),
        target: q.get("target").map(str::to_owned),
        backfill: q.get("backfill").map(str::to_owned),
        visible,
    };
    let rows = db::runs(&app.pool, &filter, offset, limit as i64 + 1).await?;
    let mut items = rows.as_array().cloned().unwrap_or_default();
    let next = (items.len() > limit).then(|| (offset + limit as i64).to_string());
    items.truncate(limit);
    ok(page(items, next))
}

async fn get_run(
    State(app): State<App>,
    headers: HeaderMap,
    Path(key): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let p = app.principal(&headers).await?;
    Params::new(q, &[])?;
    if !key.starts_with("tk1-") || key.len() != 36 {
        return Err(bad(format!(
            "{key:?} is not a trigger key (tk1- and 32 hex digits)"
        )));
    }
    let run = db::run(&app.pool, &key)
        .await?
        .ok_or_else(|| not_found(format!("no run {key}")))?;
    let dependency = run["dependency_id"].as_str().unwrap_or_default();
    let allowed = {
        let t = app.view.read();
        visible(&p, &t, dependency)
    };
    if !allowed {
        return Err(forbidden(format!(
            "{} may not see the runs of {dependency:?}",
            p.name
        )));
    }
    let mut run = run;
    run["target_url"] = target_url(&app, &run).map_or(Value::Null, Value::String);
    ok(run)
}

/// Where a person sees the run at its target: for an Airflow target declared
/// through the API, the dag run's page in Airflow's UI (a bootstrap target's URL
/// is the dispatcher's configuration, unknown here).
fn target_url(app: &App, run: &Value) -> Option<String> {
    if run["target_kind"] != "AIRFLOW" {
        return None;
    }
    let name = run["target_name"].as_str()?;
    let run_id = run["external_id"].as_str()?;
    let doc = app
        .targets
        .get(&format!("airflow/{name}"))
        .or_else(|| app.targets.get("airflow/*"))?
        .ok()?;
    let url = serde_json::from_str::<Value>(&doc).ok()?["url"]
        .as_str()?
        .trim_end_matches('/')
        .to_owned();
    let dag = run["target_parameters"]["dag_id"].as_str().unwrap_or(name);
    Some(format!(
        "{url}/dags/{}/runs/{}",
        sluice_kit::uri::component(dag),
        sluice_kit::uri::component(run_id)
    ))
}

async fn lineage(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let p = app.reader(&headers).await?;
    app.ready()?;
    let q = Params::new(q, &["project", "filter", "layout"])?;
    let project = q.get("project");
    // A substring of a dependency's id or of an input's or product's key: the
    // dependencies that match, with their edges.
    let filter = q.get("filter").filter(|f| !f.is_empty());
    let layout = match q.get("layout") {
        None => false,
        Some("layered") => true,
        Some(other) => return Err(bad(format!("layout must be `layered`, not {other:?}"))),
    };
    let now = sluice_kit::clock::now_ms();
    let (mut nodes, edges, ids) = {
        let mut t = app.view.write();
        let ids: Vec<String> = t
            .specs
            .keys()
            .filter(|id| visible(&p, &t, id))
            .filter(|id| project.is_none_or(|pr| owner_of(&t, id).as_deref() == Some(pr)))
            .cloned()
            .collect();
        let mut assets: BTreeMap<AssetKey, &'static str> = BTreeMap::new();
        let mut stale: BTreeSet<AssetKey> = BTreeSet::new();
        let mut nodes = Vec::new();
        let mut edges = Vec::new();
        let mut shown = Vec::new();
        for id in ids {
            let refused = t.refusal(&id);
            let Some(Ok(s)) = t.specs.get(&id).map(|e| &e.spec) else {
                continue;
            };
            let inputs = s.condition.inputs();
            if let Some(f) = filter
                && !id.contains(f)
                && !inputs
                    .iter()
                    .copied()
                    .chain(s.produces.as_ref())
                    .any(|a| a.as_str().contains(f))
            {
                continue;
            }
            let progress = t.progress.get(&id);
            nodes.push(json!({
                "kind": "dependency", "id": id, "project": s.owner_project,
                "status": if refused.is_some() { "refused" } else { "accepted" },
                "paused": s.paused,
                "last_triggered_ms": progress.and_then(|p| p.last_triggered_ms),
                // A quiet period or minimum interval runs: it fires then.
                "fire_at_ms": progress.and_then(|p| p.fire_at_ms),
            }));
            for (input, bound) in s.condition.freshness_bounds() {
                if t.assets.get(input).is_some_and(|p| {
                    sluice_core::condition::stale_commit(&p.unpack().0, bound, now).is_some()
                }) {
                    stale.insert(input.clone());
                }
            }
            for input in inputs {
                assets.entry(input.clone()).or_insert("reads");
                edges.push(json!({"from": input, "to": id, "kind": "reads"}));
            }
            if let Some(out) = &s.produces {
                assets.insert(out.clone(), "produced");
                edges.push(json!({"from": id, "to": out, "kind": "produces"}));
            }
            shown.push(id);
        }
        for a in assets.keys() {
            let state = t.assets.get(a).map(|p| p.unpack().0);
            let state = state.as_ref();
            nodes.push(json!({
                "kind": "asset", "id": a,
                "sequence": state.and_then(|s| s.latest.as_ref().map(|c| c.sequence)),
                "last_commit_ms": state.and_then(|s| s.latest.as_ref().map(|c| c.commit_time_ms)),
                "stale": stale.contains(a),
            }));
        }
        (nodes, edges, shown)
    };
    // Each dependency's last run, and what the UI colours by: a dependency by its
    // status, an asset fresh, stale past a reader's fresh_within, failed (its
    // producer's last run failed) or waiting for its first commit.
    let last = db::last_runs(&app.pool, &ids).await?;
    let mut producer_failed = BTreeSet::new();
    for e in &edges {
        if e["kind"] == "produces"
            && last[e["from"].as_str().unwrap_or_default()]["status"] == "FAILED"
        {
            producer_failed.insert(e["to"].as_str().unwrap_or_default().to_owned());
        }
    }
    for n in &mut nodes {
        let id = n["id"].as_str().unwrap_or_default().to_owned();
        if n["kind"] == "dependency" {
            let run = &last[id.as_str()];
            n["last_run_status"] = run["status"].clone();
            n["last_trigger_key"] = run["trigger_key"].clone();
            n["state"] = json!(match (
                n["status"].as_str(),
                n["paused"].as_bool(),
                run["status"].as_str()
            ) {
                (Some("refused"), _, _) => "refused",
                (_, Some(true), _) => "paused",
                (_, _, Some("FAILED")) => "failed",
                (_, _, Some("UNKNOWN")) => "unknown",
                (_, _, Some("PENDING" | "RUNNING")) => "running",
                _ if n["fire_at_ms"].is_i64() => "pending",
                _ => "waiting",
            });
        } else {
            n["state"] = json!(if producer_failed.contains(&id) {
                "failed"
            } else if n["stale"] == true {
                "stale"
            } else if n["sequence"].is_null() {
                "waiting"
            } else {
                "fresh"
            });
        }
    }
    if !layout {
        return ok(json!({"nodes": nodes, "edges": edges}));
    }
    let names: Vec<String> = nodes
        .iter()
        .map(|n| {
            format!(
                "{}:{}",
                n["kind"].as_str().unwrap_or_default(),
                n["id"].as_str().unwrap_or_default()
            )
        })
        .collect();
    let node_of = |kind: &str, id: &Value| format!("{kind}:{}", id.as_str().unwrap_or_default());
    let pairs: Vec<(String, String)> = edges
        .iter()
        .map(|e| match e["kind"].as_str() {
            Some("reads") => (
                node_of("asset", &e["from"]),
                node_of("dependency", &e["to"]),
            ),
            _ => (
                node_of("dependency", &e["from"]),
                node_of("asset", &e["to"]),
            ),
        })
        .collect();
    let placed = app.layouts.place(names.clone(), pairs).await?;
    for (n, name) in nodes.iter_mut().zip(&names) {
        if let Some((x, y)) = placed.at.get(name) {
            n["x"] = json!(x);
            n["y"] = json!(y);
        }
    }
    ok(json!({"nodes": nodes, "edges": edges, "width": placed.width, "height": placed.height}))
}

async fn events(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let p = app.reader(&headers).await?;
    Params::new(q, &[])?;
    let rx = app.view.events.subscribe();
    let view = app.view.clone();
    let stream = futures::stream::unfold((rx, view, p), |(mut rx, view, p)| async move {
        loop {
            match rx.recv().await {
                Ok(e) => {
                    let dependency = match &e {
                        crate::view::Event::Dependency { id, .. } => Some(id.clone()),
                        crate::view::Event::Progress { dependency_id, .. }
                        | crate::view::Event::Run { dependency_id, .. } => {
                            Some(dependency_id.clone())
                        }
                        crate::view::Event::State { .. } => None,
                    };
                    if let Some(d) = dependency {
                        let t = view.read();
                        if t.specs.contains_key(&d) && !visible(&p, &t, &d) {
                            continue;
                        }
                    }
                    let data = serde_json::to_string(&e).unwrap_or_default();
                    let kind = serde_json::to_value(&e)
                        .ok()
                        .and_then(|v| v["type"].as_str().map(str::to_owned))
                        .unwrap_or_default();
                    return Some((
                        Ok(SseEvent::default().event(kind).data(data)),
                        (rx, view, p),
                    ));
                }
                // A slow reader missed events: say so, so it can re-read the lists.
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    let ev = SseEvent::default()
                        .event("lagged")
                        .data(json!({"missed": n}).to_string());
                    return Some((Ok(ev), (rx, view, p)));
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

async fn audit(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let p = app.principal(&headers).await?;
    if !p.may_anywhere(Role::Admin) {
        return Err(forbidden(format!(
            "{} is not an admin of any project; the audit log needs admin",
            p.name
        )));
    }
    let q = Params::new(q, &["limit", "cursor"])?;
    let limit = q.limit(app.max_page, 100)?;
    let before = q
        .get("cursor")
        .map(|c| {
            c.parse::<i64>()
                .map_err(|_| bad(format!("cursor {c:?} is not one this API gave")))
        })
        .transpose()?;
    let rows = db::audit_log(&app.pool, before, limit as i64 + 1).await?;
    let mut items = rows.as_array().cloned().unwrap_or_default();
    let all_projects = p.may(Role::Admin, "*");
    items.retain(|r| {
        all_projects
            || r["project"]
                .as_str()
                .is_some_and(|pr| p.may(Role::Admin, pr))
    });
    let next = if items.len() > limit {
        items.truncate(limit);
        items.last().map(|r| r["id"].to_string())
    } else {
        None
    };
    ok(page(items, next))
}

// ---- grants ----

async fn list_grants(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    app.reader(&headers).await?;
    app.ready()?;
    let q = Params::new(q, &["project"])?;
    let project = q.get("project");
    let enforced = app.view.read().enforced.is_some();
    let items: Vec<Value> = app
        .view
        .grants
        .snapshot()
        .0
        .into_values()
        .filter(|g| project.is_none_or(|p| g.project == p))
        .map(|g| serde_json::to_value(g).unwrap_or(Value::Null))
        .collect();
    ok(json!({"enforced": enforced, "items": items}))
}

/// Grants open one project's reach into another's data and targets: only an
/// admin of every project (`*`) gives or takes them.
async fn grant_admin(app: &App, headers: &HeaderMap) -> Result<Principal, ApiError> {
    let p = app.principal(headers).await?;
    if !p.may(Role::Admin, "*") {
        return Err(forbidden(format!(
            "{}; grants need admin of every project (\"*\")",
            p.lacks(Role::Admin, "*")
        )));
    }
    Ok(p)
}

async fn put_grant(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Answer {
    let p = grant_admin(&app, &headers).await?;
    app.ready()?;
    let q = Params::new(q, &["dry_run"])?;
    let dry_run = q.flag("dry_run")?;
    let text = std::str::from_utf8(&body).map_err(|_| bad("the body is not UTF-8"))?;
    let grant = Grant::from_json(text).map_err(|e| {
        err(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_grant",
            e.to_string(),
        )
    })?;
    if grant.id != id {
        return Err(bad(format!(
            "the path names {id:?} but the grant's id is {:?}",
            grant.id
        )));
    }
    let current = app.view.grants.snapshot().0.get(&id).cloned();
    if current.as_ref() == Some(&grant) {
        return ok(json!({"id": id, "dry_run": dry_run, "changed": false}));
    }
    if dry_run {
        return ok(
            json!({"id": id, "dry_run": true, "changed": true, "before": current, "after": grant}),
        );
    }
    app.publish_grant(&id, Some(&grant)).await?;
    db::audit(
        &app.pool,
        db::Audit {
            principal: &p.name,
            action: if current.is_some() {
                "grant.replace"
            } else {
                "grant.create"
            },
            resource: &format!("grants/{id}"),
            project: &grant.project,
            before: current.as_ref().and_then(|g| serde_json::to_value(g).ok()),
            after: serde_json::to_value(&grant).ok(),
        },
    )
    .await?;
    let status = if current.is_some() {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((
        status,
        axum::Json(serde_json::to_value(&grant).unwrap_or(Value::Null)),
    )
        .into_response())
}

async fn delete_grant(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let p = grant_admin(&app, &headers).await?;
    app.ready()?;
    Params::new(q, &[])?;
    let current = app
        .view
        .grants
        .snapshot()
        .0
        .get(&id)
        .cloned()
        .ok_or_else(|| not_found(format!("no grant {id:?}")))?;
    app.publish_grant(&id, None).await?;
    db::audit(
        &app.pool,
        db::Audit {
            principal: &p.name,
            action: "grant.delete",
            resource: &format!("grants/{id}"),
            project: &current.project,
            before: serde_json::to_value(&current).ok(),
            after: None,
        },
    )
    .await?;
    ok(json!({"id": id, "deleted": true}))
}
