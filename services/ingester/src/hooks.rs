//! Commit hooks on Kafka and CDC: raw topics where writers publish their commits,
//! read in the exactly-once consume-transform-produce loop (offsets commit with the
//! events they produced). A record that is not a commit is dead-lettered with its
//! origin by the loop; consumption goes on.
//!
//! Formats per topic (`SLUICE_HOOK_TOPICS`):
//! - `json`: the generic commit notice (one, or a batch) of `POST /v1/commits`;
//! - `hudi`: Hudi's Kafka write-commit callback message (keyed by table name), the
//!   asset key completed from the topic's `namespace` or given as `asset`;
//! - `avro`: Sluice's own `asset-event.avsc` (single-object or Confluent framing);
//! - `debezium`: Debezium change events of a table that records commits, mapped
//!   column by column: JSON (with or without the schema envelope) or Avro in the
//!   Confluent wire format (told apart by the first byte), the writer schema read
//!   from the topic's `schema_registry` (default `SLUICE_SCHEMA_REGISTRY_URL`).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value};
use sluice_core::{AssetEvent, AssetKey, EventKind, EventSource};
use sluice_kit::codec::CONFLUENT_MAGIC;
use sluice_kit::txn::{Input, Output, ProcessError, Processor};
use sluice_kit::{BlockingCodec, CodecError, ForeignAvro, SchemaName};

use crate::metrics as m;
use crate::normalize::{self, CommitNotice, HudiKey, Invalid};

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookTopic {
    pub topic: String,
    pub format: HookFormat,
    /// `hudi`: the `catalog.namespace` that the message's tableName completes.
    #[serde(default)]
    pub namespace: Option<String>,
    /// `hudi`: one asset for every message of the topic.
    #[serde(default)]
    pub asset: Option<String>,
    /// `debezium`: AssetEvent field → column of the captured table.
    #[serde(default)]
    pub mapping: Option<CdcMapping>,
    /// `debezium`: the registry holding the writer schemas of its Avro events.
    #[serde(default)]
    pub schema_registry: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HookFormat {
    Json,
    Hudi,
    Avro,
    Debezium,
}

/// Which column of the captured commit table holds each AssetEvent field. The
/// defaults are the field names themselves; `format` may be a constant instead.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CdcMapping {
    #[serde(default = "d_asset")]
    pub asset_key: String,
    /// Column holding the table format, or `=iceberg` etc. for a constant.
    #[serde(default = "d_format")]
    pub format: String,
    #[serde(default = "d_snapshot")]
    pub snapshot_id: String,
    #[serde(default = "d_sequence")]
    pub sequence: String,
    #[serde(default = "d_time")]
    pub commit_time_ms: String,
    #[serde(default)]
    pub operation: Option<String>,
    #[serde(default)]
    pub watermark_ms: Option<String>,
    #[serde(default)]
    pub schema_id: Option<String>,
}

fn d_asset() -> String {
    "asset_key".into()
}
fn d_format() -> String {
    "format".into()
}
fn d_snapshot() -> String {
    "snapshot_id".into()
}
fn d_sequence() -> String {
    "sequence".into()
}
fn d_time() -> String {
    "commit_time_ms".into()
}

/// The mapping of a debezium topic that names none.
static DEFAULT_MAPPING: std::sync::LazyLock<CdcMapping> =
    std::sync::LazyLock::new(CdcMapping::default);

impl Default for CdcMapping {
    fn default() -> Self {
        serde_json::from_str("{}").expect("all defaults")
    }
}

