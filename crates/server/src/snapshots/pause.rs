//! Pause and resume, as E2B: `POST /sandboxes/{id}/pause` (204; 409 when already paused;
//! `memory: false`: the files only, the runtime's `pause_files_to_disk`, whose resume boots
//! a fresh sandbox with the same id on them),
//! `POST /sandboxes/{id}/resume` (201; 409 when running) and resume through
//! `POST /v2/sandboxes/{id}/connect` (201 when it resumed, 200 when it was running);
//! `autoPause` on create pauses instead of killing at the timeout.
//!
//! A pause is the runtime's `pause_to_disk` into `<data-dir>/snapshots/<snapshot-id>/`: the
//! sandbox's processes stop and its host files go, the snapshot stays. Its row keeps state
//! `paused` and the snapshot (`sandbox_lifecycle.paused_in`), so a paused sandbox survives a
//! daemon restart (reconcile leaves it alone) and a resume restores it with the SAME id,
//! then gives its agent `/init` (a fresh identity: id, entropy, clock, env vars, token).
//! Metering: leaving `running` closes the usage interval; a resume opens a new one.
//!
//! Crash consistency, as in sandboxes/service.rs: `pausing` and the snapshot's row and user are
//! written before the checkpoint; a restart finds a `pausing` row either with a complete
//! snapshot (paused) or not (error, or running if the sandbox survived); a `resuming` row
//! goes back to `paused` (the restore's leftovers are swept as nobody adopted them).
//!
//! One operation at a time per sandbox ([`OpLocks::lock`](super::ops::OpLocks::lock)):
//! pause, resume, snapshot, fork, kill.

use crate::error::Error;
use crate::sandboxes::error::SandboxError;
use crate::sandboxes::service::{
    DESTROY_TIMEOUT, INIT_TIMEOUT, Live, SandboxService, init_agent, lock,
};
use crate::snapshots::error::{HandleError, SnapshotError};
use crate::store::snapshots::{SnapshotPurpose, SnapshotRow};
use crate::store::{SandboxRow, State};
use crate::util::{now_ms, random_hex, rfc3339};
use sandcell_runtime::{RestoreSpec, Sandbox, SandboxStatus, SnapshotHandle};
use std::collections::BTreeMap;
use std::sync::Arc;

/// How many times a resume restores a snapshot whose agent does not answer.
pub const RESTORE_ATTEMPTS: u32 = 3;

/// A new snapshot id: `snap-` and 16 hex digits.
pub fn new_snapshot_id() -> Result<String, Error> {
    Ok(format!(
        "snap-{}",
        random_hex(8).map_err(Error::io("getrandom for a snapshot id"))?
    ))
}

/// What a resume found.
pub enum Resumed {
    /// It was paused and runs again (E2B: 201).
    Resumed(SandboxRow),
    /// It was running already (connect: 200; resume: 409).
    WasRunning(SandboxRow),
}

impl SandboxService {
    pub(crate) fn snapshot_dir(&self, snapshot_id: &str) -> std::path::PathBuf {
        self.dirs.data.join("snapshots").join(snapshot_id)
    }

