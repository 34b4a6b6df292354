//! Helpers for tests that run against the real stack started by `compose/stack.sh`.
//!
//! Every test takes fresh names (topic prefix, group, transactional id, database)
//! from [`unique`], so tests never see each other's data and can run in parallel.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub mod api;
pub mod pipeline;
pub mod registry;
pub mod spark;

/// The broker, from `SLUICE_KAFKA_BOOTSTRAP` (set by `compose/test.sh`).
pub fn bootstrap() -> String {
    std::env::var("SLUICE_KAFKA_BOOTSTRAP")
        .expect("SLUICE_KAFKA_BOOTSTRAP is not set: run the tests with compose/test.sh (it starts Kafka and PostgreSQL)")
}

/// The PostgreSQL server, from `SLUICE_DATABASE_URL` (set by `compose/test.sh`).
pub fn database_url() -> String {
    std::env::var("SLUICE_DATABASE_URL")
        .expect("SLUICE_DATABASE_URL is not set: run the tests with compose/test.sh (it starts Kafka and PostgreSQL)")
}

/// A name no other test (in this run or an earlier one) uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}-{}-{n}", &id[..10])
}

/// A fresh, empty database on the test server; returns its URL.
pub async fn fresh_database() -> String {
    use sqlx::Connection;
    let base = database_url();
    let name = unique("t").replace('-', "_");
    let mut conn = sqlx::PgConnection::connect(&base)
        .await
        .expect("connect to the test PostgreSQL");
    // The name is generated here from a UUID: nothing outside the test reaches it.
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut conn)
        .await
        .expect("create database");
    let (root, _) = base.rsplit_once('/').expect("database URL has a path");
    format!("{root}/{name}")
}

/// Makes the database of `database_url` owned by `sluice_dispatcher`, a login
/// role that is no superuser and can create neither roles nor databases, as
/// `deploy/postgres/roles.sql` makes it; the URL that logs in as it.
pub async fn least_privilege_dispatcher_role(database_url: &str) -> String {
    use sqlx::Connection;
    const PASSWORD: &str = "sluice-dispatcher-test";
    let mut conn = sqlx::PgConnection::connect(database_url)
        .await
        .expect("connect to the test database");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DO $$ BEGIN CREATE ROLE sluice_dispatcher LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE \
         PASSWORD '{PASSWORD}'; \
         EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
    )))
    .execute(&mut conn)
    .await
    .expect("create the sluice_dispatcher role");
    let database = database_url.rsplit('/').next().expect("a database name");
    let database = database.split('?').next().unwrap_or(database);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "ALTER DATABASE \"{database}\" OWNER TO sluice_dispatcher; \
         ALTER SCHEMA public OWNER TO sluice_dispatcher; \
         REVOKE CREATE ON SCHEMA public FROM PUBLIC;"
    )))
    .execute(&mut conn)
    .await
    .expect("give the database to sluice_dispatcher");
    let (scheme, rest) = database_url.split_once("://").expect("a URL");
    let host_and_db = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    format!("{scheme}://sluice_dispatcher:{PASSWORD}@{host_and_db}")
}

/// Gives the `sluice_api` role (made once per server) the grants of
/// `deploy/postgres/api-grants.sql` in `database_url`'s database; returns the URL
/// that connects to it as that role.
pub async fn least_privilege_api_role(database_url: &str) -> String {
    use sqlx::Connection;
    const PASSWORD: &str = "sluice-api-test";
    let mut conn = sqlx::PgConnection::connect(database_url)
        .await
        .expect("connect to the test database");
    // Parallel tests race to make the role: whoever loses finds it made.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DO $$ BEGIN CREATE ROLE sluice_api LOGIN PASSWORD '{PASSWORD}'; \
         EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
    )))
    .execute(&mut conn)
    .await
    .expect("create the sluice_api role");
    let grants = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/postgres/api-grants.sql"),
    )
    .expect("read deploy/postgres/api-grants.sql");
    sqlx::raw_sql(sqlx::AssertSqlSafe(grants))
        .execute(&mut conn)
        .await
        .expect("apply deploy/postgres/api-grants.sql");
    let (scheme, rest) = database_url.split_once("://").expect("a URL");
    let host_and_db = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    format!("{scheme}://sluice_api:{PASSWORD}@{host_and_db}")
}

