//! Proof that the local stack is real: Kafka transactions, transactional offsets,
//! compacted topics and PostgreSQL migrations, against the broker and server that
//! `compose/stack.sh` starts.

use std::collections::BTreeSet;
use std::time::Duration;

use rdkafka::admin::{AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use sluice_integration_tests::{create_topic, fresh_database, kafka, unique};
use sluice_kit::topics::{self, BootstrapError, Topic, TopicNames};

const T: Duration = Duration::from_secs(30);

fn txn_producer() -> BaseProducer {
    let p: BaseProducer = kafka()
        .transactional_producer_config("stack-test", &unique("txn"))
        .create()
        .expect("producer");
    p.init_transactions(T).expect("init transactions");
    p
}

/// Reads everything currently readable from `topic` under an isolation level.
fn read_all(topic: &str, isolation: &str, wait: Duration) -> Vec<String> {
    let mut cfg: ClientConfig = kafka().reader_config(&unique("reader"));
    cfg.set("isolation.level", isolation);
    let c: BaseConsumer = cfg.create().expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .expect("tpl");
    c.assign(&tpl).expect("assign");
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + wait;
    while std::time::Instant::now() < deadline {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
            out.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).to_string());
        }
    }
    out
}

fn send(p: &BaseProducer, topic: &str, payloads: &[&str]) {
    for v in payloads {
        p.send(BaseRecord::to(topic).key("k").payload(*v))
            .expect("send");
    }
    p.flush(T).expect("flush");
}

#[tokio::test]
async fn committed_records_are_visible_only_after_commit() {
    let topic = create_topic(1).await;
    let p = txn_producer();
    p.begin_transaction().expect("begin");
    send(&p, &topic, &["a", "b", "c"]);
    // Flushed to the broker but not committed: a read_committed reader sees nothing.
    assert!(read_all(&topic, "read_committed", Duration::from_secs(2)).is_empty());
    p.commit_transaction(T).expect("commit");
    assert_eq!(
        read_all(&topic, "read_committed", Duration::from_secs(3)),
        ["a", "b", "c"]
    );
}

#[tokio::test]
async fn aborted_records_are_never_visible() {
    let topic = create_topic(1).await;
    let p = txn_producer();
    p.begin_transaction().expect("begin");
    send(&p, &topic, &["lost-1", "lost-2"]);
    p.abort_transaction(T).expect("abort");
    p.begin_transaction().expect("begin");
    send(&p, &topic, &["kept"]);
    p.commit_transaction(T).expect("commit");
    assert_eq!(
        read_all(&topic, "read_committed", Duration::from_secs(3)),
        ["kept"]
    );
    // The aborted records were really written: an uncommitted reader sees them.
    let dirty = read_all(&topic, "read_uncommitted", Duration::from_secs(3));
    assert_eq!(dirty, ["lost-1", "lost-2", "kept"]);
}

#[tokio::test]
async fn offsets_commit_with_the_transaction_and_not_on_abort() {
    let input = create_topic(1).await;
    let plain: BaseProducer = kafka()
        .producer_config("stack-test")
        .create()
        .expect("producer");
    send(&plain, &input, &["1", "2", "3", "4"]);
    let group = unique("group");
    let consumer: BaseConsumer = kafka()
        .consumer_config(&unique("c"), &group)
        .create()
        .expect("consumer");
    consumer.subscribe(&[input.as_str()]).expect("subscribe");
    let mut seen = 0;
    while seen < 4 {
        if let Some(Ok(_)) = consumer.poll(Duration::from_millis(200)) {
            seen += 1;
        }
    }
    let committed = |c: &BaseConsumer| {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&input, 0);
        c.committed_offsets(tpl, T).expect("committed").elements()[0].offset()
    };
    let p = txn_producer();
    let cgm = consumer.group_metadata().expect("group metadata");
    let offsets = |o: i64| {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&input, 0, Offset::Offset(o))
            .expect("tpl");
        tpl
    };
    p.begin_transaction().expect("begin");
    p.send_offsets_to_transaction(&offsets(2), &cgm, T)
        .expect("send offsets");
    p.commit_transaction(T).expect("commit");
    assert_eq!(committed(&consumer), Offset::Offset(2));

    p.begin_transaction().expect("begin");
    p.send_offsets_to_transaction(&offsets(4), &cgm, T)
        .expect("send offsets");
    p.abort_transaction(T).expect("abort");
    assert_eq!(
        committed(&consumer),
        Offset::Offset(2),
        "an aborted transaction commits no offsets"
    );
}