    /// Pauses running sandbox `id` into a snapshot on disk: with its `memory`, or its files
    /// only. 409 when it is paused or being paused already, 404 when it is not running, 400
    /// for the files only of a sandbox without a disk.
    pub async fn pause(&self, id: &str, memory: bool) -> Result<(), SnapshotError> {
        let _op = self.ops.lock(id).await;
        if !memory {
            self.check_files_only(id).await?;
        }
        let now = now_ms();
        if !self
            .db
            .transition(id, &[State::Running], State::Pausing, None, now)
            .await?
        {
            return Err(match self.db.sandbox(id).await?.map(|r| r.state) {
                Some(State::Paused | State::Pausing) => {
                    SnapshotError::AlreadyPaused(id.to_string())
                }
                _ => SnapshotError::SandboxNotFound(id.to_string()),
            });
        }
        let row = self
            .db
            .sandbox(id)
            .await?
            .ok_or_else(|| SnapshotError::SandboxNotFound(id.to_string()))?;
        let snap_id = new_snapshot_id()?;
        let dir = self.snapshot_dir(&snap_id);
        // Recorded before anything is written, with its user: a restart knows the files.
        self.db
            .insert_snapshot(
                &SnapshotRow {
                    id: snap_id.clone(),
                    key_id: row.key_id.clone(),
                    kind: SnapshotPurpose::Pause,
                    name: None,
                    source_id: id.to_string(),
                    template_id: row.template_id.clone(),
                    dir: dir.to_string_lossy().into_owned(),
                    handle: None,
                    created_at: now,
                    deleted_at: None,
                },
                &[id],
            )
            .await?;
        let mut life = self.db.sandbox_lifecycle(id).await?;
        life.paused_in = Some(snap_id.clone());
        self.db.set_sandbox_lifecycle(id, &life).await?;
        // The proxy stops routing to it from here.
        let live = lock(&self.live).remove(id);
        let Some(live) = live else {
            return Err(self
                .pause_failed(&row, &snap_id, None, "the daemon does not run it".into())
                .await);
        };
        let paused = if memory {
            live.sandbox.pause_to_disk(&dir).await
        } else {
            live.sandbox.pause_files_to_disk(&dir).await
        };
        match paused {
            Ok(handle) => {
                let json = serde_json::to_string(&handle).map_err(SnapshotError::Encode)?;
                self.db.set_snapshot_handle(&snap_id, &json).await?;
                self.db.set_handle(id, None).await?;
                self.db
                    .transition(id, &[State::Pausing], State::Paused, None, now_ms())
                    .await?;
                // Its host network goes with its processes (a resume makes a new one from
                // the same rules; it leaves its private networks).
                self.networks.ended(&self.db, id).await;
                // It no longer runs on the snapshot it was restored from, if any.
                self.db.drop_snapshot_users(id, Some(&snap_id)).await?;
                self.collect_snapshots().await;
                Ok(())
            }
            Err(e) => {
                let refused = matches!(e, sandcell_runtime::Error::Refused { .. });
                match self
                    .pause_failed(&row, &snap_id, Some(live), e.to_string())
                    .await
                {
                    // Its guest's doing, and it runs on: 409 with the cause (runtime error).
                    SnapshotError::PauseFailedStillRunning { .. } if refused => {
                        Err(SnapshotError::Runtime(e))
                    }
                    answer => Err(answer),
                }
            }
        }
    }

    /// A filesystem-only pause needs the sandbox's files on a disk (without one they live in
    /// its memory).
    async fn check_files_only(&self, id: &str) -> Result<(), SnapshotError> {
        let row = self
            .db
            .sandbox(id)
            .await?
            .ok_or_else(|| SnapshotError::SandboxNotFound(id.to_string()))?;
        if row.disk_mib == 0 || self.sandbox_disk_mib().is_none() {
            return Err(SnapshotError::FilesOnlyWithoutDisk(id.to_string()));
        }
        Ok(())
    }

    /// Whether paused sandbox `id` was paused without its memory (its resume boots afresh).
    pub async fn paused_files_only(&self, id: &str) -> bool {
        self.paused_snapshot(id).await.is_ok_and(|h| {
            matches!(
                h.files,
                sandcell_runtime::snapshot::SnapshotFiles::Gvisor {
                    checkpoint_dir: None,
                    ..
                }
            )
        })
    }

    /// After a failed pause: the sandbox runs on if it still does, else it is an error.
    async fn pause_failed(
        &self,
        row: &SandboxRow,
        snap_id: &str,
        live: Option<Arc<Live>>,
        why: String,
    ) -> SnapshotError {
        let id = &row.id;
        let _ = self.db.remove_snapshot_user(snap_id, id).await;
        if let Ok(mut life) = self.db.sandbox_lifecycle(id).await {
            life.paused_in = None;
            let _ = self.db.set_sandbox_lifecycle(id, &life).await;
        }
        let running = match &live {
            Some(l) => matches!(l.sandbox.status().await, Ok(SandboxStatus::Running)),
            None => false,
        };
        let failed = SnapshotError::PauseFailed {
            id: id.clone(),
            why,
        };
        let message = failed.to_string();
        tracing::warn!("{message}");
        let answer = match failed {
            // E2B: 503 when it cannot be paused now and keeps running.
            SnapshotError::PauseFailed { id, why } if running => {
                SnapshotError::PauseFailedStillRunning { id, why }
            }
            failed => failed,
        };
        if let (true, Some(live)) = (running, live.clone()) {
            let handle = live
                .sandbox
                .handle()
                .and_then(|h| serde_json::to_string(&h).ok());
            let end_at = row.end_at.unwrap_or_else(now_ms);
            let _ = self
                .db
                .mark_running_again(row, State::Pausing, now_ms(), end_at, handle.as_deref())
                .await;
            lock(&self.live).insert(id.clone(), live);
        } else {
            if let Some(live) = live {
                let _ = tokio::time::timeout(DESTROY_TIMEOUT, live.sandbox.destroy()).await;
            }
            let _ = self
                .db
                .transition(
                    id,
                    &[State::Pausing],
                    State::Error,
                    Some(&message),
                    now_ms(),
                )
                .await;
        }
        self.collect_snapshots().await;
        answer
    }

