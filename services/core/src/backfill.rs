//! Backfills: what a request to re-run a dependency over past data covers, as a
//! list of items, one trigger each.
//!
//! An item's trigger key has a basis of its own (`backfill` + the backfill's id +
//! the item), so a backfill never collides with a live trigger of the same
//! partition or window, and a resubmitted backfill (same id) adds no run. The id
//! comes from the caller's request id, or, without one, from the dependency and
//! the range itself: submitting the same range twice is one backfill.

use serde::{Deserialize, Serialize};

use crate::asset::AssetKey;
use crate::calendar::Day;
use crate::dependency::{DependencySpec, Mode};
use crate::digest::Canonical;
use crate::trigger::InputVersion;

/// The most items one backfill may have; a larger range is split by the caller.
pub const MAX_ITEMS: usize = 10_000;

/// What a backfill covers, as written in the request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Range {
    /// These partitions, in this order (`dt=2026-11-01`).
    Partitions(Vec<String>),
    /// Every partition from `from` to `to`, both included: the same path up to the
    /// last `=`, and values that are both dates (`YYYY-MM-DD`, one a day) or both
    /// integers (one each).
    PartitionRange { from: String, to: String },
    /// Every window of a `window` dependency that overlaps `[from_ms, to_ms)`
    /// (windows are aligned to the epoch, as the resolver aligns them).
    Windows { from_ms: i64, to_ms: i64 },
    /// Every commit of one input whose sequence is in `[from_sequence,
    /// to_sequence]`, read from the evidence log; the other inputs at their
    /// current snapshots.
    Snapshots {
        input: AssetKey,
        from_sequence: i64,
        to_sequence: i64,
    },
}

/// One trigger of a backfill.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    Partition(String),
    Window { end_ms: i64 },
    Snapshot(InputVersion),
}

impl Item {
    /// The item as the trigger key's basis and the run's reason name it.
    pub fn label(&self) -> String {
        match self {
            Item::Partition(p) => format!("partition {p}"),
            Item::Window { end_ms } => format!("window ending {end_ms}"),
            Item::Snapshot(v) => format!(
                "{} snapshot {} (sequence {})",
                v.asset_key, v.snapshot_id, v.sequence
            ),
        }
    }
}

/// Why a backfill request is refused; each names the exact problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    #[error("the range is empty")]
    Empty,
    #[error("the range has {0} items; at most {MAX_ITEMS} in one backfill")]
    TooMany(usize),
    #[error("partition {0:?} is not `name=value` (e.g. dt=2026-11-01)")]
    NotAPartition(String),
    #[error("partition range {from:?}..{to:?}: {why}")]
    PartitionRange {
        from: String,
        to: String,
        why: String,
    },
    #[error("windows need a dependency of mode window; {id:?} is {mode}")]
    NotWindowed { id: String, mode: Mode },
    #[error("{0:?} is not an input of the dependency")]
    NotAnInput(String),
    #[error("from {from} is after to {to}")]
    Reversed { from: i64, to: i64 },
}

