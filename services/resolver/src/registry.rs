//! The dependencies one resolver instance owns — pure bookkeeping, no Kafka.
//!
//! Besides the specs and their progress it keeps what a pass needs to find work
//! (the inverted index asset → dependencies, the pending timers, the re-checks)
//! and what an abort needs to undo: every entry as it was before the open
//! transaction first touched it. An abort puts those back exactly — a spec that
//! was replaced or deleted in the aborted transaction comes back too — so the
//! replay of the rewound records finds the state they were first applied to.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use foldhash::{HashMap, HashMapExt};
use sluice_core::decide::{Cause, Progress};
use sluice_core::{AssetKey, DependencySpec};

/// One owned dependency.
#[derive(Clone, Debug)]
pub struct Owned {
    pub spec: Arc<DependencySpec>,
    /// dependencies (and resolver-progress) partition it lives on.
    pub partition: i32,
    /// Offset of the spec record it came from: an older record replayed by the
    /// loop must not bring an older version back.
    pub offset: i64,
    pub progress: Progress,
}

#[derive(Default)]
pub struct Registry {
    deps: HashMap<String, Owned>,
    index: HashMap<AssetKey, BTreeSet<String>>,
    /// Dependencies with a pending timer.
    timed: HashSet<String>,
    /// Dependencies to re-check on the next pass (after restore, abort, a grant change).
    recheck: BTreeSet<String>,
    /// Entries as they were before the open transaction changed them (None: absent).
    saved: HashMap<String, Option<Owned>>,
}

impl Registry {
    pub fn new() -> Self {
        Registry {
            deps: HashMap::new(),
            ..Registry::default()
        }
    }

    pub fn len(&self) -> usize {
        self.deps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.deps.is_empty()
    }

    pub fn get(&self, id: &str) -> Option<&Owned> {
        self.deps.get(id)
    }

    /// True when `id` was loaded from a record at or after `offset` (a replayed
    /// older record must not bring an older version back).
    pub fn holds_at_or_after(&self, id: &str, offset: i64) -> bool {
        self.deps.get(id).is_some_and(|o| o.offset >= offset)
    }

    /// A new or changed spec, in the open transaction; a changed one keeps its progress.
    pub fn upsert(&mut self, spec: DependencySpec, partition: i32, offset: i64) {
        let id = spec.id.clone();
        self.save(&id);
        let progress = match self.take(&id) {
            Some(old) => old.progress,
            None => Progress {
                version: spec.version,
                ..Progress::default()
            },
        };
        self.put_spec(spec, partition, offset, progress);
    }

    /// A deleted spec, in the open transaction: the partition its progress lives on.
    pub fn remove(&mut self, id: &str) -> Option<i32> {
        self.save(id);
        self.take(id).map(|o| o.partition)
    }

    /// A spec and its progress read by a restore (committed already): re-checked
    /// on the next pass.
    pub fn load(&mut self, spec: DependencySpec, partition: i32, offset: i64, progress: Progress) {
        self.take(&spec.id);
        self.recheck.insert(spec.id.clone());
        self.put_spec(spec, partition, offset, progress);
    }

    fn put_spec(&mut self, spec: DependencySpec, partition: i32, offset: i64, progress: Progress) {
        let owned = Owned {
            spec: Arc::new(spec),
            partition,
            offset,
            progress,
        };
        self.put(owned.spec.id.clone(), owned);
    }

    /// Runs one evaluation step of `id` on its progress, in the open transaction.
    pub fn step<R>(
        &mut self,
        id: &str,
        f: impl FnOnce(&DependencySpec, &mut Progress) -> R,
    ) -> Option<R> {
        if !self.deps.contains_key(id) {
            return None;
        }
        self.save(id);
        let owned = self.deps.get_mut(id)?;
        let r = f(&owned.spec, &mut owned.progress);
        if owned.progress.fire_at_ms.is_some() {
            self.timed.insert(id.to_owned());
        } else {
            self.timed.remove(id);
        }
        Some(r)
    }

    /// Asks for `id` to be judged again on the next pass (`None`: all owned).
    pub fn recheck(&mut self, id: Option<&str>) {
        match id {
            Some(id) => {
                self.recheck.insert(id.to_owned());
            }
            None => self.recheck.extend(self.deps.keys().cloned()),
        }
    }

    /// The work of one pass, each dependency once: those reading a `changed`
    /// asset, then those asked to be re-checked, then the timers due at `now_ms`.
    pub fn due(
        &mut self,
        changed: impl IntoIterator<Item = AssetKey>,
        now_ms: i64,
    ) -> Vec<(String, Cause)> {
        let mut work = Vec::new();
        let mut seen: HashSet<String> = HashSet::new();
        for asset in changed {
            for id in self.index.get(&asset).into_iter().flatten() {
                if seen.insert(id.clone()) {
                    work.push((id.clone(), Cause::Change));
                }
            }
        }
        for id in std::mem::take(&mut self.recheck) {
            if self.deps.contains_key(&id) && seen.insert(id.clone()) {
                work.push((id, Cause::Recheck));
            }
        }
        for id in &self.timed {
            let due = self
                .deps
                .get(id)
                .and_then(|o| o.progress.fire_at_ms)
                .is_some_and(|at| at <= now_ms);
            if due && seen.insert(id.clone()) {
                work.push((id.clone(), Cause::Recheck));
            }
        }
        work
    }

