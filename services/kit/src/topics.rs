//! The topics of DESIGN.md: names, partition counts, configs, and their bootstrap.
//!
//! Bootstrap creates what is missing and checks what exists: a topic Sluice needs
//! compacted that is found with another cleanup policy is a start-up error, because
//! a deleted state record would silently lose an asset's truth.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::error::RDKafkaErrorCode;

use crate::config::Env;

/// Roles of the topics; the name is `<prefix><role>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Topic {
    AssetEvents,
    AssetState,
    Dependencies,
    ResolverProgress,
    Triggers,
    Runs,
    DeadLetter,
    Grants,
    /// Targets declared through the API (`kind/name` → a [`DeclaredResource`]),
    /// applied live by the dispatcher over its `SLUICE_TARGETS` bootstrap.
    ///
    /// [`DeclaredResource`]: crate::wire::DeclaredResource
    Targets,
    /// Tables declared through the API for the ingester's pollers (asset key →
    /// a [`DeclaredResource`]), applied live over `SLUICE_POLL_TABLES`.
    ///
    /// [`DeclaredResource`]: crate::wire::DeclaredResource
    Tables,
    /// Notification rules declared through the API (rule name → a
    /// [`DeclaredResource`]), which the API's notifier applies live.
    ///
    /// [`DeclaredResource`]: crate::wire::DeclaredResource
    Notifications,
}

impl Topic {
    pub const ALL: [Topic; 11] = [
        Topic::AssetEvents,
        Topic::AssetState,
        Topic::Dependencies,
        Topic::ResolverProgress,
        Topic::Triggers,
        Topic::Runs,
        Topic::DeadLetter,
        Topic::Grants,
        Topic::Targets,
        Topic::Tables,
        Topic::Notifications,
    ];

    pub fn role(self) -> &'static str {
        match self {
            Topic::AssetEvents => "asset-events",
            Topic::AssetState => "asset-state",
            Topic::Dependencies => "dependencies",
            Topic::ResolverProgress => "resolver-progress",
            Topic::Triggers => "triggers",
            Topic::Runs => "runs",
            Topic::DeadLetter => "dead-letter",
            Topic::Grants => "grants",
            Topic::Targets => "targets",
            Topic::Tables => "tables",
            Topic::Notifications => "notifications",
        }
    }

    pub fn compacted(self) -> bool {
        matches!(
            self,
            Topic::AssetState
                | Topic::Dependencies
                | Topic::ResolverProgress
                | Topic::Runs
                | Topic::Grants
                | Topic::Targets
                | Topic::Tables
                | Topic::Notifications
        )
    }

    /// Topic-level configs beyond the cleanup policy.
    fn configs(self) -> Vec<(&'static str, &'static str)> {
        match self {
            // The evidence log: kept a long time (90 days) for audit and replay.
            Topic::AssetEvents => vec![("retention.ms", "7776000000")],
            Topic::Triggers => vec![("retention.ms", "1209600000")],
            Topic::DeadLetter => vec![("retention.ms", "2592000000")],
            // The resolvers order specs by append time to decide which one closes a
            // cycle: the broker's clock, not each writer's.
            Topic::Dependencies => vec![
                ("min.cleanable.dirty.ratio", "0.1"),
                ("segment.ms", "3600000"),
                ("delete.retention.ms", "86400000"),
                ("message.timestamp.type", "LogAppendTime"),
            ],
            // Compacted tables: compact promptly, keep tombstones a day for readers.
            _ => vec![
                ("min.cleanable.dirty.ratio", "0.1"),
                ("segment.ms", "3600000"),
                ("delete.retention.ms", "86400000"),
            ],
        }
    }
}

#[derive(Clone, Debug)]
pub struct TopicNames {
    pub prefix: String,
    pub partitions: i32,
    /// -1: the broker's `default.replication.factor`.
    pub replication_factor: i32,
}

impl TopicNames {
    pub fn read(env: &mut Env) -> Self {
        let t = TopicNames {
            prefix: env.string("SLUICE_TOPIC_PREFIX", "sluice."),
            partitions: env.parse("SLUICE_TOPIC_PARTITIONS", 12),
            replication_factor: env.parse("SLUICE_TOPIC_REPLICATION_FACTOR", -1),
        };
        if t.partitions < 1 {
            env.problem(format!(
                "SLUICE_TOPIC_PARTITIONS={} must be at least 1",
                t.partitions
            ));
        }
        if t.replication_factor == 0 || t.replication_factor < -1 {
            env.problem(format!(
                "SLUICE_TOPIC_REPLICATION_FACTOR={} must be -1 (broker default) or at least 1",
                t.replication_factor
            ));
        }
        t
    }

    pub fn with_prefix(prefix: &str, partitions: i32) -> Self {
        TopicNames {
            prefix: prefix.to_owned(),
            partitions,
            replication_factor: -1,
        }
    }

    pub fn name(&self, t: Topic) -> String {
        format!("{}{}", self.prefix, t.role())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error(
        "topic {topic} must be compacted (cleanup.policy contains \"compact\") but has cleanup.policy={found:?}; fix it with kafka-configs --alter --add-config cleanup.policy=compact"
    )]
    NotCompacted { topic: String, found: String },
    #[error(
        "the broker's ACLs do not let this service's principal {operation} topic {topic}; grant it (deploy/kafka/acls.sh or `sluice acls` give the whole set of each service)"
    )]
    Forbidden {
        topic: String,
        operation: crate::access::Operation,
    },
    #[error("creating topic {topic}: {message}")]
    Create { topic: String, message: String },
    #[error("describing topic {topic}: {message}")]
    Describe { topic: String, message: String },
    #[error("kafka admin: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
}

