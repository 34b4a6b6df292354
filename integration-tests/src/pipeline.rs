//! The four services as separate processes (as in production) on one run's own
//! topics and database, for the end-to-end tests: started, killed with SIGKILL,
//! restarted with the same settings.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_kit::topics::TopicNames;

use crate::{bootstrap, free_port, fresh_database, service_binary, unique};

pub const SERVICES: [&str; 4] = ["ingester", "state-updater", "resolver", "dispatcher"];
pub const TOKEN: &str = "pipeline-token-0123456789";

pub struct Pipeline {
    pub names: TopicNames,
    pub database_url: String,
    pub http_port: u16,
    /// How every process of the run reaches Kafka: the local broker, or one with
    /// TLS and SASL ([`Pipeline::with_kafka`]).
    kafka_env: Vec<(String, String)>,
    env: BTreeMap<&'static str, Vec<(String, String)>>,
    running: BTreeMap<&'static str, (Child, u16)>,
    pub restarts: BTreeMap<&'static str, u32>,
}

impl Pipeline {
    /// A fresh prefix and database; `per_service` adds settings to one service.
    pub async fn new(partitions: i32, per_service: &[(&'static str, &str, String)]) -> Pipeline {
        let names = TopicNames::with_prefix(&format!("{}.", unique("e2e")), partitions);
        let mut env: BTreeMap<&'static str, Vec<(String, String)>> = BTreeMap::new();
        for (service, k, v) in per_service {
            env.entry(service)
                .or_default()
                .push(((*k).to_owned(), v.clone()));
        }
        Pipeline {
            names,
            database_url: fresh_database().await,
            http_port: free_port(),
            kafka_env: vec![("SLUICE_KAFKA_BOOTSTRAP".into(), bootstrap())],
            env,
            running: BTreeMap::new(),
            restarts: BTreeMap::new(),
        }
    }

    /// Every process of the run (the services, the API, the CLI) reaches Kafka
    /// with these settings instead: `SLUICE_KAFKA_BOOTSTRAP` and `SLUICE_RDKAFKA_*`.
    pub fn with_kafka(mut self, env: &[(&str, String)]) -> Self {
        self.kafka_env = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect();
        self
    }

    /// Adds a setting to one service (from its next start on).
    pub fn set(&mut self, service: &'static str, key: &str, value: impl Into<String>) {
        self.env
            .entry(service)
            .or_default()
            .push((key.to_owned(), value.into()));
    }

    fn log_path(&self, service: &str) -> std::path::PathBuf {
        log_path(&self.names.prefix, service)
    }

    /// The service's log file, appended to across restarts.
    fn log_file(&self, service: &str) -> std::io::Result<std::fs::File> {
        let path = self.log_path(service);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    }

    /// The last `lines` WARN / ERROR lines of every service's log.
    pub fn log_tails(&self, lines: usize) -> String {
        log_tails(&self.names.prefix, lines)
    }

    pub fn push_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1/commits", self.http_port)
    }

    /// The settings every service of this run gets (the `sluice` CLI too).
    pub fn common_env(&self) -> Vec<(String, String)> {
        let mut env = self.kafka_env.clone();
        env.push(("SLUICE_TOPIC_PREFIX".into(), self.names.prefix.clone()));
        env.push((
            "SLUICE_TOPIC_PARTITIONS".into(),
            self.names.partitions.to_string(),
        ));
        env
    }

    /// Starts another instance of `service` with this run's settings and waits for
    /// it to exit on its own (killed after `within`): its status, or `None` if it
    /// ran on, and what it said.
    pub async fn run_until_exit(
        &self,
        service: &'static str,
        instance: &str,
        within: Duration,
    ) -> (Option<std::process::ExitStatus>, String) {
        let (mut cmd, _) = self.command(service);
        let out =
            std::env::temp_dir().join(format!("{}{service}-{instance}.out", self.names.prefix));
        let file = std::fs::File::create(&out).expect("output file");
        let mut child = cmd
            .env("SLUICE_INSTANCE", instance)
            .stdout(file.try_clone().expect("output file"))
            .stderr(file)
            .spawn()
            .expect("spawn service");
        let deadline = Instant::now() + within;
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        (status, std::fs::read_to_string(&out).unwrap_or_default())
    }

    fn spawn(&self, service: &'static str) -> (Child, u16) {
        let (mut cmd, admin) = self.command(service);
        cmd.stdout(if std::env::var_os("SLUICE_TEST_SERVICE_LOG").is_some() {
            Stdio::inherit()
        } else {
            self.log_file(service)
                .map_or_else(|_| Stdio::null(), Stdio::from)
        })
        .stderr(Stdio::inherit());
        (cmd.spawn().expect("spawn service"), admin)
    }

    /// The service's command with this run's settings, and its admin port.
    fn command(&self, service: &'static str) -> (Command, u16) {
        let admin = free_port();
        let mut cmd = Command::new(service_binary(&format!("sluice-{service}")));
        cmd.envs(self.common_env())
            // The harness's own switch: the services would report it as unknown.
            .env_remove("SLUICE_TEST_SERVICE_LOG")
            .env("SLUICE_INSTANCE", "0")
            .env("SLUICE_ADMIN_ADDR", format!("127.0.0.1:{admin}"))
            .env("SLUICE_DATABASE_URL", &self.database_url)
            .env(
                "SLUICE_INGEST_HTTP_ADDR",
                format!("127.0.0.1:{}", self.http_port),
            )
            .env(
                "SLUICE_INGEST_TOKENS",
                format!(r#"[{{"name": "e2e", "token": "{TOKEN}", "namespaces": ["*"]}}]"#),
            )
            // Services log to stdout: shown when SLUICE_TEST_SERVICE_LOG asks for
            // logs, else kept in a file per service for `log_tails` (a failure's story).
            .env(
                "SLUICE_LOG",
                std::env::var("SLUICE_TEST_SERVICE_LOG").unwrap_or_else(|_| "info".into()),
            );
        for (k, v) in self.env.get(service).into_iter().flatten() {
            cmd.env(k, v);
        }
        (cmd, admin)
    }

    pub async fn start(&mut self, service: &'static str) {
        let (child, admin) = self.spawn(service);
        self.running.insert(service, (child, admin));
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let ok = client
                .get(format!("http://127.0.0.1:{admin}/health/ready"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ok {
                return;
            }
            let exited = self
                .running
                .get_mut(service)
                .and_then(|(c, _)| c.try_wait().ok().flatten());
            assert!(
                exited.is_none(),
                "sluice-{service} exited at start: {exited:?}"
            );
            assert!(
                Instant::now() < deadline,
                "sluice-{service} not ready in 90 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn start_all(&mut self) {
        for s in SERVICES {
            self.start(s).await;
        }
    }

    /// Starts the four services, then the API on a free port with `tokens_file`;
    /// returns its client, calling as `token`.
    pub async fn start_all_with_api(
        &mut self,
        tokens_file: String,
        token: &str,
    ) -> crate::api::Api {
        let port = free_port();
        self.set("api", "SLUICE_API_ADDR", format!("127.0.0.1:{port}"));
        self.set("api", "SLUICE_API_TOKENS_FILE", tokens_file);
        self.start_all().await;
        // The dispatcher has migrated: the API connects as the least-privileged role
        // the deploy files ship, so a query needing more than they grant fails here.
        let api_url = crate::least_privilege_api_role(&self.database_url).await;
        self.set("api", "SLUICE_DATABASE_URL", api_url);
        self.start("api").await;
        crate::api::Api::new(port, token)
    }

    /// SIGKILL: no shutdown, no flush, no commit.
    pub fn kill(&mut self, service: &'static str) {
        if let Some((mut c, _)) = self.running.remove(service) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub async fn kill_and_restart(&mut self, service: &'static str) {
        self.kill(service);
        *self.restarts.entry(service).or_insert(0) += 1;
        self.start(service).await;
    }

    /// Whether the service's process is still running (not exited on its own).
    pub fn alive(&mut self, service: &str) -> bool {
        self.running
            .get_mut(service)
            .is_some_and(|(c, _)| c.try_wait().ok().flatten().is_none())
    }

    pub fn admin_port(&self, service: &str) -> Option<u16> {
        self.running.get(service).map(|(_, p)| *p)
    }

    /// Runs the `sluice` CLI against this run's topics.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(service_binary("sluice"))
            .args(args)
            .envs(self.common_env())
            .output()
            .expect("run sluice")
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        for (_, (mut c, _)) in std::mem::take(&mut self.running) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn log_path(prefix: &str, service: &str) -> std::path::PathBuf {
    std::env::temp_dir()
        .join("sluice-test-logs")
        .join(format!("{prefix}{service}.log"))
}

/// The last `lines` WARN / ERROR lines of every service's log of the run with
/// topic prefix `prefix` (librdkafka's reconnect noise left out), for a test to
/// print when it fails.
pub fn log_tails(prefix: &str, lines: usize) -> String {
    let mut out = String::new();
    for service in SERVICES.iter().chain(&["api"]) {
        let Ok(text) = std::fs::read_to_string(log_path(prefix, service)) else {
            continue;
        };
        let picked: Vec<&str> = text
            .lines()
            .filter(|l| {
                (l.contains(" WARN ") || l.contains(" ERROR ") || l.contains("rebuilt"))
                    && !l.contains("librdkafka")
                    && !l.contains("read error")
                    && !l.contains("consume error")
            })
            .collect();
        let from = picked.len().saturating_sub(lines);
        out.push_str(&format!(
            "--- sluice-{service} ({}):\n",
            log_path(prefix, service).display()
        ));
        for l in &picked[from..] {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}
