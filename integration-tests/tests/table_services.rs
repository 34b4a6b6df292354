//! Table services on a real Hudi table: a MERGE_ON_READ table written by Spark
//! (pyspark + Hudi 1.0.2's bundle), its commits reaching Sluice by Hudi's own HTTP
//! write-commit callback and by the poller, a `NUM_COMMITS` compaction policy
//! applied like any dependency, and the compaction run by Spark through the
//! shipped driver (`services/dispatcher/engines/hudi_table_service.py`) as a
//! `command` target — with the dispatcher killed (SIGKILL) during the compaction;
//! then log compaction, clustering and clean policies on one table, each run by
//! a `spark-submit` of the same driver to a Spark standalone cluster.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_integration_tests::api::tokens_file;
use sluice_integration_tests::pipeline::{Pipeline, TOKEN};
use sluice_integration_tests::spark::SparkCluster;
use sluice_integration_tests::{
    http_get, hudi_bundle, hudi_spark_write, service_binary, unique, venv_bin,
};
use sqlx::PgPool;

const TABLE: &str = "lake.ods.orders";
const POLICY: &str = "orders-compaction";
const BUSINESS: &str = "orders-report";

fn driver() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../services/dispatcher/engines/hudi_table_service.py")
}

/// `(requested, completed)` of every completed instance on the table's timeline
/// that was planned as `plan` (`compaction`, `logcompaction`, `clustering`,
/// `clean`): a compaction completes as a `commit`, a log compaction as a
/// `deltacommit`, a clustering as a `replacecommit`, each under its plan's instant.
fn completed_services(table: &Path, plan: &str) -> Vec<(String, String)> {
    let tl = table.join(".hoodie").join(sluice_kit::hudi::LAYOUT2_DIR);
    let names: Vec<String> = std::fs::read_dir(&tl)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    let mut out: Vec<(String, String)> = names
        .iter()
        .filter_map(|n| {
            let (req, _) = sluice_kit::hudi::completed_instant(n, true)?;
            let done = n.split_once('.')?.0.split_once('_')?.1;
            names
                .contains(&format!("{req}.{plan}.requested"))
                .then(|| (req.to_owned(), done.to_owned()))
        })
        .collect();
    out.sort();
    out
}

fn compactions(table: &Path) -> Vec<(String, String)> {
    completed_services(table, "compaction")
}

/// Writes one upsert per element of `days` (each a deltacommit) with Spark; with
/// `callback`, Hudi's HTTP write-commit callback posts each to the ingester.
/// Returns the writer's line per commit.
async fn write(table: &Path, days: &[&str], callback: Option<String>) -> Vec<Value> {
    let env: Vec<(&str, String)> = callback
        .map(|url| {
            vec![
                ("HUDI_CALLBACK_URL", url),
                ("HUDI_CALLBACK_KEY", TOKEN.into()),
            ]
        })
        .unwrap_or_default();
    hudi_spark_write(table, "MERGE_ON_READ", days, &env).await
}

/// `(status, attempt, started_at ms)` of every job of `dependency`, oldest first.
async fn jobs(pool: &PgPool, dependency: &str) -> Vec<(String, i32, Option<i64>)> {
    sqlx::query_as(
        "SELECT j.status, j.attempt, \
                (extract(epoch FROM t.recorded_at) * 1000)::bigint \
         FROM jobs j JOIN trigger_history t USING (trigger_key) \
         WHERE t.dependency_id = $1 ORDER BY t.recorded_at",
    )
    .bind(dependency)
    .fetch_all(pool)
    .await
    .expect("jobs")
}

/// The input sequence of every trigger of `dependency`, oldest first.
async fn fired_sequences(pool: &PgPool, dependency: &str) -> Vec<i64> {
    let rows: Vec<(Value,)> = sqlx::query_as(
        "SELECT inputs FROM trigger_history WHERE dependency_id = $1 ORDER BY recorded_at",
    )
    .bind(dependency)
    .fetch_all(pool)
    .await
    .expect("triggers");
    rows.iter()
        .map(|(inputs,)| inputs[0]["sequence"].as_i64().expect("sequence"))
        .collect()
}