/// Runs `integration-tests/lake/<script>` with the lake venv's Python; panics with
/// its stderr unless it succeeds; returns its stdout. (Blocking: async callers wrap
/// it in `spawn_blocking` when the test serves something the script calls.)
pub fn lake_script(script: &str, args: &[String]) -> String {
    venv_script("lake", script, args)
}

/// Runs `integration-tests/lake/<script>` with the named venv's Python; its stdout.
pub fn venv_script(venv: &str, script: &str, args: &[String]) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("lake")
        .join(script);
    let out = std::process::Command::new(venv_bin(venv, "python"))
        .arg(path)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {script}: {e}"));
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Writes a Hudi table with Hudi's own Spark writer
/// (`integration-tests/lake/hudi_spark.py`), one upsert per element of `writes`
/// (comma-separated `dt` partitions), named after the table's directory; `env`
/// as the script reads it (`HUDI_CALLBACK_URL`, `HUDI_WRITE_OPTIONS`). Returns
/// the writer's line per commit (`requested`, `completed`, `action`, `partitions`).
pub async fn hudi_spark_write(
    table: &std::path::Path,
    table_type: &str,
    writes: &[&str],
    env: &[(&str, String)],
) -> Vec<serde_json::Value> {
    let name = table.file_name().expect("table dir").to_string_lossy();
    let out = tokio::process::Command::new(venv_bin("spark", "python"))
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("lake/hudi_spark.py"))
        .arg(hudi_bundle())
        .arg(table)
        .args([&*name, table_type])
        .args(writes)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .await
        .expect("run hudi_spark.py");
    assert!(
        out.status.success(),
        "hudi_spark.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The JVM shares the script's stdout (Hudi's JOL prints warnings there).
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("writer line"))
        .collect()
}

/// Hudi's Spark bundle jar (`compose/lib.sh ensure_spark` resolves it).
pub fn hudi_bundle() -> PathBuf {
    let jar = std::env::var_os("SLUICE_TEST_HUDI_BUNDLE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../.stack/spark-jars/hudi-spark3.5-bundle_2.12-1.0.2.jar")
        });
    assert!(
        jar.exists(),
        "no Hudi bundle at {} — `bash compose/test.sh` resolves it (compose/lib.sh ensure_spark)",
        jar.display()
    );
    jar
}

/// An executable of the test venv `.stack/<name>-venv` (made by
/// `compose/ensure-venv.sh`, which `compose/test.sh` runs); `SLUICE_TEST_<NAME>_VENV`
/// points elsewhere.
pub fn venv_bin(name: &str, program: &str) -> PathBuf {
    let var = format!("SLUICE_TEST_{}_VENV", name.to_ascii_uppercase());
    let venv = std::env::var_os(&var)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../.stack/{name}-venv"))
        });
    let bin = venv.join("bin").join(program);
    assert!(
        bin.exists(),
        "no {program} at {} — `bash compose/test.sh` installs the {name} venv (compose/ensure-venv.sh)",
        bin.display()
    );
    bin
}

/// A fresh database with the dispatcher's migrations applied: (URL, pool).
pub async fn dispatcher_database() -> (String, sqlx::PgPool) {
    let url = fresh_database().await;
    let pool = sqlx::PgPool::connect(&url).await.expect("pool");
    sluice_dispatcher::MIGRATOR
        .run(&pool)
        .await
        .expect("migrate");
    (url, pool)
}

/// Fresh topics of `topics` under a new prefix `<tag>-…`.
pub async fn fresh_topics(
    tag: &str,
    partitions: i32,
    topics: &[sluice_kit::Topic],
) -> sluice_kit::topics::TopicNames {
    let names =
        sluice_kit::topics::TopicNames::with_prefix(&format!("{}.", unique(tag)), partitions);
    let admin = kafka().admin("sluice-tests").expect("admin");
    sluice_kit::topics::bootstrap(&admin, &names, topics, Duration::from_secs(30))
        .await
        .expect("topics");
    names
}

