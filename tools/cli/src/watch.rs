//! `sluice watch`: the pipeline as it happens. Over the API ([`follow_api`], the
//! default when an API is configured): its event stream — state changes,
//! dependency changes, triggers, run transitions — filtered to what the caller may
//! see. Straight on Kafka ([`run`], `--kafka`, or no API): each commit on
//! asset-events, each state change, each trigger with its snapshot combination,
//! each dispatch transition with its commit-to-dispatch latency, each dead letter
//! — then a summary; read_committed, so only what the services committed.

use std::collections::{BTreeMap, HashMap};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use sluice_core::{AssetEvent, JobStatus};
use sluice_kit::clock::now_ms;
use sluice_kit::config::Common;
use sluice_kit::wire::RunRecord;
use sluice_kit::wire::{StateRecord, TriggerRecord};
use sluice_kit::{Codec, SchemaName, Shutdown, Topic};

/// Prints the API's event stream (`GET /v1/events`) until Ctrl-C or `idle`
/// passes without an event: one line each, or with `json` one JSON object each.
pub async fn follow_api(
    client: &crate::client::Client,
    json: bool,
    idle: Option<Duration>,
) -> Result<(), crate::client::Failure> {
    let shutdown = Shutdown::new();
    shutdown.listen_for_signals();
    let stream = client.events("/v1/events", idle, |event, data| {
        let v: serde_json::Value = serde_json::from_str(data).unwrap_or_default();
        if json {
            let mut v = v;
            if event == "lagged" {
                v["type"] = "lagged".into();
            }
            println!("{v}");
        } else {
            println!("{}  {}", clock(now_ms()), api_line(event, &v));
        }
        true
    });
    tokio::select! {
        r = stream => r,
        _ = shutdown.wait_stopped() => Ok(()),
    }
}

