//! Paimon: the partitions a commit changed. A snapshot's `deltaManifestList` names
//! the manifests of that commit alone; each manifest entry (a data file added or
//! deleted) carries its partition as a serialized `BinaryRow`, read here against
//! the partition keys and types of the snapshot's schema file. Pure apart from
//! reading files through a [`Tree`].

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use apache_avro::types::Value as Avro;
use serde_json::Value;
use sluice_core::calendar::Day;

use super::formats::{ScanError, Tree};

/// Paimon's `partition.default-name`: how a null partition value is written.
const NULL_PARTITION: &str = "__DEFAULT_PARTITION__";

/// The partitions the commit wrote or deleted from, as `k=v/k2=v2` paths in the
/// table's own directory naming; empty for an unpartitioned table, and for a
/// partition type this reader does not render (unknown, never wrong).
pub fn commit_partitions(
    t: &dyn Tree,
    schema_id: i64,
    delta_manifest_list: &str,
) -> Result<Vec<String>, ScanError> {
    let schema_path = PathBuf::from(format!("schema/schema-{schema_id}"));
    let schema: Value =
        serde_json::from_slice(&t.read(&schema_path)?).map_err(|e| ScanError::Corrupt {
            path: t.full(&schema_path),
            reason: format!("not complete JSON: {e}"),
        })?;
    let keys = match partition_keys(&schema) {
        Ok(keys) if keys.is_empty() => return Ok(Vec::new()),
        Ok(keys) => keys,
        Err(KeysError::Unrendered) => return Ok(Vec::new()),
        Err(KeysError::Corrupt(reason)) => {
            return Err(ScanError::Corrupt {
                path: t.full(&schema_path),
                reason,
            });
        }
    };
    let mut out = BTreeSet::new();
    for list_entry in read_avro(t, &Path::new("manifest").join(delta_manifest_list))? {
        let Some(Avro::String(name)) = field(&list_entry, "_FILE_NAME") else {
            continue;
        };
        let manifest = Path::new("manifest").join(name);
        for entry in read_avro(t, &manifest)? {
            let Some(Avro::Bytes(row)) = field(&entry, "_PARTITION") else {
                return Err(ScanError::Corrupt {
                    path: t.full(&manifest),
                    reason: "a manifest entry without `_PARTITION` bytes".into(),
                });
            };
            let values = decode_row(row, &keys).map_err(|reason| ScanError::Corrupt {
                path: t.full(&manifest),
                reason: format!("partition row: {reason}"),
            })?;
            out.insert(
                keys.iter()
                    .zip(values)
                    .map(|((k, _), v)| format!("{k}={}", v.as_deref().unwrap_or(NULL_PARTITION)))
                    .collect::<Vec<_>>()
                    .join("/"),
            );
        }
    }
    Ok(out.into_iter().collect())
}

/// A partition column's type, as far as a partition path renders it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PartType {
    Boolean,
    TinyInt,
    SmallInt,
    Int,
    BigInt,
    Date,
    String,
}

enum KeysError {
    /// A partition type without a rendering here (timestamp, decimal, ...).
    Unrendered,
    Corrupt(String),
}

/// The partition keys in order, with their types from the schema's fields.
fn partition_keys(schema: &Value) -> Result<Vec<(String, PartType)>, KeysError> {
    let corrupt = |r: &str| KeysError::Corrupt(r.to_owned());
    let keys = schema
        .get("partitionKeys")
        .and_then(Value::as_array)
        .ok_or_else(|| corrupt("no `partitionKeys`"))?;
    let fields = schema
        .get("fields")
        .and_then(Value::as_array)
        .ok_or_else(|| corrupt("no `fields`"))?;
    keys.iter()
        .map(|k| {
            let k = k
                .as_str()
                .ok_or_else(|| corrupt("a partition key that is not a name"))?;
            let f = fields
                .iter()
                .find(|f| f.get("name").and_then(Value::as_str) == Some(k))
                .ok_or_else(|| KeysError::Corrupt(format!("partition key `{k}` is not a field")))?;
            // A primitive type is a string such as `INT NOT NULL` or `VARCHAR(10)`.
            let ty = f.get("type").and_then(Value::as_str).unwrap_or_default();
            let base = ty
                .split(['(', ' '])
                .next()
                .unwrap_or_default()
                .to_ascii_uppercase();
            let t = match base.as_str() {
                "BOOLEAN" => PartType::Boolean,
                "TINYINT" => PartType::TinyInt,
                "SMALLINT" => PartType::SmallInt,
                "INT" | "INTEGER" => PartType::Int,
                "BIGINT" => PartType::BigInt,
                "DATE" => PartType::Date,
                "STRING" | "CHAR" | "VARCHAR" => PartType::String,
                _ => return Err(KeysError::Unrendered),
            };
            Ok((k.to_owned(), t))
        })
        .collect()
}

