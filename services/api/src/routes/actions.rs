//! Operator actions: pause / resume a dependency, run it now, re-run a run,
//! settle a run whose outcome the dispatcher could not tell (UNKNOWN).
//!
//! Each keeps the exactly-once rules. Pause is part of the declared state (a
//! new version of the spec on the dependencies topic), so it survives restarts
//! and every resolver sees it. A manual run and a re-run are trigger requests
//! whose key has a basis of its own (`manual` / `rerun` with the caller's request
//! id): a retried request derives the same key, which the dispatcher records once,
//! and no such key can equal a data trigger's.

use serde::Deserialize;
use sluice_core::trigger::{TriggerBasis, TriggerKey};
use sluice_kit::wire::{TriggerInput, TriggerOrigin, TriggerRecord, TriggerTarget, WireTargetKind};

use super::*;

/// The body of an action (optional: `{}` or nothing for pause / resume).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ActionBody {
    /// The caller's id of this request; the `Idempotency-Key` header works too.
    request_id: Option<String>,
    /// Why, for the audit log and the run's reason.
    reason: Option<String>,
}

fn action_body(body: &Bytes, headers: &HeaderMap) -> Result<ActionBody, ApiError> {
    let mut b: ActionBody = if body.iter().all(u8::is_ascii_whitespace) {
        ActionBody::default()
    } else {
        serde_json::from_slice(body).map_err(|e| bad(format!("the body: {e}")))?
    };
    b.request_id = request_id(b.request_id.take(), headers)?;
    Ok(b)
}

/// The request id given in the body, else in the `Idempotency-Key` header, checked.
pub(super) fn request_id(
    given: Option<String>,
    headers: &HeaderMap,
) -> Result<Option<String>, ApiError> {
    let id = match (given, headers.get("idempotency-key")) {
        (Some(id), _) => Some(id),
        (None, Some(v)) => Some(
            v.to_str()
                .map_err(|_| bad("Idempotency-Key is not text"))?
                .to_owned(),
        ),
        (None, None) => None,
    };
    if let Some(id) = &id
        && (id.is_empty() || id.len() > 200 || id.chars().any(char::is_control))
    {
        return Err(bad("request_id must be 1 to 200 printable characters"));
    }
    Ok(id)
}

/// What every action starts with: the caller, the engine's state read, the
/// `dry_run` flag and the body.
async fn begin(
    app: &App,
    headers: &HeaderMap,
    q: HashMap<String, String>,
    body: &Bytes,
) -> Result<(Principal, bool, ActionBody), ApiError> {
    let p = app.principal(headers).await?;
    app.ready()?;
    let dry_run = Params::new(q, &["dry_run"])?.flag("dry_run")?;
    Ok((p, dry_run, action_body(body, headers)?))
}

impl ActionBody {
    fn request_id(&self) -> Result<&str, ApiError> {
        self.request_id.as_deref().ok_or_else(|| {
            bad(
                "a request_id is required (in the body or as Idempotency-Key): \
                 a retried request with the same id is the same run",
            )
        })
    }
}

/// The accepted spec of `id`, for an action by `p` needing `role`.
pub(super) fn spec_for(
    app: &App,
    p: &Principal,
    id: &str,
    role: Role,
) -> Result<DependencySpec, ApiError> {
    let mut t = app.view.write();
    forbidden_or_missing(p, &t, id)?;
    if let Some(why) = t.refusal(id) {
        return Err(err(
            StatusCode::CONFLICT,
            "refused",
            format!("{id:?} is not in force: {why}"),
        ));
    }
    let spec = t
        .specs
        .get(id)
        .and_then(|e| e.spec.as_ref().ok())
        .cloned()
        .ok_or_else(|| not_found(format!("no dependency {id:?}")))?;
    if !p.may(role, &spec.owner_project) {
        return Err(forbidden(p.lacks(role, &spec.owner_project)));
    }
    Ok(spec)
}

