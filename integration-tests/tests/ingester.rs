//! The ingester as a process against the real broker: HTTP push with every
//! refusal, a broker that cannot take the event (503), commit-hook and Debezium
//! CDC topics exactly once across a kill -9 with bad records dead-lettered, and the
//! Debezium Avro change events written by Confluent's own serializer through a
//! schema registry (its outage waited out, not dead-lettered), and the
//! pollers on tables written by the real writers (pyiceberg, pypaimon, deltalake
//! from the venv `compose/ensure-venv.sh` installs; Hudi timelines laid out as
//! Hudi 0.15.0 and 1.0.2 write them), push + poll of one commit folding once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use serde_json::{Value, json};
use sluice_core::{AssetEvent, AssetKey, EventId, EventKind, EventSource, Operation, TableFormat};
use sluice_integration_tests::registry::StandIn;
use sluice_integration_tests::{
    ReadRecord, bootstrap, create_topic, free_port, fresh_topics, hudi_spark_write, kafka,
    lake_script, read_records, service_binary, unique, venv_bin,
};
use sluice_kit::topics::{Topic, TopicNames};
use sluice_kit::wire::StateRecord;
use sluice_kit::{Codec, SchemaName};

const PARTITIONS: i32 = 2;
const TOKEN: &str = "tok-ods-0123456789";
const TOKENS: &str =
    r#"[{"name": "ods-writer", "token": "tok-ods-0123456789", "namespaces": ["lake.ods"]}]"#;

struct Ingester {
    child: Child,
    http: String,
    admin: String,
}

/// A state-updater folding what the ingester emits (as in production), and its
/// admin address.
fn state_updater(names: &TopicNames) -> (Reaped, String) {
    let admin = format!("127.0.0.1:{}", free_port());
    let child = Command::new(service_binary("sluice-state-updater"))
        .env("SLUICE_KAFKA_BOOTSTRAP", bootstrap())
        .env("SLUICE_TOPIC_PREFIX", &names.prefix)
        .env("SLUICE_TOPIC_PARTITIONS", PARTITIONS.to_string())
        .env("SLUICE_ADMIN_ADDR", &admin)
        .env("SLUICE_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn state-updater");
    (Reaped(child), admin)
}

/// A child process killed when the test ends, passed or failed.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Ingester {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn topics_for(tag: &str) -> TopicNames {
    fresh_topics(
        tag,
        PARTITIONS,
        &[Topic::AssetEvents, Topic::AssetState, Topic::DeadLetter],
    )
    .await
}