/// One event of the API's stream as a line.
fn api_line(event: &str, v: &serde_json::Value) -> String {
    let s = |k: &str| match &v[k] {
        serde_json::Value::Null => "-".to_owned(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    match event {
        "state" => format!(
            "state     {:<28} revision {} latest sequence {}",
            s("asset"),
            s("revision"),
            s("sequence")
        ),
        "dependency" if v["deleted"] == true => format!("spec      {:<28} deleted", s("id")),
        "dependency" => format!("spec      {:<28} version {}", s("id"), s("version")),
        "progress" => format!(
            "trigger   {:<28} {} ({} in all)",
            s("dependency_id"),
            s("last_trigger_key"),
            s("triggers_total")
        ),
        "run" => {
            let reason = v["reason"]
                .as_str()
                .map(|r| format!(": {r}"))
                .unwrap_or_default();
            format!(
                "run       {:<28} {} {} (attempt {}){reason}",
                s("dependency_id"),
                s("trigger_key"),
                s("status"),
                s("attempt")
            )
        }
        "lagged" => format!(
            "lagged    missed {} events; re-read the lists (sluice get …)",
            s("missed")
        ),
        other => format!("{other:<9} {v}"),
    }
}

pub struct Args {
    pub from_start: bool,
    pub idle_exit: Option<Duration>,
}

/// `HH:MM:SS.mmm` UTC of an epoch-ms instant.
fn clock(ms: i64) -> String {
    let day = ms.rem_euclid(86_400_000);
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        day / 3_600_000,
        day / 60_000 % 60,
        day / 1_000 % 60,
        day % 1_000
    )
}

fn seconds(ms: i64) -> String {
    format!("{:.2} s", ms as f64 / 1000.0)
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[derive(Default)]
struct Summary {
    commits: u64,
    states: u64,
    triggers: u64,
    dead_letters: u64,
    /// Final status per trigger key.
    outcome: BTreeMap<String, JobStatus>,
    to_dispatch_ms: Vec<i64>,
    to_done_ms: Vec<i64>,
}

struct Watch {
    codec: Codec,
    topics: HashMap<String, Topic>,
    first_commit: HashMap<String, i64>,
    sum: Summary,
}

impl Watch {
    async fn show(
        &mut self,
        topic: Topic,
        key: &str,
        payload: Option<&[u8]>,
        headers: Vec<(String, String)>,
    ) {
        let at = clock(now_ms());
        let Some(payload) = payload else { return };
        match topic {
            Topic::AssetEvents => match self
                .codec
                .decode::<AssetEvent>(SchemaName::AssetEvent, payload)
                .await
            {
                Ok(e) => {
                    self.sum.commits += 1;
                    println!(
                        "{at}  commit    {:<28} snapshot {} (sequence {}) {:?} via {:?}",
                        e.asset_key.as_str(),
                        e.snapshot_id,
                        e.sequence,
                        e.operation,
                        e.source
                    );
                }
                Err(e) => println!("{at}  commit    {key}: undecodable: {e}"),
            },
            Topic::AssetState => match self
                .codec
                .decode::<StateRecord>(SchemaName::AssetState, payload)
                .await
            {
                Ok(s) => {
                    self.sum.states += 1;
                    let latest = s
                        .latest
                        .as_ref()
                        .map_or("-".into(), |l| l.sequence.to_string());
                    println!(
                        "{at}  state     {:<28} revision {} latest sequence {latest}, {} commits ({} data)",
                        s.asset_key.as_str(),
                        s.revision,
                        s.commit_count,
                        s.data_commit_count
                    );
                }
                Err(e) => println!("{at}  state     {key}: undecodable: {e}"),
            },
            Topic::Triggers => match self
                .codec
                .decode::<TriggerRecord>(SchemaName::TriggerRequest, payload)
                .await
            {
                Ok(t) => {
                    self.sum.triggers += 1;
                    self.first_commit
                        .insert(t.trigger_key.clone(), t.first_commit_ms);
                    let inputs: Vec<String> = t
                        .inputs
                        .iter()
                        .map(|i| format!("{}@{}", i.asset_key, i.sequence))
                        .collect();
                    println!(
                        "{at}  trigger   {:<28} {} [{}] ({}; commit→trigger {})",
                        t.target.name,
                        t.trigger_key,
                        inputs.join(", "),
                        t.reason,
                        seconds(t.requested_ms - t.first_commit_ms)
                    );
                }
                Err(e) => println!("{at}  trigger   {key}: undecodable: {e}"),
            },
            Topic::Runs => match self
                .codec
                .decode::<RunRecord>(SchemaName::RunStatus, payload)
                .await
            {
                Ok(r) => {
                    let since = self
                        .first_commit
                        .get(&r.trigger_key)
                        .map(|f| r.updated_ms - f);
                    match (r.status, since) {
                        (JobStatus::Running, Some(ms)) => self.sum.to_dispatch_ms.push(ms),
                        (JobStatus::Succeeded | JobStatus::Failed, Some(ms)) => {
                            self.sum.to_done_ms.push(ms)
                        }
                        _ => {}
                    }
                    self.sum.outcome.insert(r.trigger_key.clone(), r.status);
                    let latency = match (r.status, since) {
                        (JobStatus::Running, Some(ms)) => {
                            format!(" (commit→dispatch {})", seconds(ms))
                        }
                        (JobStatus::Succeeded | JobStatus::Failed, Some(ms)) => {
                            format!(" (commit→done {})", seconds(ms))
                        }
                        _ => String::new(),
                    };
                    println!(
                        "{at}  dispatch  {:<28} {} {:?} attempt {}{}{latency}",
                        r.target_name,
                        r.trigger_key,
                        r.status,
                        r.attempt,
                        r.reason.map_or(String::new(), |x| format!(": {x}")),
                    );
                }
                Err(e) => println!("{at}  dispatch  {key}: undecodable: {e}"),
            },
            Topic::DeadLetter => {
                self.sum.dead_letters += 1;
                let h: BTreeMap<String, String> = headers.into_iter().collect();
                println!(
                    "{at}  DEAD      from {}@{}: {}",
                    h.get("sluice.dlq.topic").map_or("?", String::as_str),
                    h.get("sluice.dlq.offset").map_or("?", String::as_str),
                    h.get("sluice.dlq.error").map_or("?", String::as_str)
                );
            }
            _ => {}
        }
    }

    fn summary(&mut self) {
        let s = &mut self.sum;
        s.to_dispatch_ms.sort_unstable();
        s.to_done_ms.sort_unstable();
        let count = |st: JobStatus| s.outcome.values().filter(|x| **x == st).count();
        println!("\n── summary ──");
        println!(
            "commits {}  state changes {}  triggers {}  dead letters {}",
            s.commits, s.states, s.triggers, s.dead_letters
        );
        println!(
            "dispatches: {} succeeded, {} failed, {} running, {} pending, {} unknown",
            count(JobStatus::Succeeded),
            count(JobStatus::Failed),
            count(JobStatus::Running),
            count(JobStatus::Pending),
            count(JobStatus::Unknown)
        );
        if !s.to_dispatch_ms.is_empty() {
            println!(
                "commit→dispatch p50 {} p99 {} max {}; commit→done p50 {} p99 {}",
                seconds(percentile(&s.to_dispatch_ms, 0.5)),
                seconds(percentile(&s.to_dispatch_ms, 0.99)),
                seconds(*s.to_dispatch_ms.last().unwrap_or(&0)),
                seconds(percentile(&s.to_done_ms, 0.5)),
                seconds(percentile(&s.to_done_ms, 0.99)),
            );
        }
    }
}

pub async fn run(common: &Common, args: Args) -> ExitCode {
    let shutdown = Shutdown::new();
    shutdown.listen_for_signals();
    let watched = [
        Topic::AssetEvents,
        Topic::AssetState,
        Topic::Triggers,
        Topic::Runs,
        Topic::DeadLetter,
    ];
    let mut cfg = common
        .kafka
        .reader_config(&format!("sluice-watch-{}", std::process::id()));
    cfg.set("enable.partition.eof", "false");
    let consumer: BaseConsumer = match cfg.create() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kafka: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut tpl = TopicPartitionList::new();
    let mut topics = HashMap::new();
    for t in watched {
        let name = common.topics.name(t);
        let partitions = match consumer.fetch_metadata(Some(&name), Duration::from_secs(30)) {
            Ok(md) => md.topics().first().map_or(0, |x| x.partitions().len()),
            Err(e) => {
                eprintln!("metadata of {name}: {e}");
                return ExitCode::FAILURE;
            }
        };
        for p in 0..partitions as i32 {
            let from = if args.from_start {
                Offset::Beginning
            } else {
                Offset::End
            };
            let _ = tpl.add_partition_offset(&name, p, from);
        }
        topics.insert(name, t);
    }
    if let Err(e) = consumer.assign(&tpl) {
        eprintln!("assign: {e}");
        return ExitCode::FAILURE;
    }
    let mut w = Watch {
        codec: Codec::new(common.schema_registry_url.as_deref()),
        topics,
        first_commit: HashMap::new(),
        sum: Summary::default(),
    };
    println!(
        "watching {}{{asset-events,asset-state,triggers,runs,dead-letter}} (times UTC)",
        common.topics.prefix
    );
    let mut last = Instant::now();
    while !shutdown.is_stopping() {
        if args.idle_exit.is_some_and(|idle| last.elapsed() >= idle) {
            break;
        }
        // Short blocking polls keep the runtime free for the signal handler.
        let msg = tokio::task::block_in_place(|| consumer.poll(Duration::from_millis(100)));
        let Some(Ok(m)) = msg else { continue };
        last = Instant::now();
        let Some(topic) = w.topics.get(m.topic()).copied() else {
            continue;
        };
        let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
        let headers = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|x| {
                        (
                            x.key.to_owned(),
                            String::from_utf8_lossy(x.value.unwrap_or_default()).into_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let payload = m.payload().map(<[u8]>::to_vec);
        w.show(topic, &key, payload.as_deref(), headers).await;
    }
    w.summary();
    ExitCode::SUCCESS
}
