//! Table-service policies: when a table needs a compaction, a log compaction, a
//! clustering or a clean, in Hudi's own terms.
//!
//! Hudi schedules its table services by a trigger strategy
//! (`hoodie.compact.inline.trigger.strategy`): `NUM_COMMITS` counts the delta
//! commits since the last *completed* compaction, `NUM_COMMITS_AFTER_LAST_REQUEST`
//! those since the last *requested* one, `TIME_ELAPSED` the time since the last
//! completed one, and `NUM_AND_TIME` / `NUM_OR_TIME` combine the two. Sluice applies
//! the same strategies outside the writer, from the table's folded state:
//!
//! * the last completed instance is the newest compaction commit the state
//!   remembers (the timeline's completed `compaction` → `commit`, seen by poll);
//! * the last request is this policy's last trigger (its baseline): at most one
//!   instance is in flight, so a policy that fired waits until a compaction newer
//!   than that trigger completes. A failed instance does not reset the count; the
//!   engine target retries it. A request that never completes (failed for good,
//!   or nothing to plan) is not waited on for ever: once the strategy holds again
//!   counting from the request alone (`num_commits` more delta commits, or
//!   `delta_seconds` since the first commit after it), the policy asks again.
//!
//! A strategy is checked when the table changes, and a check that waits only
//! for time tells the resolver when to look again ([`Reading::due_in_ms`]), so
//! `TIME_ELAPSED` fires on time on a table that stopped committing.

use serde::{Deserialize, Serialize};

use crate::condition::Baseline;
use crate::event::Operation;
use crate::state::{AssetState, RECENT_COMMITS};

/// The largest `num_commits` a policy may ask: the count is read from the commits
/// a state remembers, and a MERGE_ON_READ table can interleave a clean or a
/// rollback with every delta commit, so half the remembered window is what is
/// always counted exactly.
pub const MAX_NUM_COMMITS: u64 = (RECENT_COMMITS / 2) as u64;

/// Which service a policy schedules; each counts from its own completed instances.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Service {
    /// Merge a MERGE_ON_READ table's log files into base files
    /// (`hoodie.compact.inline.max.delta.commits`).
    Compaction,
    /// Rewrite file groups for layout (`hoodie.clustering.inline.max.commits`).
    Clustering,
    /// Remove old file versions (`hoodie.clean.max.commits`).
    Clean,
    /// Merge a MERGE_ON_READ file slice's log blocks into one log block, base
    /// files untouched (`hoodie.log.compaction.inline`; RFC-48): cheaper than a
    /// compaction, for tables updated often between compactions.
    LogCompaction,
}

impl Service {
    pub const ALL: [Service; 4] = [
        Service::Compaction,
        Service::Clustering,
        Service::Clean,
        Service::LogCompaction,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Service::Compaction => "compaction",
            Service::Clustering => "clustering",
            Service::Clean => "clean",
            Service::LogCompaction => "log_compaction",
        }
    }

    pub fn parse(s: &str) -> Option<Service> {
        Service::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// Whether a completed commit of `op` is an instance this service counts
    /// from. A compaction merges every log block into a base file, so it leaves
    /// no log to compact: log compaction counts from either.
    fn completes(self, op: Operation) -> bool {
        match self {
            Service::Compaction => op == Operation::Compact,
            Service::Clustering => op == Operation::Cluster,
            Service::Clean => op == Operation::Clean,
            Service::LogCompaction => matches!(op, Operation::LogCompact | Operation::Compact),
        }
    }
}

/// Hudi's trigger strategies, by Hudi's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Strategy {
    NumCommits,
    NumCommitsAfterLastRequest,
    TimeElapsed,
    NumAndTime,
    NumOrTime,
}