/// Applies `specs` through the CLI, as an operator would.
fn apply(p: &Pipeline, root: &std::path::Path, specs: &serde_json::Value) {
    let file = root.join("specs.json");
    std::fs::write(&file, specs.to_string()).expect("specs");
    let applied = p.cli(&["apply", &file.to_string_lossy()]);
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
}

async fn wait_for<F, Fut>(what: &str, p: &Pipeline, secs: u64, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f().await {
        assert!(
            Instant::now() < deadline,
            "{what}: not within {secs} s\n{}",
            p.log_tails(30)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Hudi instants are `yyyyMMddHHmmssSSS` in the writer's zone (UTC here): ms.
fn instant_ms(instant: &str) -> i64 {
    sluice_ingester::normalize::hudi_instant(instant)
        .expect("instant")
        .1
}

/// What the ingester accepted from Hudi's callback, from its metrics.
async fn accepted_from_hudi(p: &Pipeline) -> u64 {
    let port = p.admin_port("ingester").expect("ingester running");
    let (_, text) = http_get(port, "/metrics").await.unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("sluice_ingester_http_accepted_total") && l.contains("hudi"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_num_commits_policy_compacts_a_spark_written_table_once_through_a_dispatcher_kill() {
    let root = std::env::temp_dir().join(unique("hts"));
    let table = root.join("orders");
    let runs = root.join("runs");
    std::fs::create_dir_all(&runs).expect("runs dir");
    let mut p = Pipeline::new(2, &[]).await;
    let tables = json!([{"asset": TABLE, "format": "hudi", "path": table,
        "interval_ms": 500, "push_timeout_ms": 500, "start": "earliest"}]);
    p.set("ingester", "SLUICE_POLL_TABLES", tables.to_string());
    let targets = json!([
        {"kind": "command", "name": "hudi-spark", "max_in_flight": 1, "max_attempts": 3,
         "void_exit_codes": [3],
         "send_timeout_ms": 600_000, "deadline_ms": 660_000,
         "argv": [venv_bin("spark", "python"), driver(), "--jar", hudi_bundle(),
                  "--path", "{param.path}"]},
        {"kind": "command", "name": "report", "argv": ["true"]},
    ]);
    p.set("dispatcher", "SLUICE_TARGETS", targets.to_string());
    p.set(
        "dispatcher",
        "SLUICE_COMMAND_DIR",
        runs.display().to_string(),
    );
    p.start_all().await;
    let specs = json!([
        {"id": POLICY, "version": 1, "owner_project": "lake",
         "target": {"kind": "command", "name": "hudi-spark", "parameters": {"path": table}},
         "condition": {"input": {"asset": TABLE, "predicates": [
             {"kind": "table_service", "service": "compaction", "strategy": "NUM_COMMITS",
              "num_commits": 4}]}}},
        {"id": BUSINESS, "version": 1, "owner_project": "lake",
         "target": {"kind": "command", "name": "report"},
         "condition": {"input": {"asset": TABLE}}},
    ]);
    apply(&p, &root, &specs);
    let pool = PgPool::connect(&p.database_url).await.expect("pool");

    // Five deltacommits, each posted by Hudi's callback (the poller sees them too).
    let callback = format!(
        "http://127.0.0.1:{}/v1/hooks/hudi?asset={TABLE}",
        p.http_port
    );
    let writer = {
        let table = table.clone();
        tokio::spawn(async move { write(&table, &["2024-12-01"; 5], Some(callback)).await })
    };
    // The policy fires at the fourth. Once Spark has planned the compaction (the
    // driver names the instant in its run directory), kill the dispatcher.
    let planned = {
        let runs = runs.clone();
        let pool = pool.clone();
        move || {
            let (runs, pool) = (runs.clone(), pool.clone());
            async move {
                let key: Option<String> = sqlx::query_scalar(
                    "SELECT trigger_key FROM trigger_history WHERE dependency_id = $1",
                )
                .bind(POLICY)
                .fetch_optional(&pool)
                .await
                .expect("trigger");
                let key = key?;
                let dir = runs.join("0").join(&key);
                let inv = std::fs::read_dir(&dir).ok()?.next()?.ok()?.path();
                inv.join("hudi-instant.json").exists().then_some(key)
            }
        }
    };
    wait_for("the compaction planned by Spark", &p, 300, || {
        let planned = planned.clone();
        async move { planned().await.is_some() }
    })
    .await;
    let key = planned().await.expect("planned");
    p.kill("dispatcher");
    println!("[hudi] dispatcher killed (SIGKILL) while Spark runs the compaction");
    tokio::time::sleep(Duration::from_secs(1)).await;
    p.start("dispatcher").await;
    wait_for("the compaction job SUCCEEDED", &p, 400, || async {
        jobs(&pool, POLICY)
            .await
            .first()
            .is_some_and(|(s, _, _)| s == "SUCCEEDED")
    })
    .await;
    let path: Vec<String> =
        sqlx::query_scalar("SELECT status FROM run_transitions WHERE trigger_key = $1 ORDER BY id")
            .bind(&key)
            .fetch_all(&pool)
            .await
            .expect("transitions");
    println!("[hudi] the compaction job went {}", path.join(" → "));
    assert!(
        path.iter().any(|s| s == "UNKNOWN") && path.last().map(String::as_str) == Some("SUCCEEDED"),
        "released by the restart, reconciled from the run, SUCCEEDED: {path:?}"
    );
    let first = writer.await.expect("writer");
    assert_eq!(first.len(), 5);
    let done = compactions(&table);
    assert_eq!(done.len(), 1, "one compaction on the timeline: {done:?}");
    let fourth = instant_ms(
        &first[3]["completed"]
            .as_i64()
            .expect("completed")
            .to_string(),
    );
    let decided = jobs(&pool, POLICY).await[0].2.expect("recorded");
    println!(
        "[hudi] from the 4th deltacommit's completion: trigger recorded after {} ms, compaction {} planned by Spark after {} ms, completed after {} ms",
        decided - fourth,
        done[0].0,
        instant_ms(&done[0].0) - fourth,
        instant_ms(&done[0].1) - fourth,
    );

    // The compaction's commit reached the state (by poll: Hudi sends no callback
    // for it) and fired nothing: the business dependency fired on deltacommits only.
    let deltas: Vec<i64> = first
        .iter()
        .map(|w| w["requested"].as_i64().expect("requested"))
        .collect();
    let compaction: i64 = done[0].0.parse().expect("instant");
    wait_for(
        "the business dependency at the 5th deltacommit",
        &p,
        60,
        || async { fired_sequences(&pool, BUSINESS).await.last() == deltas.last() },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await; // the compaction polled meanwhile
    let fired = fired_sequences(&pool, BUSINESS).await;
    println!("[hudi] business triggers at {fired:?}; deltacommits {deltas:?}");
    assert!(
        fired.iter().all(|s| deltas.contains(s)),
        "a business trigger on a non-deltacommit: {fired:?}, compaction {compaction}"
    );
    assert_eq!(
        accepted_from_hudi(&p).await,
        5,
        "each deltacommit posted once by Hudi's callback"
    );

    // Four more deltacommits with the callback off: the poller alone carries them,
    // the count runs from the completed compaction, and a second one follows.
    let second = write(&table, &["2024-12-01"; 4], None).await;
    assert_eq!(second.len(), 4);
    assert_eq!(accepted_from_hudi(&p).await, 5, "the callback is off");
    wait_for("the second compaction SUCCEEDED", &p, 400, || async {
        let j = jobs(&pool, POLICY).await;
        j.len() == 2 && j[1].0 == "SUCCEEDED"
    })
    .await;
    let done = compactions(&table);
    assert_eq!(done.len(), 2, "{done:?}");
    let j = jobs(&pool, POLICY).await;
    println!("[hudi] policy jobs: {j:?}; compactions {done:?}");
    assert!(
        j.iter().all(|(s, _, _)| s == "SUCCEEDED"),
        "every compaction job SUCCEEDED: {j:?}"
    );
    let all: Vec<i64> = first
        .iter()
        .chain(&second)
        .map(|w| w["requested"].as_i64().expect("requested"))
        .collect();
    wait_for(
        "the business dependency at the 9th deltacommit",
        &p,
        60,
        || async { fired_sequences(&pool, BUSINESS).await.last() == all.last() },
    )
    .await;
    let fired = fired_sequences(&pool, BUSINESS).await;
    assert!(
        fired.iter().all(|s| all.contains(s)),
        "business triggers only on deltacommits: {fired:?}"
    );
    drop(p);
    let _ = std::fs::remove_dir_all(&root);
}

/// The last transition's reason of every run of `dependency`, oldest first.
async fn reasons(pool: &PgPool, dependency: &str) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT j.status, coalesce((SELECT r.reason FROM run_transitions r \
                 WHERE r.trigger_key = j.trigger_key ORDER BY r.id DESC LIMIT 1), '') \
         FROM jobs j JOIN trigger_history t USING (trigger_key) \
         WHERE t.dependency_id = $1 ORDER BY t.recorded_at",
    )
    .bind(dependency)
    .fetch_all(pool)
    .await
    .expect("reasons")
}

/// The other three services, each a policy of its own on one MERGE_ON_READ
/// table, all run by one `command` target that `spark-submit`s the shipped driver
/// to a Spark standalone cluster (the target is the engine's queue: one slot).
/// Each counts data commits from its own last completed instance, never from
/// another service's, and the driver takes the table, the service and Hudi's
/// settings from the policy's target parameters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_compaction_clustering_and_clean_policies_run_on_a_spark_cluster() {
    const EVENTS: &str = "lake.ods.events";
    const LOG: &str = "events-log-compaction";
    const CLUSTER: &str = "events-clustering";
    const CLEAN: &str = "events-clean";
    let root = std::env::temp_dir().join(unique("hts"));
    let table = root.join("events");
    let runs = root.join("runs");
    std::fs::create_dir_all(&runs).expect("runs dir");
    let started = Instant::now();
    let cluster = SparkCluster::start(&root.join("spark"), "2g").await;
    println!(
        "[spark] standalone cluster {} up after {} ms",
        cluster.master_url,
        started.elapsed().as_millis()
    );
    let mut p = Pipeline::new(2, &[]).await;
    let tables = json!([{"asset": EVENTS, "format": "hudi", "path": table,
        "interval_ms": 500, "push_timeout_ms": 500, "start": "earliest"}]);
    p.set("ingester", "SLUICE_POLL_TABLES", tables.to_string());
    let targets = json!([
        {"kind": "command", "name": "spark-cluster", "max_in_flight": 1, "max_attempts": 2,
         "void_exit_codes": [3], "send_timeout_ms": 600_000, "deadline_ms": 660_000,
         "argv": [venv_bin("spark", "python"), driver(), "--jar", hudi_bundle(),
                  "--master", &cluster.master_url]},
    ]);
    p.set("dispatcher", "SLUICE_TARGETS", targets.to_string());
    p.set(
        "dispatcher",
        "SLUICE_COMMAND_DIR",
        runs.display().to_string(),
    );
    const ADMIN: &str = "root-token-0123456789";
    let api = p
        .start_all_with_api(
            tokens_file(&[("root", ADMIN, json!({"*": "admin"}))]),
            ADMIN,
        )
        .await;
    let policy = |id: &str, service: &str, n: u64, options: &str| {
        json!({"id": id, "version": 1, "owner_project": "lake",
         "target": {"kind": "command", "name": "spark-cluster",
                    "parameters": {"path": table, "service": service, "options": options}},
         "condition": {"input": {"asset": EVENTS, "predicates": [
             {"kind": "table_service", "service": service, "strategy": "NUM_COMMITS",
              "num_commits": n}]}}})
    };
    let specs = json!([
        // Hudi plans a log compaction for a file slice of at least this many log blocks.
        policy(
            LOG,
            "log_compaction",
            3,
            "hoodie.log.compaction.blocks.threshold=2"
        ),
        policy(CLUSTER, "clustering", 4, ""),
        // Keep one commit: the file group clustering replaced goes at the next clean.
        policy(CLEAN, "clean", 5, "hoodie.cleaner.commits.retained=1"),
    ]);
    apply(&p, &root, &specs);
    let pool = PgPool::connect(&p.database_url).await.expect("pool");
    let statuses = |dep: &'static str| {
        let pool = pool.clone();
        async move {
            jobs(&pool, dep)
                .await
                .into_iter()
                .map(|(s, _, _)| s)
                .collect::<Vec<_>>()
        }
    };
    // A policy's one run SUCCEEDED, and its one instant completed on the timeline.
    let ran_once = async |dep: &'static str, action: &str, what: &str| {
        wait_for(&format!("the {what} SUCCEEDED"), &p, 300, || async {
            statuses(dep).await == ["SUCCEEDED"]
        })
        .await;
        let done = completed_services(&table, action);
        assert_eq!(done.len(), 1, "one {what} on the timeline: {done:?}");
        done
    };
    let day = "2024-12-01";

    // Three deltacommits (an insert, two updates: two log blocks): log compaction is due.
    let w = write(&table, &[day; 3], None).await;
    let lc = ran_once(LOG, "logcompaction", "log compaction").await;
    let third = instant_ms(&w[2]["completed"].as_i64().expect("completed").to_string());
    println!(
        "[spark] log compaction {} planned {} ms and completed {} ms after the 3rd deltacommit",
        lc[0].0,
        instant_ms(&lc[0].0) - third,
        instant_ms(&lc[0].1) - third
    );
    // Its own deltacommit (operation LOG_COMPACT) is no data commit: the poller
    // keeps it as a log compaction, and it makes no 4th commit for clustering.
    let lc_seq: i64 = lc[0].0.parse().expect("instant");
    wait_for(
        "the log compaction's commit kept as LOG_COMPACT",
        &p,
        60,
        || async {
            let v = api
                .get(&format!("/v1/assets/{EVENTS}/commits?limit=20"))
                .await;
            v["items"].as_array().is_some_and(|items| {
                items
                    .iter()
                    .any(|e| e["sequence"] == lc_seq && e["operation"] == "LOG_COMPACT")
            })
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        statuses(CLUSTER).await.is_empty(),
        "clustering counted the log compaction as a data commit"
    );

    // A 4th deltacommit: clustering is due (the log compaction did not reset it).
    write(&table, &[day], None).await;
    ran_once(CLUSTER, "clustering", "clustering").await;
    assert_eq!(
        statuses(LOG).await.len(),
        1,
        "1 commit since the log compaction"
    );
    assert!(
        statuses(CLEAN).await.is_empty(),
        "4 commits, the clean needs 5"
    );
    let partition = table.join(format!("dt={day}"));
    let file_groups = || -> std::collections::BTreeSet<String> {
        std::fs::read_dir(&partition)
            .expect("partition")
            .filter_map(|e| {
                let n = e.ok()?.file_name().into_string().ok()?;
                let n = n.trim_start_matches('.');
                (n.ends_with(".parquet") || n.contains(".log."))
                    .then(|| n.split('_').next().unwrap_or(n).to_owned())
            })
            .collect()
    };
    let before_clean = file_groups();
    assert_eq!(
        before_clean.len(),
        2,
        "the replaced file group and clustering's new one: {before_clean:?}"
    );

    // A 5th: the clean is due and removes the file group clustering replaced.
    write(&table, &[day], None).await;
    ran_once(CLEAN, "clean", "clean").await;
    let after_clean = file_groups();
    println!("[spark] file groups before the clean {before_clean:?}, after {after_clean:?}");
    assert_eq!(after_clean.len(), 1, "the replaced file group removed");

    // Run the clean now: nothing is old enough, Hudi plans nothing (the driver's
    // exit 3), and the void exit code ends the run at once, not retried.
    let run = std::process::Command::new(service_binary("sluice"))
        .args(["run", CLEAN])
        .env("SLUICE_API_URL", &api.base)
        .env("SLUICE_API_TOKEN", ADMIN)
        .env("SLUICE_CONFIG", root.join("no-config"))
        .output()
        .expect("run sluice");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    wait_for("the clean run now FAILED void", &p, 300, || async {
        statuses(CLEAN)
            .await
            .get(1)
            .is_some_and(|s| s != "PENDING" && s != "RUNNING")
    })
    .await;
    let r = reasons(&pool, CLEAN).await;
    println!("[spark] clean runs: {r:?}");
    assert_eq!(r[1].0, "FAILED", "{r:?}");
    assert!(r[1].1.contains("void"), "ended as void, not retried: {r:?}");
    let attempts = jobs(&pool, CLEAN).await[1].1;
    assert_eq!(attempts, 1, "a void outcome is not retried");
    assert_eq!(completed_services(&table, "clean").len(), 1);
    assert_eq!(statuses(LOG).await, ["SUCCEEDED"]);
    assert_eq!(statuses(CLUSTER).await, ["SUCCEEDED"]);
    println!(
        "[spark] all three services and the void run in {} s",
        started.elapsed().as_secs()
    );
    drop(p);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&root);
}
