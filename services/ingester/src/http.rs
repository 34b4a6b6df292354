//! HTTP push: `POST /v1/commits` (the generic notice, one or a batch) and
//! `POST /v1/hooks/hudi` (Hudi's write-commit HTTP callback). The contract is in
//! `services/ingester/openapi.yaml`. A 200 only after the broker acknowledged
//! every event of the request; 503 with Retry-After when it did not.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::json;
use sluice_core::{AssetEvent, AssetKey, EventSource};

use crate::auth::{Denied, TokenSpec, Tokens};
use crate::metrics as m;
use crate::normalize::{self, HudiKey};
use crate::sink::Sink;

pub struct Http {
    pub sink: Sink,
    pub tokens: Tokens,
    pub max_body_bytes: usize,
    pub max_batch: usize,
}

pub fn router(state: Arc<Http>) -> Router {
    Router::new()
        .route("/v1/commits", post(commits))
        .route("/v1/hooks/hudi", post(hudi))
        .with_state(state)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    let message = message.into();
    metrics::counter!(m::HTTP_REJECTED_TOTAL, "status" => status.as_u16().to_string()).increment(1);
    tracing::debug!(status = status.as_u16(), %message, "request refused");
    (
        status,
        axum::Json(json!({"error": message, "status": status.as_u16()})),
    )
        .into_response()
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    if let Some(v) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        return v.strip_prefix("Bearer ").map(str::trim);
    }
    // Hudi's HTTP callback sends its API key in this header.
    headers
        .get("HUDI-CALLBACK-KEY")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

/// Reads the body within the limit (413 with the limit beyond it).
async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<axum::body::Bytes, Response> {
    let too_big = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("body exceeds {limit} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let mut stream = body.into_data_stream();
    let mut buf = Vec::with_capacity(declared.unwrap_or(0).min(limit));
    let mut seen = 0usize;
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else {
            return Err(error(StatusCode::BAD_REQUEST, "the body was cut off"));
        };
        seen += chunk.len();
        if seen <= limit {
            buf.extend_from_slice(&chunk);
        } else if seen > DRAIN_LIMIT {
            // Too big even to drain: answer now, the client sees the connection close.
            break;
        }
        // Between the limit and DRAIN_LIMIT the rest is read and dropped, so the
        // client gets its 413 instead of a broken pipe mid-upload.
    }
    if seen > limit {
        return Err(too_big());
    }
    Ok(buf.into())
}

/// How much of an oversized body is read and discarded before the 413.
const DRAIN_LIMIT: usize = 64 << 20;

/// Authorises every event of a request, then publishes them all or none.
async fn accept(
    state: &Http,
    token: &TokenSpec,
    events: Vec<AssetEvent>,
    path: &'static str,
) -> Response {
    for e in &events {
        if let Err(denied) = token.may_write(&e.asset_key) {
            return error(StatusCode::FORBIDDEN, denied.to_string());
        }
    }
    match state.sink.publish(&events).await {
        Ok(()) => {
            metrics::counter!(m::ACCEPTED_TOTAL, "path" => path).increment(events.len() as u64);
            let ids: Vec<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
            (
                StatusCode::OK,
                axum::Json(json!({"accepted": events.len(), "event_ids": ids})),
            )
                .into_response()
        }
        Err(e) => {
            tracing::warn!(error = %e, events = events.len(), "broker did not acknowledge; answering 503");
            let mut r = error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not accepted, retry: {e}"),
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            r
        }
    }
}

fn unauthorized(e: Denied) -> Response {
    let mut r = error(StatusCode::UNAUTHORIZED, e.to_string());
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

async fn commits(State(state): State<Arc<Http>>, headers: HeaderMap, body: Body) -> Response {
    // Authenticate before reading a body (an unknown caller gets nothing parsed).
    let token = match state.tokens.identify(bearer(&headers)) {
        Ok(t) => t,
        Err(e) => return unauthorized(e),
    };
    let bytes = match read_body(&headers, body, state.max_body_bytes).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let events = match normalize::commits_from_json(&bytes, EventSource::Push) {
        Ok(e) => e,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.0),
    };
    if events.len() > state.max_batch {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "{} commits in one request; at most {}",
                events.len(),
                state.max_batch
            ),
        );
    }
    accept(&state, token, events, "commits").await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HudiQuery {
    asset: Option<String>,
    namespace: Option<String>,
}

async fn hudi(
    State(state): State<Arc<Http>>,
    headers: HeaderMap,
    query: Result<Query<HudiQuery>, axum::extract::rejection::QueryRejection>,
    body: Body,
) -> Response {
    let token = match state.tokens.identify(bearer(&headers)) {
        Ok(t) => t,
        Err(e) => return unauthorized(e),
    };
    let Ok(Query(q)) = query else {
        return error(
            StatusCode::BAD_REQUEST,
            "query: only ?asset=catalog.namespace.table or ?namespace=catalog.namespace",
        );
    };
    let key = match (q.asset, q.namespace) {
        (Some(a), None) => match AssetKey::parse(&a) {
            Ok(k) => HudiKey::Asset(k),
            Err(e) => return error(StatusCode::BAD_REQUEST, format!("asset: {e}")),
        },
        (None, Some(ns)) => HudiKey::Namespace(ns),
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "give ?asset=catalog.namespace.table or ?namespace=catalog.namespace (the callback's tableName completes it) in hoodie.write.commit.callback.http.url",
            );
        }
    };
    let bytes = match read_body(&headers, body, state.max_body_bytes).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    match normalize::hudi_from_json(&bytes, &key, EventSource::Push) {
        Ok(e) => accept(&state, token, vec![e], "hudi").await,
        Err(e) => error(StatusCode::BAD_REQUEST, e.0),
    }
}
