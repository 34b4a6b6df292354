//! Liveness and readiness, shared between the work loop and the admin server.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use crate::clock::now_ms;

/// When a restore or a catch-up last read from the broker, process-wide. These
/// block the work loop (a restore runs inside a partition assignment) for as
/// long as the topic takes to read, minutes for a large one; they are bounded by
/// their own deadlines, so reading counts as being live. A follower that has
/// caught up no longer feeds it: a stuck work loop is then seen.
static LAST_PROGRESS_MS: AtomicI64 = AtomicI64::new(i64::MIN);

/// Called by restore and catch-up reads on every poll.
pub fn progress() {
    LAST_PROGRESS_MS.store(now_ms(), Ordering::Relaxed);
}

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

    /// The work loop beat, or a restore / catch-up read, within `stall_after`.
    pub fn is_live(&self) -> bool {
        let last = self
            .0
            .last_beat_ms
            .load(Ordering::Relaxed)
            .max(LAST_PROGRESS_MS.load(Ordering::Relaxed));
        now_ms().saturating_sub(last)
            <= i64::try_from(self.0.stall_after.as_millis()).unwrap_or(i64::MAX)
    }

    pub fn is_ready(&self) -> bool {
        self.0.ready.load(Ordering::Relaxed) && !self.0.stopping.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restore_reading_keeps_a_service_live_while_its_loop_cannot_beat() {
        let health = Health::new(Duration::from_millis(100));
        std::thread::sleep(Duration::from_millis(150));
        // (Another test of this binary may have read a changelog a moment ago.)
        if LAST_PROGRESS_MS.load(Ordering::Relaxed) < now_ms() - 100 {
            assert!(!health.is_live(), "no beat and no progress: stalled");
        }
        progress();
        assert!(health.is_live(), "a restore read counts as live");
        health.beat();
        assert!(health.is_live());
    }
}
