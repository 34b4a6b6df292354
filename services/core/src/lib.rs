//! The pure core of Sluice.
//!
//! Everything here is deterministic and free of I/O: no Kafka, no HTTP, no SQL.
//! Services decode records into these types, call the functions below and carry
//! out the effects they return. That keeps every guarantee testable in isolation:
//!
//! * [`asset`] — validated [`AssetKey`]s and table formats.
//! * [`event`] — [`AssetEvent`], the evidence, with its deterministic [`EventId`].
//! * [`state`] — [`AssetState`] and the monotonic fold (reordering and duplicates are harmless).
//! * [`condition`] — the dependency condition tree (ALL / ANY over per-asset predicates).
//! * [`dependency`] — [`DependencySpec`]: a condition with its mode, coalescing and target, validated, and the cycle check over a set.
//! * [`packed`] — states packed into bytes, to hold millions of assets in memory.
//! * [`table_service`] — table-service policies (Hudi's trigger strategies for compaction).
//! * [`decide`] — the decision of one dependency: what fires now and what its progress becomes.
//! * [`explain`] — "why did / didn't it run": the same evaluation, told leaf by leaf.
//! * [`grants`] — which project may read which namespaces and trigger which targets.
//! * [`trigger`] — [`TriggerKey`], the exactly-once identity of a trigger.
//! * [`job`] — the statuses of a dispatch job.
//! * [`backfill`] — what a backfill covers: its items, one trigger each, and its id.

pub mod asset;
pub mod backfill;
pub mod calendar;
pub mod condition;
pub mod decide;
pub mod dependency;
pub mod event;
pub mod explain;
pub mod grants;
pub mod job;
pub mod packed;
pub mod state;
pub mod table_service;
pub mod trigger;

mod digest;

pub use asset::{AssetKey, TableFormat};
pub use condition::{Baseline, Condition, InputCondition, Predicate, Scope};
pub use decide::{Cause, Fire, Progress};
pub use dependency::{DependencySpec, SpecError, TargetKind};
pub use event::{AssetEvent, EventId, EventKind, EventSource, Operation, QualityStatus};
pub use job::JobStatus;
pub use state::{AssetState, FoldOutcome};
pub use trigger::{TriggerBasis, TriggerKey};