impl Range {
    /// The items of the range for `spec`. `evidence` is the input's commits read
    /// from the evidence log, for a snapshot range (in any order, duplicates
    /// allowed; ignored by the other ranges).
    pub fn expand(
        &self,
        spec: &DependencySpec,
        evidence: &[InputVersion],
    ) -> Result<Vec<Item>, RangeError> {
        let items = match self {
            Range::Partitions(list) => {
                let mut seen = std::collections::BTreeSet::new();
                let mut items = Vec::with_capacity(list.len());
                for p in list {
                    check_partition(p)?;
                    if seen.insert(p.as_str()) {
                        items.push(Item::Partition(p.clone()));
                    }
                }
                items
            }
            Range::PartitionRange { from, to } => partition_range(from, to)?
                .into_iter()
                .map(Item::Partition)
                .collect(),
            Range::Windows { from_ms, to_ms } => {
                let Mode::Window { size_ms } = spec.mode else {
                    return Err(RangeError::NotWindowed {
                        id: spec.id.clone(),
                        mode: spec.mode,
                    });
                };
                if from_ms > to_ms {
                    return Err(RangeError::Reversed {
                        from: *from_ms,
                        to: *to_ms,
                    });
                }
                if from_ms == to_ms {
                    return Err(RangeError::Empty);
                }
                let first = from_ms.saturating_sub(from_ms.rem_euclid(size_ms));
                // Saturating: a range at the ends of time is refused as too
                // large, never an overflow.
                let count = to_ms
                    .saturating_sub(first)
                    .saturating_add(size_ms - 1)
                    .div_euclid(size_ms);
                if count > MAX_ITEMS as i64 {
                    return Err(RangeError::TooMany(count as usize));
                }
                (0..count)
                    .map(|i| Item::Window {
                        end_ms: first.saturating_add((i + 1).saturating_mul(size_ms)),
                    })
                    .collect()
            }
            Range::Snapshots {
                input,
                from_sequence,
                to_sequence,
            } => {
                if !spec.inputs().contains(input) {
                    return Err(RangeError::NotAnInput(input.as_str().to_owned()));
                }
                if from_sequence > to_sequence {
                    return Err(RangeError::Reversed {
                        from: *from_sequence,
                        to: *to_sequence,
                    });
                }
                let mut picked: Vec<&InputVersion> = evidence
                    .iter()
                    .filter(|c| {
                        &c.asset_key == input
                            && (*from_sequence..=*to_sequence).contains(&c.sequence)
                    })
                    .collect();
                picked.sort_by_key(|c| c.sequence);
                picked.dedup_by_key(|c| c.sequence);
                picked.into_iter().cloned().map(Item::Snapshot).collect()
            }
        };
        checked(items)
    }

    /// The input and sequence bounds of a snapshot range: what to read from the
    /// evidence log before [`Range::expand`].
    pub fn snapshot_bounds(&self) -> Option<(&AssetKey, i64, i64)> {
        match self {
            Range::Snapshots {
                input,
                from_sequence,
                to_sequence,
            } => Some((input, *from_sequence, *to_sequence)),
            _ => None,
        }
    }
}

fn checked(items: Vec<Item>) -> Result<Vec<Item>, RangeError> {
    match items.len() {
        0 => Err(RangeError::Empty),
        n if n > MAX_ITEMS => Err(RangeError::TooMany(n)),
        _ => Ok(items),
    }
}

fn check_partition(p: &str) -> Result<(), RangeError> {
    let ok = p.split('/').all(|seg| {
        seg.split_once('=')
            .is_some_and(|(k, v)| !k.is_empty() && !v.is_empty())
    }) && p.len() <= 400
        && !p.chars().any(char::is_control);
    if ok {
        Ok(())
    } else {
        Err(RangeError::NotAPartition(p.to_owned()))
    }
}

fn partition_range(from: &str, to: &str) -> Result<Vec<String>, RangeError> {
    let fail = |why: &str| RangeError::PartitionRange {
        from: from.to_owned(),
        to: to.to_owned(),
        why: why.to_owned(),
    };
    check_partition(from)?;
    check_partition(to)?;
    let (Some((prefix, a)), Some((prefix_to, b))) = (from.rsplit_once('='), to.rsplit_once('='))
    else {
        return Err(fail("not name=value"));
    };
    if prefix != prefix_to {
        return Err(fail("the two ends differ before the last `=`"));
    }
    let values: Vec<String> = if let (Some(a), Some(b)) = (Day::parse(a), Day::parse(b)) {
        if a > b {
            return Err(fail("from is after to"));
        }
        let n = b.number() - a.number() + 1;
        if n > MAX_ITEMS as i64 {
            return Err(RangeError::TooMany(n as usize));
        }
        (a.number()..=b.number())
            .map(|d| Day::from_number(d).to_string())
            .collect()
    } else if let (Ok(a), Ok(b)) = (a.parse::<i64>(), b.parse::<i64>()) {
        if a > b {
            return Err(fail("from is after to"));
        }
        if b.saturating_sub(a) >= MAX_ITEMS as i64 {
            return Err(RangeError::TooMany(
                b.saturating_sub(a).saturating_add(1) as usize
            ));
        }
        let width = if a.to_string().len() < from.len() - prefix.len() - 1 {
            from.len() - prefix.len() - 1 // keep zero padding: hh=00..hh=23
        } else {
            0
        };
        (a..=b).map(|v| format!("{v:0width$}")).collect()
    } else {
        return Err(fail(
            "the values must both be dates (YYYY-MM-DD) or both integers",
        ));
    };
    Ok(values
        .into_iter()
        .map(|v| format!("{prefix}={v}"))
        .collect())
}

