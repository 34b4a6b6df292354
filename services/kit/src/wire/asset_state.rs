//! The asset-state topic's value (`schemas/asset-state.avsc`): the folded state of
//! one table with the updater's revision. Avro has no tuples and no non-string map
//! keys, so the core state is reshaped here.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use sluice_core::state::{CommitInfo, QualityMark};
use sluice_core::{AssetKey, AssetState, TableFormat};

use super::{WireError, count};

/// Value of the asset-state topic. Serde names match the Avro record names: the
/// schema-aware (de)serializer checks them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename = "AssetState")]
pub struct StateRecord {
    pub asset_key: AssetKey,
    pub revision: i64,
    pub format: TableFormat,
    pub latest: Option<WireCommit>,
    pub latest_data: Option<WireCommit>,
    pub commit_count: i64,
    pub data_commit_count: i64,
    pub watermark_ms: Option<i64>,
    pub schema_sequence: Option<i64>,
    pub schema_id: Option<i64>,
    pub quality: Option<QualityMark>,
    pub expired_through: Option<i64>,
    pub recent: Vec<WireCommit>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename = "CommitInfo")]
pub struct WireCommit {
    pub event_id: sluice_core::EventId,
    pub snapshot_id: i64,
    pub sequence: i64,
    pub commit_time_ms: i64,
    pub operation: sluice_core::Operation,
    pub partitions: Vec<String>,
}

impl From<&CommitInfo> for WireCommit {
    fn from(c: &CommitInfo) -> Self {
        WireCommit {
            event_id: c.event_id.clone(),
            snapshot_id: c.snapshot_id,
            sequence: c.sequence,
            commit_time_ms: c.commit_time_ms,
            operation: c.operation,
            partitions: c.partitions.iter().cloned().collect(),
        }
    }
}

impl From<WireCommit> for CommitInfo {
    fn from(c: WireCommit) -> Self {
        CommitInfo {
            event_id: c.event_id,
            snapshot_id: c.snapshot_id,
            sequence: c.sequence,
            commit_time_ms: c.commit_time_ms,
            operation: c.operation,
            partitions: c.partitions.into_iter().collect::<BTreeSet<_>>(),
        }
    }
}

impl StateRecord {
    pub fn new(state: &AssetState, revision: i64) -> Self {
        StateRecord {
            asset_key: state.asset_key.clone(),
            revision,
            format: state.format,
            latest: state.latest.as_ref().map(WireCommit::from),
            latest_data: state.latest_data.as_ref().map(WireCommit::from),
            // Counters fit i64 for any realistic table (2^63 commits).
            commit_count: i64::try_from(state.commit_count).unwrap_or(i64::MAX),
            data_commit_count: i64::try_from(state.data_commit_count).unwrap_or(i64::MAX),
            watermark_ms: state.watermark_ms,
            schema_sequence: state.schema.map(|(seq, _)| seq),
            schema_id: state.schema.map(|(_, id)| id),
            quality: state.quality,
            expired_through: state.expired_through,
            recent: state.recent.iter().map(WireCommit::from).collect(),
        }
    }

    /// Back to the core state; a record whose counters went negative is refused.
    pub fn into_state(self) -> Result<(AssetState, i64), WireError> {
        let schema = match (self.schema_sequence, self.schema_id) {
            (Some(seq), Some(id)) => Some((seq, id)),
            (None, None) => None,
            _ => {
                return Err(WireError::Inconsistent(
                    "schema_sequence and schema_id must be both set or both null",
                ));
            }
        };
        let state = AssetState {
            asset_key: self.asset_key,
            format: self.format,
            latest: self.latest.map(CommitInfo::from),
            latest_data: self.latest_data.map(CommitInfo::from),
            commit_count: count("commit_count", self.commit_count)?,
            data_commit_count: count("data_commit_count", self.data_commit_count)?,
            watermark_ms: self.watermark_ms,
            schema,
            quality: self.quality,
            expired_through: self.expired_through,
            recent: by_sequence(self.recent),
        };
        Ok((state, self.revision))
    }
}

/// The recent commits by ascending sequence, one per sequence, as the core keeps
/// them. The updater writes them so; any other order is sorted, and of two commits
/// with one sequence the later wins.
fn by_sequence(recent: Vec<WireCommit>) -> Vec<CommitInfo> {
    if recent.windows(2).all(|w| w[0].sequence < w[1].sequence) {
        return recent.into_iter().map(CommitInfo::from).collect();
    }
    recent
        .into_iter()
        .map(|c| (c.sequence, CommitInfo::from(c)))
        .collect::<BTreeMap<_, _>>()
        .into_values()
        .collect()
}

