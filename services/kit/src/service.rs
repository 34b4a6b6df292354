//! What every service's `main` and start-up do, in one place.

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use rdkafka::producer::Producer as _;

use crate::access::{Access, Acl, Operation, ResourceKind};
use crate::authorized::{self, Authorized};
use crate::backoff::Backoff;
use crate::config::{Common, ConfigErrors};
use crate::health::Health;
use crate::shutdown::Shutdown;
use crate::topics;

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
    #[error(
        "the broker refused this service (check SLUICE_RDKAFKA_SASL_* and SLUICE_RDKAFKA_SSL_*): {0}"
    )]
    Refused(String),
    #[error(
        "the broker's ACLs do not let this service's principal {}; grant them (deploy/kafka/acls.sh or `sluice acls` give the whole set of each service)",
        .0.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    )]
    Forbidden(Vec<Acl>),
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

/// What a service needs of the broker: its row of the access table, with the
/// consumer group and the user's topics this deployment configures.
#[derive(Clone, Debug)]
pub struct KafkaNeeds {
    pub access: &'static Access,
    /// The consumer group it joins (its `SLUICE_*_GROUP`), if any.
    pub group: Option<String>,
    /// Topics of the user's it reads (the ingester's hook topics).
    pub extra_reads: Vec<String>,
}

impl KafkaNeeds {
    pub fn of(access: &'static Access) -> Self {
        KafkaNeeds {
            access,
            group: None,
            extra_reads: Vec::new(),
        }
    }

    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    pub fn reading(mut self, topics: Vec<String>) -> Self {
        self.extra_reads = topics;
        self
    }

    /// The rules it needs under `prefix`, its group named as configured.
    pub fn acls(&self, prefix: &str) -> Vec<Acl> {
        let mut acls = self.access.acls(prefix, &self.extra_reads);
        acls.retain(|a| a.kind != ResourceKind::Group);
        if let Some(g) = &self.group {
            acls.push(Acl {
                kind: ResourceKind::Group,
                name: g.clone(),
                prefixed: false,
                operation: Operation::Read,
            });
        }
        acls
    }
}

/// The rules of `needs` the broker does not grant this principal, found by
/// asking what it may do on each topic and group (transactional ids cannot be
/// asked: a missing one fails the transactional loop's start, by name). A
/// resource the broker does not describe, or a broker that does not say, is
/// not reported: the work itself will say what is wrong.
async fn missing_acls(
    admin: &rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext>,
    needs: &[Acl],
    timeout: Duration,
) -> Vec<Acl> {
    let mut missing = Vec::new();
    for kind in [ResourceKind::Topic, ResourceKind::Group] {
        let mut names: Vec<String> = needs
            .iter()
            .filter(|a| a.kind == kind)
            .map(|a| a.name.clone())
            .collect();
        names.sort();
        names.dedup();
        let answers =
            tokio::task::block_in_place(|| authorized::describe(admin, kind, &names, timeout));
        let answers = match answers {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, resource = %kind, "cannot ask the broker which operations are authorized; not checking the ACLs");
                continue;
            }
        };
        for acl in needs.iter().filter(|a| a.kind == kind) {
            let allowed = match answers.iter().find(|(n, _)| *n == acl.name) {
                // Not describable: Read and Write would imply Describe, so they are
                // missing; Create and DescribeConfigs do not, and bootstrap has used them.
                Some((_, Authorized::Denied)) => {
                    !matches!(acl.operation, Operation::Read | Operation::Write)
                }
                Some((_, Authorized::Operations(Some(ops)))) => ops.contains(&acl.operation),
                Some((_, Authorized::Other(e))) => {
                    tracing::warn!(resource = %acl.name, error = %e, "the broker did not describe it");
                    true
                }
                _ => true,
            };
            if !allowed {
                missing.push(acl.clone());
            }
        }
    }
    missing
}

