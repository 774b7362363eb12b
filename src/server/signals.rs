//! Signals, replacing Pingora's own handling: SIGHUP reloads the config
//! (Pingora would die of it), SIGTERM drains within `grace_period` and exits
//! as soon as nothing is in flight, SIGINT stops at once, SIGQUIT hands the
//! listeners to a new process (Pingora's graceful upgrade).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use log::{error, info, warn};
use pingora::server::{ShutdownSignal, ShutdownSignalWatch};
use tokio::signal::unix::{signal, SignalKind};

use crate::server::state::AppState;
use floodgate_limiter::Roster;

pub struct Signals {
    state: Arc<AppState>,
    grace: Duration,
    /// With `instances = "auto"`: left at a stop, so the others' share
    /// grows at once instead of when this one's slot expires.
    roster: Option<Arc<Roster>>,
}

impl Signals {
    pub fn new(state: Arc<AppState>, grace: Duration, roster: Option<Arc<Roster>>) -> Self {
        Signals {
            state,
            grace,
            roster,
        }
    }

    /// What a stop does last: leases back, this instance off the count.
    async fn leave(&self) {
        self.return_leases().await;
        if let Some(tracing) = &self.state.tracing {
            // The spans of the last requests, sent while the collector has time.
            if !tracing.flush(LEASE_RETURN_TIME).await {
                warn!("the last spans were not all sent within {LEASE_RETURN_TIME:?}");
            }
        }
        if let Some(roster) = &self.roster {
            if tokio::time::timeout(LEASE_RETURN_TIME, roster.leave())
                .await
                .is_err()
            {
                warn!("could not take this instance off the count in time: the others count it until its slot expires");
            }
        }
    }

    /// Waits for the requests in flight to finish, at most the grace period.
    async fn drain(&self) {
        self.state.start_draining();
        let started = Instant::now();
        info!(
            "SIGTERM: draining {} request(s) in flight, for at most {:?}",
            self.state.in_flight(),
            self.grace
        );
        while self.state.in_flight() > 0 && started.elapsed() < self.grace {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        match self.state.in_flight() {
            0 => info!("drained in {:.2}s", started.elapsed().as_secs_f64()),
            n => warn!("grace period over with {n} request(s) still in flight"),
        }
    }

    /// Budget leased from Redis and not used goes back, so that the other
    /// instances may spend it: at a stop, and at a reload (whose limits
    /// may have other numbers).
    async fn return_leases(&self) {
        let back = self.state.store.return_leases();
        if tokio::time::timeout(LEASE_RETURN_TIME, back).await.is_err() {
            warn!("leases not all given back within {LEASE_RETURN_TIME:?}: their units come back when they expire");
        }
    }
}

/// How long a stop or a reload waits for leases to go back.
const LEASE_RETURN_TIME: Duration = Duration::from_secs(1);

#[async_trait]
impl ShutdownSignalWatch for Signals {
    async fn recv(&self) -> ShutdownSignal {
        let streams = (
            signal(SignalKind::hangup()),
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
            signal(SignalKind::quit()),
        );
        let (Ok(mut hup), Ok(mut term), Ok(mut int), Ok(mut quit)) = streams else {
            error!("cannot install signal handlers; stopping");
            return ShutdownSignal::FastShutdown;
        };
        info!(
            "signals: SIGHUP reloads {}, SIGTERM drains, SIGINT stops",
            self.state.config_path.display()
        );
        loop {
            tokio::select! {
                _ = hup.recv() => {
                    info!("SIGHUP: reloading {}", self.state.config_path.display());
                    self.state.reload();
                    self.return_leases().await;
                }
                _ = term.recv() => {
                    self.drain().await;
                    self.leave().await;
                    return ShutdownSignal::GracefulTerminate;
                }
                _ = int.recv() => {
                    self.leave().await;
                    return ShutdownSignal::FastShutdown;
                }
                _ = quit.recv() => {
                    self.leave().await;
                    return ShutdownSignal::GracefulUpgrade;
                }
            }
        }
    }
}
