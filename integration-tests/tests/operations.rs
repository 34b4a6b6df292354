//! Operator actions against the real pipeline (the four services and the API as
//! processes on the local broker and PostgreSQL): pause → commits → resume fires
//! once, for the newest combination, and pausing survives a resolver restart; run
//! now twice with one request id is one run; a re-run of a FAILED run is a new
//! run linked to it, and a retried re-run request is the same run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode as AxumStatus};
use axum::routing::post;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_integration_tests::api::{Api, push};
use sluice_integration_tests::pipeline::Pipeline;
use sluice_integration_tests::{eventually, free_port, service_binary, unique};

const OPERATOR: &str = "gmv-operator-token-0123456789";
const VIEWER: &str = "gmv-viewer-token-0123456789";
const ADMIN: &str = "root-token-0123456789";

fn tokens_file() -> String {
    sluice_integration_tests::api::tokens_file(&[
        ("gmv-operator", OPERATOR, json!({"gmv": "operator"})),
        ("gmv-viewer", VIEWER, json!({"gmv": "viewer"})),
        ("root", ADMIN, json!({"*": "admin"})),
    ])
}

/// The sends a webhook receiver took, by path, with their Idempotency-Key.
#[derive(Clone, Default)]
struct Receiver {
    sends: Arc<Mutex<Vec<(String, String)>>>,
    failing: Arc<AtomicBool>,
}

impl Receiver {
    fn count(&self, path: &str) -> usize {
        self.sends
            .lock()
            .expect("lock")
            .iter()
            .filter(|(p, _)| p == path)
            .count()
    }

    fn keys(&self, path: &str) -> Vec<String> {
        let sends = self.sends.lock().expect("lock");
        sends
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, k)| k.clone())
            .collect()
    }

    async fn serve(&self) -> u16 {
        let record = |path: &'static str, r: Receiver| {
            post(move |headers: HeaderMap| {
                let r = r.clone();
                async move {
                    let key = headers
                        .get("Idempotency-Key")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    r.sends.lock().expect("lock").push((path.to_owned(), key));
                    if path == "/flaky" && r.failing.load(Ordering::SeqCst) {
                        (AxumStatus::BAD_REQUEST, "refused")
                    } else {
                        (AxumStatus::OK, "ok")
                    }
                }
            })
        };
        let app = axum::Router::new()
            .route("/hook", record("/hook", self.clone()))
            .route("/flaky", record("/flaky", self.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move { axum::serve(listener, app).await });
        port
    }
}

/// Waits `quiet` and checks nothing more arrived at `path`.
async fn still(r: &Receiver, path: &str, want: usize, quiet: Duration) {
    tokio::time::sleep(quiet).await;
    assert_eq!(
        r.count(path),
        want,
        "no further send to {path}: {:?}",
        r.keys(path)
    );
}

