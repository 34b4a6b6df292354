//! The Confluent wire-format path of Sluice's own codec, against the shared
//! schema-registry stand-in (`sluice_integration_tests::registry`; no
//! Confluent-compatible registry can run on this machine, see
//! `docs/decisions/0003-schema-registry-stand-in.md`).

use sluice_core::{AssetEvent, AssetKey, AssetState, EventSource, TableFormat};
use sluice_integration_tests::registry::StandIn;
use sluice_kit::SchemaName;
use sluice_kit::codec::{CONFLUENT_MAGIC, Codec, CodecError};
use sluice_kit::wire::StateRecord;

async fn stand_in() -> (String, StandIn) {
    let registry = StandIn::default();
    (registry.listen(0).await, registry)
}

fn event() -> AssetEvent {
    AssetEvent::committed(
        AssetKey::parse("lake.ods.payment_latest").expect("valid"),
        TableFormat::Iceberg,
        99,
        3,
        1_764_633_600_000,
        EventSource::Push,
    )
}

#[tokio::test]
async fn confluent_wire_format_round_trips_and_registers_under_the_topic_subject() {
    let (url, registry) = stand_in().await;
    let codec = Codec::new(Some(&url));
    let bytes = codec
        .encode(SchemaName::AssetEvent, "sluice.asset-events", &event())
        .await
        .expect("encode");
    assert_eq!(bytes[0], CONFLUENT_MAGIC);
    assert_eq!(
        u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]),
        1
    );
    let back: AssetEvent = codec
        .decode(SchemaName::AssetEvent, &bytes)
        .await
        .expect("decode");
    assert_eq!(back, event());
    assert_eq!(registry.subjects(), ["sluice.asset-events-value"]);

    // A second codec (another service) decodes the same bytes through the registry.
    let other = Codec::new(Some(&url));
    let again: AssetEvent = other
        .decode(SchemaName::AssetEvent, &bytes)
        .await
        .expect("decode");
    assert_eq!(again, event());
}

#[tokio::test]
async fn registry_errors_are_typed() {
    let (url, _registry) = stand_in().await;
    let codec = Codec::new(Some(&url));
    let decode = |b: Vec<u8>| {
        let c = &codec;
        async move { c.decode::<AssetEvent>(SchemaName::AssetEvent, &b).await }
    };
    assert!(matches!(decode(vec![]).await, Err(CodecError::Empty)));
    assert!(matches!(
        decode(vec![0x00, 0x00, 0x01]).await,
        Err(CodecError::Truncated { len: 3, .. })
    ));
    assert!(matches!(
        decode(vec![0xC3, 0x01, 0, 0, 0, 0]).await,
        Err(CodecError::WrongMagic { .. })
    ));
    // An id the registry never issued.
    let unknown = decode(vec![0x00, 0x00, 0x00, 0x30, 0x39, 0x02]).await;
    assert!(
        matches!(
            unknown,
            Err(CodecError::Registry {
                retriable: false,
                ..
            })
        ),
        "{unknown:?}"
    );
    // A record of another schema, correctly framed: refused, not half-read.
    let state = StateRecord::new(&AssetState::fold_all([&event()]).expect("state"), 1);
    let other = codec
        .encode(SchemaName::AssetState, "sluice.asset-state", &state)
        .await
        .expect("encode");
    let wrong = decode(other).await;
    assert!(matches!(wrong, Err(CodecError::Shape { .. })), "{wrong:?}");
}

#[tokio::test]
async fn an_unreachable_registry_is_a_retriable_error() {
    let codec = Codec::new(Some("http://127.0.0.1:9"));
    let err = codec
        .encode(SchemaName::AssetEvent, "t", &event())
        .await
        .expect_err("no registry");
    assert!(matches!(err, CodecError::Registry { .. }), "{err:?}");
}
