//! Target configuration: which systems the dispatcher may call, how, and within
//! which limits. Read from JSON (`SLUICE_TARGETS` inline or `SLUICE_TARGETS_FILE`);
//! every mistake is reported with the target it belongs to.
//!
//! ```json
//! [{"kind": "webhook", "name": "hook-1", "url": "http://host/hook", "secret": "s3cret",
//!   "idempotent": true, "max_in_flight": 4, "max_per_round": 100, "max_attempts": 3},
//!  {"kind": "airflow", "name": "*", "url": "http://airflow:8080", "api_version": 2,
//!   "username": "admin", "password": "…"}]
//! ```
//!
//! A target named `*` serves every trigger of its kind whose name has no entry
//! of its own.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::lifecycle::RetryPolicy;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Airflow,
    Dolphinscheduler,
    Webhook,
    Command,
    Kafka,
}

impl Kind {
    /// The name used in `trigger_history.target_kind` (the Avro enum symbol).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Airflow => "AIRFLOW",
            Kind::Dolphinscheduler => "DOLPHINSCHEDULER",
            Kind::Webhook => "WEBHOOK",
            Kind::Command => "COMMAND",
            Kind::Kafka => "KAFKA",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Some(match s {
            "AIRFLOW" => Kind::Airflow,
            "DOLPHINSCHEDULER" => Kind::Dolphinscheduler,
            "WEBHOOK" => Kind::Webhook,
            "COMMAND" => Kind::Command,
            "KAFKA" => Kind::Kafka,
            _ => return None,
        })
    }
}

/// One target entry as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    kind: Kind,
    name: String,
    // Limits and policy.
    max_in_flight: Option<u32>,
    max_per_round: Option<u32>,
    max_attempts: Option<u32>,
    backoff_ms: Option<u64>,
    max_backoff_ms: Option<u64>,
    /// How long one send may take before its outcome is unknown.
    send_timeout_ms: Option<u64>,
    /// RUNNING without an answer for this long → the sweep makes it UNKNOWN.
    deadline_ms: Option<u64>,
    /// An accepted external run may take this long before the sweep gives up on it.
    run_timeout_ms: Option<u64>,
    // Adapter settings (which apply depends on the kind).
    url: Option<String>,
    secret: Option<String>,
    #[serde(default)]
    idempotent: bool,
    api_version: Option<u8>,
    username: Option<String>,
    password: Option<String>,
    token: Option<String>,
    project_code: Option<String>,
    argv: Option<Vec<String>>,
    topic: Option<String>,
}

#[derive(Clone, Debug)]
pub struct Limits {
    pub max_in_flight: u32,
    pub max_per_round: u32,
}

#[derive(Clone, Debug)]
pub struct Timing {
    pub send_timeout: Duration,
    pub deadline: Duration,
    pub run_timeout: Duration,
}

/// How the adapter of a target reaches it.
#[derive(Clone, Debug)]
pub enum Reach {
    Airflow {
        url: String,
        api_version: u8,
        username: String,
        password: String,
    },
    Dolphinscheduler {
        url: String,
        token: String,
        project_code: String,
    },
    Webhook {
        url: String,
        secret: Option<String>,
        idempotent: bool,
    },
    Command {
        argv: Vec<String>,
    },
    Kafka {
        topic: String,
    },
}

#[derive(Clone, Debug)]
pub struct Target {
    pub kind: Kind,
    pub name: String,
    pub limits: Limits,
    pub policy: RetryPolicy,
    pub timing: Timing,
    pub reach: Reach,
}

/// Every configured target, looked up by (kind, name) with the `*` fallback.
#[derive(Clone, Debug, Default)]
pub struct Targets {
    by_name: BTreeMap<(Kind, String), Target>,
}

impl Targets {
    pub fn parse(json: &str) -> Result<Targets, Vec<String>> {
        let raw: Vec<RawTarget> =
            serde_json::from_str(json).map_err(|e| vec![format!("targets: {e}")])?;
        let mut problems = Vec::new();
        let mut by_name = BTreeMap::new();
        for r in raw {
            let at = format!("target {}/{}", r.kind.as_str().to_lowercase(), r.name);
            match build(r) {
                Ok(t) => {
                    if by_name.insert((t.kind, t.name.clone()), t).is_some() {
                        problems.push(format!("{at}: listed twice"));
                    }
                }
                Err(e) => problems.extend(e.into_iter().map(|e| format!("{at}: {e}"))),
            }
        }
        if problems.is_empty() {
            Ok(Targets { by_name })
        } else {
            Err(problems)
        }
    }

    pub fn get(&self, kind: Kind, name: &str) -> Option<&Target> {
        self.by_name
            .get(&(kind, name.to_owned()))
            .or_else(|| self.by_name.get(&(kind, "*".to_owned())))
    }

    pub fn all(&self) -> impl Iterator<Item = &Target> {
        self.by_name.values()
    }
}