    /// The partitions moved to another instance: their dependencies leave memory.
    pub fn revoke(&mut self, partitions: &BTreeSet<i32>) {
        let gone: Vec<String> = self
            .deps
            .iter()
            .filter(|(_, o)| partitions.contains(&o.partition))
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            self.take(&id);
            self.recheck.remove(&id);
            self.saved.remove(&id);
        }
    }

    /// The open transaction committed: its changes are durable.
    pub fn commit(&mut self) {
        self.saved.clear();
    }

    /// The open transaction aborted: every entry it touched is put back as it was,
    /// and every owned dependency is judged again (the changes drained in the
    /// aborted pass are lost).
    pub fn abort(&mut self) {
        for (id, before) in std::mem::take(&mut self.saved) {
            self.take(&id);
            if let Some(owned) = before {
                self.put(id, owned);
            }
        }
        self.recheck(None);
    }

    fn save(&mut self, id: &str) {
        if !self.saved.contains_key(id) {
            self.saved.insert(id.to_owned(), self.deps.get(id).cloned());
        }
    }

    /// Removes `id` with its index entries and timer.
    fn take(&mut self, id: &str) -> Option<Owned> {
        let old = self.deps.remove(id)?;
        for a in old.spec.inputs() {
            if let Some(ids) = self.index.get_mut(&a) {
                ids.remove(id);
                if ids.is_empty() {
                    self.index.remove(&a);
                }
            }
        }
        self.timed.remove(id);
        Some(old)
    }

    /// Inserts `owned` with its index entries and timer.
    fn put(&mut self, id: String, owned: Owned) {
        for a in owned.spec.inputs() {
            self.index.entry(a).or_default().insert(id.clone());
        }
        if owned.progress.fire_at_ms.is_some() {
            self.timed.insert(id.clone());
        }
        self.deps.insert(id, owned);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: &str, input: &str, version: i64) -> DependencySpec {
        DependencySpec::from_json(&format!(
            r#"{{"id": "{id}", "version": {version}, "owner_project": "p",
                "target": {{"kind": "webhook", "name": "w"}},
                "condition": {{"input": {{"asset": "{input}"}}}}, "mode": {{"kind": "snapshots"}}}}"#
        ))
        .expect("valid spec")
    }

    fn key(s: &str) -> AssetKey {
        AssetKey::parse(s).expect("key")
    }

    fn ids(work: &[(String, Cause)]) -> Vec<&str> {
        work.iter().map(|(id, _)| id.as_str()).collect()
    }

    #[test]
    fn an_aborted_deletion_brings_the_dependency_back_for_the_replay() {
        let mut r = Registry::new();
        r.load(spec("d1", "lake.s.a", 1), 0, 10, Progress::default());
        r.due([], 0);
        assert_eq!(r.remove("d1"), Some(0));
        r.abort();
        // The replayed tombstone must find it, to delete its progress too.
        assert_eq!(r.get("d1").map(|o| o.offset), Some(10));
        assert_eq!(ids(&r.due([key("lake.s.a")], 0)), ["d1"]);
    }

    #[test]
    fn an_aborted_change_restores_the_old_spec_its_index_and_its_progress() {
        let mut r = Registry::new();
        r.load(spec("d1", "lake.s.a", 1), 0, 10, Progress::default());
        r.commit();
        r.upsert(spec("d1", "lake.s.b", 2), 0, 11);
        r.step("d1", |_, p| p.fire_at_ms = Some(5));
        assert_eq!(ids(&r.due([key("lake.s.b")], 0)), ["d1"]);
        r.abort();
        let o = r.get("d1").expect("back");
        assert_eq!(
            (o.spec.version, o.offset, o.progress.fire_at_ms),
            (1, 10, None)
        );
        assert!(
            !r.holds_at_or_after("d1", 11),
            "the replay applies the change again"
        );
        assert!(
            r.due([key("lake.s.b")], 100)
                .iter()
                .all(|(_, c)| *c == Cause::Recheck)
        );
        assert_eq!(ids(&r.due([key("lake.s.a")], 100)), ["d1"]);
    }

    #[test]
    fn a_committed_step_survives_a_later_abort() {
        let mut r = Registry::new();
        r.upsert(spec("d1", "lake.s.a", 1), 0, 1);
        r.step("d1", |_, p| p.fire_at_ms = Some(50));
        r.commit();
        r.step("d1", |_, p| p.fire_at_ms = None);
        r.abort();
        assert_eq!(r.get("d1").and_then(|o| o.progress.fire_at_ms), Some(50));
        r.due([], 0);
        assert!(r.due([], 49).is_empty(), "not due before its time");
        assert_eq!(ids(&r.due([], 50)), ["d1"]);
    }

    #[test]
    fn an_aborted_insert_is_gone() {
        let mut r = Registry::new();
        r.upsert(spec("d1", "lake.s.a", 1), 0, 1);
        r.abort();
        assert!(r.is_empty());
        assert!(r.due([key("lake.s.a")], 0).is_empty());
    }

    #[test]
    fn a_revoked_partition_forgets_its_dependencies_and_their_saved_entries() {
        let mut r = Registry::new();
        r.upsert(spec("d1", "lake.s.a", 1), 0, 1);
        r.upsert(spec("d2", "lake.s.a", 1), 1, 1);
        r.revoke(&BTreeSet::from([0]));
        r.abort();
        assert!(
            r.get("d1").is_none(),
            "an abort after a revoke must not resurrect it"
        );
        assert!(r.get("d2").is_none(), "d2 was uncommitted");
    }
}
