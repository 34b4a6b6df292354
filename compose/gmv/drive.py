"""Drives the GMV scenario with real commits to the ODS tables, round by round, and
waits after each round until the cascade has reached the dashboard.

    python drive.py <warehouse> <rounds> [--timeout SECS]

Each round commits new orders; payments follow in the same round except in round 2,
where they come one round late — the ALL of DWD_trade_event_fact waits for both.
Orders are pushed to the ingester over HTTP; payments are not (a lost push): the
poller finds them. In round 2 the driver asks Sluice's API why DWD_trade_event_fact
did not run (when SLUICE_API_URL is set). Prints one line per step and the
expected GMV at the end.
"""
import sys
import time

import pyarrow as pa

import lake


def log(msg):
    print(f"[drive] {msg}", flush=True)


def main():
    warehouse, rounds = sys.argv[1], int(sys.argv[2])
    timeout = float(sys.argv[sys.argv.index("--timeout") + 1]) if "--timeout" in sys.argv else 120.0
    cat = lake.catalog(warehouse)
    orders_t, payments_t = cat.load_table("ods.order_latest"), cat.load_table("ods.payment_latest")
    next_id, expected, owed = 1, 0.0, []
    for r in range(1, rounds + 1):
        ids = list(range(next_id, next_id + 5))
        next_id += 5
        amounts = [round(10.0 * r + i, 2) for i in range(5)]
        orders_t.append(pa.table({"order_id": ids, "dt": [f"2026-12-0{1 + r % 3}"] * 5, "amount": amounts},
                                 schema=lake.TABLES["ods.order_latest"]))
        lake.push(orders_t, "ods.order_latest")
        log(f"round {r}: committed 5 orders to lake.ods.order_latest (pushed)")
        owed.append((ids, amounts))
        if r == 2 and r < rounds:
            log("round 2: payments are late — DWD waits (ALL)")
            lake.explain_waiting("dwd_trade_event_fact", "lake.ods.payment_latest", log)
            continue
        pay_ids = [i for ids_, _ in owed for i in ids_]
        paid = [a for _, am in owed for a in am]
        owed = []
        payments_t.append(pa.table({"order_id": pay_ids, "paid": paid}, schema=lake.TABLES["ods.payment_latest"]))
        expected += sum(paid)
        log(f"round {r}: committed {len(pay_ids)} payments to lake.ods.payment_latest (no push: the poller finds it)")
        deadline = time.time() + timeout
        while True:
            rows = lake.catalog(warehouse).load_table("ads.gmv_dashboard").scan().to_arrow().to_pylist()
            if rows and abs(rows[0]["gmv_total"] - expected) < 1e-6:
                break
            if time.time() > deadline:
                log(f"round {r}: the dashboard did not reach GMV {expected:.2f} within {timeout:.0f} s (it shows {rows})")
                sys.exit(1)
            time.sleep(0.3)
        log(f"round {r}: the dashboard shows gmv_total {rows[0]['gmv_total']:.2f} over {rows[0]['orders']} orders, as expected")
    log(f"done: {rounds} rounds, GMV {expected:.2f}")


if __name__ == "__main__":
    main()
