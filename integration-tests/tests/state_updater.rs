//! The state-updater as a process against the real broker: exactly-once fold under
//! kill -9, and two instances with a rebalance in the middle of the run.
//!
//! The check: the final asset-state equals the pure fold of the input computed here
//! independently, and per asset the published revisions are exactly 1, 2, …, n where
//! n is the number of changes the pure fold makes in log order — so no state version
//! was ever produced twice or skipped.

use std::collections::{BTreeMap, HashMap};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use sluice_core::{
    AssetEvent, AssetKey, AssetState, EventKind, EventSource, FoldOutcome, Operation, TableFormat,
};
use sluice_integration_tests::{
    bootstrap, committed_total, free_port, kafka, read_topic, service_binary, unique,
};
use sluice_kit::topics::{self, Topic, TopicNames};
use sluice_kit::wire::StateRecord;
use sluice_kit::{Codec, SchemaName};

const T: Duration = Duration::from_secs(30);
const PARTITIONS: i32 = 4;

/// `assets` × `per_asset` commits, with duplicates and local reordering mixed in,
/// deterministic from `seed`. Every 7th event also carries a watermark.
fn workload(assets: usize, per_asset: i64, seed: u64) -> Vec<AssetEvent> {
    let mut events = Vec::new();
    for a in 0..assets {
        let key = AssetKey::parse(&format!("lake.ods.t{a:04}")).expect("valid");
        for seq in 1..=per_asset {
            let mut e = AssetEvent::new(
                key.clone(),
                TableFormat::Paimon,
                EventKind::SnapshotCommitted,
                seq * 100 + 7,
                seq,
                1_000 * seq,
                EventSource::Poll,
            );
            e.partitions = vec![format!("dt=2026-12-{:02}", seq % 28 + 1)];
            e.operation = if seq % 5 == 0 {
                Operation::Compact
            } else {
                Operation::Append
            };
            if seq % 7 == 0 {
                e.watermark_ms = Some(seq * 10);
            }
            events.push(e);
        }
    }
    // Shuffle (reorders within and across assets) and duplicate every 10th event.
    let mut x = seed | 1;
    for i in (1..events.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        events.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let dups: Vec<AssetEvent> = events.iter().step_by(10).cloned().collect();
    for (i, d) in dups.into_iter().enumerate() {
        let at = (i * 37) % events.len();
        events.insert(at, d);
    }
    events
}

struct Run {
    names: TopicNames,
    group: String,
}

impl Run {
    async fn new() -> Self {
        let names = TopicNames::with_prefix(&format!("{}.", unique("su")), PARTITIONS);
        let admin = kafka().admin("su-test").expect("admin");
        topics::bootstrap(
            &admin,
            &names,
            &[Topic::AssetEvents, Topic::AssetState, Topic::DeadLetter],
            T,
        )
        .await
        .expect("topics");
        let group = format!("{}state-updater", names.prefix);
        Run { names, group }
    }

    async fn produce(&self, events: &[AssetEvent], garbage: usize) {
        let codec = Codec::new(None);
        let p: BaseProducer = kafka()
            .producer_config("su-test")
            .create()
            .expect("producer");
        let topic = self.names.name(Topic::AssetEvents);
        for e in events {
            let bytes = codec
                .encode(SchemaName::AssetEvent, &topic, e)
                .await
                .expect("encode");
            let key = e.asset_key.as_str().to_owned();
            loop {
                match p.send(BaseRecord::to(&topic).key(&key).payload(&bytes)) {
                    Ok(()) => break,
                    Err((_, _)) => {
                        p.poll(Duration::from_millis(50));
                    }
                }
            }
        }
        for i in 0..garbage {
            let key = format!("lake.ods.t{i:04}");
            p.send(
                BaseRecord::to(&topic)
                    .key(&key)
                    .payload(&[0xC3u8, 0x01, 0xFF][..]),
            )
            .expect("send garbage");
        }
        p.flush(T).expect("flush");
    }

    fn spawn(&self, instance: &str) -> Child {
        self.spawn_batched(instance, 200)
    }

    fn spawn_batched(&self, instance: &str, batch: usize) -> Child {
        Command::new(service_binary("sluice-state-updater"))
            .env("SLUICE_KAFKA_BOOTSTRAP", bootstrap())
            .env("SLUICE_TOPIC_PREFIX", &self.names.prefix)
            .env("SLUICE_TOPIC_PARTITIONS", PARTITIONS.to_string())
            .env("SLUICE_INSTANCE", instance)
            .env("SLUICE_ADMIN_ADDR", format!("127.0.0.1:{}", free_port()))
            .env("SLUICE_BATCH_MAX_RECORDS", batch.to_string())
            .env("SLUICE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn state-updater")
    }

    /// Offsets the group has committed on asset-events (a killed instance's open
    /// transaction not counted); asks again while the broker cannot answer.
    fn committed(&self) -> i64 {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            match committed_total(
                &self.group,
                &self.names.name(Topic::AssetEvents),
                PARTITIONS,
            ) {
                Ok(n) => return n,
                Err(e) => {
                    assert!(
                        Instant::now() < deadline,
                        "committed offsets unavailable: {e}"
                    );
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }

    fn wait_committed(&self, total: i64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.committed() < total {
            assert!(
                Instant::now() < deadline,
                "only {} of {total} events committed",
                self.committed()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    fn read(&self, topic: Topic) -> BTreeMap<String, Vec<Vec<u8>>> {
        read_topic(&self.names.name(topic), PARTITIONS)
    }

    /// Compares asset-state with the pure fold of `events` in per-asset log order.
    async fn verify(&self, events: &[AssetEvent]) {
        let mut by_asset: HashMap<&AssetKey, Vec<&AssetEvent>> = HashMap::new();
        for e in events {
            by_asset.entry(&e.asset_key).or_default().push(e);
        }
        let codec = Codec::new(None);
        let published = self.read(Topic::AssetState);
        assert_eq!(published.len(), by_asset.len(), "one state key per asset");
        let (mut versions, mut mismatched) = (0usize, Vec::new());
        for (asset, evs) in &by_asset {
            let mut pure = AssetState::new((*asset).clone(), TableFormat::Paimon);
            let changes = evs
                .iter()
                .filter(|e| pure.apply(e) == FoldOutcome::Changed)
                .count() as i64;
            let records = published.get(asset.as_str()).expect("asset published");
            let mut revisions = Vec::new();
            let mut last = None;
            for bytes in records {
                let rec: StateRecord = codec
                    .decode(SchemaName::AssetState, bytes)
                    .await
                    .expect("state decodes");
                revisions.push(rec.revision);
                last = Some(rec);
            }
            versions += revisions.len();
            let expected: Vec<i64> = (1..=changes).collect();
            assert_eq!(revisions, expected, "{asset}: revisions doubled or skipped");
            let (state, _) = last.expect("at least one").into_state().expect("valid");
            if state != pure {
                mismatched.push(asset.to_string());
            }
        }
        assert!(
            mismatched.is_empty(),
            "final state differs from the pure fold for {mismatched:?}"
        );
        eprintln!(
            "verified {} assets, {versions} state versions, 0 doubled, 0 skipped",
            by_asset.len()
        );
    }
}

fn kill9(child: &mut Child) {
    child.kill().expect("kill -9");
    let _ = child.wait();
}

/// One at a time: the kill -9 test needs each incarnation to be cut off mid-run,
/// which a machine loaded by a second state-updater test (2 cores) can outpace.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread")]
async fn exactly_once_fold_under_repeated_kill_9() {
    /// Events per transaction of the killed incarnations.
    const BATCH: usize = 5;
    let _turn = SERIAL.lock().await;
    let run = Run::new().await;
    let events = workload(500, 21, 42);
    assert!(events.len() >= 10_000, "{} events", events.len());
    let (early, late) = events.split_at(events.len() * 2 / 3);
    run.produce(early, 3).await;
    let mut produced = early.len() as i64 + 3;
    let mut kills = 0;
    let mut seen = 0;
    for round in 0..6 {
        if round == 3 {
            // New events for assets whose states must be restored after the kills.
            run.produce(late, 0).await;
            produced += late.len() as i64;
        }
        // Small transactions: a run of 10,000 events takes thousands of commits,
        // so a kill after a few lands mid-run however fast the machine is (with
        // 20 a transaction, one CI run's incarnations finished the workload
        // between two reads of the committed count).
        let before = run.committed();
        if before >= produced {
            break;
        }
        let mut child = run.spawn_batched("0", BATCH);
        // Kill -9 once this incarnation has committed ten more transactions:
        // mid-run, with a batch in flight and states in memory that must come back
        // from asset-state.
        let deadline = Instant::now() + Duration::from_secs(60);
        let cut = before + 10 * BATCH as i64;
        loop {
            seen = run.committed();
            if seen > cut || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        kill9(&mut child);
        kills += 1;
    }
    // What the last kill cut short.
    let committed_before_final = seen;
    assert!(kills >= 4, "only {kills} kills happened");
    assert!(
        committed_before_final < produced,
        "the kills must interrupt the run, not follow it"
    );
    let mut child = run.spawn("0");
    run.wait_committed(produced, Duration::from_secs(180));
    kill9(&mut child);
    eprintln!(
        "{kills} kill -9 during the run; {committed_before_final} of {produced} events committed before the last start"
    );
    run.verify(&events).await;
    let dead = run.read(Topic::DeadLetter);
    assert_eq!(
        dead.values().map(Vec::len).sum::<usize>(),
        3,
        "the three garbage records are dead-lettered once each"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn two_instances_and_a_rebalance_give_the_same_result() {
    let _turn = SERIAL.lock().await;
    let run = Run::new().await;
    let events = workload(300, 19, 7);
    let (first, second) = events.split_at(events.len() / 2);
    run.produce(first, 0).await;
    let mut a = run.spawn("a");
    let deadline = Instant::now() + Duration::from_secs(60);
    while run.committed() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    // b joins while a is mid-run: a cooperative-sticky rebalance hands partitions over.
    let mut b = run.spawn("b");
    run.produce(second, 0).await;
    std::thread::sleep(Duration::from_millis(4000));
    // b leaves mid-run (crash), a takes its partitions over.
    kill9(&mut b);
    run.wait_committed(events.len() as i64, Duration::from_secs(180));
    kill9(&mut a);
    run.verify(&events).await;
}

/// A static member fenced after its session timed out (seen after a broker restart)
/// has a consumer that never delivers again. Another consumer joining the group
/// under the state-updater's group.instance.id fences it the same way: the loop
/// builds a new consumer, restores, and the fold stays exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn a_fenced_consumer_is_rebuilt_and_the_fold_stays_exactly_once() {
    let _turn = SERIAL.lock().await;
    let run = Run::new().await;
    let events = workload(100, 11, 3);
    let (first, second) = events.split_at(events.len() / 2);
    run.produce(first, 0).await;
    let mut a = run.spawn("f");
    run.wait_committed(first.len() as i64, Duration::from_secs(90));
    sluice_integration_tests::fence_static_member(
        "sluice-state-updater-f",
        &run.group,
        &run.names.name(Topic::AssetEvents),
    );
    run.produce(second, 0).await;
    run.wait_committed(events.len() as i64, Duration::from_secs(120));
    assert!(
        a.try_wait().expect("wait").is_none(),
        "it rode the fencing out"
    );
    kill9(&mut a);
    run.verify(&events).await;
}
