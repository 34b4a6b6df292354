//! Pure: every input format → canonical [`AssetEvent`]s, or a precise reason why
//! not. HTTP, the Kafka hook topics and the pollers all come through here, so the
//! same commit seen by two paths becomes the same event (the core derives its id).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;
use sluice_core::{
    AssetEvent, AssetKey, EventKind, EventSource, Operation, QualityStatus, TableFormat,
};

/// Why an input is not an event; the message names the field at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

fn invalid(msg: impl Into<String>) -> Invalid {
    Invalid(msg.into())
}

/// The generic commit notification (`POST /v1/commits`, JSON hook topics); see
/// `services/ingester/openapi.yaml`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommitNotice {
    pub asset_key: String,
    pub format: String,
    pub snapshot_id: i64,
    pub sequence: i64,
    pub commit_time_ms: i64,
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub operation: Option<String>,
    #[serde(default)]
    pub watermark_ms: Option<i64>,
    #[serde(default)]
    pub schema_id: Option<i64>,
    #[serde(default)]
    pub partitions: Vec<String>,
    #[serde(default)]
    pub quality: Option<String>,
    #[serde(default)]
    pub attributes: BTreeMap<String, String>,
}

fn upper_enum<T: for<'de> Deserialize<'de>>(
    field: &str,
    raw: &str,
    allowed: &str,
) -> Result<T, Invalid> {
    serde_json::from_value(Value::String(raw.to_ascii_uppercase()))
        .map_err(|_| invalid(format!("{field}: {raw:?} is not one of {allowed}")))
}

impl CommitNotice {
    pub fn into_event(self, source: EventSource) -> Result<AssetEvent, Invalid> {
        let key =
            AssetKey::parse(&self.asset_key).map_err(|e| invalid(format!("asset_key: {e}")))?;
        let format: TableFormat = self
            .format
            .parse()
            .map_err(|e| invalid(format!("format: {e}")))?;
        if self.sequence < 0 {
            return Err(invalid(format!("sequence: {} is negative", self.sequence)));
        }
        if self.commit_time_ms <= 0 {
            return Err(invalid(format!(
                "commit_time_ms: {} is not epoch milliseconds",
                self.commit_time_ms
            )));
        }
        let kind = match &self.kind {
            None => EventKind::SnapshotCommitted,
            Some(k) => upper_enum(
                "kind",
                k,
                "snapshot_committed, schema_changed, quality_reported, watermark_advanced, snapshot_expired",
            )?,
        };
        let operation = match &self.operation {
            None => Operation::Append,
            Some(o) => upper_enum("operation", o, "append, overwrite, compact, delete, other")?,
        };
        let quality: Option<QualityStatus> = match &self.quality {
            None => None,
            Some(q) => Some(upper_enum("quality", q, "passed, warned, failed")?),
        };
        if kind == EventKind::QualityReported && quality.is_none() {
            return Err(invalid("quality: required when kind is quality_reported"));
        }
        if kind == EventKind::SchemaChanged && self.schema_id.is_none() {
            return Err(invalid("schema_id: required when kind is schema_changed"));
        }
        if kind == EventKind::WatermarkAdvanced && self.watermark_ms.is_none() {
            return Err(invalid(
                "watermark_ms: required when kind is watermark_advanced",
            ));
        }
        if let Some(p) = self
            .partitions
            .iter()
            .find(|p| p.is_empty() || p.len() > 512)
        {
            return Err(invalid(format!("partitions: {p:?} must be 1 to 512 bytes")));
        }
        let mut e = AssetEvent::new(
            key,
            format,
            kind,
            self.snapshot_id,
            self.sequence,
            self.commit_time_ms,
            source,
        );
        e.operation = operation;
        e.watermark_ms = self.watermark_ms;
        e.schema_id = self.schema_id;
        e.partitions = self.partitions;
        e.quality = quality;
        e.attributes = self.attributes;
        Ok(e)
    }
}

/// A body of one notice, an array of them, or `{"commits": [...]}`; every item is
/// checked and the first bad one is named by its index.
pub fn commits_from_json(body: &[u8], source: EventSource) -> Result<Vec<AssetEvent>, Invalid> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| invalid(format!("body is not JSON: {e}")))?;
    let (items, batched) = match v {
        Value::Array(items) => (items, true),
        Value::Object(mut o) if o.len() == 1 && o.contains_key("commits") => {
            match o.remove("commits") {
                Some(Value::Array(items)) => (items, true),
                _ => return Err(invalid("commits: must be an array")),
            }
        }
        other @ Value::Object(_) => (vec![other], false),
        _ => {
            return Err(invalid(
                "body must be a commit object, an array of them, or {\"commits\": [...]}",
            ));
        }
    };
    if items.is_empty() {
        return Err(invalid("commits: empty"));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            let at = |e: String| {
                if batched {
                    invalid(format!("commits[{i}].{e}"))
                } else {
                    invalid(e)
                }
            };
            let notice: CommitNotice =
                serde_json::from_value(item).map_err(|e| at(e.to_string()))?;
            notice.into_event(source).map_err(|e| at(e.0))
        })
        .collect()
}

