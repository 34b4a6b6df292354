#!/usr/bin/env bash
# The whole test suite, on a fresh machine or a used one:
#   installs what is missing (Kafka from Maven Central, PostgreSQL, OpenSSL headers and Chromium from the
#   machine's packages, Airflow, the lake writers, Playwright, kubernetes-validate and pyspark from PyPI into venvs, Hudi's Spark bundle from Maven Central, Helm from the Go module proxy), starts the local stack, builds, checks
#   formatting and lints, runs every test (the core's pure tests and the integration
#   tests against the real broker, PostgreSQL and Airflow), then stops the stack again if it was not running before.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
cd "$REPO"
say() { printf '[test] %s\n' "$*" >&2; }

# shellcheck source=compose/lib.sh
source "$HERE/lib.sh"
ensure_toolchain
ensure_airflow
ensure_lake
ensure_browser
ensure_kube_tools
stack_up
trap stack_down_if_started EXIT
ensure_spark # after the stack: it brought Java and Maven

say "cargo fmt --check"
cargo fmt --all -- --check
say "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -q -- -D warnings
say "building services and tests"
cargo build --workspace --bins --tests --locked -q
say "running tests"
cargo test --workspace --locked --no-fail-fast
