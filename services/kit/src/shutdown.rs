//! Graceful shutdown: SIGTERM/SIGINT start it, a second signal exits at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;

/// Cloneable shutdown signal, usable from async code and from blocking loops.
#[derive(Clone, Debug)]
pub struct Shutdown {
    flag: Arc<AtomicBool>,
    tx: Arc<watch::Sender<bool>>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    pub fn new() -> Self {
        let (tx, _) = watch::channel(false);
        Shutdown {
            flag: Arc::new(AtomicBool::new(false)),
            tx: Arc::new(tx),
        }
    }

    pub fn trigger(&self) {
        self.flag.store(true, Ordering::SeqCst);
        self.tx.send_replace(true);
    }

    pub fn is_stopping(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// The flag blocking loops poll.
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.flag.clone()
    }

    pub async fn wait_stopped(self) {
        let mut rx = self.tx.subscribe();
        while !*rx.borrow_and_update() {
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Listens for SIGTERM / SIGINT: the first triggers shutdown, the second exits (130).
    pub fn listen_for_signals(&self) {
        let me = self.clone();
        tokio::spawn(async move {
            let mut first = true;
            loop {
                wait_for_signal().await;
                if first {
                    tracing::info!("signal received: shutting down (send again to exit at once)");
                    me.trigger();
                    first = false;
                } else {
                    tracing::warn!("second signal: exiting now");
                    std::process::exit(130);
                }
            }
        });
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