/// Creates the missing topics of `which` and checks every one of them.
pub async fn bootstrap<C: rdkafka::client::ClientContext + 'static>(
    admin: &AdminClient<C>,
    names: &TopicNames,
    which: &[Topic],
    timeout: Duration,
) -> Result<(), BootstrapError> {
    let opts = AdminOptions::new()
        .operation_timeout(Some(timeout))
        .request_timeout(Some(timeout));
    let specs: Vec<(String, Vec<(&str, &str)>)> = which
        .iter()
        .map(|t| {
            let mut cfg = t.configs();
            cfg.push((
                "cleanup.policy",
                if t.compacted() { "compact" } else { "delete" },
            ));
            (names.name(*t), cfg)
        })
        .collect();
    let new_topics: Vec<NewTopic<'_>> = specs
        .iter()
        .map(|(name, cfg)| {
            let mut nt = NewTopic::new(
                name,
                names.partitions,
                TopicReplication::Fixed(names.replication_factor),
            );
            for (k, v) in cfg {
                nt = nt.set(k, v);
            }
            nt
        })
        .collect();
    // A principal without Create (topics made by an operator, e.g. Strimzi's
    // KafkaTopic) is told so for every topic, existing or not: those that exist
    // are fine, a missing one is reported below.
    let mut uncreatable = Vec::new();
    for result in admin.create_topics(&new_topics, &opts).await? {
        match result {
            Ok(topic) => tracing::info!(topic = %topic, "created topic"),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, RDKafkaErrorCode::TopicAuthorizationFailed)) => uncreatable.push(topic),
            Err((topic, code)) => {
                return Err(BootstrapError::Create {
                    topic,
                    message: code.to_string(),
                });
            }
        }
    }
    let resources: Vec<ResourceSpecifier<'_>> = specs
        .iter()
        .map(|(n, _)| ResourceSpecifier::Topic(n))
        .collect();
    // A topic created a moment ago may not report its configs yet: ask again until
    // every policy is known or the timeout passes.
    let started = std::time::Instant::now();
    loop {
        let mut unknown = None;
        for (t, described) in which
            .iter()
            .zip(admin.describe_configs(&resources, &opts).await?)
        {
            let topic = names.name(*t);
            let described = described.map_err(|code| match code {
                RDKafkaErrorCode::TopicAuthorizationFailed => BootstrapError::Forbidden {
                    topic: topic.clone(),
                    operation: crate::access::Operation::DescribeConfigs,
                },
                RDKafkaErrorCode::UnknownTopicOrPartition if uncreatable.contains(&topic) => {
                    BootstrapError::Forbidden {
                        topic: topic.clone(),
                        operation: crate::access::Operation::Create,
                    }
                }
                _ => BootstrapError::Describe {
                    topic: topic.clone(),
                    message: code.to_string(),
                },
            })?;
            let policy = described
                .get("cleanup.policy")
                .and_then(|e| e.value.clone())
                .unwrap_or_default();
            if policy.is_empty() {
                unknown = Some(topic);
            } else if t.compacted() && !policy.split(',').any(|p| p.trim() == "compact") {
                return Err(BootstrapError::NotCompacted {
                    topic,
                    found: policy,
                });
            }
        }
        match unknown {
            None => return Ok(()),
            Some(topic) if started.elapsed() >= timeout => {
                return Err(BootstrapError::Describe {
                    topic,
                    message: format!(
                        "cleanup.policy still unknown after {} ms",
                        timeout.as_millis()
                    ),
                });
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Checks that two topics have the same partition count: a changelog restored by
/// partition (state for input partition p lives on partition p) needs it.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("metadata of {topic}: {source}")]
    Metadata {
        topic: String,
        source: rdkafka::error::KafkaError,
    },
    #[error(
        "{input} has {inputs} partitions but {changelog} has {changelogs}: they must be co-partitioned (same count)"
    )]
    NotCopartitioned {
        input: String,
        inputs: usize,
        changelog: String,
        changelogs: usize,
    },
}

pub fn check_copartitioned(
    kafka: &crate::kafka::KafkaOptions,
    input: &str,
    changelog: &str,
) -> Result<(), TopologyError> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    fn metadata(topic: &str) -> impl FnOnce(rdkafka::error::KafkaError) -> TopologyError {
        let topic = topic.to_owned();
        move |source| TopologyError::Metadata { topic, source }
    }
    let probe: BaseConsumer = kafka
        .reader_config("sluice-copartition-probe")
        .create()
        .map_err(metadata(input))?;
    let count = |t: &str| -> Result<usize, TopologyError> {
        let md = probe
            .fetch_metadata(Some(t), kafka.request_timeout)
            .map_err(metadata(t))?;
        Ok(md.topics().first().map_or(0, |t| t.partitions().len()))
    };
    let (inputs, changelogs) = (count(input)?, count(changelog)?);
    if inputs != changelogs {
        return Err(TopologyError::NotCopartitioned {
            input: input.to_owned(),
            inputs,
            changelog: changelog.to_owned(),
            changelogs,
        });
    }
    Ok(())
}
