"""Runs one Hudi table service (compaction, log compaction, clustering, clean) for
a Sluice table-service policy, on Spark.

    python hudi_table_service.py --jar HUDI_BUNDLE.jar [--master spark://host:7077]
        [--path TABLE_PATH] [--service compaction|log_compaction|clustering|clean]
        [--option hoodie.key=value[,hoodie.key=value]]... [--spark-conf spark.key=value]...

A `command` target runs it (see docs/table-services.md): Sluice's policy already
decided that the table is due, so this program plans the instance and runs it.
Run by Sluice, what the flags leave out comes from the trigger (SLUICE_TRIGGER):
the policy's target parameters `path`, `service` and `options` (`k=v,k=v`), so
one target serves every table and service.

`--master local[N]` (the default `local[1]`) runs Spark in this process;
any other master (`spark://…`, `yarn`, `k8s://…`) re-executes this program
under `spark-submit` in client mode with Hudi's bundle on the driver's and the
executors' class paths: the work runs on the cluster's executors, and the
driver (this process) stays the dispatcher's child, its exit code the outcome.

Compaction and clustering:
1. A plan left pending on the timeline (by an earlier attempt that failed or was
   killed) is run again first: Hudi rolls its inflight state back and re-executes
   the same plan, so a retry never leaves a second plan behind.
2. Otherwise it plans one (`CALL run_compaction(op => 'schedule', ...)`,
   `run_clustering`) with Hudi's own trigger told to plan now
   (`max.delta.commits=1`, `max.commits=1`: the policy was Sluice's to apply).
   Either way it writes the instant to `./hudi-instant.json` before running it:
   the dispatcher reads the table's timeline for it if this run ends without an
   exit code.
3. It runs the plan with that instant and exits 0 only when the timeline shows
   the instant completed: the timeline is the outcome.
Log compaction has no SQL procedure in Hudi 1.0.2: it goes through Hudi's write
client (`scheduleLogCompaction`, `logCompact`, `commitLogCompaction`), with the
same steps, except that Hudi refuses to re-run a log compaction left inflight (its
plans are mutable): it rolls that one back and a new one is planned.
Clean plans and runs in one call (`run_clean`); its new completed instant is the
outcome.

Exit codes: 0 completed; 1 failed (the reason on stderr); 2 bad arguments;
3 Hudi planned nothing (nothing to rewrite or remove: the policy's request is void).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

from pyspark.sql import SparkSession

NOTHING_PLANNED = 3
SERVICE_NAMES = ["compaction", "log_compaction", "clustering", "clean"]


def timeline_dir(path):
    layout2 = os.path.join(path, ".hoodie", "timeline")
    return layout2 if os.path.isdir(layout2) else os.path.join(path, ".hoodie")


def instants(path):
    """(requested instant, state, completion or None, action) of every instant file."""
    out = []
    for name in os.listdir(timeline_dir(path)):
        if name.startswith(".") or "." not in name:
            continue
        stem, rest = name.split(".", 1)
        requested, _, completed = stem.partition("_")
        if not requested.isdigit():
            continue
        if rest.endswith(".requested") or rest.endswith(".inflight"):
            action, state = rest.rsplit(".", 1)
            out.append((requested, state, None, action))
        else:
            out.append((requested, "completed", completed or None, rest))
    return out


def completed(path, instant):
    return any(r == instant and s == "completed" for r, s, _, _ in instants(path))


def inflight(path, instant):
    return any(r == instant and s == "inflight" for r, s, _, _ in instants(path))


# Per service run by a procedure: the action its plans carry on the timeline while
# pending, and how Hudi's procedures plan and run one (`{path}`, `{opts}`,
# `{instant}` filled in).
SERVICES = {
    "compaction": {
        "pending": ("compaction",),
        "plan": "CALL run_compaction(op => 'schedule', path => {path}, options => {opts})",
        "run": "CALL run_compaction(op => 'run', path => {path}, timestamp => {instant}, options => {opts})",
        "now": "hoodie.compact.inline.max.delta.commits=1",
    },
    "clustering": {
        # 1.x plans as `clustering`, 0.x as a requested `replacecommit`.
        "pending": ("clustering", "replacecommit"),
        "plan": "CALL run_clustering(op => 'schedule', path => {path}, options => {opts})",
        "run": "CALL run_clustering(op => 'execute', path => {path}, instants => '{instant}', options => {opts})",
        "now": "hoodie.clustering.inline.max.commits=1",
    },
}


def pending(path, actions):
    done = {r for r, s, _, _ in instants(path) if s == "completed"}
    return sorted({r for r, s, _, a in instants(path) if a in actions and r not in done})


def session(jar, confs, master="local[1]"):
    """A Spark session with Hudi's bundle (offline: a local jar, never
    spark.jars.packages) and `confs` (`key=value`) on top. `master` None: the
    session spark-submit set up (its master and class paths)."""
    b = SparkSession.builder.appName("sluice-hudi-table-service")
    if master is not None:
        b = (b.master(master)
             .config("spark.jars", jar)
             # On the driver's own class path too: Hudi's Avro models and Spark's
             # Avro must share a class loader, or reading a log file's delete block
             # fails with a ClassCastException (clustering a MERGE_ON_READ table does).
             .config("spark.driver.extraClassPath", jar))
    b = (b.config("spark.serializer", "org.apache.spark.serializer.KryoSerializer")
         .config("spark.sql.extensions", "org.apache.spark.sql.hudi.HoodieSparkSessionExtension")
         .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.hudi.catalog.HoodieCatalog")
         .config("spark.driver.memory", "1g")
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", "1"))
    for kv in confs:
        k, v = kv.split("=", 1)
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


# Set by spark-submit for the Python program it starts: the JVM is up already,
# with spark-submit's master and class paths.
SUBMITTED = "PYSPARK_GATEWAY_PORT" in os.environ


# Under spark-submit, this program's stderr reaches the JVM's stdout (PySpark
# merges the two streams), so what it has to say to the user also goes to this
# file, which the submitting process repeats on its own stderr at the end: the
# last lines of a run's stderr are its reason in Sluice.
REASON_FILE = "SLUICE_HUDI_REASON_FILE"


LOG4J2_WARN = """rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
"""


def say(message):
    print(message, file=sys.stderr, flush=True)
    if os.environ.get(REASON_FILE):
        with open(os.environ[REASON_FILE], "a") as f:
            print(message, file=f)


def submit(a):
    """Runs this program again under spark-submit in client mode and waits: its
    driver runs beside this process, in the run's process group (a kill reaches
    both), its exit code is this one."""
    spark_submit = a.spark_submit or shutil.which(
        "spark-submit", path=os.path.dirname(sys.executable)) or shutil.which("spark-submit")
    if not spark_submit:
        say("spark-submit not found (give --spark-submit, or run from a venv with pyspark)")
        return 1
    argv = [spark_submit, "--master", a.master, "--deploy-mode", "client",
            "--name", f"sluice-hudi-{a.service}", "--jars", a.jar,
            "--driver-class-path", a.jar, "--conf", f"spark.executor.extraClassPath={a.jar}",
            "--conf", "spark.driver.memory=1g"]
    for kv in a.spark_conf:
        argv += ["--conf", kv]
    argv += [os.path.abspath(__file__), "--jar", a.jar, "--path", a.path, "--service", a.service,
             "--master", a.master]
    for kv in a.option:
        argv += ["--option", kv]
    # Spark's own log at WARN from the JVM's start (spark.log.level applies only
    # once the context is up), so a run's stderr is its warnings and its reason.
    log4j = os.path.abspath("spark-log4j2.properties")
    with open(log4j, "w") as f:
        f.write(LOG4J2_WARN)
    argv[1:1] = ["--driver-java-options", f"-Dlog4j2.configurationFile=file:{log4j}"]
    reasons = os.path.abspath("hudi-driver-reason.txt")
    if os.path.exists(reasons):
        os.remove(reasons)
    env = dict(os.environ, PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable))
    env[REASON_FILE] = reasons
    sys.stdout.flush()
    code = subprocess.run(argv, env=env).returncode
    if os.path.exists(reasons):
        with open(reasons) as f:
            sys.stderr.write(f.read())
    elif code != 0:
        print(f"spark-submit exited with {code}", file=sys.stderr)
    return code


def sql_str(s):
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def arguments(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jar", required=True)
    ap.add_argument("--path")
    ap.add_argument("--service", choices=SERVICE_NAMES)
    ap.add_argument("--option", action="append", default=[],
                    help="Hudi settings, key=value (several: comma-separated)")
    ap.add_argument("--spark-conf", action="append", default=[])
    ap.add_argument("--master", default="local[1]")
    ap.add_argument("--spark-submit", help="spark-submit to use (default: beside python)")
    a = ap.parse_args(argv)
    # What the flags leave out, from the policy's target parameters.
    params = {}
    if os.environ.get("SLUICE_TRIGGER"):
        params = json.loads(os.environ["SLUICE_TRIGGER"]).get("target", {}).get("parameters") or {}
    a.path = a.path or params.get("path")
    a.service = a.service or params.get("service") or "compaction"
    if params.get("options") and not a.option:
        a.option = [params["options"]]
    a.option = [kv.strip() for o in a.option for kv in o.split(",") if kv.strip()]
    if not a.path:
        ap.error("no table: give --path, or the policy's target parameter `path`")
    if a.service not in SERVICE_NAMES:
        ap.error(f"service {a.service!r}: one of {', '.join(SERVICE_NAMES)}")
    bad = [kv for kv in a.option + a.spark_conf if "=" not in kv]
    if bad:
        ap.error(f"not key=value: {', '.join(bad)}")
    return a


def main():
    a = arguments(sys.argv[1:])
    if not os.path.isdir(os.path.join(a.path, ".hoodie")):
        say(f"{a.path} is not a Hudi table (no .hoodie)")
        return 1
    local = a.master.startswith("local")
    if not local and not SUBMITTED:
        return submit(a)
    spark = session(a.jar, a.spark_conf, a.master if local else None)
    if a.service == "clean":
        return clean(spark, a)
    if a.service == "log_compaction":
        return log_compaction(spark, a)
    svc = SERVICES[a.service]
    fill = {"path": sql_str(a.path), "opts": sql_str(",".join([svc["now"], *a.option]))}
    left = pending(a.path, svc["pending"])
    if left:
        instant, how = left[0], "resumed"
    else:
        spark.sql(svc["plan"].format(**fill)).collect()
        planned = [i for i in pending(a.path, svc["pending"]) if i not in left]
        if not planned:
            return nothing_planned(a)
        instant, how = planned[0], "planned"
    claim(a, instant)
    spark.sql(svc["run"].format(instant=instant, **fill)).collect()
    spark.stop()
    return outcome(a, instant, how)


def outcome(a, instant, how):
    if not completed(a.path, instant):
        say(f"{a.service} {instant} ran but is not completed on the timeline")
        return 1
    print(json.dumps({"service": a.service, "instant": instant, "how": how}), flush=True)
    return 0


def nothing_planned(a):
    print(json.dumps({"service": a.service, "planned": None}), flush=True)
    say(f"Hudi planned no {a.service}: nothing to rewrite or remove")
    return NOTHING_PLANNED


def claim(a, instant):
    """Names the instant in the run directory before running it (see the docstring)."""
    with open("hudi-instant.json.tmp", "w") as f:
        json.dump({"path": os.path.abspath(a.path), "instant": instant, "service": a.service}, f)
    os.replace("hudi-instant.json.tmp", "hudi-instant.json")


def log_compaction(spark, a):
    """Log compaction through Hudi's write client (no SQL procedure for it)."""
    from py4j.protocol import Py4JJavaError

    jvm = spark._jvm
    conf = jvm.java.util.HashMap()
    for kv in a.option:
        k, v = kv.split("=", 1)
        conf.put(k, v)
    client = jvm.org.apache.hudi.HoodieCLIUtils.createHoodieWriteClient(
        spark._jsparkSession, a.path, jvm.org.apache.spark.api.python.PythonUtils.toScalaMap(conf),
        jvm.scala.Option.empty())
    none = jvm.org.apache.hudi.common.util.Option.empty()
    try:
        instant, how = None, "planned"
        for left in pending(a.path, ("logcompaction",)):
            if not inflight(a.path, left):
                instant, how = left, "resumed"  # planned, never started: run as planned
                break
            # Started and stopped: Hudi rolls it back and refuses to re-run it.
            try:
                client.logCompact(left)
            except Py4JJavaError:
                pass
            if left in pending(a.path, ("logcompaction",)):
                say(f"log compaction {left} left inflight and not rolled back")
                return 1
        if instant is None:
            planned = client.scheduleLogCompaction(none)
            if not planned.isPresent():
                return nothing_planned(a)
            instant = planned.get()
        claim(a, instant)
        result = client.logCompact(instant)
        client.commitLogCompaction(instant, result.getCommitMetadata().get(), none)
    finally:
        client.close()
    spark.stop()
    return outcome(a, instant, how)


def clean(spark, a):
    """A clean plans and runs in one procedure call: the new completed `clean`
    instant is the outcome (none: nothing old enough to remove)."""
    before = {r for r, s, _, act in instants(a.path) if act == "clean" and s == "completed"}
    spark.sql(f"CREATE TABLE IF NOT EXISTS sluice_clean_target USING hudi LOCATION {sql_str(a.path)}")
    opts = ",".join(a.option)
    spark.sql(f"CALL run_clean(table => 'sluice_clean_target', trigger_max_commits => 1, options => {sql_str(opts)})").collect()
    spark.stop()
    after = sorted(r for r, s, _, act in instants(a.path) if act == "clean" and s == "completed" and r not in before)
    if not after:
        return nothing_planned(a)
    print(json.dumps({"service": "clean", "instant": after[-1], "how": "planned"}), flush=True)
    return 0


def reason_of(e):
    """One line for a failure: a JVM exception's own class and message."""
    java = getattr(e, "java_exception", None)
    return str(java.toString()) if java is not None else f"{type(e).__name__}: {e}"


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:
        say(reason_of(e))
        raise
