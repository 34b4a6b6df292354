//! The dispatcher as processes against the real broker and PostgreSQL, with
//! in-process receivers: a webhook endpoint (checks the HMAC signature, counts
//! every send, answers as told) and a DolphinScheduler stand-in (its documented
//! start-process-instance and process-instance paths; DolphinScheduler is a Java
//! service that cannot run here) — and a real Airflow 3 (`airflow standalone`
//! from the venv `compose/ensure-venv.sh` installs), in this file so that its
//! slow start overlaps the other tests; an https webhook (Python's TLS server,
//! a certificate from a CA made here with the openssl CLI).

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use sluice_core::JobStatus;
use sluice_dispatcher::adapters::{
    IDEMPOTENCY_HEADER, INVOCATION_HEADER, SIGNATURE_HEADER, signature,
};
use sluice_integration_tests::{
    bootstrap, dispatcher_database, free_port, fresh_topics, http_get, kafka,
    least_privilege_api_role, read_topic, service_binary, unique, venv_bin,
};
use sluice_kit::topics::{Topic, TopicNames};
use sluice_kit::wire::RunRecord;
use sluice_kit::wire::{TriggerInput, TriggerRecord, TriggerTarget, WireTargetKind};
use sluice_kit::{Codec, SchemaName};
use sqlx::PgPool;

const PARTITIONS: i32 = 4;
const SECRET: &str = "it-secret";

#[derive(Clone, Debug)]
struct Call {
    target: String,
    key: String,
    invocation: String,
    signed: bool,
}

#[derive(Default)]
struct Receiver {
    calls: Vec<Call>,
    /// Statuses to answer per trigger key, in order; then 200.
    script: BTreeMap<String, Vec<u16>>,
    in_flight: BTreeMap<String, usize>,
    max_in_flight: BTreeMap<String, usize>,
    delay: BTreeMap<String, Duration>,
    /// DolphinScheduler stand-in: instance id → (startParams, polls so far).
    ds_instances: BTreeMap<i64, (serde_json::Value, u32)>,
}

type Shared = Arc<Mutex<Receiver>>;

async fn hook(
    State(r): State<Shared>,
    Path(target): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> StatusCode {
    let h = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let call = Call {
        target: target.clone(),
        key: h(IDEMPOTENCY_HEADER),
        invocation: h(INVOCATION_HEADER),
        signed: h(SIGNATURE_HEADER) == signature(SECRET, &body),
    };
    let (delay, status) = {
        let mut g = r.lock().expect("lock");
        let n = g.in_flight.entry(target.clone()).or_default();
        *n += 1;
        let now = *n;
        let max = g.max_in_flight.entry(target.clone()).or_default();
        *max = (*max).max(now);
        let status = g
            .script
            .get_mut(&call.key)
            .and_then(|s| (!s.is_empty()).then(|| s.remove(0)))
            .unwrap_or(200);
        g.calls.push(call);
        (g.delay.get(&target).copied().unwrap_or_default(), status)
    };
    tokio::time::sleep(delay).await;
    *r.lock().expect("lock").in_flight.entry(target).or_default() -= 1;
    StatusCode::from_u16(status).expect("status")
}

/// DolphinScheduler 3.x `POST /dolphinscheduler/projects/{projectCode}/executors/start-process-instance`
/// (form body, `token` header; answers `{"code": 0, "msg": "success", "data": …}`,
/// a business error as HTTP 200 with a non-zero code, e.g. 50014 for a missing definition).
async fn ds_start(
    State(r): State<Shared>,
    Path(project): Path<String>,
    headers: HeaderMap,
    axum::Form(form): axum::Form<BTreeMap<String, String>>,
) -> (StatusCode, axum::Json<serde_json::Value>) {
    use serde_json::json;
    if headers.get("token").and_then(|v| v.to_str().ok()) != Some("ds-token") {
        return (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"code": 10004, "msg": "user login failed", "data": null})),
        );
    }
    if project != "4242" || form.get("processDefinitionCode").map(String::as_str) != Some("777") {
        return (
            StatusCode::OK,
            axum::Json(
                json!({"code": 50014, "msg": "process definition not exists", "data": null}),
            ),
        );
    }
    let params: serde_json::Value = form
        .get("startParams")
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_default();
    let mut g = r.lock().expect("lock");
    let id = 1000 + g.ds_instances.len() as i64;
    g.calls.push(Call {
        target: "ds".into(),
        key: params["sluice_trigger_key"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        invocation: String::new(),
        signed: true,
    });
    g.ds_instances.insert(id, (params, 0));
    (
        StatusCode::OK,
        axum::Json(json!({"code": 0, "msg": "success", "data": id})),
    )
}

/// `GET /dolphinscheduler/projects/{projectCode}/process-instances/{id}`: RUNNING_EXECUTION
/// for two polls, then SUCCESS.
async fn ds_instance(
    State(r): State<Shared>,
    Path((_project, id)): Path<(String, i64)>,
) -> (StatusCode, axum::Json<serde_json::Value>) {
    use serde_json::json;
    let mut g = r.lock().expect("lock");
    let Some((_, polls)) = g.ds_instances.get_mut(&id) else {
        return (
            StatusCode::OK,
            axum::Json(json!({"code": 10118, "msg": "process instance not exists"})),
        );
    };
    *polls += 1;
    let state = if *polls > 2 {
        "SUCCESS"
    } else {
        "RUNNING_EXECUTION"
    };
    (
        StatusCode::OK,
        axum::Json(json!({"code": 0, "msg": "success", "data": {"id": id, "state": state}})),
    )
}

async fn serve(r: Shared) -> u16 {
    let app = axum::Router::new()
        .route("/hook/{target}", post(hook))
        .route(
            "/dolphinscheduler/projects/{project}/executors/start-process-instance",
            post(ds_start),
        )
        .route(
            "/dolphinscheduler/projects/{project}/process-instances/{id}",
            get(ds_instance),
        )
        .with_state(r);
    sluice_integration_tests::serve(app).await
}

/// The API token of the re-run in the Airflow test (an admin of every project:
/// its triggers name no declared dependency).
const API_ADMIN: &str = "dispatcher-test-admin-0123456789";

struct Run {
    names: TopicNames,
    db: String,
    pool: PgPool,
    receiver: Shared,
    port: u16,
}

impl Run {
    async fn new() -> Self {
        let names = fresh_topics("ds", PARTITIONS, &sluice_dispatcher::ACCESS.topics()).await;
        let (db, pool) = dispatcher_database().await;
        let receiver = Shared::default();
        let port = serve(receiver.clone()).await;
        Run {
            names,
            db,
            pool,
            receiver,
            port,
        }
    }

    fn hook_target(&self, name: &str, extra: &str) -> String {
        format!(
            r#"{{"kind": "webhook", "name": "{name}", "url": "http://127.0.0.1:{}/hook/{name}", "secret": "{SECRET}"{extra}}}"#,
            self.port
        )
    }

