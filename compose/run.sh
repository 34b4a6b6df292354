#!/usr/bin/env bash
# Sluice's main job on one machine, no Docker: brings up the stack (Kafka + PostgreSQL,
# installing them if missing, and the lake writers into a venv), builds the four
# services and the control plane's API and starts each as its own process, as in
# production, then runs the GMV
# cascade of the DolphinScheduler RFC on real Iceberg tables:
#
#   ODS_order_latest + ODS_payment_latest ──ALL──► DWD_trade_event_fact ──► DWS_gmv_daily ──► ADS_gmv_dashboard
#
# The ODS tables get real commits (orders pushed over HTTP, payments found by the
# poller); each layer is a local-command target that writes the next table with the
# real writer and commits it — snapshot advancement alone drives the cascade, no
# cron. `sluice watch --kafka` shows every commit, state change, trigger and dispatch as it
# happens, and a summary at the end. Ctrl-C stops the services (SIGTERM, then their
# graceful shutdown) and the stack, and leaves nothing running.
#
#   compose/run.sh                 run the cascade, then keep running until Ctrl-C
#   compose/run.sh --check         run the cascade, report, stop (for scripts)
#   GMV_ROUNDS=5 compose/run.sh    more rounds (default 3)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
cd "$REPO"
say() { printf '[sluice] %s\n' "$*" >&2; }
mode="${1:-run}"

# shellcheck source=compose/lib.sh
source "$HERE/lib.sh"
ensure_toolchain
ensure_lake
stack_up
# Each run is a fresh scenario: its own topics, database and warehouse (the state of
# an earlier run would make this run's first commits look old).
RUN_ID="gmv-$(date +%Y%m%d-%H%M%S)"
export SLUICE_TOPIC_PREFIX="${SLUICE_TOPIC_PREFIX:-sluice.$RUN_ID.}"
export SLUICE_TOPIC_PARTITIONS="${SLUICE_TOPIC_PARTITIONS:-4}"
DB_NAME="sluice_${RUN_ID//-/_}"
# Earlier runs' databases go (one run at a time: the ports are fixed).
for old in $(psql -At "$SLUICE_DATABASE_URL" -c "SELECT datname FROM pg_database WHERE datname LIKE 'sluice_gmv_%'"); do
  psql -q "$SLUICE_DATABASE_URL" -c "DROP DATABASE IF EXISTS $old" >/dev/null
done
psql -q "$SLUICE_DATABASE_URL" -c "CREATE DATABASE $DB_NAME" >/dev/null
export SLUICE_DATABASE_URL="${SLUICE_DATABASE_URL%/*}/$DB_NAME"
rm -rf "$REPO/.stack/gmv"
WAREHOUSE="$REPO/.stack/gmv/$RUN_ID/warehouse"
PY="$REPO/.stack/lake-venv/bin/python"
# The ingester's push token for this machine, made once and kept in .stack/.
TOKEN_FILE="$REPO/.stack/ingest-token"
[[ -s $TOKEN_FILE ]] || od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$TOKEN_FILE"
INGEST_TOKEN="$(cat "$TOKEN_FILE")"
export SLUICE_INGEST_TOKENS="[{\"name\": \"local\", \"token\": \"$INGEST_TOKEN\", \"namespaces\": [\"*\"]}]"
export SLUICE_INGEST_HTTP_ADDR="${SLUICE_INGEST_HTTP_ADDR:-127.0.0.1:8088}"
# What the layer scripts (and the driver) push their commits to.
export SLUICE_PUSH_URL="http://$SLUICE_INGEST_HTTP_ADDR/v1/commits" SLUICE_PUSH_TOKEN="$INGEST_TOKEN"
# The API's admin token for this machine (stored hashed in the tokens file, as a
# production tokens file would be): what the driver and the curl examples use.
API_TOKEN_FILE="$REPO/.stack/api-token"
[[ -s $API_TOKEN_FILE ]] || od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$API_TOKEN_FILE"
API_TOKEN="$(cat "$API_TOKEN_FILE")"
export SLUICE_API_TOKENS_FILE="$REPO/.stack/api-tokens.json"
printf '[{"name": "local-admin", "sha256": "%s", "roles": {"*": "admin"}}]\n' \
  "$(printf %s "$API_TOKEN" | sha256sum | cut -d' ' -f1)" >"$SLUICE_API_TOKENS_FILE"
export SLUICE_API_ADDR="${SLUICE_API_ADDR:-127.0.0.1:8090}"
export SLUICE_API_URL="http://$SLUICE_API_ADDR" SLUICE_API_TOKEN="$API_TOKEN"
say "creating the GMV tables in $WAREHOUSE"
eval "$(cd "$HERE/gmv" && "$PY" setup.py "$WAREHOUSE" "$PY" "$HERE/gmv/layer.py")"

say "building the services"
cargo build --bins --locked -q

