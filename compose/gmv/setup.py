"""Creates the GMV scenario's five Iceberg tables and prints the service settings
that point Sluice at them, as shell assignments for compose/run.sh:

    python setup.py <warehouse> <python> <layer.py>

SLUICE_POLL_TABLES: every table polled (the compensation path; pushes may be lost).
SLUICE_TARGETS: one local-command target per layer, running layer.py.
"""
import json
import shlex
import sys

import lake

warehouse, python, layer = sys.argv[1:4]
paths = lake.create_all(warehouse)
# The poller reads each table's current metadata from the SQL catalog's pointer.
catalog = {"kind": "sql", "uri": lake.CATALOG_URI.format(warehouse=warehouse), "name": lake.CATALOG_NAME}
tables = [{"asset": lake.asset(ident), "format": "iceberg", "path": path,
           "catalog": {**catalog, "table": ident},
           "interval_ms": 1000, "push_timeout_ms": 1000, "start": "earliest"}
          for ident, path in paths.items()]
targets = [{"kind": "command", "name": name, "argv": [python, layer, warehouse, "{target_name}"],
            "send_timeout_ms": 120000, "deadline_ms": 150000, "max_attempts": 3, "backoff_ms": 1000}
           for name in ["dwd_trade_event_fact", "dws_gmv_daily", "ads_gmv_dashboard"]]
print(f"export SLUICE_POLL_TABLES={shlex.quote(json.dumps(tables))}")
print(f"export SLUICE_TARGETS={shlex.quote(json.dumps(targets))}")