/// The id of a backfill: from the caller's request id when given, else from the
/// dependency and the range (the same range submitted twice is one backfill).
pub fn backfill_id(dependency_id: &str, request_id: Option<&str>, range: &Range) -> String {
    let mut c = Canonical::new("sluice.backfill.v1");
    c.str(dependency_id);
    match request_id {
        Some(r) => {
            c.str("request").str(r);
        }
        None => {
            // serde_json of an owned enum of strings and integers cannot fail.
            let text = serde_json::to_string(range).unwrap_or_default();
            c.str("range").str(&text);
        }
    }
    format!("bf-{}", c.hex(12))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dependency::{Coalescing, Target, TargetKind};

    fn spec(mode: Mode) -> DependencySpec {
        DependencySpec {
            id: "dws-daily".into(),
            version: 1,
            owner_project: "p".into(),
            target: Target {
                kind: TargetKind::Webhook,
                name: "w".into(),
                parameters: Default::default(),
            },
            condition: serde_json::from_value(serde_json::json!(
                {"input": {"asset": "lake.ods.orders"}}
            ))
            .expect("condition"),
            mode,
            coalescing: Coalescing::default(),
            produces: None,
            paused: false,
            schema_acknowledged: Default::default(),
        }
    }

    fn labels(items: &[Item]) -> Vec<String> {
        items.iter().map(Item::label).collect()
    }

    #[test]
    fn a_date_range_has_one_partition_a_day_across_months_and_leap_days() {
        let r = Range::PartitionRange {
            from: "region=eu/dt=2024-02-27".into(),
            to: "region=eu/dt=2024-03-02".into(),
        };
        let items = r.expand(&spec(Mode::PerPartition), &[]).expect("range");
        assert_eq!(
            labels(&items),
            [
                "partition region=eu/dt=2024-02-27",
                "partition region=eu/dt=2024-02-28",
                "partition region=eu/dt=2024-02-29",
                "partition region=eu/dt=2024-03-01",
                "partition region=eu/dt=2024-03-02"
            ]
        );
        let year = Range::PartitionRange {
            from: "dt=2025-01-01".into(),
            to: "dt=2025-12-31".into(),
        };
        assert_eq!(
            year.expand(&spec(Mode::Snapshots), &[])
                .expect("year")
                .len(),
            365
        );
    }

    #[test]
    fn an_integer_range_keeps_its_zero_padding() {
        let r = Range::PartitionRange {
            from: "hh=08".into(),
            to: "hh=11".into(),
        };
        assert_eq!(
            labels(&r.expand(&spec(Mode::PerPartition), &[]).expect("range")),
            [
                "partition hh=08",
                "partition hh=09",
                "partition hh=10",
                "partition hh=11"
            ]
        );
    }

    #[test]
    fn bad_ranges_are_refused_with_the_reason() {
        let s = spec(Mode::PerPartition);
        let range = |from: &str, to: &str| Range::PartitionRange {
            from: from.into(),
            to: to.into(),
        };
        for (r, want) in [
            (range("dt=2026-02-30", "dt=2026-03-01"), "both be dates"),
            (range("dt=2026-03-02", "dt=2026-03-01"), "from is after to"),
            (range("a=2026-03-01", "b=2026-03-02"), "differ before"),
            (range("dt=2000-01-01", "dt=2030-01-01"), "at most 10000"),
            (Range::Partitions(vec!["nope".into()]), "not `name=value`"),
            (Range::Partitions(vec![]), "empty"),
            (
                Range::Windows {
                    from_ms: 0,
                    to_ms: 10,
                },
                "mode window",
            ),
        ] {
            let e = r.expand(&s, &[]).expect_err("refused").to_string();
            assert!(e.contains(want), "{r:?}: {e}");
        }
    }

    #[test]
    fn windows_are_epoch_aligned_and_cover_the_range() {
        let s = spec(Mode::Window { size_ms: 100 });
        let r = Range::Windows {
            from_ms: 150,
            to_ms: 400,
        };
        assert_eq!(
            labels(&r.expand(&s, &[]).expect("windows")),
            [
                "window ending 200",
                "window ending 300",
                "window ending 400"
            ]
        );
        let within = |from_ms, to_ms| Range::Windows { from_ms, to_ms }.expand(&s, &[]);
        assert_eq!(
            labels(&within(120, 130).expect("one")),
            ["window ending 200"]
        );
        assert_eq!(within(150, 150), Err(RangeError::Empty));
        assert!(matches!(within(-250, -100), Ok(w) if w.len() == 2));
        assert!(matches!(
            within(i64::MIN, i64::MAX),
            Err(RangeError::TooMany(_))
        ));
    }

    #[test]
    fn snapshot_items_take_one_commit_per_sequence_in_the_bounds() {
        let input = AssetKey::parse("lake.ods.orders").expect("key");
        let r = Range::Snapshots {
            input: input.clone(),
            from_sequence: 2,
            to_sequence: 3,
        };
        let v = |seq| InputVersion {
            asset_key: input.clone(),
            snapshot_id: 100 + seq,
            sequence: seq,
        };
        let s = spec(Mode::Snapshots);
        let items = r
            .expand(&s, &[v(3), v(1), v(2), v(3), v(4)])
            .expect("items");
        assert_eq!(items, [Item::Snapshot(v(2)), Item::Snapshot(v(3))]);
        assert_eq!(r.expand(&s, &[v(9)]), Err(RangeError::Empty));
        let other = Range::Snapshots {
            input: AssetKey::parse("lake.ods.other").expect("key"),
            from_sequence: 0,
            to_sequence: 1,
        };
        assert_eq!(
            other.expand(&spec(Mode::Snapshots), &[]),
            Err(RangeError::NotAnInput("lake.ods.other".into()))
        );
    }

    proptest::proptest! {
        /// Any range a caller can send is items or a reason, never a panic.
        #[test]
        fn any_range_is_items_or_a_reason(
            from_ms in proptest::num::i64::ANY,
            to_ms in proptest::num::i64::ANY,
            size_ms in 1i64..=i64::MAX,
            from in "[a-z]{1,3}=-?[0-9]{1,20}",
            to in "[a-z]{1,3}=-?[0-9]{1,20}",
        ) {
            let s = spec(Mode::Window { size_ms });
            let _ = Range::Windows { from_ms, to_ms }.expand(&s, &[]);
            let _ = Range::PartitionRange { from, to }.expand(&s, &[]);
        }
    }

    #[test]
    fn the_id_is_the_request_id_or_the_range_itself() {
        let a = Range::Partitions(vec!["dt=1".into()]);
        let b = Range::Partitions(vec!["dt=2".into()]);
        assert_eq!(backfill_id("d", None, &a), backfill_id("d", None, &a));
        assert_ne!(backfill_id("d", None, &a), backfill_id("d", None, &b));
        assert_ne!(backfill_id("d", None, &a), backfill_id("e", None, &a));
        assert_eq!(
            backfill_id("d", Some("r1"), &a),
            backfill_id("d", Some("r1"), &b)
        );
        assert!(backfill_id("d", None, &a).starts_with("bf-"));
    }
}