impl Strategy {
    pub const ALL: [Strategy; 5] = [
        Strategy::NumCommits,
        Strategy::NumCommitsAfterLastRequest,
        Strategy::TimeElapsed,
        Strategy::NumAndTime,
        Strategy::NumOrTime,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::NumCommits => "NUM_COMMITS",
            Strategy::NumCommitsAfterLastRequest => "NUM_COMMITS_AFTER_LAST_REQUEST",
            Strategy::TimeElapsed => "TIME_ELAPSED",
            Strategy::NumAndTime => "NUM_AND_TIME",
            Strategy::NumOrTime => "NUM_OR_TIME",
        }
    }

    pub fn parse(s: &str) -> Option<Strategy> {
        Strategy::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// Whether the strategy counts commits.
    pub fn counts(self) -> bool {
        !matches!(self, Strategy::TimeElapsed)
    }

    /// Whether the strategy waits for time.
    pub fn times(self) -> bool {
        !matches!(
            self,
            Strategy::NumCommits | Strategy::NumCommitsAfterLastRequest
        )
    }

    /// The strategy's verdict from its count and its time.
    fn holds(self, by_count: bool, by_time: bool) -> bool {
        match self {
            Strategy::NumCommits | Strategy::NumCommitsAfterLastRequest => by_count,
            Strategy::TimeElapsed => by_time,
            Strategy::NumAndTime => by_count && by_time,
            Strategy::NumOrTime => by_count || by_time,
        }
    }
}

/// Hudi's defaults: `hoodie.compact.inline.max.delta.commits` and `…max.delta.seconds`.
pub const DEFAULT_NUM_COMMITS: u64 = 5;
pub const DEFAULT_DELTA_SECONDS: i64 = 3_600;

/// A table-service policy: `service` is due under Hudi's `strategy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    pub service: Service,
    pub strategy: Strategy,
    #[serde(default = "default_num_commits")]
    pub num_commits: u64,
    #[serde(default = "default_delta_seconds")]
    pub delta_seconds: i64,
}

fn default_num_commits() -> u64 {
    DEFAULT_NUM_COMMITS
}

fn default_delta_seconds() -> i64 {
    DEFAULT_DELTA_SECONDS
}

/// What a policy saw on the table: the figures its verdict compared.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Reading {
    /// Sequence of the newest completed instance remembered (none: not in the window).
    pub last_completed: Option<i64>,
    /// This policy's last request, while no instance newer than it has completed.
    pub in_flight_since: Option<i64>,
    /// Data commits counted as the strategy counts them (at least this many when
    /// the last completed instance is older than the remembered commits).
    pub commits: u64,
    /// Time since the last completed instance (or the oldest remembered commit).
    pub elapsed_ms: Option<i64>,
}

impl Reading {
    /// For a policy whose strategy waits for time and that has nothing in flight:
    /// how long until its time comes due (none: due already, or no commit yet).
    pub fn due_in_ms(&self, policy: &Policy) -> Option<i64> {
        if !policy.strategy.times() || self.in_flight_since.is_some() {
            return None;
        }
        let left = policy.delta_seconds.saturating_mul(1_000) - self.elapsed_ms?;
        (left > 0).then_some(left)
    }
}

impl Policy {
    /// Whether `state` is due for the service, and what was read. `base` is the
    /// state at the policy's last trigger (none: it never fired).
    pub fn due(&self, state: &AssetState, base: Option<&Baseline>, now_ms: i64) -> (bool, Reading) {
        let Policy {
            service,
            strategy,
            num_commits,
            delta_seconds,
        } = *self;
        let done = state
            .recent
            .iter()
            .rev()
            .find(|c| service.completes(c.operation));
        let last_completed = done.map(|c| c.sequence);
        let requested = base.and_then(|b| b.sequence);
        let data_after = |from: Option<i64>| {
            state
                .recent
                .iter()
                .filter(|c| c.operation.changes_data() && from.is_none_or(|f| c.sequence > f))
                .count() as u64
        };
        // Time since the first commit after `seq`: a request is only worth making
        // again for commits it did not cover (an unchanged table fires nothing new).
        let time_since_next = |seq: i64| {
            state
                .recent
                .iter()
                .find(|c| c.sequence > seq)
                .map(|c| now_ms.saturating_sub(c.commit_time_ms))
        };
        let delta_ms = delta_seconds.saturating_mul(1_000);
        let in_flight_since = requested
            .filter(|r| last_completed.is_none_or(|d| *r >= d))
            .filter(|r| {
                // A request given up on: the strategy holds again from it alone.
                let lost = strategy.holds(
                    data_after(Some(*r)) >= num_commits,
                    time_since_next(*r).is_some_and(|e| e >= delta_ms),
                );
                !lost
            });
        let from = match strategy {
            Strategy::NumCommitsAfterLastRequest => last_completed.max(requested),
            _ => last_completed,
        };
        let commits = data_after(from);
        let since_ms = done
            .or_else(|| state.recent.first())
            .map(|c| c.commit_time_ms);
        let elapsed_ms = since_ms.map(|t| now_ms.saturating_sub(t));
        let holds = strategy.holds(
            commits >= num_commits,
            elapsed_ms.is_some_and(|e| e >= delta_ms),
        );
        // Nothing to compact before the first data commit, whatever the clock says.
        let anything = state.latest_data.is_some();
        (
            holds && anything && in_flight_since.is_none(),
            Reading {
                last_completed,
                in_flight_since,
                commits,
                elapsed_ms,
            },
        )
    }

