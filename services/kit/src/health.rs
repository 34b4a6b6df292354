//! Liveness and readiness, shared between the work loop and the admin server.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use crate::clock::now_ms;

#[derive(Clone, Debug)]
pub struct Health(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    last_beat_ms: AtomicI64,
    ready: AtomicBool,
    stopping: AtomicBool,
    /// A work loop that has not beaten for this long is not live.
    stall_after: Duration,
}

impl Health {
    pub fn new(stall_after: Duration) -> Self {
        Health(Arc::new(Inner {
            last_beat_ms: AtomicI64::new(now_ms()),
            ready: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            stall_after,
        }))
    }

    /// Called by the work loop on every iteration.
    pub fn beat(&self) {
        self.0.last_beat_ms.store(now_ms(), Ordering::Relaxed);
    }

    pub fn set_ready(&self, ready: bool) {
        self.0.ready.store(ready, Ordering::Relaxed);
    }

    pub fn set_stopping(&self) {
        self.0.stopping.store(true, Ordering::Relaxed);
    }

    pub fn is_live(&self) -> bool {
        let age = now_ms() - self.0.last_beat_ms.load(Ordering::Relaxed);
        age <= i64::try_from(self.0.stall_after.as_millis()).unwrap_or(i64::MAX)
    }

    pub fn is_ready(&self) -> bool {
        self.0.ready.load(Ordering::Relaxed) && !self.0.stopping.load(Ordering::Relaxed)
    }
}
