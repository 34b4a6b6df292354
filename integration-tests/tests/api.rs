//! `sluice-api` against the real pipeline: the four services and the API as
//! processes on the local broker and PostgreSQL. A dependency is created through
//! the API, commits are pushed to the ingester, and the API must tell — from the
//! same evaluator the resolver uses — why it ran and why it then waits; the run
//! with its transitions, the commits from the evidence log, the audit row, the
//! event stream, and a spec written straight to the topic that the API shows as
//! refused.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::post;
use rdkafka::producer::{FutureProducer, FutureRecord};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_core::DependencySpec;
use sluice_integration_tests::api::push;
use sluice_integration_tests::pipeline::Pipeline;
use sluice_integration_tests::{eventually, kafka};
use sluice_kit::wire::WireSpec;
use sluice_kit::{Codec, SchemaName, Topic};

const EDITOR: &str = "gmv-editor-token-0123456789";
const ADMIN: &str = "root-token-0123456789";

fn tokens_file() -> String {
    sluice_integration_tests::api::tokens_file(&[
        ("gmv-editor", EDITOR, json!({"gmv": "editor"})),
        ("root", ADMIN, json!({"*": "admin"})),
    ])
}

#[tokio::test]
async fn the_api_explains_runs_and_refusals_from_the_live_pipeline() {
    // A webhook that records every send.
    let sends: Arc<Mutex<Vec<String>>> = Arc::default();
    let recorded = sends.clone();
    let hook = axum::Router::new().route(
        "/hook",
        post(move |headers: axum::http::HeaderMap| {
            let recorded = recorded.clone();
            async move {
                let key = headers
                    .get("Idempotency-Key")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default();
                recorded.lock().expect("lock").push(key.to_owned());
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let hook_port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move { axum::serve(listener, hook).await });

    let mut p = Pipeline::new(2, &[]).await;
    p.set(
        "dispatcher",
        "SLUICE_TARGETS",
        format!(r#"[{{"kind": "webhook", "name": "*", "url": "http://127.0.0.1:{hook_port}/hook", "idempotent": true}}]"#),
    );
    p.set("dispatcher", "SLUICE_DISPATCH_LOOK_MS", "200");
    let api = p.start_all_with_api(tokens_file(), ADMIN).await;

    // Create through the API: 201, read back at once, accepted, audited.
    let spec = json!({
        "id": "dwd-trade", "version": 1, "owner_project": "gmv",
        "target": {"kind": "webhook", "name": "dwd_trade"},
        "condition": {"all": [{"input": {"asset": "lake.ods.order"}}, {"input": {"asset": "lake.ods.payment"}}]},
        "produces": "lake.dwd.trade"
    });
    let (status, created) = api
        .call("PUT", "/v1/dependencies/dwd-trade", EDITOR, Some(&spec))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["status"], "accepted");
    assert_eq!(created["etag"], "\"v1\"");
    let (status, again) = api
        .call("PUT", "/v1/dependencies/dwd-trade", EDITOR, Some(&spec))
        .await;
    assert_eq!(
        (status, again["changed"].clone()),
        (StatusCode::OK, json!(false)),
        "{again}"
    );

    // Before any commit: waiting, and it says for what.
    let e = api.get("/v1/dependencies/dwd-trade/explain").await;
    assert_eq!(e["status"], "waiting", "{e}");
    assert!(
        e["summary"]
            .as_str()
            .is_some_and(|s| s.contains("lake.ods.order: seen — no commit seen yet")),
        "{e}"
    );

    // Round 1: both inputs commit → one trigger, delivered.
    let url = p.push_url();
    push(&api.client, &url, "lake.ods.order", 1).await;
    push(&api.client, &url, "lake.ods.payment", 1).await;
    assert!(
        eventually(Duration::from_secs(60), || async {
            sends.lock().expect("lock").len() == 1
        })
        .await,
        "round 1 delivered once"
    );
    let key = sends.lock().expect("lock")[0].clone();

    // Round 2: only the order commits → it waits for the payment, and explain says
    // exactly that, with the key of the trigger that ran.
    push(&api.client, &url, "lake.ods.order", 2).await;
    let want = json!(["lake.ods.payment: advanced — at sequence 1, needs a data commit after 1"]);
    let mut explained = Value::Null;
    for _ in 0..300 {
        explained = api.get("/v1/dependencies/dwd-trade/explain").await;
        if explained["unmet"] == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        explained["unmet"], want,
        "explain names the payment: {explained}"
    );
    assert_eq!(explained["status"], "waiting");
    assert_eq!(explained["last_trigger_key"], key.as_str());
    let order = &explained["condition"]["children"][0];
    assert_eq!(order["satisfied"], true, "{order}");
    assert_eq!(order["checks"][0]["reason"], "at sequence 2, after 1");
    assert_eq!(order["baseline"]["data_sequence"], 1);

    // The run, its history and its transitions.
    assert!(
        eventually(Duration::from_secs(30), || async {
            let run = api.get(&format!("/v1/runs/{key}")).await;
            run["status"] == "SUCCEEDED"
        })
        .await
    );
    let run = api.get(&format!("/v1/runs/{key}")).await;
    let statuses: Vec<&str> = run["transitions"]
        .as_array()
        .expect("transitions")
        .iter()
        .filter_map(|t| t["status"].as_str())
        .collect();
    assert_eq!(statuses, ["PENDING", "RUNNING", "SUCCEEDED"], "{run}");
    assert_eq!(run["dependency_id"], "dwd-trade");
    let history = api.get("/v1/dependencies/dwd-trade/triggers").await;
    assert_eq!(
        history["items"].as_array().map(Vec::len),
        Some(1),
        "{history}"
    );
    assert_eq!(history["items"][0]["trigger_key"], key.as_str());
    let runs = api.get("/v1/runs?status=succeeded").await;
    assert!(
        runs["items"]
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r["trigger_key"] == key.as_str())),
        "{runs}"
    );

    // Assets: the state, the commits from the evidence log (newest first), who reads it.
    let order = api.get("/v1/assets/lake.ods.order").await;
    assert_eq!(order["latest"]["sequence"], 2, "{order}");
    let commits = api.get("/v1/assets/lake.ods.order/commits?limit=10").await;
    let seqs: Vec<i64> = commits["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|c| c["sequence"].as_i64())
        .collect();
    assert_eq!(seqs, [2, 1], "{commits}");
    assert_eq!(commits["complete"], true);
    let deps = api.get("/v1/assets/lake.ods.order/dependencies").await;
    assert_eq!(deps["read_by"], json!(["dwd-trade"]));
    let graph = api.get("/v1/lineage").await;
    assert!(
        graph["edges"].as_array().is_some_and(|e| e
            .contains(&json!({"from": "dwd-trade", "to": "lake.dwd.trade", "kind": "produces"}))),
        "{graph}"
    );

    // The event stream carries the next commit.
    let stream = api
        .client
        .get(format!("{}/v1/events", api.base))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("stream");
    assert_eq!(stream.status(), StatusCode::OK);
    let mut body = stream;
    push(&api.client, &url, "lake.ods.payment", 2).await;
    let mut seen = String::new();
    let got = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(chunk)) = body.chunk().await {
            seen.push_str(&String::from_utf8_lossy(&chunk));
            if seen.contains("event: state") && seen.contains("lake.ods.payment") {
                return true;
            }
        }
        false
    })
    .await;
    assert!(
        got.unwrap_or(false),
        "a state event for the payment: {seen}"
    );

    // A spec written straight to the topic that closes a cycle: the API shows it
    // refused, with the reason, as the resolver refuses it.
    let back = DependencySpec::from_json(
        r#"{"id": "back", "version": 1, "owner_project": "gmv", "target": {"kind": "webhook", "name": "back"},
            "condition": {"input": {"asset": "lake.dwd.trade"}}, "produces": "lake.ods.order"}"#,
    )
    .expect("valid alone");
    let producer: FutureProducer = kafka()
        .producer_config("api-test")
        .create()
        .expect("producer");
    let topic = p.names.name(Topic::Dependencies);
    let bytes = Codec::new(None)
        .encode(SchemaName::DependencySpec, &topic, &WireSpec::from(&back))
        .await
        .expect("encodes");
    producer
        .send(
            FutureRecord::to(&topic).key("back").payload(&bytes),
            Duration::from_secs(10),
        )
        .await
        .expect("sent");
    assert!(
        eventually(Duration::from_secs(20), || async {
            let (s, d) = api.call("GET", "/v1/dependencies/back", ADMIN, None).await;
            s == StatusCode::OK && d["status"] == "refused"
        })
        .await
    );
    let refused = api.get("/v1/dependencies?status=refused").await;
    let reason = refused["items"][0]["refused_reason"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        reason.contains("cycle through produced assets"),
        "{refused}"
    );
    let e = api.get("/v1/dependencies/back/explain").await;
    assert_eq!(e["accepted"], false, "{e}");

    // The editor may not touch another project's dependency; the audit log has the create.
    let mut other = spec.clone();
    other["id"] = json!("other");
    other["owner_project"] = json!("finance");
    let (status, answer) = api
        .call("PUT", "/v1/dependencies/other", EDITOR, Some(&other))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    let audit = api.get("/v1/audit").await;
    let row = &audit["items"][0];
    assert_eq!(
        (row["principal"].as_str(), row["action"].as_str()),
        (Some("gmv-editor"), Some("dependency.create")),
        "{audit}"
    );
    assert_eq!(row["after"]["id"], "dwd-trade");

    // Delete: a tombstone; gone from the API at once.
    let (status, _) = api
        .call("DELETE", "/v1/dependencies/back", ADMIN, None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = api.call("GET", "/v1/dependencies/back", ADMIN, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// Grants enforced (`SLUICE_GRANTS=enforce` on the resolver and the API): a spec
/// written straight to the dependencies topic, past the API, whose project has no
/// grant to read its input never fires — the resolver withholds it and the API
/// shows it refused with the gap — and fires once an admin grants it.
#[tokio::test]
async fn the_resolver_enforces_grants_on_a_spec_written_straight_to_the_topic() {
    let sends: Arc<Mutex<Vec<String>>> = Arc::default();
    let recorded = sends.clone();
    let hook = axum::Router::new().route(
        "/hook",
        post(move |headers: axum::http::HeaderMap| {
            let recorded = recorded.clone();
            async move {
                let key = headers
                    .get("Idempotency-Key")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default();
                recorded.lock().expect("lock").push(key.to_owned());
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let hook_port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move { axum::serve(listener, hook).await });
    let mut p = Pipeline::new(2, &[]).await;
    p.set(
        "dispatcher",
        "SLUICE_TARGETS",
        format!(
            r#"[{{"kind": "webhook", "name": "*", "url": "http://127.0.0.1:{hook_port}/hook", "idempotent": true}}]"#
        ),
    );
    p.set("dispatcher", "SLUICE_DISPATCH_LOOK_MS", "200");
    p.set("resolver", "SLUICE_GRANTS", "enforce");
    p.set("api", "SLUICE_GRANTS", "enforce");
    let api = p.start_all_with_api(tokens_file(), ADMIN).await;
    // The target is shared with gmv; reading crm.raw is not granted.
    let share =
        json!({"id": "gmv-hooks", "project": "gmv", "kind": "share_target", "target": "webhook:*"});
    let (status, answer) = api
        .call("PUT", "/v1/grants/gmv-hooks", ADMIN, Some(&share))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let spec = DependencySpec::from_json(
        r#"{"id": "crm-sync", "version": 1, "owner_project": "gmv", "target": {"kind": "webhook", "name": "crm"},
            "condition": {"input": {"asset": "crm.raw.customer"}}}"#,
    )
    .expect("valid");
    let producer: FutureProducer = kafka()
        .producer_config("api-grants-test")
        .create()
        .expect("producer");
    let topic = p.names.name(Topic::Dependencies);
    let bytes = Codec::new(None)
        .encode(SchemaName::DependencySpec, &topic, &WireSpec::from(&spec))
        .await
        .expect("encodes");
    producer
        .send(
            FutureRecord::to(&topic).key("crm-sync").payload(&bytes),
            Duration::from_secs(10),
        )
        .await
        .expect("sent");
    let url = p.push_url();
    push(&api.client, &url, "crm.raw.customer", 1).await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            let (s, d) = api
                .call("GET", "/v1/dependencies/crm-sync", ADMIN, None)
                .await;
            s == StatusCode::OK && d["status"] == "refused"
        })
        .await
    );
    let (_, d) = api
        .call("GET", "/v1/dependencies/crm-sync", ADMIN, None)
        .await;
    assert_eq!(
        d["refused_reason"],
        "project \"gmv\" may not read namespace crm.raw (input crm.raw.customer): no grant lets it"
    );
    // The resolver withholds it: nothing fires while the grant is missing.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        sends.lock().expect("lock").is_empty(),
        "withheld without a grant"
    );
    // Granted: it fires once, for the commit it had been waiting on.
    let read = json!({"id": "gmv-crm", "project": "gmv", "kind": "read_namespace", "namespace": "crm.raw"});
    let (status, answer) = api
        .call("PUT", "/v1/grants/gmv-crm", ADMIN, Some(&read))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    assert!(
        eventually(Duration::from_secs(30), || async {
            sends.lock().expect("lock").len() == 1
        })
        .await,
        "fires once the grant is given"
    );
    let (_, d) = api
        .call("GET", "/v1/dependencies/crm-sync", ADMIN, None)
        .await;
    assert_eq!(d["status"], "accepted", "{d}");
    let grants = api.get("/v1/grants").await;
    assert_eq!(grants["enforced"], true);
    assert_eq!(grants["items"].as_array().map(Vec::len), Some(2));
}
