//! Typed configuration from the environment (`SLUICE_…`), validated at start.
//!
//! Each service builds its `Options` with an [`Env`] reader, which collects every
//! problem instead of stopping at the first, so one start shows the operator all
//! that is wrong. Values of secret settings never appear in an error or a log.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

/// A value that must never be printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Every problem found in one configuration.
#[derive(Debug, Default, thiserror::Error)]
pub struct ConfigErrors(pub Vec<String>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "invalid configuration ({} problem(s)):", self.0.len())?;
        for e in &self.0 {
            writeln!(f, "  - {e}")?;
        }
        Ok(())
    }
}

/// Reads `SLUICE_*` variables from a snapshot of the environment.
pub struct Env {
    vars: BTreeMap<String, String>,
    errors: Vec<String>,
}

impl Env {
    /// From the process environment.
    pub fn from_process() -> Self {
        Self::from_map(std::env::vars())
    }

    /// From explicit pairs (tests).
    pub fn from_map<K: Into<String>, V: Into<String>>(
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Env {
            vars: vars
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            errors: Vec::new(),
        }
    }

    pub fn string(&mut self, name: &str, default: &str) -> String {
        self.vars
            .get(name)
            .cloned()
            .unwrap_or_else(|| default.to_owned())
    }

    pub fn optional(&mut self, name: &str) -> Option<String> {
        self.vars.get(name).filter(|v| !v.is_empty()).cloned()
    }

    pub fn required(&mut self, name: &str) -> String {
        match self.optional(name) {
            Some(v) => v,
            None => {
                self.errors.push(format!("{name} is required"));
                String::new()
            }
        }
    }

    pub fn secret(&mut self, name: &str) -> Option<Secret> {
        self.optional(name).map(Secret)
    }

    /// Parses a value; a bad one is reported (without echoing secrets: these are not secret).
    pub fn parse<T: FromStr>(&mut self, name: &str, default: T) -> T
    where
        T::Err: fmt::Display,
    {
        match self.vars.get(name) {
            None => default,
            Some(raw) => match raw.parse() {
                Ok(v) => v,
                Err(e) => {
                    self.errors.push(format!("{name}={raw:?}: {e}"));
                    default
                }
            },
        }
    }

    /// A duration in milliseconds.
    pub fn millis(&mut self, name: &str, default: Duration) -> Duration {
        let ms = self.parse::<u64>(name, u64::try_from(default.as_millis()).unwrap_or(u64::MAX));
        Duration::from_millis(ms)
    }

    pub fn addr(&mut self, name: &str, default: &str) -> SocketAddr {
        let raw = self.string(name, default);
        match raw.parse() {
            Ok(a) => a,
            Err(e) => {
                self.errors
                    .push(format!("{name}={raw:?}: not a socket address ({e})"));
                SocketAddr::from(([127, 0, 0, 1], 0))
            }
        }
    }

    /// A value given inline (`NAME`) or in a file (`NAME_FILE`, e.g. a mounted
    /// Secret), not both; none if neither is set.
    pub fn value_or_file(&mut self, name: &str) -> Option<String> {
        let file_var = format!("{name}_FILE");
        match (self.optional(name), self.optional(&file_var)) {
            (Some(_), Some(_)) => {
                self.problem(format!("set {name} or {file_var}, not both"));
                None
            }
            (Some(value), None) => Some(value),
            (None, Some(path)) => std::fs::read_to_string(&path)
                .map_err(|e| self.problem(format!("{file_var} {path}: {e}")))
                .ok(),
            (None, None) => None,
        }
    }

    /// Every variable that starts with `prefix`, with the prefix removed.
    pub fn with_prefix(&self, prefix: &str) -> BTreeMap<String, String> {
        self.vars
            .iter()
            .filter_map(|(k, v)| {
                k.strip_prefix(prefix)
                    .map(|rest| (rest.to_owned(), v.clone()))
            })
            .collect()
    }

