//! What the API knows of the engine, followed whole from the compacted topics (as
//! every resolver instance follows them): asset-state, dependencies,
//! resolver-progress; and runs, for the event stream. Nothing here is the API's
//! own: a restart reads it all again, and any number of instances agree.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::message::{BorrowedMessage, Message};
use serde::Serialize;
use sluice_core::dependency::cycle_verdicts;
use sluice_core::packed::PackedState;
use sluice_core::{AssetKey, AssetState, DependencySpec, Progress};
use sluice_kit::grants::SharedGrants;
use sluice_kit::wire::{ProgressRecord, RunRecord, WireSpec};
use sluice_kit::{BlockingCodec, SchemaName};
use tokio::sync::broadcast;

/// Where a dependency record sits in the topic's append order (timestamp ms,
/// partition, offset), as the resolver orders them for the cycle verdict.
pub type Order = (i64, i32, i64);

/// One key of the dependencies topic.
#[derive(Clone, Debug)]
pub struct SpecEntry {
    pub order: Order,
    /// The spec, or why its record is not one (the resolver dead-letters it).
    pub spec: Result<DependencySpec, String>,
}

#[derive(Default)]
pub struct Tables {
    /// Ordered, so a page of a prefix is a range read, not a scan; packed, since
    /// an API instance holds every asset (`PackedState::unpack` reads one).
    pub assets: BTreeMap<AssetKey, PackedState>,
    pub specs: BTreeMap<String, SpecEntry>,
    pub progress: HashMap<String, Progress>,
    /// Next offset to read of each dependencies partition (read-your-writes).
    pub specs_next: HashMap<i32, i64>,
    /// Refusals by the cycle rule, recomputed when the specs change.
    refused: Option<HashMap<String, String>>,
    /// The grants, when they are enforced (`SLUICE_GRANTS=enforce`).
    pub enforced: Option<Arc<SharedGrants>>,
}

impl Tables {
    /// Why `id` is refused (bad record, cycle, no grant), or none: accepted.
    pub fn refusal(&mut self, id: &str) -> Option<String> {
        let spec = match &self.specs.get(id)?.spec {
            Err(e) => return Some(e.clone()),
            Ok(s) => s.clone(),
        };
        if let Some(cycle) = self.cycle_refusals().get(id) {
            return Some(cycle.clone());
        }
        self.enforced
            .as_ref()
            .and_then(|g| g.check(&spec).err())
            .map(|e| e.to_string())
    }

    /// The cycle verdicts of the whole set in append order, as every resolver
    /// instance reaches them ([`cycle_verdicts`]).
    fn cycle_refusals(&mut self) -> &HashMap<String, String> {
        if self.refused.is_none() {
            let mut producing: Vec<(&Order, &DependencySpec)> = self
                .specs
                .values()
                .filter_map(|e| match &e.spec {
                    Ok(s) if s.produces.is_some() => Some((&e.order, s)),
                    _ => None,
                })
                .collect();
            producing.sort_by_key(|(o, _)| **o);
            let ordered: Vec<&DependencySpec> = producing.iter().map(|(_, s)| *s).collect();
            let mut refused = HashMap::new();
            for (s, verdict) in ordered.iter().zip(cycle_verdicts(&ordered)) {
                if let Err(e) = verdict {
                    refused.insert(s.id.clone(), e.to_string());
                }
            }
            self.refused = Some(refused);
        }
        self.refused.get_or_insert_default()
    }

    /// The specs that stand (valid and not refused), for a new spec's cycle check.
    pub fn accepted(&mut self) -> Vec<DependencySpec> {
        let refused = self.cycle_refusals().clone();
        self.specs
            .values()
            .filter_map(|e| e.spec.as_ref().ok())
            .filter(|s| !refused.contains_key(&s.id))
            .cloned()
            .collect()
    }
}

