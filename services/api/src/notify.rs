//! Notification rules and what they send: the pure part of notifications (the
//! rule document, which events a rule takes, the bodies in each format). The
//! worker that finds events, routes and delivers them is [`crate::notifier`].
//!
//! ```json
//! {"name": "gmv-alerts", "project": "gmv", "dependency": "dws_gmv_daily",
//!  "on": ["run_failed", "job_unknown", "dead_letter", "freshness_breach", "backfill_finished"],
//!  "webhook": {"url": {"env": "GMV_SLACK_WEBHOOK"}, "format": "slack"},
//!  "max_attempts": 8, "retry_after_ms": 1000}
//! ```
//!
//! `dependency` narrows a project's rule to one dependency; project `"*"` takes
//! every project's events. `url` is a plain URL or, since a Slack or Teams
//! webhook URL holds its token, a reference; `token` (a reference only) is sent as
//! `Authorization: Bearer`.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sluice_kit::secret_ref::{SecretValue, Source};

/// What happened, as `notification_events.kind` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A run's job became FAILED (its attempts spent, or the target said so).
    RunFailed,
    /// A job's outcome is unknown: someone must settle it.
    JobUnknown,
    /// A record about one of the dependency's inputs was dead-lettered.
    DeadLetter,
    /// An input's newest data commit is older than the dependency's `fresh_within`.
    FreshnessBreach,
    /// Every item of a backfill reached an end (succeeded, failed or cancelled).
    BackfillFinished,
}

impl EventKind {
    pub const ALL: [EventKind; 5] = [
        EventKind::RunFailed,
        EventKind::JobUnknown,
        EventKind::DeadLetter,
        EventKind::FreshnessBreach,
        EventKind::BackfillFinished,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::RunFailed => "run_failed",
            EventKind::JobUnknown => "job_unknown",
            EventKind::DeadLetter => "dead_letter",
            EventKind::FreshnessBreach => "freshness_breach",
            EventKind::BackfillFinished => "backfill_finished",
        }
    }

    pub fn parse(s: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// The body a receiver understands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// Sluice's own JSON: every field of the event.
    #[default]
    Json,
    /// A Slack incoming webhook: `text` plus Block Kit blocks.
    Slack,
    /// A Microsoft Teams Workflows webhook: a message with an Adaptive Card.
    Teams,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Webhook {
    /// A URL, or a reference to one (`{"env": …}`, `{"file": …}`).
    pub url: SecretValue,
    #[serde(default)]
    pub format: Format,
    /// A bearer token, by reference only.
    #[serde(default)]
    pub token: Option<SecretValue>,
}

/// One notification rule, as declared.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub name: String,
    pub project: String,
    #[serde(default)]
    pub dependency: Option<String>,
    pub on: BTreeSet<EventKind>,
    pub webhook: Webhook,
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// The first wait after a failed send; each later one doubles, up to 10 minutes.
    #[serde(default = "default_retry_after_ms")]
    pub retry_after_ms: u64,
}

fn default_max_attempts() -> u32 {
    8
}

fn default_retry_after_ms() -> u64 {
    1_000
}

/// Longest wait between two sends of one notification.
const MAX_RETRY_WAIT_MS: u64 = 600_000;

