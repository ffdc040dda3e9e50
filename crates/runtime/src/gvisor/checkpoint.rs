//! Snapshots of gVisor sandboxes: `runsc checkpoint` and `runsc restore`.
//!
//! What runsc 20221219 (Debian bookworm) does, measured, and what follows:
//!
//! - `runsc checkpoint` saves every process and the sandbox's memory, and with
//!   `--overlay2=root:memory` also every write to the root (it lives in sandbox memory): the
//!   host overlayfs upper layer then only holds mount points. We still freeze a copy of it
//!   (`upper/`) and restore over `[upper/, image tree]`, which is correct for runsc versions
//!   without `--overlay2` too.
//! - A sandbox holding a bound or connected host Unix socket cannot be saved ("Cannot save
//!   endpoint with bound host socket"): the agent's listener and its connections are such
//!   sockets. So the agent is asked to close them first (`/sandcell/checkpoint-hold`, see
//!   `crates/agent/src/checkpoint.rs`) and listens again, in the restored sandbox, once the
//!   runtime puts the resume marker in its socket directory. A failed save ends the sandbox
//!   (runsc 20240729, measured), and a guest can bind host sockets of its own in that
//!   directory: so the sandbox is paused (`runsc pause`) once the agent holds, checked for
//!   such sockets (host_sockets.rs) and, if it has any, resumed and refused
//!   ([`Error::Refused`]: it runs on as it was); else the paused sandbox is checkpointed.
//! - That directory is the guest's to write: the resume marker is made without following
//!   a link there (crate::nofollow).
//! - The checkpointed sandbox stops (`--leave-running` hangs in this version and leaves the
//!   sandbox unusable), so a snapshot or fork of a running sandbox restores the parent in
//!   place at once from the same image: same id, same socket, its processes continue; open
//!   connections to it end. This is the closest correct thing to "keep running".
//! - `runsc restore` into a new container id with a new bundle (new root mount, new socket
//!   directory) works: that is how restores and fork children are made.
//! - Restored agents that accepted connections and never answered, reset the first one, or
//!   died (SIGSEGV, a tokio panic) were runsc's epoll defect, not concurrency: a registration
//!   the agent deleted before the checkpoint comes back ready after the restore and hands
//!   tokio a freed pointer (gVisor commit 5d857245b fixed it upstream, 2026-03). The agent
//!   works around it when it holds (see `crates/agent/src/checkpoint.rs`). Checkpoints and
//!   restores still run one at a time (`Shared::restores`): on a 2-core host concurrent ones only
//!   slow each other down. A fork of N costs N restores.
//! - gVisor cannot unlink a host socket from inside the sandbox: the runtime removes the
//!   agent's socket file before a restored agent binds it again.
//! - Restored sandboxes keep the snapshot's hostname (the kernel state is restored).
//! - Sandboxes with a network cannot be snapshotted yet (the restored netstack would need
//!   the same namespace set up again).

use super::*;
use crate::snapshot::{RestoreSpec, SnapshotFiles, SnapshotHandle, SnapshotKind};
use sandcell_proto::agent::{HELD_MARKER, RESUME_MARKER};
use std::time::Instant;

const CHECKPOINT_DIR: &str = "checkpoint";
const UPPER_DIR: &str = "upper";
/// How long the agent gets to answer the hold request and let go of its sockets (a second
/// or less; 5 s was seen to run out on a host loaded ~4x over its cores).
const HOLD_TIMEOUT: Duration = Duration::from_secs(15);
/// Checkpoints and restores (a restore up to the restored agent answering) run one at a
/// time: per runtime through its mutex [`Shared::restores`], and across runtimes and
/// processes through this file. Once blamed for restored agents that never answered; that
/// was runsc's epoll defect (module docs), and one at a time is kept because concurrent
/// runsc checkpoints and restores only compete for the same cores. The daemon, a `sandcell
/// run` beside it and test binaries all drive the host's one runsc, so the runtime's mutex
/// alone is not enough (`flock` locks of two opens conflict also within one process).
const HOST_LOCK: &str = "/run/sandcell-gvisor-checkpoint.lock";

