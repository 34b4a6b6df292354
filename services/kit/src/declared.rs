//! A topic of declared resources followed whole (the targets topic, for the
//! dispatcher, which applies them, and the API, which shows them): one
//! [`SharedDeclared`] per topic and process. Each record is kept as its JSON
//! document; what a document means is the owning service's to say.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::message::Message;

use crate::wire::DeclaredResource;
use crate::{BlockingCodec, SchemaName};

#[derive(Default)]
pub struct SharedDeclared {
    /// id → the JSON document, or why its record is not a resource.
    docs: RwLock<BTreeMap<String, Result<String, String>>>,
    caught_up: AtomicBool,
    /// Bumped on every change: a reader compares it with the one it built from.
    generation: AtomicU64,
    failed: RwLock<Option<String>>,
}

impl SharedDeclared {
    pub fn new() -> Arc<Self> {
        Arc::new(SharedDeclared::default())
    }

    pub fn snapshot(&self) -> BTreeMap<String, Result<String, String>> {
        self.docs.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn get(&self, id: &str) -> Option<Result<String, String>> {
        self.docs
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn caught_up(&self) -> bool {
        self.caught_up.load(Ordering::Acquire)
    }

    /// For documents filled by hand (tests, embedding).
    pub fn mark_caught_up(&self) {
        self.caught_up.store(true, Ordering::Release);
    }

    pub fn failure(&self) -> Option<String> {
        self.failed
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Waits until the follower has read the topic to its end.
    pub fn wait_caught_up(&self, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        while !self.caught_up() {
            if Instant::now() > until || self.failure().is_some() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    /// Applies one record (`None`: a tombstone, the resource is deleted).
    pub fn apply(&self, id: &str, doc: Option<Result<String, String>>) {
        let mut docs = self.docs.write().unwrap_or_else(|p| p.into_inner());
        match doc {
            Some(doc) => {
                docs.insert(id.to_owned(), doc);
            }
            None => {
                docs.remove(id);
            }
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Follows `topic` on a thread of its own until `stop`.
    pub fn spawn_follower(
        self: &Arc<Self>,
        config: ClientConfig,
        topic: String,
        codec: BlockingCodec,
        stop: Arc<AtomicBool>,
        timeout: Duration,
    ) -> std::thread::JoinHandle<()> {
        let shared = self.clone();
        std::thread::Builder::new()
            .name("declared-follower".into())
            .spawn(move || {
                let result = crate::changelog::follow(
                    &config,
                    &topic,
                    timeout,
                    &stop,
                    || shared.mark_caught_up(),
                    |msg| {
                        let Some(id) = msg.key().and_then(|k| std::str::from_utf8(k).ok()) else {
                            return;
                        };
                        let doc = msg.payload().map(|b| {
                            codec
                                .decode::<DeclaredResource>(SchemaName::DeclaredResource, b)
                                .map(|r| r.document)
                                .map_err(|e| e.to_string())
                        });
                        shared.apply(id, doc);
                    },
                );
                if let Err(e) = result {
                    tracing::error!(topic, error = %e, "declared-resource follower stopped");
                    *shared.failed.write().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                }
            })
            .expect("spawning a thread")
    }
}
