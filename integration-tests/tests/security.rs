//! Kafka with TLS and SASL: a broker of its own (the stack's Kafka jars, KRaft)
//! with an SSL listener and a SASL_SSL listener whose SCRAM users are set at
//! format time, certificates made here with the openssl CLI. The four services and
//! the CLI run the whole path over SASL_SSL (a commit pushed, folded, resolved,
//! dispatched to a webhook); hook topics compressed with zstd and gzip are read; a
//! wrong password stops a service at start with the reason, not a hang. And
//! PostgreSQL over TLS with `sslmode=verify-full` (the stack's server has a
//! certificate made by `compose/stack.sh`): the dispatcher runs on it, and a
//! server its CA file does not vouch for is refused.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::post;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::json;
use sluice_integration_tests::api::push;
use sluice_integration_tests::pipeline::Pipeline;
use sluice_integration_tests::{eventually, free_port, service_binary, unique};

const USER: &str = "sluice-svc";
const PASSWORD: &str = "scram-test-password-42";

/// The stack's Kafka jars (`compose/stack.sh` resolves them from Maven Central).
fn kafka_classpath() -> String {
    let stack = std::env::var_os("SLUICE_STACK_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.stack"));
    let libs = std::fs::read_dir(stack.join("kafka"))
        .expect("the stack's kafka directory (compose/stack.sh up)")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libs-"))
        })
        .expect("the Kafka jars under .stack/kafka/libs-*");
    format!("{}/*", libs.display())
}

