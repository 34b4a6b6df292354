"""Publishes Debezium change events of a commit-recording table in Avro, the way a
Debezium PostgreSQL connector (3.x) with Confluent's AvroConverter writes them:
Confluent's own serializer (confluent-kafka for Python) registers the Envelope and
Key schemas under <topic>-value / <topic>-key (TopicNameStrategy) and frames each
record as 0x00 | schema id (4 bytes) | Avro binary.

    python debezium_avro.py <bootstrap> <topic> <registry url> [N]

The schemas are those the connector derives for the table

    CREATE TABLE public.sluice_commits (id BIGINT PRIMARY KEY, asset_key TEXT NOT NULL,
      format TEXT NOT NULL, snapshot_id BIGINT NOT NULL, sequence BIGINT NOT NULL,
      commit_time_ms BIGINT NOT NULL, operation TEXT, watermark_ms BIGINT,
      schema_id INTEGER, committed_at TIMESTAMPTZ)

with topic.prefix "cdc" (optional columns are ["null", T] with default null; a
TIMESTAMPTZ is an io.debezium.time.ZonedTimestamp string). Records, in order
(offsets 0..): a snapshot read, an insert with every optional column, the delete
of the first row, its tombstone, then three bad ones: an unknown schema id, a
datum cut short, a row whose format is not a table format. Prints nothing.
With N (the benchmark): N inserts instead, over 10,000 assets, spread over the
topic's partitions by key; prints the records/s it produced.
"""
import json
import sys
import time

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

NS = "cdc.public.sluice_commits"


def optional(name, t):
    return {"name": name, "type": ["null", t], "default": None}


VALUE = {
    "type": "record", "name": "Value", "connect.name": f"{NS}.Value",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "asset_key", "type": "string"},
        {"name": "format", "type": "string"},
        {"name": "snapshot_id", "type": "long"},
        {"name": "sequence", "type": "long"},
        {"name": "commit_time_ms", "type": "long"},
        optional("operation", "string"),
        optional("watermark_ms", "long"),
        optional("schema_id", "int"),
        optional("committed_at", {"type": "string", "connect.version": 1,
                                  "connect.name": "io.debezium.time.ZonedTimestamp"}),
    ],
}

SOURCE = {
    "type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql",
    "connect.name": "io.debezium.connector.postgresql.Source",
    "fields": [
        {"name": "version", "type": "string"},
        {"name": "connector", "type": "string"},
        {"name": "name", "type": "string"},
        {"name": "ts_ms", "type": "long"},
        {"name": "snapshot", "default": "false", "type": [
            {"type": "string", "connect.version": 1, "connect.default": "false",
             "connect.name": "io.debezium.data.Enum",
             "connect.parameters": {"allowed": "true,first,first_in_data_collection,"
                                               "last_in_data_collection,last,false,incremental"}},
            "null"]},
        {"name": "db", "type": "string"},
        optional("sequence", "string"),
        optional("ts_us", "long"),
        optional("ts_ns", "long"),
        {"name": "schema", "type": "string"},
        {"name": "table", "type": "string"},
        optional("txId", "long"),
        optional("lsn", "long"),
        optional("xmin", "long"),
    ],
}

BLOCK = {
    "type": "record", "name": "block", "namespace": "event", "connect.version": 1,
    "connect.name": "event.block",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "total_order", "type": "long"},
        {"name": "data_collection_order", "type": "long"},
    ],
}

ENVELOPE = {
    "type": "record", "name": "Envelope", "namespace": NS, "connect.version": 2,
    "connect.name": f"{NS}.Envelope",
    "fields": [
        {"name": "before", "type": ["null", VALUE], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "source", "type": SOURCE},
        optional("transaction", BLOCK),
        {"name": "op", "type": "string"},
        optional("ts_ms", "long"),
        optional("ts_us", "long"),
        optional("ts_ns", "long"),
    ],
}

KEY = {"type": "record", "name": "Key", "namespace": NS, "connect.name": f"{NS}.Key",
       "fields": [{"name": "id", "type": "long"}]}


def row(id_, asset, fmt, seq, **extra):
    r = {"id": id_, "asset_key": asset, "format": fmt, "snapshot_id": 7000 + seq, "sequence": seq,
         "commit_time_ms": 1_700_000_000_000 + seq, "operation": None, "watermark_ms": None,
         "schema_id": None, "committed_at": None}
    r.update(extra)
    return r


def envelope(op, before, after, lsn, snapshot="false"):
    ts = 1_700_000_100_000 + lsn
    return {
        "before": before, "after": after, "op": op, "ts_ms": ts, "ts_us": ts * 1000, "ts_ns": ts * 1_000_000,
        "transaction": None,
        "source": {"version": "3.6.1.Final", "connector": "postgresql", "name": "cdc", "ts_ms": ts,
                   "snapshot": snapshot, "db": "lake", "sequence": json.dumps([None, str(lsn)]),
                   "ts_us": ts * 1000, "ts_ns": ts * 1_000_000, "schema": "public",
                   "table": "sluice_commits", "txId": 700 + lsn, "lsn": lsn, "xmin": None},
    }


def main(bootstrap, topic, registry):
    sr = SchemaRegistryClient({"url": registry})
    value = AvroSerializer(sr, json.dumps(ENVELOPE))
    key = AvroSerializer(sr, json.dumps(KEY))
    ctx = lambda field: SerializationContext(topic, field)  # noqa: E731

    first = row(1, "lake.ods.e", "iceberg", 1)
    second = row(2, "lake.ods.e", "iceberg", 2, operation="overwrite", watermark_ms=1_699_999_999_000,
                 schema_id=3, committed_at="2023-11-14T22:13:20.002Z")
    bad = row(3, "lake.ods.e", "orc", 3)
    good = [
        (1, envelope("r", None, first, 10, snapshot="last")),
        (2, envelope("c", None, second, 20)),
        (1, envelope("d", first, None, 30)),
        (1, None),  # the tombstone Debezium writes after a delete
    ]
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for k, v in good:
        p.produce(topic, partition=0, key=key({"id": k}, ctx(MessageField.KEY)),
                  value=None if v is None else value(v, ctx(MessageField.VALUE)))
    framed = value(envelope("c", None, bad, 40), ctx(MessageField.VALUE))
    schema_id = framed[1:5]
    p.produce(topic, partition=0, value=b"\x00\x00\x00\x27\x0f\x00")  # id 9999: never issued
    p.produce(topic, partition=0, value=b"\x00" + schema_id + b"\x02\x02")  # a datum cut short
    p.produce(topic, partition=0, value=framed)  # well framed, but "orc" is no table format
    if p.flush(30) != 0:
        sys.exit("records not delivered")


def bench(bootstrap, topic, registry, n):
    sr = SchemaRegistryClient({"url": registry})
    value = AvroSerializer(sr, json.dumps(ENVELOPE))
    ctx = SerializationContext(topic, MessageField.VALUE)
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20})
    started = time.monotonic()
    for i in range(n):
        asset = f"lake.bench.t{i % 10_000:05}"
        bytes_ = value(envelope("c", None, row(i, asset, "paimon", i), i), ctx)
        while True:
            try:
                p.produce(topic, key=asset.encode(), value=bytes_)
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(120) != 0:
        sys.exit("records not delivered")
    print(f"{n / (time.monotonic() - started):.0f}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 4:
        bench(*sys.argv[1:4], int(sys.argv[4]))
    else:
        main(*sys.argv[1:4])
