//! TriggerKey: the exactly-once identity of a trigger.
//!
//! `trigger_key = "tk1-" ‖ hex(SHA-256(canonical(target, group, basis)))[..32]`
//!
//! * `target` — the dependency's target identity (e.g. `airflow:gmv_daily`).
//! * `group` — the dependency group (its id), so two dependencies on the same target
//!   with the same inputs stay distinct.
//! * `basis` — what this trigger is *for*: the snapshot combination (sorted by asset,
//!   so input order does not matter), or the partition, or the watermark window.
//!
//! Every field is length-prefixed (see `digest`), 128 bits are kept (a collision
//! among 10^12 keys has probability ~10^-15). The derivation is pinned by test
//! vectors below: changing it would re-trigger every combination ever seen.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::asset::AssetKey;
use crate::digest::Canonical;

/// One input of a snapshot combination.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct InputVersion {
    pub asset_key: AssetKey,
    pub snapshot_id: i64,
    pub sequence: i64,
}

/// What a trigger is for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TriggerBasis {
    /// The snapshot combination of the inputs (order-insensitive).
    Snapshots(Vec<InputVersion>),
    /// Partition-aware dependencies: one trigger per partition.
    Partition(String),
    /// Watermark alignment: one trigger per window, by its end (epoch ms).
    Window { end_ms: i64 },
    /// Run now, asked by an operator: one trigger per request id, whatever the
    /// inputs, so a retried request is one run and never collides with a data trigger.
    Manual { request_id: String },
    /// A re-run of the run `of`: one trigger per (original, request id).
    Rerun { of: String, request_id: String },
    /// One item of a backfill (`crate::backfill`): one trigger per (backfill, item),
    /// never equal to a live trigger of the same partition or window.
    Backfill { backfill_id: String, item: String },
}

/// The identity that PostgreSQL's unique constraint and every idempotency key use.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TriggerKey(String);

impl TriggerKey {
    pub fn derive(target: &str, group: &str, basis: &TriggerBasis) -> Self {
        let mut c = Canonical::new("sluice.trigger.v1");
        c.str(target).str(group);
        match basis {
            TriggerBasis::Snapshots(inputs) => {
                let mut sorted: Vec<&InputVersion> = inputs.iter().collect();
                sorted.sort();
                sorted.dedup();
                c.str("snapshots").i64(sorted.len() as i64);
                for i in sorted {
                    c.str(i.asset_key.as_str())
                        .i64(i.snapshot_id)
                        .i64(i.sequence);
                }
            }
            TriggerBasis::Partition(p) => {
                c.str("partition").str(p);
            }
            TriggerBasis::Window { end_ms } => {
                c.str("window").i64(*end_ms);
            }
            TriggerBasis::Manual { request_id } => {
                c.str("manual").str(request_id);
            }
            TriggerBasis::Rerun { of, request_id } => {
                c.str("rerun").str(of).str(request_id);
            }
            TriggerBasis::Backfill { backfill_id, item } => {
                c.str("backfill").str(backfill_id).str(item);
            }
        }
        TriggerKey(format!("tk1-{}", c.hex(16)))
    }

