"""Runs one Hudi table service (compaction, clustering, clean) for a Sluice
table-service policy, on Spark.

    python hudi_table_service.py --jar HUDI_BUNDLE.jar --path TABLE_PATH [--service compaction]
        [--option hoodie.key=value]... [--spark-conf spark.key=value]...

A `command` target runs it (see docs/table-services.md): Sluice's policy already
decided that the table is due, so this program plans the instance and runs it.

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
Clean plans and runs in one call (`run_clean`); its new completed instant is the
outcome.

Exit codes: 0 completed; 1 failed (the reason on stderr); 3 Hudi planned nothing
(nothing to rewrite or remove: the policy's request is void).
"""
import argparse
import json
import os
import sys

from pyspark.sql import SparkSession

NOTHING_PLANNED = 3


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


# Per service: the action its plans carry on the timeline while pending, and how
# Hudi's procedures plan and run one (`{path}`, `{opts}`, `{instant}` filled in).
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


def session(jar, confs):
    """A local Spark session with Hudi's bundle (offline: a local jar, never
    spark.jars.packages) and `confs` (`key=value`) on top."""
    b = (SparkSession.builder.master("local[1]").appName("sluice-hudi-table-service")
         .config("spark.jars", jar)
         # On the driver's own class path too: Hudi's Avro models and Spark's Avro
         # must share a class loader, or reading a log file's delete block fails
         # with a ClassCastException (clustering a MERGE_ON_READ table does).
         .config("spark.driver.extraClassPath", jar)
         .config("spark.serializer", "org.apache.spark.serializer.KryoSerializer")
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


def sql_str(s):
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jar", required=True)
    ap.add_argument("--path", required=True)
    ap.add_argument("--service", default="compaction", choices=["compaction", "clustering", "clean"])
    ap.add_argument("--option", action="append", default=[])
    ap.add_argument("--spark-conf", action="append", default=[])
    a = ap.parse_args()
    if not os.path.isdir(os.path.join(a.path, ".hoodie")):
        print(f"{a.path} is not a Hudi table (no .hoodie)", file=sys.stderr)
        return 1
    spark = session(a.jar, a.spark_conf)
    if a.service == "clean":
        return clean(spark, a)
    svc = SERVICES[a.service]
    fill = {"path": sql_str(a.path), "opts": sql_str(",".join([svc["now"], *a.option]))}
    left = pending(a.path, svc["pending"])
    if left:
        instant, how = left[0], "resumed"
    else:
        spark.sql(svc["plan"].format(**fill)).collect()
        planned = [i for i in pending(a.path, svc["pending"]) if i not in left]
        if not planned:
            print(json.dumps({"service": a.service, "planned": None}), flush=True)
            print(f"Hudi planned no {a.service}: nothing to rewrite", file=sys.stderr)
            return NOTHING_PLANNED
        instant, how = planned[0], "planned"
    claim(a, instant)
    spark.sql(svc["run"].format(instant=instant, **fill)).collect()
    spark.stop()
    if not completed(a.path, instant):
        print(f"{a.service} {instant} ran but is not completed on the timeline", file=sys.stderr)
        return 1
    print(json.dumps({"service": a.service, "instant": instant, "how": how}), flush=True)
    return 0


def claim(a, instant):
    """Names the instant in the run directory before running it (see the docstring)."""
    with open("hudi-instant.json.tmp", "w") as f:
        json.dump({"path": os.path.abspath(a.path), "instant": instant, "service": a.service}, f)
    os.replace("hudi-instant.json.tmp", "hudi-instant.json")


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
        print(json.dumps({"service": "clean", "planned": None}), flush=True)
        print("Hudi planned no clean: no file version old enough to remove", file=sys.stderr)
        return NOTHING_PLANNED
    print(json.dumps({"service": "clean", "instant": after[-1], "how": "planned"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
