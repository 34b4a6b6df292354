//! Avro codecs for every topic value.
//!
//! Two wire formats, chosen by configuration:
//!
//! * **Confluent wire format** (`0x00 ‖ schema id: u32 BE ‖ datum`) through a schema
//!   registry when `SLUICE_SCHEMA_REGISTRY_URL` is set. Schemas are registered under
//!   `<topic>-value` (TopicNameStrategy) on first use.
//! * **Avro single-object encoding** (`0xC3 0x01 ‖ CRC-64-AVRO fingerprint: 8 bytes LE ‖
//!   datum`) otherwise: self-describing enough to refuse a record of another schema,
//!   with no registry to run.
//!
//! Keys are never Avro: they are the raw UTF-8 of the asset key / dependency id /
//! trigger key, so compaction sees one byte string per logical key (see
//! `docs/decisions/0001-raw-utf8-keys.md`).
//!
//! Decoding is total: any byte string gives a value or a [`CodecError`], never a panic.

use std::io::Cursor;

use apache_avro::Schema;
use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::types::Value;
use apache_avro::writer::datum::GenericDatumWriter;
use schema_registry_converter::async_impl::avro::{AvroDecoder, AvroEncoder};
use schema_registry_converter::async_impl::schema_registry::SrSettings;
use schema_registry_converter::avro_common::get_supplied_schema;
use schema_registry_converter::schema_registry_common::SubjectNameStrategy;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::schemas::SchemaName;
use crate::wire::StateRecord;

/// First two bytes of Avro single-object encoding.
pub const SINGLE_OBJECT_MAGIC: [u8; 2] = [0xC3, 0x01];
/// Largest single allocation a decode may make (a record, an array, a string).
pub const MAX_ALLOCATION_BYTES: usize = 16 * 1024 * 1024;
/// Magic byte of the Confluent wire format.
pub const CONFLUENT_MAGIC: u8 = 0x00;

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("empty payload")]
    Empty,
    #[error("payload of {len} byte(s) is shorter than the {need}-byte header")]
    Truncated { len: usize, need: usize },
    #[error("wrong magic byte(s) {found:02x?}; expected {expected:02x?}")]
    WrongMagic { found: Vec<u8>, expected: Vec<u8> },
    #[error("record was written with schema fingerprint {found}, not {expected} ({schema})")]
    UnknownFingerprint {
        found: String,
        expected: String,
        schema: &'static str,
    },
    #[error("payload does not decode as {schema}: {message}")]
    Datum {
        schema: &'static str,
        message: String,
    },
    #[error("{trailing} byte(s) left over after a complete {schema} record")]
    Trailing {
        schema: &'static str,
        trailing: usize,
    },
    #[error("decoded {schema} does not map to the expected type: {message}")]
    Shape {
        schema: &'static str,
        message: String,
    },
    #[error("value does not fit schema {schema}: {message}")]
    Encode {
        schema: &'static str,
        message: String,
    },
    #[error("schema registry: {message}")]
    Registry { message: String, retriable: bool },
}

impl CodecError {
    /// True when the same bytes may decode later (a registry outage), false for bad bytes.
    pub fn is_retriable(&self) -> bool {
        matches!(
            self,
            CodecError::Registry {
                retriable: true,
                ..
            }
        )
    }
}

/// Encodes and decodes topic values.
pub enum Codec {
    SingleObject,
    Registry(Box<Registry>),
}

pub struct Registry {
    encoder: AvroEncoder,
    decoder: AvroDecoder,
}

impl Codec {
    /// The registry codec when a URL is given, single-object encoding otherwise.
    pub fn new(registry_url: Option<&str>) -> Codec {
        limit_allocations();
        match registry_url {
            Some(url) => {
                let settings = registry_settings(url);
                Codec::Registry(Box::new(Registry {
                    encoder: AvroEncoder::new(settings.clone()),
                    decoder: AvroDecoder::new(settings),
                }))
            }
            None => Codec::SingleObject,
        }
    }

