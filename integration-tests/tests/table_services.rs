//! Table services on a real Hudi table: a MERGE_ON_READ table written by Spark
//! (pyspark + Hudi 1.0.2's bundle), its commits reaching Sluice by Hudi's own HTTP
//! write-commit callback and by the poller, a `NUM_COMMITS` compaction policy
//! applied like any dependency, and the compaction run by Spark through the
//! shipped driver (`services/dispatcher/engines/hudi_table_service.py`) as a
//! `command` target — with the dispatcher killed (SIGKILL) during the compaction.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_integration_tests::pipeline::{Pipeline, TOKEN};
use sluice_integration_tests::{http_get, hudi_bundle, unique, venv_bin};
use sqlx::PgPool;

const TABLE: &str = "lake.ods.orders";
const POLICY: &str = "orders-compaction";
const BUSINESS: &str = "orders-report";

fn driver() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../services/dispatcher/engines/hudi_table_service.py")
}

/// `(requested, completed)` of every completed compaction on the table's timeline:
/// a `commit` whose requested instant was planned as a `compaction`.
fn compactions(table: &Path) -> Vec<(String, String)> {
    let tl = table.join(".hoodie/timeline");
    let names: Vec<String> = std::fs::read_dir(&tl)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    let mut out: Vec<(String, String)> = names
        .iter()
        .filter_map(|n| {
            let (stem, action) = n.split_once('.')?;
            let (req, done) = stem.split_once('_')?;
            (action == "commit" && names.contains(&format!("{req}.compaction.requested")))
                .then(|| (req.to_owned(), done.to_owned()))
        })
        .collect();
    out.sort();
    out
}

/// Writes one upsert per element of `days` (each a deltacommit) with Spark; with
/// `callback`, Hudi's HTTP write-commit callback posts each to the ingester.
/// Returns the writer's line per commit.
async fn write(table: &Path, days: &[&str], callback: Option<String>) -> Vec<Value> {
    let mut cmd = tokio::process::Command::new(venv_bin("spark", "python"));
    cmd.arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("lake/hudi_spark.py"))
        .arg(hudi_bundle())
        .arg(table)
        .args(["orders", "MERGE_ON_READ"])
        .args(days);
    if let Some(url) = callback {
        cmd.env("HUDI_CALLBACK_URL", url)
            .env("HUDI_CALLBACK_KEY", TOKEN);
    }
    let out = cmd.output().await.expect("run hudi_spark.py");
    assert!(
        out.status.success(),
        "hudi_spark.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("writer line"))
        .collect()
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
    let file = root.join("specs.json");
    std::fs::write(&file, specs.to_string()).expect("specs");
    let applied = p.cli(&["apply", &file.to_string_lossy()]);
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
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