    /// Resumes paused sandbox `id` (waiting for a pause in progress) with its end
    /// `timeout_secs` from now; a running one only has its end extended.
    pub async fn resume(
        self: &Arc<Self>,
        id: &str,
        timeout_secs: u64,
    ) -> Result<Resumed, SnapshotError> {
        let _op = self.ops.lock(id).await;
        let now = now_ms();
        let end_at = now + (timeout_secs as i64) * 1000;
        let row = self
            .db
            .sandbox(id)
            .await?
            .ok_or_else(|| SnapshotError::SandboxNotFound(id.to_string()))?;
        match row.state {
            State::Paused => {}
            State::Running => {
                self.db.set_end_at(id, end_at, true).await?;
                return Ok(Resumed::WasRunning(row));
            }
            _ => return Err(SnapshotError::SandboxNotFound(id.to_string())),
        }
        // Its memory comes back: the key's memory quota and the host's capacity
        // (sandboxes/admission.rs); refused, it stays paused. The admission is held until
        // the row is `resuming` (which counts as memory), so that concurrent creates and
        // resumes see this one.
        let admitted = self.admit_resume(&row).await?;
        let snapshot = self.paused_snapshot(id).await?;
        if !self
            .db
            .transition(id, &[State::Paused], State::Resuming, None, now)
            .await?
        {
            return Err(SnapshotError::SandboxNotFound(id.to_string()));
        }
        drop(admitted);
        let restored = self
            .restore_and_init(&snapshot, id, &snapshot.env, row.access_token.as_deref())
            .await;
        let sandbox = match restored {
            Ok(s) => s,
            Err(e) => {
                // The snapshot is intact: it stays paused and may be resumed again.
                let _ = self
                    .db
                    .transition(id, &[State::Resuming], State::Paused, None, now_ms())
                    .await;
                return Err(e.into());
            }
        };
        let handle = sandbox
            .handle()
            .and_then(|h| serde_json::to_string(&h).ok());
        lock(&self.live).insert(
            id.to_string(),
            Arc::new(Live {
                sandbox: sandbox.clone(),
                access_token: row.access_token.clone(),
            }),
        );
        let now = now_ms();
        self.db
            .mark_running_again(&row, State::Resuming, now, end_at, handle.as_deref())
            .await?;
        if let Err(e) = self.networks.started(&self.db, id, sandbox.network()).await {
            tracing::warn!("sandbox {id}: its network: {e}");
        }
        self.watch(id.to_string(), sandbox);
        let mut row = row;
        row.state = State::Running;
        row.end_at = Some(end_at);
        Ok(Resumed::Resumed(row))
    }

    /// Restores `snapshot` as running sandbox `id` and gives its agent `/init`. A failed
    /// restore, or a restored agent that does not answer (destroyed first), is tried again,
    /// up to [`RESTORE_ATTEMPTS`] times: on a loaded host runsc 20221219 sometimes restores
    /// an agent that never answers, or crashes restoring (SIGSEGV), where the next restore
    /// of the same image works.
    pub(crate) async fn restore_and_init(
        &self,
        snapshot: &SnapshotHandle,
        id: &str,
        env: &BTreeMap<String, String>,
        access_token: Option<&str>,
    ) -> Result<Arc<dyn Sandbox>, SandboxError> {
        let mut attempt = 1;
        loop {
            let sandbox = match self.restore(snapshot, id).await {
                Ok(sandbox) => sandbox,
                Err(e) if attempt >= RESTORE_ATTEMPTS => return Err(e.into()),
                Err(e) => {
                    tracing::warn!("sandbox {id}: {e}; restoring it again");
                    attempt += 1;
                    continue;
                }
            };
            let problem = match init_restored(&sandbox, env, access_token).await {
                Ok(()) => return Ok(sandbox),
                Err(problem) => problem,
            };
            let _ = tokio::time::timeout(DESTROY_TIMEOUT, sandbox.destroy()).await;
            if attempt >= RESTORE_ATTEMPTS {
                return Err(SandboxError::Restore(format!(
                    "sandbox {id}: {problem} (restore attempt {attempt} of {RESTORE_ATTEMPTS})"
                )));
            }
            tracing::warn!("sandbox {id}: {problem}; restoring it again");
            attempt += 1;
        }
    }

