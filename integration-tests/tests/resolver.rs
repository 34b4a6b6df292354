//! The resolver as a process against the real broker.
//!
//! A run is a sequence of rounds; each round commits one new snapshot of every
//! asset (written to asset-state as the state-updater would) and waits until the
//! resolver has emitted that round's triggers. The expected trigger keys are
//! computed here with the same pure `decide::step`, round by round. The resolver is
//! kill -9'd during rounds (and, in the second test, a second instance joins and
//! one leaves); at the end every expected key is on the triggers topic exactly
//! once under `read_committed`, and no other key is.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use sluice_core::DependencySpec;
use sluice_core::decide::{self, Cause, Progress};
use sluice_core::{AssetEvent, AssetKey, AssetState, EventSource, Operation, TableFormat};
use sluice_integration_tests::{bootstrap, free_port, kafka, read_topic, service_binary, unique};
use sluice_kit::topics::{self, Topic, TopicNames};
use sluice_kit::wire::StateRecord;
use sluice_kit::wire::{TriggerRecord, WireSpec};
use sluice_kit::{Codec, SchemaName};

const T: Duration = Duration::from_secs(30);
const PARTITIONS: i32 = 4;
const ASSETS: usize = 24;

fn asset(i: usize) -> AssetKey {
    AssetKey::parse(&format!("lake.ods.t{i:03}")).expect("valid")
}

/// 48 dependencies: ALL over 2–3 assets, per-partition ALL, commit-count, and
/// nested ALL(ANY…) (deterministic per round given the order of `publish_round`).
fn specs() -> Vec<DependencySpec> {
    let mut out = Vec::new();
    for d in 0..48usize {
        let a = asset(d % ASSETS);
        let b = asset((d * 7 + 3) % ASSETS);
        let c = asset((d * 5 + 11) % ASSETS);
        let inputs: Vec<AssetKey> = [a, b, c]
            .into_iter()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let leaf = |k: &AssetKey| format!(r#"{{"input": {{"asset": "{k}"}}}}"#);
        let (condition, mode) = match d % 4 {
            0 => (
                format!(
                    r#"{{"all": [{}]}}"#,
                    inputs.iter().map(leaf).collect::<Vec<_>>().join(",")
                ),
                r#"{"kind": "snapshots"}"#,
            ),
            1 => (
                format!(
                    r#"{{"all": [{}]}}"#,
                    inputs.iter().map(leaf).collect::<Vec<_>>().join(",")
                ),
                r#"{"kind": "per_partition"}"#,
            ),
            2 => (
                format!(
                    r#"{{"input": {{"asset": "{}", "predicates": [{{"kind": "commits_since_trigger", "at_least": 3, "include_compaction": false}}]}}}}"#,
                    inputs[0]
                ),
                r#"{"kind": "snapshots"}"#,
            ),
            _ => (
                format!(
                    r#"{{"all": [{}, {{"any": [{}]}}]}}"#,
                    leaf(&inputs[0]),
                    inputs[1..].iter().map(leaf).collect::<Vec<_>>().join(",")
                ),
                r#"{"kind": "snapshots"}"#,
            ),
        };
        let json = format!(
            r#"{{"id": "dep-{d:03}", "version": 1, "owner_project": "it",
                "target": {{"kind": "webhook", "name": "hook-{d:03}"}},
                "condition": {condition}, "mode": {mode}}}"#
        );
        out.push(DependencySpec::from_json(&json).expect("test spec is valid"));
    }
    out
}

/// Asset states after `round` commits each (partition `r=NNN` per round).
fn states_at(round: i64) -> BTreeMap<AssetKey, AssetState> {
    let mut out = BTreeMap::new();
    for i in 0..ASSETS {
        let k = asset(i);
        let mut s = AssetState::new(k.clone(), TableFormat::Iceberg);
        for r in 1..=round {
            let mut e = AssetEvent::committed(
                k.clone(),
                TableFormat::Iceberg,
                r * 1_000 + i as i64,
                r,
                r * 60_000,
                EventSource::Push,
            );
            e.partitions = vec![format!("r={r:03}")];
            e.operation = Operation::Append;
            s.apply(&e);
        }
        out.insert(k, s);
    }
    out
}

/// The keys the pure evaluator emits when every round is seen whole.
fn expected_keys(specs: &[DependencySpec], rounds: i64) -> Vec<BTreeSet<String>> {
    let mut progress: BTreeMap<&str, Progress> = BTreeMap::new();
    let mut per_round = Vec::new();
    for r in 1..=rounds {
        let states = states_at(r);
        let mut keys = BTreeSet::new();
        for s in specs {
            let p = progress.entry(&s.id).or_insert_with(|| Progress {
                version: s.version,
                ..Progress::default()
            });
            for f in decide::step(s, p, &|a| states.get(a), 0, Cause::Change).fires {
                keys.insert(f.key.as_str().to_owned());
            }
        }
        per_round.push(keys);
    }
    per_round
}

