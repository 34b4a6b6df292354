"""The GMV scenario's lake: one pyiceberg SQL catalog (SQLite) over a local
warehouse, its five tables, and the commit push to the ingester."""
import json
import os
import urllib.request

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog

TABLES = {
    "ods.order_latest": pa.schema([("order_id", pa.int64()), ("dt", pa.string()), ("amount", pa.float64())]),
    "ods.payment_latest": pa.schema([("order_id", pa.int64()), ("paid", pa.float64())]),
    "dwd.trade_event_fact": pa.schema([("order_id", pa.int64()), ("dt", pa.string()), ("amount", pa.float64()), ("paid", pa.float64())]),
    "dws.gmv_daily": pa.schema([("dt", pa.string()), ("gmv", pa.float64()), ("orders", pa.int64())]),
    "ads.gmv_dashboard": pa.schema([("gmv_total", pa.float64()), ("days", pa.int64()), ("orders", pa.int64())]),
}


CATALOG_NAME = "gmv"
CATALOG_URI = "sqlite:///{warehouse}/catalog.db"


def catalog(warehouse):
    os.makedirs(warehouse, exist_ok=True)
    return SqlCatalog(CATALOG_NAME, uri=CATALOG_URI.format(warehouse=warehouse), warehouse=f"file://{warehouse}")


def create_all(warehouse):
    cat = catalog(warehouse)
    paths = {}
    for ident, schema in TABLES.items():
        ns = ident.split(".")[0]
        try:
            cat.create_namespace(ns)
        except Exception:  # exists
            pass
        t = cat.load_table(ident) if cat.table_exists(ident) else cat.create_table(ident, schema=schema)
        paths[ident] = t.location().removeprefix("file://")
    return paths


def asset(ident):
    return "lake." + ident


def push(table, ident):
    """Tells the ingester about the table's newest commit (when SLUICE_PUSH_URL is set)."""
    url, token = os.environ.get("SLUICE_PUSH_URL"), os.environ.get("SLUICE_PUSH_TOKEN")
    if not url:
        return
    s = table.current_snapshot()
    body = json.dumps({"asset_key": asset(ident), "format": "iceberg", "snapshot_id": s.snapshot_id,
                       "sequence": s.sequence_number, "commit_time_ms": s.timestamp_ms,
                       "operation": s.summary.operation.value if s.summary else "append"}).encode()
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=15) as r:
        r.read()


def explain_waiting(dependency, waiting_for, log, timeout=30.0):
    """Asks the API (SLUICE_API_URL, SLUICE_API_TOKEN) why `dependency` did not run,
    until `waiting_for` is all it waits for, and logs the answer's summary and leaves."""
    url, token = os.environ.get("SLUICE_API_URL"), os.environ.get("SLUICE_API_TOKEN")
    if not url:
        return
    import time
    req = urllib.request.Request(f"{url}/v1/dependencies/{dependency}/explain",
                                 headers={"Authorization": f"Bearer {token}"})
    deadline, answer = time.time() + timeout, {}
    while time.time() < deadline:
        with urllib.request.urlopen(req, timeout=15) as r:
            answer = json.loads(r.read())
        unmet = answer.get("unmet", [])
        if answer.get("status") == "waiting" and unmet and all(waiting_for in u for u in unmet):
            break
        time.sleep(0.2)
    log(f"GET /v1/dependencies/{dependency}/explain → {answer.get('summary')}")
    for leaf in answer.get("condition", {}).get("children", []):
        for check in leaf.get("checks", []):
            mark = "✓" if check["satisfied"] else "✗"
            log(f"    {mark} {leaf.get('asset')}: {check['predicate']} — {check['reason']}")
