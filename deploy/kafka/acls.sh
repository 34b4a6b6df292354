#!/usr/bin/env bash
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

# ingester
allow ingester literal Write --topic "${PREFIX}asset-events" --topic "${PREFIX}dead-letter"
allow ingester literal Create,DescribeConfigs --topic "${PREFIX}asset-events" --topic "${PREFIX}asset-state" --topic "${PREFIX}dead-letter" --topic "${PREFIX}tables"
allow ingester literal Read --topic "${PREFIX}asset-state" --topic "${PREFIX}tables" --group "${PREFIX}ingester"
allow ingester prefixed Write --transactional-id "${PREFIX}ingester-"
for t in $HOOK_TOPICS; do allow ingester literal Read --topic "$t"; done

# state-updater
allow state-updater literal Read --topic "${PREFIX}asset-events" --topic "${PREFIX}asset-state" --group "${PREFIX}state-updater"
allow state-updater literal Create,DescribeConfigs --topic "${PREFIX}asset-events" --topic "${PREFIX}asset-state" --topic "${PREFIX}dead-letter"
allow state-updater literal Write --topic "${PREFIX}asset-state" --topic "${PREFIX}dead-letter"
allow state-updater prefixed Write --transactional-id "${PREFIX}state-updater-"

# resolver
allow resolver literal Read --topic "${PREFIX}asset-state" --topic "${PREFIX}dependencies" --topic "${PREFIX}grants" --topic "${PREFIX}resolver-progress" --group "${PREFIX}resolver"
allow resolver literal Create,DescribeConfigs --topic "${PREFIX}asset-state" --topic "${PREFIX}dead-letter" --topic "${PREFIX}dependencies" --topic "${PREFIX}grants" --topic "${PREFIX}resolver-progress" --topic "${PREFIX}triggers"
allow resolver literal Write --topic "${PREFIX}dead-letter" --topic "${PREFIX}resolver-progress" --topic "${PREFIX}triggers"
allow resolver prefixed Write --transactional-id "${PREFIX}resolver-"

# dispatcher
allow dispatcher literal Write --topic "${PREFIX}dead-letter" --topic "${PREFIX}runs"
allow dispatcher literal Create,DescribeConfigs --topic "${PREFIX}dead-letter" --topic "${PREFIX}runs" --topic "${PREFIX}targets" --topic "${PREFIX}triggers"
allow dispatcher literal Read --topic "${PREFIX}targets" --topic "${PREFIX}triggers" --group "${PREFIX}dispatcher"

# api
allow api literal Read --topic "${PREFIX}asset-events" --topic "${PREFIX}asset-state" --topic "${PREFIX}dead-letter" --topic "${PREFIX}dependencies" --topic "${PREFIX}grants" --topic "${PREFIX}notifications" --topic "${PREFIX}resolver-progress" --topic "${PREFIX}runs" --topic "${PREFIX}tables" --topic "${PREFIX}targets" --group "${PREFIX}notifier"
allow api literal Create,DescribeConfigs --topic "${PREFIX}asset-events" --topic "${PREFIX}asset-state" --topic "${PREFIX}dead-letter" --topic "${PREFIX}dependencies" --topic "${PREFIX}grants" --topic "${PREFIX}notifications" --topic "${PREFIX}resolver-progress" --topic "${PREFIX}runs" --topic "${PREFIX}tables" --topic "${PREFIX}targets" --topic "${PREFIX}triggers"
allow api literal Write --topic "${PREFIX}dependencies" --topic "${PREFIX}grants" --topic "${PREFIX}notifications" --topic "${PREFIX}tables" --topic "${PREFIX}targets" --topic "${PREFIX}triggers"

# cli
allow cli literal Read --topic "${PREFIX}asset-events" --topic "${PREFIX}asset-state" --topic "${PREFIX}dead-letter" --topic "${PREFIX}runs" --topic "${PREFIX}triggers"
allow cli literal Write --topic "${PREFIX}dependencies"
