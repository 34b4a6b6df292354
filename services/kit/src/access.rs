//! What each service may do on the broker: the topics it reads and writes, its
//! consumer group and its transactional ids. One table drives three things, so
//! they cannot drift apart: the topics a service bootstraps, the ACL set shipped
//! for a broker with an authorizer (`deploy/kafka/acls.sh`, the Helm chart's
//! Strimzi `KafkaUser`s, `sluice acls`), and the check each service makes at start
//! that its principal holds them ([`crate::kafka::missing_acls`]).

use std::fmt;

use crate::Topic;

/// A Sluice process that talks to Kafka, and what it needs there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// The service's name: its principal is `User:sluice-<service>` by default.
    pub service: &'static str,
    pub reads: &'static [Topic],
    pub writes: &'static [Topic],
    /// The consumer group's name after the topic prefix (`<prefix><group>`), if
    /// the service consumes as a group. Readers of whole topics assign their
    /// partitions and need no group.
    pub group: Option<&'static str>,
    /// Whether it produces in transactions, with ids `<prefix><service>-<instance>`.
    pub transactional: bool,
    /// Whether it creates its topics when they are missing (the services do;
    /// the CLI only uses what they made).
    pub bootstraps: bool,
}

pub const INGESTER: Access = Access {
    service: "ingester",
    // Declared tables for the pollers; asset-state for where each table stands.
    reads: &[Topic::Tables, Topic::AssetState],
    writes: &[Topic::AssetEvents, Topic::DeadLetter],
    group: Some("ingester"),
    transactional: true,
    bootstraps: true,
};

pub const STATE_UPDATER: Access = Access {
    service: "state-updater",
    reads: &[Topic::AssetEvents, Topic::AssetState],
    writes: &[Topic::AssetState, Topic::DeadLetter],
    group: Some("state-updater"),
    transactional: true,
    bootstraps: true,
};

pub const RESOLVER: Access = Access {
    service: "resolver",
    reads: &[
        Topic::AssetState,
        Topic::Dependencies,
        Topic::ResolverProgress,
        Topic::Grants,
    ],
    writes: &[Topic::Triggers, Topic::ResolverProgress, Topic::DeadLetter],
    group: Some("resolver"),
    transactional: true,
    bootstraps: true,
};

pub const DISPATCHER: Access = Access {
    service: "dispatcher",
    reads: &[Topic::Triggers, Topic::Targets],
    writes: &[Topic::Runs, Topic::DeadLetter],
    group: Some("dispatcher"),
    transactional: false,
    bootstraps: true,
};

pub const API: Access = Access {
    service: "api",
    reads: &[
        Topic::AssetEvents,
        Topic::AssetState,
        Topic::Dependencies,
        Topic::ResolverProgress,
        Topic::Runs,
        Topic::Grants,
        Topic::Targets,
        Topic::Tables,
        Topic::Notifications,
        Topic::DeadLetter,
    ],
    // Declared resources, and the triggers of run now / backfill.
    writes: &[
        Topic::Dependencies,
        Topic::Grants,
        Topic::Targets,
        Topic::Tables,
        Topic::Notifications,
        Topic::Triggers,
    ],
    // The notifier's reader of the dead-letter topic.
    group: Some("notifier"),
    transactional: false,
    bootstraps: true,
};

/// The CLI's direct paths: `apply` without an API writes dependencies;
/// `watch --kafka` reads the pipeline's topics.
pub const CLI: Access = Access {
    service: "cli",
    reads: &[
        Topic::AssetEvents,
        Topic::AssetState,
        Topic::Triggers,
        Topic::Runs,
        Topic::DeadLetter,
    ],
    writes: &[Topic::Dependencies],
    group: None,
    transactional: false,
    bootstraps: false,
};

pub const ALL: [&Access; 6] = [
    &INGESTER,
    &STATE_UPDATER,
    &RESOLVER,
    &DISPATCHER,
    &API,
    &CLI,
];

