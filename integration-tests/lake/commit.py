"""Commits to a real lake table with its real writer, for the poller tests and the
main job: pyiceberg (SQL catalog on SQLite), pypaimon (filesystem catalog) and
deltalake (delta-rs). Prints one JSON line per commit with what the table's own
metadata now says, so a test can compare it with the events Sluice emits.

    python commit.py iceberg|paimon|paimon-by-day|delta|delta-by-day <warehouse> <db> <table> <commits> [rows]

delta-by-day writes a Delta table partitioned by a `dt` column, commit i into
dt=2024-12-0<i+1>.

The table directory is <warehouse>/<db>.db/<table> for Paimon and
<warehouse>/<db>/<table> for Iceberg (pyiceberg's SQL catalog) and Delta; each
output line carries it as "path".
"""
import json
import os
import sys
import time

import pyarrow as pa


def rows(n, start):
    return pa.table({
        "id": pa.array(range(start, start + n), pa.int64()),
        "amount": pa.array([float(i) for i in range(start, start + n)], pa.float64()),
    })


def iceberg(warehouse, db, name, commits, n):
    from pyiceberg.catalog.sql import SqlCatalog
    cat = SqlCatalog("sluice", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}")
    try:
        cat.create_namespace(db)
    except Exception:  # already there
        pass
    ident = f"{db}.{name}"
    table = cat.load_table(ident) if cat.table_exists(ident) else cat.create_table(ident, schema=rows(0, 0).schema)
    for i in range(commits):
        table.append(rows(n, i * n))
        s = table.current_snapshot()
        print(json.dumps({"path": table.location().removeprefix("file://"), "snapshot_id": s.snapshot_id,
                          "sequence": s.sequence_number, "commit_time_ms": s.timestamp_ms}), flush=True)


def paimon(warehouse, db, name, commits, n):
    from pypaimon import CatalogFactory, Schema
    cat = CatalogFactory.create({"warehouse": warehouse})
    cat.create_database(db, True)
    ident = f"{db}.{name}"
    cat.create_table(ident, Schema.from_pyarrow_schema(rows(0, 0).schema), True)
    table = cat.get_table(ident)
    path = os.path.join(warehouse, f"{db}.db", name)
    for i in range(commits):
        wb = table.new_batch_write_builder()
        w, c = wb.new_write(), wb.new_commit()
        w.write_arrow(rows(n, i * n))
        c.commit(w.prepare_commit())
        w.close()
        c.close()
        latest = int(open(os.path.join(path, "snapshot", "LATEST")).read().strip())
        snap = json.load(open(os.path.join(path, "snapshot", f"snapshot-{latest}")))
        print(json.dumps({"path": path, "snapshot_id": snap["id"], "sequence": snap["id"],
                          "commit_time_ms": snap["timeMillis"]}), flush=True)


def paimon_by_day(warehouse, db, name, commits, n):
    """Commit i writes partition dt=2024-12-(i+1) / hh=i (an INT key); the last also
    writes a day whose name is short enough to sit inline in Paimon's BinaryRow."""
    from pypaimon import CatalogFactory, Schema
    cat = CatalogFactory.create({"warehouse": warehouse})
    cat.create_database(db, True)
    ident = f"{db}.{name}"
    schema = rows(0, 0).schema.append(pa.field("dt", pa.string())).append(pa.field("hh", pa.int32()))
    cat.create_table(ident, Schema.from_pyarrow_schema(schema, partition_keys=["dt", "hh"]), True)
    table = cat.get_table(ident)
    path = os.path.join(warehouse, f"{db}.db", name)
    for i in range(commits):
        days = [f"2024-12-{i + 1:02}"] + (["eu"] if i == commits - 1 else [])
        data = pa.concat_tables([
            rows(n, i * n).append_column("dt", pa.array([d] * n, pa.string()))
                          .append_column("hh", pa.array([i] * n, pa.int32()))
            for d in days])
        wb = table.new_batch_write_builder()
        w, c = wb.new_write(), wb.new_commit()
        w.write_arrow(data)
        c.commit(w.prepare_commit())
        w.close()
        c.close()
        latest = int(open(os.path.join(path, "snapshot", "LATEST")).read().strip())
        snap = json.load(open(os.path.join(path, "snapshot", f"snapshot-{latest}")))
        print(json.dumps({"path": path, "snapshot_id": snap["id"], "sequence": snap["id"],
                          "commit_time_ms": snap["timeMillis"],
                          "partitions": sorted(f"dt={d}/hh={i}" for d in days)}), flush=True)


def delta(warehouse, db, name, commits, n):
    from deltalake import DeltaTable, write_deltalake
    path = os.path.join(warehouse, db, name)
    for i in range(commits):
        write_deltalake(path, rows(n, i * n), mode="append")
        t = DeltaTable(path)
        h = t.history(1)[0]
        print(json.dumps({"path": path, "snapshot_id": t.version(), "sequence": t.version(),
                          "commit_time_ms": h.get("timestamp")}), flush=True)


def delta_by_day(warehouse, db, name, commits, n):
    from deltalake import DeltaTable, write_deltalake
    path = os.path.join(warehouse, db, name)
    start = DeltaTable(path).version() + 1 if os.path.exists(os.path.join(path, "_delta_log")) else 0
    for i in range(commits):
        data = rows(n, i * n).append_column("dt", pa.array([f"2024-12-{start + i + 1:02}"] * n, pa.string()))
        write_deltalake(path, data, mode="append", partition_by=["dt"])
        t = DeltaTable(path)
        h = t.history(1)[0]
        print(json.dumps({"path": path, "snapshot_id": t.version(), "sequence": t.version(),
                          "commit_time_ms": h.get("timestamp"), "partition": f"dt=2024-12-{start + i + 1:02}"}),
              flush=True)


if __name__ == "__main__":
    fmt, warehouse, db, name, commits = sys.argv[1:6]
    n = int(sys.argv[6]) if len(sys.argv) > 6 else 10
    os.makedirs(warehouse, exist_ok=True)
    {"iceberg": iceberg, "paimon": paimon, "delta": delta, "delta-by-day": delta_by_day,
     "paimon-by-day": paimon_by_day}[fmt](os.path.abspath(warehouse), db, name, int(commits), n)