    pub async fn encode<T: Serialize>(
        &self,
        name: SchemaName,
        topic: &str,
        value: &T,
    ) -> Result<Vec<u8>, CodecError> {
        match self {
            Codec::SingleObject => encode_single_object(name, value),
            Codec::Registry(r) => {
                let avro = to_avro(name, value)?;
                let strategy = SubjectNameStrategy::TopicNameStrategyWithSchema(
                    topic.to_owned(),
                    false,
                    get_supplied_schema(name.schema()),
                );
                r.encoder
                    .encode_value(avro, &strategy)
                    .await
                    .map_err(registry_error)
            }
        }
    }

    pub async fn decode<T: DeserializeOwned>(
        &self,
        name: SchemaName,
        bytes: &[u8],
    ) -> Result<T, CodecError> {
        let value = match self {
            Codec::SingleObject => return decode_single_object(name, bytes),
            Codec::Registry(r) => {
                check_confluent_header(bytes)?;
                let decoded = r
                    .decoder
                    .decode(Some(bytes))
                    .await
                    .map_err(registry_error)?;
                // The writer schema came from the registry; resolve it into ours so a
                // record of another schema is refused instead of half-read.
                decoded
                    .value
                    .resolve(name.schema())
                    .map_err(|e| CodecError::Shape {
                        schema: name.file_stem(),
                        message: e.to_string(),
                    })?
            }
        };
        from_avro(name, &value)
    }
}

/// The codec for blocking code — the transactional loop's processors and the
/// changelog readers, which run on threads of their own. Single-object encoding is
/// plain computation; a registry fetch runs on the async runtime the codec was made
/// on (or on a small runtime of its own when made outside one), so no processor
/// carries a runtime handle.
pub enum BlockingCodec {
    SingleObject,
    Registry { codec: Codec, runtime: Driver },
}

/// Where a registry fetch runs.
pub enum Driver {
    Shared(tokio::runtime::Handle),
    Own(tokio::runtime::Runtime),
}

impl BlockingCodec {
    pub fn new(registry_url: Option<&str>) -> Result<BlockingCodec, CodecError> {
        let codec = Codec::new(registry_url);
        if let Codec::SingleObject = codec {
            return Ok(BlockingCodec::SingleObject);
        }
        Ok(BlockingCodec::Registry {
            codec,
            runtime: Driver::here()?,
        })
    }

    pub fn encode<T: Serialize>(
        &self,
        name: SchemaName,
        topic: &str,
        value: &T,
    ) -> Result<Vec<u8>, CodecError> {
        match self {
            BlockingCodec::SingleObject => encode_single_object(name, value),
            BlockingCodec::Registry { codec, runtime } => {
                runtime.wait(codec.encode(name, topic, value))
            }
        }
    }

    pub fn decode<T: DeserializeOwned>(
        &self,
        name: SchemaName,
        bytes: &[u8],
    ) -> Result<T, CodecError> {
        match self {
            BlockingCodec::SingleObject => decode_single_object(name, bytes),
            BlockingCodec::Registry { codec, runtime } => runtime.wait(codec.decode(name, bytes)),
        }
    }

    /// An asset-state record. Restores read these by the million: one framed
    /// with the current schema's fingerprint is read by the hand reader of that
    /// schema ([`crate::wire::asset_state::read_datum`]), any other (an earlier
    /// schema, the registry's framing) by the generic reader.
    pub fn decode_state(&self, bytes: &[u8]) -> Result<StateRecord, CodecError> {
        let name = SchemaName::AssetState;
        match (self, bytes.get(..2), bytes.get(2..10)) {
            (BlockingCodec::SingleObject, Some(magic), Some(print))
                if magic == SINGLE_OBJECT_MAGIC && print == fingerprint(name) =>
            {
                crate::wire::asset_state::read_datum(&bytes[10..]).map_err(|message| {
                    CodecError::Datum {
                        schema: name.file_stem(),
                        message,
                    }
                })
            }
            _ => self.decode(name, bytes),
        }
    }
}