/// Held across one checkpoint or restore: the runtime's mutex first (so that waiting tasks
/// do not each hold a blocking thread), then an exclusive `flock` on [`HOST_LOCK`], released
/// when the file closes (on drop, or when the process dies).
struct OneAtATime {
    _file: std::fs::File,
    _guard: tokio::sync::OwnedMutexGuard<()>,
}

async fn one_at_a_time(shared: &Shared) -> Result<OneAtATime> {
    let guard = shared.restores.clone().lock_owned().await;
    let file = tokio::task::spawn_blocking(|| -> std::io::Result<std::fs::File> {
        use std::os::fd::AsRawFd;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(HOST_LOCK)?;
        // SAFETY: flock(2) on a file descriptor we own; no memory is involved.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(f)
    })
    .await
    .map_err(|e| Error::io(RT, format!("locking {HOST_LOCK}"), std::io::Error::other(e)))?
    .map_err(|e| Error::io(RT, format!("locking {HOST_LOCK}"), e))?;
    Ok(OneAtATime {
        _file: file,
        _guard: guard,
    })
}

/// How long the checkpointed `runsc run` gets to exit by itself before it and its sandbox
/// are killed: not at all. Once `runsc checkpoint` has returned, the state is saved (the
/// sentry wrote it to the file runsc handed it before answering) and the sandbox is of no
/// more use; and a sandbox checkpointed while paused (as ours are, see `freeze_checked`)
/// never exits by itself with runsc 0.0~20240729. Every pause and snapshot waited out the
/// 10 s this once was (pause through the daemon 10.5-10.7 s, 3 of 3), then 250 ms, which
/// was still 250-280 ms of a 350 ms checkpoint (`RUST_LOG=sandcell_runtime::gvisor=debug`
/// on bench_gvisor_snapshot: runsc checkpoint done at 70-95 ms, its processes gone at
/// 341-373 ms).
const OLD_RUNSC_EXIT: Duration = Duration::ZERO;
/// The same for runsc 0.0~20221219 (no `--net-disconnect-ok`), whose `runsc run` exits and
/// removes the container by itself after a checkpoint: its own cleanup is not cut short.
const OLDEST_RUNSC_EXIT: Duration = Duration::from_secs(10);

impl Shared {
    /// `runsc restore` of `image` into container `id` from `bundle`, with the flags of
    /// [`Shared::sandbox_command`].
    pub(in crate::gvisor) fn restore_command(
        &self,
        bundle: &Path,
        id: &str,
        network: bool,
        host_writes: bool,
        image: &Path,
    ) -> tokio::process::Command {
        let mut cmd = self.sandbox_command_root(network, host_writes);
        cmd.arg("restore")
            .arg(format!("--image-path={}", image.display()))
            .arg(format!("--bundle={}", bundle.display()))
            .arg(id);
        cmd
    }
}

fn unsupported(op: &'static str, why: impl Into<String>) -> Error {
    Error::Unsupported {
        runtime: RT,
        op,
        why: why.into(),
    }
}

