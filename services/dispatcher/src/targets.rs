//! Target configuration: which systems the dispatcher may call, how, and within
//! which limits. Two sources: the bootstrap JSON (`SLUICE_TARGETS` inline or
//! `SLUICE_TARGETS_FILE`), read at start, and the targets topic, where the API
//! publishes targets declared live ([`LiveTargets`]; a declared target replaces a
//! bootstrap one of the same kind and name). Every mistake is reported with the
//! target it belongs to.
//!
//! ```json
//! [{"kind": "webhook", "name": "hook-1", "url": "http://host/hook", "secret": "s3cret",
//!   "idempotent": true, "max_in_flight": 4, "max_per_round": 100, "max_attempts": 3},
//!  {"kind": "airflow", "name": "*", "url": "http://airflow:8080", "api_version": 2,
//!   "username": "admin", "password": "…"}]
//! ```
//!
//! A target named `*` serves every trigger of its kind whose name has no entry
//! of its own. A secret (`secret`, `password`, `token`) may be a reference,
//! `{"env": "VAR"}` or `{"file": "/path"}` (a mounted Kubernetes Secret key),
//! looked up when the target is built; in a declared target it must be one, so
//! no secret is ever stored in a topic. `"paused": true` stops new sends to the
//! target; sends under way finish and are followed.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::Deserialize;
use sluice_kit::declared::SharedDeclared;
use sluice_kit::secret_ref::{SecretValue, Source};

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

    /// The lower-case name used in target documents and declared ids.
    pub fn as_lower(self) -> &'static str {
        match self {
            Kind::Airflow => "airflow",
            Kind::Dolphinscheduler => "dolphinscheduler",
            Kind::Webhook => "webhook",
            Kind::Command => "command",
            Kind::Kafka => "kafka",
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
    #[serde(default)]
    paused: bool,
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
    secret: Option<SecretValue>,
    #[serde(default)]
    idempotent: bool,
    api_version: Option<u8>,
    username: Option<String>,
    password: Option<SecretValue>,
    token: Option<SecretValue>,
    project_code: Option<String>,
    argv: Option<Vec<String>>,
    /// A command's exit codes that mean "nothing to do" (e.g. `[3]` for the Hudi
    /// table-service driver: Hudi planned nothing): FAILED at once, not retried.
    void_exit_codes: Option<Vec<i32>>,
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
        /// Exit codes that mean "nothing to do": the job fails at once, never retried.
        void_exit_codes: Vec<i32>,
    },
    Kafka {
        topic: String,
    },
}

