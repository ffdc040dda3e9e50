//! Auto-resume at the proxy: a request for a paused sandbox created with
//! `autoResume: {"enabled": true}` (the SDKs' `lifecycle={"on_timeout": "pause",
//! "auto_resume": True}`) resumes it, and is then served as if it had been running, through
//! its envd (commands, files) or its ports.
//!
//! - The request must pass the sandbox's guard first, as it would if the sandbox ran
//!   ([`proxy::admit`]: the envd access token or a signed file URL; the ports' traffic token
//!   under `allowPublicTraffic: false`). One that would be refused is refused the same way
//!   and wakes nothing. A public port wakes the sandbox for anyone who reaches the daemon,
//!   as it would reach the running sandbox's port.
//! - Requests that arrive while it wakes wait for the same resume ([`Wakes`]: one resume
//!   per sandbox however many requests come): at most [`MAX_WAITERS`] per sandbox (more
//!   get 503 at once), each for at most [`WAKE_WAIT`] (then 503 "still resuming"; the
//!   resume goes on and a retry finds the sandbox running).
//! - The resume is the API's (snapshots/pause.rs): the key's quotas and the host's capacity
//!   apply (refused, the sandbox stays paused and every waiting request gets the refusal,
//!   429 or 503), and the sandbox runs for the timeout recorded at create (E2B: the
//!   create's timeout, at least 5 minutes). It runs in its own task: clients that go away
//!   do not stop it halfway.
//! - A paused sandbox without auto-resume answers as before: 502 "was not found".

use crate::App;
use crate::http::error::ApiError;
use crate::http::proxy::{Guard, Target, admit, not_found_in_sandbox};
use crate::sandboxes::service::{Live, SandboxService, lock};
use crate::snapshots::error::SnapshotError;
use crate::store::State;
use axum::http::request::Parts;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Requests that may wait for one sandbox to wake; more are answered 503 at once. (The API
/// port's connection cap, `serve --max-connections`, bounds them all.)
pub const MAX_WAITERS: usize = 256;

/// The longest a request waits for its sandbox to wake (a gVisor resume takes seconds; a
/// resume whose restored agent does not answer is retried, snapshots/pause.rs).
pub const WAKE_WAIT: Duration = Duration::from_secs(60);

/// How a resume ended; `None` while it runs.
type Outcome = Option<Result<(), ApiError>>;

/// One resume in flight.
struct Wake {
    done: watch::Receiver<Outcome>,
    /// One clone per waiting request (and the map's own): how many wait.
    waiters: Arc<()>,
}

type WakeMap = Mutex<HashMap<String, Wake>>;

/// The resumes in flight, one per sandbox (one daemon's: [`App`] owns it).
#[derive(Default)]
pub struct Wakes {
    inflight: Arc<WakeMap>,
}

impl Wakes {
    /// Waits until paused sandbox `id` runs, joining the resume of it in flight or starting
    /// one (that gives it `timeout_secs`).
    pub async fn wake(&self, app: &App, id: &str, timeout_secs: u64) -> Result<(), ApiError> {
        let (mut done, _waiting) = {
            let mut inflight = lock(&self.inflight);
            let wake = inflight
                .entry(id.to_string())
                .or_insert_with(|| self.start(app, id, timeout_secs));
            if Arc::strong_count(&wake.waiters) > MAX_WAITERS {
                return Err(ApiError::unavailable(format!(
                    "sandbox {id} is resuming and {MAX_WAITERS} requests already wait for it: \
                     retry in a few seconds"
                )));
            }
            (wake.done.clone(), wake.waiters.clone())
        };
        match tokio::time::timeout(WAKE_WAIT, done.wait_for(Option::is_some)).await {
            Ok(Ok(outcome)) => outcome.clone().unwrap_or(Ok(())),
            Ok(Err(_)) => Err(ApiError::internal(format!(
                "the resume of sandbox {id} ended without an answer"
            ))),
            Err(_) => Err(ApiError::unavailable(format!(
                "sandbox {id} is still resuming after {} s: retry the request",
                WAKE_WAIT.as_secs()
            ))),
        }
    }

    /// Starts the resume of `id` in its own task; it leaves the map when done.
    fn start(&self, app: &App, id: &str, timeout_secs: u64) -> Wake {
        let (tx, rx) = watch::channel(None);
        let inflight = self.inflight.clone();
        let lifecycle = app.lifecycle.clone();
        let metrics = app.metrics.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            let begun = Instant::now();
            let outcome = resume(&lifecycle, &id, timeout_secs).await;
            metrics.count_auto_resume(outcome.is_ok());
            match &outcome {
                Ok(()) => tracing::info!(
                    "sandbox {id}: auto-resumed for a request in {} ms",
                    begun.elapsed().as_millis()
                ),
                Err(e) => tracing::warn!("sandbox {id}: {}", e.message),
            }
            // The answer first, then the entry goes: a request arriving in between reads the
            // answer; one arriving after finds the sandbox running (resume put it in `live`
            // before it returned) or, if it failed, starts a new resume.
            let _ = tx.send(Some(outcome));
            lock(&inflight).remove(&id);
        });
        Wake {
            done: rx,
            waiters: Arc::new(()),
        }
    }
}

/// The resume of a wake, its failure worded for the requests that wait on it.
async fn resume(
    lifecycle: &Arc<SandboxService>,
    id: &str,
    timeout_secs: u64,
) -> Result<(), ApiError> {
    match lifecycle.resume(id, timeout_secs).await {
        // Resumed, or running already (a connect got there first).
        Ok(_) => Ok(()),
        // Killed meanwhile.
        Err(SnapshotError::SandboxNotFound(_)) => Err(not_found_in_sandbox(id)),
        Err(e) => {
            let e = ApiError::from(e);
            Err(ApiError::new(
                e.status,
                format!("auto-resume of sandbox {id} failed: {}", e.message),
            ))
        }
    }
}

/// For the proxy: sandbox `target` is not running. Wakes it when it is paused with
/// auto-resume and `req` passes its guard (the guard's answer otherwise); "not found" when
/// it is not paused or has no auto-resume.
pub(crate) async fn wake_for(
    app: &Arc<App>,
    target: &Target,
    req: &Parts,
) -> Result<Arc<Live>, ApiError> {
    let id = &target.sandbox_id;
    let Some(row) = app.db.sandbox(id).await? else {
        return Err(not_found_in_sandbox(id));
    };
    if !matches!(row.state, State::Paused | State::Pausing | State::Resuming) {
        // Running by now (a resume ended between the two looks), or gone.
        return app
            .lifecycle
            .live(id)
            .ok_or_else(|| not_found_in_sandbox(id));
    }
    let Some(timeout_secs) = app.db.sandbox_lifecycle(id).await?.auto_resume else {
        return Err(not_found_in_sandbox(id));
    };
    // The guard it will have once running: its token, and a network if it had one (a
    // resume makes it again from the same record, snapshots/pause.rs).
    let networks = &app.lifecycle.networks;
    let guard = Guard {
        access_token: row.access_token.clone(),
        traffic_token: networks.recorded_traffic_token(&app.db, id).await?,
        network: networks.spec_of(&app.db, id).await?.is_some(),
    };
    admit(req, target.port, &guard)?;
    app.wakes.wake(app, id, timeout_secs).await?;
    app.lifecycle
        .live(id)
        .ok_or_else(|| not_found_in_sandbox(id))
}
