//! The web UI: three files compiled into the binary and served under `/ui`, so it
//! runs wherever the API runs, offline, with nothing fetched from elsewhere
//! (`docs/decisions/0005-web-ui.md`). Every byte of data it shows comes from the
//! API's own routes, called with the signed-in token.

use axum::http::header;
use axum::response::Redirect;

use super::*;

const INDEX: &str = include_str!("../../ui/index.html");
const SCRIPT: &str = include_str!("../../ui/app.js");
const STYLE: &str = include_str!("../../ui/app.css");

/// Only this origin: no inline script, no other host (the token never leaves).
const POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
                      img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'";

fn file(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            // A new binary serves new files: never a stale script beside a new API.
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

pub(super) async fn index() -> Response {
    file("text/html; charset=utf-8", INDEX)
}

pub(super) async fn script() -> Response {
    file("text/javascript; charset=utf-8", SCRIPT)
}

pub(super) async fn style() -> Response {
    file("text/css; charset=utf-8", STYLE)
}

pub(super) async fn to_ui() -> Redirect {
    Redirect::temporary("/ui/")
}
