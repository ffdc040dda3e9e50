//! A warm pool of idle `sandcell-vmm --wait-restore` processes: exec, dynamic loading, KVM
//! VM creation and the control socket are done before a sandbox needs them, so a create
//! from a template snapshot only sends the `restore` request.
//!
//! Each idle VMM has a slot directory `<run-dir>/.vmm-pool/<slot>/` with `control.sock`,
//! `vmm.log` (its stdout and stderr) and `vmm.pid`. Taking one hands over the process; the
//! pool starts a replacement at once (a fork and exec: cheap; the replacement gets ready
//! while the taker restores).
//!
//! The idle VMMs are started in their own session, not tied to the daemon's life, because
//! the VM one of them becomes must outlive a daemon restart like a cold-booted one. So that
//! none leaks: dropping the pool kills its idle VMMs, and a new pool kills the idle VMMs
//! that a previous pool in the same run dir left behind (a daemon killed with -9), checked
//! by their command line naming the slot's socket (a reused pid would not).
//!
//! With the jail on, an idle VMM is jailed from its start (jail/pooled.rs): its control
//! socket is in the slot's `vmm/` directory, and it has a second slot directory, for the
//! disk top and snapshots, under `<data-dir>/sandboxes/.vmm-pool/<slot>/vmm`.

use crate::util::{kill_pid, remove_dir_all_if_exists};
use crate::{Dirs, Error, Result};
use sandcell_proto::sync::lock;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::RT;
use super::jail::{JailPolicy, VMM_DIR, VmmJail};

/// The pool directory's name under the run dir (a leading dot: never a sandbox id).
const POOL_DIR: &str = ".vmm-pool";
/// How long a just-started VMM may take to bind its control socket.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// One idle VMM, owned by whoever took it.
pub(super) struct PooledVmm {
    pub(super) child: tokio::process::Child,
    pub(super) pid: u32,
    pub(super) slot: PathBuf,
    /// Jailed: its jail, and the slot's state directory (its `vmm/` is the VMM's).
    pub(super) jail: Option<(VmmJail, PathBuf)>,
}

impl PooledVmm {
    pub(super) fn control(&self) -> PathBuf {
        match self.jail {
            Some(_) => self.slot.join(VMM_DIR).join("control.sock"),
            None => self.slot.join("control.sock"),
        }
    }

    pub(super) fn log(&self) -> PathBuf {
        self.slot.join("vmm.log")
    }

    /// Kills the process and removes its slot (a take that was not used).
    pub(super) fn discard(self) {
        kill_pid(self.pid, libc::SIGKILL);
        let _ = remove_dir_all_if_exists(&self.slot);
        if let Some((jail, state_slot)) = self.jail {
            let _ = remove_dir_all_if_exists(&state_slot);
            // Kills what is left in its cgroup and removes it; the uid is free after.
            if let Err(e) = jail.release() {
                tracing::warn!("warm VMM pool: {e}");
            }
        }
        // Dropping the Child lets tokio reap it in the background.
    }
}

pub(super) struct WarmPool {
    vmm: PathBuf,
    dir: PathBuf,
    /// Where jailed slots keep their state directories.
    state_dir: PathBuf,
    jail: Option<JailPolicy>,
    size: usize,
    idle: Mutex<VecDeque<PooledVmm>>,
    next: AtomicU64,
    /// Set by [`WarmPool::stop`]: no more idle VMMs are started.
    stopped: std::sync::atomic::AtomicBool,
}