#[tokio::test]
async fn pause_run_now_and_rerun_keep_exactly_once() {
    let receiver = Receiver::default();
    receiver.failing.store(true, Ordering::SeqCst);
    let port = receiver.serve().await;
    let api_port = free_port();
    let mut p = Pipeline::new(2, &[]).await;
    p.set(
        "dispatcher",
        "SLUICE_TARGETS",
        format!(
            r#"[{{"kind": "webhook", "name": "flaky", "url": "http://127.0.0.1:{port}/flaky", "max_attempts": 1}},
                {{"kind": "webhook", "name": "*", "url": "http://127.0.0.1:{port}/hook", "idempotent": true}}]"#
        ),
    );
    p.set("dispatcher", "SLUICE_DISPATCH_LOOK_MS", "200");
    p.set("api", "SLUICE_API_ADDR", format!("127.0.0.1:{api_port}"));
    p.set("api", "SLUICE_API_TOKENS_FILE", tokens_file());
    p.start_all().await;
    p.start("api").await;
    let api = Api::new(api_port, OPERATOR);
    let url = p.push_url();
    let spec = |id: &str, target: &str, input: &str| {
        json!({"id": id, "version": 1, "owner_project": "gmv",
               "target": {"kind": "webhook", "name": target},
               "condition": {"input": {"asset": input}}})
    };
    for (id, target, input) in [
        ("daily", "daily", "lake.ods.a"),
        ("flaky-dep", "flaky", "lake.ods.b"),
    ] {
        let (status, v) = api
            .call(
                "PUT",
                &format!("/v1/dependencies/{id}"),
                OPERATOR,
                Some(&spec(id, target, input)),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
    }

    // A data trigger, then pause.
    push(&api.client, &url, "lake.ods.a", 1).await;
    assert!(
        eventually(Duration::from_secs(60), || async {
            receiver.count("/hook") == 1
        })
        .await
    );
    let (status, v) = api
        .call(
            "POST",
            "/v1/dependencies/daily/pause",
            VIEWER,
            Some(&json!({})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a viewer may not pause: {v}");
    let paused = api
        .post(
            "/v1/dependencies/daily/pause",
            json!({"reason": "upstream backfill"}),
        )
        .await;
    assert_eq!(
        (paused["paused"].clone(), paused["changed"].clone()),
        (json!(true), json!(true))
    );
    let again = api.post("/v1/dependencies/daily/pause", json!({})).await;
    assert_eq!(again["changed"], false, "pausing twice changes nothing");

    // Paused: commits arrive and are evaluated, nothing fires — not even after the
    // resolver restarts (the pause is declared state, on the topic).
    push(&api.client, &url, "lake.ods.a", 2).await;
    p.kill_and_restart("resolver").await;
    push(&api.client, &url, "lake.ods.a", 3).await;
    let explained = {
        let mut e = Value::Null;
        for _ in 0..200 {
            e = api.get("/v1/dependencies/daily/explain").await;
            if e["summary"]
                .as_str()
                .is_some_and(|s| s.contains("withheld"))
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        e
    };
    assert_eq!(explained["paused"], true, "{explained}");
    assert!(
        explained["summary"]
            .as_str()
            .is_some_and(|s| s.starts_with("paused") && s.contains("withheld")),
        "{explained}"
    );
    still(&receiver, "/hook", 1, Duration::from_secs(3)).await;

    // Resume: exactly one trigger, for the newest combination (sequence 3).
    let resumed = api.post("/v1/dependencies/daily/resume", json!({})).await;
    assert_eq!(resumed["paused"], false);
    assert!(
        eventually(Duration::from_secs(30), || async {
            receiver.count("/hook") == 2
        })
        .await
    );
    still(&receiver, "/hook", 2, Duration::from_secs(3)).await;
    let resumed_key = receiver.keys("/hook")[1].clone();
    assert!(
        eventually(Duration::from_secs(20), || async {
            api.run_status(&resumed_key).await == "SUCCEEDED"
        })
        .await
    );
    let run = api.get(&format!("/v1/runs/{resumed_key}")).await;
    assert_eq!(
        run["inputs"][0]["sequence"], 3,
        "the newest combination: {run}"
    );
    assert_eq!(run["origin"], "data");

    // Run now, the same request twice: one run. Another request id: another run.
    let (status, v) = api
        .call(
            "POST",
            "/v1/dependencies/daily/runs",
            OPERATOR,
            Some(&json!({})),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "a request id is required: {v}"
    );
    let first = api
        .post(
            "/v1/dependencies/daily/runs",
            json!({"request_id": "r-1", "reason": "numbers look off"}),
        )
        .await;
    let retried = api
        .post("/v1/dependencies/daily/runs", json!({"request_id": "r-1"}))
        .await;
    assert_eq!(
        first["trigger_key"], retried["trigger_key"],
        "{first} {retried}"
    );
    assert_eq!(first["origin"], "manual");
    let manual_key = first["trigger_key"].as_str().expect("key").to_owned();
    assert!(
        eventually(Duration::from_secs(30), || async {
            receiver.count("/hook") == 3
        })
        .await
    );
    still(&receiver, "/hook", 3, Duration::from_secs(3)).await;
    assert_eq!(receiver.keys("/hook")[2], manual_key);
    assert!(
        eventually(Duration::from_secs(20), || async {
            api.run_status(&manual_key).await == "SUCCEEDED"
        })
        .await
    );
    let run = api.get(&format!("/v1/runs/{manual_key}")).await;
    assert_eq!(
        (
            run["origin"].as_str(),
            run["requested_by"].as_str(),
            run["request_id"].as_str()
        ),
        (Some("manual"), Some("gmv-operator"), Some("r-1")),
        "{run}"
    );
    assert!(
        run["reason"]
            .as_str()
            .is_some_and(|r| r.contains("numbers look off")),
        "{run}"
    );
    let other = api
        .post("/v1/dependencies/daily/runs", json!({"request_id": "r-2"}))
        .await;
    assert_ne!(other["trigger_key"], first["trigger_key"]);
    assert!(
        eventually(Duration::from_secs(30), || async {
            receiver.count("/hook") == 4
        })
        .await
    );

    // A FAILED run, re-run: a new run linked to it; the retried request is the same one.
    push(&api.client, &url, "lake.ods.b", 1).await;
    assert!(
        eventually(Duration::from_secs(60), || async {
            receiver.count("/flaky") == 1
        })
        .await
    );
    let failed_key = receiver.keys("/flaky")[0].clone();
    assert!(
        eventually(Duration::from_secs(30), || async {
            api.run_status(&failed_key).await == "FAILED"
        })
        .await,
        "a refusal with max_attempts 1 fails the run"
    );
    receiver.failing.store(false, Ordering::SeqCst);
    let rerun = api
        .post(
            &format!("/v1/runs/{failed_key}/rerun"),
            json!({"request_id": "rr-1", "reason": "target fixed"}),
        )
        .await;
    let rerun_again = api
        .post(
            &format!("/v1/runs/{failed_key}/rerun"),
            json!({"request_id": "rr-1"}),
        )
        .await;
    assert_eq!(rerun["trigger_key"], rerun_again["trigger_key"]);
    let rerun_key = rerun["trigger_key"].as_str().expect("key").to_owned();
    assert_ne!(rerun_key, failed_key);
    assert!(
        eventually(Duration::from_secs(30), || async {
            api.run_status(&rerun_key).await == "SUCCEEDED"
        })
        .await
    );
    still(&receiver, "/flaky", 2, Duration::from_secs(2)).await;
    let run = api.get(&format!("/v1/runs/{rerun_key}")).await;
    assert_eq!(
        (run["origin"].as_str(), run["rerun_of"].as_str()),
        (Some("rerun"), Some(failed_key.as_str())),
        "{run}"
    );
    assert_eq!(run["inputs"][0]["asset"], "lake.ods.b");
    assert_eq!(
        api.run_status(&failed_key).await,
        "FAILED",
        "the original stays as it ended"
    );

    // The same actions from the `sluice` command line, over the API.
    cli_against(&p, &api);

    // Every action is in the audit log; an unknown run is a 404.
    let (status, audit) = api.call("GET", "/v1/audit?limit=50", ADMIN, None).await;
    assert_eq!(status, StatusCode::OK, "{audit}");
    let actions: Vec<&str> = audit["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|r| r["action"].as_str())
        .collect();
    for a in [
        "dependency.pause",
        "dependency.resume",
        "dependency.run",
        "run.rerun",
    ] {
        assert!(actions.contains(&a), "{a} audited: {actions:?}");
    }
    let (status, v) = api
        .call(
            "POST",
            "/v1/runs/tk1-00000000000000000000000000000000/rerun",
            OPERATOR,
            Some(&json!({"request_id": "x"})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
}

/// Runs `sluice` with the API's address and the operator's token.
fn sluice(api: &Api, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(service_binary("sluice"))
        .args(args)
        .env("SLUICE_API_URL", &api.base)
        .env("SLUICE_API_TOKEN", OPERATOR)
        .env(
            "SLUICE_CONFIG",
            std::env::temp_dir().join(unique("no-config")),
        )
        .output()
        .expect("run sluice");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn cli_against(_p: &Pipeline, api: &Api) {
    let dir = std::env::temp_dir().join(unique("specs"));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(
        dir.join("weekly.yaml"),
        "id: weekly\nversion: 1\nowner_project: gmv\ntarget: {kind: webhook, name: weekly}\n\
         condition: {input: {asset: lake.ods.a}}\n",
    )
    .expect("spec file");
    let d = dir.to_string_lossy().into_owned();
    let (code, out, err) = sluice(api, &["apply", "-f", &d, "--dry-run"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("dependency/weekly would be created"), "{out}");
    let (code, out, err) = sluice(api, &["apply", "-f", &d]);
    assert_eq!(
        (code, out.trim()),
        (0, "dependency/weekly created — accepted"),
        "{err}"
    );
    let (code, out, _) = sluice(api, &["apply", "-f", &d]);
    assert_eq!((code, out.trim()), (0, "dependency/weekly unchanged"));

    let (code, out, err) = sluice(api, &["get", "deps"]);
    assert_eq!(code, 0, "{err}");
    let header = out.lines().next().unwrap_or_default();
    assert!(
        header.starts_with("ID") && header.contains("PAUSED"),
        "{out}"
    );
    assert!(out.lines().any(|l| l.starts_with("weekly ")), "{out}");

    let (code, out, err) = sluice(api, &["explain", "weekly"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("weekly v1 [snapshots]"), "{out}");
    assert!(out.contains("lake.ods.a"), "{out}");

    let (code, out, err) = sluice(api, &["pause", "weekly", "--reason", "cli"]);
    assert_eq!(
        (code, out.trim()),
        (0, "dependency/weekly paused (version 2)"),
        "{err}"
    );
    let (_, out, _) = sluice(api, &["get", "deps", "-o", "json"]);
    let deps: Value = serde_json::from_str(&out).expect("json");
    let weekly = deps
        .as_array()
        .and_then(|d| d.iter().find(|d| d["id"] == "weekly"))
        .cloned();
    assert_eq!(
        weekly.map(|w| w["paused"].clone()),
        Some(json!(true)),
        "{out}"
    );

    let (code, first, err) = sluice(api, &["run", "weekly", "--request-id", "c-1"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        first.starts_with("run tk1-") && first.contains("(manual)"),
        "{first}"
    );
    let (_, again, _) = sluice(api, &["run", "weekly", "--request-id", "c-1"]);
    assert_eq!(first, again, "the same request id is the same run");
    let (_, yaml, _) = sluice(api, &["describe", "dep", "weekly"]);
    assert!(yaml.contains("paused: true"), "{yaml}");

    let (code, _, err) = sluice(api, &["describe", "dep", "nope"]);
    assert_eq!(code, 1, "a refusal exits 1");
    assert!(err.contains("404"), "{err}");
    let (code, _, err) = sluice(api, &["get", "nothing"]);
    assert_eq!(code, 2, "a usage error exits 2: {err}");
    let (code, out, _) = sluice(api, &["--version"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("sluice "), "{out}");
    let (code, out, _) = sluice(api, &["completions", "bash"]);
    assert!(code == 0 && out.contains("sluice"), "completions");
}