impl Rule {
    /// The rule a document declares, with every problem in it (secrets are
    /// checked as references, not looked up).
    pub fn parse(document: &str) -> Result<Rule, Vec<String>> {
        let rule: Rule = serde_json::from_str(document).map_err(|e| vec![e.to_string()])?;
        let mut problems = Vec::new();
        if rule.name.is_empty() || rule.name.contains('/') || rule.name.len() > 200 {
            problems.push("name must be 1 to 200 characters without '/'".to_owned());
        }
        if rule.project.is_empty() {
            problems.push("project is empty (\"*\" is every project)".to_owned());
        }
        if rule.dependency.as_deref() == Some("") {
            problems.push("dependency is empty; leave it out for the whole project".to_owned());
        }
        if rule.on.is_empty() {
            problems.push(format!(
                "on names no event; choose from {}",
                EventKind::ALL.map(EventKind::as_str).join(", ")
            ));
        }
        if !(1..=100).contains(&rule.max_attempts) {
            problems.push("max_attempts must be 1 to 100".to_owned());
        }
        if !(1..=MAX_RETRY_WAIT_MS).contains(&rule.retry_after_ms) {
            problems.push(format!("retry_after_ms must be 1 to {MAX_RETRY_WAIT_MS}"));
        }
        match rule.url(Source::Check) {
            Ok(url) if url != "unchecked" => {
                if let Err(e) = check_url(&url) {
                    problems.push(e);
                }
            }
            Ok(_) => {}
            Err(e) => problems.push(e),
        }
        if let Some(Err(e)) = rule.token(Source::Check) {
            problems.push(e);
        }
        if problems.is_empty() {
            Ok(rule)
        } else {
            Err(problems)
        }
    }

    /// The URL to send to; a plain one is not a secret, a reference is looked up
    /// as `source` allows.
    pub fn url(&self, source: Source) -> Result<String, String> {
        match &self.webhook.url {
            SecretValue::Value(u) => Ok(u.clone()),
            r => r.reveal("webhook.url", source),
        }
    }

    pub fn token(&self, source: Source) -> Option<Result<String, String>> {
        self.webhook
            .token
            .as_ref()
            .map(|t| t.reveal("webhook.token", source))
    }

    /// Whether this rule takes an event about these dependencies (id, owning
    /// project): one of them is in its project (and is its dependency, if it names one).
    pub fn takes(&self, kind: EventKind, about: &[(String, String)]) -> bool {
        self.on.contains(&kind)
            && about.iter().any(|(dependency, project)| {
                (self.project == "*" || &self.project == project)
                    && self.dependency.as_ref().is_none_or(|d| d == dependency)
            })
    }

    /// The wait before the send after `attempts` failed ones.
    pub fn retry_wait_ms(&self, attempts: u32) -> u64 {
        let doublings = attempts.saturating_sub(1).min(30);
        self.retry_after_ms
            .saturating_mul(1u64 << doublings)
            .min(MAX_RETRY_WAIT_MS)
    }
}

fn check_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("webhook.url {url:?} is not an http:// or https:// URL"))?;
    if rest.is_empty() || rest.starts_with('/') {
        return Err(format!("webhook.url {url:?} names no host"));
    }
    Ok(())
}

/// An event as stored, with what the notifier knows of it.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub key: String,
    pub kind: EventKind,
    pub dependency_id: Option<String>,
    pub asset: Option<String>,
    pub trigger_key: Option<String>,
    pub backfill_id: Option<String>,
    pub detail: Value,
    /// When it happened (RFC 3339).
    pub at: String,
}

impl Event {
    /// One line a person reads first.
    pub fn summary(&self) -> String {
        let d = &self.detail;
        let text = |k: &str| d.get(k).and_then(Value::as_str).unwrap_or("?").to_owned();
        let int = |k: &str| d.get(k).and_then(Value::as_i64).unwrap_or(0);
        let dep = self.dependency_id.as_deref().unwrap_or("?");
        let key = self.trigger_key.as_deref().unwrap_or("?");
        match self.kind {
            EventKind::RunFailed => format!(
                "Run {key} of {dep} FAILED on {} after {} attempt(s): {}",
                text("target"),
                int("attempt"),
                text("reason")
            ),
            EventKind::JobUnknown => format!(
                "Run {key} of {dep} is UNKNOWN on {}: {}. Settle it: sluice settle {key}",
                text("target"),
                text("reason")
            ),
            EventKind::DeadLetter => format!(
                "A record for {} was dead-lettered from {}[{}]@{}: {}",
                self.asset.as_deref().unwrap_or("?"),
                text("topic"),
                int("partition"),
                int("offset"),
                text("error")
            ),
            EventKind::FreshnessBreach => format!(
                "{} is stale for {dep}: its newest data commit is {} s old, past fresh_within {} s",
                self.asset.as_deref().unwrap_or("?"),
                int("age_ms") / 1000,
                int("max_age_ms") / 1000
            ),
            EventKind::BackfillFinished => format!(
                "Backfill {} of {dep} finished: {} succeeded, {} failed, {} cancelled of {}",
                self.backfill_id.as_deref().unwrap_or("?"),
                int("succeeded"),
                int("failed"),
                int("cancelled"),
                int("items_total")
            ),
        }
    }

