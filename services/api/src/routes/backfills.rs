//! Backfills: a dependency re-run over past partitions, windows or snapshots.
//!
//! The request is recorded in PostgreSQL first (`backfills`, keyed by the
//! backfill's id), then one trigger per item goes to the triggers topic with the
//! basis `backfill` + id + item. A resubmit (same id) publishes the same keys
//! again, which the dispatcher records once: it completes a submit cut short and
//! adds no run. The dispatcher paces the items (live triggers first, at most half
//! the target's slots, the request's `max_in_flight` / `per_minute` if lower) and
//! cancels what is still PENDING when the backfill is cancelled.

use serde::Deserialize;
use sluice_core::EventKind;
use sluice_core::backfill::{Item, Range, backfill_id};
use sluice_core::trigger::{InputVersion, TriggerBasis, TriggerKey};
use sluice_kit::wire::{TriggerOrigin, TriggerRecord, TriggerTarget};

use super::actions::{current_inputs, request_id, spec_for};
use super::*;

/// How far back a snapshot range is looked for in the evidence log, in commits.
const SNAPSHOT_EVIDENCE: usize = 50_000;
/// Trigger records in flight to the broker at once while a backfill is published.
const PUBLISH_CONCURRENCY: usize = 256;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BackfillBody {
    /// The caller's id: the same id is the same backfill. Without one, the
    /// dependency and the range are the id.
    request_id: Option<String>,
    reason: Option<String>,
    partitions: Option<Value>,
    partition_range: Option<Value>,
    windows: Option<Value>,
    snapshots: Option<Value>,
    /// At most this many of its runs at once (never more than half the target's slots).
    max_in_flight: Option<u32>,
    /// At most this many of its runs started a minute.
    per_minute: Option<u32>,
}