/// Start-up shared by all services: metrics, admin port, topic bootstrap (retried
/// while the broker is not reachable yet, refused at once if a topic is
/// misconfigured), and the check that the broker's ACLs grant what it needs.
pub async fn start(
    common: &Common,
    needs: KafkaNeeds,
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
    let topics_needed = needs.access.topics();
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    // A broker that refuses our credentials is an error to report, not an outage
    // to wait out.
    let probe = common.kafka.probe(&format!(
        "sluice-{}-{}-probe",
        common.service, common.instance
    ))?;
    let refused = || async {
        loop {
            probe.poll(Duration::ZERO);
            if let Some(why) = probe.context().refusal() {
                return why;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    loop {
        let attempt = topics::bootstrap(
            &admin,
            &common.topics,
            &topics_needed,
            common.kafka.request_timeout,
        );
        let result = tokio::select! {
            r = attempt => r,
            why = refused() => return Err(StartError::Refused(why)),
        };
        match result {
            Ok(()) => break,
            Err(
                e @ (topics::BootstrapError::NotCompacted { .. }
                | topics::BootstrapError::Forbidden { .. }),
            ) => return Err(e.into()),
            Err(e) if !shutdown.is_stopping() => {
                let wait = backoff.next_wait();
                tracing::warn!(error = %e, retry_ms = wait.as_millis() as u64, "topic bootstrap failed; retrying");
                tokio::time::sleep(wait).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    let missing = missing_acls(
        &admin,
        &needs.acls(&common.topics.prefix),
        common.kafka.request_timeout,
    )
    .await;
    if !missing.is_empty() {
        return Err(StartError::Forbidden(missing));
    }
    Ok(Started {
        health,
        admin_addr,
        admin_task,
    })
}

/// Why a supervised task ended the service.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("{task}: {source}")]
    Failed {
        task: &'static str,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{task} panicked: {message}")]
    Panicked { task: &'static str, message: String },
    #[error("{task} ended on its own")]
    Ended { task: &'static str },
}

/// The tasks of one service, which live and end together: when one ends on its
/// own — an error, a panic, or just returning — the others are told to stop, so
/// the process exits instead of living on half-dead. The first failure is the
/// service's result.
pub struct Supervisor {
    tasks: tokio::task::JoinSet<Result<(), Box<dyn std::error::Error + Send + Sync>>>,
    names: std::collections::HashMap<tokio::task::Id, &'static str>,
    shutdown: Shutdown,
    heartbeat: Option<tokio::task::JoinHandle<()>>,
}

impl Supervisor {
    pub fn new(shutdown: &Shutdown) -> Self {
        Supervisor {
            tasks: tokio::task::JoinSet::new(),
            names: std::collections::HashMap::new(),
            shutdown: shutdown.clone(),
            heartbeat: None,
        }
    }

    /// Beats `health` every second while the service runs, for parts that have no
    /// loop of their own to beat it (an HTTP server, a poller).
    pub fn heartbeat(&mut self, health: &Health) {
        let health = health.clone();
        self.heartbeat = Some(tokio::spawn(async move {
            loop {
                health.beat();
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }));
    }

    pub fn spawn<F, E>(&mut self, task: &'static str, work: F)
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let handle = self
            .tasks
            .spawn(async move { work.await.map_err(Into::into) });
        self.names.insert(handle.id(), task);
    }

    /// A blocking part (a transactional loop, a changelog follower) on a thread of its own.
    pub fn spawn_blocking<F, E>(&mut self, task: &'static str, work: F)
    where
        F: FnOnce() -> Result<(), E> + Send + 'static,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let handle = self
            .tasks
            .spawn_blocking(move || work().map_err(Into::into));
        self.names.insert(handle.id(), task);
    }

    /// Waits until shutdown or until one task ends; stops and joins the rest, then
    /// marks the service stopping and waits for its admin server.
    pub async fn run(mut self, started: Started) -> Result<(), TaskError> {
        let mut outcome = Ok(());
        while let Some(ended) = self.tasks.join_next_with_id().await {
            let name = |id| self.names.get(&id).copied().unwrap_or("a task");
            let error = match ended {
                Ok((_, Ok(()))) if self.shutdown.is_stopping() => None,
                Ok((id, Ok(()))) => Some(TaskError::Ended { task: name(id) }),
                Ok((id, Err(source))) => Some(TaskError::Failed {
                    task: name(id),
                    source,
                }),
                Err(join) => Some(TaskError::Panicked {
                    task: name(join.id()),
                    message: panic_message(join),
                }),
            };
            if let Some(e) = error {
                if !self.shutdown.is_stopping() {
                    tracing::error!(error = %e, "a part of the service ended; stopping the rest");
                }
                self.shutdown.trigger();
                if outcome.is_ok() {
                    outcome = Err(e);
                }
            }
        }
        if let Some(beat) = self.heartbeat.take() {
            beat.abort();
        }
        started.health.set_stopping();
        self.shutdown.trigger();
        let _ = started.admin_task.await;
        outcome
    }
}

fn panic_message(join: tokio::task::JoinError) -> String {
    match join.try_into_panic() {
        Ok(payload) => payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_owned()),
        Err(join) => join.to_string(),
    }
}