    /// Wraps a key read back from the wire or the database.
    pub fn from_wire(s: String) -> Self {
        TriggerKey(s)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TriggerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn iv(asset: &str, snapshot_id: i64, sequence: i64) -> InputVersion {
        InputVersion {
            asset_key: AssetKey::parse(asset).expect("valid"),
            snapshot_id,
            sequence,
        }
    }

    fn gmv() -> TriggerBasis {
        TriggerBasis::Snapshots(vec![
            iv("lake.ods.order_latest", 1001, 12),
            iv("lake.ods.payment_latest", 1002, 7),
        ])
    }

    #[test]
    fn test_vectors_are_pinned() {
        // These values are part of Sluice's contract. If this test fails, the derivation
        // changed and every trigger ever recorded would fire again: do not "fix" the vector.
        assert_eq!(
            TriggerKey::derive("airflow:dwd_trade_event_fact", "dwd-trade", &gmv()).as_str(),
            "tk1-c90b8a6ff80fe66069651ca4bf00aeee"
        );
        assert_eq!(
            TriggerKey::derive(
                "hudi:compaction",
                "lake.dwd.fact",
                &TriggerBasis::Partition("dt=2026-12-01".into())
            )
            .as_str(),
            "tk1-c30747131555dc49d3a7a521c8f16218"
        );
        assert_eq!(
            TriggerKey::derive(
                "webhook:gmv",
                "gmv-hourly",
                &TriggerBasis::Window {
                    end_ms: 1_764_633_600_000
                }
            )
            .as_str(),
            "tk1-c936e9ebef7b964f294ea7047d0a65a2"
        );
        assert_eq!(
            TriggerKey::derive(
                "webhook:gmv",
                "gmv-daily",
                &TriggerBasis::Backfill {
                    backfill_id: "bf-0123456789abcdef01234567".into(),
                    item: "partition dt=2026-11-01".into()
                }
            )
            .as_str(),
            "tk1-c63063df2acfd53e923a6f9ba736b5e3"
        );
    }

    #[test]
    fn input_order_does_not_matter_but_every_field_does() {
        let TriggerBasis::Snapshots(mut inputs) = gmv() else {
            unreachable!()
        };
        let a = TriggerKey::derive("t", "g", &TriggerBasis::Snapshots(inputs.clone()));
        inputs.reverse();
        assert_eq!(
            a,
            TriggerKey::derive("t", "g", &TriggerBasis::Snapshots(inputs.clone()))
        );
        assert_ne!(
            a,
            TriggerKey::derive("t", "g2", &TriggerBasis::Snapshots(inputs.clone()))
        );
        assert_ne!(
            a,
            TriggerKey::derive("t2", "g", &TriggerBasis::Snapshots(inputs.clone()))
        );
        inputs[0].snapshot_id += 1;
        assert_ne!(
            a,
            TriggerKey::derive("t", "g", &TriggerBasis::Snapshots(inputs))
        );
        // Field boundaries are unambiguous.
        assert_ne!(
            TriggerKey::derive("ab", "c", &TriggerBasis::Partition("x".into())),
            TriggerKey::derive("a", "bc", &TriggerBasis::Partition("x".into()))
        );
        let manual = |id: &str| TriggerBasis::Manual {
            request_id: id.into(),
        };
        assert_eq!(
            TriggerKey::derive("t", "g", &manual("r1")),
            TriggerKey::derive("t", "g", &manual("r1")),
            "a retried request is the same trigger"
        );
        assert_ne!(
            TriggerKey::derive("t", "g", &manual("r1")),
            TriggerKey::derive("t", "g", &TriggerBasis::Partition("r1".into())),
            "a manual run never collides with a data trigger"
        );
        assert_ne!(
            TriggerKey::derive("t", "g", &manual("r1")),
            TriggerKey::derive(
                "t",
                "g",
                &TriggerBasis::Rerun {
                    of: String::new(),
                    request_id: "r1".into()
                }
            )
        );
        assert_ne!(
            TriggerKey::derive("t", "g", &TriggerBasis::Partition("1".into())),
            TriggerKey::derive("t", "g", &TriggerBasis::Window { end_ms: 1 })
        );
    }

    #[test]
    fn no_collisions_over_a_million_distinct_combinations() {
        let mut seen: HashMap<TriggerKey, (i64, i64)> = HashMap::with_capacity(1 << 20);
        for a in 0..1_000i64 {
            for b in 0..1_000i64 {
                let basis = TriggerBasis::Snapshots(vec![iv("c.n.a", a, a), iv("c.n.b", b, b)]);
                let k = TriggerKey::derive("target", "group", &basis);
                if let Some(prev) = seen.insert(k.clone(), (a, b)) {
                    panic!("collision: {k} for {prev:?} and {:?}", (a, b));
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        #[test]
        fn stable_and_distinct_for_random_inputs(
            target in "[a-z:_]{1,12}",
            group in "[a-z._-]{1,12}",
            snaps in proptest::collection::vec((0i64..1_000_000, 0i64..1_000_000), 1..5),
            other in (0i64..1_000_000),
        ) {
            let inputs: Vec<InputVersion> = snaps
                .iter()
                .enumerate()
                .map(|(i, (s, q))| iv(&format!("c.n.t{i}"), *s, *q))
                .collect();
            let basis = TriggerBasis::Snapshots(inputs.clone());
            let k1 = TriggerKey::derive(&target, &group, &basis);
            prop_assert_eq!(&k1, &TriggerKey::derive(&target, &group, &basis));
            prop_assert!(k1.as_str().starts_with("tk1-") && k1.as_str().len() == 36);
            let mut changed = inputs;
            if changed[0].snapshot_id != other {
                changed[0].snapshot_id = other;
                prop_assert_ne!(k1, TriggerKey::derive(&target, &group, &TriggerBasis::Snapshots(changed)));
            }
        }
    }
}