pub(super) async fn pause_dependency(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Answer {
    set_paused(app, headers, id, q, body, true).await
}

pub(super) async fn resume_dependency(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Answer {
    set_paused(app, headers, id, q, body, false).await
}

async fn set_paused(
    app: App,
    headers: HeaderMap,
    id: String,
    q: HashMap<String, String>,
    body: Bytes,
    paused: bool,
) -> Answer {
    let (p, dry_run, body) = begin(&app, &headers, q, &body).await?;
    let current = spec_for(&app, &p, &id, Role::Operator)?;
    check_if_match(&headers, Some(&current))?;
    if current.paused == paused {
        return ok(
            json!({"id": id, "paused": paused, "changed": false, "version": current.version}),
        );
    }
    let mut next = current.clone();
    next.paused = paused;
    next.version += 1;
    if dry_run {
        return ok(
            json!({"id": id, "paused": paused, "changed": true, "version": next.version, "dry_run": true}),
        );
    }
    app.publish_spec(&id, Some(&next)).await?;
    db::audit(
        &app.pool,
        db::Audit {
            principal: &p.name,
            action: if paused {
                "dependency.pause"
            } else {
                "dependency.resume"
            },
            resource: &format!("dependencies/{id}"),
            project: &next.owner_project,
            before: Some(json!({"paused": current.paused, "version": current.version})),
            after: Some(json!({"paused": paused, "version": next.version, "reason": body.reason})),
        },
    )
    .await?;
    ok(json!({"id": id, "paused": paused, "changed": true, "version": next.version}))
}

/// An operator's acceptance of an input's new schema.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AcknowledgeBody {
    /// The input asset whose `schema_unchanged` is shut by a schema change.
    input: String,
    /// The schema id the operator looked at; refused if the input has moved on
    /// since (default: whatever it has now).
    schema_id: Option<i64>,
    /// Why the new schema is fine for the target; required and audited.
    reason: String,
}

/// Acknowledges a schema change: a new version of the spec carrying the accepted
/// schema id, which the resolver takes once on that version's first evaluation (a
/// change of the declared state, like pause, so every resolver sees it and a
/// restart keeps it). The dependency then fires for the newest combination if the
/// rest of its condition holds.
pub(super) async fn acknowledge_schema(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Answer {
    let p = app.principal(&headers).await?;
    app.ready()?;
    let dry_run = Params::new(q, &["dry_run"])?.flag("dry_run")?;
    let current = spec_for(&app, &p, &id, Role::Operator)?;
    check_if_match(&headers, Some(&current))?;
    let b: AcknowledgeBody = serde_json::from_slice(&body).map_err(|e| {
        bad(format!(
            "the body: {e} (expected {{\"input\": \"asset key\", \"schema_id\": 7, \"reason\": \"...\"}})"
        ))
    })?;
    if b.reason.trim().is_empty() {
        return Err(bad(
            "a reason is required: why the new schema is fine for the target",
        ));
    }
    let input = AssetKey::parse(&b.input).map_err(|e| bad(format!("input: {e}")))?;
    if !current.condition.watches_schema(&input) {
        return Err(err(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            format!(
                "{id:?} has no input {input} with schema_unchanged: there is no schema to acknowledge"
            ),
        ));
    }
    let (now, then) = {
        let t = app.view.read();
        let now = t
            .assets
            .get(&input)
            .and_then(|p| p.unpack().0.schema.map(|(_, id)| id));
        let then = t
            .progress
            .get(&id)
            .and_then(|p| p.baselines.get(&input))
            .and_then(|b| b.schema_id);
        (now, then)
    };
    let Some(now) = now else {
        return Err(err(
            StatusCode::CONFLICT,
            "no_schema",
            format!("{input} has reported no schema yet: there is nothing to acknowledge"),
        ));
    };
    if let Some(looked_at) = b.schema_id
        && looked_at != now
    {
        return Err(err(
            StatusCode::CONFLICT,
            "schema_moved",
            format!(
                "{input} has schema {now} now, not {looked_at}: look at it and acknowledge that one"
            ),
        ));
    }
    let answer = |changed: bool, version: i64| {
        json!({"id": id, "input": input.as_str(), "schema_id": now, "at_last_trigger": then,
               "changed": changed, "version": version, "dry_run": dry_run})
    };
    // Never triggered (no baseline) or already the baseline: nothing is shut.
    if then.is_none_or(|then| then == now) {
        return ok(answer(false, current.version));
    }
    let mut next = current.clone();
    next.schema_acknowledged.insert(input.clone(), now);
    next.version += 1;
    if dry_run {
        return ok(answer(true, next.version));
    }
    app.publish_spec(&id, Some(&next)).await?;
    db::audit(
        &app.pool,
        db::Audit {
            principal: &p.name,
            action: "dependency.acknowledge_schema",
            resource: &format!("dependencies/{id}"),
            project: &next.owner_project,
            before: Some(json!({"input": input.as_str(), "schema_id": then, "version": current.version})),
            after: Some(json!({"input": input.as_str(), "schema_id": now, "version": next.version, "reason": b.reason})),
        },
    )
    .await?;
    ok(answer(true, next.version))
}

/// The inputs' current snapshots (the newest data commit of each, else its
/// newest commit) and the newest of their commit times.
pub(super) fn current_inputs(app: &App, spec: &DependencySpec) -> (Vec<TriggerInput>, Option<i64>) {
    let t = app.view.read();
    let mut newest = None::<i64>;
    let inputs = spec
        .inputs()
        .iter()
        .filter_map(|a| {
            let (state, _) = t.assets.get(a)?.unpack();
            let c = state.latest_data.as_ref().or(state.latest.as_ref())?;
            newest = newest.max(Some(c.commit_time_ms));
            Some(TriggerInput {
                asset_key: a.as_str().to_owned(),
                snapshot_id: c.snapshot_id,
                sequence: c.sequence,
                watermark_ms: state.watermark_ms,
            })
        })
        .collect();
    (inputs, newest)
}

/// Run now: one trigger of the dependency with its inputs' current snapshots,
/// whether or not its condition holds (and whether or not it is paused: the
/// operator asked).
pub(super) async fn run_dependency(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Answer {
    let (p, dry_run, body) = begin(&app, &headers, q, &body).await?;
    let spec = spec_for(&app, &p, &id, Role::Operator)?;
    let request_id = body.request_id()?.to_owned();
    let now = sluice_kit::clock::now_ms();
    let (inputs, newest_commit) = current_inputs(&app, &spec);
    let key = TriggerKey::derive(
        &spec.target.identity(),
        &spec.id,
        &TriggerBasis::Manual {
            request_id: request_id.clone(),
        },
    );
    let record = TriggerRecord {
        trigger_key: key.as_str().to_owned(),
        dependency_id: spec.id.clone(),
        dependency_version: spec.version,
        target: TriggerTarget::from(&spec.target),
        inputs,
        partition: None,
        window_end_ms: None,
        reason: format!(
            "run now by {}: {}",
            p.name,
            body.reason.as_deref().unwrap_or("no reason given")
        ),
        first_commit_ms: newest_commit.unwrap_or(now),
        requested_ms: now,
        origin: TriggerOrigin::Manual,
        requested_by: Some(p.name.clone()),
        request_id: Some(request_id),
        rerun_of: None,
    };
    let resource = format!("dependencies/{id}");
    let audit = (
        &p,
        "dependency.run",
        resource.as_str(),
        spec.owner_project.as_str(),
    );
    submit(&app, record, dry_run, audit).await
}

/// Re-run: a new run of a FAILED, SUCCEEDED or CANCELLED run's inputs, linked to it.
pub(super) async fn rerun(
    State(app): State<App>,
    headers: HeaderMap,
    Path(of): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Answer {
    let (p, dry_run, body) = begin(&app, &headers, q, &body).await?;
    let Some(original) = db::run(&app.pool, &of).await? else {
        return Err(not_found(format!("no run {of:?}")));
    };
    let text = |k: &str| original.get(k).and_then(Value::as_str).map(str::to_owned);
    let dependency = text("dependency_id").unwrap_or_default();
    // A deleted dependency's runs are an admin's to repeat.
    let project = owner_of(&app.view.read(), &dependency).unwrap_or_else(|| "*".into());
    if !p.may(Role::Operator, &project) {
        return Err(forbidden(p.lacks(Role::Operator, &project)));
    }
    let request_id = body.request_id()?.to_owned();
    let status = text("status").unwrap_or_default();
    if !matches!(status.as_str(), "FAILED" | "SUCCEEDED" | "CANCELLED") {
        return Err(err(
            StatusCode::CONFLICT,
            "not_finished",
            format!(
                "only a FAILED, SUCCEEDED or CANCELLED run is re-run; {of} is {status} \
                 (an UNKNOWN one is settled first)"
            ),
        ));
    }
    let kind: WireTargetKind =
        serde_json::from_value(original.get("target_kind").cloned().unwrap_or_default())
            .map_err(|e| unavailable(format!("the run's target kind: {e}")))?;
    let target = TriggerTarget {
        kind,
        name: text("target_name").unwrap_or_default(),
        parameters: serde_json::from_value(
            original
                .get("target_parameters")
                .cloned()
                .unwrap_or_else(|| json!({})),
        )
        .map_err(|e| unavailable(format!("the run's target parameters: {e}")))?,
    };
    let inputs = original
        .get("inputs")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|i| TriggerInput {
                    asset_key: i["asset"].as_str().unwrap_or_default().to_owned(),
                    snapshot_id: i["snapshot_id"].as_i64().unwrap_or_default(),
                    sequence: i["sequence"].as_i64().unwrap_or_default(),
                    watermark_ms: i["watermark_ms"].as_i64(),
                })
                .collect()
        })
        .unwrap_or_default();
    let identity = format!(
        "{}:{}",
        sluice_core::dependency::TargetKind::from(kind).as_str(),
        target.name
    );
    let key = TriggerKey::derive(
        &identity,
        &dependency,
        &TriggerBasis::Rerun {
            of: of.clone(),
            request_id: request_id.clone(),
        },
    );
    let now = sluice_kit::clock::now_ms();
    let record = TriggerRecord {
        trigger_key: key.as_str().to_owned(),
        dependency_id: dependency,
        dependency_version: original["dependency_version"].as_i64().unwrap_or_default(),
        target,
        inputs,
        partition: text("partition"),
        window_end_ms: original["window_end_ms"].as_i64(),
        reason: format!(
            "re-run of {of} by {}: {}",
            p.name,
            body.reason.as_deref().unwrap_or("no reason given")
        ),
        first_commit_ms: original["first_commit_ms"].as_i64().unwrap_or(now),
        requested_ms: now,
        origin: TriggerOrigin::Rerun,
        requested_by: Some(p.name.clone()),
        request_id: Some(request_id),
        rerun_of: Some(of.clone()),
    };
    let resource = format!("runs/{of}");
    submit(
        &app,
        record,
        dry_run,
        (&p, "run.rerun", &resource, &project),
    )
    .await
}

/// What the operator found at the target for an UNKNOWN run.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SettleBody {
    /// `succeeded` (it ran), `failed` (it failed, or must not run), `retry` (it
    /// never ran: send it again).
    outcome: String,
    /// What the operator checked; required, it is the run's reason and audited.
    reason: String,
}