async fn cleanup_policy(name: &str) -> String {
    let admin = kafka().admin("stack-test").expect("admin");
    let r = admin
        .describe_configs([&ResourceSpecifier::Topic(name)], &AdminOptions::new())
        .await
        .expect("describe");
    let cfg = r.into_iter().next().expect("one").expect("described");
    cfg.get("cleanup.policy")
        .and_then(|e| e.value.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn bootstrap_creates_compacted_topics_compacted_and_is_idempotent() {
    let names = TopicNames::with_prefix(&format!("{}.", unique("boot")), 3);
    let admin = kafka().admin("stack-test").expect("admin");
    topics::bootstrap(&admin, &names, &Topic::ALL, T)
        .await
        .expect("bootstrap");
    topics::bootstrap(&admin, &names, &Topic::ALL, T)
        .await
        .expect("second bootstrap is a no-op");
    let mut compacted = BTreeSet::new();
    for t in Topic::ALL {
        let policy = cleanup_policy(&names.name(t)).await;
        assert_eq!(
            policy == "compact",
            t.compacted(),
            "{}: {policy}",
            names.name(t)
        );
        if t.compacted() {
            compacted.insert(t.role());
        }
    }
    assert_eq!(
        compacted,
        BTreeSet::from([
            "asset-state",
            "dependencies",
            "grants",
            "notifications",
            "resolver-progress",
            "runs",
            "tables",
            "targets"
        ])
    );
}

#[tokio::test]
async fn a_compacted_topic_found_with_delete_policy_is_a_start_up_error() {
    let names = TopicNames::with_prefix(&format!("{}.", unique("wrong")), 1);
    let admin = kafka().admin("stack-test").expect("admin");
    let state = names.name(Topic::AssetState);
    let nt = NewTopic::new(&state, 1, TopicReplication::Fixed(1)).set("cleanup.policy", "delete");
    for r in admin
        .create_topics([&nt], &AdminOptions::new())
        .await
        .expect("create")
    {
        r.expect("created");
    }
    let err = topics::bootstrap(&admin, &names, &[Topic::AssetState], T)
        .await
        .expect_err("refused");
    assert!(
        matches!(&err, BootstrapError::NotCompacted { topic, found } if *topic == state && found == "delete"),
        "{err}"
    );
}

#[tokio::test]
async fn postgresql_accepts_the_migrations_and_enforces_one_row_per_trigger_key() {
    let url = fresh_database().await;
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    sluice_dispatcher::MIGRATOR
        .run(&pool)
        .await
        .expect("migrations apply");
    sluice_dispatcher::MIGRATOR
        .run(&pool)
        .await
        .expect("and re-apply as a no-op");
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .expect("tables");
    for t in ["dispatcher_epochs", "jobs", "trigger_history"] {
        assert!(tables.iter().any(|x| x == t), "{t} missing from {tables:?}");
    }
    let insert = "INSERT INTO trigger_history (trigger_key, dependency_id, dependency_version, target_kind, target_name, \
                  inputs, reason, first_commit_at, requested_at, source_partition, source_offset) \
                  VALUES ($1, 'dep', 1, 'WEBHOOK', 'w', '[]', 'test', now(), now(), 0, 0) \
                  ON CONFLICT (trigger_key) DO NOTHING RETURNING trigger_key";
    let key = "tk1-c90b8a6ff80fe66069651ca4bf00aeee";
    let first: Option<String> = sqlx::query_scalar(insert)
        .bind(key)
        .fetch_optional(&pool)
        .await
        .expect("insert");
    let second: Option<String> = sqlx::query_scalar(insert)
        .bind(key)
        .fetch_optional(&pool)
        .await
        .expect("insert");
    assert_eq!(
        (first.as_deref(), second),
        (Some(key), None),
        "the second insert of one key is a no-op"
    );
    let bad = sqlx::query(insert).bind("not-a-key").execute(&pool).await;
    assert!(
        bad.is_err(),
        "a malformed trigger_key is refused by the schema"
    );
    // A job that becomes UNKNOWN, then FAILED, is one notification event each, in
    // the transition's own transaction, keyed by the job's revision.
    sqlx::query("INSERT INTO jobs (trigger_key, dependency_id, status, target_kind, target_name) VALUES ($1, 'dep', 'PENDING', 'WEBHOOK', 'w')")
        .bind(key)
        .execute(&pool)
        .await
        .expect("job");
    for (status, revision) in [("UNKNOWN", 1), ("UNKNOWN", 1), ("FAILED", 2)] {
        sqlx::query(
            "UPDATE jobs SET status = $2, revision = $3, reason = 'test' WHERE trigger_key = $1",
        )
        .bind(key)
        .bind(status)
        .bind(revision)
        .execute(&pool)
        .await
        .expect("transition");
    }
    let events: Vec<(String, String)> =
        sqlx::query_as("SELECT event_key, kind FROM notification_events ORDER BY at")
            .fetch_all(&pool)
            .await
            .expect("events");
    assert_eq!(
        events,
        [
            (format!("job_unknown:{key}:1"), "job_unknown".to_owned()),
            (format!("run_failed:{key}:2"), "run_failed".to_owned())
        ],
        "one event per transition into UNKNOWN or FAILED, none for the same status again"
    );
    let epoch1 = sluice_dispatcher::take_epoch(&pool, "a")
        .await
        .expect("epoch");
    let epoch2 = sluice_dispatcher::take_epoch(&pool, "b")
        .await
        .expect("epoch");
    assert!(epoch2 > epoch1);
}
