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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ui_shows_the_gmv_cascade_live_and_acts_by_role() {
    let python = venv_bin("ui", "python");
    let tokens = sluice_integration_tests::api::tokens_file(&[
        ("gmv-operator", OPERATOR, json!({"gmv": "operator"})),
        ("gmv-viewer", VIEWER, json!({"gmv": "viewer"})),
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
}
