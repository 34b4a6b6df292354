//! A **schema-registry stand-in**: no Confluent-compatible registry can be installed
//! on this machine (see `docs/decisions/0003-schema-registry-stand-in.md`). It serves
//! the endpoints Sluice's codec and Confluent's own serializers (confluent-kafka for
//! Python) call, with the Confluent REST API's bodies and codes:
//! `POST /subjects/{subject}/versions` → `{"id", "subject", "version"}` (the same
//! schema gets the same id) and `GET /schemas/ids/{id}` → `{"schema"}` or 404
//! `{"error_code": 40403}`.

use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};

#[derive(Default)]
pub struct Schemas {
    /// Schema text by id - 1.
    pub schemas: Vec<String>,
    /// (subject, schema text) in registration order; a version is a subject's count.
    pub registrations: Vec<(String, String)>,
}

/// The registry's state, shared by every address it listens on.
#[derive(Clone, Default)]
pub struct StandIn {
    pub state: Arc<Mutex<Schemas>>,
}

async fn register(
    State(r): State<StandIn>,
    Path(subject): Path<String>,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let Some(schema) = body.get("schema").and_then(Value::as_str) else {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"error_code": 42201, "message": "Invalid schema"})),
        );
    };
    let mut r = r.state.lock().expect("lock");
    let id = match r.schemas.iter().position(|s| s == schema) {
        Some(i) => i + 1,
        None => {
            r.schemas.push(schema.to_owned());
            r.schemas.len()
        }
    };
    if !r
        .registrations
        .iter()
        .any(|(s, text)| *s == subject && text == schema)
    {
        r.registrations.push((subject.clone(), schema.to_owned()));
    }
    let version = r
        .registrations
        .iter()
        .filter(|(s, _)| *s == subject)
        .count();
    (
        StatusCode::OK,
        Json(json!({ "id": id, "subject": subject, "version": version })),
    )
}

async fn by_id(State(r): State<StandIn>, Path(id): Path<usize>) -> (StatusCode, Json<Value>) {
    let r = r.state.lock().expect("lock");
    match id.checked_sub(1).and_then(|i| r.schemas.get(i)) {
        Some(s) => (StatusCode::OK, Json(json!({ "schema": s }))),
        None => (
            StatusCode::NOT_FOUND,
            Json(json!({"error_code": 40403, "message": "Schema not found"})),
        ),
    }
}

impl StandIn {
    /// Serves this registry on `127.0.0.1:port` (0 = any free port); returns its URL.
    pub async fn listen(&self, port: u16) -> String {
        let app = Router::new()
            .route("/subjects/{subject}/versions", post(register))
            .route("/schemas/ids/{id}", get(by_id))
            .with_state(self.clone());
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind the registry stand-in");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
        format!("http://{addr}")
    }

    /// Subjects in registration order.
    pub fn subjects(&self) -> Vec<String> {
        let r = self.state.lock().expect("lock");
        r.registrations.iter().map(|(s, _)| s.clone()).collect()
    }
}