async fn start(names: &TopicNames, instance: &str, env: &[(&str, &str)]) -> Ingester {
    let (http_port, admin_port) = (free_port(), free_port());
    let mut cmd = Command::new(service_binary("sluice-ingester"));
    cmd.env("SLUICE_KAFKA_BOOTSTRAP", bootstrap())
        .env("SLUICE_TOPIC_PREFIX", &names.prefix)
        .env("SLUICE_TOPIC_PARTITIONS", PARTITIONS.to_string())
        .env("SLUICE_INSTANCE", instance)
        .env("SLUICE_ADMIN_ADDR", format!("127.0.0.1:{admin_port}"))
        .env("SLUICE_INGEST_HTTP_ADDR", format!("127.0.0.1:{http_port}"))
        .env("SLUICE_INGEST_TOKENS", TOKENS)
        .env(
            "SLUICE_LOG",
            std::env::var("SLUICE_TEST_SERVICE_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let ing = Ingester {
        child: cmd.spawn().expect("spawn ingester"),
        http: format!("http://127.0.0.1:{http_port}"),
        admin: format!("http://127.0.0.1:{admin_port}"),
    };
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = client
            .get(format!("{}/health/ready", ing.admin))
            .send()
            .await;
        if ready.is_ok_and(|r| r.status().is_success()) {
            return ing;
        }
        assert!(Instant::now() < deadline, "ingester not ready in 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn events(names: &TopicNames) -> Vec<AssetEvent> {
    let codec = Codec::new(None);
    let mut out = Vec::new();
    for r in read_records(&names.name(Topic::AssetEvents), PARTITIONS) {
        let e: AssetEvent = codec
            .decode(SchemaName::AssetEvent, &r.payload.expect("an event"))
            .await
            .expect("asset-events decode");
        assert_eq!(
            r.key.as_deref(),
            Some(e.asset_key.as_str().as_bytes()),
            "keyed by asset"
        );
        assert!(e.id_is_consistent());
        out.push(e);
    }
    out
}

/// The newest asset-state per asset (the state-updater's fold).
async fn states(names: &TopicNames) -> BTreeMap<String, StateRecord> {
    let codec = Codec::new(None);
    let mut out = BTreeMap::new();
    for r in read_records(&names.name(Topic::AssetState), PARTITIONS) {
        let s: StateRecord = codec
            .decode(SchemaName::AssetState, &r.payload.expect("a state"))
            .await
            .expect("asset-state decode");
        out.insert(s.asset_key.as_str().to_owned(), s);
    }
    out
}

fn id(asset: &str, sequence: i64, snapshot: i64) -> String {
    EventId::derive(
        &AssetKey::parse(asset).expect("key"),
        EventKind::SnapshotCommitted,
        sequence,
        snapshot,
    )
    .as_str()
    .to_owned()
}

fn count_by_id(evs: &[AssetEvent]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for e in evs {
        *m.entry(e.event_id.as_str().to_owned()).or_insert(0) += 1;
    }
    m
}

async fn post(
    url: &str,
    token: Option<&str>,
    body: impl Into<reqwest::Body>,
) -> (u16, Value, Option<String>) {
    let mut req = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap_or_default().to_owned());
    let body = resp.json().await.unwrap_or(Value::Null);
    (status, body, retry)
}

fn notice(asset: &str, seq: i64) -> Value {
    json!({"asset_key": asset, "format": "iceberg", "snapshot_id": 1000 + seq, "sequence": seq,
           "commit_time_ms": 1_700_000_000_000i64 + seq})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_push_is_acknowledged_and_every_bad_request_gets_its_4xx() {
    let names = topics_for("ih").await;
    let ing = start(&names, "a", &[]).await;
    let commits = format!("{}/v1/commits", ing.http);

    let (s, b, _) = post(
        &commits,
        Some(TOKEN),
        notice("lake.ods.orders", 1).to_string(),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["event_ids"][0], id("lake.ods.orders", 1, 1001).as_str());
    let batch = json!({"commits": [notice("lake.ods.orders", 2), notice("lake.ods.payments", 1), notice("lake.ods.payments", 2)]});
    let (s, b, _) = post(&commits, Some(TOKEN), batch.to_string()).await;
    assert_eq!((s, b["accepted"].as_u64()), (200, Some(3)), "{b}");

    // Refusals: each with its status and a message that names the fault.
    let cases: Vec<(Option<&str>, String, u16, &str)> = vec![
        (None, notice("lake.ods.orders", 9).to_string(), 401, "no bearer token"),
        (Some("tok-wrong-0123456789"), notice("lake.ods.orders", 9).to_string(), 401, "not valid"),
        (Some(TOKEN), notice("lake.dwd.fact", 9).to_string(), 403, "may not write namespace \"lake.dwd\""),
        (Some(TOKEN), "{\"asset_key\": ".into(), 400, "body is not JSON"),
        (
            Some(TOKEN),
            json!([notice("lake.ods.orders", 9), notice("Lake.ods.x", 9)]).to_string(),
            400,
            "commits[1].asset_key",
        ),
        (Some(TOKEN), json!({"asset_key": "lake.ods.orders", "format": "orc", "snapshot_id": 1, "sequence": 1, "commit_time_ms": 1}).to_string(), 400, "format: unknown table format"),
        (Some(TOKEN), format!("[{}]", vec![notice("lake.ods.orders", 9).to_string(); 20_000].join(",")), 413, "body exceeds 1048576 bytes"),
    ];
    for (token, body, want, msg) in cases {
        let (s, b, _) = post(&commits, token, body).await;
        assert_eq!(s, want, "{b}");
        assert!(
            b["error"].as_str().is_some_and(|e| e.contains(msg)),
            "{want}: {b}"
        );
    }

    // Hudi's HTTP callback: its API key header, the asset completed from ?namespace.
    let hudi = json!({"commitTime": "20241201123045123", "tableName": "Orders_Hudi", "basePath": "/lake/orders_hudi",
        "hoodieWriteStat": [{"fileId": "f1", "partitionPath": "dt=2024-12-01", "numInserts": 5}], "commitActionType": "deltacommit"});
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/hooks/hudi?namespace=lake.ods", ing.http))
        .header("HUDI-CALLBACK-KEY", TOKEN)
        .body(hudi.to_string())
        .send()
        .await
        .expect("hudi callback");
    assert_eq!(resp.status().as_u16(), 200);
    let (s, b, _) = post(
        &format!("{}/v1/hooks/hudi", ing.http),
        Some(TOKEN),
        hudi.to_string(),
    )
    .await;
    assert_eq!(s, 400, "{b}");

    let evs = events(&names).await;
    let mut got: Vec<(String, i64)> = evs
        .iter()
        .map(|e| (e.asset_key.as_str().to_owned(), e.sequence))
        .collect();
    got.sort();
    println!("HTTP accepted events on asset-events: {got:?}");
    assert_eq!(
        got,
        [
            ("lake.ods.orders".to_owned(), 1),
            ("lake.ods.orders".to_owned(), 2),
            ("lake.ods.orders_hudi".to_owned(), 20241201123045123),
            ("lake.ods.payments".to_owned(), 1),
            ("lake.ods.payments".to_owned(), 2),
        ],
        "every 200 is on the topic, nothing refused is"
    );
    assert!(evs.iter().all(|e| e.source == EventSource::Push));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_cannot_take_the_event_answers_503_not_a_false_200() {
    let names = topics_for("i503").await;
    let ing = start(&names, "a", &[("SLUICE_INGEST_ACK_TIMEOUT_MS", "2000")]).await;
    let commits = format!("{}/v1/commits", ing.http);
    let (s, _, _) = post(
        &commits,
        Some(TOKEN),
        notice("lake.ods.orders", 1).to_string(),
    )
    .await;
    assert_eq!(s, 200);
    // The topic goes away (automatic creation is off): the broker cannot acknowledge.
    let admin = kafka().admin("ingester-test").expect("admin");
    admin
        .delete_topics(
            &[&names.name(Topic::AssetEvents)],
            &rdkafka::admin::AdminOptions::new(),
        )
        .await
        .expect("delete topic");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t = Instant::now();
    let (s, b, retry) = post(
        &commits,
        Some(TOKEN),
        notice("lake.ods.orders", 2).to_string(),
    )
    .await;
    println!(
        "after the topic was deleted: {s} in {:?}, Retry-After {retry:?}: {b}",
        t.elapsed()
    );
    assert_eq!(s, 503, "{b}");
    assert_eq!(retry.as_deref(), Some("5"));
    assert!(
        b["error"]
            .as_str()
            .is_some_and(|e| e.contains("not accepted, retry"))
    );
}

fn produce(topic: &str, records: &[(Option<&str>, Option<Vec<u8>>)]) {
    let p: BaseProducer = kafka()
        .producer_config("ingester-test")
        .create()
        .expect("producer");
    for (k, v) in records {
        let mut r: BaseRecord<'_, str, [u8]> = BaseRecord::to(topic).partition(0);
        if let Some(k) = k {
            r = r.key(k);
        }
        if let Some(v) = v {
            r = r.payload(v);
        }
        p.send(r).expect("send");
    }
    p.flush(Duration::from_secs(30)).expect("flush");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hook_and_cdc_topics_exactly_once_across_kill_9_bad_records_dead_lettered() {
    let names = topics_for("ik").await;
    let (json_t, hudi_t, avro_t, cdc_t) = (
        create_topic(1).await,
        create_topic(1).await,
        create_topic(1).await,
        create_topic(1).await,
    );
    let b = |v: Value| Some(v.to_string().into_bytes());
    produce(
        &json_t,
        &[
            (None, b(notice("lake.ods.a", 1))),
            (
                None,
                b(json!([notice("lake.ods.a", 2), notice("lake.ods.b", 1)])),
            ),
            (Some("garbage"), Some(b"not json at all".to_vec())),
            (None, b(notice("lake.ods..x", 1))),
        ],
    );
    produce(
        &hudi_t,
        &[
            (
                Some("payments"),
                b(
                    json!({"commitTime": "20241202010203004", "tableName": "payments", "basePath": "/lake/p", "commitActionType": "commit"}),
                ),
            ),
            (
                Some("payments"),
                b(json!({"commitTime": "yesterday", "tableName": "payments"})),
            ),
        ],
    );
    let codec = Codec::new(None);
    let mut avro_event = AssetEvent::committed(
        AssetKey::parse("lake.ods.c").expect("key"),
        TableFormat::Paimon,
        5,
        5,
        1_700_000_000_000,
        EventSource::KafkaHook,
    );
    avro_event
        .attributes
        .insert("writer".into(), "flink".into());
    let avro = codec
        .encode(SchemaName::AssetEvent, &avro_t, &avro_event)
        .await
        .expect("encode");
    produce(
        &avro_t,
        &[
            (Some("lake.ods.c"), Some(avro)),
            (Some("lake.ods.c"), Some(vec![0xC3, 0x01, 0xFF])),
        ],
    );
    let row = json!({"asset_key": "lake.ods.d", "format": "delta", "snapshot_id": 3, "sequence": 3, "commit_time_ms": 1_700_000_000_003i64});
    produce(
        &cdc_t,
        &[
            (
                Some("1"),
                b(
                    json!({"schema": {"type": "struct"}, "payload": {"before": null, "after": row, "op": "c", "ts_ms": 1}}),
                ),
            ),
            (
                Some("1"),
                b(json!({"before": row, "after": null, "op": "d", "ts_ms": 2})),
            ),
            (Some("1"), None), // the tombstone after the delete
            (
                Some("2"),
                b(json!({"before": null, "after": {"asset_key": "lake.ods.d"}, "op": "c"})),
            ),
        ],
    );
    let hooks = json!([
        {"topic": json_t, "format": "json"},
        {"topic": hudi_t, "format": "hudi", "namespace": "lake.ods"},
        {"topic": avro_t, "format": "avro"},
        {"topic": cdc_t, "format": "debezium"},
    ])
    .to_string();
    let env = [
        ("SLUICE_HOOK_TOPICS", hooks.as_str()),
        ("SLUICE_INGEST_HTTP_ADDR", "off"),
    ];
    let want: BTreeMap<String, usize> = [
        id("lake.ods.a", 1, 1001),
        id("lake.ods.a", 2, 1002),
        id("lake.ods.b", 1, 1001),
        id("lake.ods.payments", 20241202010203004, 20241202010203004),
        avro_event.event_id.as_str().to_owned(),
        id("lake.ods.d", 3, 3),
        EventId::derive(
            &AssetKey::parse("lake.ods.d").expect("key"),
            EventKind::SnapshotExpired,
            3,
            3,
        )
        .as_str()
        .to_owned(),
    ]
    .into_iter()
    .map(|k| (k, 1))
    .collect();

    let mut ing = start(&names, "a", &env).await;
    let wait_all = async |names: &TopicNames| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let got = count_by_id(&events(names).await);
            if got.len() >= want.len() || Instant::now() > deadline {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    };
    let first = wait_all(&names).await;
    // kill -9 and a restart: the committed offsets went with the events, nothing twice.
    let _ = ing.child.kill();
    let _ = ing.child.wait();
    ing = start(&names, "a", &env).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = count_by_id(&events(&names).await);
    drop(ing);
    println!("hook events by id before kill -9: {first:?}\nafter restart: {after:?}");
    assert_eq!(first, want);
    assert_eq!(
        after, want,
        "each hook record's events exactly once across kill -9"
    );

    let dlq: Vec<ReadRecord> = read_records(&names.name(Topic::DeadLetter), PARTITIONS);
    let mut origins: Vec<(String, String)> = dlq
        .iter()
        .map(|r| {
            (
                r.header("sluice.dlq.topic").unwrap_or_default(),
                r.header("sluice.dlq.offset").unwrap_or_default(),
            )
        })
        .collect();
    origins.sort();
    let mut want_origins = vec![
        (json_t.clone(), "2".to_owned()),
        (json_t.clone(), "3".to_owned()),
        (hudi_t.clone(), "1".to_owned()),
        (avro_t.clone(), "1".to_owned()),
        (cdc_t.clone(), "3".to_owned()),
    ];
    want_origins.sort();
    println!(
        "dead letters: {:?}",
        dlq.iter()
            .map(|r| r.header("sluice.dlq.error"))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        origins, want_origins,
        "every bad record dead-lettered once with its origin"
    );
    assert!(
        dlq.iter()
            .all(|r| r.header("sluice.dlq.error").is_some_and(|e| !e.is_empty()))
    );
}

/// Debezium Avro: Confluent's serializer (confluent-kafka for Python) writes the
/// PostgreSQL connector's Envelope through the registry stand-in; the ingester reads
/// each writer schema by the id in the frame. While its registry does not answer,
/// nothing is consumed and nothing is dead-lettered; once it does, every change
/// comes exactly once and the three bad records are dead-lettered with their origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_avro_through_a_schema_registry_whose_outage_is_waited_out() {
    let names = topics_for("iv").await;
    let cdc_t = create_topic(1).await;
    let registry = StandIn::default();
    let url = registry.listen(0).await;
    let args = [bootstrap(), cdc_t.clone(), url.clone()];
    tokio::task::spawn_blocking(move || lake_script("debezium_avro.py", &args))
        .await
        .expect("join");
    let mut subjects = registry.subjects();
    subjects.sort();
    assert_eq!(subjects, [format!("{cdc_t}-key"), format!("{cdc_t}-value")]);

    // The ingester's registry address does not answer yet.
    let port = free_port();
    let hooks = json!([{
        "topic": cdc_t, "format": "debezium",
        "schema_registry": format!("http://127.0.0.1:{port}"),
        "mapping": {"operation": "operation", "watermark_ms": "watermark_ms", "schema_id": "schema_id"},
    }])
    .to_string();
    let env = [
        ("SLUICE_HOOK_TOPICS", hooks.as_str()),
        ("SLUICE_INGEST_HTTP_ADDR", "off"),
    ];
    let ing = start(&names, "v", &env).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let dlq = names.name(Topic::DeadLetter);
    assert!(
        events(&names).await.is_empty(),
        "nothing read without the writer schema"
    );
    assert!(
        read_records(&dlq, PARTITIONS).is_empty(),
        "a registry outage is not bad input"
    );

    registry.listen(port).await;
    let expired = EventId::derive(
        &AssetKey::parse("lake.ods.e").expect("key"),
        EventKind::SnapshotExpired,
        1,
        7001,
    )
    .as_str()
    .to_owned();
    let want: BTreeMap<String, usize> = [
        id("lake.ods.e", 1, 7001),
        id("lake.ods.e", 2, 7002),
        expired,
    ]
    .into_iter()
    .map(|k| (k, 1))
    .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut got = Vec::new();
    while Instant::now() < deadline {
        got = events(&names).await;
        if got.len() >= want.len() && read_records(&dlq, PARTITIONS).len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got_later = events(&names).await;
    drop(ing);
    assert_eq!(count_by_id(&got), want);
    assert_eq!(
        count_by_id(&got_later),
        want,
        "nothing after the last change"
    );
    let insert = got
        .iter()
        .find(|e| e.sequence == 2)
        .expect("the insert's event");
    assert_eq!(
        (
            insert.format,
            insert.operation,
            insert.watermark_ms,
            insert.schema_id,
            insert.source,
            insert.attributes.get("cdc.op").map(String::as_str),
        ),
        (
            TableFormat::Iceberg,
            Operation::Overwrite,
            Some(1_699_999_999_000),
            Some(3),
            EventSource::Cdc,
            Some("c"),
        ),
        "optional columns read through their [null, T] unions"
    );

    let dead = read_records(&dlq, PARTITIONS);
    let mut why: Vec<(String, String)> = dead
        .iter()
        .map(|r| {
            (
                r.header("sluice.dlq.offset").unwrap_or_default(),
                r.header("sluice.dlq.error").unwrap_or_default(),
            )
        })
        .collect();
    why.sort_by_key(|(offset, _)| offset.parse::<i64>().unwrap_or(-1));
    println!("Avro dead letters: {why:#?}");
    assert!(
        dead.iter()
            .all(|r| r.header("sluice.dlq.topic").as_deref() == Some(cdc_t.as_str()))
    );
    let offsets: Vec<&str> = why.iter().map(|(o, _)| o.as_str()).collect();
    assert_eq!(offsets, ["4", "5", "6"], "each bad record once, in order");
    assert!(
        why[0].1.contains("9999") || why[0].1.contains("40403"),
        "{why:?}"
    );
    assert!(why[2].1.contains("orc"), "{why:?}");
}

fn lake_python() -> PathBuf {
    venv_bin("lake", "python")
}

/// Commits with the real writer; returns (table path, [(snapshot id, sequence)]).
fn commit(
    format: &str,
    warehouse: &Path,
    table: &str,
    commits: usize,
) -> (PathBuf, Vec<(i64, i64)>) {
    let out = lake_script(
        "commit.py",
        &[
            format.to_owned(),
            warehouse.display().to_string(),
            "ods".to_owned(),
            table.to_owned(),
            commits.to_string(),
        ],
    );
    let mut path = PathBuf::new();
    let mut snaps = Vec::new();
    for line in out.lines() {
        let v: Value = serde_json::from_str(line).expect("writer output");
        path = PathBuf::from(v["path"].as_str().expect("path"));
        snaps.push((
            v["snapshot_id"].as_i64().expect("id"),
            v["sequence"].as_i64().expect("seq"),
        ));
    }
    (path, snaps)
}

/// A Hudi 0.15.0 (timeline layout 1) table: completed instants as `<instant>.<action>`
/// with JSON commit metadata, one still inflight.
fn hudi_0x(dir: &Path) -> Vec<i64> {
    let h = dir.join(".hoodie");
    std::fs::create_dir_all(&h).expect("dir");
    std::fs::write(h.join("hoodie.properties"), "hoodie.table.name=hudi_orders\nhoodie.table.type=COPY_ON_WRITE\nhoodie.timeline.layout.version=1\nhoodie.table.version=6\n").expect("w");
    let meta = |op: &str| {
        format!(
            r#"{{"partitionToWriteStats": {{"dt=2024-12-01": [{{"fileId": "f1", "partitionPath": "dt=2024-12-01", "numInserts": 3}}]}}, "compacted": false, "extraMetadata": {{"schema": "{{}}"}}, "operationType": "{op}"}}"#
        )
    };
    for (instant, op) in [
        ("20241201100000000", "INSERT"),
        ("20241201110000000", "UPSERT"),
    ] {
        std::fs::write(h.join(format!("{instant}.commit.requested")), "").expect("w");
        std::fs::write(h.join(format!("{instant}.inflight")), "").expect("w");
        std::fs::write(h.join(format!("{instant}.commit")), meta(op)).expect("w");
    }
    std::fs::write(h.join("20241201120000000.commit.requested"), "").expect("w");
    std::fs::write(h.join("20241201120000000.inflight"), "").expect("w");
    vec![20241201100000000, 20241201110000000]
}

/// A Hudi 1.0.2 (timeline layout 2) table: `.hoodie/timeline/<requested>_<completed>.<action>`.
fn hudi_1x(dir: &Path) -> Vec<i64> {
    let t = dir.join(".hoodie/timeline");
    std::fs::create_dir_all(&t).expect("dir");
    std::fs::write(dir.join(".hoodie/hoodie.properties"), "hoodie.table.name=hudi_events\nhoodie.table.type=MERGE_ON_READ\nhoodie.timeline.layout.version=2\nhoodie.table.version=8\n").expect("w");
    // An upsert, then a clustering (a replacecommit whose metadata says "cluster").
    for (instant, completed, action, op) in [
        (
            "20241201100000000",
            "20241201100005123",
            "deltacommit",
            "upsert",
        ),
        (
            "20241201110000000",
            "20241201110009456",
            "replacecommit",
            "cluster",
        ),
    ] {
        std::fs::write(t.join(format!("{instant}.{action}.requested")), "").expect("w");
        std::fs::write(t.join(format!("{instant}.{action}.inflight")), "").expect("w");
        let file = t.join(format!("{instant}_{completed}.{action}"));
        lake_script(
            "hudi_avro.py",
            &[file.display().to_string(), action.to_owned(), op.to_owned()],
        );
    }
    vec![20241201100000000, 20241201110000000]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pollers_on_real_tables_fold_with_push_once_and_resume_without_re_emitting() {
    let names = topics_for("ip").await;
    let root = std::env::temp_dir().join(unique("lake"));
    let (ice, ice_snaps) = commit("iceberg", &root.join("iceberg"), "orders", 2);
    let (pai, pai_snaps) = commit("paimon", &root.join("paimon"), "payments", 2);
    let (del, del_snaps) = commit("delta", &root.join("delta"), "refunds", 2);
    let (h0, h1) = (root.join("hudi0"), root.join("hudi1"));
    let (h0_seqs, h1_seqs) = (hudi_0x(&h0), hudi_1x(&h1));
    let table = |asset: &str, format: &str, path: &Path| json!({"asset": asset, "format": format, "path": path, "interval_ms": 300, "push_timeout_ms": 300, "start": "earliest"});
    // commit.py's pyiceberg SQL catalog: the poller follows its metadata_location.
    let mut orders = table("lake.ods.orders", "iceberg", &ice);
    orders["catalog"] = json!({"kind": "sql", "name": "sluice", "table": "ods.orders",
        "uri": format!("sqlite:///{}/catalog.db", root.join("iceberg").display())});
    let tables = json!([
        orders,
        table("lake.ods.payments", "paimon", &pai),
        table("lake.ods.refunds", "delta", &del),
        table("lake.ods.hudi_orders", "hudi", &h0),
        table("lake.ods.hudi_events", "hudi", &h1),
    ])
    .to_string();
    let mut expected: BTreeMap<String, usize> = BTreeMap::new();
    for (asset, snaps) in [
        ("lake.ods.orders", &ice_snaps),
        ("lake.ods.payments", &pai_snaps),
        ("lake.ods.refunds", &del_snaps),
    ] {
        for (snap, seq) in snaps.iter() {
            expected.insert(id(asset, *seq, *snap), 1);
        }
    }
    for (asset, seqs) in [
        ("lake.ods.hudi_orders", &h0_seqs),
        ("lake.ods.hudi_events", &h1_seqs),
    ] {
        for s in seqs.iter() {
            expected.insert(id(asset, *s, *s), 1);
        }
    }
    // The state-updater folds what the ingester emits (as in production).
    let (folder, folder_admin) = state_updater(&names);
    let env = [("SLUICE_POLL_TABLES", tables.as_str())];
    let ing = start(&names, "a", &env).await;
    // The newest Iceberg commit also arrives by push: one commit, two paths.
    let (ice_snap, ice_seq) = ice_snaps[1];
    let push = json!({"asset_key": "lake.ods.orders", "format": "iceberg", "snapshot_id": ice_snap, "sequence": ice_seq, "commit_time_ms": 1_700_000_000_000i64});
    let (s, b, _) = post(
        &format!("{}/v1/commits", ing.http),
        Some(TOKEN),
        push.to_string(),
    )
    .await;
    assert_eq!(s, 200, "{b}");

    let want_seq: BTreeMap<&str, i64> = [
        ("lake.ods.orders", ice_snaps[1].1),
        ("lake.ods.payments", pai_snaps[1].1),
        ("lake.ods.refunds", del_snaps[1].1),
        ("lake.ods.hudi_orders", h0_seqs[1]),
        ("lake.ods.hudi_events", h1_seqs[1]),
    ]
    .into_iter()
    .collect();
    let folded = async |names: &TopicNames| {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let st = states(names).await;
            let done = want_seq.iter().all(|(a, seq)| {
                st.get(*a)
                    .and_then(|s| s.latest.as_ref())
                    .is_some_and(|l| l.sequence == *seq)
            });
            if done || Instant::now() > deadline {
                return st;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    };
    let st = folded(&names).await;
    let evs = events(&names).await;
    // Hudi 1.x: the operation comes from the Avro commit metadata, not the action
    // alone (a replacecommit alone would read as an overwrite).
    let hudi_ops: Vec<(Operation, Option<&str>)> = evs
        .iter()
        .filter(|e| e.asset_key.as_str() == "lake.ods.hudi_events")
        .map(|e| {
            (
                e.operation,
                e.attributes.get("hudi.operation_type").map(String::as_str),
            )
        })
        .collect();
    assert_eq!(
        hudi_ops,
        [
            (Operation::Append, Some("upsert")),
            (Operation::Cluster, Some("cluster"))
        ]
    );
    let by_id = count_by_id(&evs);
    let commits: BTreeMap<&str, i64> = st
        .iter()
        .map(|(k, s)| (k.as_str(), s.commit_count))
        .collect();
    println!("events by id: {by_id:?}\nfolded commit counts: {commits:?}");
    for (k, n) in &expected {
        let got = by_id.get(k).copied().unwrap_or(0);
        assert!(got >= *n, "event {k} was polled ({got})");
    }
    assert!(
        evs.iter()
            .all(|e| expected.contains_key(e.event_id.as_str())),
        "no event the tables do not state"
    );
    // Push + poll of the newest Iceberg commit: the fold counted it once.
    let want_counts: BTreeMap<&str, i64> = [
        ("lake.ods.orders", 2),
        ("lake.ods.payments", 2),
        ("lake.ods.refunds", 2),
        ("lake.ods.hudi_orders", 2),
        ("lake.ods.hudi_events", 2),
    ]
    .into_iter()
    .collect();
    assert_eq!(commits, want_counts);
    // Each commit counted once, under the path whose copy came first: the
    // poll for all but (perhaps) the pushed one.
    let metrics = reqwest::get(format!("http://{folder_admin}/metrics"))
        .await
        .expect("state-updater metrics")
        .text()
        .await
        .expect("metrics text");
    let folded = |source: &str| -> i64 {
        let series = format!("sluice_state_commits_first_seen_total{{source=\"{source}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .map_or(0, |v| v.trim().parse().expect("a count"))
    };
    let (by_poll, by_push) = (folded("poll"), folded("push"));
    println!("folded first by poll {by_poll}, by push {by_push}");
    assert_eq!(by_poll + by_push, want_counts.values().sum::<i64>());
    assert!(by_push <= 1, "only one commit was pushed");

    // A restart resumes at the folded positions: no history emitted again.
    drop(ing);
    let before = evs.len();
    let ing = start(&names, "a", &env).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let again = events(&names).await.len();
    println!("asset-events records before restart {before}, 3 s after {again}");
    assert_eq!(again, before, "a restart re-emits nothing");

    // A half-written Paimon snapshot is retried and reported, not turned into an event.
    let next = pai_snaps[1].1 + 1;
    let snapshot_dir = pai.join("snapshot");
    let good = std::fs::read_to_string(snapshot_dir.join(format!("snapshot-{}", next - 1)))
        .expect("read snapshot");
    let mut complete: Value = serde_json::from_str(&good).expect("json");
    complete["id"] = json!(next);
    let complete = complete.to_string();
    std::fs::write(
        snapshot_dir.join(format!("snapshot-{next}")),
        &complete[..complete.len() / 2],
    )
    .expect("half");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let metrics = reqwest::get(format!("{}/metrics", ing.admin))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    let errors = metrics
        .lines()
        .find(|l| l.starts_with("sluice_ingester_poll_errors_total{format=\"PAIMON\"}"))
        .map(str::to_owned);
    assert!(errors.is_some(), "poll errors counted: {metrics}");
    assert!(
        !events(&names)
            .await
            .iter()
            .any(|e| e.asset_key.as_str() == "lake.ods.payments" && e.sequence == next),
        "no event from a half-written snapshot"
    );
    std::fs::write(snapshot_dir.join(format!("snapshot-{next}")), &complete).expect("complete");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !events(&names)
        .await
        .iter()
        .any(|e| e.asset_key.as_str() == "lake.ods.payments" && e.sequence == next)
    {
        assert!(
            Instant::now() < deadline,
            "the completed snapshot is polled"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    println!("half-written snapshot-{next}: {errors:?}; polled once complete");
    drop(ing);
    drop(folder);
    let _ = std::fs::remove_dir_all(&root);
}

/// An S3-compatible store for the poller: moto's server (`moto_server`, from the
/// lake venv), which implements the S3 REST API — a stand-in for S3 / MinIO, which
/// cannot run here. The tables in it were written by the real writers (pypaimon,
/// deltalake) on local disk and uploaded file by file, as a sync would.
struct S3 {
    child: std::process::Child,
    endpoint: String,
}

impl Drop for S3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl S3 {
    async fn start() -> S3 {
        let port = free_port();
        let bin = lake_python().with_file_name("moto_server");
        assert!(
            bin.exists(),
            "no moto_server in the lake venv — compose/test.sh installs it"
        );
        let child = Command::new(bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto_server");
        let endpoint = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(60);
        while reqwest::get(&endpoint).await.is_err() {
            assert!(Instant::now() < deadline, "moto_server not up in 60 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        S3 { child, endpoint }
    }

    /// Uploads every file under `dir` to `s3://bucket/prefix/…` (the bucket is made if needed).
    fn upload(&self, dir: &Path, bucket: &str, prefix: &str) {
        let script = r#"
import os, sys, boto3
endpoint, bucket, prefix, root = sys.argv[1:5]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  aws_access_key_id="test", aws_secret_access_key="test")
try:
    s3.create_bucket(Bucket=bucket)
except s3.exceptions.BucketAlreadyOwnedByYou:
    pass
for d, _, files in os.walk(root):
    for f in files:
        full = os.path.join(d, f)
        s3.upload_file(full, bucket, prefix + "/" + os.path.relpath(full, root))
"#;
        let out = Command::new(lake_python())
            .args([
                "-c",
                script,
                &self.endpoint,
                bucket,
                prefix,
                &dir.display().to_string(),
            ])
            .output()
            .expect("upload");
        assert!(
            out.status.success(),
            "upload: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pollers_read_tables_on_an_s3_compatible_store() {
    let s3 = S3::start().await;
    let names = topics_for("is3").await;
    let root = std::env::temp_dir().join(unique("lake-s3"));
    let (pai, pai_snaps) = commit("paimon", &root.join("paimon"), "payments", 2);
    let (del, del_snaps) = commit("delta", &root.join("delta"), "refunds", 2);
    s3.upload(&pai, "lake", "warehouse/ods.db/payments");
    s3.upload(&del, "lake", "warehouse/ods/refunds");
    let table = |asset: &str, format: &str, url: &str| json!({"asset": asset, "format": format, "path": url, "interval_ms": 300, "push_timeout_ms": 300, "start": "earliest"});
    let mut missing = table(
        "lake.ods.missing",
        "iceberg",
        "s3://lake/warehouse/ods/missing",
    );
    missing["catalog"] = json!({"kind": "hadoop"});
    let tables = json!([
        table(
            "lake.ods.payments",
            "paimon",
            "s3://lake/warehouse/ods.db/payments"
        ),
        table(
            "lake.ods.refunds",
            "delta",
            "s3://lake/warehouse/ods/refunds"
        ),
        missing,
    ])
    .to_string();
    let env = [
        ("SLUICE_POLL_TABLES", tables.as_str()),
        ("AWS_ENDPOINT", s3.endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_REGION", "us-east-1"),
    ];
    let ing = start(&names, "a", &env).await;
    let mut want: BTreeMap<String, usize> = BTreeMap::new();
    for (snap, seq) in &pai_snaps {
        want.insert(id("lake.ods.payments", *seq, *snap), 1);
    }
    for (snap, seq) in &del_snaps {
        want.insert(id("lake.ods.refunds", *seq, *snap), 1);
    }
    let wait_for = async |want: &BTreeMap<String, usize>| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let got = count_by_id(&events(&names).await);
            if want.keys().all(|k| got.contains_key(k)) || Instant::now() > deadline {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    };
    let got = wait_for(&want).await;
    println!("events from the S3 tables: {got:?}");
    assert_eq!(got, want, "each snapshot on the store once, nothing else");
    // A new commit, synced to the store, is found by the next poll.
    let (_, more) = commit("paimon", &root.join("paimon"), "payments", 1);
    s3.upload(&pai, "lake", "warehouse/ods.db/payments");
    want.insert(id("lake.ods.payments", more[0].1, more[0].0), 1);
    let got = wait_for(&want).await;
    assert_eq!(got, want);
    // The table that is not on the store is reported, not invented.
    let metrics = reqwest::get(format!("{}/metrics", ing.admin))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("sluice_ingester_poll_errors_total{format=\"ICEBERG\"}"),
        "{metrics}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// One call of `lake/iceberg_catalog.py` (pyiceberg, SQL catalog on SQLite): its JSON line.
fn ice(warehouse: &Path, table: &str, action: &str, args: &[&str]) -> Value {
    let mut argv = vec![
        warehouse.display().to_string(),
        table.to_owned(),
        action.to_owned(),
    ];
    argv.extend(args.iter().map(|a| (*a).to_owned()));
    let out = lake_script("iceberg_catalog.py", &argv);
    serde_json::from_str(out.lines().last().expect("a line")).expect("json line")
}

/// A stand-in for an Iceberg REST catalog (none can run here), answering the two
/// calls of the spec the poller makes: `GET /v1/config` (with a prefix override)
/// and loadTable, `GET /v1/{prefix}/namespaces/{ns}/tables/{table}` → the
/// LoadTableResult of the table's current metadata file; 404 with the spec's
/// ErrorModel for another table, 500 while `failing`.
#[derive(Clone, Default)]
struct RestCatalog {
    /// (namespace, table) → metadata location.
    tables: std::sync::Arc<std::sync::Mutex<BTreeMap<(String, String), String>>>,
    failing: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl RestCatalog {
    async fn serve(&self) -> String {
        use axum::extract::{Path as UrlPath, State};
        use axum::http::StatusCode;
        use axum::routing::get;
        async fn config() -> axum::Json<Value> {
            axum::Json(json!({"defaults": {}, "overrides": {"prefix": "ws"}}))
        }
        async fn load(
            State(c): State<RestCatalog>,
            UrlPath((prefix, ns, table)): UrlPath<(String, String, String)>,
        ) -> (StatusCode, axum::Json<Value>) {
            let error = |code: StatusCode, kind: &str, msg: &str| {
                (
                    code,
                    axum::Json(
                        json!({"error": {"message": msg, "type": kind, "code": code.as_u16()}}),
                    ),
                )
            };
            if c.failing.load(std::sync::atomic::Ordering::SeqCst) {
                return error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "ServerError",
                    "stand-in outage",
                );
            }
            let location = c.tables.lock().expect("lock").get(&(ns, table)).cloned();
            match location {
                Some(loc) if prefix == "ws" => {
                    let text = std::fs::read_to_string(loc.trim_start_matches("file://"))
                        .expect("metadata file");
                    let metadata: Value = serde_json::from_str(&text).expect("metadata json");
                    (
                        StatusCode::OK,
                        axum::Json(json!({"metadata-location": loc, "metadata": metadata})),
                    )
                }
                _ => error(
                    StatusCode::NOT_FOUND,
                    "NoSuchTableException",
                    "Table does not exist",
                ),
            }
        }
        let app = axum::Router::new()
            .route("/v1/config", get(config))
            .route("/v1/{prefix}/namespaces/{ns}/tables/{table}", get(load))
            .with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }
}

fn poll_errors(metrics: &str) -> i64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("sluice_ingester_poll_errors_total{format=\"ICEBERG\"} "))
        .map_or(0, |v| v.trim().parse().expect("a count"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iceberg_polls_read_only_what_the_catalog_committed() {
    let names = topics_for("ice").await;
    let w = std::env::temp_dir().join(unique("ice"));
    let rest = RestCatalog::default();
    let rest_url = rest.serve().await;
    let uri = format!("sqlite:///{}/catalog.db", w.display());
    let sql = |t: &str| json!({"kind": "sql", "uri": uri, "name": "it", "table": t});
    let created = ice(&w, "ods.orders", "create", &["v2"]);
    let path = created["path"].as_str().expect("path").to_owned();
    let v1_path = ice(&w, "ods.v1", "create", &["v1"])["path"]
        .as_str()
        .expect("path")
        .to_owned();
    ice(&w, "ods.broken", "create", &["v2"]);
    ice(
        &w,
        "ods.broken",
        "point-to",
        &["file:///nowhere/metadata/00009-x.metadata.json"],
    );
    let first = ice(&w, "ods.orders", "append", &["2024-12-01"]);
    let v1a = ice(&w, "ods.v1", "append", &["a"]);
    let v1b = ice(&w, "ods.v1", "append", &["b"]);
    let set_rest = |m: &Value| {
        rest.tables.lock().expect("lock").insert(
            ("ods".into(), "orders".into()),
            m["metadata"].as_str().expect("location").to_owned(),
        );
    };
    set_rest(&first);
    let table = |asset: &str, path: &str, catalog: Value| json!({"asset": asset, "format": "iceberg", "path": path, "catalog": catalog, "interval_ms": 300, "push_timeout_ms": 300, "start": "earliest"});
    let mut audit = table("lake.ice.orders_audit", &path, sql("ods.orders"));
    audit["ref"] = json!("audit");
    let tables = json!([
        table("lake.ice.orders", &path, sql("ods.orders")),
        audit,
        table(
            "lake.ice.orders_rest",
            &path,
            json!({"kind": "rest", "uri": rest_url, "table": "ods.orders"})
        ),
        table("lake.ice.v1", &v1_path, sql("ods.v1")),
        table("lake.ice.broken", &path, sql("ods.broken")),
    ])
    .to_string();
    let ing = start(&names, "a", &[("SLUICE_POLL_TABLES", tables.as_str())]).await;
    let commit_id = |asset: &str, m: &Value, seq: &str| {
        id(
            asset,
            m[seq].as_i64().expect("sequence"),
            m["snapshot_id"].as_i64().expect("snapshot"),
        )
    };
    // Format v1 has no sequence numbers: Sluice's order is timestamp-ms × 1000 (+ rank).
    let v1_id = |m: &Value| {
        id(
            "lake.ice.v1",
            m["timestamp_ms"].as_i64().expect("ts") * 1000,
            m["snapshot_id"].as_i64().expect("snapshot"),
        )
    };
    let wait_for = async |ids: &[String]| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let evs = events(&names).await;
            let got = count_by_id(&evs);
            if ids.iter().all(|k| got.contains_key(k)) {
                return evs;
            }
            assert!(
                Instant::now() < deadline,
                "events {ids:?} not all polled; got {got:?}"
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    };
    let evs = wait_for(&[
        commit_id("lake.ice.orders", &first, "sequence"),
        commit_id("lake.ice.orders_rest", &first, "sequence"),
        v1_id(&v1a),
        v1_id(&v1b),
    ])
    .await;
    let e1 = evs
        .iter()
        .find(|e| e.asset_key.as_str() == "lake.ice.orders")
        .expect("event");
    assert_eq!(
        e1.partitions,
        ["dt=2024-12-01"],
        "partitions from the snapshot summary"
    );

    // A writer dies after writing its metadata file, before the catalog's swap: the
    // file holds a snapshot the table never committed.
    let crashed = ice(&w, "ods.orders", "crash", &["2024-12-02"]);
    let orphan = crashed["orphan_snapshot_id"].as_i64().expect("orphan id");
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The next real commit takes the same sequence number the orphan had.
    let second = ice(&w, "ods.orders", "append", &["2024-12-03"]);
    set_rest(&second);
    assert_eq!(second["sequence"], 2);
    ice(&w, "ods.orders", "branch", &["audit"]);
    let on_branch = ice(&w, "ods.orders", "append", &["2024-12-04", "audit"]);
    let branch_snapshot = on_branch["branch_snapshot_id"].as_i64().expect("id");
    let expired = ice(&w, "ods.v1", "expire-oldest", &[]);
    assert_eq!(expired["expired"], v1a["snapshot_id"]);
    let v1c = ice(&w, "ods.v1", "append", &["c"]);
    let branch_id = id(
        "lake.ice.orders_audit",
        on_branch["branch_sequence"].as_i64().expect("seq"),
        branch_snapshot,
    );
    let evs = wait_for(&[
        commit_id("lake.ice.orders", &second, "sequence"),
        commit_id("lake.ice.orders_rest", &second, "sequence"),
        branch_id.clone(),
        v1_id(&v1c),
    ])
    .await;
    println!(
        "iceberg events: {:?}",
        evs.iter()
            .map(|e| (e.asset_key.as_str(), e.kind, e.sequence, e.snapshot_id))
            .collect::<Vec<_>>()
    );
    assert!(
        evs.iter().all(|e| e.snapshot_id != orphan),
        "the uncommitted snapshot {orphan} was never an event"
    );
    assert!(
        !evs.iter()
            .any(|e| e.asset_key.as_str() == "lake.ice.orders" && e.snapshot_id == branch_snapshot),
        "a commit to branch audit is not a commit of main"
    );
    // The v1 commit after the expiry is newer than both before it, and the expiry
    // is reported as what it is.
    let v1_commits: Vec<i64> = evs
        .iter()
        .filter(|e| e.asset_key.as_str() == "lake.ice.v1" && e.kind == EventKind::SnapshotCommitted)
        .map(|e| e.sequence)
        .collect();
    assert_eq!(v1_commits.len(), 3, "{v1_commits:?}");
    assert!(v1_commits.windows(2).all(|w| w[0] < w[1]), "{v1_commits:?}");
    assert!(evs.iter().any(|e| e.asset_key.as_str() == "lake.ice.v1"
        && e.kind == EventKind::SnapshotExpired
        && e.snapshot_id == v1a["snapshot_id"].as_i64().expect("id")));

    // A schema change without a snapshot is emitted as one.
    let altered = ice(&w, "ods.orders", "add-column", &["note"]);
    assert_eq!(altered["schema_id"], 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let evs = events(&names).await;
        let changed = evs.iter().find(|e| {
            e.asset_key.as_str() == "lake.ice.orders" && e.kind == EventKind::SchemaChanged
        });
        if let Some(e) = changed {
            assert_eq!(e.schema_id, Some(1));
            break;
        }
        assert!(Instant::now() < deadline, "no SCHEMA_CHANGED event");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // Bad catalogs are errors of their poll, never events: a row that points at a
    // missing file (every poll), a REST catalog answering 500.
    let metrics = async || {
        reqwest::get(format!("{}/metrics", ing.admin))
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text")
    };
    let before = poll_errors(&metrics().await);
    assert!(before > 0, "the broken catalog row is counted");
    let count = events(&names).await.len();
    rest.failing
        .store(true, std::sync::atomic::Ordering::SeqCst);
    ice(&w, "ods.orders", "append", &["2024-12-05"]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = events(&names)
        .await
        .into_iter()
        .filter(|e| e.asset_key.as_str() == "lake.ice.orders_rest")
        .count();
    assert!(poll_errors(&metrics().await) > before + 2);
    assert!(
        events(&names)
            .await
            .iter()
            .all(|e| e.asset_key.as_str() != "lake.ice.broken"),
        "nothing from the broken row"
    );
    rest.failing
        .store(false, std::sync::atomic::Ordering::SeqCst);
    println!("events before the outage {count}; orders_rest events during it {during}");
    drop(ing);
    let _ = std::fs::remove_dir_all(&w);
}

/// The heartbeat rule of Hudi's table-service plan: a table whose state has not
/// advanced for `push_timeout_ms` is polled at that pace, not only every
/// `interval_ms` (here ten minutes, far past the test): a lost push is found within
/// the push timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_table_is_polled_after_the_push_timeout_not_the_interval() {
    let names = topics_for("hb").await;
    let root = std::env::temp_dir().join(unique("hb"));
    let (del, first) = commit("delta", &root.join("delta"), "quiet", 1);
    let tables = json!([{"asset": "lake.ods.quiet", "format": "delta", "path": del,
        "interval_ms": 600_000, "push_timeout_ms": 1_000, "start": "earliest"}])
    .to_string();
    let ing = start(&names, "a", &[("SLUICE_POLL_TABLES", tables.as_str())]).await;
    let seen = async |seq: i64, within: Duration| {
        let deadline = Instant::now() + within;
        loop {
            if events(&names)
                .await
                .iter()
                .any(|e| e.asset_key.as_str() == "lake.ods.quiet" && e.sequence == seq)
            {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    assert!(
        seen(first[0].1, Duration::from_secs(30)).await,
        "the first poll"
    );
    let (_, second) = commit("delta", &root.join("delta"), "quiet", 1);
    let t = Instant::now();
    assert!(
        seen(second[0].1, Duration::from_secs(20)).await,
        "a commit no push reported is polled within the push timeout, not the 10 min interval"
    );
    println!(
        "quiet table: the unpushed commit polled after {:.1} s (push_timeout 1 s, interval 600 s)",
        t.elapsed().as_secs_f64()
    );
    drop(ing);
    let _ = std::fs::remove_dir_all(&root);
}

/// pyiceberg's SqlCatalog in PostgreSQL (the JDBC / SQL catalog most teams run):
/// the poller reads the `iceberg_tables` row there, not the directory; the table
/// writes no partition summaries, so each commit's partitions come from the
/// manifests it added.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iceberg_on_a_postgresql_catalog_is_read_through_its_row() {
    let names = topics_for("icepg").await;
    let w = std::env::temp_dir().join(unique("icepg"));
    let db = sluice_integration_tests::fresh_database().await;
    let sa = db.replacen("postgres://", "postgresql+psycopg2://", 1);
    let ice_pg = |action: &str, args: &[&str]| -> Value {
        let mut argv = vec![
            "--catalog-uri".to_owned(),
            sa.clone(),
            w.display().to_string(),
            "ods.pg".to_owned(),
            action.to_owned(),
        ];
        argv.extend(args.iter().map(|a| (*a).to_owned()));
        let out = lake_script("iceberg_catalog.py", &argv);
        serde_json::from_str(out.lines().last().expect("a line")).expect("json line")
    };
    // No partition summaries: the poller reads the partitions from the manifests.
    let path = ice_pg("create", &["v2", "no-summary"])["path"]
        .as_str()
        .expect("path")
        .to_owned();
    let first = ice_pg("append", &["2024-12-01"]);
    let tables = json!([{"asset": "lake.ice.pg", "format": "iceberg", "path": path,
        "catalog": {"kind": "sql", "uri": db, "name": "it", "table": "ods.pg"},
        "interval_ms": 300, "push_timeout_ms": 300, "start": "earliest"}])
    .to_string();
    let ing = start(&names, "a", &[("SLUICE_POLL_TABLES", tables.as_str())]).await;
    let crashed = ice_pg("crash", &["2024-12-02"]);
    let second = ice_pg("append", &["2024-12-03"]);
    let want = [&first, &second].map(|m| {
        id(
            "lake.ice.pg",
            m["sequence"].as_i64().expect("seq"),
            m["snapshot_id"].as_i64().expect("id"),
        )
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let evs = loop {
        let evs = events(&names).await;
        let got = count_by_id(&evs);
        if want.iter().all(|k| got.contains_key(k)) {
            break evs;
        }
        assert!(
            Instant::now() < deadline,
            "not polled from PostgreSQL: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(
        evs.iter()
            .all(|e| Some(e.snapshot_id) != crashed["orphan_snapshot_id"].as_i64()),
        "the uncommitted snapshot is not an event"
    );
    let parts: Vec<(i64, Vec<String>)> = evs
        .iter()
        .map(|e| (e.sequence, e.partitions.clone()))
        .collect();
    println!(
        "PostgreSQL catalog: {} events, the orphan never one; partitions from manifests {parts:?}",
        evs.len()
    );
    assert_eq!(
        parts,
        [
            (1, vec!["dt=2024-12-01".to_owned()]),
            (2, vec!["dt=2024-12-03".to_owned()])
        ]
    );
    drop(ing);
    let _ = std::fs::remove_dir_all(&w);
}

/// Hudi written by its own writer (Spark with Hudi's bundle): the poller reads the
/// 1.x timeline Hudi keeps (`<requested>_<completed>.<action>`, Avro commit
/// metadata, Hadoop's `.crc` files beside them) of a MERGE_ON_READ table (each
/// upsert a `deltacommit`) and of a COPY_ON_WRITE one (a `commit`), and emits each
/// upsert once, with the partitions its write stats name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hudi_written_by_spark_is_polled_with_its_partitions() {
    let names = topics_for("hs").await;
    let root = std::env::temp_dir().join(unique("hs"));
    let mut tables = Vec::new();
    let mut wanted = Vec::new();
    for (asset, table_type, action) in [
        ("lake.ods.orders", "MERGE_ON_READ", "deltacommit"),
        ("lake.ods.payments", "COPY_ON_WRITE", "commit"),
    ] {
        let name = asset.rsplit('.').next().expect("name");
        let path = root.join(name);
        let writes = hudi_spark_write(
            &path,
            table_type,
            &["2024-12-01", "2024-12-02,2024-12-03"],
            &[],
        )
        .await;
        assert_eq!(writes.len(), 2, "{writes:?}");
        tables.push(json!({"asset": asset, "format": "hudi", "path": path,
            "interval_ms": 300, "push_timeout_ms": 300, "start": "earliest"}));
        for w in writes {
            let parts = w["partitions"].as_array().expect("partitions");
            let parts: Vec<String> = parts
                .iter()
                .map(|p| p.as_str().expect("p").to_owned())
                .collect();
            assert_eq!(w["action"], action, "{w}");
            wanted.push((
                asset.to_owned(),
                w["requested"].as_i64().expect("instant"),
                parts,
                action.to_owned(),
            ));
        }
    }
    wanted.sort();
    let tables = Value::Array(tables).to_string();
    let ing = start(&names, "a", &[("SLUICE_POLL_TABLES", tables.as_str())]).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while events(&names).await.len() < wanted.len() {
        assert!(Instant::now() < deadline, "not polled in 60 s");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await; // and nothing more
    let evs = events(&names).await;
    let mut got: Vec<(String, i64, Vec<String>, String)> = evs
        .iter()
        .map(|e| {
            let action = e.attributes.get("hudi.action").cloned().unwrap_or_default();
            (
                e.asset_key.to_string(),
                e.sequence,
                e.partitions.clone(),
                action,
            )
        })
        .collect();
    got.sort();
    println!("hudi events (asset, sequence, partitions, action): {got:?}");
    assert_eq!(
        got, wanted,
        "each upsert once, with its partitions and action"
    );
    for e in &evs {
        assert_eq!(
            e.attributes.get("hudi.operation_type").map(String::as_str),
            Some("UPSERT"),
            "{e:?}"
        );
        assert_eq!(e.operation, Operation::Append, "{e:?}");
    }
    drop(ing);
    let _ = std::fs::remove_dir_all(&root);
}

/// Hudi 1.x archives old instants out of the active timeline into its LSM
/// history (Parquet files under `.hoodie/timeline/history`). A poller that was
/// down while commits were made *and* archived must still emit each of them —
/// once: restarted, it resumes after what the state holds and reads the archive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_poller_finds_hudi_commits_archived_while_it_was_down() {
    const ASSET: &str = "lake.ods.ledger";
    let names = topics_for("ha").await;
    let root = std::env::temp_dir().join(unique("ha"));
    let path = root.join("ledger");
    // Archive early: keep 3–4 commits active, clean after every commit.
    let write = async |days: &[&str]| -> Vec<i64> {
        let options = "hoodie.keep.min.commits=3,hoodie.keep.max.commits=4,\
                       hoodie.cleaner.commits.retained=2,hoodie.metadata.enable=false";
        hudi_spark_write(
            &path,
            "COPY_ON_WRITE",
            days,
            &[("HUDI_WRITE_OPTIONS", options.into())],
        )
        .await
        .iter()
        .map(|w| w["requested"].as_i64().expect("requested"))
        .collect()
    };
    let days = ["2024-12-01", "2024-12-02", "2024-12-03"];
    let first = write(&days[..2]).await;
    let (folder, _) = state_updater(&names);
    let tables = json!([{"asset": ASSET, "format": "hudi", "path": path,
        "interval_ms": 300, "push_timeout_ms": 300, "start": "earliest"}])
    .to_string();
    let env = [("SLUICE_POLL_TABLES", tables.as_str())];
    let held = async |names: &TopicNames, seq: i64| {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let st = states(names).await;
            let at = st
                .get(ASSET)
                .and_then(|s| s.latest.as_ref())
                .map(|l| l.sequence);
            if at.is_some_and(|a| a >= seq) {
                return; // at the commit, or at the clean after it
            }
            assert!(
                Instant::now() < deadline,
                "the state at {at:?}, not at {seq}"
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    };
    let ing = start(&names, "a", &env).await;
    held(&names, first[1]).await;
    tokio::time::sleep(Duration::from_secs(1)).await; // a clean polled meanwhile is folded too
    drop(ing);

    // Eight more commits while no poller runs; Hudi archives some of them.
    let second = write(&days.repeat(3)[..8]).await;
    let active: Vec<i64> = std::fs::read_dir(path.join(".hoodie/timeline"))
        .expect("timeline")
        .filter_map(|e| {
            let n = e.ok()?.file_name().into_string().ok()?;
            let (req, action) = sluice_kit::hudi::completed_instant(&n, true)?;
            (action == "commit").then(|| req.parse().ok())?
        })
        .collect();
    let archived: Vec<i64> = second
        .iter()
        .copied()
        .filter(|s| !active.contains(s))
        .collect();
    println!(
        "[hudi] {} commits made while the poller was down, {} of them archived before it came back",
        second.len(),
        archived.len()
    );
    assert!(
        !archived.is_empty(),
        "the scenario needs commits archived meanwhile"
    );
    let ing = start(&names, "a", &env).await;
    held(&names, second[7]).await;
    tokio::time::sleep(Duration::from_secs(1)).await; // and nothing more
    let evs = events(&names).await;
    let mut commits: Vec<i64> = evs
        .iter()
        .filter(|e| e.operation == Operation::Append)
        .map(|e| e.sequence)
        .collect();
    commits.sort();
    let want: Vec<i64> = first.iter().chain(&second).copied().collect();
    assert_eq!(commits, want, "every commit once, the archived ones too");
    let by_id = count_by_id(&evs);
    assert!(
        by_id.values().all(|n| *n == 1),
        "no event emitted twice: {by_id:?}"
    );
    drop(ing);
    drop(folder);
    let _ = std::fs::remove_dir_all(&root);
}

/// A lost push must not mean a partition that never fires: the poller emits the
/// partitions a commit wrote — a Delta commit's `add` actions' partitionValues (a
/// table delta-rs wrote partitioned by `dt`), a Paimon commit's delta manifests'
/// partition rows (a table pypaimon wrote partitioned by a STRING `dt` and an INT
/// `hh`, one day name short enough to be stored inline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polled_commits_carry_the_partitions_they_wrote() {
    let names = topics_for("dp").await;
    let root = std::env::temp_dir().join(unique("dp"));
    let (delta, delta_commits) = commit("delta-by-day", &root.join("delta"), "by_day", 2);
    let (paimon, paimon_commits) = commit("paimon-by-day", &root.join("paimon"), "by_day", 2);
    let tables = json!([
        {"asset": "lake.ods.by_day", "format": "delta", "path": delta,
         "interval_ms": 300, "push_timeout_ms": 300, "start": "earliest"},
        {"asset": "lake.ods.paimon_by_day", "format": "paimon", "path": paimon,
         "interval_ms": 300, "push_timeout_ms": 300, "start": "earliest"}])
    .to_string();
    let ing = start(&names, "a", &[("SLUICE_POLL_TABLES", tables.as_str())]).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let partitions = loop {
        let by_commit: BTreeMap<(String, i64), Vec<String>> = events(&names)
            .await
            .into_iter()
            .map(|e| ((e.asset_key.to_string(), e.sequence), e.partitions))
            .collect();
        if by_commit.len() >= delta_commits.len() + paimon_commits.len() {
            break by_commit;
        }
        assert!(Instant::now() < deadline, "not polled: {by_commit:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    println!("partitions by commit: {partitions:?}");
    let of = |asset: &str, seq: i64| partitions[&(asset.to_owned(), seq)].clone();
    assert_eq!(of("lake.ods.by_day", delta_commits[0].1), ["dt=2024-12-01"]);
    assert_eq!(of("lake.ods.by_day", delta_commits[1].1), ["dt=2024-12-02"]);
    assert_eq!(
        of("lake.ods.paimon_by_day", paimon_commits[0].1),
        ["dt=2024-12-01/hh=0"]
    );
    assert_eq!(
        of("lake.ods.paimon_by_day", paimon_commits[1].1),
        ["dt=2024-12-02/hh=1", "dt=eu/hh=1"]
    );
    drop(ing);
    let _ = std::fs::remove_dir_all(&root);
}
