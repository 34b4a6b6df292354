//! The notifier: finds what rules alert on, routes each event to the rules that
//! take it, and delivers the notifications with retries. It runs in every API
//! instance; PostgreSQL makes them one: an event is written once by its key
//! (`ON CONFLICT DO NOTHING`), routed and sent under `FOR UPDATE SKIP LOCKED`
//! claims, so N instances share the work and never send one notification twice
//! at once.
//!
//! Where events come from:
//! * a job that becomes FAILED or UNKNOWN — the transition trigger writes the event
//!   in the transition's own transaction (migration 0007);
//! * a backfill whose items all ended — a sweep here;
//! * a dead letter — this service's consumer group on the dead-letter topic, whose
//!   offsets advance only after the event is written;
//! * a freshness breach — the dependencies' `fresh_within` bounds checked here
//!   against asset-state, once per stale commit.
//!
//! A notification goes out until the receiver answers 2xx, at most the rule's
//! `max_attempts` times with doubling waits; a 4xx other than 408 / 429 will not
//! change on a retry and ends it at once. An ended one that was not taken is DEAD,
//! kept with its last error (`GET /v1/notification-deliveries?status=DEAD`).
//! Every send carries `Idempotency-Key: <delivery key>`: a send interrupted by a
//! crash is sent again with the same key.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};
use serde_json::{Value, json};
use sluice_core::condition::stale_commit;
use sluice_core::packed::PackedState;
use sluice_kit::Shutdown;
use sluice_kit::clock::now_ms;
use sluice_kit::declared::SharedDeclared;
use sluice_kit::dlq;
use sluice_kit::secret_ref::Source;
use sqlx::{PgPool, Row};

use crate::notify::{Event, EventKind, Rule, delivery_key};
use crate::view::View;

/// How long a claimed send is the claimer's before another instance may retry it.
const SEND_LEASE_SECS: i64 = 60;
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
const BATCH: i64 = 100;

pub struct Notifier {
    pub pool: PgPool,
    pub view: Arc<View>,
    pub rules: Arc<SharedDeclared>,
    pub http: reqwest::Client,
    /// How often it looks for events and due sends.
    pub interval: Duration,
    /// Dead letters older than this when first read are not notified (a new
    /// deployment does not page about last month's).
    pub dead_letter_max_age: Duration,
}

/// The rules that parse; a broken record is the API's to show, not to apply.
fn rules(shared: &SharedDeclared) -> BTreeMap<String, Rule> {
    shared
        .snapshot()
        .into_iter()
        .filter_map(|(name, doc)| Some((name, Rule::parse(&doc.ok()?).ok()?)))
        .collect()
}

impl Notifier {
    /// Runs until `shutdown`; a failing round is logged and retried next interval.
    pub async fn run(&self, shutdown: Shutdown) {
        let mut last_breach: HashMap<(String, String), String> = HashMap::new();
        while !shutdown.is_stopping() {
            if self.rules.caught_up()
                && self.view.ready()
                && let Err(e) = self.round(&mut last_breach).await
            {
                tracing::warn!(error = %e, "notification round failed; retrying");
            }
            tokio::select! {
                _ = tokio::time::sleep(self.interval) => {}
                _ = shutdown.clone().wait_stopped() => {}
            }
        }
    }

    async fn round(
        &self,
        last_breach: &mut HashMap<(String, String), String>,
    ) -> Result<(), sqlx::Error> {
        let rules = rules(&self.rules);
        if rules
            .values()
            .any(|r| r.on.contains(&EventKind::FreshnessBreach))
        {
            self.find_freshness_breaches(last_breach).await?;
        }
        self.find_finished_backfills().await?;
        while self.route(&rules).await? == BATCH as usize {}
        while self.deliver(&rules).await? == BATCH as usize {}
        Ok(())
    }

