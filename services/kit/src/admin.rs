//! The admin router on its own port: `/health/live`, `/health/ready`, `/metrics`.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::health::Health;

#[derive(Clone)]
struct AdminState {
    health: Health,
    metrics: PrometheusHandle,
}

/// Installs the Prometheus recorder (once per process) and returns its handle.
pub fn install_metrics() -> PrometheusHandle {
    use std::sync::OnceLock;
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            // Fails only if another recorder was installed first (tests): keep ours unused then.
            let _ = metrics::set_global_recorder(recorder);
            crate::metrics::describe();
            handle
        })
        .clone()
}

pub fn router(health: Health, metrics: PrometheusHandle) -> Router {
    Router::new()
        .route("/health/live", get(live))
        .route("/health/ready", get(ready))
        .route("/metrics", get(render))
        .with_state(AdminState { health, metrics })
}

/// Binds the admin port; returns the bound address (port 0 picks one).
pub async fn serve(
    addr: SocketAddr,
    health: Health,
    shutdown: crate::shutdown::Shutdown,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = router(health, install_metrics());
    let task = tokio::spawn(async move {
        let stopped = shutdown.wait_stopped();
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(stopped)
            .await
        {
            tracing::error!(error = %e, "admin server failed");
        }
    });
    Ok((bound, task))
}

async fn live(State(s): State<AdminState>) -> impl IntoResponse {
    if s.health.is_live() {
        (StatusCode::OK, "live\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "work loop stalled\n")
    }
}

async fn ready(State(s): State<AdminState>) -> impl IntoResponse {
    if s.health.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

async fn render(State(s): State<AdminState>) -> impl IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        s.metrics.render(),
    )
}
