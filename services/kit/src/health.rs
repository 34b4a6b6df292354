//! Liveness and readiness, shared between the work loop and the admin server.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or_default()
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