/// Paimon's `BinaryRow` as `SerializationUtils.serializeBinaryRow` writes it: a
/// big-endian arity, then the row — a header byte and null bits padded to 8-byte
/// words, one little-endian 8-byte slot per field, and a variable part. A string of
/// at most 7 bytes sits in its slot (highest bit set, length in the next 7 bits);
/// a longer one is `offset << 32 | length` into the row.
fn decode_row(bytes: &[u8], keys: &[(String, PartType)]) -> Result<Vec<Option<String>>, String> {
    let arity = bytes
        .get(..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or("shorter than its arity")?;
    if arity != keys.len() {
        return Err(format!(
            "{arity} fields where the schema has {} partition keys",
            keys.len()
        ));
    }
    let row = &bytes[4..];
    let null_bytes = (arity + 63 + 8) / 64 * 8;
    let slot = |i: usize| -> Result<[u8; 8], String> {
        let at = null_bytes + i * 8;
        row.get(at..at + 8)
            .map(|s| s.try_into().expect("8 bytes"))
            .ok_or_else(|| format!("field {i} past the end ({} bytes)", row.len()))
    };
    keys.iter()
        .enumerate()
        .map(|(i, (_, ty))| {
            let bit = i + 8; // after the header byte
            let null = row.get(bit / 8).is_none_or(|b| b & (1 << (bit % 8)) != 0);
            if null {
                return Ok(None);
            }
            let s = slot(i)?;
            let long = i64::from_le_bytes(s);
            let int = i32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            Ok(Some(match ty {
                PartType::Boolean => (s[0] != 0).to_string(),
                PartType::TinyInt => (s[0] as i8).to_string(),
                PartType::SmallInt => i16::from_le_bytes([s[0], s[1]]).to_string(),
                PartType::Int => int.to_string(),
                PartType::BigInt => long.to_string(),
                PartType::Date => Day::from_number(i64::from(int)).to_string(),
                PartType::String => {
                    let text = if s[7] & 0x80 != 0 {
                        let len = usize::from(s[7] & 0x7f);
                        s.get(..len).ok_or("an inline string longer than 7 bytes")?
                    } else {
                        let (offset, len) = ((long >> 32) as usize, (long & 0xffff_ffff) as usize);
                        row.get(offset..offset + len)
                            .ok_or_else(|| format!("field {i}'s string past the end"))?
                    };
                    String::from_utf8(text.to_vec())
                        .map_err(|_| format!("field {i} is not UTF-8"))?
                }
            }))
        })
        .collect()
}

fn read_avro(t: &dyn Tree, path: &Path) -> Result<Vec<Avro>, ScanError> {
    let bytes = t.read(path)?;
    let corrupt = |e: apache_avro::Error| ScanError::Corrupt {
        path: t.full(path),
        reason: format!("Avro manifest: {e}"),
    };
    apache_avro::Reader::new(&bytes[..])
        .map_err(corrupt)?
        .map(|r| r.map_err(corrupt))
        .collect()
}

fn field<'a>(v: &'a Avro, name: &str) -> Option<&'a Avro> {
    match v {
        Avro::Record(fields) => fields.iter().find(|(n, _)| n == name).map(|(_, v)| v),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DT_HH: [(&str, PartType); 2] = [("dt", PartType::String), ("hh", PartType::Int)];

    fn keys(k: &[(&str, PartType)]) -> Vec<(String, PartType)> {
        k.iter().map(|(n, t)| ((*n).to_owned(), *t)).collect()
    }

    /// Bytes pypaimon 2.1.0 wrote for (`2024-12-02-longer-than-seven`, 7).
    const LONG_STRING: &[u8] = b"\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x1c\x00\x00\x00\x18\x00\x00\x00\x07\x00\x00\x00\x00\x00\x00\x002024-12-02-longer-than-seven\x00\x00\x00\x00";

    #[test]
    fn a_row_as_paimon_writes_it_reads_back() {
        let got = decode_row(LONG_STRING, &keys(&DT_HH)).expect("decodes");
        assert_eq!(
            got,
            [
                Some("2024-12-02-longer-than-seven".into()),
                Some("7".into())
            ]
        );
        // "eu" inline (0x80 | 2 in the slot's last byte), a null hh (bit 9), a DATE.
        let mut inline = vec![0, 0, 0, 2, 0, 0b10, 0, 0, 0, 0, 0, 0];
        inline.extend_from_slice(&[b'e', b'u', 0, 0, 0, 0, 0, 0x82]);
        inline.extend_from_slice(&[0; 8]);
        assert_eq!(
            decode_row(&inline, &keys(&DT_HH)).expect("decodes"),
            [Some("eu".into()), None]
        );
        let mut date = vec![0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0];
        date.extend_from_slice(&20_058_i32.to_le_bytes());
        date.extend_from_slice(&[0; 4]);
        assert_eq!(
            decode_row(&date, &keys(&[("d", PartType::Date)])).expect("decodes"),
            [Some("2024-12-01".into())]
        );
    }

    #[test]
    fn a_row_cut_short_or_of_another_shape_is_an_error_not_a_value() {
        for cut in [3, 12, 30, LONG_STRING.len() - 8] {
            assert!(
                decode_row(&LONG_STRING[..cut], &keys(&DT_HH)).is_err(),
                "cut at {cut}"
            );
        }
        let err = decode_row(LONG_STRING, &keys(&DT_HH[..1])).expect_err("arity");
        assert!(err.contains("2 fields where the schema has 1"), "{err}");
    }

    #[test]
    fn partition_types_come_from_the_schema_fields() {
        let schema = serde_json::json!({"fields": [
            {"id": 0, "name": "id", "type": "BIGINT"},
            {"id": 1, "name": "dt", "type": "VARCHAR(10) NOT NULL"},
            {"id": 2, "name": "hh", "type": "INT"}],
            "partitionKeys": ["dt", "hh"]});
        assert_eq!(
            partition_keys(&schema).ok(),
            Some(keys(&[("dt", PartType::String), ("hh", PartType::Int)]))
        );
        let ts = serde_json::json!({"fields": [{"id": 0, "name": "t", "type": "TIMESTAMP(3)"}],
            "partitionKeys": ["t"]});
        assert!(matches!(partition_keys(&ts), Err(KeysError::Unrendered)));
        let missing = serde_json::json!({"fields": [], "partitionKeys": ["x"]});
        assert!(
            matches!(partition_keys(&missing), Err(KeysError::Corrupt(r)) if r.contains("`x`"))
        );
    }
}
