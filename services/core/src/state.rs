//! AssetState: the fold of an asset's events.
//!
//! The fold is a join: every field moves only "up" in an order that does not depend
//! on arrival (highest sequence, highest watermark, latest report), so any
//! permutation or duplication of the same events gives the same state. The one
//! bound is [`RECENT_COMMITS`]: a commit that arrives after more than that many
//! newer commits are already folded is refused as too late (and counted), because
//! remembering every sequence forever would grow without bound.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::asset::{AssetKey, TableFormat};
use crate::event::{AssetEvent, EventId, EventKind, Operation, QualityStatus};

/// How many of the newest commits a state remembers individually. Reordering within
/// this distance is harmless; a commit later than that is refused as `TooLate`.
pub const RECENT_COMMITS: usize = 64;

/// One commit as the state remembers it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitInfo {
    pub event_id: EventId,
    pub snapshot_id: i64,
    pub sequence: i64,
    pub commit_time_ms: i64,
    pub operation: Operation,
    pub partitions: BTreeSet<String>,
}

/// The latest quality verdict: for the highest sequence reported, the latest report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct QualityMark {
    pub sequence: i64,
    pub reported_at_ms: i64,
    pub status: QualityStatus,
}

/// The current truth about one asset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssetState {
    pub asset_key: AssetKey,
    pub format: TableFormat,
    /// Newest commit of any kind.
    pub latest: Option<CommitInfo>,
    /// Newest commit that changed data (not a compaction or clean).
    pub latest_data: Option<CommitInfo>,
    /// Distinct commits folded, of any kind / of data-changing kinds.
    pub commit_count: u64,
    pub data_commit_count: u64,
    pub watermark_ms: Option<i64>,
    /// `(sequence, schema id)` of the newest schema seen.
    pub schema: Option<(i64, i64)>,
    pub quality: Option<QualityMark>,
    /// Highest sequence reported expired; never moves `latest` back.
    pub expired_through: Option<i64>,
    /// The newest [`RECENT_COMMITS`] commits, by ascending sequence, one per
    /// sequence. A sorted vector, not a map: a handful of commits in one small
    /// allocation, which an unpack (see `packed`) makes for every read.
    pub recent: Vec<CommitInfo>,
}

/// What folding one event did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FoldOutcome {
    Changed,
    /// The event carried nothing newer than the state already holds.
    Unchanged(Stale),
}

/// Why an event changed nothing; each is a metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stale {
    /// The same commit was already folded.
    Duplicate,
    /// Older than what the state holds for this kind of fact.
    NotNewer,
    /// A commit older than every one of the [`RECENT_COMMITS`] remembered.
    TooLate,
    /// The event is for another asset (a routing bug upstream).
    WrongAsset,
}

impl Stale {
    pub fn as_str(self) -> &'static str {
        match self {
            Stale::Duplicate => "duplicate",
            Stale::NotNewer => "not_newer",
            Stale::TooLate => "too_late",
            Stale::WrongAsset => "wrong_asset",
        }
    }
}

impl AssetState {
    pub fn new(asset_key: AssetKey, format: TableFormat) -> Self {
        AssetState {
            asset_key,
            format,
            latest: None,
            latest_data: None,
            commit_count: 0,
            data_commit_count: 0,
            watermark_ms: None,
            schema: None,
            quality: None,
            expired_through: None,
            recent: Vec::new(),
        }
    }

