//! The web UI in a real headless Chromium (Debian's, driven by Playwright from the
//! venv `compose/lib.sh ensure_browser` makes) against the GMV scenario on the
//! four services and the API as processes: the graph, the blocking leaf while the
//! payments are late, a live update without a reload, and the operator's actions
//! that a viewer is refused. The browser side is `integration-tests/ui/check_ui.py`;
//! its screenshots land in the temp dir (a few are kept in `docs/ui/`).

use std::path::PathBuf;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_integration_tests::api::push;
use sluice_integration_tests::pipeline::{Pipeline, TOKEN};
use sluice_integration_tests::{eventually, unique, venv_bin};

const OPERATOR: &str = "gmv-operator-token-0123456789";
const VIEWER: &str = "gmv-viewer-token-0123456789";
const ALL_VIEWER: &str = "all-viewer-token-0123456789";
/// The large graph: this many dependencies, each reading four assets and producing
/// a fifth — 5,000 assets.
const BULK: usize = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ui_shows_the_gmv_cascade_live_and_acts_by_role() {
    let python = venv_bin("ui", "python");
    let tokens = sluice_integration_tests::api::tokens_file(&[
        ("gmv-operator", OPERATOR, json!({"gmv": "operator"})),
        ("gmv-viewer", VIEWER, json!({"gmv": "viewer"})),
        ("all-viewer", ALL_VIEWER, json!({"*": "viewer"})),
    ]);
    let mut p = Pipeline::new(2, &[]).await;
    let api = p.start_all_with_api(tokens, OPERATOR).await;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let specs: Vec<Value> = serde_json::from_str(
        &std::fs::read_to_string(root.join("../compose/gmv/specs.json")).expect("GMV specs"),
    )
    .expect("specs json");
    for spec in &specs {
        let id = spec["id"].as_str().expect("id");
        let (status, v) = api
            .call(
                "PUT",
                &format!("/v1/dependencies/{id}"),
                OPERATOR,
                Some(spec),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
    }
    // The orders commit; the payments are late.
    push(&api.client, &p.push_url(), "lake.ods.order_latest", 1).await;
    assert!(
        eventually(Duration::from_secs(30), || async {
            let (status, _) = api
                .call("GET", "/v1/assets/lake.ods.order_latest", OPERATOR, None)
                .await;
            status == StatusCode::OK
        })
        .await
    );

    let shots = std::env::temp_dir().join(unique("ui-shots"));
    std::fs::create_dir_all(&shots).expect("shots dir");
    let out = tokio::process::Command::new(&python)
        .arg(root.join("ui/check_ui.py"))
        .args([&api.base, VIEWER, OPERATOR, &p.push_url(), TOKEN])
        .arg(&shots)
        .output()
        .await
        .expect("run check_ui.py");
    let said = String::from_utf8_lossy(&out.stdout);
    println!("{said}screenshots in {}", shots.display());
    assert!(
        out.status.success(),
        "the UI as a user sees it:\n{said}{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        p.log_tails(20)
    );
    for name in [
        "graph",
        "dependency-blocked",
        "dependency-triggered",
        "runs",
    ] {
        assert!(shots.join(format!("{name}.png")).exists(), "{name}.png");
    }

    // 5,000 assets: published straight to the dependencies topic (the CLI's
    // bootstrap path), then the graph must stay usable in the browser.
    let bulk: Vec<Value> = (0..BULK)
        .map(|d| {
            let inputs: Vec<Value> = (0..4)
                .map(|k| json!({"input": {"asset": format!("lake.bulk.in_{d:04}_{k}")}}))
                .collect();
            json!({"id": format!("bulk_{d:04}"), "version": 1, "owner_project": "bulk",
                   "target": {"kind": "webhook", "name": "bulk"},
                   "condition": {"all": inputs}, "produces": format!("lake.bulk.out_{d:04}")})
        })
        .collect();
    let file = shots.join("bulk.json");
    std::fs::write(&file, Value::Array(bulk).to_string()).expect("bulk specs");
    let out = p.cli(&["apply", &file.to_string_lossy()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        eventually(Duration::from_secs(60), || async {
            let (_, v) = api
                .call(
                    "GET",
                    "/v1/dependencies?project=bulk&limit=1000",
                    ALL_VIEWER,
                    None,
                )
                .await;
            v["items"].as_array().is_some_and(|a| a.len() == BULK)
        })
        .await,
        "the bulk specs read by the API"
    );
    let out = tokio::process::Command::new(&python)
        .arg(root.join("ui/check_big_graph.py"))
        .args([&api.base, ALL_VIEWER, &BULK.to_string()])
        .arg(&shots)
        .output()
        .await
        .expect("run check_big_graph.py");
    let said = String::from_utf8_lossy(&out.stdout);
    println!("{said}");
    assert!(
        out.status.success(),
        "the large graph:\n{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
