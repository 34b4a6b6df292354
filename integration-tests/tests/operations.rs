//! Operator actions against the real pipeline (the four services and the API as
//! processes on the local broker and PostgreSQL): pause → commits → resume fires
//! once, for the newest combination, and pausing survives a resolver restart; run
//! now twice with one request id is one run; a re-run of a FAILED run is a new
//! run linked to it, and a retried re-run request is the same run; a backfill
//! runs each item once beside the dependency's live triggers, a resubmit adds
//! none, and a cancel stops what has not started; a target declared while the
//! services run takes the jobs waiting for it, its caps change without a restart
//! and lose nothing, and a paused target holds new sends until resumed; a table
//! declared while the ingester runs is polled from the position the state holds.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode as AxumStatus};
use axum::routing::post;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_integration_tests::api::{Api, push};
use sluice_integration_tests::pipeline::Pipeline;
use sluice_integration_tests::{eventually, service_binary, unique};

const OPERATOR: &str = "gmv-operator-token-0123456789";
const VIEWER: &str = "gmv-viewer-token-0123456789";
const ADMIN: &str = "root-token-0123456789";
/// The `/late` target's signing secret: in the dispatcher's environment only, the
/// declared target names the variable.
const LATE_SECRET: &str = "shh-declared-live";

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
    /// `/late`: its sends under way now, the most at once, and whether every
    /// signature matched the body.
    late_now: Arc<AtomicUsize>,
    late_most: Arc<AtomicUsize>,
    late_bad_signatures: Arc<AtomicUsize>,
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
            post(move |headers: HeaderMap, body: axum::body::Bytes| {
                let r = r.clone();
                async move {
                    if path == "/late" {
                        let now = r.late_now.fetch_add(1, Ordering::SeqCst) + 1;
                        r.late_most.fetch_max(now, Ordering::SeqCst);
                        let want = sluice_dispatcher::adapters::signature(LATE_SECRET, &body);
                        let got = headers
                            .get(sluice_dispatcher::adapters::SIGNATURE_HEADER)
                            .and_then(|v| v.to_str().ok());
                        if got != Some(want.as_str()) {
                            r.late_bad_signatures.fetch_add(1, Ordering::SeqCst);
                        }
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        r.late_now.fetch_sub(1, Ordering::SeqCst);
                    }
                    let key = headers
                        .get("Idempotency-Key")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    if path == "/slow" {
                        // a target that takes its time, so a backfill lasts a while
                        tokio::time::sleep(Duration::from_millis(150)).await;
                    }
                    r.sends.lock().expect("lock").push((path.to_owned(), key));
                    if path == "/flaky" && r.failing.load(Ordering::SeqCst) {
                        (AxumStatus::BAD_REQUEST, "refused")
                    } else if path == "/fragile" && r.failing.load(Ordering::SeqCst) {
                        // received, then an error: whether it ran cannot be told
                        (AxumStatus::SERVICE_UNAVAILABLE, "lost")
                    } else {
                        (AxumStatus::OK, "ok")
                    }
                }
            })
        };
        let app = axum::Router::new()
            .route("/hook", record("/hook", self.clone()))
            .route("/flaky", record("/flaky", self.clone()))
            .route("/fragile", record("/fragile", self.clone()))
            .route("/slow", record("/slow", self.clone()))
            .route("/late", record("/late", self.clone()));
        sluice_integration_tests::serve(app).await
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
    let mut p = Pipeline::new(2, &[]).await;
    p.set(
        "dispatcher",
        "SLUICE_TARGETS",
        format!(
            r#"[{{"kind": "webhook", "name": "flaky", "url": "http://127.0.0.1:{port}/flaky", "max_attempts": 1}},
                {{"kind": "webhook", "name": "fragile", "url": "http://127.0.0.1:{port}/fragile"}},
                {{"kind": "webhook", "name": "*", "url": "http://127.0.0.1:{port}/hook", "idempotent": true}}]"#
        ),
    );
    p.set("dispatcher", "SLUICE_DISPATCH_LOOK_MS", "200");
    let api = p.start_all_with_api(tokens_file(), OPERATOR).await;
    let url = p.push_url();
    let spec = |id: &str, target: &str, input: &str| {
        json!({"id": id, "version": 1, "owner_project": "gmv",
               "target": {"kind": "webhook", "name": target},
               "condition": {"input": {"asset": input}}})
    };
    for (id, target, input) in [
        ("daily", "daily", "lake.ods.a"),
        ("flaky-dep", "flaky", "lake.ods.b"),
        ("fragile-dep", "fragile", "lake.ods.c"),
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
    // A send to a target that cannot be asked and does not deduplicate ends in a
    // 503: UNKNOWN, for an operator.
    push(&api.client, &url, "lake.ods.c", 1).await;
    assert!(
        eventually(Duration::from_secs(60), || async {
            receiver.count("/fragile") == 1
        })
        .await
    );
    let unknown_key = receiver.keys("/fragile")[0].clone();
    assert!(
        eventually(Duration::from_secs(30), || async {
            api.run_status(&unknown_key).await == "UNKNOWN"
        })
        .await,
        "an unanswerable send is UNKNOWN"
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

    // Settling the UNKNOWN run: an operator's call, with a reason, over the API and
    // the CLI; only an UNKNOWN run moves.
    let settle = |body: Value| {
        let (api, key) = (&api, unknown_key.clone());
        async move {
            api.call(
                "POST",
                &format!("/v1/runs/{key}/settle"),
                OPERATOR,
                Some(&body),
            )
            .await
        }
    };
    let (status, v) = settle(json!({"outcome": "maybe", "reason": "x"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v.to_string().contains("succeeded, failed, retry"), "{v}");
    let (status, v) = settle(json!({"outcome": "retry", "reason": " "})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "a reason is required: {v}");
    let (status, v) = api
        .call(
            "POST",
            &format!("/v1/runs/{unknown_key}/settle"),
            VIEWER,
            Some(&json!({"outcome": "retry", "reason": "x"})),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a viewer may not settle: {v}"
    );
    let (code, out, err) = sluice(&api, &["get", "runs", "--status", "unknown"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&unknown_key), "listed for the operator: {out}");
    let (code, out, err) = sluice(
        &api,
        &[
            "settle",
            &unknown_key,
            "retry",
            "--reason",
            "checked",
            "--dry-run",
        ],
    );
    assert_eq!(
        (code, out.trim()),
        (
            0,
            format!("run/{unknown_key} would become PENDING").as_str()
        ),
        "{err}"
    );
    assert_eq!(
        api.run_status(&unknown_key).await,
        "UNKNOWN",
        "a dry run moves nothing"
    );
    let (code, out, err) = sluice(
        &api,
        &[
            "settle",
            &unknown_key,
            "retry",
            "--reason",
            "the receiver's log shows nothing arrived",
        ],
    );
    assert_eq!(
        (code, out.trim()),
        (0, format!("run/{unknown_key} is now PENDING").as_str()),
        "{err}"
    );
    assert!(
        eventually(Duration::from_secs(30), || async {
            api.run_status(&unknown_key).await == "SUCCEEDED"
        })
        .await,
        "sent again after the operator's retry"
    );
    still(&receiver, "/fragile", 2, Duration::from_secs(2)).await;
    let (code, _, err) = sluice(
        &api,
        &["settle", &unknown_key, "failed", "--reason", "late"],
    );
    assert_eq!(code, 1, "a settled run is not settled again");
    assert!(err.contains("is SUCCEEDED, not UNKNOWN"), "{err}");

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
        "run.settle",
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
    sluice_as(api, OPERATOR, args)
}

fn sluice_as(api: &Api, token: &str, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(service_binary("sluice"))
        .args(args)
        .env("SLUICE_API_URL", &api.base)
        .env("SLUICE_API_TOKEN", token)
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

/// The backfill a CLI line names: `backfill/bf-… submitted: …`.
fn backfill_id_in(out: &str) -> String {
    out.split_whitespace()
        .find_map(|w| w.strip_prefix("backfill/"))
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn a_backfill_runs_each_item_once_beside_live_triggers() {
    let receiver = Receiver::default();
    let port = receiver.serve().await;
    let mut p = Pipeline::new(2, &[]).await;
    // Two slots: the backfill gets one, live triggers always find the other.
    p.set(
        "dispatcher",
        "SLUICE_TARGETS",
        format!(
            r#"[{{"kind": "webhook", "name": "*", "url": "http://127.0.0.1:{port}/slow",
                  "idempotent": true, "max_in_flight": 2}}]"#
        ),
    );
    let api = p.start_all_with_api(tokens_file(), OPERATOR).await;
    let url = p.push_url();
    let spec = json!({"id": "parts", "version": 1, "owner_project": "gmv",
                      "target": {"kind": "webhook", "name": "parts"},
                      "condition": {"input": {"asset": "lake.ods.p"}}});
    let (status, v) = api
        .call("PUT", "/v1/dependencies/parts", OPERATOR, Some(&spec))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    push(&api.client, &url, "lake.ods.p", 1).await;
    assert!(
        eventually(Duration::from_secs(60), || async {
            receiver.count("/slow") == 1
        })
        .await,
        "the first live trigger"
    );

    // Bad requests are precise 4xx and record nothing.
    let (status, v) = api
        .call(
            "POST",
            "/v1/dependencies/parts/backfills",
            OPERATOR,
            Some(&json!({"partitions": ["dt=1"], "windows": {"from_ms": 0, "to_ms": 1}})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v.to_string().contains("exactly one range"), "{v}");
    let (status, v) = api
        .call(
            "POST",
            "/v1/dependencies/parts/backfills",
            OPERATOR,
            Some(&json!({"windows": {"from_ms": 0, "to_ms": 1}})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let (status, v) = api
        .call(
            "POST",
            "/v1/dependencies/parts/backfills",
            VIEWER,
            Some(&json!({"partitions": ["dt=1"]})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    let (code, out, err) = sluice(
        &api,
        &[
            "backfill",
            "parts",
            "--partitions",
            "dt=1,dt=2",
            "--dry-run",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("would run 2 items"), "{out}");

    // 100 days of partitions (2026-08-01 to 2026-11-08), through the CLI.
    let args = [
        "backfill",
        "parts",
        "--from",
        "dt=2026-08-01",
        "--to",
        "dt=2026-11-08",
        "--reason",
        "restated orders",
    ];
    let (code, out, err) = sluice(&api, &args);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("submitted: 100 items"), "{out}");
    let id = backfill_id_in(&out);
    assert!(id.starts_with("bf-"), "{out}");

    // While it runs, a live commit is dispatched: it does not wait for the 100.
    assert!(
        eventually(Duration::from_secs(60), || async {
            receiver.count("/slow") >= 5
        })
        .await,
        "the backfill started"
    );
    push(&api.client, &url, "lake.ods.p", 2).await;
    let live_done_at = {
        let mut at = None;
        for _ in 0..600 {
            let runs = api.get("/v1/runs?dependency=parts&limit=1000").await;
            let live = runs["items"].as_array().into_iter().flatten().any(|r| {
                r["origin"] == "data"
                    && r["status"] == "SUCCEEDED"
                    && r["inputs"][0]["sequence"] == json!(2)
            });
            if live {
                at = Some(api.get(&format!("/v1/backfills/{id}")).await);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        at.expect("the live trigger ran")
    };
    let done_then = live_done_at["progress"]["succeeded"].as_i64().unwrap_or(0);
    assert!(
        done_then < 100 && live_done_at["state"] == "running",
        "the live trigger ran while the backfill was still running: {live_done_at}"
    );

    // Every item once, with a key of its own.
    let mut finished = Value::Null;
    for _ in 0..900 {
        finished = api.get(&format!("/v1/backfills/{id}")).await;
        if finished["state"] == "done" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(finished["state"], "done", "{finished}");
    assert_eq!(finished["progress"]["succeeded"], 100, "{finished}");
    let runs = api.get(&format!("/v1/runs?backfill={id}&limit=1000")).await;
    let items = runs["items"].as_array().cloned().unwrap_or_default();
    let keys: std::collections::BTreeSet<String> = items
        .iter()
        .filter_map(|r| r["trigger_key"].as_str().map(str::to_owned))
        .collect();
    let partitions: std::collections::BTreeSet<String> = items
        .iter()
        .filter_map(|r| r["partition"].as_str().map(str::to_owned))
        .collect();
    assert_eq!((keys.len(), partitions.len()), (100, 100));
    assert!(partitions.contains("dt=2026-08-01") && partitions.contains("dt=2026-11-08"));
    let sent = receiver.keys("/slow");
    for k in &keys {
        assert_eq!(sent.iter().filter(|s| *s == k).count(), 1, "{k} sent once");
    }
    let total = receiver.count("/slow");

    // A resubmit adds none.
    let (code, out, err) = sluice(&api, &args);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("backfill/{id} resubmitted")), "{out}");
    still(&receiver, "/slow", total, Duration::from_secs(3)).await;
    let (code, out, err) = sluice(&api, &["get", "backfills"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with(&id) && l.contains("done")),
        "{out}"
    );

    // A slow backfill (2 a minute), cancelled: what had not started never runs.
    let slow = api
        .post(
            "/v1/dependencies/parts/backfills",
            json!({"partition_range": {"from": "hh=00", "to": "hh=23"}, "per_minute": 2,
                   "request_id": "hourly-redo"}),
        )
        .await;
    let slow_id = slow["backfill_id"].as_str().unwrap_or_default().to_owned();
    assert_eq!(slow["items"], 24, "{slow}");
    assert!(
        eventually(Duration::from_secs(60), || async {
            receiver.count("/slow") == total + 2
        })
        .await,
        "two start in the first minute"
    );
    let (code, out, err) = sluice(&api, &["cancel", &slow_id, "--reason", "wrong hours"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("backfill/{slow_id} cancelled")),
        "{out}"
    );
    let mut cancelled = Value::Null;
    for _ in 0..100 {
        cancelled = api.get(&format!("/v1/backfills/{slow_id}")).await;
        if cancelled["progress"]["cancelled"] == 22 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(cancelled["state"], "cancelled", "{cancelled}");
    assert_eq!(cancelled["progress"]["cancelled"], 22, "{cancelled}");
    still(&receiver, "/slow", total + 2, Duration::from_secs(3)).await;
    // The same request id over another range is a conflict, not a new backfill.
    let (status, v) = api
        .call(
            "POST",
            "/v1/dependencies/parts/backfills",
            OPERATOR,
            Some(&json!({"partitions": ["hh=01"], "request_id": "hourly-redo"})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
}

#[tokio::test]
async fn a_target_declared_live_takes_its_waiting_jobs_changes_caps_and_pauses() {
    let receiver = Receiver::default();
    let port = receiver.serve().await;
    let mut p = Pipeline::new(2, &[]).await;
    p.set(
        "dispatcher",
        "SLUICE_TARGETS",
        format!(
            r#"[{{"kind": "webhook", "name": "boot", "url": "http://127.0.0.1:{port}/hook"}}]"#
        ),
    );
    p.set("dispatcher", "LATE_HOOK_SECRET", LATE_SECRET);
    let api = p.start_all_with_api(tokens_file(), ADMIN).await;
    let url = p.push_url();
    let assets = ["lake.ods.l1", "lake.ods.l2", "lake.ods.l3", "lake.ods.l4"];
    for (i, asset) in assets.iter().enumerate() {
        let spec = json!({"id": format!("late-{i}"), "version": 1, "owner_project": "gmv",
                          "target": {"kind": "webhook", "name": "late"},
                          "condition": {"input": {"asset": asset}}});
        let (status, v) = api
            .call(
                "PUT",
                &format!("/v1/dependencies/late-{i}"),
                ADMIN,
                Some(&spec),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
    }
    // Four triggers for a target no dispatcher knows yet: they wait.
    for asset in assets {
        push(&api.client, &url, asset, 1).await;
    }
    assert!(
        eventually(Duration::from_secs(60), || async {
            let runs = api.get("/v1/runs?target=late").await;
            runs["items"].as_array().map_or(0, Vec::len) == 4
        })
        .await,
        "four jobs recorded"
    );
    still(&receiver, "/late", 0, Duration::from_secs(1)).await;

    // A secret written into a declared target is refused; a reference is not.
    let dir = std::env::temp_dir().join(unique("targets"));
    std::fs::create_dir_all(&dir).expect("dir");
    let write = |name: &str, body: String| {
        let f = dir.join(name);
        std::fs::write(&f, body).expect("target file");
        f.to_string_lossy().into_owned()
    };
    let literal = write(
        "literal.yaml",
        format!("kind: webhook\nname: late\nurl: http://127.0.0.1:{port}/late\nsecret: shh\n"),
    );
    let (code, _, err) = sluice_as(&api, ADMIN, &["apply", "-f", &literal]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("holds references, never secrets"), "{err}");
    let late = |max_in_flight: u32| {
        format!(
            "kind: webhook\nname: late\nurl: http://127.0.0.1:{port}/late\n\
             secret: {{env: LATE_HOOK_SECRET}}\nidempotent: true\nmax_in_flight: {max_in_flight}\n"
        )
    };
    let one = write("late.yaml", late(1));
    let (code, out, err) = sluice(&api, &["apply", "-f", &one]);
    assert_eq!(
        code, 1,
        "an operator of gmv may not change a shared target: {out}"
    );
    assert!(err.contains("admin of every project"), "{err}");
    let (code, out, err) = sluice_as(&api, ADMIN, &["apply", "-f", &one]);
    assert_eq!(
        (code, out.trim()),
        (0, "target/webhook/late created"),
        "{err}"
    );

    // Taken without a restart, long before the 30 s an unroutable job waits, one at a time.
    assert!(
        eventually(Duration::from_secs(10), || async {
            receiver.count("/late") == 4
        })
        .await,
        "the waiting jobs go to the target declared live: {:?}",
        receiver.keys("/late")
    );
    assert_eq!(
        receiver.late_most.load(Ordering::SeqCst),
        1,
        "max_in_flight 1"
    );

    // Caps changed while jobs flow: in force at once, nothing lost.
    let four = write("late4.yaml", late(4));
    let (code, out, err) = sluice_as(&api, ADMIN, &["apply", "-f", &four]);
    assert_eq!(
        (code, out.trim()),
        (0, "target/webhook/late configured"),
        "{err}"
    );
    receiver.late_most.store(0, Ordering::SeqCst);
    for asset in assets {
        push(&api.client, &url, asset, 2).await;
    }
    assert!(
        eventually(Duration::from_secs(30), || async {
            receiver.count("/late") == 8
        })
        .await
    );
    assert!(
        receiver.late_most.load(Ordering::SeqCst) > 1,
        "max_in_flight 4 lets sends overlap"
    );
    let keys: std::collections::BTreeSet<String> = receiver.keys("/late").into_iter().collect();
    assert_eq!(keys.len(), 8, "each trigger once");
    assert_eq!(
        receiver.late_bad_signatures.load(Ordering::SeqCst),
        0,
        "signed with the secret the reference names"
    );

    // Paused: new sends held, then sent once on resume.
    let (code, out, err) = sluice_as(
        &api,
        ADMIN,
        &[
            "pause",
            "--target",
            "webhook/late",
            "--reason",
            "receiver upgrade",
        ],
    );
    assert_eq!(
        (code, out.trim()),
        (0, "target/webhook/late paused"),
        "{err}"
    );
    let (_, out, _) = sluice_as(&api, ADMIN, &["get", "targets", "-o", "json"]);
    let listed: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(listed[0]["paused"], json!(true), "{out}");
    push(&api.client, &url, assets[0], 3).await;
    assert!(
        eventually(Duration::from_secs(30), || async {
            let runs = api.get("/v1/runs?target=late").await;
            runs["items"].as_array().map_or(0, Vec::len) == 9
        })
        .await,
        "the trigger is recorded while the target is paused"
    );
    still(&receiver, "/late", 8, Duration::from_secs(2)).await;
    let (code, out, err) = sluice_as(&api, ADMIN, &["resume", "--target", "webhook/late"]);
    assert_eq!(
        (code, out.trim()),
        (0, "target/webhook/late resumed"),
        "{err}"
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            receiver.count("/late") == 9
        })
        .await
    );
    let audit = api.get("/v1/audit").await;
    let actions: Vec<&str> = audit["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["action"].as_str())
        .filter(|a| a.starts_with("target."))
        .collect();
    for want in [
        "target.create",
        "target.replace",
        "target.pause",
        "target.resume",
    ] {
        assert!(actions.contains(&want), "{want} audited: {actions:?}");
    }

    // Deleted: its jobs wait again (no bootstrap target of that name).
    let (code, out, err) = sluice_as(&api, ADMIN, &["delete", "target", "webhook/late"]);
    assert_eq!(
        (code, out.trim()),
        (0, "target/webhook/late deleted"),
        "{err}"
    );
    let (status, _) = api
        .call("GET", "/v1/targets/webhook/late", ADMIN, None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    push(&api.client, &url, assets[1], 3).await;
    still(&receiver, "/late", 9, Duration::from_secs(3)).await;
}

/// `sluice_ingester_poll_emitted_total{format="…"}` on the ingester's admin port.
async fn poll_emitted(p: &Pipeline, format: &str) -> f64 {
    let port = p.admin_port("ingester").expect("ingester running");
    let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    let series = format!("sluice_ingester_poll_emitted_total{{format=\"{format}\"}}");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The delta-rs writer: `commits` appends to `<warehouse>/ods/<table>`; its path.
fn delta_commits(warehouse: &std::path::Path, table: &str, commits: usize) -> String {
    let out = sluice_integration_tests::lake_script(
        "commit.py",
        &[
            "delta".to_owned(),
            warehouse.display().to_string(),
            "ods".to_owned(),
            table.to_owned(),
            commits.to_string(),
        ],
    );
    let last: Value = serde_json::from_str(out.lines().last().expect("a commit")).expect("json");
    last["path"].as_str().expect("path").to_owned()
}

#[tokio::test]
async fn a_table_declared_live_is_polled_from_the_position_the_state_holds() {
    let mut p = Pipeline::new(2, &[]).await;
    let api = p.start_all_with_api(tokens_file(), ADMIN).await;
    let warehouse = std::env::temp_dir().join(unique("warehouse"));
    let lake = warehouse.clone();
    let path = tokio::task::spawn_blocking(move || delta_commits(&lake, "orders", 2))
        .await
        .expect("writer");
    let asset = "lake.ods.orders_live";
    // The commit at version 1 reached Sluice already (a commit hook): the state
    // holds it before any poller knows the table.
    let r = api
        .client
        .post(p.push_url())
        .bearer_auth(sluice_integration_tests::pipeline::TOKEN)
        .json(
            &json!({"asset_key": asset, "format": "delta", "snapshot_id": 1, "sequence": 1,
                      "commit_time_ms": 1_764_633_600_000i64, "operation": "append"}),
        )
        .send()
        .await
        .expect("push");
    assert!(r.status().is_success(), "{}", r.status());
    let sequence = |v: &Value| v["latest"]["sequence"].as_i64();
    assert!(
        eventually(Duration::from_secs(30), || async {
            let (_, v) = api
                .call("GET", &format!("/v1/assets/{asset}"), ADMIN, None)
                .await;
            sequence(&v) == Some(1)
        })
        .await
    );

    // Declared while the ingester runs, with `start: earliest`: it resumes after
    // what the state holds, so versions 0 and 1 are not emitted again.
    let dir = std::env::temp_dir().join(unique("tables"));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("orders.yaml");
    let table = |interval_ms: u32| {
        format!(
            "asset: {asset}\nformat: delta\npath: {path}\ninterval_ms: {interval_ms}\n\
             push_timeout_ms: {interval_ms}\nstart: earliest\n"
        )
    };
    std::fs::write(&file, table(500)).expect("table file");
    let f = file.to_string_lossy().into_owned();
    let (code, out, err) = sluice_as(&api, ADMIN, &["apply", "-f", &f, "--dry-run"]);
    assert_eq!(
        (code, out.trim()),
        (0, &*format!("table/{asset} would be created")),
        "{err}"
    );
    let (code, out, err) = sluice_as(&api, ADMIN, &["apply", "-f", &f]);
    assert_eq!(
        (code, out.trim()),
        (0, &*format!("table/{asset} created")),
        "{err}"
    );
    let (_, out, _) = sluice_as(&api, ADMIN, &["get", "tables"]);
    assert!(
        out.lines()
            .any(|l| l.starts_with(asset) && l.contains("delta")),
        "{out}"
    );

    // A new commit is polled within the interval.
    let lake = warehouse.clone();
    tokio::task::spawn_blocking(move || delta_commits(&lake, "orders", 1))
        .await
        .expect("writer");
    assert!(
        eventually(Duration::from_secs(15), || async {
            let (_, v) = api
                .call("GET", &format!("/v1/assets/{asset}"), ADMIN, None)
                .await;
            sequence(&v) == Some(2)
        })
        .await,
        "the declared table is polled"
    );
    assert_eq!(
        poll_emitted(&p, "DELTA").await,
        1.0,
        "only the commit after the held position is emitted"
    );

    // Changed live, then deleted: no longer polled.
    std::fs::write(&file, table(700)).expect("table file");
    let (code, out, err) = sluice_as(&api, ADMIN, &["apply", "-f", &f]);
    assert_eq!(
        (code, out.trim()),
        (0, &*format!("table/{asset} configured")),
        "{err}"
    );
    let (code, out, err) = sluice_as(&api, ADMIN, &["delete", "table", asset]);
    assert_eq!(
        (code, out.trim()),
        (0, &*format!("table/{asset} deleted")),
        "{err}"
    );
    let lake = warehouse.clone();
    tokio::task::spawn_blocking(move || delta_commits(&lake, "orders", 1))
        .await
        .expect("writer");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, v) = api
        .call("GET", &format!("/v1/assets/{asset}"), ADMIN, None)
        .await;
    assert_eq!(sequence(&v), Some(2), "a deleted table is not polled: {v}");
    let audit = api.get("/v1/audit").await;
    let actions: Vec<&str> = audit["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["action"].as_str())
        .filter(|a| a.starts_with("table."))
        .collect();
    for want in ["table.create", "table.replace", "table.delete"] {
        assert!(actions.contains(&want), "{want} audited: {actions:?}");
    }
}

/// Pushes a commit of `asset` that carries a schema id.
async fn push_schema(api: &Api, url: &str, asset: &str, seq: i64, schema_id: i64) {
    let body = json!({"asset_key": asset, "format": "iceberg", "snapshot_id": seq, "sequence": seq,
        "commit_time_ms": 1_764_633_600_000i64 + seq, "schema_id": schema_id});
    sluice_integration_tests::api::push_notice(&api.client, url, &body).await;
}

#[tokio::test]
async fn an_acknowledged_schema_change_opens_schema_unchanged_once() {
    let receiver = Receiver::default();
    let port = receiver.serve().await;
    let mut p = Pipeline::new(2, &[]).await;
    p.set(
        "dispatcher",
        "SLUICE_TARGETS",
        format!(r#"[{{"kind": "webhook", "name": "*", "url": "http://127.0.0.1:{port}/hook", "idempotent": true}}]"#),
    );
    let api = p.start_all_with_api(tokens_file(), OPERATOR).await;
    let url = p.push_url();
    let spec = json!({"id": "guarded", "version": 1, "owner_project": "gmv",
        "target": {"kind": "webhook", "name": "guarded"},
        "condition": {"input": {"asset": "lake.ods.s", "predicates": [
            {"kind": "advanced", "include_compaction": false}, {"kind": "schema_unchanged"}]}}});
    let (status, v) = api
        .call("PUT", "/v1/dependencies/guarded", OPERATOR, Some(&spec))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let ack = |schema: Option<i64>| json!({"input": "lake.ods.s", "schema_id": schema, "reason": "adds a nullable column"});
    let path = "/v1/dependencies/guarded/acknowledge-schema";

    // The first commit fires (never triggered); a schema change shuts it.
    push_schema(&api, &url, "lake.ods.s", 1, 1).await;
    assert!(
        eventually(Duration::from_secs(60), || async {
            receiver.count("/hook") == 1
        })
        .await
    );
    let (_, v) = api.call("POST", path, OPERATOR, Some(&ack(None))).await;
    assert_eq!(v["changed"], false, "nothing is shut yet: {v}");
    push_schema(&api, &url, "lake.ods.s", 2, 2).await;
    assert!(
        eventually(Duration::from_secs(30), || async {
            api.get("/v1/dependencies/guarded/explain")
                .await
                .to_string()
                .contains("schema changed from 1 to 2")
        })
        .await,
        "explain names the change"
    );
    still(&receiver, "/hook", 1, Duration::from_secs(2)).await;

    // Refusals: a viewer; a schema the input no longer has; a body without a reason;
    // an input without schema_unchanged. A dry run publishes nothing.
    let (status, v) = api.call("POST", path, VIEWER, Some(&ack(Some(2)))).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    let (code, _, err) = sluice(
        &api,
        &[
            "ack-schema",
            "guarded",
            "--input",
            "lake.ods.s",
            "--schema-id",
            "1",
            "--reason",
            "x",
        ],
    );
    assert_eq!(code, 1, "a schema the input moved on from: {err}");
    assert!(err.contains("has schema 2 now, not 1"), "{err}");
    let (status, v) = api
        .call(
            "POST",
            path,
            OPERATOR,
            Some(&json!({"input": "lake.ods.s", "reason": " "})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    let (status, v) = api
        .call(
            "POST",
            path,
            OPERATOR,
            Some(&json!({"input": "lake.ods.t", "reason": "r"})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    let (code, out, err) = sluice(
        &api,
        &[
            "ack-schema",
            "guarded",
            "--input",
            "lake.ods.s",
            "--reason",
            "r",
            "--dry-run",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("would accept schema 2"), "{out}");
    still(&receiver, "/hook", 1, Duration::from_secs(2)).await;

    // Acknowledged: the newest commit fires, once.
    let (code, out, err) = sluice(
        &api,
        &[
            "ack-schema",
            "guarded",
            "--input",
            "lake.ods.s",
            "--schema-id",
            "2",
            "--reason",
            "adds a nullable column",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("accepts schema 2 of lake.ods.s"), "{out}");
    assert!(
        eventually(Duration::from_secs(30), || async {
            receiver.count("/hook") == 2
        })
        .await
    );
    let key = receiver.keys("/hook")[1].clone();
    assert!(
        eventually(Duration::from_secs(20), || async {
            api.run_status(&key).await == "SUCCEEDED"
        })
        .await
    );
    let run = api.get(&format!("/v1/runs/{key}")).await;
    assert_eq!(run["inputs"][0]["sequence"], 2, "the newest commit: {run}");
    let (_, v) = api.call("POST", path, OPERATOR, Some(&ack(Some(2)))).await;
    assert_eq!(v["changed"], false, "taken: nothing is shut: {v}");

    // Taken once: a restart re-applies nothing, the same schema flows, the next
    // change shuts it again.
    p.kill_and_restart("resolver").await;
    push_schema(&api, &url, "lake.ods.s", 3, 2).await;
    assert!(
        eventually(Duration::from_secs(60), || async {
            receiver.count("/hook") == 3
        })
        .await
    );
    push_schema(&api, &url, "lake.ods.s", 4, 3).await;
    still(&receiver, "/hook", 3, Duration::from_secs(4)).await;

    let (_, audit) = api.call("GET", "/v1/audit?limit=50", ADMIN, None).await;
    let audit = audit.to_string();
    assert!(audit.contains("dependency.acknowledge_schema"), "{audit}");
    assert!(audit.contains("adds a nullable column"), "{audit}");
}