    fn title(&self) -> &'static str {
        match self.kind {
            EventKind::RunFailed => "Sluice: a run failed",
            EventKind::JobUnknown => "Sluice: a run's outcome is unknown",
            EventKind::DeadLetter => "Sluice: a record was dead-lettered",
            EventKind::FreshnessBreach => "Sluice: an input is stale",
            EventKind::BackfillFinished => "Sluice: a backfill finished",
        }
    }

    /// The facts every format shows.
    fn facts(&self) -> Vec<(&'static str, String)> {
        [
            ("Event", Some(self.kind.as_str().to_owned())),
            ("Dependency", self.dependency_id.clone()),
            ("Asset", self.asset.clone()),
            ("Trigger key", self.trigger_key.clone()),
            ("Backfill", self.backfill_id.clone()),
            ("At", Some(self.at.clone())),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect()
    }

    /// The body of the notification `delivery_key` in `format`.
    pub fn body(&self, format: Format, rule: &str, delivery_key: &str) -> Value {
        let summary = self.summary();
        match format {
            Format::Json => json!({
                "key": delivery_key,
                "rule": rule,
                "event": self.kind.as_str(),
                "event_key": self.key,
                "summary": summary,
                "dependency": self.dependency_id,
                "asset": self.asset,
                "trigger_key": self.trigger_key,
                "backfill_id": self.backfill_id,
                "detail": self.detail,
                "at": self.at,
            }),
            Format::Slack => {
                let fields: Vec<Value> = self
                    .facts()
                    .into_iter()
                    .map(|(k, v)| json!({"type": "mrkdwn", "text": format!("*{k}*\n{v}")}))
                    .collect();
                json!({
                    "text": summary,
                    "blocks": [
                        {"type": "header", "text": {"type": "plain_text", "text": self.title()}},
                        {"type": "section", "text": {"type": "mrkdwn", "text": summary}},
                        {"type": "section", "fields": fields},
                        {"type": "context", "elements": [
                            {"type": "mrkdwn", "text": format!("rule `{rule}` · key `{delivery_key}`")}
                        ]}
                    ]
                })
            }
            Format::Teams => {
                let facts: Vec<Value> = self
                    .facts()
                    .into_iter()
                    .map(|(k, v)| json!({"title": k, "value": v}))
                    .collect();
                json!({
                    "type": "message",
                    "attachments": [{
                        "contentType": "application/vnd.microsoft.card.adaptive",
                        "contentUrl": null,
                        "content": {
                            "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
                            "type": "AdaptiveCard",
                            "version": "1.4",
                            "body": [
                                {"type": "TextBlock", "text": self.title(), "weight": "Bolder",
                                 "size": "Medium", "wrap": true},
                                {"type": "TextBlock", "text": summary, "wrap": true},
                                {"type": "FactSet", "facts": facts},
                                {"type": "TextBlock", "text": format!("rule {rule} · key {delivery_key}"),
                                 "isSubtle": true, "size": "Small", "wrap": true}
                            ]
                        }
                    }]
                })
            }
        }
    }
}