impl BackfillBody {
    /// The one range the body names.
    fn range(&self) -> Result<Range, ApiError> {
        let given: Vec<(&str, &Value)> = [
            ("partitions", &self.partitions),
            ("partition_range", &self.partition_range),
            ("windows", &self.windows),
            ("snapshots", &self.snapshots),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
        .collect();
        let [(kind, value)] = given.as_slice() else {
            return Err(bad(format!(
                "name exactly one range: partitions, partition_range, windows or snapshots \
                 (got {})",
                if given.is_empty() {
                    "none".to_owned()
                } else {
                    given.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
                }
            )));
        };
        serde_json::from_value(json!({ *kind: value })).map_err(|e| bad(format!("{kind}: {e}")))
    }
}

fn positive(name: &str, v: Option<u32>) -> Result<Option<i32>, ApiError> {
    match v {
        None => Ok(None),
        Some(0) => Err(bad(format!("{name} must be at least 1"))),
        Some(n) => i32::try_from(n)
            .map(Some)
            .map_err(|_| bad(format!("{name} is too large"))),
    }
}

/// `POST /v1/dependencies/{id}/backfills`: 202 with the backfill's id and its
/// item count (`resubmitted` if the id was known); a dry run lists the items.
pub(super) async fn submit_backfill(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Answer {
    let p = app.principal(&headers).await?;
    app.ready()?;
    let dry_run = Params::new(q, &["dry_run"])?.flag("dry_run")?;
    let spec = spec_for(&app, &p, &id, Role::Operator)?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(bad(
            "the body names the range: partitions, partition_range, windows or snapshots",
        ));
    }
    let mut b: BackfillBody =
        serde_json::from_slice(&body).map_err(|e| bad(format!("the body: {e}")))?;
    b.request_id = request_id(b.request_id.take(), &headers)?;
    let range = b.range()?;
    let max_in_flight = positive("max_in_flight", b.max_in_flight)?;
    let per_minute = positive("per_minute", b.per_minute)?;

    let evidence = match range.snapshot_bounds() {
        None => Vec::new(),
        Some((input, _, _)) => snapshot_evidence(&app, input).await?,
    };
    let items = range
        .expand(&spec, &evidence)
        .map_err(|e| err(StatusCode::UNPROCESSABLE_ENTITY, "bad_range", e.to_string()))?;
    let backfill = backfill_id(&spec.id, b.request_id.as_deref(), &range);
    let records = records(&app, &spec, &backfill, &items, &p.name, b.reason.as_deref());
    let request = json!({
        "range": range,
        "request_id": b.request_id,
        "max_in_flight": max_in_flight,
        "per_minute": per_minute,
    });
    if dry_run {
        return ok(json!({
            "dry_run": true,
            "backfill_id": backfill,
            "dependency": spec.id,
            "items": records.len(),
            "first": records.iter().take(20).map(|r| json!({
                "trigger_key": r.trigger_key,
                "partition": r.partition,
                "window_end_ms": r.window_end_ms,
                "reason": r.reason,
            })).collect::<Vec<_>>(),
            "request": request,
        }));
    }
    let new = db::insert_backfill(
        &app.pool,
        &db::NewBackfill {
            backfill_id: &backfill,
            dependency_id: &spec.id,
            project: &spec.owner_project,
            // as the dispatcher's jobs name it, for its pacing
            target_kind: sluice_kit::wire::WireTargetKind::from(spec.target.kind).as_str(),
            target_name: &spec.target.name,
            request: &request,
            items_total: records.len() as i32,
            max_in_flight,
            per_minute,
            requested_by: &p.name,
            reason: b.reason.as_deref(),
        },
    )
    .await?;
    if !new {
        let known = db::backfill(&app.pool, &backfill)
            .await?
            .unwrap_or(Value::Null);
        if known["request"]["range"] != request["range"] || known["dependency_id"] != json!(spec.id)
        {
            return Err(err(
                StatusCode::CONFLICT,
                "request_id_reused",
                format!(
                    "request id {:?} already names backfill {backfill} of {} over another range",
                    b.request_id.as_deref().unwrap_or(""),
                    known["dependency_id"].as_str().unwrap_or("?"),
                ),
            ));
        }
        if !known["cancelled_ms"].is_null() {
            return Err(err(
                StatusCode::CONFLICT,
                "cancelled",
                format!("backfill {backfill} was cancelled; submit it under a new request id"),
            ));
        }
    }
    // Every item again on a resubmit: the dispatcher records each key once, so
    // this completes a submit cut short and adds nothing to a complete one.
    for chunk in records.chunks(PUBLISH_CONCURRENCY) {
        let sends: Vec<_> = chunk.iter().map(|r| app.publish_trigger(r)).collect();
        futures::future::try_join_all(sends).await?;
    }
    db::audit(
        &app.pool,
        db::Audit {
            principal: &p.name,
            action: "dependency.backfill",
            resource: &format!("backfills/{backfill}"),
            project: &spec.owner_project,
            before: None,
            after: Some(json!({
                "dependency": spec.id,
                "request": request,
                "items": records.len(),
                "resubmitted": !new,
                "reason": b.reason,
            })),
        },
    )
    .await?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(json!({
            "backfill_id": backfill,
            "dependency": spec.id,
            "items": records.len(),
            "resubmitted": !new,
            "backfill": format!("/v1/backfills/{backfill}"),
        })),
    )
        .into_response())
}

/// The commits of `input` in the evidence log (newest `SNAPSHOT_EVIDENCE`).
async fn snapshot_evidence(app: &App, input: &AssetKey) -> Result<Vec<InputVersion>, ApiError> {
    let commits = app.commits.clone();
    let key = input.clone();
    let found = tokio::task::spawn_blocking(move || commits.newest(&key, SNAPSHOT_EVIDENCE))
        .await
        .map_err(|e| unavailable(format!("reading the evidence log: {e}")))?
        .map_err(|e| unavailable(format!("reading the evidence log: {e}")))?;
    Ok(found
        .events
        .into_iter()
        .filter(|e| e.kind == EventKind::SnapshotCommitted)
        .map(|e| InputVersion {
            asset_key: e.asset_key,
            snapshot_id: e.snapshot_id,
            sequence: e.sequence,
        })
        .collect())
}