    /// Folds every event in order, starting from an empty state for the first one's asset.
    pub fn fold_all<'a>(events: impl IntoIterator<Item = &'a AssetEvent>) -> Option<Self> {
        let mut it = events.into_iter();
        let first = it.next()?;
        let mut state = AssetState::new(first.asset_key.clone(), first.format);
        state.apply(first);
        for e in it {
            state.apply(e);
        }
        Some(state)
    }

    /// Folds one event. Never moves a fact backwards.
    pub fn apply(&mut self, e: &AssetEvent) -> FoldOutcome {
        if e.asset_key != self.asset_key {
            return FoldOutcome::Unchanged(Stale::WrongAsset);
        }
        let mut changed = false;
        // Watermarks and schema ids ride on any event kind that carries them.
        if let Some(w) = e.watermark_ms {
            changed |= raise(&mut self.watermark_ms, w);
        }
        if let Some(schema_id) = e.schema_id {
            changed |= raise(&mut self.schema, (e.sequence, schema_id));
        }
        let kind_outcome = match e.kind {
            EventKind::SnapshotCommitted => self.fold_commit(e),
            EventKind::QualityReported => match e.quality {
                Some(status) => {
                    let mark = QualityMark {
                        sequence: e.sequence,
                        reported_at_ms: e.commit_time_ms,
                        status,
                    };
                    changed_or(raise(&mut self.quality, mark), Stale::NotNewer)
                }
                None => FoldOutcome::Unchanged(Stale::NotNewer),
            },
            EventKind::SnapshotExpired => changed_or(
                raise(&mut self.expired_through, e.sequence),
                Stale::NotNewer,
            ),
            // Their facts (watermark, schema id) were folded above.
            EventKind::WatermarkAdvanced | EventKind::SchemaChanged => {
                FoldOutcome::Unchanged(Stale::NotNewer)
            }
        };
        match kind_outcome {
            FoldOutcome::Changed => FoldOutcome::Changed,
            _ if changed => FoldOutcome::Changed,
            unchanged => unchanged,
        }
    }

    fn fold_commit(&mut self, e: &AssetEvent) -> FoldOutcome {
        let at = self
            .recent
            .binary_search_by_key(&e.sequence, |c| c.sequence);
        if let Ok(i) = at {
            let existing = &mut self.recent[i];
            // The same commit seen again (push and poll). Join the details so the
            // result does not depend on which path arrived first.
            let before = existing.clone();
            existing.commit_time_ms = existing.commit_time_ms.max(e.commit_time_ms);
            existing.partitions.extend(e.partitions.iter().cloned());
            if e.event_id < existing.event_id {
                existing.event_id = e.event_id.clone();
                existing.snapshot_id = e.snapshot_id;
            }
            // Paths that disagree on the operation: a data-changing reading wins, so a
            // commit can only turn into a data commit, never back (counters stay monotonic).
            let rank = |op: Operation| (op.changes_data(), op);
            if rank(e.operation) > rank(existing.operation) {
                if e.operation.changes_data() && !existing.operation.changes_data() {
                    self.data_commit_count += 1;
                }
                existing.operation = e.operation;
            }
            if *existing == before {
                return FoldOutcome::Unchanged(Stale::Duplicate);
            }
            let updated = existing.clone();
            self.refresh_latest(&updated);
            return FoldOutcome::Changed;
        }
        let full = self.recent.len() >= RECENT_COMMITS;
        if full
            && self
                .recent
                .first()
                .is_some_and(|min| e.sequence < min.sequence)
        {
            return FoldOutcome::Unchanged(Stale::TooLate);
        }
        let info = CommitInfo {
            event_id: e.event_id.clone(),
            snapshot_id: e.snapshot_id,
            sequence: e.sequence,
            commit_time_ms: e.commit_time_ms,
            operation: e.operation,
            partitions: e.partitions.iter().cloned().collect(),
        };
        self.commit_count += 1;
        if info.operation.changes_data() {
            self.data_commit_count += 1;
        }
        self.refresh_latest(&info);
        self.recent.insert(at.unwrap_or_else(|i| i), info);
        if self.recent.len() > RECENT_COMMITS {
            self.recent.remove(0);
        }
        FoldOutcome::Changed
    }

    fn refresh_latest(&mut self, info: &CommitInfo) {
        if self
            .latest
            .as_ref()
            .is_none_or(|l| info.sequence >= l.sequence)
        {
            self.latest = Some(info.clone());
        }
        if info.operation.changes_data()
            && self
                .latest_data
                .as_ref()
                .is_none_or(|l| info.sequence >= l.sequence)
        {
            self.latest_data = Some(info.clone());
        }
    }

    /// True when a remembered commit newer than `after_sequence` touched `partition`.
    pub fn partition_committed_after(&self, partition: &str, after_sequence: Option<i64>) -> bool {
        let from = after_sequence.map_or(0, |s| self.recent.partition_point(|c| c.sequence <= s));
        self.recent[from..]
            .iter()
            .any(|c| c.partitions.contains(partition))
    }

    /// Partitions touched by the remembered commits.
    pub fn recent_partitions(&self) -> BTreeSet<&str> {
        self.recent
            .iter()
            .flat_map(|c| c.partitions.iter().map(String::as_str))
            .collect()
    }
}