fn build(r: RawTarget) -> Result<Target, Vec<String>> {
    let mut problems = Vec::new();
    if r.name.is_empty() {
        problems.push("name is empty".to_owned());
    }
    let mut need = |field: &str, v: &Option<String>| -> String {
        match v {
            Some(s) if !s.is_empty() => s.clone(),
            _ => {
                problems.push(format!("`{field}` is required for this kind"));
                String::new()
            }
        }
    };
    let reach = match r.kind {
        Kind::Airflow => Reach::Airflow {
            url: need("url", &r.url),
            api_version: r.api_version.unwrap_or(2),
            username: need("username", &r.username),
            password: need("password", &r.password),
        },
        Kind::Dolphinscheduler => Reach::Dolphinscheduler {
            url: need("url", &r.url),
            token: need("token", &r.token),
            project_code: need("project_code", &r.project_code),
        },
        Kind::Webhook => Reach::Webhook {
            url: need("url", &r.url),
            secret: r.secret.clone(),
            idempotent: r.idempotent,
        },
        Kind::Command => Reach::Command {
            argv: r.argv.clone().unwrap_or_default(),
        },
        Kind::Kafka => Reach::Kafka {
            topic: need("topic", &r.topic),
        },
    };
    if let Reach::Airflow { api_version, .. } = &reach
        && !matches!(api_version, 1 | 2)
    {
        problems.push(format!(
            "api_version {api_version}: Airflow has /api/v1 (2.x) and /api/v2 (3.x)"
        ));
    }
    if let Reach::Command { argv } = &reach
        && argv.is_empty()
    {
        problems.push("`argv` is required for a command and must not be empty".into());
    }
    for (field, url) in [("url", &r.url)] {
        if let Some(u) = url
            && !(u.starts_with("http://") || u.starts_with("https://"))
        {
            problems.push(format!("{field} {u:?} must start with http:// or https://"));
        }
    }
    let positive = |field: &str, v: Option<u32>, default: u32, problems: &mut Vec<String>| {
        let v = v.unwrap_or(default);
        if v == 0 {
            problems.push(format!("`{field}` must be at least 1"));
        }
        v
    };
    let limits = Limits {
        max_in_flight: positive("max_in_flight", r.max_in_flight, 16, &mut problems),
        max_per_round: positive("max_per_round", r.max_per_round, 256, &mut problems),
    };
    let policy = RetryPolicy {
        max_attempts: positive("max_attempts", r.max_attempts, 3, &mut problems),
        backoff: Duration::from_millis(r.backoff_ms.unwrap_or(1_000)),
        max_backoff: Duration::from_millis(r.max_backoff_ms.unwrap_or(300_000)),
    };
    let ms = |field: &str, v: Option<u64>, default: u64, problems: &mut Vec<String>| {
        let v = v.unwrap_or(default);
        if v == 0 {
            problems.push(format!("`{field}` must be positive"));
        }
        Duration::from_millis(v)
    };
    let timing = Timing {
        send_timeout: ms("send_timeout_ms", r.send_timeout_ms, 10_000, &mut problems),
        deadline: ms("deadline_ms", r.deadline_ms, 60_000, &mut problems),
        run_timeout: ms(
            "run_timeout_ms",
            r.run_timeout_ms,
            86_400_000,
            &mut problems,
        ),
    };
    if timing.deadline <= timing.send_timeout {
        problems.push(
            "`deadline_ms` must exceed `send_timeout_ms` (a send still under way must not be swept)"
                .into(),
        );
    }
    if problems.is_empty() {
        Ok(Target {
            kind: r.kind,
            name: r.name,
            limits,
            policy,
            timing,
            reach,
        })
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_set_parses_and_the_star_entry_is_the_fallback() {
        let t = Targets::parse(
            r#"[{"kind": "webhook", "name": "a", "url": "http://x/a", "max_in_flight": 2},
                {"kind": "webhook", "name": "*", "url": "http://x/any"}]"#,
        )
        .expect("valid");
        assert_eq!(
            t.get(Kind::Webhook, "a").map(|t| t.limits.max_in_flight),
            Some(2)
        );
        assert_eq!(
            t.get(Kind::Webhook, "b").map(|t| t.name.as_str()),
            Some("*")
        );
        assert!(t.get(Kind::Airflow, "a").is_none());
    }

    #[test]
    fn every_mistake_is_named_with_its_target() {
        let e = Targets::parse(
            r#"[{"kind": "airflow", "name": "af", "url": "ftp://x", "api_version": 3},
                {"kind": "command", "name": "c", "max_attempts": 0},
                {"kind": "webhook", "name": "w", "url": "http://x", "deadline_ms": 5, "send_timeout_ms": 10}]"#,
        )
        .expect_err("invalid");
        let all = e.join("\n");
        for want in [
            "target airflow/af: `username` is required",
            "target airflow/af: api_version 3",
            "target airflow/af: url \"ftp://x\" must start with http:// or https://",
            "target command/c: `argv` is required",
            "target command/c: `max_attempts` must be at least 1",
            "target webhook/w: `deadline_ms` must exceed",
        ] {
            assert!(all.contains(want), "{want:?} missing in:\n{all}");
        }
    }

    #[test]
    fn unknown_fields_and_kinds_are_refused() {
        let e = Targets::parse(
            r#"[{"kind": "webhook", "name": "w", "url": "http://x", "retries": 3}]"#,
        )
        .expect_err("unknown field");
        assert!(e[0].contains("unknown field `retries`"), "{e:?}");
        let e = Targets::parse(r#"[{"kind": "cron", "name": "w"}]"#).expect_err("unknown kind");
        assert!(e[0].contains("unknown variant `cron`"), "{e:?}");
    }

    #[test]
    fn a_target_listed_twice_is_refused() {
        let e = Targets::parse(
            r#"[{"kind": "kafka", "name": "k", "topic": "t"}, {"kind": "kafka", "name": "k", "topic": "u"}]"#,
        )
        .expect_err("twice");
        assert_eq!(e, vec!["target kafka/k: listed twice".to_owned()]);
    }
}
