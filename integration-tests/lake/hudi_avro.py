"""Writes a completed Hudi 1.x commit instant the way Hudi 1.0.2 does: the
HoodieCommitMetadata (org.apache.hudi.avro.model; for a replacecommit the
HoodieReplaceCommitMetadata) as an Avro data file with its schema embedded and no
codec, as TimelineMetadataUtils.serializeAvroMetadata writes it. fastavro is an
Avro implementation independent of the Rust reader under test.

    python hudi_avro.py <file> <commit|deltacommit|replacecommit> <operationType>

The write stats carry a subset of HoodieWriteStat's fields (all optional in Hudi's
schema); the reader uses the embedded schema, whatever fields it has.
"""
import sys

import fastavro


def optional(name, t):
    return {"name": name, "type": ["null", t], "default": None}


WRITE_STAT = {
    "type": "record", "name": "HoodieWriteStat",
    "fields": [optional("fileId", "string"), optional("path", "string"), optional("prevCommit", "string"),
               optional("numWrites", "long"), optional("numDeletes", "long"),
               optional("numUpdateWrites", "long"), optional("totalWriteBytes", "long"),
               optional("partitionPath", "string"), optional("numInserts", "long"),
               optional("fileSizeInBytes", "long")],
}


def schema(action):
    fields = [
        optional("partitionToWriteStats", {"type": "map", "values": {"type": "array", "items": WRITE_STAT}}),
        optional("extraMetadata", {"type": "map", "values": "string"}),
        {"name": "version", "type": ["int", "null"], "default": 1},
        optional("operationType", "string"),
    ]
    name = "HoodieCommitMetadata"
    if action == "replacecommit":
        name = "HoodieReplaceCommitMetadata"
        fields.insert(1, optional("partitionToReplaceFileIds",
                                  {"type": "map", "values": {"type": "array", "items": "string"}}))
    return {"namespace": "org.apache.hudi.avro.model", "type": "record", "name": name, "fields": fields}


def main(path, action, operation):
    stat = {"fileId": "f1-0", "path": "dt=2024-12-01/f1-0_0-1-1_x.parquet", "prevCommit": "null",
            "numWrites": 3, "numDeletes": 0, "numUpdateWrites": 1, "totalWriteBytes": 4321,
            "partitionPath": "dt=2024-12-01", "numInserts": 2, "fileSizeInBytes": 4321}
    record = {"partitionToWriteStats": {"dt=2024-12-01": [stat]},
              "extraMetadata": {"schema": '{"type":"record","name":"events","fields":[]}'},
              "version": 1, "operationType": operation}
    if action == "replacecommit":
        record["partitionToReplaceFileIds"] = {"dt=2024-12-01": ["f0-0"]}
    with open(path, "wb") as out:
        fastavro.writer(out, fastavro.parse_schema(schema(action)), [record], codec="null")


if __name__ == "__main__":
    main(*sys.argv[1:4])