#[derive(Clone, Debug)]
pub struct Target {
    pub kind: Kind,
    pub name: String,
    /// No new sends; sends under way finish.
    pub paused: bool,
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
            let at = format!("target {}/{}", r.kind.as_lower(), r.name);
            match build(r, Source::Bootstrap) {
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

/// The id a declared target is published under: `kind/name`.
pub fn declared_id(kind: Kind, name: &str) -> String {
    format!("{}/{name}", kind.as_lower())
}

/// Checks a target document for the targets topic without looking up its secret
/// references (the API's check before it publishes): the id it must be published
/// under, or every mistake.
pub fn check_declared(document: &str) -> Result<String, Vec<String>> {
    let t = parse_document(document, Source::Check)?;
    Ok(declared_id(t.kind, &t.name))
}

fn parse_document(document: &str, source: Source) -> Result<Target, Vec<String>> {
    let raw: RawTarget = serde_json::from_str(document).map_err(|e| vec![e.to_string()])?;
    build(raw, source)
}

/// The targets in force: the bootstrap set with the declared ones over it, rebuilt
/// when the targets topic changes.
pub struct LiveTargets {
    bootstrap: Targets,
    declared: Arc<SharedDeclared>,
    /// The set last built, and the topic generation it was built from.
    current: RwLock<(u64, Arc<Targets>)>,
}

impl LiveTargets {
    pub fn new(bootstrap: Targets, declared: Arc<SharedDeclared>) -> Self {
        let first = Arc::new(bootstrap.clone());
        LiveTargets {
            bootstrap,
            declared,
            current: RwLock::new((u64::MAX, first)),
        }
    }

    /// Only the bootstrap set, never changed (tests, embedding).
    pub fn fixed(bootstrap: Targets) -> Self {
        let declared = SharedDeclared::new();
        declared.mark_caught_up();
        LiveTargets::new(bootstrap, declared)
    }

    pub fn declared(&self) -> &Arc<SharedDeclared> {
        &self.declared
    }

    /// The set in force now.
    pub fn current(&self) -> Arc<Targets> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .clone()
    }

    /// Rebuilds the set if the topic changed since the last build; true if it did.
    /// A declared target that is not valid here (a reference this dispatcher cannot
    /// look up) is left out, with an error naming it: its jobs wait as unroutable
    /// rather than go to a target half-configured.
    pub fn refresh(&self) -> bool {
        let generation = self.declared.generation();
        if self.current.read().unwrap_or_else(|p| p.into_inner()).0 == generation {
            return false;
        }
        let mut merged = self.bootstrap.clone();
        let mut invalid = 0u64;
        for (id, doc) in self.declared.snapshot() {
            let built = doc
                .map_err(|e| vec![e])
                .and_then(|d| parse_document(&d, Source::Declared))
                .and_then(|t| {
                    let want = declared_id(t.kind, &t.name);
                    if want == id {
                        Ok(t)
                    } else {
                        Err(vec![format!("published under {id:?}, not {want:?}")])
                    }
                });
            match built {
                Ok(t) => {
                    merged.by_name.insert((t.kind, t.name.clone()), t);
                }
                Err(problems) => {
                    invalid += 1;
                    tracing::error!(target = %id, problems = %problems.join("; "),
                        "declared target not valid here: left out");
                }
            }
        }
        metrics::gauge!(crate::metrics::TARGETS_INVALID).set(invalid as f64);
        metrics::gauge!(crate::metrics::TARGETS).set(merged.by_name.len() as f64);
        tracing::info!(
            targets = merged.by_name.len(),
            invalid,
            generation,
            "targets in force"
        );
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = (generation, Arc::new(merged));
        true
    }
}

fn build(r: RawTarget, source: Source) -> Result<Target, Vec<String>> {
    let mut problems = Vec::new();
    if r.name.is_empty() {
        problems.push("name is empty".to_owned());
    }
    if source != Source::Bootstrap && r.name.contains('/') {
        problems.push("a declared target's name has no '/'".to_owned());
    }
    let mut secret_of = |field: &str, v: &Option<SecretValue>| -> Option<String> {
        v.as_ref()
            .and_then(|v| v.reveal(field, source).map_err(|e| problems.push(e)).ok())
    };
    let webhook_secret = secret_of("secret", &r.secret);
    let password = secret_of("password", &r.password);
    let token = secret_of("token", &r.token);
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
            password: need("password", &password),
        },
        Kind::Dolphinscheduler => Reach::Dolphinscheduler {
            url: need("url", &r.url),
            token: need("token", &token),
            project_code: need("project_code", &r.project_code),
        },
        Kind::Webhook => Reach::Webhook {
            url: need("url", &r.url),
            secret: webhook_secret,
            idempotent: r.idempotent,
        },
        Kind::Command => Reach::Command {
            argv: r.argv.clone().unwrap_or_default(),
            void_exit_codes: r.void_exit_codes.clone().unwrap_or_default(),
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
    if let Reach::Command {
        argv,
        void_exit_codes,
    } = &reach
    {
        if argv.is_empty() {
            problems.push("`argv` is required for a command and must not be empty".into());
        }
        if let Some(c) = void_exit_codes.iter().find(|c| !(1..=255).contains(*c)) {
            problems.push(format!(
                "void_exit_codes: {c} is not an exit code of a failed command (1 to 255)"
            ));
        }
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
            paused: r.paused,
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

    #[test]
    fn a_declared_target_holds_references_never_secrets() {
        let e = check_declared(
            r#"{"kind": "webhook", "name": "w", "url": "http://x", "secret": "s3cret"}"#,
        )
        .expect_err("a literal secret");
        assert!(
            e[0].contains("`secret`: a declared resource holds references"),
            "{e:?}"
        );
        let e = check_declared(
            r#"{"kind": "airflow", "name": "af", "url": "http://x", "username": "u",
                "password": {"vault": "p"}}"#,
        )
        .expect_err("an unknown reference");
        assert!(e[0].contains("a secret is {\"env\""), "{e:?}");
        assert_eq!(
            check_declared(
                r#"{"kind": "airflow", "name": "af", "url": "http://x", "username": "u",
                    "password": {"env": "AIRFLOW_PASSWORD"}, "paused": true}"#
            ),
            Ok("airflow/af".to_owned())
        );
        let e = check_declared(r#"{"kind": "kafka", "name": "a/b", "topic": "t"}"#)
            .expect_err("a slash");
        assert!(e[0].contains("no '/'"), "{e:?}");
    }

    #[test]
    fn references_are_looked_up_where_the_target_is_built() {
        let dir = std::env::temp_dir().join(format!("sluice-targets-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("token");
        std::fs::write(&file, "from-a-file\n").expect("file");
        let t = Targets::parse(&format!(
            r#"[{{"kind": "dolphinscheduler", "name": "ds", "url": "http://x",
                 "project_code": "1", "token": {{"file": "{}"}}}}]"#,
            file.display()
        ))
        .expect("valid");
        match &t.get(Kind::Dolphinscheduler, "ds").expect("ds").reach {
            Reach::Dolphinscheduler { token, .. } => assert_eq!(token, "from-a-file"),
            other => panic!("{other:?}"),
        }
        let e = Targets::parse(
            r#"[{"kind": "webhook", "name": "w", "url": "http://x",
                 "secret": {"env": "SLUICE_TEST_SURELY_UNSET_VARIABLE"}}]"#,
        )
        .expect_err("unset");
        assert!(
            e[0].contains("environment variable SLUICE_TEST_SURELY_UNSET_VARIABLE is not set"),
            "{e:?}"
        );
    }

    #[test]
    fn declared_targets_replace_bootstrap_ones_and_a_tombstone_restores_them() {
        let bootstrap = Targets::parse(
            r#"[{"kind": "webhook", "name": "w", "url": "http://boot", "max_in_flight": 1}]"#,
        )
        .expect("valid");
        let declared = SharedDeclared::new();
        let live = LiveTargets::new(bootstrap, declared.clone());
        assert!(live.refresh(), "the first build");
        assert!(!live.refresh(), "nothing changed");
        let url = |live: &LiveTargets, name: &str| match live
            .current()
            .get(Kind::Webhook, name)
            .map(|t| t.reach.clone())
        {
            Some(Reach::Webhook { url, .. }) => Some(url),
            _ => None,
        };
        declared.apply(
            "webhook/w",
            Some(Ok(
                r#"{"kind": "webhook", "name": "w", "url": "http://declared", "paused": true}"#
                    .into(),
            )),
        );
        declared.apply(
            "webhook/late",
            Some(Ok(
                r#"{"kind": "webhook", "name": "late", "url": "http://late"}"#.into(),
            )),
        );
        // Published under a key that is not its own: left out, never guessed at.
        declared.apply(
            "webhook/elsewhere",
            Some(Ok(
                r#"{"kind": "webhook", "name": "other", "url": "http://x"}"#.into(),
            )),
        );
        assert!(live.refresh());
        assert_eq!(url(&live, "w").as_deref(), Some("http://declared"));
        assert!(live.current().get(Kind::Webhook, "w").expect("w").paused);
        assert_eq!(url(&live, "late").as_deref(), Some("http://late"));
        assert_eq!(url(&live, "other"), None);
        declared.apply("webhook/w", None);
        assert!(live.refresh());
        assert_eq!(url(&live, "w").as_deref(), Some("http://boot"));
    }
}
