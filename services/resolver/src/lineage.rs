//! Cycles are a property of the whole dependency set, not of the specs one
//! resolver instance owns: every instance follows all partitions of the
//! `dependencies` topic (as it follows asset-state) and keeps the specs that
//! produce an asset — the only ones that add an edge to the lineage graph.
//!
//! The verdict is a pure function of that set, so every instance (and a restart)
//! reaches the same one: specs are taken in the order their records were appended
//! (broker timestamp, then partition and offset; the dependencies topic stamps
//! LogAppendTime), and a spec is refused when it closes a cycle with the specs
//! accepted before it. A spec keeps its place while its edges (inputs and produced
//! asset) stay the same, so re-publishing an accepted spec (a new target, a new
//! version) never hands its place to a spec refused meanwhile; a record that
//! changes the edges takes the place it was appended at. Before judging a spec, its owner waits until the follower
//! has read every partition to the end it had then, so a spec appended earlier
//! on another partition is never missed.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use sluice_kit::{BlockingCodec, SchemaName};

use sluice_core::DependencySpec;
use sluice_core::dependency::{SpecError, cycle_verdict};
use sluice_kit::wire::WireSpec;

/// Where a spec record sits in the append order: (timestamp ms, partition, offset).
pub type Order = (i64, i32, i64);

#[derive(Default)]
struct View {
    /// Specs that produce an asset, by id, with their record's place in the order.
    producing: HashMap<String, (Order, DependencySpec)>,
    /// Next offset to read, per partition.
    next: HashMap<i32, i64>,
    failed: Option<String>,
}

#[derive(Default)]
pub struct Lineage {
    view: Mutex<View>,
}

impl Lineage {
    pub fn new() -> Arc<Self> {
        Arc::new(Lineage::default())
    }

    fn view(&self) -> std::sync::MutexGuard<'_, View> {
        self.view.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies one record of the dependencies topic (`None`: a tombstone). A record
    /// that does not decode is left to its owner to dead-letter.
    pub fn apply(&self, id: &str, order: Order, spec: Option<DependencySpec>) {
        let mut v = self.view();
        let (_, partition, offset) = order;
        let next = v.next.entry(partition).or_insert(0);
        *next = (*next).max(offset + 1);
        match spec.filter(|s| s.produces.is_some()) {
            Some(s) => {
                let kept = v
                    .producing
                    .get(id)
                    .filter(|(_, old)| old.produces == s.produces && old.inputs() == s.inputs())
                    .map(|(o, _)| *o);
                v.producing
                    .insert(id.to_owned(), (kept.unwrap_or(order), s));
            }
            None => {
                v.producing.remove(id);
            }
        }
    }

    /// The place in the order of `id` (where its current edges were appended), if it
    /// produces an asset.
    pub fn order_of(&self, id: &str) -> Option<Order> {
        self.view().producing.get(id).map(|(o, _)| *o)
    }

    /// Starts [`Lineage::follow`] on a thread of its own.
    pub fn spawn_follower(
        self: &Arc<Self>,
        config: ClientConfig,
        topic: String,
        codec: BlockingCodec,
        stop: Arc<AtomicBool>,
    ) -> std::thread::JoinHandle<()> {
        let lineage = self.clone();
        std::thread::Builder::new()
            .name("dependencies-follower".into())
            .spawn(move || lineage.follow(&config, &topic, &codec, &stop))
            .expect("spawning a thread")
    }

    /// Follows every partition of `topic` until `stop` (a blocking loop).
    pub fn follow(
        self: &Arc<Self>,
        config: &ClientConfig,
        topic: &str,
        codec: &BlockingCodec,
        stop: &AtomicBool,
    ) {
        let outcome = sluice_kit::changelog::follow(
            config,
            topic,
            Duration::from_secs(30),
            stop,
            || {},
            |msg| {
                let Some(id) = msg.key().and_then(|k| std::str::from_utf8(k).ok()) else {
                    return;
                };
                let order = (
                    msg.timestamp().to_millis().unwrap_or(0),
                    msg.partition(),
                    msg.offset(),
                );
                let spec = msg.payload().and_then(|bytes| {
                    codec
                        .decode::<WireSpec>(SchemaName::DependencySpec, bytes)
                        .ok()
                        .and_then(|w| w.into_spec(id).ok())
                });
                self.apply(id, order, spec);
            },
        );
        if let Err(e) = outcome {
            tracing::error!(error = %e, "dependencies follower stopped");
            self.view().failed = Some(e.to_string());
        }
    }

