//! The GMV cascade of the DolphinScheduler RFC end to end, as the README's main job runs it
//! (`compose/gmv/`): the four services as processes over the real broker and
//! PostgreSQL, real Iceberg tables written by pyiceberg, ODS orders pushed over
//! HTTP and payments found by the poller, each layer a local-command target that
//! writes and commits the next table. Every layer runs once per cascade.

use std::path::PathBuf;
use std::process::Command;

use sluice_integration_tests::pipeline::{Pipeline, TOKEN};
use sluice_integration_tests::{unique, venv_bin};
use sqlx::PgPool;

fn gmv_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../compose/gmv")
}

fn python() -> PathBuf {
    venv_bin("lake", "python")
}

/// Runs `setup.py` and returns (SLUICE_POLL_TABLES, SLUICE_TARGETS).
fn setup(warehouse: &str) -> (String, String) {
    let out = Command::new(python())
        .current_dir(gmv_dir())
        .args(["setup.py", warehouse])
        .arg(python())
        .arg(gmv_dir().join("layer.py"))
        .output()
        .expect("setup.py");
    assert!(
        out.status.success(),
        "setup.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let value = |name: &str| {
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("export {name}=")))
            .unwrap_or_else(|| panic!("{name} in setup.py output: {text}"));
        line.trim_matches('\'').to_owned()
    };
    (value("SLUICE_POLL_TABLES"), value("SLUICE_TARGETS"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gmv_cascade_runs_each_layer_once_per_cascade_on_snapshot_advancement_alone() {
    let warehouse = std::env::temp_dir().join(unique("gmv")).join("warehouse");
    let warehouse = warehouse.to_string_lossy().into_owned();
    let (tables, targets) = setup(&warehouse);
    let mut p = Pipeline::new(4, &[]).await;
    p.set("ingester", "SLUICE_POLL_TABLES", tables);
    p.set("dispatcher", "SLUICE_TARGETS", targets);
    let push = p.push_url();
    p.set("dispatcher", "SLUICE_PUSH_URL", push.clone());
    p.set("dispatcher", "SLUICE_PUSH_TOKEN", TOKEN);
    p.start_all().await;
    let applied = p.cli(&["apply", &gmv_dir().join("specs.json").to_string_lossy()]);
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;

    let drive = Command::new(python())
        .current_dir(gmv_dir())
        .args(["drive.py", &warehouse, "3", "--timeout", "120"])
        .env("SLUICE_PUSH_URL", &push)
        .env("SLUICE_PUSH_TOKEN", TOKEN)
        .output()
        .expect("drive.py");
    let log = String::from_utf8_lossy(&drive.stdout).into_owned();
    println!("{log}");
    assert!(
        drive.status.success(),
        "the cascade: {log}{}",
        String::from_utf8_lossy(&drive.stderr)
    );
    assert!(log.contains("gmv_total 330.00 over 15 orders"), "{log}");

    // Exactly once per layer per cascade: round 1 and round 3 (round 2's payments
    // were late, so the ALL waited and round 3 carries both rounds).
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let pool = PgPool::connect(&p.database_url).await.expect("pool");
    let rows: Vec<(String, String, i32, i64)> = sqlx::query_as(
        "SELECT j.target_name, j.status, j.attempt, count(*) OVER (PARTITION BY j.target_name) \
         FROM jobs j JOIN trigger_history t USING (trigger_key) ORDER BY t.recorded_at",
    )
    .fetch_all(&pool)
    .await
    .expect("jobs");
    println!("jobs: {rows:?}");
    assert_eq!(rows.len(), 6, "{rows:?}");
    for (target, status, attempt, per_target) in &rows {
        assert_eq!(
            (status.as_str(), *attempt, *per_target),
            ("SUCCEEDED", 1, 2),
            "{target}"
        );
    }
    let _ = std::fs::remove_dir_all(PathBuf::from(&warehouse).parent().expect("run dir"));
}