    /// One event per stale commit of an input under a `fresh_within`.
    async fn find_freshness_breaches(
        &self,
        last: &mut HashMap<(String, String), String>,
    ) -> Result<(), sqlx::Error> {
        let now = now_ms();
        let breaches: Vec<(String, String, String, Value)> = {
            let mut t = self.view.write();
            let specs = t.accepted();
            let mut out = Vec::new();
            for spec in &specs {
                for (input, bound) in spec.condition.freshness_bounds() {
                    let Some((state, _)) = t.assets.get(input).map(PackedState::unpack) else {
                        continue;
                    };
                    if let Some(c) = stale_commit(&state, bound, now) {
                        let key = format!("freshness_breach:{}:{}:{}", spec.id, input, c.sequence);
                        let detail = json!({"max_age_ms": bound, "age_ms": now - c.commit_time_ms,
                                            "commit_time_ms": c.commit_time_ms,
                                            "snapshot_id": c.snapshot_id, "sequence": c.sequence});
                        out.push((spec.id.clone(), input.to_string(), key, detail));
                    }
                }
            }
            out
        };
        for (dependency, input, key, detail) in breaches {
            let seen = (dependency.clone(), input.clone());
            if last.get(&seen) == Some(&key) {
                continue;
            }
            sqlx::query(
                "INSERT INTO notification_events (event_key, kind, dependency_id, asset_key, detail)
                 VALUES ($1, 'freshness_breach', $2, $3, $4::jsonb) ON CONFLICT (event_key) DO NOTHING",
            )
            .bind(&key)
            .bind(&dependency)
            .bind(&input)
            .bind(detail.to_string())
            .execute(&self.pool)
            .await?;
            last.insert(seen, key);
        }
        Ok(())
    }

    /// A backfill whose every item was recorded and ended (none PENDING, RUNNING
    /// or UNKNOWN) is an event, once.
    async fn find_finished_backfills(&self) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO notification_events (event_key, kind, dependency_id, backfill_id, detail)
             SELECT 'backfill_finished:' || b.backfill_id, 'backfill_finished', b.dependency_id,
                    b.backfill_id,
                    jsonb_build_object(
                        'items_total', b.items_total,
                        'succeeded', count(*) FILTER (WHERE j.status = 'SUCCEEDED'),
                        'failed', count(*) FILTER (WHERE j.status = 'FAILED'),
                        'cancelled', count(*) FILTER (WHERE j.status = 'CANCELLED'),
                        'requested_by', b.requested_by)
             FROM backfills b JOIN jobs j ON j.backfill_id = b.backfill_id
             WHERE NOT EXISTS (SELECT 1 FROM notification_events e
                               WHERE e.event_key = 'backfill_finished:' || b.backfill_id)
             GROUP BY b.backfill_id
             HAVING count(*) = b.items_total
                AND count(*) FILTER (WHERE j.status IN ('PENDING', 'RUNNING', 'UNKNOWN')) = 0
             ON CONFLICT (event_key) DO NOTHING",
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The dependencies an event is about, with their projects: its own, or for a
    /// dead letter every dependency reading the asset.
    fn about(&self, e: &Event) -> Vec<(String, String)> {
        let t = self.view.read();
        let project = |id: &str| {
            t.specs
                .get(id)
                .and_then(|s| s.spec.as_ref().ok())
                .map(|s| (id.to_owned(), s.owner_project.clone()))
        };
        match (&e.dependency_id, &e.asset) {
            (Some(d), _) => project(d).into_iter().collect(),
            (None, Some(asset)) => t
                .specs
                .iter()
                .filter_map(|(id, s)| {
                    let s = s.spec.as_ref().ok()?;
                    s.condition
                        .inputs()
                        .iter()
                        .any(|i| i.as_str() == asset)
                        .then(|| (id.clone(), s.owner_project.clone()))
                })
                .collect(),
            (None, None) => Vec::new(),
        }
    }

    /// Matches a batch of new events to the rules: one delivery per event and rule.
    async fn route(&self, rules: &BTreeMap<String, Rule>) -> Result<usize, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let rows = sqlx::query(
            "SELECT event_key, kind, dependency_id, asset_key, trigger_key, backfill_id, detail::text AS detail,
                    to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') AS at
             FROM notification_events WHERE routed_at IS NULL
             ORDER BY at LIMIT $1 FOR UPDATE SKIP LOCKED",
        )
        .bind(BATCH)
        .fetch_all(&mut *tx)
        .await?;
        let n = rows.len();
        for row in rows {
            let e = event(&row)?;
            let about = self.about(&e);
            for (name, rule) in rules {
                if rule.takes(e.kind, &about) {
                    sqlx::query(
                        "INSERT INTO notification_deliveries (delivery_key, event_key, rule)
                         VALUES ($1, $2, $3) ON CONFLICT (delivery_key) DO NOTHING",
                    )
                    .bind(delivery_key(&e.key, name))
                    .bind(&e.key)
                    .bind(name)
                    .execute(&mut *tx)
                    .await?;
                }
            }
            sqlx::query(
                "UPDATE notification_events SET routed_at = clock_timestamp() WHERE event_key = $1",
            )
            .bind(&e.key)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(n)
    }