/// A change, for `GET /v1/events`.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    State {
        asset: String,
        sequence: Option<i64>,
        revision: i64,
    },
    Dependency {
        id: String,
        version: Option<i64>,
        deleted: bool,
    },
    Progress {
        dependency_id: String,
        last_trigger_key: Option<String>,
        triggers_total: u64,
    },
    Run {
        trigger_key: String,
        dependency_id: String,
        status: String,
        attempt: i32,
        reason: Option<String>,
    },
}

pub struct View {
    tables: RwLock<Tables>,
    /// Every grant (followed whether or not they are enforced, to list them).
    pub grants: Arc<SharedGrants>,
    caught_up: AtomicUsize,
    failed: RwLock<Option<String>>,
    pub events: broadcast::Sender<Event>,
}

/// The topics followed before the API is ready.
pub const FOLLOWED: usize = 3;

impl View {
    /// A view whose grants are shown but not enforced.
    pub fn new() -> Arc<View> {
        Self::with_grants(SharedGrants::new(), false)
    }

    /// A view over `grants`; `enforce`: a spec no grant allows is refused.
    pub fn with_grants(grants: Arc<SharedGrants>, enforce: bool) -> Arc<View> {
        Arc::new(View {
            tables: RwLock::new(Tables {
                enforced: enforce.then(|| grants.clone()),
                ..Tables::default()
            }),
            grants,
            caught_up: AtomicUsize::new(0),
            failed: RwLock::new(None),
            events: broadcast::channel(4_096).0,
        })
    }

