# Shared by run.sh and test.sh (sourced, not run): the toolchain, and the stack
# brought up and later left as it was found.

# Installs missing build tools and puts cargo on PATH.
ensure_toolchain() {
  bash "$HERE/ensure-toolchain.sh"
  # shellcheck disable=SC1091
  [[ -f "$HOME/.cargo/env" ]] && source "$HOME/.cargo/env"
  return 0
}

# Starts the stack and exports its SLUICE_* variables. Sets STACK_WAS_RUNNING=1 when
# it was already up, so callers stop it only if they started it. (The status is
# captured first: `status | grep -q` under pipefail fails when grep closes early.)
stack_up() {
  local status
  status="$(bash "$HERE/stack.sh" status)"
  STACK_WAS_RUNNING=0
  [[ $status == *"kafka: running"* ]] && STACK_WAS_RUNNING=1
  bash "$HERE/stack.sh" up
  eval "$(bash "$HERE/stack.sh" env)"
  export SLUICE_KAFKA_BOOTSTRAP SLUICE_DATABASE_URL
}

# Stops the stack if stack_up started it.
stack_down_if_started() {
  if [[ ${STACK_WAS_RUNNING:-1} -eq 0 ]]; then bash "$HERE/stack.sh" down; fi
}

# The real Airflow 3 the dispatcher's integration test triggers (a venv of its own:
# its dependency set is large and pinned by Airflow).
AIRFLOW_PIN="apache-airflow==3.1.8"
ensure_airflow() {
  bash "$HERE/ensure-venv.sh" airflow "$AIRFLOW_PIN"
  export SLUICE_TEST_AIRFLOW_VENV="$HERE/../.stack/airflow-venv"
}

# The real lake writers (pyiceberg, deltalake, pypaimon) the poller tests and the
# main job commit with.
# moto's server is the S3-compatible store of the poller tests (S3 / MinIO cannot run here);
# confluent-kafka's Avro serializer writes the Debezium Avro change events of the CDC test;
# pyiceberg's sql-postgres extra lets its SqlCatalog live in the test PostgreSQL.
LAKE_PINS=("pyiceberg[sql-sqlite,sql-postgres,pyarrow]==0.12.0" "deltalake==1.6.6" "pypaimon==2.1.0" "moto[server]==5.2.5" "confluent-kafka[avro]==2.16.1")
ensure_lake() {
  bash "$HERE/ensure-venv.sh" lake "${LAKE_PINS[@]}"
  export SLUICE_TEST_LAKE_VENV="$HERE/../.stack/lake-venv"
}

# Real Spark with Hudi's Spark bundle: the Hudi tables of the poller test are written
# by Hudi's own writer. pyspark from PyPI; the bundle from Maven Central as a local
# jar (Spark is given `spark.jars`, never `spark.jars.packages`: it runs offline).
SPARK_PIN="pyspark==3.5.7"
ensure_spark() {
  bash "$HERE/ensure-venv.sh" spark "$SPARK_PIN"
  local jars="$HERE/../.stack/spark-jars"
  if [[ ! -f "$jars/.complete" ]]; then
    printf '[spark] resolving Hudi 1.0.2 Spark bundle from Maven Central\n' >&2
    rm -rf "$jars" && mkdir -p "$jars"
    mvn -q -B -f "$HERE/spark/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
      -DoutputDirectory="$jars" >&2
    touch "$jars/.complete"
  fi
  export SLUICE_TEST_SPARK_VENV="$HERE/../.stack/spark-venv"
  SLUICE_TEST_HUDI_BUNDLE="$(ls "$jars"/hudi-spark3.5-bundle_2.12-*.jar)"
  export SLUICE_TEST_HUDI_BUNDLE
}

# A real browser for the web UI's test: Debian's Chromium (a test tool's own browser
# download cannot work offline), driven by Playwright from PyPI in a venv.
PLAYWRIGHT_PIN="playwright==1.65.3"
ensure_browser() {
  if [[ ! -x /usr/bin/chromium ]]; then
    [[ $(id -u) -eq 0 ]] || { printf '[browser] install Debian chromium (apt-get install chromium)\n' >&2; return 1; }
    printf '[browser] installing Debian chromium\n' >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >&2
  fi
  bash "$HERE/ensure-venv.sh" ui "$PLAYWRIGHT_PIN"
  export SLUICE_TEST_UI_VENV="$HERE/../.stack/ui-venv"
}

# The Helm chart's checks: Helm 4 built from the Go module proxy (no release
# download site is reachable; about three minutes the first time), and
# kubernetes-validate from PyPI, which carries the Kubernetes schemas offline.
HELM_PIN="helm.sh/helm/v4/cmd/helm@v4.3.2"
KUBERNETES_VALIDATE_PIN="kubernetes-validate==1.37.0"
ensure_kube_tools() {
  local bin="$HERE/../.stack/tools/bin"
  if [[ ! -x "$bin/helm" || "$(cat "$bin/.helm-pin" 2>/dev/null)" != "$HELM_PIN" ]]; then
    command -v go >/dev/null || { printf '[helm] install Go 1.26 (golang) to build Helm\n' >&2; return 1; }
    printf '[helm] building %s from the Go module proxy\n' "$HELM_PIN" >&2
    mkdir -p "$bin"
    GOBIN="$bin" GOFLAGS=-mod=mod go install "$HELM_PIN" >&2
    printf '%s' "$HELM_PIN" >"$bin/.helm-pin"
  fi
  bash "$HERE/ensure-venv.sh" kube "$KUBERNETES_VALIDATE_PIN"
  export SLUICE_TEST_HELM="$bin/helm"
  export SLUICE_TEST_KUBERNETES_VALIDATE="$HERE/../.stack/kube-venv/bin/kubernetes-validate"
}