    /// Records a cross-field problem found by a `validate()`.
    pub fn problem(&mut self, message: impl Into<String>) {
        self.errors.push(message.into());
    }

    /// Ends reading: every problem, or the value.
    pub fn finish<T>(self, value: T) -> Result<T, ConfigErrors> {
        if self.errors.is_empty() {
            Ok(value)
        } else {
            Err(ConfigErrors(self.errors))
        }
    }
}

/// Every `SLUICE_*` variable a Sluice service reads (any service: one environment
/// may be shared by all), plus the `SLUICE_RDKAFKA_*` family. A test holds this
/// list, the names the code reads and the README's configuration table together.
pub const KNOWN: &[&str] = &[
    "SLUICE_ADMIN_ADDR",
    "SLUICE_API_ADDR",
    "SLUICE_API_DATABASE_URL",
    "SLUICE_API_JWKS",
    "SLUICE_API_JWT_AUDIENCE",
    "SLUICE_API_JWT_ISSUER",
    "SLUICE_API_JWT_NAME_CLAIM",
    "SLUICE_API_JWT_ROLES_CLAIM",
    "SLUICE_API_MAX_PAGE",
    "SLUICE_API_NOTIFY",
    "SLUICE_API_NOTIFY_DEAD_LETTER_MAX_AGE_S",
    "SLUICE_API_NOTIFY_INTERVAL_MS",
    "SLUICE_API_TOKEN",
    "SLUICE_API_TOKENS_FILE",
    "SLUICE_API_URL",
    "SLUICE_BATCH_MAX_MS",
    "SLUICE_BATCH_MAX_RECORDS",
    "SLUICE_COMMAND_DIR",
    "SLUICE_CONFIG",
    "SLUICE_DATABASE_MAX_CONNECTIONS",
    "SLUICE_DATABASE_URL",
    "SLUICE_DISPATCHER_FAULT",
    "SLUICE_DISPATCH_LOOK_MS",
    "SLUICE_DISPATCH_ROUND_MS",
    "SLUICE_GRANTS",
    "SLUICE_HOOK_TOPICS",
    "SLUICE_HOOK_TOPICS_FILE",
    "SLUICE_INGESTER_GROUP",
    "SLUICE_INGEST_ACK_TIMEOUT_MS",
    "SLUICE_INGEST_HTTP_ADDR",
    "SLUICE_INGEST_MAX_BATCH",
    "SLUICE_INGEST_MAX_BODY_BYTES",
    "SLUICE_INGEST_TOKENS",
    "SLUICE_INGEST_TOKENS_FILE",
    "SLUICE_INSTANCE",
    "SLUICE_INTAKE_BATCH_MAX",
    "SLUICE_INTAKE_BATCH_WAIT_MS",
    "SLUICE_KAFKA_BOOTSTRAP",
    "SLUICE_KAFKA_REQUEST_TIMEOUT_MS",
    "SLUICE_LOG",
    "SLUICE_LOG_FORMAT",
    "SLUICE_POLL_TABLES",
    "SLUICE_POLL_TABLES_FILE",
    "SLUICE_RESOLVER_GROUP",
    "SLUICE_SCHEMA_REGISTRY_URL",
    "SLUICE_SHUTDOWN_GRACE_MS",
    "SLUICE_STATE_UPDATER_GROUP",
    "SLUICE_TARGETS",
    "SLUICE_TARGETS_FILE",
    "SLUICE_TLS_CA_FILE",
    "SLUICE_TOPIC_PARTITIONS",
    "SLUICE_TOPIC_PREFIX",
    "SLUICE_TOPIC_REPLICATION_FACTOR",
];

/// What a command target is given (set by the dispatcher, never read by a service).
pub const COMMAND_ENV: &[&str] = &[
    "SLUICE_TRIGGER",
    "SLUICE_TRIGGER_KEY",
    "SLUICE_DEPENDENCY_ID",
    "SLUICE_INVOCATION_ID",
    "SLUICE_ATTEMPT",
];