    fn spawn(&self, instance: &str, targets: &str, extra_env: &[(&str, &str)]) -> Child {
        let mut cmd = Command::new(service_binary("sluice-dispatcher"));
        cmd.env("SLUICE_KAFKA_BOOTSTRAP", bootstrap())
            .env("SLUICE_DATABASE_URL", &self.db)
            .env("SLUICE_TOPIC_PREFIX", &self.names.prefix)
            .env("SLUICE_TOPIC_PARTITIONS", PARTITIONS.to_string())
            .env("SLUICE_INSTANCE", instance)
            .env("SLUICE_ADMIN_ADDR", format!("127.0.0.1:{}", free_port()))
            .env("SLUICE_TARGETS", targets)
            .env("SLUICE_DISPATCH_LOOK_MS", "200")
            .env(
                "SLUICE_LOG",
                std::env::var("SLUICE_TEST_SERVICE_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        cmd.spawn().expect("spawn dispatcher")
    }

    /// `sluice-api` over this run's topics and database (as its least-privileged
    /// role), with one admin token; its URL once it is ready.
    async fn start_api(&self) -> (String, Child) {
        let port = free_port();
        let admin = free_port();
        let tokens = sluice_integration_tests::api::tokens_file(&[(
            "root",
            API_ADMIN,
            serde_json::json!({"*": "admin"}),
        )]);
        let child = Command::new(service_binary("sluice-api"))
            .env("SLUICE_KAFKA_BOOTSTRAP", bootstrap())
            .env(
                "SLUICE_DATABASE_URL",
                least_privilege_api_role(&self.db).await,
            )
            .env("SLUICE_TOPIC_PREFIX", &self.names.prefix)
            .env("SLUICE_TOPIC_PARTITIONS", PARTITIONS.to_string())
            .env("SLUICE_ADMIN_ADDR", format!("127.0.0.1:{admin}"))
            .env("SLUICE_API_ADDR", format!("127.0.0.1:{port}"))
            .env("SLUICE_API_TOKENS_FILE", tokens)
            .env("SLUICE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn sluice-api");
        let ready = sluice_integration_tests::eventually(Duration::from_secs(60), || async {
            http_get(admin, "/health/ready")
                .await
                .is_some_and(|(status, _)| status == 200)
        })
        .await;
        assert!(ready, "sluice-api ready");
        (format!("http://127.0.0.1:{port}"), child)
    }

    /// Produces each trigger `copies` times, spread over the partitions.
    async fn publish(&self, triggers: &[TriggerRecord], copies: usize) {
        let codec = Codec::new(None);
        let topic = self.names.name(Topic::Triggers);
        let p: BaseProducer = kafka()
            .producer_config("ds-test")
            .create()
            .expect("producer");
        for (i, t) in triggers.iter().enumerate() {
            let bytes = codec
                .encode(SchemaName::TriggerRequest, &topic, t)
                .await
                .expect("encode");
            for c in 0..copies {
                let mut rec = BaseRecord::to(&topic)
                    .partition(((i + c) % PARTITIONS as usize) as i32)
                    .key(&t.trigger_key)
                    .payload(&bytes);
                loop {
                    match p.send(rec) {
                        Ok(()) => break,
                        Err((_, r)) => {
                            p.poll(Duration::from_millis(5));
                            rec = r;
                        }
                    }
                }
            }
        }
        p.flush(Duration::from_secs(60)).expect("flush");
    }

    async fn statuses(&self) -> BTreeMap<String, (String, i32)> {
        let rows: Vec<(String, String, i32)> =
            sqlx::query_as("SELECT trigger_key, status, attempt FROM jobs")
                .fetch_all(&self.pool)
                .await
                .expect("jobs");
        rows.into_iter().map(|(k, s, a)| (k, (s, a))).collect()
    }

    /// Waits until every key in `keys` has a job in a final or wanted state.
    async fn wait_status(&self, keys: &BTreeSet<String>, want: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.statuses().await;
            let done = keys
                .iter()
                .filter(|k| s.get(*k).is_some_and(|(st, _)| st == want))
                .count();
            if done == keys.len() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{done} of {} jobs {want}; others: {:?}",
                keys.len(),
                keys.iter()
                    .filter_map(|k| s.get(k).filter(|(st, _)| st != want).map(|v| (k, v)))
                    .take(5)
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn calls(&self) -> Vec<Call> {
        self.receiver.lock().expect("lock").calls.clone()
    }

    /// The last RunStatus per key on the runs topic.
    async fn runs(&self) -> BTreeMap<String, Vec<RunRecord>> {
        let codec = Codec::new(None);
        let mut out = BTreeMap::new();
        for (k, values) in read_topic(&self.names.name(Topic::Runs), PARTITIONS) {
            let mut recs = Vec::new();
            for v in values {
                recs.push(
                    codec
                        .decode::<RunRecord>(SchemaName::RunStatus, &v)
                        .await
                        .expect("run status decodes"),
                );
            }
            out.insert(k, recs);
        }
        out
    }
}

fn trigger(n: usize, kind: WireTargetKind, target: &str) -> TriggerRecord {
    // FNV-1a of the target name, so keys of different targets never collide.
    let h = target.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let key = format!("tk1-{h:016x}{n:016x}");
    TriggerRecord {
        trigger_key: key,
        dependency_id: format!("dep-{n}"),
        dependency_version: 1,
        target: TriggerTarget {
            kind,
            name: target.into(),
            parameters: BTreeMap::new(),
        },
        inputs: vec![TriggerInput {
            asset_key: "lake.ods.orders".into(),
            snapshot_id: 1000 + n as i64,
            sequence: n as i64,
            watermark_ms: None,
        }],
        partition: None,
        window_end_ms: None,
        reason: "advanced".into(),
        first_commit_ms: 1_700_000_000_000,
        requested_ms: 1_700_000_000_100,
        origin: sluice_kit::wire::TriggerOrigin::Data,
        requested_by: None,
        request_id: None,
        rerun_of: None,
    }
}

/// Trigger `n` for webhook `target` as the intake hands it to the store; with
/// `backfill`, an item of that backfill.
fn new_trigger(
    n: usize,
    target: &str,
    backfill: Option<&str>,
) -> sluice_dispatcher::store::NewTrigger {
    let t = trigger(n, WireTargetKind::Webhook, target);
    sluice_dispatcher::store::NewTrigger {
        trigger_key: t.trigger_key,
        dependency_id: t.dependency_id,
        dependency_version: 1,
        target_kind: "WEBHOOK".into(),
        target_name: target.into(),
        target_parameters: "{}".into(),
        inputs: "[]".into(),
        partition: backfill.map(|_| format!("dt={n}")),
        window_end_ms: None,
        reason: "test".into(),
        first_commit_ms: 1_700_000_000_000,
        requested_ms: 1_700_000_000_000,
        source_partition: 0,
        source_offset: n as i64,
        origin: if backfill.is_some() {
            "backfill"
        } else {
            "data"
        }
        .into(),
        requested_by: None,
        request_id: backfill.map(str::to_owned),
        rerun_of: None,
    }
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn keys(ts: &[TriggerRecord]) -> BTreeSet<String> {
    ts.iter().map(|t| t.trigger_key.clone()).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// An https webhook whose certificate comes from a CA the dispatcher is told to
/// trust (`SLUICE_TLS_CA_FILE`): the trigger goes over TLS once, signed, SUCCEEDED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_target_gets_the_trigger_over_tls() {
    use std::io::BufRead;
    let dir = std::env::temp_dir().join(unique("sluice-tls"));
    let (ca, cert, key) = sluice_integration_tests::tls_files(&dir);
    let script =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("receivers/https_webhook.py");
    let mut server = Command::new("python3")
        .arg(script)
        .args([&cert, &key])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the https webhook");
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    let stdout = server.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = lines_tx.send(line);
        }
    });
    let port = lines
        .recv_timeout(Duration::from_secs(30))
        .expect("the webhook's port");
    let run = Run::new().await;
    let targets = format!(
        r#"[{{"kind": "webhook", "name": "tls", "url": "https://127.0.0.1:{port}/hook/tls", "secret": "{SECRET}"}}]"#
    );
    let ca = ca.display().to_string();
    let mut d = run.spawn("a", &targets, &[("SLUICE_TLS_CA_FILE", ca.as_str())]);
    let t = trigger(1, WireTargetKind::Webhook, "tls");
    run.publish(std::slice::from_ref(&t), 2).await;
    run.wait_status(
        &keys(std::slice::from_ref(&t)),
        "SUCCEEDED",
        Duration::from_secs(60),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    kill(&mut d);
    let _ = server.kill();
    let _ = server.wait();
    let calls: Vec<serde_json::Value> = lines
        .try_iter()
        .map(|l| serde_json::from_str(&l).expect("a request line"))
        .collect();
    assert_eq!(calls.len(), 1, "one send over TLS: {calls:?}");
    let c = &calls[0];
    assert_eq!(c["path"], "/hook/tls");
    assert_eq!(
        c["headers"][IDEMPOTENCY_HEADER.to_ascii_lowercase()],
        t.trigger_key.as_str()
    );
    let body = unhex(c["body_hex"].as_str().expect("body"));
    assert_eq!(
        c["headers"][SIGNATURE_HEADER.to_ascii_lowercase()],
        signature(SECRET, &body).as_str(),
        "signed"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trigger_delivered_many_times_to_three_dispatchers_is_one_row_and_one_send() {
    let run = Run::new().await;
    let targets = format!("[{}]", run.hook_target("hook", ""));
    let mut ds: Vec<Child> = ["a", "b", "c"]
        .iter()
        .map(|i| run.spawn(i, &targets, &[]))
        .collect();
    let triggers: Vec<TriggerRecord> = (0..60)
        .map(|n| trigger(n, WireTargetKind::Webhook, "hook"))
        .collect();
    // Every trigger four times, on four partitions: every dispatcher sees copies.
    run.publish(&triggers, 4).await;
    // Bad input: garbage and a record whose key is not its trigger_key.
    let p: BaseProducer = kafka()
        .producer_config("ds-test")
        .create()
        .expect("producer");
    let topic = run.names.name(Topic::Triggers);
    p.send(
        BaseRecord::to(&topic)
            .key("garbage")
            .payload(&[1u8, 2, 3][..])
            .headers(OwnedHeaders::new().insert(Header {
                key: "origin",
                value: Some("it"),
            })),
    )
    .expect("send");
    let mut wrong = trigger(999, WireTargetKind::Webhook, "hook");
    let bytes = Codec::new(None)
        .encode(SchemaName::TriggerRequest, &topic, &wrong)
        .await
        .expect("encode");
    wrong.trigger_key = "not-the-key".into();
    p.send(
        BaseRecord::to(&topic)
            .key(&wrong.trigger_key)
            .payload(&bytes),
    )
    .expect("send");
    p.flush(Duration::from_secs(30)).expect("flush");

    let want = keys(&triggers);
    run.wait_status(&want, "SUCCEEDED", Duration::from_secs(90))
        .await;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM trigger_history")
        .fetch_one(&run.pool)
        .await
        .expect("count");
    let calls = run.calls();
    let per_key: BTreeMap<&str, usize> = calls.iter().fold(BTreeMap::new(), |mut m, c| {
        *m.entry(c.key.as_str()).or_default() += 1;
        m
    });
    println!(
        "trigger records 240, rows {rows}, sends {}, keys sent {}",
        calls.len(),
        per_key.len()
    );
    assert_eq!(rows, 60, "one row per trigger_key");
    assert_eq!(calls.len(), 60, "one send per trigger_key");
    assert!(per_key.values().all(|&n| n == 1));
    assert!(
        calls
            .iter()
            .all(|c| c.signed && c.target == "hook" && !c.invocation.is_empty())
    );
    // Bad records are dead-lettered with their origin.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let dlq = read_topic(&run.names.name(Topic::DeadLetter), PARTITIONS);
    assert!(
        dlq.contains_key("garbage") && dlq.contains_key("not-the-key"),
        "{:?}",
        dlq.keys()
    );
    // Every transition is on the runs topic: PENDING → RUNNING → SUCCEEDED.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let runs = run.runs().await;
        let complete = want.iter().all(|k| {
            runs.get(k).is_some_and(|r| {
                r.iter().map(|x| x.status).collect::<Vec<_>>()
                    == [JobStatus::Pending, JobStatus::Running, JobStatus::Succeeded]
            })
        });
        if complete {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "runs topic incomplete: {:?}",
            runs.values().next()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for d in &mut ds {
        kill(d);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_dispatch_is_retried_with_a_new_invocation_up_to_its_limit() {
    let run = Run::new().await;
    let targets = format!(
        "[{}]",
        run.hook_target("flaky", r#", "max_attempts": 3, "backoff_ms": 100"#)
    );
    let always = trigger(1, WireTargetKind::Webhook, "flaky");
    let once = trigger(2, WireTargetKind::Webhook, "flaky");
    {
        let mut g = run.receiver.lock().expect("lock");
        g.script
            .insert(always.trigger_key.clone(), vec![400, 422, 400, 400]);
        g.script.insert(once.trigger_key.clone(), vec![429]);
    }
    let mut d = run.spawn("a", &targets, &[]);
    run.publish(&[always.clone(), once.clone()], 1).await;
    run.wait_status(
        &keys(std::slice::from_ref(&always)),
        "FAILED",
        Duration::from_secs(60),
    )
    .await;
    run.wait_status(
        &keys(std::slice::from_ref(&once)),
        "SUCCEEDED",
        Duration::from_secs(60),
    )
    .await;
    let calls = run.calls();
    let inv = |k: &str| -> Vec<String> {
        calls
            .iter()
            .filter(|c| c.key == k)
            .map(|c| c.invocation.clone())
            .collect()
    };
    let (a, o) = (inv(&always.trigger_key), inv(&once.trigger_key));
    println!(
        "always refused: {} sends; refused once: {} sends",
        a.len(),
        o.len()
    );
    assert_eq!(a.len(), 3, "max_attempts sends, then FAILED");
    assert_eq!(
        a.iter().collect::<BTreeSet<_>>().len(),
        3,
        "a new invocation each time"
    );
    assert_eq!(o.len(), 2);
    assert_ne!(o[0], o[1]);
    let reason: String = sqlx::query_scalar("SELECT reason FROM jobs WHERE trigger_key = $1")
        .bind(&always.trigger_key)
        .fetch_one(&run.pool)
        .await
        .expect("reason");
    assert!(
        reason.contains("400") && reason.contains("attempt 3 of 3"),
        "{reason}"
    );
    kill(&mut d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_between_mark_running_and_send_never_sends_twice() {
    let run = Run::new().await;
    // `blind` cannot be asked (no Idempotency-Key support): UNKNOWN for an operator.
    // `dedup` deduplicates by Idempotency-Key: settled by one send under the same key.
    let timing = r#", "send_timeout_ms": 500, "deadline_ms": 1500"#;
    let targets = format!(
        "[{}, {}]",
        run.hook_target("blind", timing),
        run.hook_target("dedup", &format!(r#"{timing}, "idempotent": true"#))
    );
    let blind = trigger(1, WireTargetKind::Webhook, "blind");
    let dedup = trigger(2, WireTargetKind::Webhook, "dedup");
    // One trigger per faulty run: each dies right after its markRunning commits.
    for t in [&blind, &dedup] {
        let mut faulty = run.spawn(
            "a",
            &targets,
            &[("SLUICE_DISPATCHER_FAULT", "abort_after_mark_running")],
        );
        run.publish(std::slice::from_ref(t), 1).await;
        let _ = faulty.wait();
        let s = run.statuses().await;
        assert!(
            s.get(&t.trigger_key)
                .is_some_and(|(st, _)| st == "RUNNING" || st == "UNKNOWN"),
            "markRunning was durable before the (never made) send: {s:?}"
        );
    }
    assert!(run.calls().is_empty(), "nothing was sent");
    let mut d = run.spawn("a", &targets, &[]);
    run.wait_status(
        &keys(std::slice::from_ref(&blind)),
        "UNKNOWN",
        Duration::from_secs(60),
    )
    .await;
    run.wait_status(
        &keys(std::slice::from_ref(&dedup)),
        "SUCCEEDED",
        Duration::from_secs(60),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await; // UNKNOWN stays UNKNOWN
    let s = run.statuses().await;
    assert_eq!(s[&blind.trigger_key].0, "UNKNOWN");
    let calls = run.calls();
    let sent = |k: &str| calls.iter().filter(|c| c.key == k).count();
    println!(
        "after kill -9 between markRunning and send: blind {} sends ({}), dedup {} sends ({})",
        sent(&blind.trigger_key),
        s[&blind.trigger_key].0,
        sent(&dedup.trigger_key),
        s[&dedup.trigger_key].0
    );
    assert_eq!(
        sent(&blind.trigger_key),
        0,
        "an unknown outcome is never resent blindly"
    );
    assert_eq!(sent(&dedup.trigger_key), 1);

    // The operator's path: list the UNKNOWN job, settle it after checking the target.
    let operator = |args: &[&str]| {
        let out = Command::new(service_binary("sluice-dispatcher"))
            .args(args)
            .env("SLUICE_DATABASE_URL", &run.db)
            .output()
            .expect("run the operator command");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, listed, _) = operator(&["unknown"]);
    assert_eq!(code, Some(0));
    assert!(
        listed.contains(&blind.trigger_key) && !listed.contains(&dedup.trigger_key),
        "{listed}"
    );
    let (code, _, err) = operator(&["settle", &dedup.trigger_key, "retry", "again"]);
    assert_eq!(code, Some(1), "a settled job is not settled again");
    assert!(err.contains("is SUCCEEDED, not UNKNOWN"), "{err}");
    let (code, _, err) = operator(&["settle", &blind.trigger_key, "maybe", "x"]);
    assert_eq!(code, Some(2), "{err}");
    let (code, out, err) = operator(&[
        "settle",
        &blind.trigger_key,
        "retry",
        "checked the receiver: it never arrived",
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    run.wait_status(
        &keys(std::slice::from_ref(&blind)),
        "SUCCEEDED",
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(
        run.calls()
            .iter()
            .filter(|c| c.key == blind.trigger_key)
            .count(),
        1,
        "sent once, after the operator's retry"
    );
    kill(&mut d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caps_hold_under_a_burst_and_other_targets_still_get_through() {
    const BURST: usize = 10_000;
    let run = Run::new().await;
    run.receiver
        .lock()
        .expect("lock")
        .delay
        .insert("slow".into(), Duration::from_millis(2));
    let targets = format!(
        "[{}, {}]",
        run.hook_target("slow", r#", "max_in_flight": 8, "max_per_round": 64"#),
        run.hook_target("fast", "")
    );
    let env = [("SLUICE_DISPATCH_ROUND_MS", "5")];
    let mut ds = vec![
        run.spawn("a", &targets, &env),
        run.spawn("b", &targets, &env),
    ];
    let slow: Vec<TriggerRecord> = (0..BURST)
        .map(|n| trigger(n, WireTargetKind::Webhook, "slow"))
        .collect();
    let fast: Vec<TriggerRecord> = (0..20)
        .map(|n| trigger(n, WireTargetKind::Webhook, "fast"))
        .collect();
    let started = Instant::now();
    run.publish(&slow, 1).await;
    run.publish(&fast, 1).await;
    run.wait_status(&keys(&fast), "SUCCEEDED", Duration::from_secs(60))
        .await;
    let fast_done = started.elapsed();
    let slow_done_then = run.calls().iter().filter(|c| c.target == "slow").count();
    run.wait_status(&keys(&slow), "SUCCEEDED", Duration::from_secs(600))
        .await;
    let all_done = started.elapsed();
    let g = run.receiver.lock().expect("lock");
    let max_slow = g.max_in_flight.get("slow").copied().unwrap_or(0);
    let slow_sends = g.calls.iter().filter(|c| c.target == "slow").count();
    println!(
        "burst {BURST} to `slow` (cap 8 in flight, 2 instances): max in flight {max_slow}, sends {slow_sends}, all done in {:.1} s ({:.0}/s); \
         `fast` done after {:.1} s with {slow_done_then} of the burst sent",
        all_done.as_secs_f64(),
        BURST as f64 / all_done.as_secs_f64(),
        fast_done.as_secs_f64()
    );
    assert!(max_slow <= 8, "cap of 8 in flight exceeded: {max_slow}");
    assert_eq!(slow_sends, BURST, "one send each");
    assert!(
        slow_done_then < BURST,
        "the other target got through during the burst"
    );
    drop(g);
    for d in &mut ds {
        kill(d);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dolphinscheduler_stand_in_started_and_followed_to_its_end() {
    let run = Run::new().await;
    let base = format!("http://127.0.0.1:{}", run.port);
    let targets = format!(
        r#"[{{"kind": "dolphinscheduler", "name": "777", "url": "{base}", "token": "ds-token", "project_code": "4242"}},
            {{"kind": "dolphinscheduler", "name": "888", "url": "{base}", "token": "ds-token", "project_code": "4242", "max_attempts": 2, "backoff_ms": 50}},
            {{"kind": "dolphinscheduler", "name": "bad-token", "url": "{base}", "token": "wrong", "project_code": "4242", "max_attempts": 1}}]"#
    );
    let mut d = run.spawn("a", &targets, &[]);
    let good = trigger(1, WireTargetKind::Dolphinscheduler, "777");
    let missing = trigger(2, WireTargetKind::Dolphinscheduler, "888");
    let denied = trigger(3, WireTargetKind::Dolphinscheduler, "bad-token");
    run.publish(&[good.clone(), missing.clone(), denied.clone()], 1)
        .await;
    run.wait_status(
        &keys(std::slice::from_ref(&good)),
        "SUCCEEDED",
        Duration::from_secs(60),
    )
    .await;
    run.wait_status(
        &keys(&[missing.clone(), denied.clone()]),
        "FAILED",
        Duration::from_secs(60),
    )
    .await;
    let (ext, reason_missing): (Option<String>, Option<String>) = (
        sqlx::query_scalar("SELECT external_id FROM jobs WHERE trigger_key = $1")
            .bind(&good.trigger_key)
            .fetch_one(&run.pool)
            .await
            .expect("ext"),
        sqlx::query_scalar("SELECT reason FROM jobs WHERE trigger_key = $1")
            .bind(&missing.trigger_key)
            .fetch_one(&run.pool)
            .await
            .expect("reason"),
    );
    assert_eq!(ext.as_deref(), Some("1000"), "the instance id is followed");
    assert!(reason_missing.unwrap_or_default().contains("50014"));
    let g = run.receiver.lock().expect("lock");
    let (params, polls) = &g.ds_instances[&1000];
    assert_eq!(params["sluice_trigger_key"], good.trigger_key.as_str());
    assert!(
        params["sluice_inputs"]
            .as_str()
            .unwrap_or_default()
            .contains("lake.ods.orders")
    );
    assert!(*polls >= 3, "followed until SUCCESS");
    drop(g);
    kill(&mut d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_target_gets_the_trigger_and_its_exit_code_decides() {
    let run = Run::new().await;
    let dir = std::env::temp_dir().join(unique("cmd"));
    std::fs::create_dir_all(&dir).expect("dir");
    let out = dir.display();
    let targets = format!(
        r#"[{{"kind": "command", "name": "compact", "argv": ["sh", "-c", "cat > {out}/$SLUICE_TRIGGER_KEY.json && test \"$1\" = ok", "sh", "{{param.verdict}}"], "max_attempts": 2, "backoff_ms": 50}}]"#
    );
    let mut d = run.spawn("a", &targets, &[]);
    let mut ok = trigger(1, WireTargetKind::Command, "compact");
    ok.target.parameters.insert("verdict".into(), "ok".into());
    let mut bad = trigger(2, WireTargetKind::Command, "compact");
    bad.target.parameters.insert("verdict".into(), "no".into());
    run.publish(&[ok.clone(), bad.clone()], 1).await;
    run.wait_status(
        &keys(std::slice::from_ref(&ok)),
        "SUCCEEDED",
        Duration::from_secs(60),
    )
    .await;
    run.wait_status(
        &keys(std::slice::from_ref(&bad)),
        "FAILED",
        Duration::from_secs(60),
    )
    .await;
    let doc: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join(format!("{}.json", ok.trigger_key)))
            .expect("stdin written"),
    )
    .expect("json");
    assert_eq!(doc["trigger_key"], ok.trigger_key.as_str());
    assert_eq!(doc["inputs"][0]["snapshot_id"], 1001);
    let s = run.statuses().await;
    assert_eq!(s[&bad.trigger_key].1, 2, "retried up to max_attempts");
    kill(&mut d);
}

/// A real Airflow 3 (`airflow standalone`: SQLite, the simple auth manager, its
/// REST API v2 on a port of ours) with two DAGs of this test, in a process group
/// of its own that is killed with all its children on drop.
struct Airflow {
    child: Child,
    url: String,
    password: String,
    /// Where the `sluice_ok` DAG writes the conf of each run, as `<run id>.json`.
    out: std::path::PathBuf,
    home: std::path::PathBuf,
    http: reqwest::Client,
}

const AIRFLOW_DAGS: &str = r#"
import json, os
from datetime import datetime
from airflow.sdk import DAG, task

OUT = os.environ["SLUICE_IT_OUT"]

with DAG(dag_id="sluice_ok", schedule=None, start_date=datetime(2024, 1, 1), catchup=False):
    @task
    def record(**context):
        run = context["dag_run"]
        with open(os.path.join(OUT, run.run_id + ".json"), "w") as f:
            json.dump(run.conf, f)
    record()

with DAG(dag_id="sluice_fails", schedule=None, start_date=datetime(2024, 1, 1), catchup=False):
    @task(retries=0)
    def fail():
        # fails on purpose until the test "fixes" it, then the operator re-runs it
        if not os.path.exists(os.path.join(OUT, "fixed")):
            raise RuntimeError("this DAG fails on purpose")
    fail()
"#;

impl Airflow {
    async fn start() -> Airflow {
        use std::os::unix::process::CommandExt;
        let airflow = venv_bin("airflow", "airflow");
        let venv_bin_dir = airflow.parent().expect("venv bin").to_owned();
        let home = std::env::temp_dir().join(unique("airflow"));
        let (dags, out) = (home.join("dags"), home.join("out"));
        std::fs::create_dir_all(&dags).expect("dags dir");
        std::fs::create_dir_all(&out).expect("out dir");
        std::fs::write(dags.join("sluice_it.py"), AIRFLOW_DAGS).expect("dag file");
        let port = free_port();
        let url = format!("http://127.0.0.1:{port}");
        let log = std::fs::File::create(home.join("standalone.log")).expect("log");
        // Its scheduler, API server and DAG processor are subprocesses that must find
        // the venv's own executables first.
        let path = format!(
            "{}:{}",
            venv_bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let child = Command::new(&airflow)
            .arg("standalone")
            .env("PATH", path)
            .env("AIRFLOW_HOME", &home)
            .env("SLUICE_IT_OUT", &out)
            .env("AIRFLOW__CORE__DAGS_FOLDER", &dags)
            .env("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
            .env("AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION", "False")
            .env("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "sluice:admin")
            .env("AIRFLOW__API__PORT", port.to_string())
            .env("AIRFLOW__API__HOST", "127.0.0.1")
            .env(
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
                format!("{url}/execution/"),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("spawn airflow standalone");
        let mut af = Airflow {
            child,
            url,
            password: String::new(),
            out,
            home,
            http: reqwest::Client::new(),
        };
        // Ready when the generated password works and both DAGs are parsed.
        let deadline = Instant::now() + Duration::from_secs(240);
        let passwords = af.home.join("simple_auth_manager_passwords.json.generated");
        loop {
            assert!(
                af.child.try_wait().expect("airflow alive").is_none(),
                "airflow standalone exited; its log:\n{}",
                af.log_tail()
            );
            assert!(
                Instant::now() < deadline,
                "Airflow not ready after 240 s; its log:\n{}",
                af.log_tail()
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
            let Some(p) = std::fs::read_to_string(&passwords)
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .and_then(|v| v["sluice"].as_str().map(str::to_owned))
            else {
                continue;
            };
            af.password = p;
            let Some(token) = af.token().await else {
                continue;
            };
            let mut parsed = 0;
            for dag in ["sluice_ok", "sluice_fails"] {
                let r = af
                    .http
                    .get(format!("{}/api/v2/dags/{dag}", af.url))
                    .bearer_auth(&token)
                    .send()
                    .await;
                parsed += usize::from(r.is_ok_and(|r| r.status().is_success()));
            }
            if parsed == 2 {
                return af;
            }
        }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.home.join("standalone.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    async fn token(&self) -> Option<String> {
        let r = self
            .http
            .post(format!("{}/auth/token", self.url))
            .json(&serde_json::json!({"username": "sluice", "password": self.password}))
            .send()
            .await
            .ok()?;
        let body: serde_json::Value = r.json().await.ok()?;
        body["access_token"].as_str().map(str::to_owned)
    }

    /// Every dag run of `dag` as (run id, state).
    async fn runs(&self, dag: &str) -> BTreeMap<String, String> {
        let token = self.token().await.expect("token");
        let body: serde_json::Value = self
            .http
            .get(format!("{}/api/v2/dags/{dag}/dagRuns?limit=100", self.url))
            .bearer_auth(token)
            .send()
            .await
            .expect("list dag runs")
            .json()
            .await
            .expect("dag runs json");
        body["dag_runs"]
            .as_array()
            .expect("dag_runs")
            .iter()
            .map(|r| {
                (
                    r["dag_run_id"].as_str().unwrap_or_default().to_owned(),
                    r["state"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    /// POSTs a dag run the way the dispatcher does and returns Airflow's status code.
    async fn post_run(&self, dag: &str, run_id: &str) -> u16 {
        let token = self.token().await.expect("token");
        self.http
            .post(format!("{}/api/v2/dags/{dag}/dagRuns", self.url))
            .bearer_auth(token)
            .json(&serde_json::json!({"dag_run_id": run_id, "logical_date": null, "conf": {}}))
            .send()
            .await
            .expect("post dag run")
            .status()
            .as_u16()
    }

    fn target(&self, dag: &str, extra: &str) -> String {
        format!(
            r#"{{"kind": "airflow", "name": "{dag}", "url": "{}", "api_version": 2,
                "username": "sluice", "password": "{}", "backoff_ms": 200,
                "send_timeout_ms": 5000, "deadline_ms": 8000{extra}}}"#,
            self.url, self.password
        )
    }
}

impl Drop for Airflow {
    fn drop(&mut self) {
        // The whole group: standalone leaves its scheduler and API server behind otherwise.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_airflow_3_runs_each_trigger_once_and_is_followed_to_its_end() {
    let airflow = Airflow::start().await;
    let run = Run::new().await;
    let targets = format!(
        "[{}, {}]",
        airflow.target("sluice_ok", ""),
        airflow.target("sluice_fails", r#", "max_attempts": 2"#)
    );
    let ok = trigger(1, WireTargetKind::Airflow, "sluice_ok");
    let fails = trigger(2, WireTargetKind::Airflow, "sluice_fails");
    let taken = trigger(3, WireTargetKind::Airflow, "sluice_ok");
    let killed = trigger(4, WireTargetKind::Airflow, "sluice_ok");
    let run_id = |t: &TriggerRecord| sluice_dispatcher::adapters::airflow_run_id(&t.trigger_key, 1);

    // The real server answers a second POST of a run id with 409.
    assert_eq!(airflow.post_run("sluice_ok", &run_id(&taken)).await, 200);
    assert_eq!(airflow.post_run("sluice_ok", &run_id(&taken)).await, 409);

    // A dispatcher that dies right after markRunning of `killed` commits.
    let mut faulty = run.spawn(
        "a",
        &targets,
        &[("SLUICE_DISPATCHER_FAULT", "abort_after_mark_running")],
    );
    run.publish(std::slice::from_ref(&killed), 1).await;
    let _ = faulty.wait();
    assert!(
        airflow
            .runs("sluice_ok")
            .await
            .keys()
            .all(|id| *id == run_id(&taken)),
        "nothing was sent for the killed trigger"
    );

    let mut d = run.spawn("a", &targets, &[]);
    run.publish(&[ok.clone(), fails.clone(), taken.clone()], 2)
        .await;
    let wait = Duration::from_secs(180);
    run.wait_status(
        &keys(&[ok.clone(), taken.clone(), killed.clone()]),
        "SUCCEEDED",
        wait,
    )
    .await;
    run.wait_status(&keys(std::slice::from_ref(&fails)), "FAILED", wait)
        .await;

    let ok_runs = airflow.runs("sluice_ok").await;
    let failed_runs = airflow.runs("sluice_fails").await;
    let of = |runs: &BTreeMap<String, String>, t: &TriggerRecord| {
        runs.iter()
            .filter(|(id, _)| id.contains(&t.trigger_key))
            .map(|(id, st)| (id.clone(), st.clone()))
            .collect::<Vec<_>>()
    };
    println!(
        "airflow dag runs: ok {:?}; taken before (409) {:?}; killed after markRunning {:?}; failing DAG {:?}",
        of(&ok_runs, &ok),
        of(&ok_runs, &taken),
        of(&ok_runs, &killed),
        of(&failed_runs, &fails)
    );
    // Followed to the real end: one successful dag run per trigger, sent with our run id.
    assert_eq!(of(&ok_runs, &ok), [(run_id(&ok), "success".to_owned())]);
    // 409 is ours: the dispatcher followed the run that already existed.
    assert_eq!(
        of(&ok_runs, &taken),
        [(run_id(&taken), "success".to_owned())]
    );
    // Killed between markRunning and send: swept to UNKNOWN, reconciled by asking
    // Airflow (404: never arrived), then sent once — one dag run, not two.
    let k = of(&ok_runs, &killed);
    assert_eq!(k.len(), 1, "{k:?}");
    assert_eq!(k[0].1, "success");
    // A failed dag run is retried as a new dag run, up to max_attempts.
    assert_eq!(
        of(&failed_runs, &fails),
        [
            (run_id(&fails), "failed".to_owned()),
            (
                sluice_dispatcher::adapters::airflow_run_id(&fails.trigger_key, 2),
                "failed".to_owned()
            )
        ]
    );
    // The DAG itself saw the snapshot combination in its conf.
    let conf: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(airflow.out.join(format!("{}.json", run_id(&ok))))
            .expect("the DAG wrote its conf"),
    )
    .expect("conf json");
    assert_eq!(conf["trigger_key"], ok.trigger_key.as_str());
    assert_eq!(conf["inputs"][0]["snapshot_id"], 1001);
    let s = run.statuses().await;
    assert_eq!(s[&fails.trigger_key], ("FAILED".to_owned(), 2));
    assert_eq!(
        s[&killed.trigger_key].1, 2,
        "attempt 1 unknown, attempt 2 sent"
    );

    // The operator fixes the DAG and re-runs the FAILED run through the API and the
    // CLI: a new run linked to the original, one new dag run, followed to success.
    std::fs::write(airflow.out.join("fixed"), "").expect("fix the DAG");
    let (api, mut api_child) = run.start_api().await;
    let rerun = |request: &str| {
        Command::new(service_binary("sluice"))
            .args(["rerun", &fails.trigger_key, "--request-id", request])
            .args(["--reason", "the DAG is fixed", "-o", "json"])
            .env("SLUICE_API_URL", &api)
            .env("SLUICE_API_TOKEN", API_ADMIN)
            .env(
                "SLUICE_CONFIG",
                std::env::temp_dir().join(unique("no-config")),
            )
            .output()
            .expect("sluice rerun")
    };
    let out = rerun("fixed-1");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let again = rerun("fixed-1");
    let same: serde_json::Value = serde_json::from_slice(&again.stdout).expect("json");
    let new_key = answer["trigger_key"].as_str().expect("new key").to_owned();
    assert_eq!(
        same["trigger_key"],
        new_key.as_str(),
        "one request id, one run"
    );
    assert_ne!(new_key, fails.trigger_key);
    run.wait_status(&BTreeSet::from([new_key.clone()]), "SUCCEEDED", wait)
        .await;
    let failed_runs = airflow.runs("sluice_fails").await;
    let new_runs: Vec<_> = failed_runs
        .iter()
        .filter(|(id, _)| id.contains(&new_key))
        .collect();
    assert_eq!(
        new_runs,
        [(
            &sluice_dispatcher::adapters::airflow_run_id(&new_key, 1),
            &"success".to_owned()
        )],
        "one new dag run in Airflow: {failed_runs:?}"
    );
    assert_eq!(
        failed_runs.len(),
        3,
        "the original's two failed dag runs stay as they were"
    );
    let linked: Option<String> =
        sqlx::query_scalar("SELECT rerun_of FROM trigger_history WHERE trigger_key = $1")
            .bind(&new_key)
            .fetch_one(&run.pool)
            .await
            .expect("history");
    assert_eq!(linked.as_deref(), Some(fails.trigger_key.as_str()));
    // Declared through the API, the Airflow target gives each run a link to its
    // dag run in Airflow's UI, and Airflow serves that page.
    let http = reqwest::Client::new();
    let declared = http
        .put(format!("{api}/v1/targets/airflow/sluice_fails"))
        .bearer_auth(API_ADMIN)
        .json(
            &serde_json::json!({"kind": "airflow", "name": "sluice_fails", "url": airflow.url,
                                  "api_version": 2, "username": "sluice",
                                  "password": {"env": "AIRFLOW_PASSWORD"}}),
        )
        .send()
        .await
        .expect("declare the target");
    assert!(
        declared.status().is_success(),
        "{:?}",
        declared.text().await
    );
    let shown: serde_json::Value = http
        .get(format!("{api}/v1/runs/{new_key}"))
        .bearer_auth(API_ADMIN)
        .send()
        .await
        .expect("the run")
        .json()
        .await
        .expect("json");
    let link = format!(
        "{}/dags/sluice_fails/runs/{}",
        airflow.url,
        sluice_dispatcher::adapters::airflow_run_id(&new_key, 1)
    );
    assert_eq!(shown["target_url"], link.as_str(), "{shown}");
    let page = http.get(&link).send().await.expect("Airflow's UI");
    assert!(
        page.status().is_success(),
        "Airflow serves {link}: {}",
        page.status()
    );
    kill(&mut api_child);
    kill(&mut d);
}

/// A static member whose session timed out is fenced when it comes back (seen after
/// a broker restart: the intake's consumer failed fatally and the dispatcher lived
/// on without recording another trigger). Here another consumer joins the group
/// under the dispatcher's own group.instance.id, which fences the dispatcher's
/// member the same way; the intake must build a new consumer and lose nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_triggers_consumer_is_rebuilt_and_no_trigger_is_lost() {
    let run = Run::new().await;
    let targets = format!("[{}]", run.hook_target("fenced", ""));
    let mut d = run.spawn("f", &targets, &[]);
    let before: Vec<TriggerRecord> = (0..5)
        .map(|n| trigger(n, WireTargetKind::Webhook, "fenced"))
        .collect();
    run.publish(&before, 1).await;
    run.wait_status(&keys(&before), "SUCCEEDED", Duration::from_secs(60))
        .await;
    // The dispatcher's client id is its group.instance.id.
    sluice_integration_tests::fence_static_member(
        "sluice-dispatcher-f",
        &format!("{}dispatcher", run.names.prefix),
        &run.names.name(Topic::Triggers),
    );
    let after: Vec<TriggerRecord> = (5..25)
        .map(|n| trigger(n, WireTargetKind::Webhook, "fenced"))
        .collect();
    run.publish(&after, 1).await;
    run.wait_status(&keys(&after), "SUCCEEDED", Duration::from_secs(90))
        .await;
    assert!(
        d.try_wait().expect("wait").is_none(),
        "the dispatcher rode it out"
    );
    let sent = run.calls().len();
    println!(
        "after the fencing: {} triggers recorded and sent ({sent} sends)",
        after.len()
    );
    assert_eq!(sent, before.len() + after.len(), "each sent once");
    kill(&mut d);
}

/// A Kafka target, against the real broker: one record per trigger keyed by its
/// trigger_key. Kafka does not deduplicate, so a job whose send may or may not have
/// happened (a kill -9 between markRunning and the send) is never resent: it stays
/// UNKNOWN for an operator, and the topic holds no second record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_target_gets_one_record_and_an_unknown_send_is_never_repeated() {
    let run = Run::new().await;
    let topic = sluice_integration_tests::create_topic(3).await;
    let targets = format!(
        r#"[{{"kind": "kafka", "name": "events", "topic": "{topic}", "send_timeout_ms": 500, "deadline_ms": 1500}}]"#
    );
    let lost = trigger(1, WireTargetKind::Kafka, "events");
    let mut faulty = run.spawn(
        "k",
        &targets,
        &[("SLUICE_DISPATCHER_FAULT", "abort_after_mark_running")],
    );
    run.publish(std::slice::from_ref(&lost), 1).await;
    let _ = faulty.wait();
    let mut d = run.spawn("k", &targets, &[]);
    let fine: Vec<TriggerRecord> = (2..12)
        .map(|n| trigger(n, WireTargetKind::Kafka, "events"))
        .collect();
    run.publish(&fine, 2).await;
    run.wait_status(&keys(&fine), "SUCCEEDED", Duration::from_secs(60))
        .await;
    run.wait_status(
        &keys(std::slice::from_ref(&lost)),
        "UNKNOWN",
        Duration::from_secs(60),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await; // several reconcile looks
    let s = run.statuses().await;
    assert_eq!(s[&lost.trigger_key].0, "UNKNOWN", "not resent blindly");
    let out = read_topic(&topic, 3);
    println!(
        "kafka target: {} keys, records per key {:?}",
        out.len(),
        out.values().map(Vec::len).collect::<Vec<_>>()
    );
    assert!(
        !out.contains_key(&lost.trigger_key),
        "the unknown send was not repeated"
    );
    for t in &fine {
        let recs = out.get(&t.trigger_key).map_or(0, Vec::len);
        assert_eq!(
            recs, 1,
            "one record for {} (published twice)",
            t.trigger_key
        );
        let doc: serde_json::Value =
            serde_json::from_slice(&out[&t.trigger_key][0]).expect("trigger document");
        assert_eq!(doc["trigger_key"], t.trigger_key.as_str());
    }
    kill(&mut d);
}

/// A command target runs detached from the dispatcher (its own process group, a
/// run directory with its pid and exit code): a kill -9 of the dispatcher in the
/// middle of the command leaves it running, and the restarted dispatcher
/// reconciles the job from the run directory — SUCCEEDED, the command run once.
/// The job's deadline is five minutes away: the restart itself releases its
/// predecessor's jobs to the reconcile (a compaction may run for an hour).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_survives_a_dispatcher_killed_mid_run_and_ends_succeeded() {
    let run = Run::new().await;
    let dir = std::env::temp_dir().join(unique("cmd-kill"));
    std::fs::create_dir_all(&dir).expect("dir");
    let (starts, done) = (dir.join("starts"), dir.join("done"));
    let runs = dir.join("runs").display().to_string();
    let targets = format!(
        r#"[{{"kind": "command", "name": "long", "argv": ["sh", "-c", "echo $SLUICE_INVOCATION_ID >> {}; sleep 3; echo ok >> {}"],
             "send_timeout_ms": 240000, "deadline_ms": 300000}}]"#,
        starts.display(),
        done.display()
    );
    let env = [("SLUICE_COMMAND_DIR", runs.as_str())];
    let mut d = run.spawn("c", &targets, &env);
    let t = trigger(1, WireTargetKind::Command, "long");
    run.publish(std::slice::from_ref(&t), 1).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !starts.exists() {
        assert!(Instant::now() < deadline, "the command never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    kill(&mut d); // kill -9 while the command sleeps
    let s = run.statuses().await;
    assert_eq!(
        s[&t.trigger_key].0, "RUNNING",
        "the dispatcher died mid-run"
    );
    let mut d = run.spawn("c", &targets, &env);
    run.wait_status(
        &keys(std::slice::from_ref(&t)),
        "SUCCEEDED",
        Duration::from_secs(45),
    )
    .await;
    let lines = |p: &std::path::Path| {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .count()
    };
    let ext: Option<String> =
        sqlx::query_scalar("SELECT external_id FROM jobs WHERE trigger_key = $1")
            .bind(&t.trigger_key)
            .fetch_one(&run.pool)
            .await
            .expect("external id");
    println!(
        "command after a kill -9 mid-run: started {}, finished {}, run directory {ext:?}",
        lines(&starts),
        lines(&done)
    );
    assert_eq!(
        (lines(&starts), lines(&done)),
        (1, 1),
        "run once, to its end"
    );
    assert!(
        ext.is_some_and(|e| e.starts_with(&runs)),
        "the run directory is the run's id"
    );
    kill(&mut d);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A target is an engine's queue: within it, a higher `priority` (the
/// dependency's target parameter) starts first, then the oldest; a priority
/// written to the topic by hand that is not an integer is 0, never a lost trigger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_starts_its_jobs_by_priority_then_age() {
    use sluice_dispatcher::store::{self, ClaimLimits};
    let run = Run::new().await;
    let epoch = sluice_dispatcher::take_epoch(&run.pool, "prio")
        .await
        .expect("epoch");
    let with = |n: usize, priority: &str| {
        let mut t = new_trigger(n, "spark", None);
        t.target_parameters = serde_json::json!({"priority": priority}).to_string();
        t
    };
    let batch = [
        with(1, "0"),
        with(2, "5"),
        with(3, "not a number"),
        with(4, "-2"),
        with(5, "5"),
    ];
    assert_eq!(
        store::record_triggers(&run.pool, &batch)
            .await
            .expect("recorded")
            .len(),
        5
    );
    let limits = ClaimLimits {
        max_in_flight: 1,
        max_per_round: 1,
        deadline: Duration::from_secs(30),
    };
    let mut order = Vec::new();
    for _ in 0..batch.len() {
        let claimed = store::claim(&run.pool, "WEBHOOK", "spark", &limits, epoch, "prio")
            .await
            .expect("claim");
        assert_eq!(claimed.len(), 1, "one slot");
        let job = &claimed[0];
        order.push(
            batch
                .iter()
                .position(|t| t.trigger_key == job.trigger_key)
                .expect("ours")
                + 1,
        );
        // Done: the slot is free for the next.
        sqlx::query(
            "UPDATE jobs SET status = 'SUCCEEDED', revision = revision + 1 WHERE trigger_key = $1",
        )
        .bind(&job.trigger_key)
        .execute(&run.pool)
        .await
        .expect("done");
    }
    // Both 5s first (due together: either order), then the 0 and the unreadable
    // one (0), then the -2.
    let mut first = order[..2].to_vec();
    first.sort();
    let mut then = order[2..4].to_vec();
    then.sort();
    assert_eq!(
        (first, then, order[4]),
        (vec![2, 5], vec![1, 3], 4),
        "{order:?}"
    );
}

/// The pre-send check of the Doris dispatcher design: a job claimed for an
/// invocation whose durable record moved before the send (a sweep, an operator's
/// settle, a peer) is not sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_moved_after_its_claim_is_not_sent() {
    use sluice_dispatcher::store::{self, ClaimLimits};
    use sluice_dispatcher::targets::{Kind, Targets};
    let run = Run::new().await;
    let targets = Targets::parse(&format!("[{}]", run.hook_target("pre", ""))).expect("targets");
    let target = targets.get(Kind::Webhook, "pre").expect("target").clone();
    let epoch = sluice_dispatcher::take_epoch(&run.pool, "pre")
        .await
        .expect("epoch");
    store::record_triggers(
        &run.pool,
        &[new_trigger(1, "pre", None), new_trigger(2, "pre", None)],
    )
    .await
    .expect("recorded");
    let limits = ClaimLimits {
        max_in_flight: 10,
        max_per_round: 10,
        deadline: Duration::from_secs(30),
    };
    let claimed = store::claim(&run.pool, "WEBHOOK", "pre", &limits, epoch, "pre")
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 2);
    let (moved, kept) = (&claimed[0], &claimed[1]);
    // Between the claim and the send, the first job moves on (as a sweep would).
    sqlx::query(
        "UPDATE jobs SET status = 'UNKNOWN', revision = revision + 1 WHERE trigger_key = $1",
    )
    .bind(&moved.trigger_key)
    .execute(&run.pool)
    .await
    .expect("move");
    let d = sluice_dispatcher::dispatch::Dispatcher {
        pool: run.pool.clone(),
        targets: std::sync::Arc::new(sluice_dispatcher::targets::LiveTargets::fixed(
            targets.clone(),
        )),
        adapters: sluice_dispatcher::adapters::Adapters::new(
            None,
            &[],
            sluice_dispatcher::command::Runs {
                root: std::env::temp_dir().join(unique("pre")),
                instance: "pre".into(),
            },
        )
        .expect("adapters"),
        epoch,
        instance: "pre".into(),
        round: Duration::from_millis(100),
        wake: Default::default(),
        look_every: Duration::from_secs(1),
        fault: sluice_dispatcher::dispatch::Fault::None,
        outcomes: Default::default(),
        checks: Default::default(),
    };
    d.send(target.clone(), moved.clone()).await;
    d.send(target, kept.clone()).await;
    let sent: Vec<String> = run.calls().into_iter().map(|c| c.key).collect();
    assert_eq!(
        sent,
        std::slice::from_ref(&kept.trigger_key),
        "only the job still claimed was sent"
    );
    let s = run.statuses().await;
    assert_eq!(s[&moved.trigger_key].0, "UNKNOWN", "left as it was moved");
    assert_eq!(s[&kept.trigger_key].0, "SUCCEEDED");
}

/// An UNKNOWN job may still be running at the target: it keeps its slot under
/// `max_in_flight` until an operator (or a reconcile) settles it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_job_keeps_its_in_flight_slot_until_settled() {
    let run = Run::new().await;
    let targets = format!(
        "[{}]",
        run.hook_target(
            "capped",
            r#", "max_in_flight": 1, "send_timeout_ms": 500, "deadline_ms": 1500"#
        )
    );
    let first = trigger(1, WireTargetKind::Webhook, "capped");
    let mut faulty = run.spawn(
        "u",
        &targets,
        &[("SLUICE_DISPATCHER_FAULT", "abort_after_mark_running")],
    );
    run.publish(std::slice::from_ref(&first), 1).await;
    let _ = faulty.wait();
    let mut d = run.spawn("u", &targets, &[]);
    run.wait_status(
        &keys(std::slice::from_ref(&first)),
        "UNKNOWN",
        Duration::from_secs(60),
    )
    .await;
    let second = trigger(2, WireTargetKind::Webhook, "capped");
    run.publish(std::slice::from_ref(&second), 1).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let s = run.statuses().await;
    assert_eq!(
        s.get(&second.trigger_key).map(|(st, _)| st.as_str()),
        Some("PENDING"),
        "the slot is held by the UNKNOWN job"
    );
    assert!(run.calls().is_empty());
    let out = Command::new(service_binary("sluice-dispatcher"))
        .args([
            "settle",
            &first.trigger_key,
            "failed",
            "checked: it never ran",
        ])
        .env("SLUICE_DATABASE_URL", &run.db)
        .output()
        .expect("settle");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    run.wait_status(
        &keys(std::slice::from_ref(&second)),
        "SUCCEEDED",
        Duration::from_secs(60),
    )
    .await;
    kill(&mut d);
}

/// Backfill pacing in the claim, on the real PostgreSQL: a backlog of 1,000
/// backfill items never stands in front of a live trigger, holds at most half
/// the target's slots, keeps its per-minute pace, and a cancel makes what is
/// still PENDING CANCELLED (never claimed). A backfill item whose backfill this
/// database never saw is dispatched as a live trigger, not refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_backlog_never_starves_live_triggers_and_keeps_its_pace() {
    use sluice_dispatcher::store::{self, ClaimLimits};
    let run = Run::new().await;
    let epoch = sluice_dispatcher::take_epoch(&run.pool, "bf")
        .await
        .expect("epoch");
    let backfill = |id: &'static str, per_minute: Option<i32>| {
        let pool = run.pool.clone();
        async move {
            sqlx::query(
                "INSERT INTO backfills (backfill_id, dependency_id, project, target_kind, \
                 target_name, request, items_total, per_minute, requested_by) \
                 VALUES ($1, 'd', 'p', 'WEBHOOK', 'bf', '{}', 1000, $2, 'test')",
            )
            .bind(id)
            .bind(per_minute)
            .execute(&pool)
            .await
            .expect("backfill row");
        }
    };
    backfill("bf-big", None).await;
    let items: Vec<store::NewTrigger> = (0..1000)
        .map(|n| new_trigger(n, "bf", Some("bf-big")))
        .collect();
    for chunk in items.chunks(250) {
        store::record_triggers(&run.pool, chunk)
            .await
            .expect("items");
    }
    let limits = ClaimLimits {
        max_in_flight: 4,
        max_per_round: 10,
        deadline: Duration::from_secs(30),
    };
    let claim = || store::claim(&run.pool, "WEBHOOK", "bf", &limits, epoch, "bf");
    let backfill_of = |keys: &[String]| {
        let pool = run.pool.clone();
        let keys = keys.to_vec();
        async move {
            sqlx::query_scalar::<_, Option<String>>(
                "SELECT backfill_id FROM jobs WHERE trigger_key = ANY($1) ORDER BY trigger_key",
            )
            .bind(&keys)
            .fetch_all(&pool)
            .await
            .expect("jobs")
        }
    };
    let finish = |keys: Vec<String>| {
        let pool = run.pool.clone();
        async move {
            sqlx::query(
                "UPDATE jobs SET status = 'SUCCEEDED', revision = revision + 1 \
                 WHERE trigger_key = ANY($1)",
            )
            .bind(&keys)
            .execute(&pool)
            .await
            .expect("finish");
        }
    };
    let keys = |c: &[store::Claimed]| c.iter().map(|j| j.trigger_key.clone()).collect::<Vec<_>>();

    // Alone, the backlog takes its share: half the 4 slots.
    let first = claim().await.expect("claim");
    assert_eq!(first.len(), 2, "a backfill holds at most half the slots");
    assert_eq!(claim().await.expect("claim").len(), 0, "its share is full");
    // Three live triggers arrive behind 998 PENDING items: two start at once.
    let live: Vec<store::NewTrigger> = (1000..1003).map(|n| new_trigger(n, "bf", None)).collect();
    store::record_triggers(&run.pool, &live)
        .await
        .expect("live");
    let second = claim().await.expect("claim");
    assert_eq!(second.len(), 2);
    assert!(
        backfill_of(&keys(&second))
            .await
            .iter()
            .all(Option::is_none),
        "the live triggers go first"
    );
    // A slot frees: the third live trigger takes it, not the backlog.
    finish(keys(&first)[..1].to_vec()).await;
    let third = claim().await.expect("claim");
    assert_eq!(backfill_of(&keys(&third)).await, [None]);
    // Live ones done: the backlog gets its share back, no more.
    finish(keys(&second)).await;
    finish(keys(&third)).await;
    let fourth = claim().await.expect("claim");
    assert_eq!(fourth.len(), 1, "one backfill job still runs: 2 - 1");
    assert!(
        backfill_of(&keys(&fourth))
            .await
            .iter()
            .all(Option::is_some)
    );

    // A paced backfill: 3 a minute, however many slots are free.
    finish(keys(&first)).await;
    finish(keys(&fourth)).await;
    sqlx::query("UPDATE backfills SET cancelled_at = now(), cancelled_by = 'test' WHERE backfill_id = 'bf-big'")
        .execute(&run.pool)
        .await
        .expect("cancel");
    let cancelled = store::cancel_backfill_jobs(&run.pool).await.expect("sweep");
    assert_eq!(
        cancelled,
        1000 - 3,
        "every PENDING item of the cancelled backfill"
    );
    assert_eq!(
        claim().await.expect("claim").len(),
        0,
        "nothing cancelled is claimed"
    );
    backfill("bf-paced", Some(3)).await;
    let paced: Vec<store::NewTrigger> = (2000..2010)
        .map(|n| new_trigger(n, "bf", Some("bf-paced")))
        .collect();
    store::record_triggers(&run.pool, &paced)
        .await
        .expect("paced");
    let mut started = 0;
    for _ in 0..5 {
        let c = claim().await.expect("claim");
        started += c.len();
        finish(keys(&c)).await;
    }
    assert_eq!(started, 3, "3 a minute, though slots were free each time");

    // An item of a backfill never recorded here: dispatched as live.
    store::record_triggers(&run.pool, &[new_trigger(3000, "bf", Some("bf-unknown"))])
        .await
        .expect("orphan");
    let orphan = claim().await.expect("claim");
    assert_eq!(backfill_of(&keys(&orphan)).await, [None]);
    let statuses: BTreeMap<String, usize> =
        sqlx::query_as::<_, (String, i64)>("SELECT status, count(*) FROM jobs GROUP BY status")
            .fetch_all(&run.pool)
            .await
            .expect("statuses")
            .into_iter()
            .map(|(s, n)| (s, n as usize))
            .collect();
    assert_eq!(statuses.get("CANCELLED"), Some(&997));
    assert_eq!(
        statuses.get("PENDING"),
        Some(&7),
        "the paced backfill's rest"
    );
}

/// Every insert and every change of a job's status or external id is one row of
/// the outbox and of the run history, however many jobs a statement moves; a job
/// that becomes FAILED or UNKNOWN is one notification event; a statement that
/// changes neither, or matches no job, records nothing.
#[tokio::test]
async fn every_transition_is_recorded_once_however_many_jobs_a_statement_moves() {
    let (_, pool) = dispatcher_database().await;
    let triggers: Vec<_> = (1..=3).map(|n| new_trigger(n, "rec", None)).collect();
    let keys: Vec<String> = triggers.iter().map(|t| t.trigger_key.clone()).collect();
    sluice_dispatcher::store::record_triggers(&pool, &triggers)
        .await
        .expect("recorded");
    // One statement over the three jobs' keys; how many rows it changed.
    let run = async |sql: &'static str| {
        let done = sqlx::query(sql).bind(&keys).execute(&pool).await;
        done.expect("statement").rows_affected()
    };
    // All three to RUNNING in one statement.
    let moved = run("UPDATE jobs SET status = 'RUNNING', revision = revision + 1, \
                     invocation_id = 'inv-' || trigger_key, epoch = 1, deadline_at = now() + interval '1 hour' \
                     WHERE trigger_key = ANY($1)")
    .await;
    assert_eq!(moved, 3);
    // The first one's run gets its external id: recorded, no new event.
    run("UPDATE jobs SET external_id = 'run-1', revision = revision + 1 WHERE trigger_key = ($1::text[])[1]")
        .await;
    // A lease renewed on all three: neither status nor external id moves.
    assert_eq!(
        run("UPDATE jobs SET lease_until = now() WHERE trigger_key = ANY($1)").await,
        3
    );
    // No job matched.
    assert_eq!(
        run("UPDATE jobs SET status = 'FAILED' WHERE trigger_key = ANY($1) AND status = 'PENDING'")
            .await,
        0
    );
    // Three ends in one statement.
    run("UPDATE jobs SET status = CASE trigger_key WHEN ($1::text[])[1] THEN 'FAILED' \
                                                 WHEN ($1::text[])[2] THEN 'UNKNOWN' ELSE 'SUCCEEDED' END, \
                         revision = revision + 1, reason = 'ended' WHERE trigger_key = ANY($1)")
        .await;

    let expected = [
        "1:PENDING",
        "2:PENDING",
        "3:PENDING",
        "1:RUNNING",
        "2:RUNNING",
        "3:RUNNING",
        "1:RUNNING(run-1)",
        "1:FAILED(run-1)",
        "2:UNKNOWN",
        "3:SUCCEEDED",
    ];
    // One statement's rows may be numbered in any order; each job's are in order.
    let by_statement = |mut rows: Vec<String>| {
        if rows.len() == expected.len() {
            for range in [0..3, 3..6, 7..10] {
                rows[range].sort();
            }
        }
        rows
    };
    for table in ["run_transitions", "job_transitions"] {
        assert_eq!(
            by_statement(recorded(&pool, table, &keys).await),
            expected,
            "{table}"
        );
    }
    let events: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT event_key, kind, detail->>'external_id' FROM notification_events ORDER BY event_key",
    )
    .fetch_all(&pool)
    .await
    .expect("events");
    let mut want = vec![
        (
            format!("run_failed:{}:3", keys[0]),
            "run_failed".to_owned(),
            Some("run-1".to_owned()),
        ),
        (
            format!("job_unknown:{}:2", keys[1]),
            "job_unknown".to_owned(),
            None,
        ),
    ];
    want.sort();
    assert_eq!(events, want);
}

/// `table`'s transitions in id order as `n:STATUS(external id)`, `n` the job's
/// place in `keys` from 1.
async fn recorded(pool: &PgPool, table: &str, keys: &[String]) -> Vec<String> {
    let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT trigger_key, status, external_id FROM {table} ORDER BY id"
    )))
    .fetch_all(pool)
    .await
    .expect("history");
    rows.into_iter()
        .map(|(k, s, e)| {
            let n = keys.iter().position(|key| *key == k).expect("a known job") + 1;
            format!("{n}:{s}{}", e.map(|e| format!("({e})")).unwrap_or_default())
        })
        .collect()
}

/// The dispatcher's PostgreSQL connections send each statement at once
/// (`TCP_NODELAY`). sqlx 0.9.0 had dropped it: over TLS a statement longer than
/// one record went out in two writes, the second held until the server's delayed
/// ACK (~40 ms), so a grouped outcome of 100+ jobs took 45–57 ms and more slots
/// made dispatch slower. Read on the sockets of the dispatcher's own pool.
#[tokio::test]
async fn the_dispatchers_database_connections_send_without_delay() {
    use std::os::fd::{BorrowedFd, RawFd};
    let (url, _) = dispatcher_database().await;
    let env: BTreeMap<String, String> = [
        ("SLUICE_KAFKA_BOOTSTRAP", bootstrap()),
        ("SLUICE_DATABASE_URL", url.clone()),
        ("SLUICE_INSTANCE", "nodelay".into()),
        ("SLUICE_ADMIN_ADDR", format!("127.0.0.1:{}", free_port())),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let options =
        sluice_dispatcher::Options::read(sluice_kit::config::Env::from_map(env)).expect("options");
    let pool = sluice_dispatcher::connect(&options, &sluice_kit::Shutdown::new())
        .await
        .expect("connect");
    let _open = pool.acquire().await.expect("a connection");
    let port = url
        .parse::<sqlx::postgres::PgConnectOptions>()
        .expect("url")
        .get_port();
    let mut checked = 0;
    for entry in std::fs::read_dir("/proc/self/fd").expect("fds") {
        let Some(fd) = entry
            .ok()
            .and_then(|e| e.file_name().to_str()?.parse::<RawFd>().ok())
        else {
            continue;
        };
        // SAFETY: only socket options are read; a descriptor closed meanwhile (by
        // another test of this binary) makes the call fail, and it is skipped.
        #[allow(unsafe_code)]
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let socket = socket2::SockRef::from(&fd);
        let to_postgres = socket
            .peer_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .is_some_and(|a| a.port() == port);
        if to_postgres {
            assert!(
                socket.tcp_nodelay().expect("TCP_NODELAY readable"),
                "a connection to PostgreSQL waits for ACKs (Nagle) before it sends"
            );
            checked += 1;
        }
    }
    assert!(checked > 0, "no connection to PostgreSQL found");
}
