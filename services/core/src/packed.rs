//! Asset states packed to be held by the million.
//!
//! The state-updater holds every asset of its partitions and each resolver and API
//! instance holds every asset there is. As structs, a one-commit [`AssetState`]
//! costs ~1,900 bytes resident: a B-tree leaf sized for eleven commits, three
//! copies of the newest commit with its 36-character id, a 24-byte key held twice,
//! and a hash table whose slots are as wide as the struct. A [`PackedState`] is one
//! allocation of bytes instead — the key, the revision and the state, with
//! varints, event ids in binary and the newest commits stored once — decoded when
//! it is read. A [`StateTable`] keys them by the key inside the bytes, so a slot
//! is one pointer wide. One commit costs ~60 bytes packed, ~110 resident.
//!
//! Unpacking is cheap (a few hundred nanoseconds) next to what a reader does
//! with a state, and only the assets a pass reads are unpacked.

use hashbrown::HashTable;

use crate::asset::{AssetKey, TableFormat};
use crate::event::{EventId, Operation, QualityStatus};
use crate::state::{AssetState, CommitInfo, QualityMark};

/// One asset's state, its revision and its partition, packed. Only [`PackedState::pack`]
/// makes one, so its bytes always decode.
#[derive(Clone, PartialEq, Eq)]
pub struct PackedState(Box<[u8]>);

impl std::fmt::Debug for PackedState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedState")
            .field("key", &self.key())
            .field("revision", &self.revision())
            .field("bytes", &self.0.len())
            .finish()
    }
}

const HAS_WATERMARK: u8 = 1;
const HAS_SCHEMA: u8 = 2;
const HAS_QUALITY: u8 = 4;
const HAS_EXPIRED: u8 = 8;

/// An id as [`EventId::derive`] makes it: `ev1-` and 32 lower-case hex digits,
/// stored as its 16 bytes.
const DERIVED_ID: u8 = 0;
/// Any other id (read from the wire), stored as its text.
const OTHER_ID: u8 = 1;
const DERIVED_PREFIX: &str = "ev1-";

impl PackedState {
    pub fn pack(state: &AssetState, revision: i64, partition: i32) -> Self {
        let mut w = Vec::with_capacity(64 + state.asset_key.as_str().len());
        put_str(&mut w, state.asset_key.as_str());
        put_i64(&mut w, revision);
        put_i64(&mut w, i64::from(partition));
        w.push(code(&TableFormat::ALL, state.format));
        let flags = [
            (state.watermark_ms.is_some(), HAS_WATERMARK),
            (state.schema.is_some(), HAS_SCHEMA),
            (state.quality.is_some(), HAS_QUALITY),
            (state.expired_through.is_some(), HAS_EXPIRED),
        ]
        .into_iter()
        .filter(|(present, _)| *present)
        .fold(0, |flags, (_, bit)| flags | bit);
        w.push(flags);
        put_u64(&mut w, state.commit_count);
        put_u64(&mut w, state.data_commit_count);
        if let Some(v) = state.watermark_ms {
            put_i64(&mut w, v);
        }
        if let Some((sequence, id)) = state.schema {
            put_i64(&mut w, sequence);
            put_i64(&mut w, id);
        }
        if let Some(q) = state.quality {
            put_i64(&mut w, q.sequence);
            put_i64(&mut w, q.reported_at_ms);
            w.push(code(&QualityStatus::ALL, q.status));
        }
        if let Some(v) = state.expired_through {
            put_i64(&mut w, v);
        }
        put_u64(&mut w, state.recent.len() as u64);
        for c in &state.recent {
            put_commit(&mut w, c);
        }
        // The newest commits are almost always among the recent ones: stored as
        // their position there (1-based; 0 = none) instead of a second copy.
        for slot in [&state.latest, &state.latest_data] {
            match slot {
                None => put_u64(&mut w, 0),
                Some(c) => match state.recent.iter().rposition(|r| r == c) {
                    Some(at) => put_u64(&mut w, at as u64 + 1),
                    None => {
                        put_u64(&mut w, state.recent.len() as u64 + 1);
                        put_commit(&mut w, c);
                    }
                },
            }
        }
        PackedState(w.into_boxed_slice())
    }

    pub fn key(&self) -> &str {
        Reader::new(&self.0).str()
    }