impl WarmPool {
    /// A pool of `size` idle VMMs under `dirs.run`, empty until the first [`WarmPool::take`].
    /// Kills what an earlier pool there left behind.
    pub(super) fn new(
        dirs: &Dirs,
        vmm: &Path,
        size: usize,
        jail: Option<JailPolicy>,
    ) -> std::sync::Arc<WarmPool> {
        let dir = dirs.run.join(POOL_DIR);
        let state_dir = dirs.sandbox_state_dir(POOL_DIR);
        kill_leftovers(&dir, &state_dir);
        std::sync::Arc::new(WarmPool {
            vmm: vmm.to_path_buf(),
            dir,
            state_dir,
            jail,
            size,
            idle: Mutex::new(VecDeque::new()),
            next: AtomicU64::new(0),
            stopped: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Kills the idle VMMs and stops refills: for a daemon that exits (its runtime, and so
    /// this pool, may never be dropped before the process ends).
    pub(super) fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        let idle: Vec<_> = lock(&self.idle).drain(..).collect();
        for vmm in idle {
            vmm.discard();
        }
    }

    /// An idle VMM whose control socket is bound (started now if the pool is empty), and
    /// the pool refilled to its size.
    pub(super) async fn take(&self) -> Result<PooledVmm> {
        let taken = lock(&self.idle).pop_front();
        let vmm = match taken {
            Some(v) => v,
            None => self.spawn()?,
        };
        self.refill();
        match wait_ready(&vmm).await {
            Ok(()) => Ok(vmm),
            Err(e) => {
                vmm.discard();
                Err(e)
            }
        }
    }

    /// Starts idle VMMs until the pool holds its size. Failures are logged: the next take
    /// starts its own.
    pub(super) fn refill(&self) {
        loop {
            if self.stopped.load(Ordering::SeqCst) || lock(&self.idle).len() >= self.size {
                return;
            }
            match self.spawn() {
                Ok(v) => lock(&self.idle).push_back(v),
                Err(e) => {
                    tracing::warn!("warm VMM pool: {e}");
                    return;
                }
            }
        }
    }

    /// How many idle VMMs the pool holds.
    #[cfg(test)]
    fn idle(&self) -> usize {
        lock(&self.idle).len()
    }

    fn spawn(&self) -> Result<PooledVmm> {
        if self.stopped.load(Ordering::SeqCst) {
            return Err(Error::io(
                RT,
                "starting an idle VMM",
                std::io::Error::other("the warm pool was stopped (the daemon is exiting)"),
            ));
        }
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        let name = format!("{}-{n}", std::process::id());
        let slot = self.dir.join(&name);
        let io = |what: String| move |e| Error::io(RT, what, e);
        remove_dir_all_if_exists(&slot).map_err(io(format!("clearing {}", slot.display())))?;
        crate::dirs::create_private_dir(&slot)
            .map_err(io(format!("creating {}", slot.display())))?;
        let log_path = slot.join("vmm.log");
        let log = crate::util::open_log(&log_path)
            .map_err(io(format!("opening {}", log_path.display())))?;
        let log2 = log
            .try_clone()
            .map_err(io("duplicating the log fd".into()))?;
        let mut command = tokio::process::Command::new(&self.vmm);
        crate::detach::detached(&mut command);
        let jail = match &self.jail {
            Some(policy) => Some(self.jail_slot(policy, &name, &slot, &mut command)?),
            None => None,
        };
        let control = match jail {
            Some(_) => slot.join(VMM_DIR).join("control.sock"),
            None => slot.join("control.sock"),
        };
        let spawned = command
            .arg("--wait-restore")
            .arg("--control-socket")
            .arg(control)
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn();
        let child = match spawned {
            Ok(child) => child,
            Err(e) => {
                if let Some((jail, state_slot)) = jail {
                    let _ = remove_dir_all_if_exists(&state_slot);
                    let _ = jail.release();
                }
                return Err(Error::io(
                    RT,
                    format!("starting {} --wait-restore", self.vmm.display()),
                    e,
                ));
            }
        };
        let pid = child.id().unwrap_or(0);
        let vmm = PooledVmm {
            child,
            pid,
            slot,
            jail,
        };
        let pid_file = vmm.slot.join("vmm.pid");
        if let Err(e) = std::fs::write(&pid_file, pid.to_string()) {
            vmm.discard();
            return Err(Error::io(RT, format!("writing {}", pid_file.display()), e));
        }
        Ok(vmm)
    }

    /// The jail of slot `name` (jail/pooled.rs), `--jail` added to `command`: its state
    /// directory made, then the jail, undone on failure.
    fn jail_slot(
        &self,
        policy: &JailPolicy,
        name: &str,
        slot: &Path,
        command: &mut tokio::process::Command,
    ) -> Result<(VmmJail, PathBuf)> {
        let state_slot = self.state_dir.join(name);
        remove_dir_all_if_exists(&state_slot)
            .and_then(|()| crate::dirs::create_private_dir(&state_slot))
            .map_err(|e| Error::io(RT, format!("creating {}", state_slot.display()), e))?;
        let jailed =
            super::jail::pooled::prepare(policy, &format!("pool-{name}"), slot, &state_slot)
                .map_err(Error::from)
                .and_then(|jail| match jail.apply(command) {
                    Ok(()) => Ok(jail),
                    Err(e) => {
                        let _ = jail.release();
                        Err(e.into())
                    }
                });
        match jailed {
            Ok(jail) => Ok((jail, state_slot)),
            Err(e) => {
                let _ = remove_dir_all_if_exists(&state_slot);
                Err(e)
            }
        }
    }
}

impl Drop for WarmPool {
    fn drop(&mut self) {
        for vmm in lock(&self.idle).drain(..) {
            vmm.discard();
        }
    }
}

/// Waits for the VMM's control socket to appear (it binds it before its event loop).
async fn wait_ready(vmm: &PooledVmm) -> Result<()> {
    let control = vmm.control();
    let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
    loop {
        if tokio::net::UnixStream::connect(&control).await.is_ok() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::io(
                RT,
                format!(
                    "waiting for the pooled VMM (pid {}) to bind {} ({})",
                    vmm.pid,
                    control.display(),
                    crate::util::last_line(&vmm.log(), 2048)
                ),
                std::io::Error::from(std::io::ErrorKind::TimedOut),
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Kills the idle VMMs of the slots under `dir` (whose command line still names the slot's
/// socket) and removes the slots, their state slots under `state_dir`, and their jails'
/// cgroups.
fn kill_leftovers(dir: &Path, state_dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let slot = entry.path();
            if let Some(pid) = std::fs::read_to_string(slot.join("vmm.pid"))
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
                && is_pooled_vmm_of(pid, &slot)
            {
                kill_pid(pid, libc::SIGKILL);
            }
            let _ = remove_dir_all_if_exists(&slot);
            let cgroup = format!("pool-{}", entry.file_name().to_string_lossy());
            if let Some(cgroup) = super::jail::leftover_cgroup(&cgroup)
                && let Err(e) = cgroup.remove()
            {
                tracing::warn!("warm VMM pool: a leftover jail's cgroup: {e}");
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir(state_dir) {
        for entry in entries.flatten() {
            let _ = remove_dir_all_if_exists(&entry.path());
        }
    }
}

/// Whether process `pid` is an idle VMM started for `slot`.
pub(super) fn is_pooled_vmm_of(pid: u32, slot: &Path) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline);
    cmdline.contains("--wait-restore")
        && cmdline.contains(&*slot.join("control.sock").to_string_lossy())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in "VMM" (a shell script) shows the pool's bookkeeping: sizes, refills and
    /// that dropping the pool kills its idle processes. The real `--wait-restore` VMM is
    /// exercised in the nested harness.
    #[tokio::test]
    async fn pool_refills_and_kills_its_idle_processes_on_drop() {
        let tmp = tempfile::tempdir().unwrap();
        let script = tmp.path().join("fake-vmm");
        // Binds nothing: the pool's take would time out, so the test only spawns and drops.
        std::fs::write(&script, "#!/bin/sh\nexec sleep 300\n").unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let dirs = Dirs::new(tmp.path().join("d"), tmp.path().join("r"));
        let pool = WarmPool::new(&dirs, &script, 2, None);
        assert_eq!(pool.idle(), 0);
        pool.refill();
        assert_eq!(pool.idle(), 2);
        let pids: Vec<u32> = lock(&pool.idle).iter().map(|v| v.pid).collect();
        for pid in &pids {
            assert!(Path::new(&format!("/proc/{pid}")).exists());
        }
        drop(pool);
        // SIGKILL is delivered at once; the zombie is reaped by tokio, so check the state.
        for pid in pids {
            let gone_or_zombie = (0..200).any(|_| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                let dead = stat.is_empty() || stat.contains(") Z ");
                if !dead {
                    std::thread::sleep(Duration::from_millis(10));
                }
                dead
            });
            assert!(gone_or_zombie, "idle process {pid} outlived the pool");
        }
        assert_eq!(
            std::fs::read_dir(dirs.run.join(POOL_DIR)).unwrap().count(),
            0
        );
    }

    #[test]
    fn leftover_slots_of_a_dead_pool_are_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let slot = tmp.path().join(POOL_DIR).join("1-0");
        std::fs::create_dir_all(&slot).unwrap();
        // A pid that is not a pooled VMM (this test process): must not be killed.
        std::fs::write(slot.join("vmm.pid"), std::process::id().to_string()).unwrap();
        assert!(!is_pooled_vmm_of(std::process::id(), &slot));
        kill_leftovers(&tmp.path().join(POOL_DIR), &tmp.path().join("state"));
        assert!(!slot.exists());
    }
}
