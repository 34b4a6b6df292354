"""Writes a Hudi table with the real Hudi 1.x Spark writer (pyspark + Hudi's Spark
bundle, given as a local jar: offline). Prints one JSON line per write with the
instant the timeline completed for it.

    python hudi_spark.py <bundle.jar> <table path> <name> <table type> <day>[,<day>...]...

Each argument after the table type is one upsert writing one row to each of those
`dt` partitions, keyed by the partition: the first write to a partition inserts
its row, later ones update it (a MERGE_ON_READ table makes each a deltacommit,
and an update a log file for compaction to merge). The environment variable
HUDI_CALLBACK_URL (with HUDI_CALLBACK_KEY) turns on Hudi's own HTTP write-commit
callback; HUDI_WRITE_OPTIONS (`k=v,k=v`) adds Hudi write settings."""
import json
import os
import sys

# The Spark session of Sluice's own table-service driver: the same class path
# and settings for the writer as for the service that compacts its tables.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "services", "dispatcher", "engines"))
from hudi_table_service import session  # noqa: E402


def timeline(path):
    tl = os.path.join(path, ".hoodie", "timeline")
    return sorted(n for n in os.listdir(tl) if "_" in n.split(".")[0] and not n.startswith("."))


def main(jar, path, name, table_type, writes):
    spark = session(jar, [])
    opts = {
        "hoodie.table.name": name,
        "hoodie.datasource.write.table.type": table_type,
        "hoodie.datasource.write.recordkey.field": "id",
        "hoodie.datasource.write.precombine.field": "ts",
        "hoodie.datasource.write.partitionpath.field": "dt",
        "hoodie.datasource.write.hive_style_partitioning": "true",
        "hoodie.datasource.write.operation": "upsert",
        "hoodie.upsert.shuffle.parallelism": "1",
        "hoodie.insert.shuffle.parallelism": "1",
        # Sluice schedules the table services: the writer must not compact inline.
        "hoodie.compact.inline": "false",
    }
    if os.environ.get("HUDI_CALLBACK_URL"):
        opts.update({
            "hoodie.write.commit.callback.on": "true",
            "hoodie.write.commit.callback.http.url": os.environ["HUDI_CALLBACK_URL"],
            "hoodie.write.commit.callback.http.api.key": os.environ.get("HUDI_CALLBACK_KEY", ""),
            "hoodie.write.commit.callback.http.timeout.seconds": "10",
        })
    for kv in filter(None, os.environ.get("HUDI_WRITE_OPTIONS", "").split(",")):
        k, v = kv.split("=", 1)
        opts[k.strip()] = v.strip()
    seen = set(timeline(path)) if os.path.isdir(os.path.join(path, ".hoodie", "timeline")) else set()
    for i, days in enumerate(writes):
        rows = [(d, i, d) for d in days.split(",")]
        df = spark.createDataFrame(rows, "id string, ts int, dt string")
        df.write.format("hudi").options(**opts).mode("append").save(path)
        new = [n for n in timeline(path) if n not in seen]
        seen.update(new)
        commits = [n for n in new if n.split(".")[1] in ("commit", "deltacommit", "replacecommit")]
        requested, completed = commits[-1].split(".")[0].split("_")
        print(json.dumps({"path": path, "requested": int(requested), "completed": int(completed),
                          "action": commits[-1].split(".")[1],
                          "partitions": sorted(f"dt={d}" for d in days.split(","))}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