    /// The snapshot paused sandbox `id` is in.
    async fn paused_snapshot(&self, id: &str) -> Result<SnapshotHandle, SnapshotError> {
        let missing = |why: &'static str| SnapshotError::PausedWithoutSnapshot {
            id: id.to_string(),
            why,
        };
        let snap_id = self
            .db
            .sandbox_lifecycle(id)
            .await?
            .paused_in
            .ok_or_else(|| missing("no snapshot recorded"))?;
        let snap = self
            .db
            .snapshot(&snap_id)
            .await?
            .ok_or_else(|| missing("its snapshot is gone"))?;
        Ok(parse_handle(&snap)?)
    }

    /// A new running sandbox `id` restored from `snapshot` (its agent not yet told who it
    /// is: the caller sends `/init`), with a network made new from the rules recorded for
    /// `id` (networks/service.rs; none recorded: no network).
    pub(crate) async fn restore(
        &self,
        snapshot: &SnapshotHandle,
        id: &str,
    ) -> Result<Arc<dyn Sandbox>, Error> {
        let mut spec = RestoreSpec::new(id.to_string());
        spec.network = self.networks.spec_of(&self.db, id).await?;
        // The daemon is infrastructure: its restart must not kill user sandboxes.
        spec.outlive_owner = true;
        Ok(Arc::from(self.runtime.restore(snapshot, spec).await?))
    }

    /// At the timeout: pause if the sandbox was created with autoPause, else kill.
    pub async fn expire(self: &Arc<Self>, id: &str, reason: &'static str) -> Result<(), Error> {
        let revoked = reason.contains("revoked");
        let life = self.db.sandbox_lifecycle(id).await?;
        if !revoked && life.auto_pause {
            match self.pause(id, !life.auto_pause_files_only).await {
                Ok(()) => return Ok(()),
                // Paused already, or ended meanwhile.
                Err(e) if e.is_not_running() => return Ok(()),
                Err(e) => tracing::warn!("auto-pause of sandbox {id} failed ({e}); killing it"),
            }
        }
        self.kill(id, reason).await.map(|_| ())
    }

    /// Removes the snapshots nothing needs any more (files first go with their rows).
    pub async fn collect_snapshots(&self) {
        let unused = match self.db.take_unused_snapshots().await {
            Ok(unused) => unused,
            Err(e) => {
                tracing::warn!("collecting snapshots: {e}");
                return;
            }
        };
        for snap in unused {
            let dir = std::path::PathBuf::from(&snap.dir);
            if !dir.starts_with(self.dirs.data.join("snapshots")) {
                tracing::warn!(
                    "snapshot {} has its files outside the data dir ({}): left",
                    snap.id,
                    snap.dir
                );
                continue;
            }
            let removed =
                tokio::task::spawn_blocking(move || match std::fs::remove_dir_all(&dir) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                    _ => Ok(()),
                })
                .await;
            if let Ok(Err(e)) = removed {
                tracing::warn!("removing snapshot {}: {e}", snap.dir);
            }
        }
    }

    /// Directories under `<data-dir>/snapshots/` no row knows (a crash between a row's
    /// removal and its files').
    pub async fn remove_orphan_snapshot_dirs(&self) {
        let known: std::collections::BTreeSet<String> = match self.db.snapshot_dirs().await {
            Ok(dirs) => dirs.into_iter().collect(),
            Err(e) => {
                tracing::warn!("{e}");
                return;
            }
        };
        let Ok(entries) = std::fs::read_dir(self.dirs.data.join("snapshots")) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if !known.contains(&*path.to_string_lossy())
                && let Err(e) = std::fs::remove_dir_all(&path)
            {
                tracing::warn!("removing {}: {e}", path.display());
            }
        }
    }

    /// At start, a sandbox the previous daemon left paused, pausing or resuming.
    pub(crate) async fn reconcile_paused(
        self: &Arc<Self>,
        row: &SandboxRow,
        found: Option<sandcell_runtime::Result<Box<dyn Sandbox>>>,
    ) -> Result<(), Error> {
        let id = &row.id;
        let snapshot_ok = self
            .paused_snapshot(id)
            .await
            .is_ok_and(|h| SnapshotHandle::load(&h.dir).is_ok_and(|on_disk| on_disk == h))
            || self.complete_pause_snapshot(id).await?;
        let now = now_ms();
        match (row.state, found) {
            (State::Paused, _) if snapshot_ok => {}
            // Interrupted resume: its half-made sandbox is swept (nobody adopts it).
            (State::Resuming, _) if snapshot_ok => {
                self.db
                    .transition(id, &[State::Resuming], State::Paused, None, now)
                    .await?;
            }
            // Interrupted pause whose checkpoint was complete.
            (State::Pausing, found) if snapshot_ok => {
                if let Some(Ok(sandbox)) = found {
                    let _ = tokio::time::timeout(DESTROY_TIMEOUT, sandbox.destroy()).await;
                }
                self.db.set_handle(id, None).await?;
                self.db
                    .transition(id, &[State::Pausing], State::Paused, None, now)
                    .await?;
            }
            // Interrupted pause before its checkpoint: still running.
            (State::Pausing, Some(Ok(sandbox))) => {
                let sandbox: Arc<dyn Sandbox> = Arc::from(sandbox);
                let handle = sandbox
                    .handle()
                    .and_then(|h| serde_json::to_string(&h).ok());
                self.db
                    .mark_running_again(
                        row,
                        State::Pausing,
                        now,
                        row.end_at.unwrap_or(now),
                        handle.as_deref(),
                    )
                    .await?;
                lock(&self.live).insert(
                    id.clone(),
                    Arc::new(Live {
                        sandbox: sandbox.clone(),
                        access_token: row.access_token.clone(),
                    }),
                );
                self.watch(id.clone(), sandbox);
                tracing::info!("sandbox {id}: an interrupted pause left it running");
            }
            (state, _) => {
                let reason = format!(
                    "lost: the daemon stopped at or before {} while the sandbox was {} and \
                     its snapshot is incomplete",
                    rfc3339(now),
                    state.as_str()
                );
                self.db.close_usage_at_last_flush(id).await?;
                self.db
                    .transition(id, &[state], State::Error, Some(&reason), now)
                    .await?;
            }
        }
        Ok(())
    }

    /// A pause snapshot whose manifest the runtime wrote but whose handle the daemon had
    /// not saved yet (crash in between): saves it; true when it is complete.
    async fn complete_pause_snapshot(&self, id: &str) -> Result<bool, Error> {
        let Some(snap_id) = self.db.sandbox_lifecycle(id).await?.paused_in else {
            return Ok(false);
        };
        let Some(snap) = self.db.snapshot(&snap_id).await? else {
            return Ok(false);
        };
        let Ok(handle) = SnapshotHandle::load(std::path::Path::new(&snap.dir)) else {
            return Ok(false);
        };
        let json = serde_json::to_string(&handle).map_err(|e| Error::Io {
            what: "encoding a snapshot".into(),
            source: e.into(),
        })?;
        self.db.set_snapshot_handle(&snap_id, &json).await?;
        Ok(true)
    }
}

