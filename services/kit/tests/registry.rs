//! The Confluent wire-format path, against an in-test **schema-registry stand-in**.
//!
//! No Confluent-compatible registry can run on this machine (see
//! `docs/decisions/0003-schema-registry-stand-in.md`). The stand-in implements the
//! two endpoints the codec calls, with the Confluent REST API's bodies and codes:
//! `POST /subjects/{subject}/versions` → `{"id": n}` (the same schema gets the same
//! id) and `GET /schemas/ids/{id}` → `{"schema": "…"}` or 404 `{"error_code": 40403}`.

use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};
use sluice_core::{AssetEvent, AssetKey, AssetState, EventSource, TableFormat};
use sluice_kit::SchemaName;
use sluice_kit::codec::{CONFLUENT_MAGIC, Codec, CodecError};
use sluice_kit::wire::StateRecord;

#[derive(Default)]
struct Registry {
    /// Schema text by id - 1.
    schemas: Vec<String>,
    registrations: Vec<String>,
}

type Shared = Arc<Mutex<Registry>>;

async fn register(
    State(r): State<Shared>,
    Path(subject): Path<String>,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let Some(schema) = body.get("schema").and_then(Value::as_str) else {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"error_code": 42201, "message": "Invalid schema"})),
        );
    };
    let mut r = r.lock().expect("lock");
    r.registrations.push(subject);
    let id = match r.schemas.iter().position(|s| s == schema) {
        Some(i) => i + 1,
        None => {
            r.schemas.push(schema.to_owned());
            r.schemas.len()
        }
    };
    (StatusCode::OK, Json(json!({ "id": id })))
}

async fn by_id(State(r): State<Shared>, Path(id): Path<usize>) -> (StatusCode, Json<Value>) {
    let r = r.lock().expect("lock");
    match id.checked_sub(1).and_then(|i| r.schemas.get(i)) {
        Some(s) => (StatusCode::OK, Json(json!({ "schema": s }))),
        None => (
            StatusCode::NOT_FOUND,
            Json(json!({"error_code": 40403, "message": "Schema not found"})),
        ),
    }
}

async fn stand_in() -> (String, Shared) {
    let shared: Shared = Arc::default();
    let app = Router::new()
        .route("/subjects/{subject}/versions", post(register))
        .route("/schemas/ids/{id}", get(by_id))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    (format!("http://{addr}"), shared)
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
    assert_eq!(
        registry.lock().expect("lock").registrations,
        ["sluice.asset-events-value"]
    );

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