    /// The reading told to a user: what was counted against what was needed.
    pub fn describe(&self, r: &Reading) -> String {
        let Policy {
            service,
            strategy,
            num_commits,
            delta_seconds,
        } = *self;
        let mut parts = Vec::new();
        if let Some(at) = r.in_flight_since {
            parts.push(format!(
                "a {} requested after sequence {at} has not completed yet",
                service.as_str()
            ));
        }
        let from = match (strategy, r.last_completed) {
            (Strategy::NumCommitsAfterLastRequest, _) => "since the last request".to_owned(),
            (_, Some(seq)) => format!("since the {} at sequence {seq}", service.as_str()),
            (_, None) => format!("with no {} remembered", service.as_str()),
        };
        if strategy.counts() {
            parts.push(format!(
                "{} data commits {from}, {} needs {num_commits}",
                r.commits,
                strategy.as_str()
            ));
        }
        if strategy.times() {
            let elapsed = r.elapsed_ms.map_or_else(
                || "no commit yet".to_owned(),
                |e| format!("{} s", e / 1_000),
            );
            parts.push(format!(
                "{elapsed} since the last {}, {} needs {delta_seconds} s",
                service.as_str(),
                strategy.as_str()
            ));
        }
        parts.join("; ")
    }

    /// Why a policy's numbers are refused.
    pub fn validate(&self) -> Result<(), String> {
        let Policy {
            strategy,
            num_commits,
            delta_seconds,
            ..
        } = *self;
        if strategy.counts() && !(1..=MAX_NUM_COMMITS).contains(&num_commits) {
            return Err(format!(
                "table_service.num_commits must be between 1 and {MAX_NUM_COMMITS} (the commits a state remembers exactly), got {num_commits}"
            ));
        }
        if strategy.times() && delta_seconds <= 0 {
            return Err(format!(
                "table_service.delta_seconds must be positive, got {delta_seconds}"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::asset::{AssetKey, TableFormat};
    use crate::event::{AssetEvent, EventKind, EventSource};

    /// A MERGE_ON_READ table: `ops` in sequence order, one second apart.
    fn table(ops: &[Operation]) -> AssetState {
        let key = AssetKey::parse("lake.ods.orders").expect("key");
        let mut s = AssetState::new(key.clone(), TableFormat::Hudi);
        for (i, op) in ops.iter().enumerate() {
            let seq = i as i64 + 1;
            let mut e = AssetEvent::new(
                key.clone(),
                TableFormat::Hudi,
                EventKind::SnapshotCommitted,
                seq,
                seq,
                seq * 1_000,
                EventSource::Poll,
            );
            e.operation = *op;
            s.apply(&e);
        }
        s
    }

    use Operation::{Append as D, Compact as C, Other as X};

    fn policy(
        service: Service,
        strategy: Strategy,
        num_commits: u64,
        delta_seconds: i64,
    ) -> Policy {
        Policy {
            service,
            strategy,
            num_commits,
            delta_seconds,
        }
    }

    fn due(
        service: Service,
        strategy: Strategy,
        num_commits: u64,
        delta_seconds: i64,
        state: &AssetState,
        base: Option<&Baseline>,
        now_ms: i64,
    ) -> (bool, Reading) {
        policy(service, strategy, num_commits, delta_seconds).due(state, base, now_ms)
    }

    fn describe(
        service: Service,
        strategy: Strategy,
        num_commits: u64,
        delta_seconds: i64,
        r: &Reading,
    ) -> String {
        policy(service, strategy, num_commits, delta_seconds).describe(r)
    }

    fn validate(strategy: Strategy, num_commits: u64, delta_seconds: i64) -> Result<(), String> {
        policy(Service::Compaction, strategy, num_commits, delta_seconds).validate()
    }

    fn num(ops: &[Operation], n: u64, base: Option<i64>) -> (bool, Reading) {
        let s = table(ops);
        let b = base.map(|sequence| Baseline {
            sequence: Some(sequence),
            ..Baseline::default()
        });
        due(
            Service::Compaction,
            Strategy::NumCommits,
            n,
            DEFAULT_DELTA_SECONDS,
            &s,
            b.as_ref(),
            0,
        )
    }

    #[test]
    fn num_commits_counts_data_commits_since_the_last_completed_compaction() {
        assert!(!num(&[D, D, D], 4, None).0);
        assert!(num(&[D, D, D, D], 4, None).0);
        // Cleans and rollbacks are not delta commits.
        assert!(!num(&[D, X, D, X, D, X], 4, None).0);
        // A completed compaction resets the count.
        let (held, r) = num(&[D, D, D, D, C, D, D], 4, None);
        assert!(!held);
        assert_eq!((r.last_completed, r.commits), (Some(5), 2));
        assert!(num(&[D, D, D, D, C, D, D, D, D], 4, None).0);
    }

    #[test]
    fn one_instance_in_flight_until_a_newer_compaction_completes() {
        // Fired at sequence 4: nothing more until a compaction after 4 completes
        // (a failed one resets nothing)...
        let (held, r) = num(&[D, D, D, D, D, D, D], 4, Some(4));
        assert!(!held);
        assert_eq!(r.in_flight_since, Some(4));
        assert_eq!(
            r.commits, 7,
            "the count still runs from the last completed one"
        );
        // ... or until the request is given up on: four more delta commits after it.
        let (held, r) = num(&[D, D, D, D, D, D, D, D], 4, Some(4));
        assert!(held, "asked again");
        assert_eq!(r.in_flight_since, None);
        // The compaction (sequence 6) completed: armed again, counting from it.
        let (held, r) = num(&[D, D, D, D, D, C, D, D, D], 4, Some(4));
        assert!(!held);
        assert_eq!((r.in_flight_since, r.commits), (None, 3));
        assert!(num(&[D, D, D, D, D, C, D, D, D, D], 4, Some(4)).0);
    }

    #[test]
    fn a_time_policy_gives_a_lost_request_up_after_its_time() {
        // Commits at 1, 2 and 3 s; requested at sequence 2: the commit after the
        // request (3 s) has waited `delta_seconds` without a compaction by 13 s.
        let s = table(&[D, D, D]);
        let b = Baseline {
            sequence: Some(2),
            ..Baseline::default()
        };
        let at = |now_ms| {
            due(
                Service::Compaction,
                Strategy::TimeElapsed,
                1,
                10,
                &s,
                Some(&b),
                now_ms,
            )
        };
        assert_eq!(at(12_999).1.in_flight_since, Some(2));
        assert!(!at(12_999).0);
        assert!(at(13_000).0);
    }

    #[test]
    fn after_last_request_counts_from_the_request() {
        let s = table(&[D, D, D, D, D, C, D, D, D, D, D]);
        let fired_at = |seq: i64| {
            let b = Baseline {
                sequence: Some(seq),
                ..Baseline::default()
            };
            due(
                Service::Compaction,
                Strategy::NumCommitsAfterLastRequest,
                2,
                DEFAULT_DELTA_SECONDS,
                &s,
                Some(&b),
                0,
            )
        };
        // Requested at 3, completed at 6: counts from 6 (5 commits since).
        let (held, r) = fired_at(3);
        assert!(held);
        assert_eq!(r.commits, 5);
    }

    #[test]
    fn time_strategies_read_the_time_since_the_last_completed_compaction() {
        let s = table(&[D, D, C, D]); // the compaction at t = 3 s
        let at =
            |strategy, n, now_ms| due(Service::Compaction, strategy, n, 10, &s, None, now_ms).0;
        assert!(!at(Strategy::TimeElapsed, 1, 12_999));
        assert!(at(Strategy::TimeElapsed, 1, 13_000));
        assert!(!at(Strategy::NumAndTime, 2, 13_000), "1 commit since");
        assert!(at(Strategy::NumAndTime, 1, 13_000));
        assert!(at(Strategy::NumOrTime, 1, 0));
        assert!(at(Strategy::NumOrTime, 2, 13_000));
        assert!(!at(Strategy::NumOrTime, 2, 12_000));
        // Nothing written yet: nothing to compact.
        let empty = table(&[]);
        assert!(
            !due(
                Service::Compaction,
                Strategy::TimeElapsed,
                1,
                1,
                &empty,
                None,
                i64::MAX
            )
            .0
        );
    }

    #[test]
    fn the_reading_is_told_in_hudi_terms() {
        let (_, r) = num(&[D, D, C, D], 4, None);
        assert_eq!(
            describe(Service::Compaction, Strategy::NumCommits, 4, 0, &r),
            "1 data commits since the compaction at sequence 3, NUM_COMMITS needs 4"
        );
        let (_, r) = num(&[D, D, D, D, D], 4, Some(4));
        assert!(
            describe(Service::Compaction, Strategy::NumCommits, 4, 0, &r)
                .starts_with("a compaction requested after sequence 4 has not completed yet")
        );
    }

    #[test]
    fn each_service_counts_from_its_own_instances() {
        use Operation::{Clean as K, Cluster as L, LogCompact as G};
        let s = table(&[D, D, C, D, L, D, K, D, G, D]);
        let count = |service| {
            due(
                service,
                Strategy::NumCommits,
                1,
                DEFAULT_DELTA_SECONDS,
                &s,
                None,
                0,
            )
            .1
        };
        // A log compaction does not reset compaction's count: base files untouched.
        let c = count(Service::Compaction);
        assert_eq!((c.last_completed, c.commits), (Some(3), 4));
        let l = count(Service::Clustering);
        assert_eq!((l.last_completed, l.commits), (Some(5), 3));
        let k = count(Service::Clean);
        assert_eq!((k.last_completed, k.commits), (Some(7), 2));
        let g = count(Service::LogCompaction);
        assert_eq!((g.last_completed, g.commits), (Some(9), 1));
        // …and a compaction resets log compaction's: it merged every log block.
        let s = table(&[D, G, D, D, C, D]);
        let g = due(
            Service::LogCompaction,
            Strategy::NumCommits,
            1,
            DEFAULT_DELTA_SECONDS,
            &s,
            None,
            0,
        )
        .1;
        assert_eq!((g.last_completed, g.commits), (Some(5), 1));
        for x in Service::ALL {
            assert_eq!(Service::parse(x.as_str()), Some(x));
        }
    }

    #[test]
    fn policies_out_of_range_are_refused() {
        assert!(validate(Strategy::NumCommits, 0, 0).is_err());
        assert!(validate(Strategy::NumCommits, MAX_NUM_COMMITS + 1, 0).is_err());
        assert!(validate(Strategy::NumCommits, 4, 0).is_ok());
        assert!(validate(Strategy::TimeElapsed, 0, 0).is_err());
        assert!(validate(Strategy::TimeElapsed, 0, 60).is_ok());
        assert!(validate(Strategy::NumOrTime, 5, 0).is_err());
        for s in Strategy::ALL {
            assert_eq!(Strategy::parse(s.as_str()), Some(s));
        }
    }
}