/// Checkpoints the running sandbox into `dest` (created; must not exist). Afterwards the
/// sandbox's runsc processes are gone and its files are still there; the caller restores it
/// in place or removes it.
async fn checkpoint_to(
    sb: &GvisorSandbox,
    dest: &Path,
    kind: SnapshotKind,
) -> Result<SnapshotHandle> {
    let pid = check_checkpointable(sb)?;
    let (images, upper) = create_snapshot_dirs(dest)?;
    let one_at_a_time_guard = one_at_a_time(&sb.shared).await?;
    // Ordering: the agent must hold (no host socket open) before the sandbox is frozen;
    // frozen, nothing in it binds a new host socket while we look for one (a save that
    // meets one ends the sandbox); the agent's socket file goes only then (the guest could
    // bind that name itself once it is free); and the checkpoint must be gone before its
    // upper layer is copied.
    let started = Instant::now();
    hold_agent(sb).await?;
    let held = started.elapsed();
    freeze_checked(sb, pid).await?;
    if let Err(e) = remove_socket_file(sb) {
        thaw(sb).await;
        return Err(e);
    }
    let frozen = started.elapsed();
    run_checkpoint(sb, pid, &images).await?;
    let saved = started.elapsed();
    wait_gone(sb, pid).await?;
    let gone = started.elapsed();
    // The copy below needs no runsc; restore_in_place takes the lock again.
    drop(one_at_a_time_guard);

    // The root's layers, flattened (flatten.rs): the snapshot stands on the image alone. A
    // failure here leaves the sandbox's own files as they were: it is restored in place.
    if let Err(e) = flatten_root(sb, &upper).await {
        let restored = restore_in_place(sb, &images).await;
        let _ = crate::util::remove_dir_all_if_exists(dest);
        return Err(match restored {
            Ok(()) => e,
            Err(again) => Error::Snapshot {
                path: dest.to_path_buf(),
                problem: format!("{e}; restoring the sandbox after it: {again}"),
            },
        });
    }
    tracing::debug!(
        "checkpoint of {}: agent held at {held:?}, frozen and checked at {frozen:?}, \
         runsc checkpoint done at {saved:?}, its processes gone at {gone:?}, root \
         flattened at {:?}",
        sb.id,
        started.elapsed()
    );
    let handle = SnapshotHandle {
        format: crate::snapshot::SNAPSHOT_FORMAT,
        runtime: RT,
        kind,
        dir: dest.to_path_buf(),
        source_id: sb.id.clone(),
        image: (&sb.image).into(),
        vcpus: sb.vcpus,
        memory_mib: sb.memory_mib,
        env: sb.env.clone(),
        files: SnapshotFiles::Gvisor {
            checkpoint_dir: Some(images),
            upper_dir: upper,
            disk_mib: sb.disk_mib,
        },
    };
    handle.save()?;
    Ok(handle)
}

/// Refuses, before touching the sandbox, what runsc cannot checkpoint; the sandbox's
/// `runsc run` pid.
fn check_checkpointable(sb: &GvisorSandbox) -> Result<u32> {
    sb.require_running("snapshot")?;
    if sb.paused.load(Ordering::SeqCst) {
        return Err(unsupported(
            "snapshot a paused sandbox",
            "resume it first (runsc checkpoints running sandboxes)",
        ));
    }
    if lock(&sb.netns).is_some() && !sb.shared.runsc.net_disconnect_ok {
        // gVisor then refuses to save any connected TCP endpoint, TIME_WAIT ones included
        // (which /proc/net/tcp does not show, so there is no reliable check up front), and
        // a refused save ends the sandbox: refuse before touching it.
        return Err(unsupported(
            "snapshot",
            format!(
                "{} cannot checkpoint a sandbox with a network (it cannot save TCP \
                 connections); runsc 2023 or later (--net-disconnect-ok) can: `make deps` \
                 installs Debian 13's",
                sb.shared.runsc.version
            ),
        ));
    }
    if sb.image.rootfs_dir.is_none() {
        return Err(unsupported(
            "snapshot",
            "the image of an adopted sandbox is not known to this process",
        ));
    }
    let Phase::Started(pid) = *lock(&sb.phase) else {
        return Err(Error::WrongState {
            runtime: RT,
            id: sb.id.clone(),
            state: sb.phase_name().into(),
            op: "snapshot",
        });
    };
    Ok(pid)
}

