//! Notifications against the real pipeline (the four services and the API as
//! processes on the local broker and PostgreSQL) and an in-test receiver: a run
//! that FAILED, a dead letter on an input, a freshness breach and a finished
//! backfill each reach the rules that take them — once per event and rule, with a
//! key of their own, in JSON, Slack and Teams bodies — through a receiver that
//! fails at first; a receiver that never takes one leaves it DEAD until it is
//! redelivered; another project's rule hears nothing.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode as AxumStatus};
use axum::routing::post;
use rdkafka::producer::{FutureProducer, FutureRecord};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_integration_tests::api::{Api, push, push_notice};
use sluice_integration_tests::pipeline::Pipeline;
use sluice_integration_tests::{eventually, kafka, service_binary};
use sluice_kit::Topic;

const EDITOR: &str = "gmv-editor-token-0123456789";
const VIEWER: &str = "gmv-viewer-token-0123456789";
const ADMIN: &str = "root-token-0123456789";

/// What the receiver took: path, Idempotency-Key, body.
#[derive(Clone, Default)]
struct Receiver {
    got: Arc<Mutex<Vec<(String, String, Value)>>>,
    /// `/json` answers 503 to this many sends first.
    json_failures: Arc<AtomicUsize>,
    /// `/gone` answers 500 while this holds.
    gone: Arc<AtomicBool>,
}

impl Receiver {
    fn at(&self, path: &str) -> Vec<(String, Value)> {
        let got = self.got.lock().expect("lock");
        got.iter()
            .filter(|(p, _, _)| p == path)
            .map(|(_, k, b)| (k.clone(), b.clone()))
            .collect()
    }

    /// The distinct notifications at `path` taken with 2xx, by key.
    fn taken(&self, path: &str) -> BTreeMap<String, Value> {
        self.at(path).into_iter().collect()
    }

    fn events(&self, path: &str, event: &str) -> Vec<Value> {
        self.taken(path)
            .into_values()
            .filter(|b| b["event"] == event)
            .collect()
    }

    async fn serve(&self) -> u16 {
        let record = |path: &'static str, r: Receiver| {
            post(move |headers: HeaderMap, body: axum::body::Bytes| {
                let r = r.clone();
                async move {
                    let key = headers
                        .get("Idempotency-Key")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let refuse = match path {
                        "/json" => r
                            .json_failures
                            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                            .is_ok(),
                        "/gone" => r.gone.load(Ordering::SeqCst),
                        "/target" => return (AxumStatus::BAD_REQUEST, "no such job"),
                        _ => false,
                    };
                    if refuse {
                        return (AxumStatus::SERVICE_UNAVAILABLE, "try later");
                    }
                    r.got
                        .lock()
                        .expect("lock")
                        .push((path.to_owned(), key, body));
                    (AxumStatus::OK, "ok")
                }
            })
        };
        let mut app = axum::Router::new();
        for path in [
            "/json", "/slack", "/teams", "/gone", "/ads", "/target", "/hook",
        ] {
            app = app.route(path, record(path, self.clone()));
        }
        sluice_integration_tests::serve(app).await
    }
}

fn tokens_file() -> String {
    sluice_integration_tests::api::tokens_file(&[
        ("gmv-editor", EDITOR, json!({"gmv": "editor"})),
        ("gmv-viewer", VIEWER, json!({"gmv": "viewer"})),
        ("root", ADMIN, json!({"*": "admin"})),
    ])
}

