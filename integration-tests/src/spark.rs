//! A Spark standalone cluster — a master and one worker, from the Spark venv's
//! own pyspark (`compose/lib.sh ensure_spark`) — for tests whose table services
//! are `spark-submit`ted to a cluster rather than run in the driver's process.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{eventually, free_port, http_get, venv_bin};

pub struct SparkCluster {
    /// `spark://127.0.0.1:<port>`: what `spark-submit --master` takes.
    pub master_url: String,
    /// The master's web UI port (`/json/` lists the workers).
    pub ui_port: u16,
    dir: PathBuf,
    daemons: Vec<Child>,
}

/// Where pip put Spark (`pyspark/` holds its `bin/` and `jars/`): `spark-class`
/// needs it as SPARK_HOME.
fn spark_home() -> PathBuf {
    let out = Command::new(venv_bin("spark", "python"))
        .args([
            "-c",
            "import os, pyspark; print(os.path.dirname(pyspark.__file__))",
        ])
        .output()
        .expect("ask the Spark venv where pyspark is");
    assert!(out.status.success(), "no pyspark in the Spark venv");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

impl SparkCluster {
    /// Starts the master, then a worker of one core and `worker_memory` (e.g.
    /// `2g`); returns once the master counts the worker alive. Logs go to `dir`.
    pub async fn start(dir: &Path, worker_memory: &str) -> SparkCluster {
        std::fs::create_dir_all(dir.join("work")).expect("spark dir");
        let home = spark_home();
        let (port, ui_port) = (free_port(), free_port());
        let master_url = format!("spark://127.0.0.1:{port}");
        let daemon = |name: &str, args: &[String]| {
            let log = std::fs::File::create(dir.join(format!("{name}.log"))).expect("log");
            Command::new(venv_bin("spark", "spark-class"))
                .args(args)
                .env("SPARK_HOME", &home)
                .env("SPARK_LOCAL_IP", "127.0.0.1")
                .env("SPARK_LOG_DIR", dir)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| panic!("start the Spark {name}: {e}"))
        };
        let mut cluster = SparkCluster {
            master_url: master_url.clone(),
            ui_port,
            dir: dir.to_owned(),
            daemons: Vec::new(),
        };
        let s = |v: &[&str]| v.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
        cluster.daemons.push(daemon(
            "master",
            &s(&[
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--webui-port",
                &ui_port.to_string(),
            ]),
        ));
        cluster
            .until("the Spark master's web UI answers", |j| j.is_some())
            .await;
        let work = dir.join("work").display().to_string();
        cluster.daemons.push(daemon(
            "worker",
            &s(&[
                "org.apache.spark.deploy.worker.Worker",
                &master_url,
                "--host",
                "127.0.0.1",
                "--cores",
                "1",
                "--memory",
                worker_memory,
                "--webui-port",
                &free_port().to_string(),
                "--work-dir",
                &work,
            ]),
        ));
        cluster
            .until("a Spark worker alive", |j| {
                j.and_then(|j| j["aliveworkers"].as_u64()) == Some(1)
            })
            .await;
        cluster
    }

    /// Waits (60 s) until the master's `/json/` satisfies `ok`.
    async fn until(&self, what: &str, ok: impl Fn(Option<serde_json::Value>) -> bool) {
        let port = self.ui_port;
        let up = eventually(Duration::from_secs(60), || async {
            let json = http_get(port, "/json/")
                .await
                .and_then(|(_, body)| serde_json::from_str(&body).ok());
            ok(json)
        })
        .await;
        assert!(up, "{what}: not within 60 s\n{}", self.logs());
    }

    /// The last lines of the master's and the worker's logs.
    pub fn logs(&self) -> String {
        ["master", "worker"]
            .iter()
            .map(|n| {
                let text =
                    std::fs::read_to_string(self.dir.join(format!("{n}.log"))).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                format!(
                    "--- spark {n} ---\n{}",
                    lines[lines.len().saturating_sub(15)..].join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for SparkCluster {
    fn drop(&mut self) {
        // `spark-class` execs the JVM: the child is the daemon itself. SIGTERM
        // first, so the worker stops its executors; SIGKILL what is left after 10 s.
        for d in self.daemons.iter_mut().rev() {
            let _ = Command::new("kill").arg(d.id().to_string()).status();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while d.try_wait().ok().flatten().is_none() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = d.kill();
            let _ = d.wait();
        }
    }
}