LOGS="$REPO/.stack/services"
mkdir -p "$LOGS"
declare -A PORT=([ingester]=9101 [state-updater]=9102 [resolver]=9103 [dispatcher]=9104 [api]=9105)
ORDER=(ingester state-updater resolver dispatcher api)
PIDS=()

stop_all() {
  trap - INT TERM EXIT
  say "stopping services"
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  stack_down_if_started
  say "stopped; nothing left running"
}
trap stop_all INT TERM EXIT
export SLUICE_LOG="${SLUICE_LOG:-info}"

for s in "${ORDER[@]}"; do
  SLUICE_ADMIN_ADDR="127.0.0.1:${PORT[$s]}" "$REPO/target/debug/sluice-$s" >"$LOGS/$s.log" 2>&1 &
  PIDS+=($!)
  say "started sluice-$s (pid $!, admin 127.0.0.1:${PORT[$s]}, log $LOGS/$s.log)"
done

deadline=$((SECONDS + 120))
for s in "${ORDER[@]}"; do
  until curl -fsS "http://127.0.0.1:${PORT[$s]}/health/ready" >/dev/null 2>&1; do
    if ((SECONDS > deadline)); then say "sluice-$s not ready after 120 s; its log:"; tail -n 30 "$LOGS/$s.log" >&2; exit 1; fi
    sleep 0.5
  done
done

printf '\n%-22s %-8s %-24s %s\n' SERVICE STATUS ADMIN LOG
for s in "${ORDER[@]}"; do
  printf '%-22s %-8s %-24s %s\n' "sluice-$s" ready "127.0.0.1:${PORT[$s]}" "$LOGS/$s.log"
done
printf '\ntopics: %s{asset-events,asset-state,dependencies,resolver-progress,triggers,runs,dead-letter,grants,targets,tables} on %s\n' \
  "$SLUICE_TOPIC_PREFIX" "$SLUICE_KAFKA_BOOTSTRAP"
printf 'metrics: curl http://127.0.0.1:9102/metrics\n'
printf 'API:     curl -H "Authorization: Bearer %s" %s/v1/dependencies/dwd_trade_event_fact/explain\n' "$API_TOKEN" "$SLUICE_API_URL"
printf 'web UI:  %s/ui/ (sign in with the token %s)\n' "$SLUICE_API_URL" "$API_TOKEN"
printf 'push a commit: curl -H "Authorization: Bearer %s" -d %s http://%s/v1/commits\n\n' \
  "$INGEST_TOKEN" "'{\"asset_key\": \"lake.ods.orders\", \"format\": \"iceberg\", \"snapshot_id\": 1, \"sequence\": 1, \"commit_time_ms\": 1764547200000}'" \
  "$SLUICE_INGEST_HTTP_ADDR"

"$REPO/target/debug/sluice" apply "$HERE/gmv/specs.json"
"$REPO/target/debug/sluice" watch --kafka &
WATCH=$!
PIDS+=("$WATCH")
sleep 2 # the resolver takes the specs before the first commit
rounds="${GMV_ROUNDS:-3}"
say "driving the GMV cascade: $rounds rounds of commits to the ODS tables"
status=0
(cd "$HERE/gmv" && "$PY" drive.py "$WAREHOUSE" "$rounds" --timeout 180) || status=$?
sleep 2 # the last transitions reach the runs topic
kill -TERM "$WATCH" 2>/dev/null || true
wait "$WATCH" 2>/dev/null || true
if ((status != 0)); then say "the cascade did not complete; service logs in $LOGS"; exit "$status"; fi
say "the cascade ran on snapshot advancement alone"

# What an operator sees next, from the CLI over the API (SLUICE_API_URL / _TOKEN are set above).
SLUICE="$REPO/target/debug/sluice"
for cmd in "get deps" "explain dwd_trade_event_fact" "get runs"; do
  printf '\n$ sluice %s\n' "$cmd"
  # shellcheck disable=SC2086 # the words of the command
  "$SLUICE" $cmd || status=$?
done
if ((status != 0)); then say "the CLI could not read the API; its log: $LOGS/api.log"; exit "$status"; fi
printf '\ntry: export SLUICE_API_URL=%s SLUICE_API_TOKEN=%s; target/debug/sluice --help\n' "$SLUICE_API_URL" "$API_TOKEN"

if [[ $mode == --check ]]; then exit 0; fi
say "still running (push commits as shown above, watch with: target/debug/sluice watch, or watch --kafka); Ctrl-C to stop"
while true; do
  for i in "${!ORDER[@]}"; do
    if ! kill -0 "${PIDS[$i]}" 2>/dev/null; then say "sluice-${ORDER[$i]} exited; its log:"; tail -n 30 "$LOGS/${ORDER[$i]}.log" >&2; exit 1; fi
  done
  sleep 2
done