/// Reads an asset-state datum written with the current schema, by hand.
///
/// Restore reads asset-state by the million, and the generic Avro reader builds a
/// tree of named values per record before serde walks it: most of a restore's
/// time. This reader knows the one schema (`schemas/asset-state.avsc`, field by
/// field in order) and is total like the generic one: any bytes give a record or
/// an error, and no length is trusted beyond the bytes that are there. Only the
/// codec calls it, for a record whose frame names the current schema.
pub fn read_datum(bytes: &[u8]) -> Result<StateRecord, String> {
    let mut r = Datum { bytes, at: 0 };
    let record = StateRecord {
        asset_key: AssetKey::parse(r.string()?).map_err(|e| e.to_string())?,
        revision: r.long()?,
        format: r.symbol(&TableFormat::ALL, "TableFormat")?,
        latest: r.optional(Datum::commit)?,
        latest_data: r.optional(Datum::commit)?,
        commit_count: r.long()?,
        data_commit_count: r.long()?,
        watermark_ms: r.optional(Datum::long)?,
        schema_sequence: r.optional(Datum::long)?,
        schema_id: r.optional(Datum::long)?,
        quality: r.optional(|r| {
            Ok(QualityMark {
                sequence: r.long()?,
                reported_at_ms: r.long()?,
                status: r.symbol(&sluice_core::QualityStatus::ALL, "QualityStatus")?,
            })
        })?,
        expired_through: r.optional(Datum::long)?,
        recent: r.array(Datum::commit)?,
    };
    if r.at != bytes.len() {
        return Err(format!(
            "{} byte(s) left over after a complete record",
            bytes.len() - r.at
        ));
    }
    Ok(record)
}