fn run(dir: &Path, program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The principals of the shipped ACL set (`User:sluice-<service>`), each a SCRAM
/// user of the broker with authorization on.
const PRINCIPALS: [&str; 6] = [
    "ingester",
    "state-updater",
    "resolver",
    "dispatcher",
    "api",
    "cli",
];

/// A single-node KRaft broker with SASL_SSL (SCRAM-SHA-512 / -256) and SSL
/// listeners; killed when dropped. With `authorize`, the StandardAuthorizer
/// decides by ACLs: `USER` (and the unauthenticated inter-broker, controller and
/// SSL listeners of this test broker) are super users, and each of
/// [`PRINCIPALS`] may do only what ACLs grant it.
struct SecureBroker {
    dir: PathBuf,
    sasl_ssl: u16,
    ssl: u16,
    child: Child,
}

impl SecureBroker {
    fn start(authorize: bool) -> SecureBroker {
        let dir = std::env::temp_dir().join(unique("secure-kafka"));
        std::fs::create_dir_all(dir.join("data")).expect("dir");
        // A CA, and the broker's certificate for 127.0.0.1 signed by it, as PKCS12.
        let (ca, cert, key) = sluice_integration_tests::tls_files(&dir);
        run(
            &dir,
            "openssl",
            &[
                "pkcs12",
                "-export",
                "-in",
                &cert.display().to_string(),
                "-inkey",
                &key.display().to_string(),
                "-certfile",
                &ca.display().to_string(),
                "-out",
                "broker.p12",
                "-passout",
                "pass:changeit",
                "-name",
                "broker",
            ],
        );
        let (sasl_ssl, ssl, internal, controller) =
            (free_port(), free_port(), free_port(), free_port());
        let d = dir.display();
        let properties = format!(
            "process.roles=broker,controller\n\
             node.id=1\n\
             controller.quorum.voters=1@127.0.0.1:{controller}\n\
             listeners=SASL_SSL://127.0.0.1:{sasl_ssl},SSL://127.0.0.1:{ssl},INTERNAL://127.0.0.1:{internal},CONTROLLER://127.0.0.1:{controller}\n\
             advertised.listeners=SASL_SSL://127.0.0.1:{sasl_ssl},SSL://127.0.0.1:{ssl},INTERNAL://127.0.0.1:{internal}\n\
             listener.security.protocol.map=SASL_SSL:SASL_SSL,SSL:SSL,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT\n\
             controller.listener.names=CONTROLLER\n\
             inter.broker.listener.name=INTERNAL\n\
             sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256\n\
             listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;\n\
             listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;\n\
             ssl.keystore.type=PKCS12\n\
             ssl.keystore.location={d}/broker.p12\n\
             ssl.keystore.password=changeit\n\
             ssl.key.password=changeit\n\
             log.dirs={d}/data\n\
             num.partitions=1\n\
             auto.create.topics.enable=false\n\
             offsets.topic.replication.factor=1\n\
             offsets.topic.num.partitions=4\n\
             transaction.state.log.replication.factor=1\n\
             transaction.state.log.min.isr=1\n\
             transaction.state.log.num.partitions=4\n\
             group.initial.rebalance.delay.ms=0\n"
        );
        let properties = if authorize {
            format!(
                "{properties}authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer\n\
                 super.users=User:{USER};User:ANONYMOUS\n"
            )
        } else {
            properties
        };
        std::fs::write(dir.join("server.properties"), properties).expect("properties");
        let java = |args: &[&str]| {
            let mut c = Command::new("java");
            c.args(["-Xms128m", "-Xmx512m", "-cp", &kafka_classpath()])
                .args(args)
                .current_dir(&dir);
            c
        };
        let id = java(&["kafka.tools.StorageTool", "random-uuid"])
            .output()
            .expect("random-uuid");
        let id = String::from_utf8_lossy(&id.stdout).trim().to_owned();
        let scram = format!("SCRAM-SHA-512=[name={USER},password={PASSWORD}]");
        let scram256 = format!("SCRAM-SHA-256=[name={USER},password={PASSWORD}]");
        let mut format = vec![
            "kafka.tools.StorageTool".to_owned(),
            "format".into(),
            "-t".into(),
            id,
            "-c".into(),
            "server.properties".into(),
            "--add-scram".into(),
            scram,
            "--add-scram".into(),
            scram256,
        ];
        if authorize {
            for p in PRINCIPALS {
                format.push("--add-scram".into());
                format.push(format!(
                    "SCRAM-SHA-512=[name=sluice-{p},password={PASSWORD}]"
                ));
            }
        }
        let format: Vec<&str> = format.iter().map(String::as_str).collect();
        let out = java(&format).output().expect("format");
        assert!(
            out.status.success(),
            "format: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let log = std::fs::File::create(dir.join("broker.log")).expect("log");
        let child = java(&["kafka.Kafka", "server.properties"])
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start the broker");
        SecureBroker {
            dir,
            sasl_ssl,
            ssl,
            child,
        }
    }

    /// The settings a service needs for the SASL_SSL listener, as `SLUICE_*` variables.
    fn env(&self, password: &str) -> Vec<(&'static str, String)> {
        vec![
            (
                "SLUICE_KAFKA_BOOTSTRAP",
                format!("127.0.0.1:{}", self.sasl_ssl),
            ),
            ("SLUICE_RDKAFKA_SECURITY_PROTOCOL", "SASL_SSL".into()),
            ("SLUICE_RDKAFKA_SASL_MECHANISM", "SCRAM-SHA-512".into()),
            ("SLUICE_RDKAFKA_SASL_USERNAME", USER.into()),
            ("SLUICE_RDKAFKA_SASL_PASSWORD", password.into()),
            (
                "SLUICE_RDKAFKA_SSL_CA_LOCATION",
                self.dir.join("ca.pem").display().to_string(),
            ),
        ]
    }

    /// A client of the SASL_SSL listener (`SCRAM-SHA-256` when asked) or, without
    /// a mechanism, of the SSL listener.
    fn client(&self, mechanism: Option<&str>) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set(
            "ssl.ca.location",
            self.dir.join("ca.pem").display().to_string(),
        );
        match mechanism {
            Some(m) => c
                .set("bootstrap.servers", format!("127.0.0.1:{}", self.sasl_ssl))
                .set("security.protocol", "SASL_SSL")
                .set("sasl.mechanism", m)
                .set("sasl.username", USER)
                .set("sasl.password", PASSWORD),
            None => c
                .set("bootstrap.servers", format!("127.0.0.1:{}", self.ssl))
                .set("security.protocol", "SSL"),
        };
        c
    }

    /// Waits until the SASL_SSL listener answers (SCRAM-SHA-256).
    async fn wait_up(&self) {
        let up = eventually(Duration::from_secs(120), || async {
            let admin: AdminClient<DefaultClientContext> =
                self.client(Some("SCRAM-SHA-256")).create().expect("admin");
            admin
                .inner()
                .fetch_metadata(None, Duration::from_secs(3))
                .is_ok()
        })
        .await;
        assert!(
            up,
            "the secure broker did not come up:\n{}",
            self.log_tail()
        );
    }

    /// Runs `kafka-acls` (Kafka's AclCommand) as the super user.
    fn kafka_acls_command(&self) -> PathBuf {
        let config = self.dir.join("admin.properties");
        std::fs::write(
            &config,
            format!(
                "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n\
                 sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"{USER}\" password=\"{PASSWORD}\";\n\
                 ssl.truststore.type=PEM\nssl.truststore.location={}\n",
                self.dir.join("ca.pem").display()
            ),
        )
        .expect("admin.properties");
        let wrapper = self.dir.join("kafka-acls");
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nexec java -Xms64m -Xmx256m -XX:TieredStopAtLevel=1 -Xshare:auto -cp '{}' org.apache.kafka.tools.AclCommand \"$@\"\n",
                kafka_classpath()
            ),
        )
        .expect("wrapper");
        run(&self.dir, "chmod", &["+x", &wrapper.display().to_string()]);
        wrapper
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("broker.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for SecureBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn create_topics(config: &ClientConfig, topics: &[&str]) {
    let admin: AdminClient<DefaultClientContext> = config.create().expect("admin");
    let new: Vec<NewTopic> = topics
        .iter()
        .map(|t| NewTopic::new(t, 1, TopicReplication::Fixed(1)))
        .collect();
    for r in admin
        .create_topics(&new, &AdminOptions::new())
        .await
        .expect("create topics")
    {
        r.expect("topic created");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipeline_runs_over_sasl_ssl_and_reads_compressed_hooks() {
    let broker = SecureBroker::start(false);
    // Both listeners answer once the broker is up: SCRAM-SHA-256 on SASL_SSL, and SSL.
    broker.wait_up().await;
    let ssl: AdminClient<DefaultClientContext> = broker.client(None).create().expect("ssl admin");
    assert!(
        ssl.inner()
            .fetch_metadata(None, Duration::from_secs(10))
            .is_ok(),
        "the SSL listener"
    );

    // A wrong password stops a service at start, saying why.
    let started = Instant::now();
    let mut wrong = Command::new(service_binary("sluice-state-updater"));
    for (k, v) in broker.env("not-the-password") {
        wrong.env(k, v);
    }
    let log = broker.dir.join("wrong-password.log");
    let file = std::fs::File::create(&log).expect("log");
    let mut child = wrong
        .env("SLUICE_TOPIC_PREFIX", format!("{}.", unique("wrong")))
        .env("SLUICE_ADMIN_ADDR", format!("127.0.0.1:{}", free_port()))
        .env("SLUICE_KAFKA_REQUEST_TIMEOUT_MS", "20000")
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("log"))
        .stderr(file)
        .spawn()
        .expect("state-updater");
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    let status =
        status.unwrap_or_else(|| panic!("still running after 60 s: a hang, not an error:\n{said}"));
    assert!(!status.success(), "refused: {said}");
    assert!(
        said.contains("the broker refused this service") && said.contains("Authentication failed"),
        "the reason names authentication: {said}"
    );
    println!(
        "a wrong password: exit {:?} after {:.1} s",
        status.code(),
        started.elapsed().as_secs_f64()
    );

    // The whole path over SASL_SSL: push → fold → resolve → dispatch.
    let sends: Arc<Mutex<Vec<String>>> = Arc::default();
    let got = sends.clone();
    let port = sluice_integration_tests::serve(axum::Router::new().route(
        "/hook",
        post(move |body: String| {
            let got = got.clone();
            async move {
                got.lock().expect("lock").push(body);
                "ok"
            }
        }),
    ))
    .await;
    let hooks = [unique("hook-zstd"), unique("hook-gzip")];
    create_topics(
        &broker.client(Some("SCRAM-SHA-512")),
        &[&hooks[0], &hooks[1]],
    )
    .await;
    let env = broker.env(PASSWORD);
    let mut p = Pipeline::new(2, &[]).await.with_kafka(&env);
    p.set(
        "dispatcher",
        "SLUICE_TARGETS",
        format!(r#"[{{"kind": "webhook", "name": "*", "url": "http://127.0.0.1:{port}/hook", "idempotent": true}}]"#),
    );
    p.set(
        "ingester",
        "SLUICE_HOOK_TOPICS",
        json!([{"topic": hooks[0], "format": "json"}, {"topic": hooks[1], "format": "json"}])
            .to_string(),
    );
    p.start_all().await;
    let specs = std::env::temp_dir().join(unique("secure-specs.json"));
    let spec = |id: &str, asset: &str| {
        json!({"id": id, "version": 1, "owner_project": "p",
               "target": {"kind": "webhook", "name": id},
               "condition": {"input": {"asset": asset}}})
    };
    std::fs::write(
        &specs,
        json!([
            spec("pushed", "lake.sec.pushed"),
            spec("zstd", "lake.sec.zstd"),
            spec("gzip", "lake.sec.gzip")
        ])
        .to_string(),
    )
    .expect("specs");
    // The CLI over SASL_SSL too (its bootstrap path writes the topic itself).
    let out = p.cli(&["apply", &specs.to_string_lossy()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    push(&reqwest::Client::new(), &p.push_url(), "lake.sec.pushed", 1).await;
    // Commit notices on hook topics, one compressed with zstd and one with gzip.
    for (topic, codec, asset) in [
        (&hooks[0], "zstd", "lake.sec.zstd"),
        (&hooks[1], "gzip", "lake.sec.gzip"),
    ] {
        let producer: FutureProducer = broker
            .client(Some("SCRAM-SHA-512"))
            .set("compression.type", codec)
            .create()
            .expect("producer");
        let notice = json!({"asset_key": asset, "format": "iceberg", "snapshot_id": 7,
                            "sequence": 1, "commit_time_ms": 1_764_633_600_000i64,
                            "operation": "append"})
        .to_string();
        producer
            .send(
                FutureRecord::to(topic).key(asset).payload(&notice),
                Duration::from_secs(10),
            )
            .await
            .expect("produced");
    }
    let all = eventually(Duration::from_secs(90), || async {
        let s = sends.lock().expect("lock");
        ["pushed", "zstd", "gzip"].iter().all(|id| {
            s.iter()
                .any(|b| b.contains(&format!("\"dependency_id\":\"{id}\"")))
        })
    })
    .await;
    assert!(
        all,
        "every dependency dispatched over SASL_SSL: {:?}\n{}",
        sends.lock().expect("lock"),
        p.log_tails(20)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgresql_is_reached_over_tls_with_verify_full() {
    let ca = std::env::var("SLUICE_TEST_PG_CA")
        .expect("SLUICE_TEST_PG_CA: the stack's PostgreSQL CA (compose/stack.sh env)");
    let mut p = Pipeline::new(1, &[]).await;
    let tls = format!("{}?sslmode=verify-full&sslrootcert={ca}", p.database_url);
    let database = p.database_url.rsplit('/').next().expect("name").to_owned();
    // The dispatcher migrates and works over TLS, verifying the server's name.
    p.set("dispatcher", "SLUICE_DATABASE_URL", tls.clone());
    p.start("dispatcher").await;
    let pool = sqlx::PgPool::connect(&tls).await.expect("connect over TLS");
    let (total, encrypted): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE s.ssl) FROM pg_stat_activity a
         JOIN pg_stat_ssl s USING (pid) WHERE a.datname = $1",
    )
    .bind(&database)
    .fetch_one(&pool)
    .await
    .expect("pg_stat_ssl");
    assert!(
        total >= 2,
        "the dispatcher's and this test's connections: {total}"
    );
    assert_eq!(encrypted, total, "every connection to the database is TLS");
    let migrated: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations")
        .fetch_one(&pool)
        .await
        .expect("migrations");
    assert!(
        migrated >= 7,
        "the dispatcher migrated over TLS: {migrated}"
    );
    // A CA that did not sign the server's certificate: refused, saying so.
    let (other_ca, _, _) =
        sluice_integration_tests::tls_files(&std::env::temp_dir().join(unique("other-ca")));
    let other = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        p.database_url,
        other_ca.display()
    );
    let err = sqlx::PgPool::connect(&other)
        .await
        .expect_err("an unknown CA is refused")
        .to_string();
    assert!(
        err.to_lowercase().contains("certificate") || err.contains("UnknownIssuer"),
        "the reason names the certificate: {err}"
    );
}

/// The shipped ACL set (`deploy/kafka/acls.sh`, run with Kafka's own
/// `kafka-acls`) on a broker whose StandardAuthorizer denies what no ACL allows:
/// the four services, the API and the CLI each as their own SCRAM principal
/// carry a commit, a hook notice and a run now to the webhook. Then one ACL is
/// taken away and a new resolver instance refuses to start, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipeline_runs_under_exactly_its_acls_and_a_missing_one_is_named() {
    let broker = SecureBroker::start(true);
    broker.wait_up().await;
    let sends: Arc<Mutex<Vec<String>>> = Arc::default();
    let got = sends.clone();
    let port = sluice_integration_tests::serve(axum::Router::new().route(
        "/hook",
        post(move |body: String| {
            let got = got.clone();
            async move {
                got.lock().expect("lock").push(body);
                "ok"
            }
        }),
    ))
    .await;
    let hook = unique("acl-hook");
    create_topics(&broker.client(Some("SCRAM-SHA-512")), &[&hook]).await;

    let mut env = broker.env(PASSWORD);
    for (k, v) in &mut env {
        if *k == "SLUICE_RDKAFKA_SASL_USERNAME" {
            *v = "sluice-cli".into();
        }
    }
    let mut p = Pipeline::new(2, &[]).await.with_kafka(&env);
    let prefix = p
        .common_env()
        .into_iter()
        .find(|(k, _)| k == "SLUICE_TOPIC_PREFIX")
        .map(|(_, v)| v)
        .expect("prefix");
    for s in ["ingester", "state-updater", "resolver", "dispatcher", "api"] {
        p.set(s, "SLUICE_RDKAFKA_SASL_USERNAME", format!("sluice-{s}"));
    }

    // The ACLs exactly as shipped, for this run's prefix and hook topic.
    let kafka_acls = broker.kafka_acls_command();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/kafka/acls.sh");
    let started = Instant::now();
    let out = Command::new("bash")
        .arg(&script)
        .env("BOOTSTRAP", format!("127.0.0.1:{}", broker.sasl_ssl))
        .env("COMMAND_CONFIG", broker.dir.join("admin.properties"))
        .env("PREFIX", &prefix)
        .env("HOOK_TOPICS", &hook)
        .env("KAFKA_ACLS", &kafka_acls)
        .output()
        .expect("acls.sh");
    assert!(
        out.status.success(),
        "deploy/kafka/acls.sh: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!(
        "deploy/kafka/acls.sh applied in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    p.set(
        "dispatcher",
        "SLUICE_TARGETS",
        format!(r#"[{{"kind": "webhook", "name": "*", "url": "http://127.0.0.1:{port}/hook", "idempotent": true}}]"#),
    );
    p.set(
        "ingester",
        "SLUICE_HOOK_TOPICS",
        json!([{"topic": hook, "format": "json"}]).to_string(),
    );
    // The database least-privileged too: the dispatcher as the owner role of
    // deploy/postgres/roles.sql (no superuser), the API with api-grants.sql only.
    let owner = sluice_integration_tests::least_privilege_dispatcher_role(&p.database_url).await;
    p.set("dispatcher", "SLUICE_DATABASE_URL", owner);
    const ADMIN: &str = "acl-admin-token";
    let tokens =
        sluice_integration_tests::api::tokens_file(&[("root", ADMIN, json!({"*": "admin"}))]);
    let api = p.start_all_with_api(tokens, ADMIN).await;

    // The CLI writes the specs over its own principal.
    let specs = std::env::temp_dir().join(unique("acl-specs.json"));
    let spec = |id: &str, asset: &str| {
        json!({"id": id, "version": 1, "owner_project": "p",
               "target": {"kind": "webhook", "name": id},
               "condition": {"input": {"asset": asset}}})
    };
    std::fs::write(
        &specs,
        json!([
            spec("pushed", "lake.acl.pushed"),
            spec("hooked", "lake.acl.hooked")
        ])
        .to_string(),
    )
    .expect("specs");
    let out = p.cli(&["apply", &specs.to_string_lossy()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = eventually(Duration::from_secs(30), || async {
        api.get("/v1/dependencies")
            .await
            .to_string()
            .contains("hooked")
    })
    .await;
    assert!(listed, "the API reads the dependencies under its ACLs");
    tokio::time::sleep(Duration::from_secs(2)).await;
    push(&reqwest::Client::new(), &p.push_url(), "lake.acl.pushed", 1).await;
    let producer: FutureProducer = broker
        .client(Some("SCRAM-SHA-512"))
        .create()
        .expect("producer");
    let notice = json!({"asset_key": "lake.acl.hooked", "format": "iceberg", "snapshot_id": 7,
                        "sequence": 1, "commit_time_ms": 1_764_633_600_000i64,
                        "operation": "append"})
    .to_string();
    producer
        .send(
            FutureRecord::to(&hook)
                .key("lake.acl.hooked")
                .payload(&notice),
            Duration::from_secs(10),
        )
        .await
        .expect("produced");
    let fired = |id: &'static str| {
        let sends = sends.clone();
        move || {
            let sends = sends.clone();
            async move {
                sends
                    .lock()
                    .expect("lock")
                    .iter()
                    .any(|b| b.contains(&format!("\"dependency_id\":\"{id}\"")))
            }
        }
    };
    let both = eventually(Duration::from_secs(90), || async {
        fired("pushed")().await && fired("hooked")().await
    })
    .await;
    assert!(
        both,
        "both dispatched under the ACLs: {:?}\n{}",
        sends.lock().expect("lock"),
        p.log_tails(20)
    );
    // Run now through the API: it writes a trigger under its own principal.
    let before = sends.lock().expect("lock").len();
    api.post(
        "/v1/dependencies/pushed/runs",
        json!({"request_id": "acl-1"}),
    )
    .await;
    let ran = eventually(Duration::from_secs(30), || async {
        sends.lock().expect("lock").len() > before
    })
    .await;
    assert!(ran, "the run now was dispatched\n{}", p.log_tails(20));

    let pool = sqlx::PgPool::connect(&p.database_url)
        .await
        .expect("connect");
    let foreign: Vec<(String, String)> = sqlx::query_as(
        "SELECT tablename::text, tableowner::text FROM pg_tables
         WHERE schemaname = 'public' AND tableowner <> 'sluice_dispatcher'",
    )
    .fetch_all(&pool)
    .await
    .expect("pg_tables");
    assert!(
        foreign.is_empty(),
        "every table is the dispatcher role's: {foreign:?}"
    );

    // One ACL taken away: a new resolver instance stops at start and names it.
    let triggers = format!("{prefix}triggers");
    let out = Command::new(&kafka_acls)
        .args([
            "--bootstrap-server",
            &format!("127.0.0.1:{}", broker.sasl_ssl),
            "--command-config",
            &broker.dir.join("admin.properties").display().to_string(),
            "--remove",
            "--force",
            "--allow-principal",
            "User:sluice-resolver",
            "--operation",
            "Write",
            "--topic",
            &triggers,
        ])
        .output()
        .expect("kafka-acls --remove");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (status, said) = p
        .run_until_exit("resolver", "1", Duration::from_secs(60))
        .await;
    let status = status.unwrap_or_else(|| panic!("ran on without the ACL:\n{said}"));
    assert!(!status.success(), "{said}");
    assert!(
        said.contains(&format!("principal Write on topic {triggers};")),
        "the error names the operation and the topic: {said}"
    );
    // The services already running keep their promise (none exited).
    for s in ["ingester", "state-updater", "dispatcher", "api"] {
        assert!(p.alive(s), "{s} is still running");
    }
}
