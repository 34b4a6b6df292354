"""The GMV workflows Sluice triggers (local-command targets): each reads its input
tables and writes the next layer's table with the real Iceberg writer, so the next
dependency is driven only by this commit.

    python layer.py <warehouse> dwd_trade_event_fact|dws_gmv_daily|ads_gmv_dashboard

The trigger (its key and snapshot combination) arrives on stdin; it is recorded in
the snapshot's summary properties.
"""
import json
import sys

import pyarrow as pa
import pyarrow.compute as pc

import lake


def dwd(cat):
    orders = cat.load_table("ods.order_latest").scan().to_arrow()
    payments = cat.load_table("ods.payment_latest").scan().to_arrow()
    # Only paid orders are trade events; the newest payment of an order wins.
    joined = orders.join(payments, keys="order_id", join_type="inner")
    return joined.select(["order_id", "dt", "amount", "paid"])


def dws(cat):
    facts = cat.load_table("dwd.trade_event_fact").scan().to_arrow()
    g = facts.group_by("dt").aggregate([("paid", "sum"), ("order_id", "count")])
    return pa.table({"dt": g["dt"], "gmv": g["paid_sum"], "orders": g["order_id_count"].cast(pa.int64())})


def ads(cat):
    daily = cat.load_table("dws.gmv_daily").scan().to_arrow()
    total = pc.sum(daily["gmv"]).as_py() or 0.0
    orders = pc.sum(daily["orders"]).as_py() or 0
    return pa.table({"gmv_total": [float(total)], "days": [daily.num_rows], "orders": [int(orders)]},
                    schema=lake.TABLES["ads.gmv_dashboard"])


LAYERS = {
    "dwd_trade_event_fact": ("dwd.trade_event_fact", dwd),
    "dws_gmv_daily": ("dws.gmv_daily", dws),
    "ads_gmv_dashboard": ("ads.gmv_dashboard", ads),
}

if __name__ == "__main__":
    warehouse, target = sys.argv[1], sys.argv[2]
    trigger = json.loads(sys.stdin.read() or "{}")
    ident, build = LAYERS[target]
    cat = lake.catalog(warehouse)
    data = build(cat).cast(lake.TABLES[ident])
    table = cat.load_table(ident)
    inputs = ",".join(f"{i['asset']}@{i['sequence']}" for i in trigger.get("inputs", []))
    table.overwrite(data, snapshot_properties={"sluice.trigger_key": trigger.get("trigger_key", ""),
                                               "sluice.inputs": inputs})
    lake.push(table, ident)
    s = table.current_snapshot()
    print(f"{ident}: {data.num_rows} rows, snapshot {s.snapshot_id} (sequence {s.sequence_number}) from {inputs}",
          file=sys.stderr)