/// Avro's binary encoding: zig-zag varint longs, length-prefixed strings, a
/// long branch index before a union's value, arrays in counted blocks.
struct Datum<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Datum<'a> {
    fn long(&mut self) -> Result<i64, String> {
        let mut z = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self
                .bytes
                .get(self.at)
                .ok_or_else(|| format!("ends inside a long at byte {}", self.at))?;
            self.at += 1;
            z |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(((z >> 1) as i64) ^ -((z & 1) as i64));
            }
        }
        Err(format!("a long longer than 10 bytes at byte {}", self.at))
    }

    /// A length or count: not negative, and at most the bytes left (each item
    /// takes at least one), so nothing is allocated on a corrupt length's word.
    fn length(&mut self, what: &str) -> Result<usize, String> {
        let at = self.at;
        let n = self.long()?;
        usize::try_from(n)
            .ok()
            .filter(|n| *n <= self.bytes.len() - self.at)
            .ok_or_else(|| format!("{what} of {n} at byte {at} does not fit the record"))
    }

    fn string(&mut self) -> Result<&'a str, String> {
        let n = self.length("a string length")?;
        let raw = &self.bytes[self.at..self.at + n];
        self.at += n;
        std::str::from_utf8(raw)
            .map_err(|_| format!("a string before byte {} is not UTF-8", self.at))
    }

    fn symbol<T: Copy>(&mut self, symbols: &[T], name: &str) -> Result<T, String> {
        let i = self.long()?;
        usize::try_from(i)
            .ok()
            .and_then(|i| symbols.get(i).copied())
            .ok_or_else(|| format!("{name} has no symbol {i}"))
    }

    /// `["null", T]`.
    fn optional<T>(
        &mut self,
        read: impl FnOnce(&mut Self) -> Result<T, String>,
    ) -> Result<Option<T>, String> {
        match self.long()? {
            0 => Ok(None),
            1 => read(self).map(Some),
            b => Err(format!("a union with two branches has no branch {b}")),
        }
    }

    fn array<T>(
        &mut self,
        mut read: impl FnMut(&mut Self) -> Result<T, String>,
    ) -> Result<Vec<T>, String> {
        let mut out = Vec::new();
        loop {
            let at = self.at;
            let count = self.long()?;
            if count == 0 {
                return Ok(out);
            }
            if count < 0 {
                // A negative count is followed by the block's size in bytes.
                self.long()?;
            }
            let n = usize::try_from(count.unsigned_abs())
                .ok()
                .filter(|n| *n <= self.bytes.len() - self.at)
                .ok_or_else(|| {
                    format!("an array block of {count} at byte {at} does not fit the record")
                })?;
            out.reserve(n);
            for _ in 0..n {
                out.push(read(self)?);
            }
        }
    }

    fn commit(&mut self) -> Result<WireCommit, String> {
        Ok(WireCommit {
            event_id: sluice_core::EventId::from_wire(self.string()?.to_owned()),
            snapshot_id: self.long()?,
            sequence: self.long()?,
            commit_time_ms: self.long()?,
            operation: self.symbol(&sluice_core::Operation::ALL, "Operation")?,
            partitions: self.array(|r| r.string().map(str::to_owned))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SchemaName;
    use crate::codec::{decode_datum, from_avro, to_avro};
    use proptest::prelude::*;
    use sluice_core::{AssetEvent, EventKind, EventSource, Operation, QualityStatus};

    fn generic(datum: &[u8]) -> Result<StateRecord, String> {
        let name = SchemaName::AssetState;
        let value = decode_datum(name.schema(), datum, "asset-state").map_err(|e| e.to_string())?;
        from_avro(name, &value).map_err(|e| e.to_string())
    }

    fn datum(record: &StateRecord) -> Vec<u8> {
        let name = SchemaName::AssetState;
        let value = to_avro(name, record).expect("to avro");
        crate::codec::encode_datum(name.schema(), value, "asset-state").expect("encode")
    }

    fn arb_record() -> impl Strategy<Value = StateRecord> {
        let key = AssetKey::parse("lake.ods.orders").expect("valid");
        proptest::collection::vec(
            (
                0usize..4,
                -5i64..200,
                proptest::option::of(any::<i64>()),
                proptest::collection::vec("[a-z=é0-9]{0,12}", 0..3),
                0usize..5,
                0usize..3,
            ),
            1..80,
        )
        .prop_flat_map(move |events| {
            let events: Vec<AssetEvent> = events
                .into_iter()
                .map(|(kind, seq, wm, parts, op, q)| {
                    let kind = [
                        EventKind::SnapshotCommitted,
                        EventKind::QualityReported,
                        EventKind::SnapshotExpired,
                        EventKind::SchemaChanged,
                    ][kind];
                    let mut e = AssetEvent::new(
                        key.clone(),
                        TableFormat::Delta,
                        kind,
                        seq * 11,
                        seq,
                        seq * 997,
                        EventSource::Cdc,
                    );
                    e.watermark_ms = wm;
                    e.schema_id = wm.map(|w| w % 3);
                    e.partitions = parts;
                    e.operation = Operation::ALL[op];
                    e.quality = Some(QualityStatus::ALL[q]);
                    e
                })
                .collect();
            let state = sluice_core::AssetState::fold_all(&events).expect("non-empty");
            any::<i64>().prop_map(move |revision| StateRecord::new(&state, revision))
        })
    }

    #[test]
    fn a_hand_made_record_reads_like_the_generic_reader_reads_it() {
        let key = AssetKey::parse("lake.ods.orders").expect("valid");
        let mut e = AssetEvent::committed(key, TableFormat::Hudi, 3, 3, 9, EventSource::Push);
        e.operation = Operation::Compact;
        e.quality = Some(QualityStatus::Warned);
        let state = sluice_core::AssetState::fold_all([&e]).expect("state");
        let record = StateRecord::new(&state, 42);
        let bytes = datum(&record);
        assert_eq!(read_datum(&bytes), Ok(record.clone()));
        assert_eq!(generic(&bytes), Ok(record));
    }

    #[test]
    fn recent_commits_out_of_order_are_sorted_and_the_later_of_a_sequence_wins() {
        let key = AssetKey::parse("lake.ods.orders").expect("valid");
        let e = AssetEvent::committed(key, TableFormat::Hudi, 3, 3, 9, EventSource::Push);
        let state = sluice_core::AssetState::fold_all([&e]).expect("state");
        let mut record = StateRecord::new(&state, 1);
        let c = record.recent[0].clone();
        let at = |sequence, commit_time_ms| WireCommit {
            sequence,
            commit_time_ms,
            ..c.clone()
        };
        record.recent = vec![at(5, 1), at(3, 2), at(5, 3)];
        let (state, _) = record.into_state().expect("state");
        let got: Vec<(i64, i64)> = state
            .recent
            .iter()
            .map(|c| (c.sequence, c.commit_time_ms))
            .collect();
        assert_eq!(got, vec![(3, 2), (5, 3)]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever the writer writes, the hand reader reads the same record as
        /// the generic one; every truncation fails in both.
        #[test]
        fn the_hand_reader_agrees_with_the_generic_reader(record in arb_record()) {
            let bytes = datum(&record);
            prop_assert_eq!(read_datum(&bytes), Ok(record.clone()));
            prop_assert_eq!(generic(&bytes), Ok(record));
            for cut in 0..bytes.len() {
                prop_assert!(read_datum(&bytes[..cut]).is_err(), "cut at {}", cut);
            }
        }

        /// On any bytes the hand reader never panics, and what it accepts the
        /// generic reader reads the same.
        #[test]
        fn arbitrary_bytes_read_the_same_or_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(record) = read_datum(&bytes) {
                prop_assert_eq!(generic(&bytes), Ok(record));
            }
        }
    }
}