fn raise<T: Ord + Copy>(slot: &mut Option<T>, v: T) -> bool {
    match slot {
        Some(cur) if *cur >= v => false,
        _ => {
            *slot = Some(v);
            true
        }
    }
}

fn changed_or(changed: bool, stale: Stale) -> FoldOutcome {
    if changed {
        FoldOutcome::Changed
    } else {
        FoldOutcome::Unchanged(stale)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventSource;
    use proptest::prelude::*;

    fn key() -> AssetKey {
        AssetKey::parse("lake.ods.order_latest").expect("valid")
    }

    fn commit(seq: i64) -> AssetEvent {
        let mut e = AssetEvent::committed(
            key(),
            TableFormat::Paimon,
            seq * 10,
            seq,
            1_000 + seq,
            EventSource::Poll,
        );
        e.partitions = vec![format!("dt=2026-12-{:02}", seq % 28 + 1)];
        e
    }

    #[test]
    fn newer_commit_advances_and_older_is_recorded_once() {
        let mut s = AssetState::new(key(), TableFormat::Paimon);
        assert_eq!(s.apply(&commit(2)), FoldOutcome::Changed);
        assert_eq!(
            s.apply(&commit(2)),
            FoldOutcome::Unchanged(Stale::Duplicate)
        );
        assert_eq!(
            s.apply(&commit(1)),
            FoldOutcome::Changed,
            "late but within the window"
        );
        assert_eq!(s.latest.as_ref().map(|c| c.sequence), Some(2));
        assert_eq!(s.commit_count, 2);
    }

    #[test]
    fn compaction_does_not_move_latest_data() {
        let mut s = AssetState::new(key(), TableFormat::Paimon);
        s.apply(&commit(1));
        let mut compact = commit(2);
        compact.operation = Operation::Compact;
        s.apply(&compact);
        assert_eq!(s.latest.as_ref().map(|c| c.sequence), Some(2));
        assert_eq!(s.latest_data.as_ref().map(|c| c.sequence), Some(1));
        assert_eq!((s.commit_count, s.data_commit_count), (2, 1));
    }

    #[test]
    fn watermark_and_expiry_never_move_back() {
        let mut s = AssetState::new(key(), TableFormat::Paimon);
        let mut w = AssetEvent::new(
            key(),
            TableFormat::Paimon,
            EventKind::WatermarkAdvanced,
            0,
            0,
            0,
            EventSource::Push,
        );
        w.watermark_ms = Some(500);
        assert_eq!(s.apply(&w), FoldOutcome::Changed);
        w.watermark_ms = Some(400);
        assert_eq!(s.apply(&w), FoldOutcome::Unchanged(Stale::NotNewer));
        assert_eq!(s.watermark_ms, Some(500));
        s.apply(&commit(5));
        let exp = AssetEvent::new(
            key(),
            TableFormat::Paimon,
            EventKind::SnapshotExpired,
            30,
            3,
            0,
            EventSource::Poll,
        );
        assert_eq!(s.apply(&exp), FoldOutcome::Changed);
        assert_eq!(s.latest.as_ref().map(|c| c.sequence), Some(5));
        assert_eq!(s.expired_through, Some(3));
    }

    #[test]
    fn a_commit_later_than_the_window_is_refused() {
        let mut s = AssetState::new(key(), TableFormat::Paimon);
        for seq in 100..100 + RECENT_COMMITS as i64 {
            s.apply(&commit(seq));
        }
        assert_eq!(s.apply(&commit(1)), FoldOutcome::Unchanged(Stale::TooLate));
        assert_eq!(s.commit_count, RECENT_COMMITS as u64);
    }

    #[test]
    fn an_event_for_another_asset_is_refused() {
        let mut s = AssetState::new(
            AssetKey::parse("a.b.c").expect("valid"),
            TableFormat::Paimon,
        );
        assert_eq!(
            s.apply(&commit(1)),
            FoldOutcome::Unchanged(Stale::WrongAsset)
        );
    }

    fn arb_event() -> impl Strategy<Value = AssetEvent> {
        (
            0usize..5,
            0i64..40,
            0i64..1_000,
            proptest::option::of(0i64..10_000),
            proptest::option::of(0i64..5),
            proptest::collection::vec(0u8..6, 0..3),
            0usize..3,
            0usize..3,
        )
            .prop_map(|(kind, seq, t, wm, schema, parts, op, q)| {
                let kind = [
                    EventKind::SnapshotCommitted,
                    EventKind::SnapshotCommitted,
                    EventKind::QualityReported,
                    EventKind::WatermarkAdvanced,
                    EventKind::SnapshotExpired,
                ][kind];
                let mut e = AssetEvent::new(
                    key(),
                    TableFormat::Paimon,
                    kind,
                    seq * 10,
                    seq,
                    t,
                    EventSource::Poll,
                );
                e.watermark_ms = wm;
                e.schema_id = schema;
                e.partitions = parts.into_iter().map(|p| format!("p={p}")).collect();
                e.operation = [Operation::Append, Operation::Compact, Operation::Overwrite][op];
                e.quality = Some(
                    [
                        QualityStatus::Passed,
                        QualityStatus::Warned,
                        QualityStatus::Failed,
                    ][q],
                );
                e
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Any permutation and duplication of a set of events folds to the same state.
        #[test]
        fn fold_is_order_and_duplicate_insensitive(
            events in proptest::collection::vec(arb_event(), 1..60),
            seed in any::<u64>(),
            dup_every in 1usize..5,
        ) {
            let reference = AssetState::fold_all(&events).expect("non-empty");
            // A deterministic shuffle driven by the seed, plus duplicates.
            let mut shuffled: Vec<AssetEvent> = events.clone();
            let mut x = seed | 1;
            for i in (1..shuffled.len()).rev() {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                shuffled.swap(i, (x % (i as u64 + 1)) as usize);
            }
            let dups: Vec<AssetEvent> = shuffled.iter().step_by(dup_every).cloned().collect();
            shuffled.extend(dups);
            let folded = AssetState::fold_all(&shuffled).expect("non-empty");
            prop_assert_eq!(folded, reference);
        }

        /// A fold never moves the newest sequence, the watermark or a counter backwards.
        #[test]
        fn fold_is_monotonic(events in proptest::collection::vec(arb_event(), 1..60)) {
            let mut s = AssetState::new(key(), TableFormat::Paimon);
            for e in &events {
                let before = s.clone();
                s.apply(e);
                prop_assert!(s.latest.as_ref().map(|c| c.sequence) >= before.latest.as_ref().map(|c| c.sequence));
                prop_assert!(s.watermark_ms >= before.watermark_ms);
                prop_assert!(s.commit_count >= before.commit_count);
                prop_assert!(s.quality >= before.quality);
            }
        }
    }
}