impl Driver {
    /// The async runtime this is called on, or a small one of its own outside one.
    fn here() -> Result<Driver, CodecError> {
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => Ok(Driver::Shared(handle)),
            Err(_) => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map(Driver::Own)
                .map_err(|e| CodecError::Registry {
                    message: format!("cannot start the registry client's runtime: {e}"),
                    retriable: false,
                }),
        }
    }

    fn wait<F: std::future::Future>(&self, f: F) -> F::Output {
        match self {
            Driver::Shared(h) => h.block_on(f),
            Driver::Own(rt) => rt.block_on(f),
        }
    }
}

/// Reads Confluent-framed Avro whose schema Sluice does not own (a Debezium change
/// event): the writer schema comes from the registry by the id in the frame, and the
/// value is returned as written, for the caller to interpret. Blocking, like
/// [`BlockingCodec`]: it is read on the transactional loop's thread.
pub struct ForeignAvro {
    decoder: AvroDecoder,
    runtime: Driver,
}

impl ForeignAvro {
    pub fn new(registry_url: &str) -> Result<ForeignAvro, CodecError> {
        limit_allocations();
        Ok(ForeignAvro {
            decoder: AvroDecoder::new(registry_settings(registry_url)),
            runtime: Driver::here()?,
        })
    }

    /// The datum under its writer schema, as JSON: unions unwrap to their branch,
    /// records become objects, int/long numbers (the shape of Kafka Connect's JSON
    /// converter payload). An unreachable registry is retriable; an unknown id or
    /// bytes that do not fit the schema are not.
    pub fn read_json(&self, bytes: &[u8]) -> Result<serde_json::Value, CodecError> {
        check_confluent_header(bytes)?;
        let decoded = self
            .runtime
            .wait(self.decoder.decode(Some(bytes)))
            .map_err(registry_error)?;
        serde_json::Value::try_from(decoded.value).map_err(|e| CodecError::Datum {
            schema: "writer schema",
            message: e.to_string(),
        })
    }
}

/// A corrupt length prefix must not make the decoder allocate gigabytes.
fn limit_allocations() {
    apache_avro::util::max_allocation_bytes(MAX_ALLOCATION_BYTES);
}

fn registry_settings(url: &str) -> SrSettings {
    SrSettings::new(url.trim_end_matches('/').to_owned())
}

fn registry_error(e: schema_registry_converter::error::SRCError) -> CodecError {
    CodecError::Registry {
        retriable: e.retriable,
        message: e.to_string(),
    }
}

fn check_confluent_header(bytes: &[u8]) -> Result<(), CodecError> {
    match bytes {
        [] => Err(CodecError::Empty),
        [m, ..] if *m != CONFLUENT_MAGIC => Err(CodecError::WrongMagic {
            found: vec![*m],
            expected: vec![CONFLUENT_MAGIC],
        }),
        b if b.len() < 5 => Err(CodecError::Truncated {
            len: b.len(),
            need: 5,
        }),
        _ => Ok(()),
    }
}

/// The 8-byte little-endian CRC-64-AVRO fingerprint of a schema's canonical form.
pub fn fingerprint(name: SchemaName) -> [u8; 8] {
    name.compiled().fingerprint
}

pub fn to_avro<T: Serialize>(name: SchemaName, value: &T) -> Result<Value, CodecError> {
    let encode_err = |e: apache_avro::Error| CodecError::Encode {
        schema: name.file_stem(),
        message: e.to_string(),
    };
    apache_avro::to_value(value)
        .map_err(encode_err)?
        .resolve_with_names(name.schema(), name.compiled().resolved.get_names())
        .map_err(encode_err)
}

pub fn from_avro<T: DeserializeOwned>(name: SchemaName, value: &Value) -> Result<T, CodecError> {
    apache_avro::from_value(value).map_err(|e| CodecError::Shape {
        schema: name.file_stem(),
        message: e.to_string(),
    })
}