/// A Kafka ACL operation, spelled as `kafka-acls --operation` takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Operation {
    Read,
    Write,
    Create,
    DescribeConfigs,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operation::Read => "Read",
            Operation::Write => "Write",
            Operation::Create => "Create",
            Operation::DescribeConfigs => "DescribeConfigs",
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ResourceKind {
    Topic,
    Group,
    TransactionalId,
}

impl fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ResourceKind::Topic => "topic",
            ResourceKind::Group => "group",
            ResourceKind::TransactionalId => "transactional-id",
        })
    }
}

/// One allow rule. `prefixed` matches every name that starts with `name`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Acl {
    pub kind: ResourceKind,
    pub name: String,
    pub prefixed: bool,
    pub operation: Operation,
}

impl fmt::Display for Acl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let star = if self.prefixed { "*" } else { "" };
        write!(f, "{} on {} {}{star}", self.operation, self.kind, self.name)
    }
}

impl Access {
    /// Every topic it touches, each once: what it bootstraps.
    pub fn topics(&self) -> Vec<Topic> {
        let mut all: Vec<Topic> = self.reads.to_vec();
        for t in self.writes {
            if !all.contains(t) {
                all.push(*t);
            }
        }
        all
    }

    /// The principal the shipped ACL set grants to.
    pub fn principal(&self) -> String {
        format!("User:sluice-{}", self.service)
    }

    /// The rules it needs under `prefix`, `extra_reads` being topics of the
    /// user's own (the ingester's hook topics). `Write` implies `Describe` and
    /// `Read` implies `Describe` on the broker, so neither is listed.
    pub fn acls(&self, prefix: &str, extra_reads: &[String]) -> Vec<Acl> {
        let topic = |name: String, operation| Acl {
            kind: ResourceKind::Topic,
            name,
            prefixed: false,
            operation,
        };
        let name = |t: &Topic| format!("{prefix}{}", t.role());
        let mut acls: Vec<Acl> = Vec::new();
        for t in self.reads {
            acls.push(topic(name(t), Operation::Read));
        }
        for t in extra_reads {
            acls.push(topic(t.clone(), Operation::Read));
        }
        for t in self.writes {
            acls.push(topic(name(t), Operation::Write));
        }
        if self.bootstraps {
            // Bootstrap creates what is missing and checks each topic's cleanup policy.
            for t in self.topics() {
                acls.push(topic(name(&t), Operation::Create));
                acls.push(topic(name(&t), Operation::DescribeConfigs));
            }
        }
        if let Some(group) = self.group {
            acls.push(Acl {
                kind: ResourceKind::Group,
                name: format!("{prefix}{group}"),
                prefixed: false,
                operation: Operation::Read,
            });
        }
        if self.transactional {
            acls.push(Acl {
                kind: ResourceKind::TransactionalId,
                name: format!("{prefix}{}-", self.service),
                prefixed: true,
                operation: Operation::Write,
            });
        }
        acls.sort();
        acls.dedup();
        acls
    }
}

/// The values of each key, keys in the order first seen.
fn group_by<K: PartialEq, V>(items: impl IntoIterator<Item = (K, V)>) -> Vec<(K, Vec<V>)> {
    let mut groups: Vec<(K, Vec<V>)> = Vec::new();
    for (k, v) in items {
        match groups.iter_mut().find(|(g, _)| *g == k) {
            Some((_, vs)) => vs.push(v),
            None => groups.push((k, vec![v])),
        }
    }
    groups
}