    /// Claims the due sends (a lease, so a crash mid-send is retried after it),
    /// sends them at once, and records each outcome.
    async fn deliver(&self, rules: &BTreeMap<String, Rule>) -> Result<usize, sqlx::Error> {
        let rows = sqlx::query(
            "WITH claimed AS (
                 UPDATE notification_deliveries d
                 SET attempts = d.attempts + 1,
                     next_attempt_at = clock_timestamp() + make_interval(secs => $2)
                 WHERE d.delivery_key IN (
                     SELECT delivery_key FROM notification_deliveries
                     WHERE status = 'PENDING' AND next_attempt_at <= clock_timestamp()
                     ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED)
                 RETURNING d.delivery_key, d.event_key, d.rule, d.attempts)
             SELECT c.delivery_key, c.rule, c.attempts, e.event_key, e.kind, e.dependency_id,
                    e.asset_key, e.trigger_key, e.backfill_id, e.detail::text AS detail,
                    to_char(e.at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') AS at
             FROM claimed c JOIN notification_events e ON e.event_key = c.event_key",
        )
        .bind(BATCH)
        .bind(SEND_LEASE_SECS as f64)
        .fetch_all(&self.pool)
        .await?;
        let n = rows.len();
        let mut sends = Vec::with_capacity(n);
        for row in &rows {
            let key: String = row.try_get("delivery_key")?;
            let rule_name: String = row.try_get("rule")?;
            let attempts: i32 = row.try_get("attempts")?;
            let e = event(row)?;
            let rule = rules.get(&rule_name);
            sends.push(async move {
                let outcome = match rule {
                    None => Outcome::Final(format!("rule {rule_name:?} was deleted")),
                    Some(r) => self.send(r, &rule_name, &key, &e).await,
                };
                (key, rule, attempts, outcome)
            });
        }
        for (key, rule, attempts, outcome) in futures::future::join_all(sends).await {
            self.record(&key, rule, attempts, outcome).await?;
        }
        Ok(n)
    }

    async fn send(&self, rule: &Rule, name: &str, key: &str, e: &Event) -> Outcome {
        let url = match rule.url(Source::Declared) {
            Ok(u) => u,
            Err(e) => return Outcome::Retry(e),
        };
        let mut request = self
            .http
            .post(&url)
            .timeout(SEND_TIMEOUT)
            .header("Idempotency-Key", key)
            .header("X-Sluice-Event", e.kind.as_str())
            .json(&e.body(rule.webhook.format, name, key));
        match rule.token(Source::Declared) {
            Some(Ok(token)) => request = request.bearer_auth(token),
            Some(Err(e)) => return Outcome::Retry(e),
            None => {}
        }
        match request.send().await {
            Ok(r) if r.status().is_success() => Outcome::Delivered,
            Ok(r) => {
                let status = r.status();
                let text: String = r
                    .text()
                    .await
                    .unwrap_or_default()
                    .chars()
                    .take(300)
                    .collect();
                let why = format!("{url} answered {status}: {text}");
                if status.is_client_error() && status.as_u16() != 408 && status.as_u16() != 429 {
                    Outcome::Final(why)
                } else {
                    Outcome::Retry(why)
                }
            }
            Err(err) => Outcome::Retry(format!("{url}: {err}")),
        }
    }

    /// Records a send's outcome, if the claim is still this one (`attempts`).
    async fn record(
        &self,
        key: &str,
        rule: Option<&Rule>,
        attempts: i32,
        outcome: Outcome,
    ) -> Result<(), sqlx::Error> {
        let (sql, why, wait_secs) = match outcome {
            Outcome::Delivered => (
                "UPDATE notification_deliveries SET status = 'DELIVERED', last_error = NULL,
                        finished_at = clock_timestamp()
                 WHERE delivery_key = $1 AND attempts = $2 AND status = 'PENDING'",
                None,
                None,
            ),
            Outcome::Retry(why) if rule.is_some_and(|r| attempts < r.max_attempts as i32) => {
                let wait = rule.map_or(0, |r| r.retry_wait_ms(attempts as u32));
                tracing::info!(key, attempts, error = %why, "notification not taken; retrying");
                (
                    "UPDATE notification_deliveries SET last_error = $3,
                            next_attempt_at = clock_timestamp() + make_interval(secs => $4)
                     WHERE delivery_key = $1 AND attempts = $2 AND status = 'PENDING'",
                    Some(why),
                    Some(wait as f64 / 1000.0),
                )
            }
            Outcome::Retry(why) | Outcome::Final(why) => {
                tracing::warn!(key, attempts, error = %why, "notification dead");
                (
                    "UPDATE notification_deliveries SET status = 'DEAD', last_error = $3,
                            finished_at = clock_timestamp()
                     WHERE delivery_key = $1 AND attempts = $2 AND status = 'PENDING'",
                    Some(why),
                    None,
                )
            }
        };
        // $1 and $2 name the claim; $3 and $4 are the statement's own.
        let mut q = sqlx::query(sql).bind(key).bind(attempts);
        if let Some(why) = why {
            q = q.bind(why);
        }
        if let Some(secs) = wait_secs {
            q = q.bind(secs);
        }
        q.execute(&self.pool).await?;
        Ok(())
    }

