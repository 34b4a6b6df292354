//! Retrying an outage: exponential backoff with jitter.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// Waits that double from `base` up to `cap`; each one is drawn uniformly from
/// `[d/2, d]`, so instances retrying the same outage (a broker, PostgreSQL) do
/// not come back in lockstep.
#[derive(Clone, Debug)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    current: Duration,
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration) -> Self {
        Backoff {
            base,
            cap: cap.max(base),
            current: base,
        }
    }

    /// The wait before the next try.
    pub fn next_wait(&mut self) -> Duration {
        let d = self.current;
        self.current = (self.current * 2).min(self.cap);
        let half = d / 2;
        half + half.mul_f64(unit())
    }

    /// The outage is over: the next wait starts again from `base`.
    pub fn reset(&mut self) {
        self.current = self.base;
    }
}

/// A number in [0, 1): randomly keyed SipHash of a counter (std only, enough for jitter).
fn unit() -> f64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_to_the_cap_with_jitter_and_reset() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(100), ms(800));
        let waits: Vec<Duration> = (0..6).map(|_| b.next_wait()).collect();
        for (w, full) in waits.iter().zip([100, 200, 400, 800, 800, 800]) {
            assert!(
                *w >= ms(full / 2) && *w <= ms(full),
                "{w:?} not in [{}, {full}] ms",
                full / 2
            );
        }
        assert!(
            waits.windows(2).any(|p| p[0] != p[1]),
            "jittered: {waits:?}"
        );
        b.reset();
        assert!(b.next_wait() <= ms(100));
    }
}