    /// The key's bytes: what a lookup compares (no UTF-8 check per probe).
    fn key_bytes(&self) -> &[u8] {
        let mut r = Reader::new(&self.0);
        let n = r.u64() as usize;
        r.take(n)
    }

    pub fn revision(&self) -> i64 {
        let mut r = Reader::new(&self.0);
        r.str();
        r.i64()
    }

    /// The input partition the state belongs to (the updater's restore and revoke).
    pub fn partition(&self) -> i32 {
        let mut r = Reader::new(&self.0);
        r.str();
        r.i64();
        // Packed from an i32.
        i32::try_from(r.i64()).unwrap_or_default()
    }

    /// Bytes held, for memory figures.
    pub fn packed_len(&self) -> usize {
        self.0.len()
    }

    /// The state and its revision.
    pub fn unpack(&self) -> (AssetState, i64) {
        let mut r = Reader::new(&self.0);
        let asset_key = AssetKey::trusted(r.str());
        let revision = r.i64();
        r.i64();
        let format = of(&TableFormat::ALL, r.u8());
        let flags = r.u8();
        let commit_count = r.u64();
        let data_commit_count = r.u64();
        let watermark_ms = (flags & HAS_WATERMARK != 0).then(|| r.i64());
        let schema = (flags & HAS_SCHEMA != 0).then(|| (r.i64(), r.i64()));
        let quality = (flags & HAS_QUALITY != 0).then(|| QualityMark {
            sequence: r.i64(),
            reported_at_ms: r.i64(),
            status: of(&QualityStatus::ALL, r.u8()),
        });
        let expired_through = (flags & HAS_EXPIRED != 0).then(|| r.i64());
        let n = r.u64() as usize;
        let recent: Vec<CommitInfo> = (0..n).map(|_| r.commit()).collect();
        let mut slot = || match r.u64() as usize {
            0 => None,
            at if at <= n => recent.get(at - 1).cloned(),
            _ => Some(r.commit()),
        };
        let latest = slot();
        let latest_data = slot();
        let state = AssetState {
            asset_key,
            format,
            latest,
            latest_data,
            commit_count,
            data_commit_count,
            watermark_ms,
            schema,
            quality,
            expired_through,
            recent,
        };
        (state, revision)
    }
}

/// Packed states by asset key. A slot holds one pointer; the key lives in the bytes.
#[derive(Default)]
pub struct StateTable {
    table: HashTable<PackedState>,
    hasher: foldhash::fast::FixedState,
}

impl StateTable {
    pub fn new() -> Self {
        StateTable::default()
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    fn hash(&self, key: &str) -> u64 {
        std::hash::BuildHasher::hash_one(&self.hasher, key)
    }

    pub fn get(&self, key: &str) -> Option<&PackedState> {
        self.table
            .find(self.hash(key), |p| p.key_bytes() == key.as_bytes())
    }

    /// The state of `key` and its revision, unpacked.
    pub fn state(&self, key: &str) -> Option<(AssetState, i64)> {
        self.get(key).map(PackedState::unpack)
    }

    /// Inserts or replaces the state of the packed key; returns the one replaced.
    pub fn insert(&mut self, packed: PackedState) -> Option<PackedState> {
        let hash = self.hash(packed.key());
        let StateTable { table, hasher } = self;
        match table.entry(
            hash,
            |p| p.key_bytes() == packed.key_bytes(),
            |p| std::hash::BuildHasher::hash_one(&*hasher, p.key()),
        ) {
            hashbrown::hash_table::Entry::Occupied(mut o) => {
                Some(std::mem::replace(o.get_mut(), packed))
            }
            hashbrown::hash_table::Entry::Vacant(v) => {
                v.insert(packed);
                None
            }
        }
    }

    pub fn remove(&mut self, key: &str) -> Option<PackedState> {
        match self
            .table
            .find_entry(self.hash(key), |p| p.key_bytes() == key.as_bytes())
        {
            Ok(o) => Some(o.remove().0),
            Err(_) => None,
        }
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&PackedState) -> bool) {
        self.table.retain(|p| keep(p));
    }

    pub fn iter(&self) -> impl Iterator<Item = &PackedState> {
        self.table.iter()
    }
}

impl Extend<PackedState> for StateTable {
    fn extend<I: IntoIterator<Item = PackedState>>(&mut self, iter: I) {
        for p in iter {
            self.insert(p);
        }
    }
}