/// A spec reading `input` whose target writes `out` (an edge of the lineage graph).
fn producing(id: &str, kind: &str, input: &str, out: &str) -> DependencySpec {
    DependencySpec::from_json(&format!(
        r#"{{"id": "{id}", "version": 1, "owner_project": "it", "target": {{"kind": "{kind}", "name": "{id}"}},
           "condition": {{"input": {{"asset": "{input}"}}}}, "produces": "{out}"}}"#
    ))
    .expect("valid alone")
}

/// Sends `spec` to one partition of the dependencies topic (not flushed).
async fn send_spec(
    p: &BaseProducer,
    codec: &Codec,
    topic: &str,
    partition: i32,
    spec: &DependencySpec,
) {
    let bytes = codec
        .encode(SchemaName::DependencySpec, topic, &WireSpec::from(spec))
        .await
        .expect("encode spec");
    p.send(
        BaseRecord::to(topic)
            .partition(partition)
            .key(&spec.id)
            .payload(&bytes),
    )
    .expect("send spec");
}

struct Run {
    names: TopicNames,
}

impl Run {
    async fn new() -> Self {
        let names = TopicNames::with_prefix(&format!("{}.", unique("rs")), PARTITIONS);
        let admin = kafka().admin("rs-test").expect("admin");
        topics::bootstrap(&admin, &names, &sluice_resolver::ACCESS.topics(), T)
            .await
            .expect("topics");
        Run { names }
    }

    fn producer(&self) -> BaseProducer {
        kafka()
            .producer_config("rs-test")
            .create()
            .expect("producer")
    }

    async fn publish_specs(&self, specs: &[DependencySpec]) {
        let codec = Codec::new(None);
        let p = self.producer();
        let topic = self.names.name(Topic::Dependencies);
        for s in specs {
            let bytes = codec
                .encode(SchemaName::DependencySpec, &topic, &WireSpec::from(s))
                .await
                .expect("encode spec");
            p.send(BaseRecord::to(&topic).key(&s.id).payload(&bytes))
                .expect("send spec");
        }
        // Bad input on the dependencies topic: garbage, and a valid-looking spec
        // that closes a cycle. Both must be dead-lettered; the rest keeps working.
        p.send(
            BaseRecord::to(&topic)
                .key("garbage")
                .payload(&[0xC3u8, 0x01, 0x02][..]),
        )
        .expect("send garbage");
        let cyc = |id: &str, input: &str, out: &str| producing(id, "command", input, out);
        // cyc-b, appended after cyc-a, is the spec that closes the cycle.
        for s in [
            cyc("cyc-a", "lake.x.a", "lake.x.b"),
            cyc("cyc-b", "lake.x.b", "lake.x.a"),
        ] {
            send_spec(&p, &codec, &topic, 0, &s).await;
        }
        p.flush(T).expect("flush");
    }

    /// A round reaches the resolver record by record, not at once, and an ANY fires
    /// on whatever part of it has arrived (real semantics: one ANY member advanced
    /// with the ALL leaf is enough). So that a round is judged whole, as the pure
    /// evaluator judges it, the round goes to one partition (the global table keeps
    /// its order) in descending key order: the ALL leaf of an ALL(ANY…) spec is its
    /// smallest input, so once it has advanced, every ANY member has too.
    async fn publish_round(&self, round: i64) {
        let codec = Codec::new(None);
        let p = self.producer();
        let topic = self.names.name(Topic::AssetState);
        for (k, s) in states_at(round).into_iter().rev() {
            let bytes = codec
                .encode(SchemaName::AssetState, &topic, &StateRecord::new(&s, round))
                .await
                .expect("encode state");
            p.send(
                BaseRecord::to(&topic)
                    .partition(0)
                    .key(k.as_str())
                    .payload(&bytes),
            )
            .expect("send state");
        }
        p.flush(T).expect("flush");
    }

