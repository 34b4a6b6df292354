"""Iceberg tables in a pyiceberg SQL catalog (SQLite), for the tests of what the
poller may believe: each call does one thing with the real writer and prints one
JSON line with what the catalog now says.

    python iceberg_catalog.py <warehouse> <table> create [v1|v2] [no-summary]
                                                                    partitioned by dt, partitions in the
                                                                    snapshot summaries unless no-summary
    python iceberg_catalog.py <warehouse> <table> append <dt> [branch]
    python iceberg_catalog.py <warehouse> <table> crash <dt>        a writer that dies after writing its
                                                                    metadata file, before the catalog's swap
    python iceberg_catalog.py <warehouse> <table> branch <name>     a branch at the current snapshot
    python iceberg_catalog.py <warehouse> <table> expire-oldest     expire the oldest snapshot
    python iceberg_catalog.py <warehouse> <table> add-column <name> a schema change (no snapshot)
    python iceberg_catalog.py <warehouse> <table> point-to <location> the catalog row names another file

<table> is `namespace.table`; the catalog, named "it", is `sqlite:///<warehouse>/catalog.db`,
or the SQLAlchemy URI given first as `--catalog-uri URI` (e.g. postgresql+psycopg2://…).
"""
import json
import os
import sys

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

argv = sys.argv[1:]
uri = None
if argv[:1] == ["--catalog-uri"]:
    uri, argv = argv[1], argv[2:]
warehouse, ident, action, *args = argv
os.makedirs(warehouse, exist_ok=True)
uri = uri or f"sqlite:///{warehouse}/catalog.db"
cat = SqlCatalog("it", uri=uri, warehouse=f"file://{warehouse}")


def report(table, **extra):
    table = cat.load_table(ident)
    s = table.current_snapshot()
    out = {"path": table.location().removeprefix("file://"), "metadata": table.metadata_location,
           "snapshot_id": s.snapshot_id if s else None,
           "sequence": s.sequence_number if s else None,
           "timestamp_ms": s.timestamp_ms if s else None,
           "snapshots": [x.snapshot_id for x in table.snapshots()],
           "schema_id": table.schema().schema_id}
    out.update(extra)
    print(json.dumps(out), flush=True)


def rows(dt):
    return pa.table({"id": pa.array([1, 2], pa.int64()), "dt": pa.array([dt, dt], pa.string())})


if action == "create":
    ns = ident.rsplit(".", 1)[0]
    try:
        cat.create_namespace(ns)
    except Exception:  # exists
        pass
    schema = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "dt", StringType(), required=False))
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="dt"))
    version = (args[0] if args else "v2").lstrip("v")
    props = {"format-version": version}
    if "no-summary" not in args:
        props["write.summary.partition-limit"] = "100"
    t = cat.create_table(ident, schema=schema, partition_spec=spec, properties=props)
    report(t)
elif action == "append":
    t = cat.load_table(ident)
    branch = args[1] if len(args) > 1 else "main"
    t.append(rows(args[0]), branch=branch)
    t = cat.load_table(ident)
    head = t.snapshot_by_name(branch)
    report(t, branch=branch, branch_snapshot_id=head.snapshot_id, branch_sequence=head.sequence_number)
elif action == "crash":
    written = []
    real_write = SqlCatalog._write_metadata

    def write_then_die(metadata, io, metadata_path):
        real_write(metadata, io, metadata_path)
        written.append((metadata_path, metadata.current_snapshot_id))
        raise SystemError("writer died before the catalog's pointer swap")

    SqlCatalog._write_metadata = staticmethod(write_then_die)
    t = cat.load_table(ident)
    try:
        t.append(rows(args[0]))
    except SystemError:
        pass
    SqlCatalog._write_metadata = staticmethod(real_write)
    report(t, orphan=written[0][0], orphan_snapshot_id=written[0][1])
elif action == "branch":
    t = cat.load_table(ident)
    t.manage_snapshots().create_branch(t.current_snapshot().snapshot_id, args[0]).commit()
    report(t)
elif action == "expire-oldest":
    t = cat.load_table(ident)
    oldest = min(t.snapshots(), key=lambda s: s.timestamp_ms)
    t.maintenance.expire_snapshots().by_id(oldest.snapshot_id).commit()
    report(t, expired=oldest.snapshot_id)
elif action == "add-column":
    t = cat.load_table(ident)
    with t.update_schema() as u:
        u.add_column(args[0], StringType())
    report(t)
elif action == "point-to":
    import sqlite3
    ns, name = ident.rsplit(".", 1)
    with sqlite3.connect(f"{warehouse}/catalog.db") as db:
        db.execute("UPDATE iceberg_tables SET metadata_location = ? WHERE catalog_name = 'it' "
                   "AND table_namespace = ? AND table_name = ?", (args[0], ns, name))
    print(json.dumps({"metadata": args[0]}), flush=True)
else:
    sys.exit(f"unknown action {action}")