impl IntoIterator for StateTable {
    type Item = PackedState;
    type IntoIter = hashbrown::hash_table::IntoIter<PackedState>;
    fn into_iter(self) -> Self::IntoIter {
        self.table.into_iter()
    }
}

fn put_u64(w: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        w.push((v as u8) | 0x80);
        v >>= 7;
    }
    w.push(v as u8);
}

fn put_i64(w: &mut Vec<u8>, v: i64) {
    put_u64(w, ((v << 1) ^ (v >> 63)) as u64);
}

fn put_str(w: &mut Vec<u8>, s: &str) {
    put_u64(w, s.len() as u64);
    w.extend_from_slice(s.as_bytes());
}

fn put_commit(w: &mut Vec<u8>, c: &CommitInfo) {
    match derived_id_bytes(c.event_id.as_str()) {
        Some(bytes) => {
            w.push(DERIVED_ID);
            w.extend_from_slice(&bytes);
        }
        None => {
            w.push(OTHER_ID);
            put_str(w, c.event_id.as_str());
        }
    }
    put_i64(w, c.snapshot_id);
    put_i64(w, c.sequence);
    put_i64(w, c.commit_time_ms);
    w.push(code(&Operation::ALL, c.operation));
    put_u64(w, c.partitions.len() as u64);
    for p in &c.partitions {
        put_str(w, p);
    }
}

/// The 16 bytes of a derived id; None for any other spelling (upper-case hex
/// included), which is kept as text so it reads back exactly.
fn derived_id_bytes(id: &str) -> Option<[u8; 16]> {
    let hex = id.strip_prefix(DERIVED_PREFIX)?;
    if hex.len() != 32 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut out = [0u8; 16];
    hex::decode_to_slice(hex, &mut out).ok()?;
    Some(out)
}

/// Reads what [`PackedState::pack`] wrote; the bytes never come from outside.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, at: 0 }
    }

    fn u8(&mut self) -> u8 {
        let b = self.bytes[self.at];
        self.at += 1;
        b
    }

    fn u64(&mut self) -> u64 {
        let mut v = 0u64;
        let mut shift = 0;
        loop {
            let b = self.u8();
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return v;
            }
            shift += 7;
        }
    }

    fn i64(&mut self) -> i64 {
        let z = self.u64();
        ((z >> 1) as i64) ^ -((z & 1) as i64)
    }

    fn take(&mut self, n: usize) -> &'a [u8] {
        let s = &self.bytes[self.at..self.at + n];
        self.at += n;
        s
    }

    fn str(&mut self) -> &'a str {
        let n = self.u64() as usize;
        // Packed from a &str.
        std::str::from_utf8(self.take(n)).unwrap_or_default()
    }

    fn commit(&mut self) -> CommitInfo {
        let event_id = match self.u8() {
            DERIVED_ID => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let mut id = [0u8; 36];
                id[..4].copy_from_slice(DERIVED_PREFIX.as_bytes());
                for (i, b) in self.take(16).iter().enumerate() {
                    id[4 + 2 * i] = HEX[usize::from(b >> 4)];
                    id[5 + 2 * i] = HEX[usize::from(b & 15)];
                }
                // ASCII, so borrowed as is: one allocation, the String's.
                EventId::from_wire(String::from_utf8_lossy(&id).into_owned())
            }
            _ => EventId::from_wire(self.str().to_owned()),
        };
        let snapshot_id = self.i64();
        let sequence = self.i64();
        let commit_time_ms = self.i64();
        let operation = of(&Operation::ALL, self.u8());
        let n = self.u64() as usize;
        let partitions = (0..n).map(|_| self.str().to_owned()).collect();
        CommitInfo {
            event_id,
            snapshot_id,
            sequence,
            commit_time_ms,
            operation,
            partitions,
        }
    }
}

/// An enum's code: its position in its `ALL`. The bytes never leave the process,
/// so they need no schema.
fn code<T: PartialEq + Copy>(all: &[T], v: T) -> u8 {
    all.iter().position(|x| *x == v).unwrap_or_default() as u8
}

