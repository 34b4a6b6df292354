//! The wall clock, in the units Sluice's records carry: one home, so every
//! service and tool reads time the same way (the pure core takes it as an input).

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch; 0 for a clock set before 1970.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or_default()
}

/// Seconds since the Unix epoch (JWT times).
pub fn now_s() -> i64 {
    now_ms() / 1_000
}