/// Settles an UNKNOWN run by hand, with the dispatcher's own compare-and-set: only
/// an UNKNOWN job moves, and the revision bump fences a reconcile that answers late.
pub(super) async fn settle(
    State(app): State<App>,
    headers: HeaderMap,
    Path(key): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Answer {
    use sluice_dispatcher::operator::{self, Settle, SettleError};
    let p = app.principal(&headers).await?;
    let dry_run = Params::new(q, &["dry_run"])?.flag("dry_run")?;
    let b: SettleBody = serde_json::from_slice(&body).map_err(|e| {
        bad(format!(
            "the body: {e} (expected {{\"outcome\": \"succeeded|failed|retry\", \"reason\": \"...\"}})"
        ))
    })?;
    let how = Settle::parse(&b.outcome).ok_or_else(|| {
        bad(format!(
            "outcome {:?}: one of succeeded, failed, retry",
            b.outcome
        ))
    })?;
    if b.reason.trim().is_empty() {
        return Err(bad("a reason is required: what was checked at the target"));
    }
    let Some(run) = db::run(&app.pool, &key).await? else {
        return Err(not_found(format!("no run {key:?}")));
    };
    let dependency = run["dependency_id"].as_str().unwrap_or_default().to_owned();
    let project = owner_of(&app.view.read(), &dependency).unwrap_or_else(|| "*".into());
    if !p.may(Role::Operator, &project) {
        return Err(forbidden(p.lacks(Role::Operator, &project)));
    }
    let status = run["status"].as_str().unwrap_or_default();
    let not_unknown = |status: &str| {
        err(
            StatusCode::CONFLICT,
            "not_unknown",
            format!("run {key} is {status}, not UNKNOWN: only an UNKNOWN run is settled by hand"),
        )
    };
    if status != "UNKNOWN" {
        return Err(not_unknown(status));
    }
    let becomes = match how {
        Settle::Succeeded => "SUCCEEDED",
        Settle::Failed => "FAILED",
        Settle::Retry => "PENDING",
    };
    if dry_run {
        return ok(json!({"dry_run": true, "trigger_key": key, "status": becomes}));
    }
    let why = format!("{} ({})", b.reason.trim(), p.name);
    let revision = match operator::settle(&app.pool, &key, how, &why).await {
        Ok(revision) => revision,
        // Settled meanwhile (a reconcile, another operator): say what it is now.
        Err(SettleError::NotUnknown { status, .. }) => return Err(not_unknown(&status)),
        Err(SettleError::NotFound(_)) => return Err(not_found(format!("no run {key:?}"))),
        Err(SettleError::Database(e)) => return Err(e.into()),
    };
    db::audit(
        &app.pool,
        db::Audit {
            principal: &p.name,
            action: "run.settle",
            resource: &format!("runs/{key}"),
            project: &project,
            before: Some(json!({"status": "UNKNOWN"})),
            after: Some(json!({"status": becomes, "reason": why})),
        },
    )
    .await?;
    ok(json!({"trigger_key": key, "status": becomes, "revision": revision}))
}

/// Who asked, the audit action, the resource and its project.
type AuditOf<'a> = (&'a Principal, &'a str, &'a str, &'a str);

/// Publishes `record` (unless a dry run) and audits it: 202, the trigger is on
/// its way and the run appears under its key.
async fn submit(app: &App, record: TriggerRecord, dry_run: bool, audit: AuditOf<'_>) -> Answer {
    if dry_run {
        return ok(json!({"dry_run": true, "trigger": record}));
    }
    app.publish_trigger(&record).await?;
    let (p, action, resource, project) = audit;
    db::audit(
        &app.pool,
        db::Audit {
            principal: &p.name,
            action,
            resource,
            project,
            before: None,
            after: serde_json::to_value(&record).ok(),
        },
    )
    .await?;
    let key = &record.trigger_key;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(json!({
            "trigger_key": key,
            "origin": record.origin.as_str(),
            "request_id": record.request_id,
            "rerun_of": record.rerun_of,
            "run": format!("/v1/runs/{key}"),
        })),
    )
        .into_response())
}

impl App {
    /// Publishes a trigger request for the dispatcher (which records each key once).
    pub(super) async fn publish_trigger(&self, record: &TriggerRecord) -> Result<(), ApiError> {
        let payload = self
            .codec
            .encode(SchemaName::TriggerRequest, &self.triggers_topic, record)
            .await
            .map_err(|e| unavailable(format!("encoding the trigger: {e}")))?;
        self.publish(&self.triggers_topic, &record.trigger_key, Some(payload))
            .await?;
        Ok(())
    }
}