    pub fn read(&self) -> RwLockReadGuard<'_, Tables> {
        self.tables.read().unwrap_or_else(|p| p.into_inner())
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, Tables> {
        self.tables.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks every followed table read to its end: for a view filled by hand.
    pub fn mark_caught_up(&self) {
        self.caught_up.store(FOLLOWED, Ordering::Relaxed);
    }

    pub fn ready(&self) -> bool {
        self.caught_up.load(Ordering::Relaxed) >= FOLLOWED && self.failure().is_none()
    }

    pub fn failure(&self) -> Option<String> {
        self.failed
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn publish(&self, e: Event) {
        // No subscriber is fine: the stream is for whoever listens now.
        let _ = self.events.send(e);
    }

    /// Applies one asset-state record (`None`: a tombstone).
    pub fn apply_state(&self, key: &str, record: Option<(AssetState, i64)>) {
        let Ok(asset) = AssetKey::parse(key) else {
            return;
        };
        let event = Event::State {
            asset: key.to_owned(),
            sequence: record
                .as_ref()
                .and_then(|(s, _)| s.latest.as_ref().map(|c| c.sequence)),
            revision: record.as_ref().map_or(-1, |(_, r)| *r),
        };
        {
            let mut t = self.write();
            match record {
                Some((state, revision)) => {
                    // The API has no use for the partition a state came from.
                    t.assets
                        .insert(asset, PackedState::pack(&state, revision, 0));
                }
                None => {
                    t.assets.remove(&asset);
                }
            }
        }
        self.publish(event);
    }

    /// Applies one dependencies record (`None`: a tombstone).
    pub fn apply_spec(&self, id: &str, order: Order, spec: Option<Result<DependencySpec, String>>) {
        let event = Event::Dependency {
            id: id.to_owned(),
            version: spec
                .as_ref()
                .and_then(|s| s.as_ref().ok().map(|s| s.version)),
            deleted: spec.is_none(),
        };
        {
            let mut t = self.write();
            let next = t.specs_next.entry(order.1).or_insert(0);
            *next = (*next).max(order.2 + 1);
            match spec {
                Some(spec) => {
                    t.specs.insert(id.to_owned(), SpecEntry { order, spec });
                }
                None => {
                    t.specs.remove(id);
                }
            }
            t.refused = None;
        }
        self.publish(event);
    }

    /// Applies one resolver-progress record (`None`: a tombstone).
    pub fn apply_progress(&self, id: &str, progress: Option<Progress>) {
        let event = progress.as_ref().map(|p| Event::Progress {
            dependency_id: id.to_owned(),
            last_trigger_key: p.last_trigger_key.as_ref().map(|k| k.as_str().to_owned()),
            triggers_total: p.triggers_total,
        });
        {
            let mut t = self.write();
            match progress {
                Some(p) => {
                    t.progress.insert(id.to_owned(), p);
                }
                None => {
                    t.progress.remove(id);
                }
            }
        }
        if let Some(e) = event {
            self.publish(e);
        }
    }

    /// Waits until the dependencies follower has read past `offset` of `partition`.
    pub async fn wait_spec_read(&self, partition: i32, offset: i64, timeout: Duration) -> bool {
        let until = tokio::time::Instant::now() + timeout;
        loop {
            if self.read().specs_next.get(&partition).copied().unwrap_or(0) > offset {
                return true;
            }
            if tokio::time::Instant::now() > until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// How a follower reads its topic.
pub struct Follow {
    pub config: ClientConfig,
    pub codec: BlockingCodec,
    pub stop: Arc<AtomicBool>,
    pub timeout: Duration,
}

/// Which topic a follower reads, and so how it decodes.
#[derive(Clone, Copy, Debug)]
pub enum Followed {
    AssetState,
    Dependencies,
    ResolverProgress,
    Runs,
}

impl View {
    /// Follows `topic` on a thread of its own until the stop flag.
    pub fn spawn_follower(
        self: &Arc<Self>,
        what: Followed,
        topic: String,
        f: Follow,
    ) -> std::thread::JoinHandle<()> {
        let view = self.clone();
        std::thread::Builder::new()
            .name(format!("follow-{topic}"))
            .spawn(move || {
                let counts = !matches!(what, Followed::Runs);
                let result = sluice_kit::changelog::follow(
                    &f.config,
                    &topic,
                    f.timeout,
                    &f.stop,
                    || {
                        if counts {
                            view.caught_up.fetch_add(1, Ordering::Relaxed);
                        }
                    },
                    |msg| view.on_record(what, &f, msg),
                );
                if let Err(e) = result {
                    tracing::error!(topic, error = %e, "follower stopped");
                    *view.failed.write().unwrap_or_else(|p| p.into_inner()) =
                        Some(format!("{topic}: {e}"));
                }
            })
            .expect("spawning a thread")
    }

    fn on_record(&self, what: Followed, f: &Follow, msg: &BorrowedMessage<'_>) {
        let Some(key) = msg.key().and_then(|k| std::str::from_utf8(k).ok()) else {
            return;
        };
        let payload = msg.payload();
        match what {
            Followed::AssetState => {
                let record = payload.and_then(|b| {
                    f.codec
                        .decode_state(b)
                        .ok()
                        .and_then(|r| r.into_state().ok())
                });
                if payload.is_none() || record.is_some() {
                    self.apply_state(key, record);
                }
            }
            Followed::Dependencies => {
                let order = (
                    msg.timestamp().to_millis().unwrap_or(0),
                    msg.partition(),
                    msg.offset(),
                );
                let spec = payload.map(|b| {
                    f.codec
                        .decode::<WireSpec>(SchemaName::DependencySpec, b)
                        .map_err(|e| format!("the record does not decode: {e}"))
                        .and_then(|w| w.into_spec(key).map_err(|e| e.to_string()))
                });
                self.apply_spec(key, order, spec);
            }
            Followed::ResolverProgress => {
                let progress = payload.and_then(|b| {
                    f.codec
                        .decode::<ProgressRecord>(SchemaName::ResolverProgress, b)
                        .ok()
                        .and_then(|r| r.into_progress().ok())
                });
                if payload.is_none() || progress.is_some() {
                    self.apply_progress(key, progress);
                }
            }
            Followed::Runs => {
                if let Some(r) =
                    payload.and_then(|b| f.codec.decode::<RunRecord>(SchemaName::RunStatus, b).ok())
                {
                    self.publish(Event::Run {
                        trigger_key: r.trigger_key,
                        dependency_id: r.dependency_id,
                        status: r.status.as_str().to_owned(),
                        attempt: r.attempt,
                        reason: r.reason,
                    });
                }
            }
        }
    }
}