pub fn parse_topics(json: &str) -> Result<Vec<HookTopic>, Vec<String>> {
    let topics: Vec<HookTopic> =
        serde_json::from_str(json).map_err(|e| vec![format!("SLUICE_HOOK_TOPICS: {e}")])?;
    let mut problems = Vec::new();
    for t in &topics {
        match t.format {
            HookFormat::Hudi => match (&t.namespace, &t.asset) {
                (Some(_), None) => {}
                (None, Some(a)) => {
                    if let Err(e) = AssetKey::parse(a) {
                        problems.push(format!("hook topic {}: asset: {e}", t.topic));
                    }
                }
                _ => problems.push(format!(
                    "hook topic {}: a hudi topic needs `namespace` or `asset`, not both",
                    t.topic
                )),
            },
            _ if t.namespace.is_some() || t.asset.is_some() => problems.push(format!(
                "hook topic {}: `namespace` / `asset` are for hudi topics",
                t.topic
            )),
            _ => {}
        }
        if t.format != HookFormat::Debezium {
            for (set, field) in [
                (t.mapping.is_some(), "mapping"),
                (t.schema_registry.is_some(), "schema_registry"),
            ] {
                if set {
                    problems.push(format!(
                        "hook topic {}: `{field}` is for debezium topics",
                        t.topic
                    ));
                }
            }
        }
    }
    if problems.is_empty() {
        Ok(topics)
    } else {
        Err(problems)
    }
}

/// What one Debezium change event means.
#[derive(Debug, PartialEq)]
pub enum Change {
    /// Insert / update / snapshot read of a commit row.
    Commit(AssetEvent),
    /// A deleted commit row: the snapshot it recorded is gone (expired).
    Expired(AssetEvent),
    /// A tombstone after a delete (log compaction's marker): nothing happened.
    Tombstone,
}

fn column<'a>(row: &'a Map<String, Value>, col: &str) -> Result<&'a Value, Invalid> {
    row.get(col)
        .filter(|v| !v.is_null())
        .ok_or_else(|| Invalid(format!("column {col:?} is missing or null")))
}

fn as_i64(v: &Value, col: &str) -> Result<i64, Invalid> {
    match v {
        Value::Number(n) => n.as_i64(),
        // Debezium renders BIGINT as a number, NUMERIC/DECIMAL as a string in some modes.
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
    .ok_or_else(|| Invalid(format!("column {col:?}: {v} is not an integer")))
}

fn as_str<'a>(v: &'a Value, col: &str) -> Result<&'a str, Invalid> {
    v.as_str()
        .ok_or_else(|| Invalid(format!("column {col:?}: {v} is not a string")))
}

/// Pure: a Debezium JSON change event (value bytes; `None` = tombstone) → a [`Change`].
pub fn debezium(value: Option<&[u8]>, map: &CdcMapping) -> Result<Change, Invalid> {
    let Some(bytes) = value else {
        return Ok(Change::Tombstone);
    };
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| Invalid(format!("not a Debezium JSON change event: {e}")))?;
    // With the converter's schemas enabled the event is {"schema": …, "payload": …}.
    let envelope = match v.get("payload") {
        Some(p) if v.get("schema").is_some() => p,
        _ => &v,
    };
    debezium_envelope(envelope, map)
}

/// Pure: a Debezium envelope (the JSON payload, or an Avro event read as JSON).
pub fn debezium_envelope(envelope: &Value, map: &CdcMapping) -> Result<Change, Invalid> {
    if envelope.is_null() {
        return Ok(Change::Tombstone);
    }
    let op = envelope
        .get("op")
        .and_then(Value::as_str)
        .ok_or_else(|| Invalid("not a Debezium change event: no `op`".into()))?;
    let (row_field, expired) = match op {
        "c" | "u" | "r" => ("after", false),
        "d" => ("before", true),
        "t" => return Ok(Change::Tombstone), // truncate: no commit is stated
        other => {
            return Err(Invalid(format!(
                "Debezium op {other:?} is not c, u, r, d or t"
            )));
        }
    };
    let row = envelope
        .get(row_field)
        .and_then(Value::as_object)
        .ok_or_else(|| Invalid(format!("Debezium op {op:?} without `{row_field}`")))?;
    let format = match map.format.strip_prefix('=') {
        Some(constant) => constant.to_owned(),
        None => as_str(column(row, &map.format)?, &map.format)?.to_owned(),
    };
    let opt_i64 = |c: &Option<String>| -> Result<Option<i64>, Invalid> {
        match c {
            None => Ok(None),
            Some(c) => match row.get(c) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => as_i64(v, c).map(Some),
            },
        }
    };
    let notice = CommitNotice {
        asset_key: as_str(column(row, &map.asset_key)?, &map.asset_key)?.to_owned(),
        format,
        snapshot_id: as_i64(column(row, &map.snapshot_id)?, &map.snapshot_id)?,
        sequence: as_i64(column(row, &map.sequence)?, &map.sequence)?,
        commit_time_ms: as_i64(column(row, &map.commit_time_ms)?, &map.commit_time_ms)?,
        kind: expired.then(|| "snapshot_expired".to_owned()),
        operation: match &map.operation {
            None => None,
            Some(c) => row.get(c).and_then(Value::as_str).map(str::to_owned),
        },
        watermark_ms: opt_i64(&map.watermark_ms)?,
        schema_id: opt_i64(&map.schema_id)?,
        partitions: Vec::new(),
        quality: None,
        attributes: BTreeMap::from([("cdc.op".to_owned(), op.to_owned())]),
    };
    let event = notice.into_event(EventSource::Cdc)?;
    Ok(if event.kind == EventKind::SnapshotExpired {
        Change::Expired(event)
    } else {
        Change::Commit(event)
    })
}

