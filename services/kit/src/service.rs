//! What every service's `main` and start-up do, in one place.

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use crate::config::{Common, ConfigErrors};
use crate::health::Health;
use crate::shutdown::Shutdown;
use crate::topics::{self, Topic};

/// The body of every `main.rs`: read config (print every problem, exit 2), start
/// telemetry and signal handling, run, map the result to an exit code.
pub fn main<O, Fut, E>(
    from_env: fn() -> Result<O, ConfigErrors>,
    common: fn(&O) -> &Common,
    run: fn(O, Shutdown) -> Fut,
) -> ExitCode
where
    Fut: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let options = match from_env() {
        Ok(o) => o,
        Err(errors) => {
            eprint!("{errors}");
            return ExitCode::from(2);
        }
    };
    let c = common(&options);
    crate::telemetry::init(c.log_format, &c.log_filter);
    let unknown = crate::config::unknown_variables(std::env::vars());
    if !unknown.is_empty() {
        tracing::warn!(variables = ?unknown, "SLUICE_ variables no service reads (a typo?); they have no effect");
    }
    let (service, grace) = (c.service, c.shutdown_grace);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{service}: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        let shutdown = Shutdown::new();
        shutdown.listen_for_signals();
        let watchdog = shutdown.clone();
        // Bound the grace period: once shutdown starts, exit after `grace` whatever happens.
        tokio::spawn(async move {
            watchdog.wait_stopped().await;
            tokio::time::sleep(grace).await;
            tracing::error!(
                grace_ms = grace.as_millis() as u64,
                "shutdown took longer than the grace period; exiting"
            );
            std::process::exit(1);
        });
        run(options, shutdown).await
    });
    match result {
        Ok(()) => {
            tracing::info!(service, "stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(service, error = %e, "service failed");
            eprintln!("{service}: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("topics: {0}")]
    Topics(#[from] topics::BootstrapError),
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("admin server on {addr}: {source}")]
    Admin {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// A started service: health, admin server, topics checked.
pub struct Started {
    pub health: Health,
    pub admin_addr: std::net::SocketAddr,
    pub admin_task: tokio::task::JoinHandle<()>,
}

/// Start-up shared by all services: metrics, admin port, topic bootstrap (retried
/// while the broker is not reachable yet, refused at once if a topic is misconfigured).
pub async fn start(
    common: &Common,
    topics_needed: &[Topic],
    shutdown: &Shutdown,
) -> Result<Started, StartError> {
    crate::admin::install_metrics();
    metrics::gauge!(crate::metrics::SERVICE_INFO, "service" => common.service, "version" => env!("CARGO_PKG_VERSION"))
        .set(1.0);
    let health = Health::new(Duration::from_secs(30));
    let (admin_addr, admin_task) =
        crate::admin::serve(common.admin_addr, health.clone(), shutdown.clone())
            .await
            .map_err(|source| StartError::Admin {
                addr: common.admin_addr,
                source,
            })?;
    tracing::info!(service = common.service, admin = %admin_addr, "admin server listening");
    let admin = common.kafka.admin(&format!(
        "sluice-{}-{}-admin",
        common.service, common.instance
    ))?;
    let mut delay = Duration::from_millis(200);
    loop {
        match topics::bootstrap(
            &admin,
            &common.topics,
            topics_needed,
            common.kafka.request_timeout,
        )
        .await
        {
            Ok(()) => break,
            Err(e @ topics::BootstrapError::NotCompacted { .. }) => return Err(e.into()),
            Err(e) if !shutdown.is_stopping() => {
                tracing::warn!(error = %e, retry_ms = delay.as_millis() as u64, "topic bootstrap failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Started {
        health,
        admin_addr,
        admin_task,
    })
}
