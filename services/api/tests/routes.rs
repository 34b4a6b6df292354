//! The API's routes without a broker or a database: the view is filled by hand,
//! the database pool points nowhere (routes that need it answer 503 once the
//! caller is let in). Covers the OpenAPI document, the 401 / 403 matrix over every
//! route and role, and bad input on every route.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sluice_api::auth::TokenFile;
use sluice_api::commits::Commits;
use sluice_api::routes::{App, ROUTES, router};
use sluice_api::view::View;
use sluice_core::{AssetEvent, AssetKey, AssetState, DependencySpec, EventSource, TableFormat};
use sluice_kit::Codec;
use tower::ServiceExt;

const PRINCIPALS: [(&str, &str); 7] = [
    ("gmv-viewer", r#"{"gmv": "viewer"}"#),
    ("gmv-editor", r#"{"gmv": "editor"}"#),
    ("gmv-operator", r#"{"gmv": "operator"}"#),
    ("gmv-admin", r#"{"gmv": "admin"}"#),
    ("other-editor", r#"{"other": "editor"}"#),
    ("all-viewer", r#"{"*": "viewer"}"#),
    ("root", r#"{"*": "admin"}"#),
];

fn token(name: &str) -> String {
    format!("{name}-token-0123456789")
}

fn spec(id: &str, project: &str, input: &str, produces: Option<&str>) -> DependencySpec {
    let produces = produces.map_or("null".to_owned(), |p| format!("{p:?}"));
    DependencySpec::from_json(&format!(
        r#"{{"id": "{id}", "version": 1, "owner_project": "{project}",
            "target": {{"kind": "webhook", "name": "hook"}},
            "condition": {{"input": {{"asset": "{input}"}}}}, "produces": {produces}}}"#
    ))
    .expect("valid")
}

fn app() -> App {
    app_with(View::new())
}

fn app_with(view: Arc<View>) -> App {
    let dir = std::env::temp_dir().join(format!("sluice-api-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join(format!("tokens-{}.json", uuid()));
    let entries: Vec<Value> = PRINCIPALS
        .iter()
        .map(|(name, roles)| {
            json!({"name": name, "sha256": hex::encode(Sha256::digest(token(name).as_bytes())),
                   "roles": serde_json::from_str::<Value>(roles).expect("json")})
        })
        .collect();
    std::fs::write(&file, serde_json::to_string(&entries).expect("json")).expect("write");
    for (i, s) in [
        spec("gmv-dep", "gmv", "lake.ods.order", Some("lake.dwd.trade")),
        spec("other-dep", "other", "lake.ods.order", None),
    ]
    .iter()
    .enumerate()
    {
        view.apply_spec(&s.id, (i as i64, 0, i as i64), Some(Ok(s.clone())));
    }
    let key = AssetKey::parse("lake.ods.order").expect("key");
    let mut state = AssetState::new(key.clone(), TableFormat::Paimon);
    state.apply(&AssetEvent::committed(
        key.clone(),
        TableFormat::Paimon,
        7,
        7,
        1_000,
        EventSource::Push,
    ));
    view.apply_state(key.as_str(), Some((state, 1)));
    view.mark_caught_up();
    let targets = sluice_kit::declared::SharedDeclared::new();
    targets.apply(
        "webhook/hooks",
        Some(Ok(
            r#"{"kind": "webhook", "name": "hooks", "url": "http://hooks/in", "secret": {"env": "HOOKS_SECRET"}}"#
                .into(),
        )),
    );
    targets.mark_caught_up();
    let tables = sluice_kit::declared::SharedDeclared::new();
    tables.apply(
        "lake.ods.order",
        Some(Ok(
            r#"{"asset": "lake.ods.order", "format": "paimon", "path": "/lake/ods/order"}"#.into(),
        )),
    );
    tables.mark_caught_up();
    let mut kafka = rdkafka::ClientConfig::new();
    kafka.set("bootstrap.servers", "127.0.0.1:1");
    App {
        view,
        tokens: Some(Arc::new(TokenFile::open(file).expect("tokens"))),
        idp: None,
        pool: sqlx::postgres::PgPoolOptions::new()
            .acquire_timeout(Duration::from_millis(300))
            .connect_lazy("postgres://nobody@127.0.0.1:1/none")
            .expect("lazy pool"),
        producer: Arc::new(kafka.create().expect("producer")),
        codec: Arc::new(Codec::new(None)),
        dependencies_topic: "deps".into(),
        grants_topic: "grants".into(),
        targets,
        targets_topic: "targets".into(),
        tables,
        tables_topic: "tables".into(),
        notifications: {
            let n = sluice_kit::declared::SharedDeclared::new();
            n.apply("hooks", Some(Ok(GMV_RULE.into())));
            n.mark_caught_up();
            n
        },
        notifications_topic: "notifications".into(),
        triggers_topic: "triggers".into(),
        commits: Arc::new(Commits {
            config: kafka.clone(),
            topic: "events".into(),
            partitions: 1,
            codec: sluice_kit::BlockingCodec::new(None).expect("codec"),
            timeout: Duration::from_millis(300),
        }),
        max_page: 500,
        layouts: Default::default(),
    }
}

/// A notification rule of project gmv, declared in the fixture.
const GMV_RULE: &str = r#"{"name": "hooks", "project": "gmv", "on": ["run_failed"], "webhook": {"url": "http://hooks.local/"}}"#;

fn uuid() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed).to_string()
}

async fn call(
    app: &App,
    method: &str,
    path: &str,
    who: Option<&str>,
    body: Option<String>,
) -> (StatusCode, Value) {
    let mut req = Request::builder()
        .method(Method::from_bytes(method.to_uppercase().as_bytes()).expect("method"))
        .uri(path);
    if let Some(w) = who {
        req = req.header("authorization", format!("Bearer {}", token(w)));
    }
    let req = req
        .body(body.map_or_else(Body::empty, Body::from))
        .expect("request");
    let resp = router(app.clone()).oneshot(req).await.expect("answers");
    let status = resp.status();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, value)
}

/// A concrete path for a route, with the fixtures' ids.
fn concrete(path: &str) -> String {
    path.replace("{key}", "lake.ods.order")
        .replace("{id}", "gmv-dep")
        .replace("{trigger_key}", "tk1-0123456789abcdef0123456789abcdef")
        .replace("{backfill_id}", "bf-0123456789abcdef01234567")
        .replace("{kind}", "webhook")
        .replace("{name}", "hooks")
        .replace("{asset}", "lake.ods.order")
}

#[tokio::test]
async fn the_openapi_document_names_every_route_and_only_those() {
    let doc: Value = serde_json::from_str(include_str!("../openapi.json")).expect("JSON");
    let documented: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .flat_map(|(path, ops)| {
            ops.as_object()
                .expect("operations")
                .keys()
                .map(move |m| (m.clone(), path.clone()))
        })
        .collect();
    let served: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
        .collect();
    assert_eq!(documented, served);
    let app = app();
    for (method, path) in ROUTES {
        // Served: the route answers "who are you", not "no such route".
        let (status, body) = call(&app, method, &concrete(path), None, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path}: {body}");
    }
    let (status, body) = call(&app, "get", "/v1/nothing", None, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "not_found");
    let (status, _) = call(&app, "post", "/v1/dependencies/gmv-dep", None, None).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
}

/// What each route needs: `None` any valid token; else the role in project gmv
/// (the fixture's dependency belongs to gmv).
fn needs(method: &str, path: &str) -> &'static [&'static str] {
    const ANY: &[&str] = &[
        "gmv-viewer",
        "gmv-editor",
        "gmv-operator",
        "gmv-admin",
        "other-editor",
        "all-viewer",
        "root",
    ];
    const GMV_VIEWERS: &[&str] = &[
        "gmv-viewer",
        "gmv-editor",
        "gmv-operator",
        "gmv-admin",
        "all-viewer",
        "root",
    ];
    const GMV_EDITORS: &[&str] = &["gmv-editor", "gmv-operator", "gmv-admin", "root"];
    const GMV_OPERATORS: &[&str] = &["gmv-operator", "gmv-admin", "root"];
    const ADMINS: &[&str] = &["gmv-admin", "root"];
    const ROOT: &[&str] = &["root"];
    match (method, path) {
        ("get", "/v1/audit") => ADMINS,
        ("put" | "delete", p) if p.starts_with("/v1/grants") => ROOT,
        // Targets serve every project: changed by an admin of all of them.
        ("put" | "delete" | "post", p) if p.starts_with("/v1/targets") => ROOT,
        ("put" | "delete", p) if p.starts_with("/v1/tables") => ROOT,
        ("put" | "delete", _) => GMV_EDITORS,
        ("post", p) if p.starts_with("/v1/dependencies/{id}") => GMV_OPERATORS,
        (_, p) if p.starts_with("/v1/dependencies/{id}") => GMV_VIEWERS,
        // The run fixture does not exist: viewers get 404/503, never 403.
        _ => ANY,
    }
}

#[tokio::test]
async fn every_route_refuses_without_a_token_and_forbids_without_the_role() {
    let app = app();
    let body = serde_json::to_string(&spec("gmv-dep", "gmv", "lake.ods.order", None))
        .expect("json")
        .replace("\"version\":1", "\"version\":2");
    let rule = GMV_RULE.replace("run_failed\"", "run_failed\", \"job_unknown\"");
    for (method, path) in ROUTES {
        let path = if *method == "get" {
            concrete(path)
        } else {
            // Writes run as dry runs: the matrix needs no broker.
            format!("{}?dry_run=true", concrete(path))
        };
        let send = (*method == "put").then(|| {
            if path.starts_with("/v1/notifications/") {
                rule.clone()
            } else {
                body.clone()
            }
        });
        let (status, _) = call(&app, method, &path, Some("nobody"), send.clone()).await;
        assert_eq!(
            status,
            StatusCode::UNAUTHORIZED,
            "{method} {path}: unknown token"
        );
        let allowed = needs(
            method,
            ROUTES
                .iter()
                .find(|r| concrete(r.1) == concrete(path.split('?').next().unwrap_or("")))
                .map_or("", |r| r.1),
        );
        for (who, _) in PRINCIPALS {
            if path.ends_with("/v1/events") {
                continue; // a stream: checked below
            }
            let (status, body) = call(&app, method, &path, Some(who), send.clone()).await;
            if allowed.contains(&who) {
                assert!(
                    status != StatusCode::FORBIDDEN && status != StatusCode::UNAUTHORIZED,
                    "{who} may {method} {path}, got {status}: {body}"
                );
            } else {
                assert_eq!(
                    status,
                    StatusCode::FORBIDDEN,
                    "{who} may not {method} {path}: {body}"
                );
                let m = body["error"]["message"].as_str().unwrap_or_default();
                assert!(
                    m.contains(who) || m.contains("needs"),
                    "the reason names the gap: {m}"
                );
            }
        }
    }
    // Lists show only what the caller may see.
    let (_, list) = call(&app, "get", "/v1/dependencies", Some("gmv-viewer"), None).await;
    let ids: Vec<&str> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|d| d["id"].as_str())
        .collect();
    assert_eq!(ids, ["gmv-dep"]);
    let (_, list) = call(&app, "get", "/v1/dependencies", Some("all-viewer"), None).await;
    assert_eq!(list["items"].as_array().expect("items").len(), 2);
    let (status, _) = call(
        &app,
        "get",
        "/v1/dependencies/other-dep",
        Some("gmv-viewer"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn bad_input_on_every_route_is_a_precise_4xx() {
    let app = app();
    let who = Some("root");
    let cases: Vec<(&str, String, Option<String>, StatusCode, &str)> = vec![
        (
            "put",
            "/v1/targets/cron/nightly?dry_run=true".into(),
            Some("{}".into()),
            StatusCode::BAD_REQUEST,
            "\"cron\" is not a target kind",
        ),
        (
            "put",
            "/v1/targets/webhook/hooks?dry_run=true".into(),
            Some(
                r#"{"kind": "webhook", "name": "hooks", "url": "http://h", "secret": "s3cret"}"#
                    .into(),
            ),
            StatusCode::UNPROCESSABLE_ENTITY,
            "`secret`: a declared resource holds references, never secrets",
        ),
        (
            "put",
            "/v1/targets/webhook/hooks?dry_run=true".into(),
            Some(r#"{"kind": "webhook", "name": "other", "url": "http://h"}"#.into()),
            StatusCode::BAD_REQUEST,
            "the path names \"webhook/hooks\" but the document is target \"webhook/other\"",
        ),
        (
            "put",
            "/v1/targets/webhook/hooks?dry_run=true".into(),
            Some(r#"{"kind": "webhook", "name": "hooks"}"#.into()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "`url` is required for this kind",
        ),
        (
            "put",
            "/v1/tables/lake.ods.order?dry_run=true".into(),
            Some(r#"{"asset": "lake.ods.order", "format": "iceberg", "path": "/l"}"#.into()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "an Iceberg table needs its \"catalog\"",
        ),
        (
            "put",
            "/v1/tables/lake.ods.order?dry_run=true".into(),
            Some(r#"{"asset": "lake.ods.other", "format": "delta", "path": "/l"}"#.into()),
            StatusCode::BAD_REQUEST,
            "the path names \"lake.ods.order\" but the document is table \"lake.ods.other\"",
        ),
        (
            "delete",
            "/v1/tables/lake.ods.none".into(),
            None,
            StatusCode::NOT_FOUND,
            "no declared table \"lake.ods.none\"",
        ),
        (
            "post",
            "/v1/targets/webhook/nothing/pause".into(),
            None,
            StatusCode::NOT_FOUND,
            "no declared target \"webhook/nothing\"",
        ),
        (
            "get",
            "/v1/assets?colour=red".into(),
            None,
            StatusCode::BAD_REQUEST,
            "unknown query parameter \"colour\"",
        ),
        (
            "get",
            "/v1/assets?limit=100000".into(),
            None,
            StatusCode::BAD_REQUEST,
            "limit must be 1..=500",
        ),
        (
            "get",
            "/v1/assets?limit=0".into(),
            None,
            StatusCode::BAD_REQUEST,
            "limit must be 1..=500",
        ),
        (
            "get",
            "/v1/assets/not-a-key".into(),
            None,
            StatusCode::BAD_REQUEST,
            "asset key \"not-a-key\"",
        ),
        (
            "get",
            "/v1/assets/lake.ods.nothing".into(),
            None,
            StatusCode::NOT_FOUND,
            "no commit of asset lake.ods.nothing",
        ),
        (
            "get",
            "/v1/assets/lake.ods.order/commits?limit=x".into(),
            None,
            StatusCode::BAD_REQUEST,
            "limit must be",
        ),
        (
            "get",
            "/v1/dependencies?status=happy".into(),
            None,
            StatusCode::BAD_REQUEST,
            "status must be accepted or refused",
        ),
        (
            "get",
            "/v1/dependencies/nope".into(),
            None,
            StatusCode::NOT_FOUND,
            "no dependency \"nope\"",
        ),
        (
            "get",
            "/v1/dependencies/nope/explain".into(),
            None,
            StatusCode::NOT_FOUND,
            "no dependency \"nope\"",
        ),
        (
            "get",
            "/v1/dependencies/gmv-dep/explain?at_ms=soon".into(),
            None,
            StatusCode::BAD_REQUEST,
            "at_ms must be milliseconds",
        ),
        (
            "get",
            "/v1/dependencies/gmv-dep/triggers?cursor=zz".into(),
            None,
            StatusCode::BAD_REQUEST,
            "cursor \"zz\" is not one this API gave",
        ),
        (
            "get",
            "/v1/runs?status=DONE".into(),
            None,
            StatusCode::BAD_REQUEST,
            "status must be one of",
        ),
        (
            "get",
            "/v1/runs/tk2-nope".into(),
            None,
            StatusCode::BAD_REQUEST,
            "is not a trigger key",
        ),
        (
            "get",
            "/v1/audit?cursor=x".into(),
            None,
            StatusCode::BAD_REQUEST,
            "cursor \"x\"",
        ),
        (
            "put",
            "/v1/dependencies/gmv-dep".into(),
            Some("{".into()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "not valid JSON",
        ),
        (
            "put",
            "/v1/dependencies/gmv-dep".into(),
            Some(r#"{"id": "gmv-dep", "colour": 1}"#.into()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown field `colour`",
        ),
        (
            "put",
            "/v1/dependencies/gmv-dep".into(),
            Some(
                serde_json::to_string(&spec("other-id", "gmv", "lake.ods.order", None))
                    .expect("json"),
            ),
            StatusCode::BAD_REQUEST,
            "the path names \"gmv-dep\" but the spec's id is \"other-id\"",
        ),
        (
            "put",
            "/v1/dependencies/gmv-dep?dry_run=maybe".into(),
            Some("{}".into()),
            StatusCode::BAD_REQUEST,
            "dry_run must be true or false",
        ),
        (
            "put",
            "/v1/dependencies/gmv-dep".into(),
            Some(
                serde_json::to_string(&spec(
                    "gmv-dep",
                    "gmv",
                    "lake.ods.order",
                    Some("lake.ods.x"),
                ))
                .expect("json"),
            ),
            StatusCode::CONFLICT,
            "version 1 is applied with other content; send version 2",
        ),
        (
            "delete",
            "/v1/dependencies/nope".into(),
            None,
            StatusCode::NOT_FOUND,
            "no dependency \"nope\"",
        ),
    ];
    for (method, path, body, want, says) in cases {
        let (status, answer) = call(&app, method, &path, who, body).await;
        assert_eq!(status, want, "{method} {path}: {answer}");
        let m = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(
            m.contains(says),
            "{method} {path}: {m:?} should say {says:?}"
        );
    }
}

#[tokio::test]
async fn a_dry_run_shows_the_diff_and_a_cycle_is_refused_against_the_applied_set() {
    let app = app();
    let mut changed = spec("gmv-dep", "gmv", "lake.ods.order", Some("lake.dwd.trade"));
    changed.version = 2;
    changed.target.name = "hook2".into();
    let (status, answer) = call(
        &app,
        "put",
        "/v1/dependencies/gmv-dep?dry_run=true",
        Some("gmv-editor"),
        Some(serde_json::to_string(&changed).expect("json")),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let fields: BTreeMap<String, Value> = answer["diff"]
        .as_array()
        .expect("diff")
        .iter()
        .map(|d| {
            (
                d["field"].as_str().unwrap_or_default().to_owned(),
                d.clone(),
            )
        })
        .collect();
    assert_eq!(fields.keys().collect::<Vec<_>>(), ["target", "version"]);
    assert_eq!(fields["target"]["after"]["name"], "hook2");
    // lake.dwd.trade → lake.ods.order closes a cycle with gmv-dep.
    let back = spec("back", "gmv", "lake.dwd.trade", Some("lake.ods.order"));
    let (status, answer) = call(
        &app,
        "put",
        "/v1/dependencies/back?dry_run=true",
        Some("gmv-editor"),
        Some(serde_json::to_string(&back).expect("json")),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    let m = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        m.contains("lake.dwd.trade → lake.ods.order → lake.dwd.trade"),
        "{m}"
    );
    // If-Match against another version is refused.
    let (status, _) = call(
        &app,
        "get",
        "/v1/dependencies/gmv-dep",
        Some("gmv-viewer"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn explain_answers_from_the_view() {
    let app = app();
    let (status, e) = call(
        &app,
        "get",
        "/v1/dependencies/gmv-dep/explain",
        Some("gmv-viewer"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{e}");
    // Never triggered, input committed: ready, with the key it would fire as.
    assert_eq!(e["status"], "ready", "{e}");
    assert_eq!(e["accepted"], true);
    assert!(
        e["next_trigger_key"]
            .as_str()
            .is_some_and(|k| k.starts_with("tk1-"))
    );
    assert_eq!(
        e["condition"]["checks"][0]["reason"],
        "at sequence 7, never triggered"
    );
}

#[tokio::test]
async fn under_enforcement_a_cross_project_read_needs_a_grant() {
    use sluice_core::grants::Grant;
    use sluice_kit::grants::SharedGrants;
    let grants = SharedGrants::new();
    let app = app_with(View::with_grants(grants.clone(), true));
    let put = |body: String| {
        let app = app.clone();
        async move {
            call(
                &app,
                "put",
                "/v1/dependencies/new-dep?dry_run=true",
                Some("gmv-editor"),
                Some(body),
            )
            .await
        }
    };
    let body =
        serde_json::to_string(&spec("new-dep", "gmv", "crm.raw.customer", None)).expect("json");
    let (status, answer) = put(body.clone()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    assert_eq!(
        answer["error"]["message"],
        "project \"gmv\" may not read namespace crm.raw (input crm.raw.customer): no grant lets it; an admin grants it with PUT /v1/grants/{id}"
    );
    // The dependencies already applied are shown refused, with the gap.
    let (_, d) = call(
        &app,
        "get",
        "/v1/dependencies/gmv-dep",
        Some("gmv-viewer"),
        None,
    )
    .await;
    assert_eq!(d["status"], "refused", "{d}");
    assert!(
        d["refused_reason"]
            .as_str()
            .is_some_and(|r| r.contains("may not read namespace lake.ods")),
        "{d}"
    );
    for g in [
        r#"{"id": "gmv-crm", "project": "gmv", "kind": "read_namespace", "namespace": "crm.raw"}"#,
        r#"{"id": "gmv-hooks", "project": "gmv", "kind": "share_target", "target": "webhook:*"}"#,
    ] {
        let g = Grant::from_json(g).expect("valid");
        grants.apply(&g.id.clone(), Some(Ok(g)));
    }
    let (status, answer) = put(body).await;
    assert_eq!(status, StatusCode::OK, "accepted with the grants: {answer}");
    // Only a `*` admin gives grants.
    let g = r#"{"id": "x", "project": "gmv", "kind": "read_namespace", "namespace": "crm.*"}"#;
    let (status, answer) = call(
        &app,
        "put",
        "/v1/grants/x?dry_run=true",
        Some("gmv-admin"),
        Some(g.into()),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    let (status, answer) = call(
        &app,
        "put",
        "/v1/grants/x?dry_run=true",
        Some("root"),
        Some(g.into()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let (status, answer) = call(
        &app,
        "put",
        "/v1/grants/x",
        Some("root"),
        Some(r#"{"id": "x", "project": "gmv", "kind": "read_namespace"}"#.into()),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("read_namespace takes a namespace"))
    );
}

#[tokio::test]
async fn pages_follow_their_cursors_to_the_end_without_gaps_or_repeats() {
    let view = View::new();
    for i in 0..53 {
        let key = AssetKey::parse(&format!("lake.n{}.t{i:03}", i % 3)).expect("key");
        let mut state = AssetState::new(key.clone(), TableFormat::Paimon);
        state.apply(&AssetEvent::committed(
            key.clone(),
            TableFormat::Paimon,
            1,
            1,
            1,
            EventSource::Push,
        ));
        view.apply_state(key.as_str(), Some((state, 1)));
        let s = spec(
            &format!("d{i:03}"),
            if i % 2 == 0 { "gmv" } else { "other" },
            key.as_str(),
            None,
        );
        view.apply_spec(&s.id, (i, 0, i), Some(Ok(s.clone())));
    }
    let app = app_with(view);
    let walk = |path: &'static str, field: &'static str, who: &'static str| {
        let app = app.clone();
        async move {
            let mut seen: Vec<String> = Vec::new();
            let mut cursor = String::new();
            loop {
                let sep = if path.contains('?') { '&' } else { '?' };
                let (status, page) = call(
                    &app,
                    "get",
                    &format!("{path}{sep}limit=7&cursor={cursor}"),
                    Some(who),
                    None,
                )
                .await;
                assert_eq!(status, StatusCode::OK, "{page}");
                let items = page["items"].as_array().expect("items").clone();
                assert!(items.len() <= 7);
                seen.extend(
                    items
                        .iter()
                        .filter_map(|i| i[field].as_str().map(str::to_owned)),
                );
                match page["next_cursor"].as_str() {
                    Some(c) => cursor = c.to_owned(),
                    None => return seen,
                }
            }
        }
    };
    let all = walk("/v1/assets", "asset_key", "root").await;
    assert_eq!(all.len(), 54, "53 + the fixture's own asset");
    assert!(all.windows(2).all(|w| w[0] < w[1]), "ordered, no repeats");
    let n1 = walk("/v1/assets?prefix=lake.n1.", "asset_key", "root").await;
    assert_eq!(n1.len(), 18);
    assert!(n1.iter().all(|k| k.starts_with("lake.n1.")));
    let ns = walk("/v1/assets?namespace=lake.n2", "asset_key", "root").await;
    assert_eq!(ns.len(), 17);
    let deps = walk("/v1/dependencies", "id", "gmv-viewer").await;
    assert_eq!(deps.len(), 27 + 1, "gmv's 27 and the fixture's gmv-dep");
    assert!(deps.windows(2).all(|w| w[0] < w[1]));
    let other = walk("/v1/dependencies?project=other", "id", "root").await;
    assert_eq!(other.len(), 26 + 1);
}

#[tokio::test]
async fn a_jwt_from_the_identity_provider_is_a_principal_and_a_bad_one_a_precise_401() {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use ring::rand::SystemRandom;
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
    use sluice_api::jwt::{Provider, Rules, Source};
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("key");
    let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
        .expect("pair");
    let point = pair.public_key().as_ref();
    let jwks = json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": "k1",
        "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..65])}]});
    let file = std::env::temp_dir().join(format!(
        "sluice-jwks-{}-{}.json",
        std::process::id(),
        uuid()
    ));
    std::fs::write(&file, jwks.to_string()).expect("jwks file");
    let rules = Rules {
        issuer: "https://idp.example".into(),
        audience: "sluice".into(),
        name_claim: "email".into(),
        roles_claim: "sluice_roles".into(),
    };
    let mut app = app();
    app.idp = Some(Arc::new(
        Provider::open(Source::File(file), rules)
            .await
            .expect("provider"),
    ));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    let sign = |exp: i64| {
        let enc = |v: Value| URL_SAFE_NO_PAD.encode(v.to_string());
        let signed = format!(
            "{}.{}",
            enc(json!({"alg": "ES256", "kid": "k1"})),
            enc(
                json!({"iss": "https://idp.example", "aud": "sluice", "email": "ann@example.com",
                       "exp": exp, "sluice_roles": {"gmv": "viewer"}})
            )
        );
        let sig = pair
            .sign(&SystemRandom::new(), signed.as_bytes())
            .expect("signs");
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
    };
    let with = |token: String| {
        let app = app.clone();
        async move {
            let req = Request::builder()
                .uri("/v1/dependencies/gmv-dep")
                .header("authorization", format!("Bearer {token}"))
                .body(Body::empty())
                .expect("request");
            let resp = router(app).oneshot(req).await.expect("answers");
            let status = resp.status();
            let bytes = resp.into_body().collect().await.expect("body").to_bytes();
            (
                status,
                serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null),
            )
        }
    };
    let (status, body) = with(sign(now + 600)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = with(sign(now - 3_600)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["message"], "the JWT expired");
    // The viewer of gmv may not edit.
    let mut req_app = app.clone();
    req_app.tokens = None;
    let req = Request::builder()
        .method("PUT")
        .uri("/v1/dependencies/gmv-dep?dry_run=true")
        .header("authorization", format!("Bearer {}", sign(now + 600)))
        .body(Body::from(
            serde_json::to_string(&spec("gmv-dep", "gmv", "lake.ods.order", None)).expect("json"),
        ))
        .expect("request");
    let resp = router(req_app).oneshot(req).await.expect("answers");
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
}