/// How long one `/init` to a restored agent may take before it is sent again on a new
/// connection (a healthy restored agent answers in milliseconds).
const INIT_TRY: std::time::Duration = std::time::Duration::from_secs(2);

/// `/init` to a restored agent, sent again on a new connection every [`INIT_TRY`] until
/// [`INIT_TIMEOUT`]: a connection to a just-restored gVisor agent sometimes never gets its
/// request read (a lost readiness event), where a new one is served.
async fn init_restored(
    sandbox: &Arc<dyn Sandbox>,
    env: &BTreeMap<String, String>,
    access_token: Option<&str>,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + INIT_TIMEOUT;
    let mut last = format!("the restored agent did not answer /init within {INIT_TIMEOUT:?}");
    while tokio::time::Instant::now() < deadline {
        match tokio::time::timeout(INIT_TRY, init_agent(sandbox, env, access_token)).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => {
                last = e.to_string();
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(_) => tracing::warn!(
                "sandbox {}: no answer to /init within {INIT_TRY:?}; sending it \
                 again on a new connection",
                sandbox.id()
            ),
        }
    }
    Err(last)
}

/// The runtime handle stored with a snapshot row.
pub(crate) fn parse_handle(snap: &SnapshotRow) -> Result<SnapshotHandle, HandleError> {
    let json = snap
        .handle
        .as_deref()
        .ok_or_else(|| HandleError::NeverCompleted(snap.id.clone()))?;
    serde_json::from_str(json).map_err(|source| HandleError::Unreadable {
        id: snap.id.clone(),
        source,
    })
}

/// The env a restored sandbox's processes get (the snapshot's, with
/// `extra` on top).
pub(crate) fn merged_env(
    snapshot: &SnapshotHandle,
    extra: Option<BTreeMap<String, String>>,
) -> BTreeMap<String, String> {
    let mut env = snapshot.env.clone();
    env.extend(extra.unwrap_or_default());
    env
}