/// Hudi's write-commit callback message (`HoodieWriteCommitCallbackMessage`, as
/// Hudi 0.14 / 1.0 serialise it with Jackson for the HTTP and the Kafka callback).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HudiCallback {
    pub commit_time: String,
    pub table_name: String,
    #[serde(default)]
    pub base_path: Option<String>,
    #[serde(default)]
    pub hoodie_write_stat: Option<Vec<HudiWriteStat>>,
    #[serde(default, deserialize_with = "jackson_option")]
    pub commit_action_type: Option<String>,
    #[serde(default, deserialize_with = "jackson_option")]
    pub extra_metadata: Option<BTreeMap<String, String>>,
}

/// Hudi 1.0.2 writes its `Option` fields through Jackson as the bean
/// `{"empty": false, "present": true}`, which carries no value: read as absent
/// (the timeline, polled, is the truth for the action). A plain value reads as
/// itself.
fn jackson_option<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m))
            if !m.is_empty() && m.keys().all(|k| k == "empty" || k == "present") =>
        {
            Ok(None)
        }
        Some(v) => serde_json::from_value(v)
            .map(Some)
            .map_err(serde::de::Error::custom),
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HudiWriteStat {
    #[serde(default)]
    pub partition_path: Option<String>,
    #[serde(default)]
    pub num_inserts: Option<i64>,
    #[serde(default)]
    pub num_update_writes: Option<i64>,
    #[serde(default)]
    pub num_deletes: Option<i64>,
}

/// Where a Hudi table's asset key comes from: given outright, or a
/// `catalog.namespace` that the callback's `tableName` completes.
#[derive(Clone, Debug)]
pub enum HudiKey {
    Asset(AssetKey),
    Namespace(String),
}

/// A Hudi instant (`yyyyMMddHHmmssSSS`, or the older `yyyyMMddHHmmss`) as
/// (sequence, epoch ms). Hudi writes instants in the timeline's time zone; Sluice
/// reads them as UTC (`hoodie.table.timeline.timezone=UTC` makes that exact).
pub fn hudi_instant(instant: &str) -> Result<(i64, i64), Invalid> {
    let digits = match instant.len() {
        17 => instant.to_owned(),
        14 => format!("{instant}000"),
        _ => {
            return Err(invalid(format!(
                "commitTime {instant:?}: a Hudi instant has 17 digits (yyyyMMddHHmmssSSS)"
            )));
        }
    };
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(format!("commitTime {instant:?}: not all digits")));
    }
    let n = |a: usize, b: usize| digits[a..b].parse::<i64>().unwrap_or(-1);
    let (y, mo, d, h, mi, s, ms) = (
        n(0, 4),
        n(4, 6),
        n(6, 8),
        n(8, 10),
        n(10, 12),
        n(12, 14),
        n(14, 17),
    );
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return Err(invalid(format!(
            "commitTime {instant:?}: not a valid date and time"
        )));
    }
    let days = days_from_civil(y, mo, d);
    let epoch_ms = ((days * 24 + h) * 60 + mi) * 60_000 + s * 1_000 + ms;
    Ok((
        digits
            .parse()
            .map_err(|_| invalid("commitTime: out of range"))?,
        epoch_ms,
    ))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// What a Hudi action means for dependencies: table services rewrite, they do not
/// change data (`replacecommit` is clustering or insert_overwrite: the write
/// operation in extraMetadata / the commit metadata tells which).
pub fn hudi_operation(action: Option<&str>, operation_type: Option<&str>) -> Operation {
    match (action.unwrap_or("commit"), operation_type) {
        (_, Some("cluster" | "CLUSTER")) | ("clustering", _) => Operation::Cluster,
        (_, Some("log_compact" | "LOG_COMPACT")) | ("logcompaction", _) => Operation::LogCompact,
        (_, Some("compact" | "COMPACT")) | ("compaction", _) => Operation::Compact,
        ("replacecommit", _) => Operation::Overwrite,
        ("clean", _) => Operation::Clean,
        ("rollback" | "restore" | "savepoint" | "indexing", _) => Operation::Other,
        (_, Some("delete" | "DELETE" | "delete_partition" | "DELETE_PARTITION")) => {
            Operation::Delete
        }
        (
            _,
            Some(
                "insert_overwrite"
                | "INSERT_OVERWRITE"
                | "insert_overwrite_table"
                | "INSERT_OVERWRITE_TABLE",
            ),
        ) => Operation::Overwrite,
        _ => Operation::Append,
    }
}