pub struct Hooks {
    topics: BTreeMap<String, HookTopic>,
    /// Where each hudi topic's asset keys come from (checked by `parse_topics`).
    hudi_keys: BTreeMap<String, HudiKey>,
    /// Writer-schema readers of the debezium topics that have a registry.
    cdc_avro: BTreeMap<String, ForeignAvro>,
    codec: BlockingCodec,
    events_topic: String,
}

impl Hooks {
    pub fn new(
        topics: Vec<HookTopic>,
        registry_url: Option<&str>,
        events_topic: String,
    ) -> Result<Hooks, CodecError> {
        let hudi_keys = topics
            .iter()
            .filter_map(|t| {
                let key = match (&t.asset, &t.namespace) {
                    (Some(a), _) => HudiKey::Asset(AssetKey::parse(a).ok()?),
                    (None, Some(ns)) => HudiKey::Namespace(ns.clone()),
                    (None, None) => return None,
                };
                Some((t.topic.clone(), key))
            })
            .collect();
        let cdc_avro = topics
            .iter()
            .filter(|t| t.format == HookFormat::Debezium)
            .filter_map(|t| {
                let url = t.schema_registry.as_deref().or(registry_url)?;
                Some(ForeignAvro::new(url).map(|r| (t.topic.clone(), r)))
            })
            .collect::<Result<_, _>>()?;
        Ok(Hooks {
            hudi_keys,
            cdc_avro,
            topics: topics.into_iter().map(|t| (t.topic.clone(), t)).collect(),
            codec: BlockingCodec::new(registry_url)?,
            events_topic,
        })
    }

    fn events(&self, hook: &HookTopic, input: &Input<'_>) -> Result<Vec<AssetEvent>, ProcessError> {
        let poison = |e: Invalid| ProcessError::poison(e.0);
        let payload = || {
            input
                .payload
                .ok_or_else(|| ProcessError::poison("a commit hook record without a value"))
        };
        match hook.format {
            HookFormat::Json => {
                normalize::commits_from_json(payload()?, EventSource::KafkaHook).map_err(poison)
            }
            HookFormat::Hudi => {
                let key = self.hudi_keys.get(input.topic).ok_or_else(|| {
                    ProcessError::fatal(format!("hudi hook topic {} without a key", input.topic))
                })?;
                normalize::hudi_from_json(payload()?, key, EventSource::KafkaHook)
                    .map(|e| vec![e])
                    .map_err(poison)
            }
            HookFormat::Avro => {
                let event: AssetEvent = self
                    .codec
                    .decode(SchemaName::AssetEvent, payload()?)
                    .map_err(|e| ProcessError::undecodable(&e))?;
                if !event.id_is_consistent() {
                    return Err(ProcessError::poison(format!(
                        "event_id {} is not the id derived from its fields",
                        event.event_id
                    )));
                }
                Ok(vec![event])
            }
            HookFormat::Debezium => {
                let map = hook.mapping.as_ref().unwrap_or(&DEFAULT_MAPPING);
                let change = match input.payload {
                    Some([CONFLUENT_MAGIC, ..]) => {
                        let reader = self.cdc_avro.get(input.topic).ok_or_else(|| {
                            ProcessError::poison(format!(
                                "a Confluent-framed Avro change event, but topic {} has no \
                                 schema_registry (nor SLUICE_SCHEMA_REGISTRY_URL) to read its \
                                 writer schema from",
                                input.topic
                            ))
                        })?;
                        let envelope = reader
                            .read_json(payload()?)
                            .map_err(|e| ProcessError::undecodable(&e))?;
                        debezium_envelope(&envelope, map)
                    }
                    json => debezium(json, map),
                };
                match change.map_err(poison)? {
                    Change::Tombstone => Ok(Vec::new()),
                    Change::Commit(e) | Change::Expired(e) => Ok(vec![e]),
                }
            }
        }
    }
}