    /// Waits until every partition was read to the end `consumer` reports for it
    /// now; false on timeout or a failed follower.
    pub fn wait_read_to_end(
        &self,
        consumer: &BaseConsumer,
        topic: &str,
        timeout: Duration,
    ) -> Result<(), String> {
        let until = Instant::now() + timeout;
        let md = consumer
            .fetch_metadata(Some(topic), timeout)
            .map_err(|e| format!("metadata of {topic}: {e}"))?;
        let count = md.topics().first().map_or(0, |t| t.partitions().len()) as i32;
        let mut ends = Vec::with_capacity(count as usize);
        for p in 0..count {
            let (_, high) = consumer
                .fetch_watermarks(topic, p, timeout)
                .map_err(|e| format!("end of {topic}/{p}: {e}"))?;
            ends.push((p, high));
        }
        loop {
            {
                let v = self.view();
                if let Some(why) = &v.failed {
                    return Err(format!("dependencies follower: {why}"));
                }
                // The topic is written without transactions (the CLI and the API
                // publish with an idempotent producer): its end is the last record + 1.
                let behind = ends
                    .iter()
                    .any(|(p, high)| v.next.get(p).copied().unwrap_or(0) < *high);
                if !behind {
                    return Ok(());
                }
            }
            if Instant::now() > until {
                return Err(format!(
                    "the dependencies follower did not reach the end of {topic} within {timeout:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The verdict on `spec` (its record at `order`): refused when it closes a
    /// cycle with the producing specs accepted before it in the append order.
    pub fn verdict(&self, spec: &DependencySpec, order: Order) -> Result<(), SpecError> {
        if spec.produces.is_none() {
            return Ok(());
        }
        let v = self.view();
        let mut earlier: Vec<&(Order, DependencySpec)> = v
            .producing
            .iter()
            .filter(|(id, (o, _))| **id != spec.id && *o < order)
            .map(|(_, e)| e)
            .collect();
        earlier.sort_by_key(|(o, _)| *o);
        cycle_verdict(earlier.into_iter().map(|(_, s)| s), spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: &str, input: &str, produces: &str) -> DependencySpec {
        DependencySpec::from_json(&format!(
            r#"{{"id": "{id}", "version": 1, "owner_project": "p",
                "target": {{"kind": "webhook", "name": "w"}},
                "condition": {{"input": {{"asset": "{input}"}}}}, "mode": {{"kind": "snapshots"}},
                "produces": "{produces}"}}"#
        ))
        .expect("valid spec")
    }

    #[test]
    fn the_spec_appended_last_is_the_one_that_closes_the_cycle() {
        let l = Lineage::default();
        let (a, b, c) = (
            spec("a", "l.o.x", "l.o.y"),
            spec("b", "l.o.y", "l.o.z"),
            spec("c", "l.o.z", "l.o.x"),
        );
        // Different partitions; c was appended last (latest timestamp).
        l.apply("a", (10, 0, 0), Some(a.clone()));
        l.apply("c", (30, 1, 0), Some(c.clone()));
        l.apply("b", (20, 2, 0), Some(b.clone()));
        assert!(l.verdict(&a, (10, 0, 0)).is_ok());
        assert!(l.verdict(&b, (20, 2, 0)).is_ok());
        let e = l
            .verdict(&c, (30, 1, 0))
            .expect_err("c closes it")
            .to_string();
        assert!(e.contains("cycle"), "{e}");
        // Deleting b opens the cycle again: c is accepted.
        l.apply("b", (40, 2, 1), None);
        assert!(l.verdict(&c, (30, 1, 0)).is_ok());
    }

    #[test]
    fn a_refused_spec_does_not_block_later_ones() {
        let l = Lineage::default();
        let (a, b, d) = (
            spec("a", "l.o.x", "l.o.y"),
            spec("b", "l.o.y", "l.o.x"),
            spec("d", "l.o.y", "l.o.w"),
        );
        l.apply("a", (1, 0, 0), Some(a));
        l.apply("b", (2, 0, 1), Some(b.clone()));
        l.apply("d", (3, 0, 2), Some(d.clone()));
        assert!(l.verdict(&b, (2, 0, 1)).is_err());
        assert!(
            l.verdict(&d, (3, 0, 2)).is_ok(),
            "b was refused, so no cycle through it"
        );
    }

    #[test]
    fn a_republished_spec_keeps_its_place_unless_its_edges_change() {
        let l = Lineage::default();
        let (a, b) = (spec("a", "l.o.x", "l.o.y"), spec("b", "l.o.y", "l.o.x"));
        l.apply("a", (10, 0, 0), Some(a.clone()));
        l.apply("b", (20, 1, 0), Some(b.clone()));
        // a is published again, edges unchanged (a new version, say).
        l.apply("a", (50, 0, 1), Some(a.clone()));
        assert_eq!(l.order_of("a"), Some((10, 0, 0)));
        let order = |id| l.order_of(id).expect("producing");
        assert!(l.verdict(&a, order("a")).is_ok(), "a stays accepted");
        assert!(l.verdict(&b, order("b")).is_err(), "b stays refused");
        // a now also reads l.o.w: its edges changed, so it is judged where it was
        // appended, after b.
        let a2 = DependencySpec::from_json(
            r#"{"id": "a", "version": 2, "owner_project": "p",
                "target": {"kind": "webhook", "name": "w"},
                "condition": {"all": [{"input": {"asset": "l.o.x"}}, {"input": {"asset": "l.o.w"}}]},
                "mode": {"kind": "snapshots"}, "produces": "l.o.y"}"#,
        )
        .expect("valid");
        l.apply("a", (60, 0, 2), Some(a2.clone()));
        assert_eq!(l.order_of("a"), Some((60, 0, 2)));
        assert!(l.verdict(&b, order("b")).is_ok(), "b comes first now");
        assert!(l.verdict(&a2, order("a")).is_err(), "a2 closes the cycle");
    }
}
