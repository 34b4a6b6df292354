//! The global asset-state table: every resolver instance reads all partitions of
//! asset-state (a dependency may read any asset), keeps the newest revision of
//! each asset, and queues the keys that changed for the next evaluation pass.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::message::Message;
use sluice_core::packed::{PackedState, StateTable};
use sluice_core::{AssetKey, AssetState};
use sluice_kit::BlockingCodec;
use sluice_kit::changelog::{NewestByKey, Record};

use crate::metrics as m;

/// Every asset's newest state, packed: a resolver holds all of them.
pub type States = StateTable;

pub struct GlobalTable {
    states: RwLock<States>,
    changed: Mutex<Vec<AssetKey>>,
    caught_up: AtomicBool,
    records: AtomicU64,
    failed: Mutex<Option<String>>,
    /// The reader has ended (shutdown): waiting for it to catch up is pointless.
    ended: AtomicBool,
}

impl GlobalTable {
    pub fn new() -> Arc<Self> {
        Arc::new(GlobalTable {
            states: RwLock::new(StateTable::new()),
            changed: Mutex::new(Vec::new()),
            caught_up: AtomicBool::new(false),
            records: AtomicU64::new(0),
            failed: Mutex::new(None),
            ended: AtomicBool::new(false),
        })
    }

    pub fn read(&self) -> RwLockReadGuard<'_, States> {
        self.states.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Keys changed since the last call (possibly repeated).
    pub fn drain_changed(&self) -> Vec<AssetKey> {
        std::mem::take(&mut *self.changed.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// True once every partition was read to the end it had when reading began:
    /// before that, evaluating would judge dependencies on a partial, older view.
    pub fn caught_up(&self) -> bool {
        self.caught_up.load(Ordering::Acquire)
    }

    /// For a table filled by [`GlobalTable::apply`] alone (embedding, benchmarks).
    pub fn mark_caught_up(&self) {
        self.caught_up.store(true, Ordering::Release);
    }

    pub fn records_read(&self) -> u64 {
        self.records.load(Ordering::Relaxed)
    }

    /// Why the reader stopped, if it did.
    pub fn failure(&self) -> Option<String> {
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Waits until caught up; false on timeout or if the reader failed.
    pub fn wait_caught_up(&self, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        while !self.caught_up() {
            if Instant::now() > until
                || self.failure().is_some()
                || self.ended.load(Ordering::Acquire)
            {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// Applies one asset-state record: the newest revision wins, so a replayed or
    /// older record never moves an asset back. Returns whether the state changed.
    pub fn apply(&self, key: AssetKey, value: Option<(AssetState, i64)>) -> bool {
        let mut states = self.states.write().unwrap_or_else(|p| p.into_inner());
        let changed = match value {
            None => states.remove(key.as_str()).is_some(),
            Some((state, revision)) => match states.get(key.as_str()) {
                Some(have) if have.revision() >= revision => false,
                // The global table has no use for the partition a state came from.
                _ => {
                    states.insert(PackedState::pack(&state, revision, 0));
                    true
                }
            },
        };
        drop(states);
        if changed {
            self.changed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(key);
        }
        changed
    }

    /// Reads asset-state on a thread of its own until `stop`.
    pub fn spawn_reader(
        self: &Arc<Self>,
        config: ClientConfig,
        topic: String,
        codec: BlockingCodec,
        stop: Arc<AtomicBool>,
        timeout: Duration,
    ) -> std::thread::JoinHandle<()> {
        let table = self.clone();
        std::thread::Builder::new()
            .name("asset-state-reader".into())
            .spawn(move || {
                if let Err(e) = table.read_loop(config, &topic, &codec, &stop, timeout) {
                    tracing::error!(error = %e, "asset-state reader stopped");
                    *table.failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                }
                table.ended.store(true, Ordering::Release);
            })
            .expect("spawning a thread")
    }

    fn read_loop(
        &self,
        config: ClientConfig,
        topic: &str,
        codec: &BlockingCodec,
        stop: &AtomicBool,
        timeout: Duration,
    ) -> Result<(), sluice_kit::changelog::ChangelogError> {
        let started = Instant::now();
        // Until caught up, only each key's newest record is kept and decoded once
        // at the end (`NewestByKey`); after, every record is applied as it comes.
        let catching_up = RefCell::new(Some(NewestByKey::default()));
        sluice_kit::changelog::follow(
            &config,
            topic,
            timeout,
            stop,
            || {
                if let Some(newest) = catching_up.borrow_mut().take() {
                    let _ = newest.for_each(|r| {
                        self.apply_record(r, codec);
                        Ok::<(), ()>(())
                    });
                }
                metrics::histogram!(m::TABLE_RESTORE_SECONDS)
                    .record(started.elapsed().as_secs_f64());
                tracing::info!(
                    records = self.records_read(),
                    seconds = started.elapsed().as_secs_f64(),
                    "asset-state table caught up"
                );
                self.caught_up.store(true, Ordering::Release);
            },
            |msg| {
                self.records.fetch_add(1, Ordering::Relaxed);
                let r = Record {
                    partition: msg.partition(),
                    offset: msg.offset(),
                    key: msg.key(),
                    payload: msg.payload(),
                };
                let kept = catching_up
                    .borrow_mut()
                    .as_mut()
                    .is_some_and(|newest| newest.keep(r));
                if !kept {
                    self.apply_record(r, codec);
                }
            },
        )
    }

    fn apply_record(&self, r: Record<'_>, codec: &BlockingCodec) {
        match decode(r, codec) {
            Ok((key, value)) => {
                self.apply(key, value);
            }
            Err(e) => {
                // The state-updater wrote it; a record we cannot read is
                // a bug or a foreign writer. Counted and logged, not guessed at.
                metrics::counter!(m::TABLE_UNREADABLE_TOTAL).increment(1);
                let at = format!("asset-state {}@{}", r.partition, r.offset);
                tracing::error!(record = %at, error = %e, "unreadable asset-state record skipped");
            }
        }
    }
}

/// Why an asset-state record could not join the table.
#[derive(Debug, thiserror::Error)]
enum Unreadable {
    #[error("key is not UTF-8")]
    KeyNotUtf8,
    #[error("key: {0}")]
    Key(#[from] sluice_core::asset::AssetKeyError),
    #[error(transparent)]
    Codec(#[from] sluice_kit::CodecError),
    #[error(transparent)]
    Wire(#[from] sluice_kit::wire::WireError),
    #[error("record key {key} is not the state's asset {asset}")]
    OtherAsset { key: AssetKey, asset: AssetKey },
}

fn decode(
    r: Record<'_>,
    codec: &BlockingCodec,
) -> Result<(AssetKey, Option<(AssetState, i64)>), Unreadable> {
    let key = r
        .key
        .and_then(|k| std::str::from_utf8(k).ok())
        .ok_or(Unreadable::KeyNotUtf8)?;
    let key = AssetKey::parse(key)?;
    let Some(payload) = r.payload else {
        return Ok((key, None));
    };
    let record = codec.decode_state(payload)?;
    let (state, revision) = record.into_state()?;
    if state.asset_key != key {
        return Err(Unreadable::OtherAsset {
            key,
            asset: state.asset_key,
        });
    }
    Ok((key, Some((state, revision))))
}
