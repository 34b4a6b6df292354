//! Codec tests: every example payload under its schema, typed round trips, garbage.

use std::collections::BTreeMap;

use apache_avro::Schema;
use apache_avro::types::Value;
use proptest::prelude::*;
use sluice_core::{AssetEvent, AssetKey, AssetState, EventSource, TableFormat};
use sluice_kit::SchemaName;
use sluice_kit::codec::{self, Codec, CodecError};
use sluice_kit::wire::StateRecord;

/// JSON → Avro value, guided by the schema (unions: null, else the first branch that fits).
fn json_to_avro(
    json: &serde_json::Value,
    schema: &Schema,
    names: &BTreeMap<String, Schema>,
) -> Result<Value, String> {
    use serde_json::Value as J;
    match (schema, json) {
        (Schema::Ref { name }, _) => {
            let s = names
                .get(&name.fullname(None))
                .ok_or(format!("unknown ref {name:?}"))?;
            json_to_avro(json, s, names)
        }
        (Schema::Null, J::Null) => Ok(Value::Null),
        (Schema::Boolean, J::Bool(b)) => Ok(Value::Boolean(*b)),
        (Schema::Int, J::Number(n)) => Ok(Value::Int(n.as_i64().ok_or("int")? as i32)),
        (Schema::Long, J::Number(n)) => Ok(Value::Long(n.as_i64().ok_or("long")?)),
        (Schema::String, J::String(s)) => Ok(Value::String(s.clone())),
        (Schema::Enum(e), J::String(s)) => {
            let i = e
                .symbols
                .iter()
                .position(|x| x == s)
                .ok_or(format!("{s} not in enum"))?;
            Ok(Value::Enum(i as u32, s.clone()))
        }
        (Schema::Array(a), J::Array(items)) => Ok(Value::Array(
            items
                .iter()
                .map(|i| json_to_avro(i, &a.items, names))
                .collect::<Result<_, _>>()?,
        )),
        (Schema::Map(m), J::Object(o)) => Ok(Value::Map(
            o.iter()
                .map(|(k, v)| Ok((k.clone(), json_to_avro(v, &m.types, names)?)))
                .collect::<Result<_, String>>()?,
        )),
        (Schema::Union(u), j) => {
            for (i, branch) in u.variants().iter().enumerate() {
                if let Ok(v) = json_to_avro(j, branch, names) {
                    return Ok(Value::Union(i as u32, Box::new(v)));
                }
            }
            Err(format!("no union branch fits {j}"))
        }
        (Schema::Record(r), J::Object(o)) => {
            let mut fields = Vec::new();
            for f in &r.fields {
                let v = o.get(&f.name).ok_or(format!("missing field {}", f.name))?;
                fields.push((f.name.clone(), json_to_avro(v, &f.schema, names)?));
            }
            if let Some(extra) = o.keys().find(|k| !r.fields.iter().any(|f| &f.name == *k)) {
                return Err(format!("unknown field {extra}"));
            }
            Ok(Value::Record(fields))
        }
        (s, j) => Err(format!("{j} does not fit {s:?}")),
    }
}

/// Drops from `json`, at every depth, the record fields `schema` does not have:
/// an example of today's schema as an older schema would have written it.
fn keep_only_fields_of(
    json: &mut serde_json::Value,
    schema: &Schema,
    names: &BTreeMap<String, Schema>,
) {
    use serde_json::Value as J;
    match (schema, json) {
        (Schema::Ref { name }, j) => {
            if let Some(s) = names.get(&name.fullname(None)) {
                keep_only_fields_of(j, s, names);
            }
        }
        (Schema::Array(a), J::Array(items)) => {
            for i in items {
                keep_only_fields_of(i, &a.items, names);
            }
        }
        (Schema::Union(u), j @ J::Object(_)) => {
            for branch in u.variants() {
                keep_only_fields_of(j, branch, names);
            }
        }
        (Schema::Record(r), J::Object(o)) => {
            o.retain(|k, _| r.fields.iter().any(|f| &f.name == k));
            for f in &r.fields {
                if let Some(v) = o.get_mut(&f.name) {
                    keep_only_fields_of(v, &f.schema, names);
                }
            }
        }
        _ => {}
    }
}

fn named_types(schema: &Schema, out: &mut BTreeMap<String, Schema>) {
    match schema {
        Schema::Record(r) => {
            out.insert(r.name.fullname(None), schema.clone());
            for f in &r.fields {
                named_types(&f.schema, out);
            }
        }
        Schema::Enum(e) => {
            out.insert(e.name.fullname(None), schema.clone());
        }
        Schema::Array(a) => named_types(&a.items, out),
        Schema::Map(m) => named_types(&m.types, out),
        Schema::Union(u) => u.variants().iter().for_each(|v| named_types(v, out)),
        _ => {}
    }
}