/// A built service binary (`compose/test.sh` builds them before the tests).
pub fn service_binary(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    // A benchmark run with --release starts the release services beside it.
    let profile = std::env::current_exe()
        .ok()
        .and_then(|e| {
            e.ancestors()
                .any(|d| d.file_name().is_some_and(|n| n == "release"))
                .then_some("release")
        })
        .unwrap_or("debug");
    let path = target.join(profile).join(name);
    assert!(
        path.exists(),
        "{} not found: build the services first (cargo build --bins)",
        path.display()
    );
    path
}

/// A free loopback port (bound and released; good enough for tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A CA and a server certificate for 127.0.0.1, made with the openssl CLI.
pub fn tls_files(
    dir: &std::path::Path,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    std::fs::create_dir_all(dir).expect("dir");
    let f = |n: &str| dir.join(n).display().to_string();
    std::fs::write(
        dir.join("leaf.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .expect("ext");
    for args in [
        vec![
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &f("ca.key"),
            "-out",
            &f("ca.pem"),
            "-subj",
            "/CN=sluice-test-ca",
            "-days",
            "2",
        ],
        vec![
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &f("leaf.key"),
            "-out",
            &f("leaf.csr"),
            "-subj",
            "/CN=localhost",
        ],
        vec![
            "x509",
            "-req",
            "-in",
            &f("leaf.csr"),
            "-CA",
            &f("ca.pem"),
            "-CAkey",
            &f("ca.key"),
            "-CAcreateserial",
            "-out",
            &f("leaf.pem"),
            "-days",
            "2",
            "-extfile",
            &f("leaf.ext"),
        ],
    ] {
        let out = std::process::Command::new("openssl")
            .args(&args)
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    (
        dir.join("ca.pem"),
        dir.join("leaf.pem"),
        dir.join("leaf.key"),
    )
}

/// Serves `app` on a free loopback port for the rest of the test; the port.
pub async fn serve(app: axum::Router) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    port
}

/// `GET path` on a loopback port; returns (status, body) or None if nothing answers.
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.ok()?;
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Some((status, body))
}

/// Polls `f` until it is true or `timeout` passes.
pub async fn eventually<F, Fut>(timeout: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

/// The client factory pointed at the test broker.
pub fn kafka() -> sluice_kit::kafka::KafkaOptions {
    sluice_kit::kafka::KafkaOptions::local(&bootstrap())
}

/// A fresh topic with `partitions` partitions (replication factor 1).
pub async fn create_topic(partitions: i32) -> String {
    use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
    let name = unique("topic");
    let admin = kafka().admin("sluice-tests").expect("admin client");
    let nt = NewTopic::new(&name, partitions, TopicReplication::Fixed(1));
    for r in admin
        .create_topics([&nt], &AdminOptions::new())
        .await
        .expect("create topic")
    {
        r.expect("topic created");
    }
    name
}

/// Sum of the offsets `group` has committed on partitions `0..partitions` of `topic`
/// (its last committed transaction's; one still open is not counted); `Err` while the
/// broker cannot answer.
pub fn committed_total(
    group: &str,
    topic: &str,
    partitions: i32,
) -> Result<i64, rdkafka::error::KafkaError> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Offset, TopicPartitionList};
    // Read uncommitted: librdkafka then asks without `require_stable`, so the broker
    // answers at once with the last committed offsets instead of "unstable offset
    // commit" for as long as a killed member's transaction stays open (a kill -9
    // test waiting that out let the next incarnation finish the run unobserved).
    let c: BaseConsumer = kafka()
        .consumer_config(&unique("probe"), group)
        .set("isolation.level", "read_uncommitted")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let committed = c.committed_offsets(tpl, Duration::from_secs(30))?;
    Ok(committed
        .elements()
        .iter()
        .map(|e| {
            if let Offset::Offset(o) = e.offset() {
                o
            } else {
                0
            }
        })
        .sum())
}

/// One record as read back, headers included.
#[derive(Clone, Debug)]
pub struct ReadRecord {
    pub partition: i32,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
}

impl ReadRecord {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }
}