fn sluice(api: &Api, token: &str, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(service_binary("sluice"))
        .args(args)
        .env("SLUICE_API_URL", &api.base)
        .env("SLUICE_API_TOKEN", token)
        .env(
            "SLUICE_CONFIG",
            std::env::temp_dir().join(sluice_integration_tests::unique("no-config")),
        )
        .output()
        .expect("run sluice");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn put(api: &Api, token: &str, path: &str, body: &Value) -> (StatusCode, Value) {
    api.call("PUT", path, token, Some(body)).await
}

async fn deliveries(api: &Api, query: &str) -> Vec<Value> {
    api.get(&format!("/v1/notification-deliveries{query}"))
        .await["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[tokio::test]
async fn each_event_reaches_the_rules_that_take_it_once() {
    let receiver = Receiver::default();
    receiver.json_failures.store(2, Ordering::SeqCst);
    receiver.gone.store(true, Ordering::SeqCst);
    let port = receiver.serve().await;
    let hook = |path: &str| format!("http://127.0.0.1:{port}{path}");
    let mut p = Pipeline::new(2, &[]).await;
    p.set(
        "dispatcher",
        "SLUICE_TARGETS",
        format!(
            r#"[{{"kind": "webhook", "name": "refusing", "url": "{}", "max_attempts": 1}},
                {{"kind": "webhook", "name": "*", "url": "{}", "idempotent": true}}]"#,
            hook("/target"),
            hook("/hook")
        ),
    );
    // The Slack URL holds its token: the rule names the variable, the API has it.
    p.set("api", "GMV_SLACK_URL", hook("/slack"));
    p.set("api", "SLUICE_API_NOTIFY_INTERVAL_MS", "100");
    let api = p.start_all_with_api(tokens_file(), ADMIN).await;
    let url = p.push_url();
    // `sluice watch` over the API's event stream, as a gmv viewer, all along.
    let mut watch = std::process::Command::new(service_binary("sluice"))
        .args(["watch", "-o", "json"])
        .env("SLUICE_API_URL", &api.base)
        .env("SLUICE_API_TOKEN", VIEWER)
        .env(
            "SLUICE_CONFIG",
            std::env::temp_dir().join(sluice_integration_tests::unique("no-config")),
        )
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("sluice watch");

    for (id, asset, target, predicates) in [
        ("failing", "lake.ods.f", "refusing", json!([])),
        (
            "fresh",
            "lake.ods.s",
            "fresh",
            json!([{"kind": "fresh_within", "max_age_ms": 1500}]),
        ),
    ] {
        let spec = json!({"id": id, "version": 1, "owner_project": "gmv",
                          "target": {"kind": "webhook", "name": target},
                          "condition": {"input": {"asset": asset, "predicates": predicates}}});
        let (status, v) = put(&api, ADMIN, &format!("/v1/dependencies/{id}"), &spec).await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
    }

    // Rules: who may declare what, and bad ones refused with their problems.
    let all_events = json!([
        "run_failed",
        "job_unknown",
        "dead_letter",
        "freshness_breach",
        "backfill_finished"
    ]);
    let gmv_json = json!({"name": "gmv-json", "project": "gmv", "on": all_events,
                          "webhook": {"url": hook("/json")}, "retry_after_ms": 100});
    let (status, v) = put(&api, VIEWER, "/v1/notifications/gmv-json", &gmv_json).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a viewer declares no rule: {v}"
    );
    let bad = json!({"name": "gmv-json", "project": "gmv", "on": [],
                     "webhook": {"url": "ftp://x", "token": "inline"}});
    let (status, v) = put(&api, EDITOR, "/v1/notifications/gmv-json", &bad).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let m = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        m.contains("on names no event") && m.contains("never secrets") && m.contains("ftp://x"),
        "{m}"
    );
    let (status, v) = put(&api, EDITOR, "/v1/notifications/gmv-json", &gmv_json).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let every = json!({"name": "ops-teams", "project": "*", "on": ["run_failed", "job_unknown"],
                       "webhook": {"url": hook("/teams"), "format": "teams"}});
    let (status, v) = put(&api, EDITOR, "/v1/notifications/ops-teams", &every).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "every project's rule needs `*`: {v}"
    );
    let (status, v) = put(&api, ADMIN, "/v1/notifications/ops-teams", &every).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let ads = json!({"name": "ads-json", "project": "ads", "on": all_events,
                     "webhook": {"url": hook("/ads")}});
    let (status, v) = put(&api, ADMIN, "/v1/notifications/ads-json", &ads).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    // Slack and the receiver that is gone, from files through the CLI.
    let dir = std::env::temp_dir().join(sluice_integration_tests::unique("rules"));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(
        dir.join("slack.yaml"),
        "name: gmv-slack\nproject: gmv\ndependency: failing\non: [run_failed]\n\
         webhook: {url: {env: GMV_SLACK_URL}, format: slack}\n",
    )
    .expect("file");
    std::fs::write(
        dir.join("gone.yaml"),
        format!(
            "name: gmv-gone\nproject: gmv\non: [run_failed]\nwebhook: {{url: \"{}\"}}\n\
             max_attempts: 2\nretry_after_ms: 50\n",
            hook("/gone")
        ),
    )
    .expect("file");
    let dir_arg = dir.to_string_lossy().into_owned();
    let (code, out, err) = sluice(&api, EDITOR, &["apply", "-f", &dir_arg]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("notification/gmv-slack created"), "{out}");
    assert!(out.contains("notification/gmv-gone created"), "{out}");
    let (code, out, err) = sluice(&api, VIEWER, &["get", "notifications"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("gmv-json") && out.contains("gmv-slack") && !out.contains("ads-json"),
        "a gmv viewer sees gmv's rules only: {out}"
    );

    // 1. A run FAILED: to gmv-json (after two refusals), gmv-slack, ops-teams,
    // gmv-gone (never taken); not to ads-json.
    push(&api.client, &url, "lake.ods.f", 1).await;
    assert!(
        eventually(Duration::from_secs(60), || async {
            !receiver.events("/json", "run_failed").is_empty()
                && !receiver.at("/slack").is_empty()
                && !receiver.at("/teams").is_empty()
        })
        .await,
        "the failure is notified: {:?}\n{}",
        receiver.got.lock().expect("lock"),
        p.log_tails(20)
    );
    let failed = receiver.events("/json", "run_failed");
    assert_eq!(failed.len(), 1, "{failed:?}");
    let f = &failed[0];
    let tk = f["trigger_key"].as_str().expect("trigger key").to_owned();
    assert_eq!(f["dependency"], "failing");
    assert!(
        f["key"].as_str().is_some_and(
            |k| k.starts_with(&format!("run_failed:{tk}:")) && k.ends_with("@gmv-json")
        ),
        "{f}"
    );
    assert!(
        f["summary"]
            .as_str()
            .is_some_and(|s| s.contains("FAILED on webhook/refusing")),
        "{f}"
    );
    let slack = &receiver.at("/slack")[0].1;
    assert!(
        slack["text"].as_str().is_some_and(|t| t.contains(&tk)),
        "{slack}"
    );
    assert_eq!(slack["blocks"][0]["type"], "header", "{slack}");
    let teams = &receiver.at("/teams")[0].1;
    assert_eq!(
        teams["attachments"][0]["contentType"], "application/vnd.microsoft.card.adaptive",
        "{teams}"
    );
    // gmv-gone: two attempts, then DEAD with the receiver's answer.
    assert!(
        eventually(Duration::from_secs(20), || async {
            deliveries(&api, "?status=DEAD&rule=gmv-gone").await.len() == 1
        })
        .await,
        "{:?}",
        deliveries(&api, "?rule=gmv-gone").await
    );
    let dead = &deliveries(&api, "?status=DEAD").await[0];
    assert_eq!(dead["attempts"], 2, "{dead}");
    assert!(
        dead["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("503")),
        "{dead}"
    );
    let json_sent = deliveries(&api, "?rule=gmv-json").await;
    assert_eq!(json_sent[0]["status"], "DELIVERED");
    assert_eq!(json_sent[0]["attempts"], 3, "two refusals, then taken");
    // Redelivered once the receiver is back, through the CLI (an editor of gmv).
    receiver.gone.store(false, Ordering::SeqCst);
    let key = dead["delivery_key"].as_str().expect("key").to_owned();
    let (code, _, err) = sluice(&api, VIEWER, &["redeliver", &key]);
    assert_eq!(code, 1, "a viewer redelivers nothing: {err}");
    let (code, out, err) = sluice(&api, EDITOR, &["redeliver", &key]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        eventually(Duration::from_secs(20), || async {
            receiver.at("/gone").len() == 1
        })
        .await
    );
    let (status, v) = api
        .call(
            "POST",
            &format!(
                "/v1/notification-deliveries/{}/retry",
                sluice_kit::uri::component(&key)
            ),
            EDITOR,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "only a DEAD one: {v}");

    // 2. A dead letter on an input of `failing`: a record the state-updater cannot read.
    let producer: FutureProducer = kafka()
        .producer_config("notifications-test")
        .create()
        .expect("producer");
    producer
        .send(
            FutureRecord::to(&p.names.name(Topic::AssetEvents))
                .key("lake.ods.f")
                .payload(&b"not an asset event"[..]),
            Duration::from_secs(10),
        )
        .await
        .expect("produced");

    // 3. A freshness breach: `fresh` wants lake.ods.s at most 1.5 s old.
    let notice = |seq: i64| {
        json!({"asset_key": "lake.ods.s", "format": "paimon", "snapshot_id": seq, "sequence": seq,
               "commit_time_ms": sluice_kit::clock::now_ms(), "operation": "append"})
    };
    push_notice(&api.client, &url, &notice(1)).await;

    // 4. A backfill of two partitions that runs to its end.
    let (status, v) = api
        .call(
            "POST",
            "/v1/dependencies/fresh/backfills",
            ADMIN,
            Some(&json!({"partitions": ["dt=1", "dt=2"], "reason": "notify test"})),
        )
        .await;
    assert_eq!(status.as_u16() / 100, 2, "{v}");
    let backfill = v["backfill_id"].as_str().expect("backfill id").to_owned();

    assert!(
        eventually(Duration::from_secs(60), || async {
            receiver.events("/json", "dead_letter").len() == 1
                && receiver.events("/json", "freshness_breach").len() == 1
                && receiver.events("/json", "backfill_finished").len() == 1
        })
        .await,
        "every event notified: {:?}\n{}",
        receiver.taken("/json").keys().collect::<Vec<_>>(),
        p.log_tails(20)
    );
    let dl = &receiver.events("/json", "dead_letter")[0];
    assert_eq!(dl["asset"], "lake.ods.f", "{dl}");
    assert!(
        dl["detail"]["topic"]
            .as_str()
            .is_some_and(|t| t.ends_with("asset-events")),
        "the dead letter's origin: {dl}"
    );
    let fb = &receiver.events("/json", "freshness_breach")[0];
    assert_eq!(
        (&fb["dependency"], &fb["asset"]),
        (&json!("fresh"), &json!("lake.ods.s"))
    );
    assert_eq!(fb["detail"]["max_age_ms"], 1500);
    let bf = &receiver.events("/json", "backfill_finished")[0];
    assert_eq!(bf["backfill_id"], backfill.as_str());
    assert_eq!(
        (&bf["detail"]["succeeded"], &bf["detail"]["items_total"]),
        (&json!(2), &json!(2))
    );

    // Once per stale commit: still one while it stays stale; a new commit that
    // goes stale again is a second breach.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(receiver.events("/json", "freshness_breach").len(), 1);
    push_notice(&api.client, &url, &notice(2)).await;
    assert!(
        eventually(Duration::from_secs(30), || async {
            receiver.events("/json", "freshness_breach").len() == 2
        })
        .await,
        "the next stale commit"
    );

    // Nothing reached another project's rule; each notification once per key, and
    // a send the receiver took was never sent again.
    assert!(receiver.at("/ads").is_empty(), "{:?}", receiver.at("/ads"));
    for path in ["/json", "/slack", "/teams", "/gone"] {
        let sends = receiver.at(path);
        assert_eq!(
            sends.len(),
            receiver.taken(path).len(),
            "{path}: one taken send per key: {sends:?}"
        );
    }
    // The watch saw the failure and the state changes, one JSON object a line.
    let _ = watch.kill();
    let out = watch.wait_with_output().expect("watch output");
    let events: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    assert!(
        events.iter().any(|e| e["type"] == "run"
            && e["trigger_key"] == tk.as_str()
            && e["status"]
                .as_str()
                .is_some_and(|s| s.eq_ignore_ascii_case("failed"))),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "state" && e["asset"] == "lake.ods.s" && e["sequence"] == 2),
        "{events:?}"
    );
    let audit = api.get("/v1/audit").await;
    let actions: Vec<&str> = audit["items"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x["action"].as_str()).collect())
        .unwrap_or_default();
    for a in ["notification.create", "notification.retry"] {
        assert!(actions.contains(&a), "{a} audited: {actions:?}");
    }
}