fn example(name: SchemaName) -> serde_json::Value {
    let path = format!(
        "{}/../../schemas/examples/{}.json",
        env!("CARGO_MANIFEST_DIR"),
        name.file_stem()
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn every_example_fits_its_schema_and_round_trips() {
    for name in SchemaName::ALL {
        let schema = name.schema();
        let mut names = BTreeMap::new();
        named_types(schema, &mut names);
        let value = json_to_avro(&example(name), schema, &names)
            .unwrap_or_else(|e| panic!("example {} does not fit: {e}", name.file_stem()));
        let bytes = codec::encode_datum(schema, value.clone(), name.file_stem()).expect("encodes");
        let back = codec::decode_datum(schema, &bytes, name.file_stem()).expect("decodes");
        assert_eq!(back, value, "{}", name.file_stem());
    }
}

/// The example's datum decoded into the Rust type the services use, and that type
/// encoded again: the same datum, so no field is lost or reshaped on the way. (Equal
/// as Avro values, and byte-equal up to the order of map entries, which Avro leaves
/// to the writer.)
fn round_trips_through<T: serde::Serialize + serde::de::DeserializeOwned>(name: SchemaName) {
    let schema = name.schema();
    let mut names = BTreeMap::new();
    named_types(schema, &mut names);
    let value = json_to_avro(&example(name), schema, &names).expect("fits");
    let bytes = codec::encode_datum(schema, value, name.file_stem()).expect("encodes");
    let decoded = codec::decode_datum(schema, &bytes, name.file_stem()).expect("decodes");
    let typed: T = codec::from_avro(name, &decoded)
        .unwrap_or_else(|e| panic!("{} into its Rust type: {e}", name.file_stem()));
    let again = codec::to_avro(name, &typed).expect("to avro");
    let bytes_again = codec::encode_datum(schema, again, name.file_stem()).expect("encodes");
    assert_eq!(
        bytes_again.len(),
        bytes.len(),
        "{} round trip",
        name.file_stem()
    );
    let decoded_again =
        codec::decode_datum(schema, &bytes_again, name.file_stem()).expect("decodes");
    assert_eq!(decoded_again, decoded, "{} round trip", name.file_stem());
}

#[test]
fn every_example_decodes_into_its_rust_type_and_encodes_byte_equal() {
    use sluice_kit::wire::{
        DeclaredResource, ProgressRecord, RunRecord, TriggerRecord, WireGrant, WireSpec,
    };
    for name in SchemaName::ALL {
        match name {
            SchemaName::AssetEvent => round_trips_through::<AssetEvent>(name),
            SchemaName::AssetState => round_trips_through::<StateRecord>(name),
            SchemaName::DependencySpec => round_trips_through::<WireSpec>(name),
            SchemaName::ResolverProgress => round_trips_through::<ProgressRecord>(name),
            SchemaName::TriggerRequest => round_trips_through::<TriggerRecord>(name),
            SchemaName::RunStatus => round_trips_through::<RunRecord>(name),
            SchemaName::Grant => round_trips_through::<WireGrant>(name),
            SchemaName::DeclaredResource => round_trips_through::<DeclaredResource>(name),
        }
    }
}

#[test]
fn key_schemas_parse() {
    for stem in ["asset-key", "dependency-id", "trigger-key"] {
        let path = format!(
            "{}/../../schemas/{stem}.key.avsc",
            env!("CARGO_MANIFEST_DIR")
        );
        let s = Schema::parse_str(&std::fs::read_to_string(path).expect("file")).expect("parses");
        assert_eq!(s, Schema::String);
    }
}

#[test]
fn the_example_event_decodes_into_the_core_type() {
    let event: AssetEvent =
        serde_json::from_value(example(SchemaName::AssetEvent)).expect("core type");
    assert!(
        event.id_is_consistent(),
        "the example's event_id is the derived one"
    );
}

fn event() -> AssetEvent {
    let mut e = AssetEvent::committed(
        AssetKey::parse("lake.ods.order_latest").expect("valid"),
        TableFormat::Paimon,
        4242,
        42,
        1_764_633_600_000,
        EventSource::Poll,
    );
    e.watermark_ms = Some(5);
    e.partitions = vec!["dt=2026-12-01".into()];
    e.attributes.insert("k".into(), "v".into());
    e
}

#[tokio::test]
async fn single_object_round_trips_core_types() {
    let c = Codec::new(None);
    let e = event();
    let bytes = c
        .encode(SchemaName::AssetEvent, "t", &e)
        .await
        .expect("encode");
    assert_eq!(&bytes[..2], &codec::SINGLE_OBJECT_MAGIC);
    assert_eq!(&bytes[2..10], &codec::fingerprint(SchemaName::AssetEvent));
    let back: AssetEvent = c
        .decode(SchemaName::AssetEvent, &bytes)
        .await
        .expect("decode");
    assert_eq!(back, e);

    let state = AssetState::fold_all([&e]).expect("state");
    let rec = StateRecord::new(&state, 7);
    let bytes = c
        .encode(SchemaName::AssetState, "t", &rec)
        .await
        .expect("encode");
    let back: StateRecord = c
        .decode(SchemaName::AssetState, &bytes)
        .await
        .expect("decode");
    assert_eq!(back.clone().into_state().expect("valid"), (state, 7));
}

#[tokio::test]
async fn garbage_is_a_typed_error() {
    let c = Codec::new(None);
    let good = c
        .encode(SchemaName::AssetEvent, "t", &event())
        .await
        .expect("encode");
    let decode = |b: Vec<u8>| {
        let c = &c;
        async move { c.decode::<AssetEvent>(SchemaName::AssetEvent, &b).await }
    };
    assert!(matches!(decode(vec![]).await, Err(CodecError::Empty)));
    assert!(matches!(
        decode(vec![0xC3, 0x01, 0x00]).await,
        Err(CodecError::Truncated { len: 3, .. })
    ));
    assert!(matches!(
        decode(vec![0x00, 0x00, 0x00, 0x01, 0x02]).await,
        Err(CodecError::WrongMagic { .. })
    ));
    // A record of another schema: an AssetState where an AssetEvent is expected.
    let state = StateRecord::new(&AssetState::fold_all([&event()]).expect("state"), 1);
    let other = c
        .encode(SchemaName::AssetState, "t", &state)
        .await
        .expect("encode");
    assert!(matches!(
        decode(other).await,
        Err(CodecError::UnknownFingerprint { .. })
    ));
    let mut truncated = good.clone();
    truncated.truncate(good.len() - 3);
    assert!(matches!(
        decode(truncated).await,
        Err(CodecError::Datum { .. })
    ));
    let mut trailing = good;
    trailing.push(0);
    assert!(matches!(
        decode(trailing).await,
        Err(CodecError::Trailing { .. })
    ));
}

#[test]
fn an_invalid_asset_key_in_a_well_formed_record_is_refused() {
    let mut value = codec::to_avro(SchemaName::AssetEvent, &event()).expect("value");
    if let Value::Record(fields) = &mut value {
        fields[1].1 = Value::String("NOT A KEY".into());
    }
    let err = codec::from_avro::<AssetEvent>(SchemaName::AssetEvent, &value).expect_err("bad key");
    assert!(err.to_string().contains("asset key"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3_000))]

    /// Random bytes (with and without a valid header) never panic the decoder.
    #[test]
    fn random_bytes_never_panic(mut bytes in proptest::collection::vec(any::<u8>(), 0..256), with_header in any::<bool>()) {
        if with_header {
            let mut framed = codec::SINGLE_OBJECT_MAGIC.to_vec();
            framed.extend_from_slice(&codec::fingerprint(SchemaName::AssetEvent));
            framed.extend_from_slice(&bytes);
            bytes = framed;
        }
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let c = Codec::new(None);
        for name in SchemaName::ALL {
            let _ = rt.block_on(c.decode::<serde_json::Value>(name, &bytes));
        }
        let r = rt.block_on(c.decode::<AssetEvent>(SchemaName::AssetEvent, &bytes));
        prop_assert!(r.is_err() || with_header);
    }
}

/// A record written before a schema gained fields (by a Sluice of the previous
/// version, still on the compacted topic) is read, the new fields at their defaults.
#[test]
fn a_record_written_under_an_earlier_schema_is_read_with_the_new_defaults() {
    use sluice_kit::wire::{TriggerOrigin, TriggerRecord, WireSpec};
    fn written_under_earlier(name: SchemaName) -> Vec<u8> {
        let old = Schema::parse_str(name.history()[0]).expect("history parses");
        let mut names = BTreeMap::new();
        named_types(&old, &mut names);
        let mut json = example(name);
        keep_only_fields_of(&mut json, &old, &names);
        let value = json_to_avro(&json, &old, &names).expect("fits the old schema");
        let mut bytes = codec::SINGLE_OBJECT_MAGIC.to_vec();
        let fp = old.fingerprint::<apache_avro::rabin::Rabin>();
        bytes.extend_from_slice(&fp.bytes[..8]);
        bytes.extend(codec::encode_datum(&old, value, name.file_stem()).expect("encodes"));
        bytes
    }
    let c = sluice_kit::BlockingCodec::new(None).expect("codec");
    let spec: WireSpec = c
        .decode(
            SchemaName::DependencySpec,
            &written_under_earlier(SchemaName::DependencySpec),
        )
        .expect("an earlier spec decodes");
    assert!(!spec.paused);
    assert!(spec.schema_acknowledged.is_empty());
    let t: TriggerRecord = c
        .decode(
            SchemaName::TriggerRequest,
            &written_under_earlier(SchemaName::TriggerRequest),
        )
        .expect("an earlier trigger decodes");
    assert_eq!((t.origin, t.rerun_of), (TriggerOrigin::Data, None));
    // A fingerprint of no version at all is still refused.
    let mut unknown = written_under_earlier(SchemaName::DependencySpec);
    unknown[2] ^= 0xff;
    assert!(matches!(
        c.decode::<WireSpec>(SchemaName::DependencySpec, &unknown),
        Err(CodecError::UnknownFingerprint { .. })
    ));
}