impl Processor for Hooks {
    fn process(&mut self, input: &Input<'_>) -> Result<Vec<Output>, ProcessError> {
        let hook = self.topics.get(input.topic).ok_or_else(|| {
            ProcessError::fatal(format!("record of unconfigured topic {}", input.topic))
        })?;
        let events = self.events(hook, input)?;
        metrics::counter!(m::HOOK_EVENTS_TOTAL, "topic" => input.topic.to_owned())
            .increment(events.len() as u64);
        events
            .iter()
            .map(|e| {
                let bytes = self
                    .codec
                    .encode(SchemaName::AssetEvent, &self.events_topic, e)
                    .map_err(|err| ProcessError::unencodable("an asset event", &err))?;
                Ok(Output::keyed(
                    &self.events_topic,
                    e.asset_key.as_str(),
                    bytes,
                ))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROW: &str = r#"{"asset_key": "lake.ods.orders", "format": "paimon", "snapshot_id": 12, "sequence": 12, "commit_time_ms": 1700000000000}"#;

    #[test]
    fn debezium_envelopes_deletes_and_tombstones() {
        let map = CdcMapping::default();
        let plain = format!(r#"{{"before": null, "after": {ROW}, "op": "c", "ts_ms": 1}}"#);
        let Change::Commit(e) = debezium(Some(plain.as_bytes()), &map).expect("valid") else {
            panic!("a commit")
        };
        assert_eq!((e.sequence, e.source), (12, EventSource::Cdc));
        let with_schema = format!(
            r#"{{"schema": {{"type": "struct"}}, "payload": {{"before": null, "after": {ROW}, "op": "r"}}}}"#
        );
        let Ok(Change::Commit(r)) = debezium(Some(with_schema.as_bytes()), &map) else {
            panic!("a commit")
        };
        assert_eq!(
            r.event_id, e.event_id,
            "a snapshot read (r) of the same row is the same event"
        );
        let delete = format!(r#"{{"before": {ROW}, "after": null, "op": "d"}}"#);
        assert!(
            matches!(debezium(Some(delete.as_bytes()), &map), Ok(Change::Expired(x)) if x.kind == EventKind::SnapshotExpired)
        );
        assert_eq!(debezium(None, &map), Ok(Change::Tombstone));
        let bad = r#"{"before": null, "after": {"asset_key": "lake.ods.orders"}, "op": "c"}"#;
        assert_eq!(
            debezium(Some(bad.as_bytes()), &map).expect_err("refused").0,
            "column \"format\" is missing or null"
        );
    }

    #[test]
    fn debezium_only_options_are_refused_elsewhere() {
        let topics = r#"[{"topic": "t", "format": "json", "schema_registry": "http://r:8081"},
            {"topic": "u", "format": "debezium", "schema_registry": "http://r:8081"}]"#;
        assert_eq!(
            parse_topics(topics).expect_err("refused"),
            ["hook topic t: `schema_registry` is for debezium topics"]
        );
    }

    #[test]
    fn mapping_renames_columns_and_constants() {
        let map: CdcMapping = serde_json::from_str(
            r#"{"asset_key": "tbl", "format": "=iceberg", "snapshot_id": "snap", "sequence": "seq", "commit_time_ms": "at"}"#,
        )
        .expect("mapping");
        let ev = r#"{"after": {"tbl": "lake.ods.pay", "snap": "99", "seq": 4, "at": 1700000000000}, "op": "u"}"#;
        let Ok(Change::Commit(e)) = debezium(Some(ev.as_bytes()), &map) else {
            panic!("a commit")
        };
        assert_eq!(
            (e.snapshot_id, e.sequence, e.format.as_str()),
            (99, 4, "ICEBERG")
        );
    }
}