/// The delivery's key: the event's and the rule's, so each rule sends each event once.
pub fn delivery_key(event_key: &str, rule: &str) -> String {
    format!("{event_key}@{rule}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(extra: &str) -> Result<Rule, Vec<String>> {
        Rule::parse(&format!(
            r#"{{"name": "r", "project": "gmv", "on": ["run_failed", "dead_letter"],
                "webhook": {{"url": "http://hooks.local/x"}}{extra}}}"#
        ))
    }

    fn about(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(d, p)| (d.to_string(), p.to_string()))
            .collect()
    }

    #[test]
    fn a_rule_takes_its_events_of_its_project_and_dependency() {
        let r = rule("").expect("valid");
        assert!(r.takes(EventKind::RunFailed, &about(&[("a", "gmv")])));
        assert!(!r.takes(EventKind::RunFailed, &about(&[("a", "ads")])));
        assert!(!r.takes(EventKind::JobUnknown, &about(&[("a", "gmv")])));
        assert!(!r.takes(EventKind::RunFailed, &[]), "about nothing known");
        // a dead letter is about every dependency reading the asset
        assert!(r.takes(EventKind::DeadLetter, &about(&[("x", "ads"), ("a", "gmv")])));
        let one = rule(r#", "dependency": "a""#).expect("valid");
        assert!(one.takes(EventKind::RunFailed, &about(&[("a", "gmv")])));
        assert!(!one.takes(EventKind::RunFailed, &about(&[("b", "gmv")])));
        let every = Rule::parse(
            r#"{"name": "all", "project": "*", "on": ["job_unknown"],
                "webhook": {"url": {"env": "HOOK"}, "format": "teams"}}"#,
        )
        .expect("valid");
        assert!(every.takes(EventKind::JobUnknown, &about(&[("z", "ads")])));
    }

    #[test]
    fn a_bad_rule_is_refused_with_every_problem() {
        let e = Rule::parse(
            r#"{"name": "a/b", "project": "", "on": [], "max_attempts": 0,
                "webhook": {"url": "ftp://x", "token": "plain"}}"#,
        )
        .expect_err("refused");
        let all = e.join("; ");
        for needle in [
            "without '/'",
            "project is empty",
            "on names no event",
            "max_attempts",
            "not an http",
            "holds references, never secrets",
        ] {
            assert!(all.contains(needle), "{needle} missing from {all}");
        }
        let e = Rule::parse(
            r#"{"name": "r", "project": "p", "on": ["cpu_hot"], "webhook": {"url": "http://h/"}}"#,
        )
        .expect_err("unknown event");
        assert!(e[0].contains("cpu_hot"), "{e:?}");
        let e = rule(r#", "color": "red""#).expect_err("unknown field");
        assert!(e[0].contains("color"), "{e:?}");
    }

    #[test]
    fn retries_double_up_to_ten_minutes() {
        let r = rule("").expect("valid");
        assert_eq!(r.retry_wait_ms(1), 1_000);
        assert_eq!(r.retry_wait_ms(2), 2_000);
        assert_eq!(r.retry_wait_ms(4), 8_000);
        assert_eq!(r.retry_wait_ms(40), MAX_RETRY_WAIT_MS);
    }

    #[test]
    fn each_format_carries_the_summary_and_the_key() {
        let e = Event {
            key: "run_failed:k1:3".into(),
            kind: EventKind::RunFailed,
            dependency_id: Some("dws".into()),
            asset: None,
            trigger_key: Some("k1".into()),
            backfill_id: None,
            detail: json!({"target": "airflow/gmv", "attempt": 3, "reason": "HTTP 500"}),
            at: "2026-12-06T00:00:00Z".into(),
        };
        let s = e.summary();
        assert_eq!(
            s,
            "Run k1 of dws FAILED on airflow/gmv after 3 attempt(s): HTTP 500"
        );
        let j = e.body(Format::Json, "r", "run_failed:k1:3@r");
        assert_eq!(j["key"], "run_failed:k1:3@r");
        assert_eq!(j["detail"]["reason"], "HTTP 500");
        let slack = e.body(Format::Slack, "r", "d");
        assert_eq!(slack["text"], s.as_str());
        assert_eq!(slack["blocks"][0]["type"], "header");
        let teams = e.body(Format::Teams, "r", "d");
        let card = &teams["attachments"][0];
        assert_eq!(
            card["contentType"],
            "application/vnd.microsoft.card.adaptive"
        );
        assert_eq!(card["content"]["type"], "AdaptiveCard");
        assert_eq!(card["content"]["body"][1]["text"], s.as_str());
    }
}