/// The `SLUICE_*` names in `vars` no service reads: most likely typos, which would
/// otherwise leave a setting at its default without a word.
pub fn unknown_variables(vars: impl IntoIterator<Item = (String, String)>) -> Vec<String> {
    vars.into_iter()
        .map(|(k, _)| k)
        .filter(|k| {
            k.starts_with("SLUICE_")
                && !k.starts_with("SLUICE_RDKAFKA_")
                // the test harness's own settings, inherited by the services it starts
                && !k.starts_with("SLUICE_TEST_")
                && !KNOWN.contains(&k.as_str())
                && !COMMAND_ENV.contains(&k.as_str())
        })
        .collect()
}

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!(
                "unknown log format {other:?}; expected text or json"
            )),
        }
    }
}

/// Settings every service shares.
#[derive(Clone, Debug)]
pub struct Common {
    pub service: &'static str,
    /// Distinguishes instances of one service (transactional ids, client ids).
    pub instance: String,
    pub kafka: crate::kafka::KafkaOptions,
    pub topics: crate::topics::TopicNames,
    pub schema_registry_url: Option<String>,
    pub admin_addr: SocketAddr,
    pub log_format: LogFormat,
    pub log_filter: String,
    /// How long shutdown may take before the process exits anyway.
    pub shutdown_grace: Duration,
}

impl Common {
    /// The Kafka client id of one of this instance's clients:
    /// `sluice-<service>-<instance>[-<part>]`.
    pub fn client_id(&self, part: &str) -> String {
        if part.is_empty() {
            format!("sluice-{}-{}", self.service, self.instance)
        } else {
            format!("sluice-{}-{}-{part}", self.service, self.instance)
        }
    }

    pub fn read(env: &mut Env, service: &'static str, default_admin: &str) -> Common {
        let instance = env.string("SLUICE_INSTANCE", "0");
        if instance.is_empty()
            || !instance
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            env.problem(format!(
                "SLUICE_INSTANCE={instance:?}: use letters, digits, '-' or '_'"
            ));
        }
        let kafka = crate::kafka::KafkaOptions::read(env);
        let topics = crate::topics::TopicNames::read(env);
        Common {
            service,
            instance,
            kafka,
            topics,
            schema_registry_url: env.optional("SLUICE_SCHEMA_REGISTRY_URL"),
            admin_addr: env.addr("SLUICE_ADMIN_ADDR", default_admin),
            log_format: env.parse("SLUICE_LOG_FORMAT", LogFormat::Text),
            log_filter: env.string("SLUICE_LOG", "info"),
            shutdown_grace: env.millis("SLUICE_SHUTDOWN_GRACE_MS", Duration::from_secs(20)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collects_every_problem() {
        let mut env = Env::from_map([
            ("SLUICE_X", "abc"),
            ("SLUICE_ADDR", "nope"),
            ("SLUICE_LOG_FORMAT", "xml"),
        ]);
        let _: u32 = env.parse("SLUICE_X", 1);
        let _ = env.addr("SLUICE_ADDR", "127.0.0.1:1");
        let _: LogFormat = env.parse("SLUICE_LOG_FORMAT", LogFormat::Text);
        let _ = env.required("SLUICE_MISSING");
        let err = env.finish(()).expect_err("four problems");
        assert_eq!(err.0.len(), 4, "{err}");
        assert!(err.to_string().contains("SLUICE_MISSING is required"));
    }

    #[test]
    fn a_typo_is_reported_and_known_names_are_not() {
        let vars = [
            ("SLUICE_KAFKA_BOOSTRAP", "x"),
            ("SLUICE_KAFKA_BOOTSTRAP", "x"),
            ("SLUICE_RDKAFKA_LINGER_MS", "5"),
            ("PATH", "/bin"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        assert_eq!(unknown_variables(vars), ["SLUICE_KAFKA_BOOSTRAP"]);
    }

    #[test]
    fn secrets_are_not_printed() {
        let s = Secret::new("hunter2");
        assert!(!format!("{s:?}").contains("hunter2"));
    }
}