/// `deploy/kafka/acls.sh`: the whole set as `kafka-acls` calls, one call per
/// principal, pattern type and set of resources (a call takes many resources
/// and operations), so a broker is set up in about twenty JVM starts.
pub fn kafka_acls_script() -> String {
    let mut s = String::from(
        r#"#!/usr/bin/env bash
# The Kafka ACLs of every Sluice principal: each reads and writes only its own
# topics, its consumer group and its transactional ids. Generated from the code's
# access table (services/kit/src/access.rs) by `sluice acls --script`; a unit test
# fails when this file and the code disagree.
#
#   BOOTSTRAP=broker:9093 COMMAND_CONFIG=admin.properties bash deploy/kafka/acls.sh
#
# PREFIX        the services' SLUICE_TOPIC_PREFIX (default sluice.)
# PRINCIPAL     how a service's principal is named, %s being the service
#               (default User:sluice-%s)
# HOOK_TOPICS   the ingester's hook topics (SLUICE_HOOK_TOPICS), space-separated
# KAFKA_ACLS    the kafka-acls command (default kafka-acls.sh on PATH)
# ACTION        --add (default) or --remove
set -euo pipefail
: "${BOOTSTRAP:?set BOOTSTRAP to the broker address, host:port}"
PREFIX="${PREFIX-sluice.}"
PRINCIPAL="${PRINCIPAL:-User:sluice-%s}"
HOOK_TOPICS="${HOOK_TOPICS:-}"
KAFKA_ACLS="${KAFKA_ACLS:-kafka-acls.sh}"
ACTION="${ACTION:---add}"
config=()
[[ -n ${COMMAND_CONFIG:-} ]] && config=(--command-config "$COMMAND_CONFIG")
force=()
[[ $ACTION == --remove ]] && force=(--force)

# allow SERVICE PATTERN OPERATION[,OPERATION] --topic NAME ...
allow() {
  local principal pattern="$2" operations=()
  # shellcheck disable=SC2059 # the format is PRINCIPAL's, by design
  principal="$(printf "$PRINCIPAL" "$1")"
  for o in ${3//,/ }; do operations+=(--operation "$o"); done
  shift 3
  $KAFKA_ACLS --bootstrap-server "$BOOTSTRAP" "${config[@]}" "$ACTION" "${force[@]}" \
    --allow-principal "$principal" --resource-pattern-type "$pattern" "${operations[@]}" "$@"
}
"#,
    );
    for access in ALL {
        s.push_str(&format!("\n# {}\n", access.service));
        let calls = group_by(access.acls("${PREFIX}", &[]).into_iter().map(|acl| {
            let flag = format!("--{} \"{}\"", acl.kind, acl.name);
            ((acl.prefixed, acl.operation), flag)
        }));
        // Operations on the same resources go in one call (Create and DescribeConfigs).
        let merged = group_by(
            calls
                .into_iter()
                .map(|((prefixed, operation), flags)| ((prefixed, flags), operation.to_string())),
        );
        for ((prefixed, flags), operations) in merged {
            let pattern = if prefixed { "prefixed" } else { "literal" };
            s.push_str(&format!(
                "allow {} {pattern} {} {}\n",
                access.service,
                operations.join(","),
                flags.join(" ")
            ));
        }
        if *access == INGESTER {
            // The hook topics are the user's: word splitting of the list is wanted.
            s.push_str(
                "for t in $HOOK_TOPICS; do allow ingester literal Read --topic \"$t\"; done\n",
            );
        }
    }
    s
}

/// The Helm chart's `templates/kafka-users.yaml`: a Strimzi `KafkaUser` per
/// principal with the same rules as [`kafka_acls_script`], for clusters whose
/// users and ACLs Strimzi's User Operator manages.
pub fn strimzi_users_template() -> String {
    let mut s = String::from(
        "{{- /* Generated from the code's access table (services/kit/src/access.rs) by\n\
         `sluice acls --strimzi`; a unit test fails when this file and the code disagree. */ -}}\n\
         {{- if .Values.kafka.strimzi.users }}\n\
         {{- $p := .Values.kafka.topicPrefix }}\n",
    );
    for access in ALL {
        let rules = group_by(
            access
                .acls("{{ $p }}", &[])
                .into_iter()
                .map(|acl| ((acl.kind, acl.name, acl.prefixed), acl.operation)),
        );
        s.push_str(&format!(
            "---\n\
             apiVersion: kafka.strimzi.io/v1beta2\n\
             kind: KafkaUser\n\
             metadata:\n\
             \x20 name: {{{{ include \"sluice.fullname\" $ }}}}-{service}\n\
             \x20 labels:\n\
             \x20   strimzi.io/cluster: {{{{ $.Values.kafka.strimzi.cluster }}}}\n\
             \x20   {{{{- include \"sluice.labels\" (dict \"root\" $ \"component\" \"{service}\") | nindent 4 }}}}\n\
             spec:\n\
             \x20 authentication: {{ type: scram-sha-512 }}\n\
             \x20 authorization:\n\
             \x20   type: simple\n\
             \x20   acls:\n",
            service = access.service
        ));
        for ((kind, name, prefixed), ops) in rules {
            let kind = match kind {
                ResourceKind::Topic => "topic",
                ResourceKind::Group => "group",
                ResourceKind::TransactionalId => "transactionalId",
            };
            let pattern = if prefixed { "prefix" } else { "literal" };
            let ops: Vec<String> = ops.iter().map(ToString::to_string).collect();
            s.push_str(&format!(
                "      - resource: {{ type: {kind}, name: \"{name}\", patternType: {pattern} }}\n\
                 \x20       operations: [{}]\n",
                ops.join(", ")
            ));
        }
        if *access == INGESTER {
            s.push_str(
                "      {{- range $.Values.kafka.strimzi.hookTopics }}\n\
                 \x20     - resource: { type: topic, name: {{ . | quote }}, patternType: literal }\n\
                 \x20       operations: [Read]\n\
                 \x20     {{- end }}\n",
            );
        }
    }
    s.push_str("{{- end }}\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_service_bootstraps_exactly_the_topics_it_reads_or_writes() {
        assert_eq!(
            STATE_UPDATER.topics(),
            vec![Topic::AssetEvents, Topic::AssetState, Topic::DeadLetter]
        );
        for a in ALL {
            for t in a.topics() {
                assert!(a.reads.contains(&t) || a.writes.contains(&t));
            }
        }
    }

    #[test]
    fn the_resolver_may_write_triggers_but_not_runs() {
        let acls = RESOLVER.acls("p.", &[]);
        let has = |op, name: &str| {
            acls.iter()
                .any(|a| a.operation == op && a.name == name && a.kind == ResourceKind::Topic)
        };
        assert!(has(Operation::Write, "p.triggers"));
        assert!(has(Operation::Read, "p.dependencies"));
        assert!(!has(Operation::Write, "p.runs"));
        assert!(!has(Operation::Read, "p.runs"));
        assert!(acls.contains(&Acl {
            kind: ResourceKind::TransactionalId,
            name: "p.resolver-".into(),
            prefixed: true,
            operation: Operation::Write,
        }));
        assert!(acls.contains(&Acl {
            kind: ResourceKind::Group,
            name: "p.resolver".into(),
            prefixed: false,
            operation: Operation::Read,
        }));
    }

    #[test]
    fn the_cli_neither_creates_topics_nor_joins_a_group() {
        let acls = CLI.acls("p.", &[]);
        assert!(acls.iter().all(|a| a.kind == ResourceKind::Topic
            && matches!(a.operation, Operation::Read | Operation::Write)));
    }

    #[test]
    fn the_charts_kafka_users_are_the_ones_the_code_generates() {
        let shipped = include_str!("../../../deploy/helm/sluice/templates/kafka-users.yaml");
        assert!(
            shipped == strimzi_users_template(),
            "deploy/helm/sluice/templates/kafka-users.yaml differs from the access table: \
             regenerate it with `cargo run -q -p sluice-cli -- acls --strimzi > \
             deploy/helm/sluice/templates/kafka-users.yaml`"
        );
    }

    #[test]
    fn the_shipped_acl_script_is_the_one_the_code_generates() {
        let shipped = include_str!("../../../deploy/kafka/acls.sh");
        assert!(
            shipped == kafka_acls_script(),
            "deploy/kafka/acls.sh differs from the access table: regenerate it with \
             `cargo run -q -p sluice-cli -- acls --script > deploy/kafka/acls.sh`"
        );
    }
}