    /// Follows the dead-letter topic in this service's consumer group until
    /// `shutdown`: each record an event, its offset committed once written.
    pub async fn follow_dead_letters(
        &self,
        config: ClientConfig,
        topic: String,
        shutdown: Shutdown,
    ) -> Result<(), String> {
        let consumer: StreamConsumer = config.create().map_err(|e| e.to_string())?;
        consumer.subscribe(&[&topic]).map_err(|e| e.to_string())?;
        loop {
            let msg = tokio::select! {
                m = consumer.recv() => m,
                _ = shutdown.clone().wait_stopped() => return Ok(()),
            };
            let msg = match msg {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "reading dead letters; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            let age_ms = msg
                .timestamp()
                .to_millis()
                .map_or(0, |t| now_ms().saturating_sub(t));
            if age_ms <= self.dead_letter_max_age.as_millis() as i64 {
                let header = |name: &str| {
                    msg.headers()
                        .and_then(|h| h.iter().find(|x| x.key == name))
                        .and_then(|x| x.value)
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                };
                let asset = msg.key().map(|k| String::from_utf8_lossy(k).into_owned());
                let detail = json!({
                    "topic": header(dlq::HEADER_TOPIC),
                    "partition": header(dlq::HEADER_PARTITION).and_then(|p| p.parse::<i64>().ok()),
                    "offset": header(dlq::HEADER_OFFSET).and_then(|o| o.parse::<i64>().ok()),
                    "error": header(dlq::HEADER_ERROR),
                });
                let key = format!("dead_letter:{}:{}", msg.partition(), msg.offset());
                let mut backoff = sluice_kit::backoff::Backoff::new(
                    Duration::from_millis(200),
                    Duration::from_secs(10),
                );
                loop {
                    let written = sqlx::query(
                        "INSERT INTO notification_events (event_key, kind, asset_key, detail)
                         VALUES ($1, 'dead_letter', $2, $3::jsonb) ON CONFLICT (event_key) DO NOTHING",
                    )
                    .bind(&key)
                    .bind(&asset)
                    .bind(detail.to_string())
                    .execute(&self.pool)
                    .await;
                    match written {
                        Ok(_) => break,
                        Err(e) if !shutdown.is_stopping() => {
                            tracing::warn!(error = %e, "recording a dead letter; retrying");
                            tokio::time::sleep(backoff.next_wait()).await;
                        }
                        // Not committed: the next incarnation reads it again.
                        Err(_) => return Ok(()),
                    }
                }
            }
            if let Err(e) = consumer.commit_message(&msg, CommitMode::Async) {
                tracing::warn!(error = %e, "committing a dead letter's offset");
            }
        }
    }
}

enum Outcome {
    Delivered,
    /// Not taken; worth another try.
    Retry(String),
    /// Not taken, and another try would not change that.
    Final(String),
}

fn event(row: &sqlx::postgres::PgRow) -> Result<Event, sqlx::Error> {
    let kind: String = row.try_get("kind")?;
    Ok(Event {
        key: row.try_get("event_key")?,
        kind: EventKind::parse(&kind)
            .ok_or_else(|| sqlx::Error::Decode(format!("unknown event kind {kind:?}").into()))?,
        dependency_id: row.try_get("dependency_id")?,
        asset: row.try_get("asset_key")?,
        trigger_key: row.try_get("trigger_key")?,
        backfill_id: row.try_get("backfill_id")?,
        detail: serde_json::from_str(row.try_get::<&str, _>("detail")?)
            .map_err(|e| sqlx::Error::Decode(e.into()))?,
        at: row.try_get("at")?,
    })
}