/// `dest` (which must not exist) and its checkpoint directory; (checkpoint dir, upper dir).
fn create_snapshot_dirs(dest: &Path) -> Result<(PathBuf, PathBuf)> {
    let upper = create_snapshot_dir(dest)?;
    let images = dest.join(CHECKPOINT_DIR);
    std::fs::create_dir(&images)
        .map_err(|e| Error::io(RT, format!("creating {}", images.display()), e))?;
    Ok((images, upper))
}

/// `dest` (which must not exist), its parents as needed; where its upper layer goes.
pub(super) fn create_snapshot_dir(dest: &Path) -> Result<PathBuf> {
    let io = |what: String| move |e| Error::io(RT, what, e);
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
    }
    std::fs::create_dir(dest).map_err(io(format!(
        "creating snapshot directory {} (it must not exist)",
        dest.display()
    )))?;
    Ok(dest.join(UPPER_DIR))
}

/// Asks the agent to let go of its host sockets and waits until it has.
async fn hold_agent(sb: &GvisorSandbox) -> Result<()> {
    // The agent lets go of its host sockets. It drops its listener after its connections,
    // so a refused connection says it has let go of all of them.
    let marker = sb.paths.host.join(RESUME_MARKER);
    let _ = std::fs::remove_file(&marker);
    let held = sb.paths.host.join(HELD_MARKER);
    let _ = std::fs::remove_file(&held);
    let client = sb.agent_client();
    match tokio::time::timeout(HOLD_TIMEOUT, client.checkpoint_hold()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(hold_failed(sb, format!("asking the agent to hold: {e}"))),
        Err(_) => {
            return Err(hold_failed(
                sb,
                format!("no answer within {HOLD_TIMEOUT:?}"),
            ));
        }
    }
    // The agent says when it holds no host socket any more (see HELD_MARKER).
    let deadline = tokio::time::Instant::now() + HOLD_TIMEOUT;
    while std::fs::symlink_metadata(&held).is_err() {
        if tokio::time::Instant::now() >= deadline {
            let _ = resume_agent(sb);
            return Err(hold_failed(
                sb,
                format!(
                    "the agent did not let go of its host sockets {HOLD_TIMEOUT:?} after \
                     agreeing to hold{}",
                    sb.console_tail()
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let _ = std::fs::remove_file(&held);
    Ok(())
}

/// `runsc pause`s the holding sandbox and checks that no process in it holds a Unix socket
/// bound in its agent directory: runsc cannot save one ("Cannot save endpoint with bound
/// host socket") and a failed save ends the sandbox (runsc 20240729, measured), so such a
/// sandbox is refused here, resumed and handed back running. Paused, it cannot bind a new
/// one before the checkpoint (which saves the paused sandbox; the restore runs).
async fn freeze_checked(sb: &GvisorSandbox, pid: u32) -> Result<()> {
    let netns = lock(&sb.netns).clone();
    if let Err(e) = sb
        .shared
        .runsc_ok_in(netns.as_deref(), &["pause", &sb.id])
        .await
    {
        let _ = resume_agent(sb);
        wait_listening(sb).await;
        return Err(e);
    }
    let bound = crate::gvisor::host_sockets::bound_in_agent_dir(pid);
    if bound.is_empty() {
        return Ok(());
    }
    thaw(sb).await;
    Err(Error::Refused {
        runtime: RT,
        id: sb.id.clone(),
        op: "checkpoint",
        why: format!(
            "a process in the sandbox holds a Unix socket bound in its agent directory \
             /run/sandcell-host ({}), which gVisor cannot checkpoint; close it (and bind \
             sockets elsewhere, e.g. /tmp) and retry; the sandbox keeps running",
            bound.join(", ")
        ),
    })
}

/// Undoes [`freeze_checked`] after a refusal: the sandbox runs and its agent listens again.
async fn thaw(sb: &GvisorSandbox) {
    let netns = lock(&sb.netns).clone();
    if let Err(e) = sb
        .shared
        .runsc_ok_in(netns.as_deref(), &["resume", &sb.id])
        .await
    {
        tracing::warn!(
            "gvisor sandbox {}: resuming after a refused checkpoint: {e}",
            sb.id
        );
    }
    if resume_agent(sb).is_ok() {
        wait_listening(sb).await;
    }
}

/// `runsc checkpoint` into `images`. On failure a sandbox still there gets its agent back
/// (and a clearer error for runsc's refusal of TCP state); one that is gone has ended.
async fn run_checkpoint(sb: &GvisorSandbox, pid: u32, images: &Path) -> Result<()> {
    // From here the end of this `runsc run` is not the sandbox's end (its waiter stays
    // silent), unless the checkpoint fails.
    let launch = sb.launch.fetch_add(1, Ordering::SeqCst);
    let image_arg = format!("--image-path={}", images.display());
    let netns = lock(&sb.netns).clone();
    let mut args = vec!["checkpoint", image_arg.as_str()];
    if sb.shared.runsc.checkpoint_compression {
        args.push("--compression=none");
    }
    args.push(&sb.id);
    if let Err(e) = sb.shared.runsc_ok_in(netns.as_deref(), &args).await {
        if crate::owner::process_start_time(pid).is_some() && sb.shared.has_state(&sb.id) {
            sb.launch.store(launch, Ordering::SeqCst);
            thaw(sb).await;
            if let Error::Command { stderr, .. } = &e
                && stderr.contains("unsupported networking state")
            {
                return Err(unsupported(
                    "snapshot",
                    format!(
                        "the sandbox has TCP connections open or closed less than 60 s ago, and {} \
                         cannot save those (runsc 2023 or later with --net-disconnect-ok \
                         resets them instead); close them, wait a minute and retry",
                        sb.shared.runsc.version
                    ),
                ));
            }
        } else {
            sb.exit.set(SandboxExit::Exited {
                code: -1,
                detail: format!("the sandbox stopped in a failed checkpoint: {e}"),
            });
        }
        return Err(e);
    }
    Ok(())
}

fn hold_failed(sb: &GvisorSandbox, problem: String) -> Error {
    Error::Connect {
        runtime: RT,
        id: sb.id.clone(),
        port: AGENT_PORT,
        problem: format!("preparing a checkpoint: {problem}"),
    }
}

fn remove_socket_file(sb: &GvisorSandbox) -> Result<()> {
    match std::fs::remove_file(&sb.paths.socket) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(
            RT,
            format!("removing the agent socket {}", sb.paths.socket.display()),
            e,
        )),
        _ => Ok(()),
    }
}

/// Lets a holding agent listen again (see `crates/agent/src/checkpoint.rs`). The marker
/// goes into the guest's writable agent directory: created through the directory's
/// descriptor, never through a link the guest put at its name (crate::nofollow).
fn resume_agent(sb: &GvisorSandbox) -> Result<()> {
    remove_socket_file(sb)?;
    let marker = sb.paths.host.join(RESUME_MARKER);
    crate::nofollow::open_dir(&sb.paths.host)
        .and_then(|dir| crate::nofollow::replace_file(&dir, RESUME_MARKER, b""))
        .map_err(|e| {
            Error::io(
                RT,
                format!("writing the resume marker {}", marker.display()),
                e,
            )
        })
}

/// Waits (at most [`HOLD_TIMEOUT`]) for a resumed agent to accept connections again, so
/// that a failed snapshot hands back a sandbox that answers.
async fn wait_listening(sb: &GvisorSandbox) {
    let deadline = tokio::time::Instant::now() + HOLD_TIMEOUT;
    while crate::nofollow::connect_unix(&sb.paths.socket)
        .await
        .is_err()
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Waits for the checkpointed `runsc run` (pid) to exit and for runsc to forget the
/// container, forcing both after [`OLD_RUNSC_EXIT`] ([`OLDEST_RUNSC_EXIT`] for the runsc
/// that cleans up by itself).
async fn wait_gone(sb: &GvisorSandbox, pid: u32) -> Result<()> {
    let grace = if sb.shared.runsc.net_disconnect_ok {
        OLD_RUNSC_EXIT
    } else {
        OLDEST_RUNSC_EXIT
    };
    let deadline = tokio::time::Instant::now() + grace;
    while crate::owner::process_start_time(pid).is_some() || sb.shared.has_state(&sb.id) {
        if crate::owner::process_start_time(pid).is_none() {
            // `runsc run` is gone but the container is still listed: runsc 20240729 keeps
            // a checkpointed container's state until it is deleted (20221219 removed it
            // itself). Delete it now rather than waiting out the deadline.
            sb.shared.force_delete(&sb.id).await?;
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            kill_pid(pid, libc::SIGKILL);
            sb.shared.force_delete(&sb.id).await?;
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// Merges the stopped sandbox's upper layer and the frozen layers below it into `dest`
/// (see flatten.rs), bounded by twice what its disk (or, without one, its memory) holds.
pub(super) async fn flatten_root(sb: &GvisorSandbox, dest: &Path) -> Result<()> {
    let mut layers = vec![sb.paths.upper.clone()];
    layers.extend(lock(&sb.lowers).iter().cloned());
    let max_bytes = u64::from(sb.disk_mib.unwrap_or(sb.memory_mib)).saturating_mul(2 << 20);
    let to = dest.to_path_buf();
    let flattened = tokio::task::spawn_blocking(move || {
        let layers: Vec<&Path> = layers.iter().map(PathBuf::as_path).collect();
        super::super::flatten::flatten(&layers, &to, max_bytes)
    })
    .await;
    let problem = match flattened {
        Ok(Ok(copied)) => {
            tracing::debug!(
                "gvisor sandbox {}: flattened its root ({} entries, {} bytes)",
                sb.id,
                copied.entries,
                copied.bytes
            );
            return Ok(());
        }
        Ok(Err(e)) => e.to_string(),
        Err(e) => e.to_string(),
    };
    Err(Error::Snapshot {
        path: dest.to_path_buf(),
        problem: format!("recording the root of sandbox {}: {problem}", sb.id),
    })
}

/// Restores the checkpointed sandbox `sb` from `images` into itself (same id, files and
/// socket; see the module docs for why).
async fn restore_in_place(sb: &GvisorSandbox, images: &Path) -> Result<()> {
    let _one_at_a_time = one_at_a_time(&sb.shared).await?;
    // runsc removes the container's cgroup with the container; ours holds the limits.
    SandboxCgroup::create(sb.shared.cgroups, &sb.id, sb.memory_mib, sb.vcpus)?;
    if let Some(net) = sb.network_addresses().await {
        super::network::readdress(&net).await?;
    }
    resume_agent(sb)?;
    *lock(&sb.restore_from) = Some(images.to_path_buf());
    *lock(&sb.phase) = Phase::Created;
    sb.start().await
}

pub(super) async fn snapshot(
    sb: &GvisorSandbox,
    dest: &Path,
    kind: SnapshotKind,
) -> Result<SnapshotHandle> {
    let handle = checkpoint_to(sb, dest, kind).await?;
    let images = dest.join(CHECKPOINT_DIR);
    restore_in_place(sb, &images).await?;
    Ok(handle)
}

pub(super) async fn pause_to_disk(sb: &GvisorSandbox, dest: &Path) -> Result<SnapshotHandle> {
    let handle = checkpoint_to(sb, dest, SnapshotKind::Full).await?;
    // Its processes are gone already: recorded as stopped on request, so that destroy only
    // removes files.
    sb.stopping.store(true, Ordering::SeqCst);
    sb.exit.set(SandboxExit::Destroyed);
    sb.destroy().await?;
    Ok(handle)
}

pub(super) async fn fork(
    sb: &GvisorSandbox,
    count: usize,
    dest: &Path,
) -> Result<Vec<Box<dyn Sandbox>>> {
    if count == 0 {
        return Ok(Vec::new());
    }
    let handle = checkpoint_to(sb, dest, SnapshotKind::Fork).await?;
    restore_in_place(sb, &dest.join(CHECKPOINT_DIR)).await?;
    // One after the other (see RESTORES).
    let mut children: Vec<Box<dyn Sandbox>> = Vec::with_capacity(count);
    for _ in 0..count {
        let spec = RestoreSpec {
            id: crate::new_sandbox_id()?,
            boot_timeout: sb.boot_timeout,
            outlive_owner: sb.outlive_owner,
            network: lock(&sb.network_spec).clone(),
        };
        match restore_new(sb.shared.clone(), &handle, spec).await {
            Ok(child) => children.push(Box::new(child)),
            Err(e) => {
                for child in &children {
                    let _ = child.destroy().await;
                }
                return Err(e);
            }
        }
    }
    Ok(children)
}

/// A new sandbox restored from a gvisor snapshot, running once its agent listens.
pub(in crate::gvisor) async fn restore_new(
    shared: Arc<Shared>,
    snapshot: &SnapshotHandle,
    restore: RestoreSpec,
) -> Result<GvisorSandbox> {
    let SnapshotFiles::Gvisor {
        checkpoint_dir,
        upper_dir,
        disk_mib,
    } = &snapshot.files
    else {
        return Err(Error::InvalidSpec {
            runtime: RT,
            problem: format!(
                "snapshot {} is of the {} runtime",
                snapshot.dir.display(),
                snapshot.runtime
            ),
        });
    };
    if !crate::validate_id(&restore.id) {
        return Err(Error::InvalidSpec {
            runtime: RT,
            problem: format!("bad sandbox id {:?}", restore.id),
        });
    }
    snapshot.check_files()?;
    let image: crate::Image = (&snapshot.image).into();
    let base = image.rootfs_dir.clone().ok_or_else(|| Error::Image {
        image: image.name.clone(),
        problem: "has no unpacked rootfs/ tree, which the gvisor runtime needs".into(),
    })?;
    let mut spec = SandboxSpec::new(restore.id.clone(), image);
    spec.vcpus = snapshot.vcpus;
    spec.memory_mib = snapshot.memory_mib;
    spec.env = snapshot.env.clone();
    spec.boot_timeout = restore.boot_timeout;
    spec.outlive_owner = restore.outlive_owner;
    spec.disk_mib = *disk_mib;
    let paths = Paths::new(&shared.dirs, &spec.id);
    crate::owner::create_run_dir(&shared.dirs, &spec.id, RT, spec.outlive_owner)?;
    let _one_at_a_time = one_at_a_time(&shared).await?;
    let dirs = shared.dirs.clone();
    let sandbox = GvisorSandbox::new(shared, &spec, paths);
    let started = async {
        // A disk of the same size under the restored root (the frozen upper layer is one of
        // its lowers; the new upper is on the new disk).
        if let Some(mib) = spec.disk_mib {
            super::super::disk::create(&dirs, &spec.id, mib).await?;
        }
        // Before prepare: the bundle names the namespace, and prepare points the restored
        // root's resolv.conf at this network's DNS server.
        if let Some(net) = &restore.network {
            sandbox.attach_network(net).await?;
        }
        sandbox.prepare(&spec, &[upper_dir, &base]).await?;
        *lock(&sandbox.lowers) = vec![upper_dir.clone()];
        // No checkpoint (a filesystem-only pause): a fresh boot on the saved files.
        if let Some(images) = checkpoint_dir {
            resume_agent(&sandbox)?;
            *lock(&sandbox.restore_from) = Some(images.clone());
        }
        sandbox.start().await
    };
    if let Err(e) = started.await {
        let _ = sandbox.destroy().await;
        return Err(Error::Snapshot {
            path: snapshot.dir.clone(),
            problem: format!("restoring it as {}: {e}", restore.id),
        });
    }
    Ok(sandbox)
}