/// The enum value of a code [`code`] wrote.
fn of<T: Copy>(all: &[T], code: u8) -> T {
    all[usize::from(code)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{AssetEvent, EventKind, EventSource};
    use proptest::prelude::*;

    fn key(i: u32) -> AssetKey {
        AssetKey::parse(&format!("lake.ods.t{i}")).expect("valid")
    }

    fn commit(k: &AssetKey, seq: i64, op: Operation, parts: &[&str]) -> AssetEvent {
        let mut e = AssetEvent::committed(
            k.clone(),
            TableFormat::Hudi,
            seq * 7,
            seq,
            1_700_000_000_000 + seq,
            EventSource::Poll,
        );
        e.operation = op;
        e.partitions = parts.iter().map(|p| p.to_string()).collect();
        e
    }

    #[test]
    fn a_one_commit_state_packs_small_and_reads_back_the_same() {
        let k = key(1);
        let s = AssetState::fold_all([&commit(&k, 1, Operation::Append, &[])]).expect("state");
        let p = PackedState::pack(&s, 7, 3);
        assert_eq!(p.unpack(), (s, 7));
        assert_eq!(
            (p.key(), p.revision(), p.partition()),
            ("lake.ods.t1", 7, 3)
        );
        assert!(p.packed_len() <= 64, "{} bytes", p.packed_len());
    }

    #[test]
    fn newest_commits_outside_the_recent_ones_are_kept_whole() {
        // A state read from the wire need not hold its newest commits among the
        // recent ones (an older writer, a hand-made record).
        let k = key(2);
        let mut s =
            AssetState::fold_all([&commit(&k, 5, Operation::Append, &["dt=1"])]).expect("state");
        s.recent.clear();
        let mut data = s.latest.clone().expect("latest");
        data.sequence = 4;
        data.event_id = EventId::from_wire("from-an-older-writer".into());
        s.latest_data = Some(data);
        assert_eq!(PackedState::pack(&s, 1, 0).unpack(), (s, 1));
    }

    #[test]
    fn the_table_replaces_removes_and_retains_by_key() {
        let mut t = StateTable::new();
        for i in 0..100 {
            let k = key(i);
            let s = AssetState::fold_all([&commit(&k, 1, Operation::Append, &[])]).expect("s");
            assert!(t.insert(PackedState::pack(&s, 1, (i % 4) as i32)).is_none());
        }
        let k = key(7);
        let s = AssetState::fold_all([&commit(&k, 2, Operation::Compact, &[])]).expect("s");
        let old = t.insert(PackedState::pack(&s, 2, 3)).expect("replaced");
        assert_eq!(old.revision(), 1);
        assert_eq!(t.state("lake.ods.t7").map(|(_, r)| r), Some(2));
        assert_eq!(t.len(), 100);
        assert!(t.remove("lake.ods.t8").is_some());
        assert!(t.get("lake.ods.t8").is_none());
        t.retain(|p| p.partition() != 0);
        assert_eq!(t.len(), 75, "99 held, 24 of them on partition 0");
        assert!(t.iter().all(|p| p.partition() != 0));
    }

    fn arb_event(k: AssetKey) -> impl Strategy<Value = AssetEvent> {
        (
            0usize..4,
            -3i64..90,
            proptest::option::of(0i64..10_000),
            proptest::collection::vec(0u8..6, 0..3),
            0usize..5,
            0usize..3,
            any::<bool>(),
        )
            .prop_map(move |(kind, seq, wm, parts, op, q, foreign_id)| {
                let kind = [
                    EventKind::SnapshotCommitted,
                    EventKind::SnapshotCommitted,
                    EventKind::QualityReported,
                    EventKind::SnapshotExpired,
                ][kind];
                let mut e = AssetEvent::new(
                    k.clone(),
                    TableFormat::Iceberg,
                    kind,
                    seq * 3,
                    seq,
                    seq * 1_000,
                    EventSource::Push,
                );
                e.watermark_ms = wm;
                e.schema_id = wm.map(|w| w % 7);
                e.partitions = parts.into_iter().map(|p| format!("p={p}")).collect();
                e.operation = Operation::ALL[op];
                e.quality = Some(QualityStatus::ALL[q]);
                if foreign_id {
                    e.event_id = EventId::from_wire(format!("EV1-{seq}"));
                }
                e
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever the fold makes, packing and unpacking gives it back.
        #[test]
        fn any_folded_state_reads_back_unchanged(
            events in proptest::collection::vec(arb_event(key(9)), 1..100),
            revision in any::<i64>(),
            partition in any::<i32>(),
        ) {
            let s = AssetState::fold_all(&events).expect("non-empty");
            let p = PackedState::pack(&s, revision, partition);
            prop_assert_eq!(p.unpack(), (s, revision));
            prop_assert_eq!(p.partition(), partition);
        }
    }
}
