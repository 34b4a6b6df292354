//! The four services as separate processes, as in production: they start against
//! the real stack, become ready, report so on their admin port, and stop cleanly
//! on SIGTERM. A bad configuration is refused with every problem listed.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sluice_integration_tests::{
    bootstrap, database_url, eventually, free_port, http_get, service_binary, unique,
};

const SERVICES: [&str; 4] = [
    "sluice-ingester",
    "sluice-state-updater",
    "sluice-resolver",
    "sluice-dispatcher",
];

fn spawn(name: &str, port: u16, prefix: &str) -> Child {
    Command::new(service_binary(name))
        .env("SLUICE_KAFKA_BOOTSTRAP", bootstrap())
        .env("SLUICE_DATABASE_URL", database_url())
        .env("SLUICE_TOPIC_PREFIX", prefix)
        .env("SLUICE_TOPIC_PARTITIONS", "2")
        .env("SLUICE_ADMIN_ADDR", format!("127.0.0.1:{port}"))
        .env("SLUICE_LOG", "warn")
        // The ingester's HTTP push on a free port, with a token (required while on).
        .env(
            "SLUICE_INGEST_HTTP_ADDR",
            format!("127.0.0.1:{}", free_port()),
        )
        .env(
            "SLUICE_INGEST_TOKENS",
            r#"[{"name": "t", "token": "services-test-0123456789", "namespaces": ["*"]}]"#,
        )
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn service")
}

fn terminate(child: &Child) {
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill")
        .success();
    assert!(ok, "kill -TERM failed");
}

#[tokio::test]
async fn the_four_services_start_become_ready_and_stop_on_sigterm() {
    let prefix = format!("{}.", unique("svc"));
    let mut running = Vec::new();
    for name in SERVICES {
        let port = free_port();
        running.push((name, port, spawn(name, port, &prefix)));
    }
    for (name, port, _) in &running {
        let ready = eventually(Duration::from_secs(60), || async {
            matches!(http_get(*port, "/health/ready").await, Some((200, _)))
        })
        .await;
        assert!(ready, "{name} did not become ready on port {port}");
        let (status, _) = http_get(*port, "/health/live").await.expect("live answers");
        assert_eq!(status, 200, "{name} live");
        let (status, metrics) = http_get(*port, "/metrics").await.expect("metrics answer");
        assert_eq!(status, 200);
        assert!(
            metrics.contains("sluice_service_info"),
            "{name} metrics:\n{metrics}"
        );
    }
    for (_, _, child) in &running {
        terminate(child);
    }
    for (name, _, mut child) in running {
        let mut waited = 0;
        let status = loop {
            if let Some(s) = child.try_wait().expect("wait") {
                break s;
            }
            assert!(waited < 300, "{name} did not exit within 30 s of SIGTERM");
            tokio::time::sleep(Duration::from_millis(100)).await;
            waited += 1;
        };
        assert!(status.success(), "{name} exited with {status}");
    }
}

#[test]
fn a_bad_configuration_lists_every_problem_and_never_prints_the_password() {
    let out = Command::new(service_binary("sluice-dispatcher"))
        .env_clear()
        .env("SLUICE_DATABASE_URL", "mysql://user:hunter2@db/x")
        .env("SLUICE_TOPIC_PARTITIONS", "0")
        .env("SLUICE_ADMIN_ADDR", "not-an-address")
        .env("SLUICE_LOG_FORMAT", "xml")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for expected in [
        "SLUICE_TOPIC_PARTITIONS",
        "SLUICE_ADMIN_ADDR",
        "SLUICE_LOG_FORMAT",
        "SLUICE_DATABASE_URL is not a valid",
    ] {
        assert!(
            stderr.contains(expected),
            "missing {expected:?} in:\n{stderr}"
        );
    }
    assert!(
        !stderr.contains("hunter2"),
        "the password leaked:\n{stderr}"
    );
}