impl HudiCallback {
    pub fn into_event(self, key: &HudiKey, source: EventSource) -> Result<AssetEvent, Invalid> {
        let asset = match key {
            HudiKey::Asset(a) => a.clone(),
            HudiKey::Namespace(ns) => {
                let raw = format!("{ns}.{}", self.table_name.to_ascii_lowercase());
                AssetKey::parse(&raw).map_err(|e| {
                    invalid(format!("tableName {:?} does not make an asset key ({e}); give ?asset=catalog.namespace.table", self.table_name))
                })?
            }
        };
        let (sequence, commit_ms) = hudi_instant(&self.commit_time)?;
        let extra = self.extra_metadata.unwrap_or_default();
        let op = hudi_operation(
            self.commit_action_type.as_deref(),
            extra.get("operationType").map(String::as_str),
        );
        let mut e = AssetEvent::committed(
            asset,
            TableFormat::Hudi,
            sequence,
            sequence,
            commit_ms,
            source,
        );
        e.operation = op;
        let stats = self.hoodie_write_stat.unwrap_or_default();
        let mut parts: Vec<String> = stats
            .iter()
            .filter_map(|s| s.partition_path.clone())
            .filter(|p| !p.is_empty())
            .collect();
        parts.sort();
        parts.dedup();
        e.partitions = parts;
        let sum = |f: fn(&HudiWriteStat) -> Option<i64>| stats.iter().filter_map(f).sum::<i64>();
        e.attributes.insert(
            "hudi.action".into(),
            self.commit_action_type.unwrap_or_else(|| "commit".into()),
        );
        e.attributes
            .insert("hudi.inserts".into(), sum(|s| s.num_inserts).to_string());
        e.attributes.insert(
            "hudi.updates".into(),
            sum(|s| s.num_update_writes).to_string(),
        );
        e.attributes
            .insert("hudi.deletes".into(), sum(|s| s.num_deletes).to_string());
        if let Some(p) = self.base_path {
            e.attributes.insert("hudi.base_path".into(), p);
        }
        Ok(e)
    }
}

