#!/usr/bin/env bash
# Sluice's main job on one machine, no Docker: brings up the stack (Kafka + PostgreSQL,
# installing them if missing), builds the four services and starts each as its own
# process, as in production; waits until every one reports ready on its admin port,
# shows their status, and runs until Ctrl-C. Ctrl-C stops the services (SIGTERM, then
# their graceful shutdown) and the stack, and leaves nothing running.
#
#   compose/run.sh           run until Ctrl-C
#   compose/run.sh --check   start everything, report, stop (for scripts)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
cd "$REPO"
say() { printf '[sluice] %s\n' "$*" >&2; }
mode="${1:-run}"

# shellcheck source=compose/lib.sh
source "$HERE/lib.sh"
ensure_toolchain
stack_up
export SLUICE_TOPIC_PREFIX="${SLUICE_TOPIC_PREFIX:-sluice.}"
export SLUICE_TOPIC_PARTITIONS="${SLUICE_TOPIC_PARTITIONS:-4}"
# The ingester's push token for this machine, made once and kept in .stack/.
TOKEN_FILE="$REPO/.stack/ingest-token"
[[ -s $TOKEN_FILE ]] || od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$TOKEN_FILE"
INGEST_TOKEN="$(cat "$TOKEN_FILE")"
export SLUICE_INGEST_TOKENS="[{\"name\": \"local\", \"token\": \"$INGEST_TOKEN\", \"namespaces\": [\"*\"]}]"
export SLUICE_INGEST_HTTP_ADDR="${SLUICE_INGEST_HTTP_ADDR:-127.0.0.1:8088}"

say "building the services"
cargo build --bins --locked -q

LOGS="$REPO/.stack/services"
mkdir -p "$LOGS"
declare -A PORT=([ingester]=9101 [state-updater]=9102 [resolver]=9103 [dispatcher]=9104)
ORDER=(ingester state-updater resolver dispatcher)
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
printf '\ntopics: %s{asset-events,asset-state,dependencies,resolver-progress,triggers,runs,dead-letter} on %s\n' \
  "$SLUICE_TOPIC_PREFIX" "$SLUICE_KAFKA_BOOTSTRAP"
printf 'metrics: curl http://127.0.0.1:9102/metrics\n'
printf 'push a commit: curl -H "Authorization: Bearer %s" -d %s http://%s/v1/commits\n\n' \
  "$INGEST_TOKEN" "'{\"asset_key\": \"lake.ods.orders\", \"format\": \"iceberg\", \"snapshot_id\": 1, \"sequence\": 1, \"commit_time_ms\": 1764547200000}'" \
  "$SLUICE_INGEST_HTTP_ADDR"

if [[ $mode == --check ]]; then exit 0; fi
say "running; Ctrl-C to stop"
while true; do
  for i in "${!PIDS[@]}"; do
    if ! kill -0 "${PIDS[$i]}" 2>/dev/null; then say "sluice-${ORDER[$i]} exited; its log:"; tail -n 30 "$LOGS/${ORDER[$i]}.log" >&2; exit 1; fi
  done
  sleep 2
done