/// Every committed record of partitions `0..partitions` of `topic`, in partition
/// and offset order.
pub fn read_records(topic: &str, partitions: i32) -> Vec<ReadRecord> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::{Headers, Message};
    use rdkafka::{Offset, TopicPartitionList};
    let mut cfg = kafka().reader_config(&unique("reader"));
    cfg.set("enable.partition.eof", "true");
    let c: BaseConsumer = cfg.create().expect("reader");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("tpl");
    }
    c.assign(&tpl).expect("assign");
    let mut out = Vec::new();
    let mut eof = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while eof < partitions && Instant::now() < deadline {
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => out.push(ReadRecord {
                partition: m.partition(),
                key: m.key().map(<[u8]>::to_vec),
                payload: m.payload().map(<[u8]>::to_vec),
                headers: m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|x| (x.key.to_owned(), x.value.unwrap_or_default().to_vec()))
                            .collect()
                    })
                    .unwrap_or_default(),
            }),
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => eof += 1,
            _ => {}
        }
    }
    out.sort_by_key(|r| r.partition);
    out
}

/// The values of `topic` by key (UTF-8), in offset order per key.
pub fn read_topic(
    topic: &str,
    partitions: i32,
) -> std::collections::BTreeMap<String, Vec<Vec<u8>>> {
    let mut out: std::collections::BTreeMap<String, Vec<Vec<u8>>> = Default::default();
    for r in read_records(topic, partitions) {
        out.entry(String::from_utf8_lossy(&r.key.unwrap_or_default()).to_string())
            .or_default()
            .push(r.payload.unwrap_or_default());
    }
    out
}

/// Resident memory of this process (Linux `/proc/self/statm`), for benchmarks.
/// The best (shortest) and the median of repeated timings. A benchmark alternates
/// a measurement with its raw-broker reference and compares like with like: the
/// same broker serves one read of the same records in half the time of the next.
pub fn best_and_median(mut secs: Vec<f64>) -> (f64, f64) {
    secs.sort_by(f64::total_cmp);
    (
        secs.first().copied().unwrap_or(f64::NAN),
        secs.get(secs.len() / 2).copied().unwrap_or(f64::NAN),
    )
}

pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Reads partitions `0..partitions` of `topic` to their end (read_committed), as a
/// benchmark's raw-broker reference; returns (records, seconds).
pub fn raw_consume(topic: &str, partitions: i32) -> (u64, f64) {
    use rdkafka::consumer::Consumer;
    use rdkafka::error::KafkaError;
    use rdkafka::{Offset, TopicPartitionList};
    // The client settings of Sluice's own readers, so a restore is compared with a
    // read as well tuned as its own.
    let c = sluice_kit::kafka::reader(&kafka().reader_config(&unique("raw"))).expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("tpl");
    }
    c.assign(&tpl).expect("assign");
    let started = Instant::now();
    let (mut n, mut eof) = (0u64, 0);
    while eof < partitions {
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(_)) => n += 1,
            Some(Err(KafkaError::PartitionEOF(_))) => eof += 1,
            _ => {}
        }
    }
    (n, started.elapsed().as_secs_f64())
}

/// Produces `records` (key, payload) to `topic` with the idempotent producer,
/// waiting out a full queue; returns the rate in records/s, flush included.
pub fn produce_all(topic: &str, records: &[(String, Vec<u8>)]) -> f64 {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = kafka().producer_config("bench").create().expect("producer");
    let started = Instant::now();
    for (k, v) in records {
        let mut rec = BaseRecord::to(topic).key(k).payload(v);
        loop {
            match producer.send(rec) {
                Ok(()) => break,
                Err((_, r)) => {
                    producer.poll(Duration::from_millis(5));
                    rec = r;
                }
            }
        }
    }
    producer.flush(Duration::from_secs(60)).expect("flush");
    records.len() as f64 / started.elapsed().as_secs_f64()
}

/// Joins `group` under `client_id` — another member's group.instance.id — until it
/// is given partitions, then leaves: the member that held that instance id is
/// fenced, as a static member is when it comes back after its session timed out
/// (seen after a broker restart). Its next group call fails fatally.
pub fn fence_static_member(client_id: &str, group: &str, topic: &str) {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let impostor: BaseConsumer = kafka()
        .consumer_config(client_id, group)
        .create()
        .expect("consumer");
    impostor.subscribe(&[topic]).expect("subscribe");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while impostor.assignment().map_or(0, |a| a.count()) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the impostor never got partitions"
        );
        impostor.poll(std::time::Duration::from_millis(100));
    }
    std::thread::sleep(std::time::Duration::from_secs(2));
}
