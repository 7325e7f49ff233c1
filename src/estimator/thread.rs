//! The estimator's own thread and tokio runtime, apart from the runtime that serves the
//! extender's verbs: however many calls karmada-scheduler (or anyone who reaches the port)
//! sends, their handshakes, decoding and estimates run on this one thread, so the verbs' workers
//! never wait behind them.

use std::future::Future;
use std::time::Duration;

use anyhow::{Context as _, anyhow};
use futures::future::BoxFuture;
use tokio::sync::oneshot;

/// How long the runtime waits, once the server has stopped, for work still running on its
/// blocking pool (a DNS lookup of the API client) before it is left to end with the process.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// The server's future, as the start-up hands it over: resolves when the server has stopped.
pub type Server = BoxFuture<'static, anyhow::Result<()>>;

/// The estimator running on its own thread; [`EstimatorThread::stopped`] waits for its end.
#[derive(Debug)]
pub struct EstimatorThread {
    stopped: oneshot::Receiver<anyhow::Result<()>>,
}

impl EstimatorThread {
    /// Starts a thread with a single-threaded tokio runtime, runs `start_up` there (binding the
    /// listener, building what the service needs: whatever it spawns lives on that runtime),
    /// and returns once it is done: its error, or the server it made, then served on the thread
    /// until it stops.
    pub async fn start(
        start_up: impl Future<Output = anyhow::Result<Server>> + Send + 'static,
    ) -> anyhow::Result<Self> {
        let (started_tx, started) = oneshot::channel();
        let (stopped_tx, stopped) = oneshot::channel();
        std::thread::Builder::new()
            .name("gpu-extender-estimator".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        let _ = started_tx.send(Err(
                            anyhow!(error).context("building the estimator's runtime")
                        ));
                        return;
                    }
                };
                let outcome = runtime.block_on(async move {
                    match start_up.await {
                        Ok(server) => {
                            let _ = started_tx.send(Ok(()));
                            Some(server.await)
                        }
                        Err(error) => {
                            let _ = started_tx.send(Err(error));
                            None
                        }
                    }
                });
                // Ends the tasks the server left (the TLS reloader, the API client's), then
                // reports: what `stopped` waits for is the runtime gone, not only the server.
                runtime.shutdown_timeout(SHUTDOWN_GRACE);
                if let Some(outcome) = outcome {
                    let _ = stopped_tx.send(outcome);
                }
            })
            .context("starting the estimator's thread")?;
        started
            .await
            .map_err(|_| anyhow!("the estimator's thread ended while starting"))??;
        Ok(Self { stopped })
    }

    /// Waits until the server has stopped (its shutdown signal fired and the calls in flight
    /// were answered) and its runtime is gone; the server's error if it failed.
    pub async fn stopped(self) -> anyhow::Result<()> {
        self.stopped
            .await
            .map_err(|_| anyhow!("the estimator's thread ended without stopping its server"))?
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use futures::FutureExt as _;

    use super::*;

    #[tokio::test]
    async fn the_server_runs_on_its_own_thread_until_it_stops() {
        let (stop, stopped) = oneshot::channel::<()>();
        let (ran_on_tx, ran_on) = oneshot::channel();
        let running = EstimatorThread::start(async move {
            let server: Server = async move {
                let _ = ran_on_tx.send(std::thread::current().name().map(str::to_owned));
                let _ = stopped.await;
                Ok(())
            }
            .boxed();
            Ok(server)
        })
        .await
        .unwrap();
        assert_eq!(
            ran_on.await.unwrap().as_deref(),
            Some("gpu-extender-estimator")
        );
        stop.send(()).unwrap();
        running.stopped().await.unwrap();
    }

    #[tokio::test]
    async fn a_failed_start_up_is_the_starts_error_and_a_failed_server_the_stops() {
        let failed = EstimatorThread::start(async { Err(anyhow!("listening on 192.0.2.1:1")) })
            .await
            .unwrap_err();
        assert_eq!(failed.to_string(), "listening on 192.0.2.1:1");
        let running = EstimatorThread::start(async {
            let server: Server = async { Err(anyhow!("serving failed")) }.boxed();
            Ok(server)
        })
        .await
        .unwrap();
        assert_eq!(
            running.stopped().await.unwrap_err().to_string(),
            "serving failed"
        );
    }
}
