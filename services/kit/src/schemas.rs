//! The Avro schemas of `schemas/`, compiled in so a service can never run with
//! a schema file other than the one its code was tested against.

use std::sync::OnceLock;

use apache_avro::Schema;
use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::schema::ResolvedSchema;
use apache_avro::writer::datum::GenericDatumWriter;

/// Every value schema, by the topic role it describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SchemaName {
    AssetEvent,
    AssetState,
    DependencySpec,
    ResolverProgress,
    TriggerRequest,
    RunStatus,
    Grant,
    DeclaredResource,
}

impl SchemaName {
    pub const ALL: [SchemaName; 8] = [
        SchemaName::AssetEvent,
        SchemaName::AssetState,
        SchemaName::DependencySpec,
        SchemaName::ResolverProgress,
        SchemaName::TriggerRequest,
        SchemaName::RunStatus,
        SchemaName::Grant,
        SchemaName::DeclaredResource,
    ];

    /// Position in [`SchemaName::ALL`] (declaration order).
    fn index(self) -> usize {
        self as usize
    }

    /// The file under `schemas/` (and `schemas/examples/` with `.json`).
    pub fn file_stem(self) -> &'static str {
        match self {
            SchemaName::AssetEvent => "asset-event",
            SchemaName::AssetState => "asset-state",
            SchemaName::DependencySpec => "dependency-spec",
            SchemaName::ResolverProgress => "resolver-progress",
            SchemaName::TriggerRequest => "trigger-request",
            SchemaName::RunStatus => "run-status",
            SchemaName::Grant => "grant",
            SchemaName::DeclaredResource => "declared-resource",
        }
    }

    pub fn source(self) -> &'static str {
        match self {
            SchemaName::AssetEvent => include_str!("../../../schemas/asset-event.avsc"),
            SchemaName::AssetState => include_str!("../../../schemas/asset-state.avsc"),
            SchemaName::DependencySpec => include_str!("../../../schemas/dependency-spec.avsc"),
            SchemaName::ResolverProgress => include_str!("../../../schemas/resolver-progress.avsc"),
            SchemaName::TriggerRequest => include_str!("../../../schemas/trigger-request.avsc"),
            SchemaName::RunStatus => include_str!("../../../schemas/run-status.avsc"),
            SchemaName::Grant => include_str!("../../../schemas/grant.avsc"),
            SchemaName::DeclaredResource => {
                include_str!("../../../schemas/declared-resource.avsc")
            }
        }
    }

    /// The earlier versions of this schema (`schemas/history/<stem>.<n>.avsc`),
    /// oldest first: a record written under one of them is still read, its new
    /// fields taking their defaults. A schema change copies the current file
    /// there before editing it, and may only add fields with defaults or append
    /// enum symbols.
    pub fn history(self) -> &'static [&'static str] {
        match self {
            SchemaName::DependencySpec => &[
                include_str!("../../../schemas/history/dependency-spec.1.avsc"),
                include_str!("../../../schemas/history/dependency-spec.2.avsc"),
                include_str!("../../../schemas/history/dependency-spec.3.avsc"),
            ],
            SchemaName::TriggerRequest => &[
                include_str!("../../../schemas/history/trigger-request.1.avsc"),
                include_str!("../../../schemas/history/trigger-request.2.avsc"),
            ],
            SchemaName::RunStatus => &[include_str!("../../../schemas/history/run-status.1.avsc")],
            SchemaName::AssetEvent => &[
                include_str!("../../../schemas/history/asset-event.1.avsc"),
                include_str!("../../../schemas/history/asset-event.2.avsc"),
            ],
            SchemaName::AssetState => &[
                include_str!("../../../schemas/history/asset-state.1.avsc"),
                include_str!("../../../schemas/history/asset-state.2.avsc"),
            ],
            _ => &[],
        }
    }

    /// An earlier version of this schema by its single-object fingerprint.
    pub fn earlier(self, fingerprint: &[u8]) -> Option<&'static Schema> {
        /// Per schema name: each earlier version with its fingerprint.
        type Versions = Vec<(Schema, [u8; 8])>;
        static PARSED: OnceLock<Vec<Versions>> = OnceLock::new();
        let all = PARSED.get_or_init(|| {
            SchemaName::ALL
                .iter()
                .map(|n| {
                    n.history()
                        .iter()
                        .map(|src| {
                            let schema = Schema::parse_str(src).unwrap_or_else(|e| {
                                panic!("schemas/history of {}: {e}", n.file_stem())
                            });
                            let fp = fingerprint_of(&schema);
                            (schema, fp)
                        })
                        .collect()
                })
                .collect()
        });
        all[self.index()]
            .iter()
            .find(|(_, fp)| fp[..] == *fingerprint)
            .map(|(s, _)| s)
    }

    /// The parsed schema. The files are part of the build and covered by tests, so a
    /// parse failure is a bug in this repository, not bad input: it panics at start.
    pub fn schema(self) -> &'static Schema {
        static PARSED: OnceLock<Vec<Schema>> = OnceLock::new();
        let all = PARSED.get_or_init(|| {
            SchemaName::ALL
                .iter()
                .map(|n| {
                    Schema::parse_str(n.source()).unwrap_or_else(|e| {
                        panic!("schemas/{}.avsc does not parse: {e}", n.file_stem())
                    })
                })
                .collect()
        });
        &all[self.index()]
    }
}

/// A schema with everything derived from it built once: name resolution, datum
/// reader and writer. Building these per record cost ~80 µs each (measured by
/// `bench-codec`), which made the codec the bottleneck of every service.
pub struct Compiled {
    pub resolved: ResolvedSchema<'static>,
    pub reader: GenericDatumReader<'static>,
    pub writer: GenericDatumWriter<'static>,
    /// CRC-64-AVRO of the canonical form, 8 bytes little-endian (single-object header).
    pub fingerprint: [u8; 8],
}

impl SchemaName {
    pub fn compiled(self) -> &'static Compiled {
        static COMPILED: OnceLock<Vec<Compiled>> = OnceLock::new();
        let all = COMPILED.get_or_init(|| {
            SchemaName::ALL
                .iter()
                .map(|n| {
                    let schema = n.schema();
                    let fail = |e: apache_avro::Error| -> ! {
                        panic!("schemas/{}.avsc: {e}", n.file_stem())
                    };
                    Compiled {
                        resolved: ResolvedSchema::try_from(schema).unwrap_or_else(|e| fail(e)),
                        reader: GenericDatumReader::builder(schema)
                            .build()
                            .unwrap_or_else(|e| fail(e)),
                        writer: GenericDatumWriter::builder(schema)
                            .build()
                            .unwrap_or_else(|e| fail(e)),
                        fingerprint: fingerprint_of(schema),
                    }
                })
                .collect()
        });
        &all[self.index()]
    }
}

/// CRC-64-AVRO (Rabin) of the canonical form, 8 bytes little-endian.
fn fingerprint_of(schema: &Schema) -> [u8; 8] {
    let fp = schema.fingerprint::<apache_avro::rabin::Rabin>();
    let mut out = [0u8; 8];
    out.copy_from_slice(&fp.bytes[..8]);
    out
}