/// One trigger per item: the inputs' current snapshots (a snapshot item puts
/// its own snapshot in place of its input's), the item's partition or window.
fn records(
    app: &App,
    spec: &DependencySpec,
    backfill: &str,
    items: &[Item],
    by: &str,
    reason: Option<&str>,
) -> Vec<TriggerRecord> {
    let (current, newest_commit) = current_inputs(app, spec);
    let now = sluice_kit::clock::now_ms();
    let identity = spec.target.identity();
    items
        .iter()
        .map(|item| {
            let label = item.label();
            let mut inputs = current.clone();
            let (mut partition, mut window_end_ms) = (None, None);
            match item {
                Item::Partition(p) => partition = Some(p.clone()),
                Item::Window { end_ms } => window_end_ms = Some(*end_ms),
                Item::Snapshot(v) => {
                    inputs.retain(|i| i.asset_key != v.asset_key.as_str());
                    inputs.push(sluice_kit::wire::TriggerInput {
                        asset_key: v.asset_key.as_str().to_owned(),
                        snapshot_id: v.snapshot_id,
                        sequence: v.sequence,
                        watermark_ms: None,
                    });
                    inputs.sort_by(|a, b| a.asset_key.cmp(&b.asset_key));
                }
            }
            let key = TriggerKey::derive(
                &identity,
                &spec.id,
                &TriggerBasis::Backfill {
                    backfill_id: backfill.to_owned(),
                    item: label.clone(),
                },
            );
            TriggerRecord {
                trigger_key: key.as_str().to_owned(),
                dependency_id: spec.id.clone(),
                dependency_version: spec.version,
                target: TriggerTarget::from(&spec.target),
                inputs,
                partition,
                window_end_ms,
                reason: format!(
                    "backfill {backfill} by {by}, {label}: {}",
                    reason.unwrap_or("no reason given")
                ),
                first_commit_ms: newest_commit.unwrap_or(now),
                requested_ms: now,
                origin: TriggerOrigin::Backfill,
                requested_by: Some(by.to_owned()),
                request_id: Some(backfill.to_owned()),
                rerun_of: None,
            }
        })
        .collect()
}

/// The backfill `id` if `p` may see it (`role` in its project).
async fn backfill_for(app: &App, p: &Principal, id: &str, role: Role) -> Result<Value, ApiError> {
    let Some(b) = db::backfill(&app.pool, id).await? else {
        return Err(not_found(format!("no backfill {id:?}")));
    };
    let project = b["project"].as_str().unwrap_or("*");
    if !p.may(role, project) {
        return Err(forbidden(p.lacks(role, project)));
    }
    Ok(b)
}

/// `GET /v1/backfills/{backfill_id}`: the request and its progress.
pub(super) async fn get_backfill(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let p = app.principal(&headers).await?;
    Params::new(q, &[])?;
    ok(backfill_for(&app, &p, &id, Role::Viewer).await?)
}

/// `GET /v1/backfills`: newest first, those the caller may see.
pub(super) async fn list_backfills(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    let p = app.principal(&headers).await?;
    let q = Params::new(q, &["dependency", "limit", "cursor"])?;
    let limit = q.limit(app.max_page, 50)?;
    let offset = q.offset()?;
    let visible = app.visible_dependencies(&p);
    let mut items = db::backfills(
        &app.pool,
        q.get("dependency"),
        visible.as_deref(),
        offset,
        limit as i64 + 1,
    )
    .await?;
    let next = (items.len() > limit).then(|| (offset + limit as i64).to_string());
    items.truncate(limit);
    ok(page(items, next))
}

/// `POST /v1/backfills/{backfill_id}/cancel`: its PENDING items become CANCELLED
/// (the dispatcher's next round), its runs under way finish.
pub(super) async fn cancel_backfill(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Answer {
    let p = app.principal(&headers).await?;
    let dry_run = Params::new(q, &["dry_run"])?.flag("dry_run")?;
    let reason: Option<String> = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct CancelBody {
            reason: Option<String>,
        }
        serde_json::from_slice::<CancelBody>(&body)
            .map_err(|e| bad(format!("the body: {e}")))?
            .reason
    };
    let before = backfill_for(&app, &p, &id, Role::Operator).await?;
    if dry_run {
        return ok(json!({"dry_run": true, "backfill": before}));
    }
    let changed = db::cancel_backfill(&app.pool, &id, &p.name).await?;
    if changed {
        db::audit(
            &app.pool,
            db::Audit {
                principal: &p.name,
                action: "backfill.cancel",
                resource: &format!("backfills/{id}"),
                project: before["project"].as_str().unwrap_or("*"),
                before: Some(before["progress"].clone()),
                after: Some(json!({"cancelled": true, "reason": reason})),
            },
        )
        .await?;
    }
    let mut now = backfill_for(&app, &p, &id, Role::Viewer).await?;
    now["changed"] = changed.into();
    ok(now)
}
