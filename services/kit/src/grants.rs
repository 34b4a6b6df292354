//! The grants topic followed whole, for the resolver (which enforces grants) and
//! the API (which shows and checks them): one [`SharedGrants`] per process.

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::message::Message;
use sluice_core::DependencySpec;
use sluice_core::grants::{GrantError, Grants};

use crate::wire::WireGrant;
use crate::{BlockingCodec, SchemaName};

/// `SLUICE_GRANTS`: whether grants are enforced. Off by default, so a deployment
/// without grants keeps working; `enforce` refuses what no grant allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrantsMode {
    Off,
    Enforce,
}

impl FromStr for GrantsMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(GrantsMode::Off),
            "enforce" => Ok(GrantsMode::Enforce),
            other => Err(format!("{other:?}: use off or enforce")),
        }
    }
}

#[derive(Default)]
pub struct SharedGrants {
    grants: RwLock<Grants>,
    caught_up: AtomicBool,
    /// Set on every change; the resolver takes it to re-check its dependencies.
    changed: AtomicBool,
    failed: RwLock<Option<String>>,
}

impl SharedGrants {
    pub fn new() -> Arc<Self> {
        Arc::new(SharedGrants::default())
    }

    pub fn snapshot(&self) -> Grants {
        self.grants
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether `spec` may run under the grants in force.
    pub fn check(&self, spec: &DependencySpec) -> Result<(), GrantError> {
        self.grants
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .check(spec)
    }

    pub fn caught_up(&self) -> bool {
        self.caught_up.load(Ordering::Acquire)
    }

    /// For grants filled by hand (tests, embedding).
    pub fn mark_caught_up(&self) {
        self.caught_up.store(true, Ordering::Release);
    }

    pub fn failure(&self) -> Option<String> {
        self.failed
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether the grants changed since the last call.
    pub fn take_changed(&self) -> bool {
        self.changed.swap(false, Ordering::AcqRel)
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

    /// Applies one record of the grants topic (`None`: revoked). A record that
    /// is not a valid grant revokes what its key granted: a grant is never
    /// guessed at.
    pub fn apply(&self, key: &str, grant: Option<Result<sluice_core::grants::Grant, String>>) {
        let mut g = self.grants.write().unwrap_or_else(|p| p.into_inner());
        match grant {
            Some(Ok(grant)) => {
                g.0.insert(key.to_owned(), grant);
            }
            Some(Err(e)) => {
                tracing::error!(grant = key, error = %e, "invalid grant record: treated as revoked");
                g.0.remove(key);
            }
            None => {
                g.0.remove(key);
            }
        }
        self.changed.store(true, Ordering::Release);
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
            .name("grants-follower".into())
            .spawn(move || {
                let result = crate::changelog::follow(
                    &config,
                    &topic,
                    timeout,
                    &stop,
                    || shared.mark_caught_up(),
                    |msg| {
                        let Some(key) = msg.key().and_then(|k| std::str::from_utf8(k).ok()) else {
                            return;
                        };
                        let grant = msg.payload().map(|b| {
                            codec
                                .decode::<WireGrant>(SchemaName::Grant, b)
                                .map_err(|e| e.to_string())
                                .and_then(|w| w.into_grant(key).map_err(|e| e.to_string()))
                        });
                        shared.apply(key, grant);
                    },
                );
                if let Err(e) = result {
                    tracing::error!(error = %e, "grants follower stopped");
                    *shared.failed.write().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                }
            })
            .expect("spawning a thread")
    }
}
