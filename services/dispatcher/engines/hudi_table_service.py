"""Runs one Hudi table service for a Sluice table-service policy, on Spark.

    python hudi_table_service.py --jar HUDI_BUNDLE.jar --path TABLE_PATH [--service compaction]
        [--option hoodie.key=value]... [--spark-conf spark.key=value]...

A `command` target runs it (see docs/table-services.md): Sluice's policy already
decided that the table is due, so this program plans the instance and runs it.

1. A compaction left pending on the timeline (planned by an earlier attempt that
   failed or was killed) is run again first: Hudi rolls its inflight state back
   and re-executes the same plan, so a retry never leaves a second plan behind.
2. Otherwise it plans one (`CALL run_compaction(op => 'schedule', ...)`) with
   Hudi's own trigger told to plan now (`max.delta.commits=1`: the policy was
   Sluice's to apply).
   Either way it writes the instant to `./hudi-instant.json` before running it:
   the dispatcher reads the table's timeline for it if this run ends without an
   exit code.
3. It runs the plan (`op => 'run'` with that instant) and exits 0 only when the
   timeline shows the instant completed: the timeline is the outcome.

Exit codes: 0 completed; 1 failed (the reason on stderr); 3 Hudi planned nothing
(no log file to compact: the policy's request is void).
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


def pending_compactions(path):
    done = {r for r, s, _, _ in instants(path) if s == "completed"}
    return sorted({r for r, s, _, a in instants(path) if a == "compaction" and r not in done})


def session(jar, confs):
    b = (SparkSession.builder.master("local[1]").appName("sluice-hudi-table-service")
         .config("spark.jars", jar)
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
    ap.add_argument("--service", default="compaction", choices=["compaction"])
    ap.add_argument("--option", action="append", default=[])
    ap.add_argument("--spark-conf", action="append", default=[])
    a = ap.parse_args()
    if not os.path.isdir(os.path.join(a.path, ".hoodie")):
        print(f"{a.path} is not a Hudi table (no .hoodie)", file=sys.stderr)
        return 1
    spark = session(a.jar, a.spark_conf)
    opts = ",".join(["hoodie.compact.inline.max.delta.commits=1", *a.option])
    path = sql_str(a.path)
    pending = pending_compactions(a.path)
    if pending:
        instant, how = pending[0], "resumed"
    else:
        before = set(pending_compactions(a.path))
        spark.sql(f"CALL run_compaction(op => 'schedule', path => {path}, options => {sql_str(opts)})").collect()
        planned = [i for i in pending_compactions(a.path) if i not in before]
        if not planned:
            print(json.dumps({"service": a.service, "planned": None}), flush=True)
            print("Hudi planned no compaction: no log file to merge", file=sys.stderr)
            return NOTHING_PLANNED
        instant, how = planned[0], "planned"
    with open("hudi-instant.json.tmp", "w") as f:
        json.dump({"path": os.path.abspath(a.path), "instant": instant, "service": a.service}, f)
    os.replace("hudi-instant.json.tmp", "hudi-instant.json")
    spark.sql(
        f"CALL run_compaction(op => 'run', path => {path}, timestamp => {instant}, options => {sql_str(opts)})"
    ).collect()
    spark.stop()
    if not completed(a.path, instant):
        print(f"compaction {instant} ran but is not completed on the timeline", file=sys.stderr)
        return 1
    print(json.dumps({"service": a.service, "instant": instant, "how": how}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