    fn spawn(&self, instance: &str) -> Child {
        Command::new(service_binary("sluice-resolver"))
            .env("SLUICE_KAFKA_BOOTSTRAP", bootstrap())
            .env("SLUICE_TOPIC_PREFIX", &self.names.prefix)
            .env("SLUICE_TOPIC_PARTITIONS", PARTITIONS.to_string())
            .env("SLUICE_INSTANCE", instance)
            .env("SLUICE_ADMIN_ADDR", format!("127.0.0.1:{}", free_port()))
            .env(
                "SLUICE_LOG",
                std::env::var("SLUICE_TEST_SERVICE_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn resolver")
    }

    /// Trigger keys on the topic (committed only), with how often each appears.
    fn triggers(&self) -> BTreeMap<String, Vec<Vec<u8>>> {
        read_topic(&self.names.name(Topic::Triggers), PARTITIONS)
    }

    fn wait_for(&self, want: &BTreeSet<String>, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let have: BTreeSet<String> = self.triggers().into_keys().collect();
            if want.is_subset(&have) {
                return;
            }
            if Instant::now() >= deadline {
                panic!(
                    "{} expected triggers still missing; emitted but not expected: {:?}",
                    want.difference(&have).count(),
                    self.describe(have.difference(want))
                );
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// Dependency and input snapshots of the given trigger keys, for a failure message.
    fn describe<'k>(&self, keys: impl Iterator<Item = &'k String>) -> Vec<String> {
        let got = self.triggers();
        let codec = Codec::new(None);
        let rt = tokio::runtime::Handle::current();
        keys.filter_map(|k| got.get(k).map(|v| (k, v)))
            .map(|(k, v)| {
                let t: TriggerRecord = tokio::task::block_in_place(|| {
                    rt.block_on(codec.decode(SchemaName::TriggerRequest, &v[0]))
                })
                .expect("trigger decodes");
                let inputs: Vec<String> = t
                    .inputs
                    .iter()
                    .map(|i| format!("{}@{}", i.asset_key, i.snapshot_id))
                    .collect();
                format!("{} {k} {inputs:?}", t.dependency_id)
            })
            .collect()
    }

    async fn verify(&self, expected: &[BTreeSet<String>]) {
        let all: BTreeSet<String> = expected.iter().flatten().cloned().collect();
        let got = self.triggers();
        let doubled: Vec<&String> = got
            .iter()
            .filter(|(_, v)| v.len() > 1)
            .map(|(k, _)| k)
            .collect();
        let extra: Vec<&String> = got.keys().filter(|k| !all.contains(*k)).collect();
        let lost: Vec<&String> = all.iter().filter(|k| !got.contains_key(*k)).collect();
        println!(
            "triggers: expected {}, got {}, lost {}, doubled {}, unexpected {}",
            all.len(),
            got.len(),
            lost.len(),
            doubled.len(),
            extra.len()
        );
        assert!(lost.is_empty(), "lost: {lost:?}");
        assert!(doubled.is_empty(), "doubled: {doubled:?}");
        assert!(extra.is_empty(), "unexpected: {extra:?}");
        // A trigger carries what the dispatcher needs.
        let codec = Codec::new(None);
        let (key, bytes) = got.iter().next().expect("some trigger");
        let t: TriggerRecord = codec
            .decode(SchemaName::TriggerRequest, &bytes[0])
            .await
            .expect("trigger decodes");
        assert_eq!(&t.trigger_key, key);
        assert!(t.dependency_id.starts_with("dep-") && t.dependency_version == 1);
        assert!(
            !t.inputs.is_empty()
                && !t.reason.is_empty()
                && t.first_commit_ms > 0
                && t.requested_ms > 0
        );
        // Both bad spec records were dead-lettered, with their origin.
        let dlq = read_topic(&self.names.name(Topic::DeadLetter), PARTITIONS);
        assert!(
            dlq.contains_key("garbage"),
            "garbage spec dead-lettered: {:?}",
            dlq.keys()
        );
        assert!(
            dlq.contains_key("cyc-b"),
            "cycle-closing spec dead-lettered: {:?}",
            dlq.keys()
        );
    }
}

fn kill(child: &mut Child) {
    // SIGKILL: no drain, no commit, whatever transaction was open stays open.
    child.kill().expect("kill -9");
    let _ = child.wait();
}

/// SIGTERM: the instance commits its open transaction and leaves the group, so its
/// partitions move at once (a killed instance's would wait for the session timeout
/// and its open transaction would hold back read_committed readers until aborted).
fn stop(child: &mut Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(status.success());
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_triggers_under_repeated_kill_9() {
    const ROUNDS: i64 = 9;
    let run = Run::new().await;
    let specs = specs();
    let expected = expected_keys(&specs, ROUNDS);
    assert!(expected.iter().all(|r| !r.is_empty()));
    run.publish_specs(&specs).await;
    let mut resolver = run.spawn("a");
    let mut want = BTreeSet::new();
    for r in 1..=ROUNDS {
        run.publish_round(r).await;
        want.extend(expected[(r - 1) as usize].iter().cloned());
        if r % 3 == 0 {
            // Mid-round: the resolver is evaluating (or committing) this round.
            tokio::time::sleep(Duration::from_millis(50 * r as u64)).await;
            kill(&mut resolver);
            resolver = run.spawn("a");
        }
        run.wait_for(&want, Duration::from_secs(90));
    }
    // A last restart with nothing new must emit nothing.
    kill(&mut resolver);
    resolver = run.spawn("a");
    tokio::time::sleep(Duration::from_secs(8)).await;
    kill(&mut resolver);
    run.verify(&expected).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_and_a_rebalance_give_the_same_result() {
    const ROUNDS: i64 = 8;
    let run = Run::new().await;
    let specs = specs();
    let expected = expected_keys(&specs, ROUNDS);
    run.publish_specs(&specs).await;
    let mut a = run.spawn("a");
    let mut b: Option<Child> = None;
    let mut want = BTreeSet::new();
    for r in 1..=ROUNDS {
        run.publish_round(r).await;
        want.extend(expected[(r - 1) as usize].iter().cloned());
        match r {
            3 => b = Some(run.spawn("b")), // partitions move to b mid-round
            6 => stop(&mut a),             // and a leaves: all of them to b
            _ => {}
        }
        run.wait_for(&want, Duration::from_secs(90));
    }
    if let Some(mut b) = b {
        kill(&mut b);
    }
    run.verify(&expected).await;
}

/// A cycle spread over partitions owned by two resolver instances: each instance
/// alone sees one spec, and the old check (among the specs an instance owns) let
/// both through. Every instance follows the whole dependency set, so the spec
/// appended last — the one that closes the cycle — is refused, visibly (dead
/// letter with the cycle in its reason), and the other keeps working.
#[tokio::test(flavor = "multi_thread")]
async fn a_cycle_across_two_instances_is_refused_once_visibly() {
    const TWO: i32 = 2;
    let names = TopicNames::with_prefix(&format!("{}.", unique("rc")), TWO);
    let admin = kafka().admin("rc-test").expect("admin");
    topics::bootstrap(&admin, &names, &sluice_resolver::ACCESS.topics(), T)
        .await
        .expect("topics");
    let spawn = |instance: &str| {
        Command::new(service_binary("sluice-resolver"))
            .env("SLUICE_KAFKA_BOOTSTRAP", bootstrap())
            .env("SLUICE_TOPIC_PREFIX", &names.prefix)
            .env("SLUICE_TOPIC_PARTITIONS", TWO.to_string())
            .env("SLUICE_INSTANCE", instance)
            .env("SLUICE_ADMIN_ADDR", format!("127.0.0.1:{}", free_port()))
            .env("SLUICE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn resolver")
    };
    let (mut a, mut b) = (spawn("a"), spawn("b"));
    // Two members, two partitions: one each once the group has settled.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let codec = Codec::new(None);
    let topic = names.name(Topic::Dependencies);
    let p: BaseProducer = kafka()
        .producer_config("rc-test")
        .create()
        .expect("producer");
    let spec = |id: &str, input: &str, out: &str| producing(id, "webhook", input, out);
    for (partition, s) in [
        (0, spec("first", "lake.c.x", "lake.c.y")),
        (1, spec("closer", "lake.c.y", "lake.c.x")),
    ] {
        send_spec(&p, &codec, &topic, partition, &s).await;
        p.flush(T).expect("flush");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let dlq_topic = names.name(Topic::DeadLetter);
    let deadline = Instant::now() + Duration::from_secs(60);
    let refused = loop {
        let refused: Vec<_> = sluice_integration_tests::read_records(&dlq_topic, TWO)
            .into_iter()
            .filter(|r| {
                r.header(sluice_kit::dlq::HEADER_ERROR)
                    .is_some_and(|e| e.contains("cycle"))
            })
            .collect();
        if !refused.is_empty() || Instant::now() > deadline {
            break refused;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let keys: Vec<String> = refused
        .iter()
        .map(|r| String::from_utf8_lossy(r.key.as_deref().unwrap_or_default()).into_owned())
        .collect();
    println!(
        "refused across instances: {keys:?} ({:?})",
        refused
            .first()
            .and_then(|r| r.header(sluice_kit::dlq::HEADER_ERROR))
    );
    assert_eq!(keys, ["closer"], "the spec appended last closes the cycle");
    // The accepted one still triggers: a commit of its input fires it.
    let state_topic = names.name(Topic::AssetState);
    let k = AssetKey::parse("lake.c.x").expect("key");
    let mut s = AssetState::new(k.clone(), TableFormat::Iceberg);
    s.apply(&AssetEvent::committed(
        k.clone(),
        TableFormat::Iceberg,
        7,
        1,
        60_000,
        EventSource::Push,
    ));
    let bytes = codec
        .encode(
            SchemaName::AssetState,
            &state_topic,
            &StateRecord::new(&s, 1),
        )
        .await
        .expect("encode state");
    p.send(BaseRecord::to(&state_topic).key(k.as_str()).payload(&bytes))
        .expect("send state");
    p.flush(T).expect("flush");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = read_topic(&names.name(Topic::Triggers), TWO).len();
        if n == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the accepted spec did not fire ({n})"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for c in [&mut a, &mut b] {
        let _ = c.kill();
        let _ = c.wait();
    }
}