pub fn encode_datum(
    schema: &Schema,
    value: Value,
    stem: &'static str,
) -> Result<Vec<u8>, CodecError> {
    let err = |e: apache_avro::Error| CodecError::Encode {
        schema: stem,
        message: e.to_string(),
    };
    GenericDatumWriter::builder(schema)
        .build()
        .map_err(err)?
        .write_value_to_vec(value)
        .map_err(err)
}

pub fn decode_datum(
    schema: &Schema,
    bytes: &[u8],
    stem: &'static str,
) -> Result<Value, CodecError> {
    let reader = GenericDatumReader::builder(schema)
        .build()
        .map_err(|e| CodecError::Datum {
            schema: stem,
            message: e.to_string(),
        })?;
    read_all(&reader, bytes, stem)
}

/// One datum that must use every byte.
fn read_all(
    reader: &GenericDatumReader<'_>,
    bytes: &[u8],
    stem: &'static str,
) -> Result<Value, CodecError> {
    let err = |e: apache_avro::Error| CodecError::Datum {
        schema: stem,
        message: e.to_string(),
    };
    let mut cursor = Cursor::new(bytes);
    let value = reader.read_value(&mut cursor).map_err(err)?;
    let trailing = bytes.len() - usize::try_from(cursor.position()).unwrap_or(bytes.len());
    if trailing > 0 {
        return Err(CodecError::Trailing {
            schema: stem,
            trailing,
        });
    }
    Ok(value)
}

/// Serializes straight from serde into Avro bytes, with no intermediate `Value`
/// (building, validating and resolving a `Value` tree cost most of the encode time).
fn encode_single_object<T: Serialize>(name: SchemaName, value: &T) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(&SINGLE_OBJECT_MAGIC);
    out.extend_from_slice(&fingerprint(name));
    name.compiled()
        .writer
        .write_ser(&mut out, value)
        .map_err(|e| CodecError::Encode {
            schema: name.file_stem(),
            message: e.to_string(),
        })?;
    Ok(out)
}

fn decode_single_object<T: DeserializeOwned>(
    name: SchemaName,
    bytes: &[u8],
) -> Result<T, CodecError> {
    if bytes.is_empty() {
        return Err(CodecError::Empty);
    }
    let magic = &bytes[..bytes.len().min(2)];
    if magic != &SINGLE_OBJECT_MAGIC[..magic.len()] {
        return Err(CodecError::WrongMagic {
            found: magic.to_vec(),
            expected: SINGLE_OBJECT_MAGIC.to_vec(),
        });
    }
    if bytes.len() < 10 {
        return Err(CodecError::Truncated {
            len: bytes.len(),
            need: 10,
        });
    }
    let expected = fingerprint(name);
    if bytes[2..10] != expected {
        // Written under an earlier version of the schema: read with that one,
        // resolved into the current one (new fields take their defaults).
        if let Some(writer) = name.earlier(&bytes[2..10]) {
            let value = decode_datum(writer, &bytes[10..], name.file_stem())?
                .resolve(name.schema())
                .map_err(|e| CodecError::Shape {
                    schema: name.file_stem(),
                    message: e.to_string(),
                })?;
            return from_avro(name, &value);
        }
        return Err(CodecError::UnknownFingerprint {
            found: hex(&bytes[2..10]),
            expected: hex(&expected),
            schema: name.file_stem(),
        });
    }
    let stem = name.file_stem();
    let body = &bytes[10..];
    let mut cursor = Cursor::new(body);
    // Straight into `T` (no `Value` tree). A datum that does not fit the schema, or
    // does not fit `T`, is one typed error either way.
    let value = name
        .compiled()
        .reader
        .read_deser::<T>(&mut cursor)
        .map_err(|e| CodecError::Datum {
            schema: stem,
            message: e.to_string(),
        })?;
    let trailing = body.len() - usize::try_from(cursor.position()).unwrap_or(body.len());
    if trailing > 0 {
        return Err(CodecError::Trailing {
            schema: stem,
            trailing,
        });
    }
    Ok(value)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