pub fn hudi_from_json(
    body: &[u8],
    key: &HudiKey,
    source: EventSource,
) -> Result<AssetEvent, Invalid> {
    let msg: HudiCallback = serde_json::from_slice(body)
        .map_err(|e| invalid(format!("not a Hudi write-commit callback message: {e}")))?;
    msg.into_event(key, source)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What Hudi 1.0.2's HTTP callback posted for an upsert on a MERGE_ON_READ
    /// table written by Spark (captured; one write stat shortened).
    const HUDI_1_0_2_CALLBACK: &[u8] = br#"{"commitTime":"20261207034351669","tableName":"orders","basePath":"/tmp/hcb",
        "hoodieWriteStat":[{"numInserts":0,"numUpdates":0,"numDeletes":0,"fileId":"6efec48f-4e9a-455c-b107-a268daf9d448-0",
        "path":"dt=2024-12-01/.6efec48f-4e9a-455c-b107-a268daf9d448-0_20261207034351669.log.1_0-14-10","cdcStats":null,
        "prevCommit":"20261207034351669","numWrites":1,"numUpdateWrites":1,"totalWriteBytes":938,"totalWriteErrors":0,
        "tempPath":null,"partitionPath":"dt=2024-12-01","fileSizeInBytes":938,"minEventTime":null,"maxEventTime":null,
        "prevBaseFile":null,"runtimeStats":{"totalScanTime":0,"totalUpsertTime":155,"totalCreateTime":0},"logVersion":1,
        "logOffset":0,"baseFile":"","logFiles":[".6efec48f-4e9a-455c-b107-a268daf9d448-0_20261207034351669.log.1_0-14-10"],
        "columnStats":{"empty":false,"present":true}}],
        "commitActionType":{"empty":false,"present":true},"extraMetadata":{"empty":false,"present":true}}"#;

    #[test]
    fn the_real_hudi_1_0_2_callback_is_read() {
        let key = HudiKey::Asset(AssetKey::parse("lake.ods.orders").expect("key"));
        let e = hudi_from_json(HUDI_1_0_2_CALLBACK, &key, EventSource::Push).expect("read");
        assert_eq!(e.sequence, 20261207034351669);
        assert_eq!(e.partitions, ["dt=2024-12-01"]);
        assert_eq!(e.operation, Operation::Append);
        // A plain action and metadata (later Hudi, or the Kafka callback) still read.
        let plain = String::from_utf8_lossy(HUDI_1_0_2_CALLBACK)
            .replace(
                r#""commitActionType":{"empty":false,"present":true}"#,
                r#""commitActionType":"deltacommit""#,
            )
            .replace(
                r#""extraMetadata":{"empty":false,"present":true}"#,
                r#""extraMetadata":{"schema":"{}"}"#,
            );
        let e = hudi_from_json(plain.as_bytes(), &key, EventSource::Push).expect("read");
        assert_eq!(
            e.attributes.get("hudi.action").map(String::as_str),
            Some("deltacommit")
        );
    }

    #[test]
    fn one_notice_and_batches_name_the_bad_item() {
        let one = br#"{"asset_key": "lake.ods.orders", "format": "iceberg", "snapshot_id": 7, "sequence": 3, "commit_time_ms": 1700000000000}"#;
        let e = commits_from_json(one, EventSource::Push).expect("valid");
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].format, TableFormat::Iceberg);
        assert_eq!(e[0].operation, Operation::Append);
        assert!(e[0].id_is_consistent());
        let batch = br#"{"commits": [
            {"asset_key": "lake.ods.orders", "format": "paimon", "snapshot_id": 1, "sequence": 1, "commit_time_ms": 1},
            {"asset_key": "lake.ods", "format": "paimon", "snapshot_id": 2, "sequence": 2, "commit_time_ms": 1}]}"#;
        let err = commits_from_json(batch, EventSource::Push)
            .expect_err("refused")
            .0;
        assert!(err.starts_with("commits[1].asset_key: "), "{err}");
        let unknown = br#"{"asset_key": "lake.ods.orders", "format": "paimon", "snapshot_id": 1, "sequence": 1, "commit_time_ms": 1, "colour": 1}"#;
        assert!(
            commits_from_json(unknown, EventSource::Push)
                .expect_err("refused")
                .0
                .contains("unknown field `colour`")
        );
        let op = br#"{"asset_key": "lake.ods.orders", "format": "paimon", "snapshot_id": 1, "sequence": 1, "commit_time_ms": 1, "operation": "merge"}"#;
        assert_eq!(
            commits_from_json(op, EventSource::Push)
                .expect_err("refused")
                .0,
            "operation: \"merge\" is not one of append, overwrite, compact, delete, other"
        );
    }

    #[test]
    fn hudi_instants_and_actions() {
        assert_eq!(
            hudi_instant("20241201123045123"),
            Ok((20241201123045123, 1_733_056_245_123))
        );
        assert_eq!(
            hudi_instant("20241201123045"),
            Ok((20241201123045000, 1_733_056_245_000))
        );
        assert!(hudi_instant("2024120112").is_err());
        assert!(hudi_instant("20241301123045123").is_err());
        assert_eq!(hudi_operation(Some("deltacommit"), None), Operation::Append);
        // Each table service as itself: a policy counts from its own service.
        assert_eq!(
            hudi_operation(Some("replacecommit"), Some("CLUSTER")),
            Operation::Cluster
        );
        assert_eq!(
            hudi_operation(Some("commit"), Some("COMPACT")),
            Operation::Compact
        );
        assert_eq!(
            hudi_operation(Some("deltacommit"), Some("LOG_COMPACT")),
            Operation::LogCompact
        );
        assert_eq!(
            hudi_operation(Some("replacecommit"), Some("INSERT_OVERWRITE")),
            Operation::Overwrite
        );
        assert_eq!(hudi_operation(Some("clean"), None), Operation::Clean);
        assert_eq!(hudi_operation(Some("rollback"), None), Operation::Other);
    }

    #[test]
    fn hudi_callback_message_becomes_the_same_event_as_its_timeline_instant() {
        let body = br#"{"commitTime": "20241201123045123", "tableName": "Orders", "basePath": "/lake/orders",
            "hoodieWriteStat": [{"fileId": "f1", "partitionPath": "dt=2024-12-01", "numInserts": 10, "numWrites": 10},
                                {"fileId": "f2", "partitionPath": "dt=2024-12-01", "numUpdateWrites": 3}],
            "commitActionType": "commit"}"#;
        let e = hudi_from_json(
            body,
            &HudiKey::Namespace("lake.ods".into()),
            EventSource::Push,
        )
        .expect("valid");
        assert_eq!(e.asset_key.as_str(), "lake.ods.orders");
        assert_eq!(e.sequence, 20241201123045123);
        assert_eq!(e.partitions, ["dt=2024-12-01"]);
        assert_eq!(e.attributes["hudi.inserts"], "10");
        let polled = AssetEvent::committed(
            e.asset_key.clone(),
            TableFormat::Hudi,
            e.sequence,
            e.sequence,
            0,
            EventSource::Poll,
        );
        assert_eq!(polled.event_id, e.event_id);
        assert!(
            hudi_from_json(
                b"{}",
                &HudiKey::Namespace("lake.ods".into()),
                EventSource::Push
            )
            .expect_err("refused")
            .0
            .contains("missing field `commitTime`")
        );
    }
}
