//! The `gvisor` runtime: one `runsc` container per sandbox, the agent as its PID 1.
//!
//! Files of sandbox `<id>` under `<run-dir>/<id>/`:
//!
//! ```text
//! owner.json        who created it (see owner.rs)
//! bundle/config.json the OCI spec (bundle.rs)
//! layer/{upper,work} host overlayfs layer over the image tree
//! rootfs/           the overlayfs mount: the container's root
//! host/agent.sock   the agent's socket (bind-mounted at /run/sandcell-host; the guest
//!                   writes there too: the host goes through nofollow.rs)
//! console.log       output of `runsc run` (the agent's stdout/stderr and runsc's errors),
//!                   capped and rotated to console.log.1 (capped_log.rs)
//! ```
//!
//! Writes never reach the image: the root is a host overlayfs whose lower layer is the
//! image tree, and on runsc versions with `--overlay2` the sandbox's writes are held in its
//! own memory (`root:memory`, counted against its memory limit) before they reach even the
//! upper layer. The host overlay is still needed: runsc's gofer creates missing mount points
//! (`/run/sandcell-host`) in the host directory it serves, which must not be the image.
//!
//! runsc's state lives in `<data-dir>/runsc` (`--root`). Resource limits live in a cgroup we
//! create ourselves (cgroup.rs). `runsc run` stays our child for the sandbox's whole life,
//! so its exit tells us when and how the sandbox ended. For the daemon
//! ([`crate::SandboxSpec::outlive_owner`]) it is started detached (own session, no
//! parent-death signal): it then outlives us, still removes the container when the sandbox
//! ends, and a restarted daemon adopts it ([`Runtime::adopt`]) and watches it through a pidfd
//! (the sandbox processes themselves die with `runsc run`: runsc boots them `--attached`).

pub mod bundle;
pub mod disk;
pub mod flatten;
mod host_sockets;
pub mod network;
pub mod runsc;
mod sandbox;
#[cfg(test)]
mod security_tests;

pub use runsc::RunscInfo;
pub use sandbox::GvisorSandbox;
use sandbox::Paths;

use crate::cgroup::{self, CgroupVersion, SandboxCgroup};
use crate::owner::Sweep;
use crate::util::{remove_dir_all_if_exists, unmount_if_mounted};
use crate::{
    Dirs, Error, Result, Runtime, RuntimeKind, Sandbox, SandboxHandle, SandboxSpec, owner,
};
use async_trait::async_trait;
use sandcell_net::NetRegistry;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub(super) const RT: RuntimeKind = RuntimeKind::Gvisor;
/// `sun_path` holds 108 bytes with the NUL.
const MAX_SOCKET_PATH: usize = 107;

pub struct GvisorRuntime {
    shared: Arc<Shared>,
}

pub(super) struct Shared {
    pub(super) dirs: Dirs,
    pub(super) runsc: RunscInfo,
    pub(super) cgroups: CgroupVersion,
    /// The networks of this runtime's sandboxes (and its owner's warm pool).
    pub(super) nets: NetRegistry,
    /// Serializes this runtime's checkpoints and restores (checkpoint.rs).
    pub(super) restores: Arc<tokio::sync::Mutex<()>>,
}

impl GvisorRuntime {
    /// Finds runsc (see [`RunscInfo::detect`]) and the cgroup hierarchy. Sandboxes with a
    /// network get it through `nets` (its pool, if one is installed).
    pub async fn new(dirs: Dirs, nets: NetRegistry) -> Result<GvisorRuntime> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(Error::Unavailable {
                runtime: RT,
                what: "not running as root".into(),
                hint: "the gvisor runtime needs root for runsc, overlayfs and cgroups: run sandcell as root".into(),
            });
        }
        let runsc = RunscInfo::detect(&dirs).await?;
        let cgroups = cgroup::detect_version().ok_or_else(|| Error::Unavailable {
            runtime: RT,
            what: format!(
                "no cgroup hierarchy (v1 memory controller or v2) at {}",
                cgroup::CGROUP_ROOT
            ),
            hint: "mount cgroup2 at /sys/fs/cgroup".into(),
        })?;
        Ok(GvisorRuntime {
            shared: Arc::new(Shared {
                dirs,
                runsc,
                cgroups,
                nets,
                restores: Arc::new(tokio::sync::Mutex::new(())),
            }),
        })
    }

    pub fn runsc(&self) -> &RunscInfo {
        &self.shared.runsc
    }

    /// The `runsc` command line that starts sandbox `id` from `bundle` in the foreground,
    /// exactly as this runtime runs it (for comparisons in benchmarks).
    pub fn run_command(&self, bundle: &Path, id: &str) -> tokio::process::Command {
        self.shared.run_command(bundle, id, false)
    }

    pub fn runsc_root(&self) -> PathBuf {
        self.shared.dirs.runsc_root()
    }
}

/// The global runsc flags of every sandbox (run and restore alike). Nothing here weakens
/// gVisor's own isolation (docs/security-model.md#gvisor): no `--TESTONLY-*` flag, the
/// platform as detected (its seccomp filters stay on), the sandbox's own netstack (never
/// `--network=host`), `--host-uds=create` only (the agent's socket in the one bind-mounted
/// host directory), root writes to the sandbox's memory or, with `host_writes`, to its own
/// overlay upper layer on the host (the image tree is a read-only lower layer).
pub(super) fn sandbox_flags(runsc: &RunscInfo, network: bool, host_writes: bool) -> Vec<String> {
    let mut flags = vec![
        format!("--platform={}", runsc.platform),
        if network {
            "--network=sandbox"
        } else {
            "--network=none"
        }
        .to_string(),
        "--host-uds=create".to_string(),
    ];
    if runsc.overlay2 {
        flags.push(
            if host_writes {
                "--overlay2=none"
            } else {
                "--overlay2=root:memory"
            }
            .to_string(),
        );
    }
    if network && runsc.net_disconnect_ok {
        flags.push("--net-disconnect-ok".to_string());
    }
    flags
}

impl Shared {
    pub(super) fn runsc(&self) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.runsc.path);
        cmd.arg(format!("--root={}", self.dirs.runsc_root().display()))
            .stdin(std::process::Stdio::null());
        cmd
    }

    /// `network`: gVisor's netstack on the interfaces of the namespace named in the bundle
    /// (network.rs), else loopback only.
    pub(super) fn run_command(
        &self,
        bundle: &Path,
        id: &str,
        network: bool,
    ) -> tokio::process::Command {
        self.run_command_root(bundle, id, network, false)
    }

    /// As [`Shared::run_command`]; `host_writes` ([`crate::HostLayer`]): the root's writes go
    /// to the host overlay (`--overlay2=none`) rather than the sandbox's memory.
    pub(super) fn run_command_root(
        &self,
        bundle: &Path,
        id: &str,
        network: bool,
        host_writes: bool,
    ) -> tokio::process::Command {
        let mut cmd = self.sandbox_command_root(network, host_writes);
        cmd.arg("run")
            .arg(format!("--bundle={}", bundle.display()))
            .arg(id);
        cmd
    }

    /// runsc with the global flags of our sandboxes (also what `runsc restore` needs: the
    /// same platform and flags as the checkpointed sandbox); `host_writes`: the root's
    /// writes go to the host overlay.
    pub(super) fn sandbox_command_root(
        &self,
        network: bool,
        host_writes: bool,
    ) -> tokio::process::Command {
        let mut cmd = self.runsc();
        cmd.args(sandbox_flags(&self.runsc, network, host_writes));
        cmd
    }

    /// `runsc ARGS`, failing with its stderr.
    pub(super) async fn runsc_ok(&self, args: &[&str]) -> Result<String> {
        self.runsc_ok_in(None, args).await
    }

    /// `runsc ARGS` run in the network namespace `netns` when given: runsc reaches a
    /// sandbox's control server through an abstract Unix socket, and abstract sockets belong
    /// to a network namespace; from any other namespace runsc finds no server and reports
    /// the sandbox "stopped" (checkpoint, pause and resume then fail).
    pub(super) async fn runsc_ok_in(&self, netns: Option<&Path>, args: &[&str]) -> Result<String> {
        let mut cmd = self.runsc();
        cmd.args(args);
        // Kept open until the command has been spawned (the child's setns uses it).
        let _netns_file = match netns {
            Some(path) => {
                let file = std::fs::File::open(path).map_err(|e| {
                    Error::io(
                        RT,
                        format!("opening network namespace {}", path.display()),
                        e,
                    )
                })?;
                network::join_netns(&mut cmd, &file);
                Some(file)
            }
            None => None,
        };
        let out = cmd
            .output()
            .await
            .map_err(|e| Error::io(RT, format!("running runsc {}", args.join(" ")), e))?;
        if !out.status.success() {
            return Err(Error::Command {
                runtime: RT,
                command: format!(
                    "runsc --root={} {}",
                    self.dirs.runsc_root().display(),
                    args.join(" ")
                ),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Containers runsc knows in our root, as (id, bundle dir).
    pub(super) async fn containers(&self) -> Result<Vec<(String, PathBuf)>> {
        if !self.dirs.runsc_root().exists() {
            return Ok(Vec::new());
        }
        let out = self.runsc_ok(&["list", "--format=json"]).await?;
        let list: serde_json::Value =
            serde_json::from_str(out.trim()).unwrap_or(serde_json::Value::Null);
        Ok(list
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|c| {
                        Some((
                            c["id"].as_str()?.to_string(),
                            PathBuf::from(c["bundle"].as_str()?),
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Whether runsc has state for container `id` (`<id>_sandbox:<id>.state` and the like;
    /// looked up in the directory because asking runsc costs a process spawn).
    pub(super) fn has_state(&self, id: &str) -> bool {
        let Ok(entries) = std::fs::read_dir(self.dirs.runsc_root()) else {
            return false;
        };
        let prefix = format!("{id}_");
        entries.flatten().any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name == id || name.starts_with(&prefix)
        })
    }

    /// Whether runsc's root holds state that might belong to none of our live sandboxes:
    /// an entry whose leading id (`<id>_sandbox:...`, or the whole name) has no run dir.
    pub(super) fn possible_orphans(&self) -> bool {
        let Ok(entries) = std::fs::read_dir(self.dirs.runsc_root()) else {
            return false;
        };
        entries.flatten().any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            let id = name.split_once('_').map_or(&*name, |(id, _)| id);
            !self.dirs.sandbox_run_dir(id).exists()
        })
    }

    /// Kills the container (if runsc still knows it) and removes its runsc state. Slow
    /// (runsc waits up to 5 s for the container to stop while `runsc run` is attached): the
    /// normal way down is [`Shared::kill`], after which `runsc run` deletes it by itself.
    pub(super) async fn force_delete(&self, id: &str) -> Result<()> {
        if !self.has_state(id) {
            return Ok(());
        }
        match self.runsc_ok(&["delete", "--force", id]).await {
            Err(Error::Command { stderr, .. })
                if stderr.contains("does not exist") || stderr.contains("not found") =>
            {
                Ok(())
            }
            other => other.map(|_| ()),
        }
    }

    /// SIGKILL to the container's init (the agent); the sandbox then shuts down and our
    /// `runsc run` removes the container and returns.
    pub(super) async fn kill(&self, id: &str) -> Result<()> {
        self.runsc_ok(&["kill", id, "KILL"]).await.map(|_| ())
    }

    /// Everything a sandbox leaves on the host, once its runsc processes are gone or told
    /// to go: runsc state, cgroup (and any process still in it), mount, directories.
    /// Keeps going after a failure and reports the first one.
    pub(super) async fn remove_leftovers(&self, id: &str) -> Result<()> {
        let mut first: Option<Error> = None;
        if self.has_state(id) {
            // Orphaned but maybe running: kill it and give its `runsc run` (if one is left)
            // the chance to clean up, the fast way; force the rest.
            let _ = self.kill(id).await;
            for _ in 0..100 {
                if !self.has_state(id) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if let Err(e) = self.force_delete(id).await {
                first.get_or_insert(e);
            }
        }
        // After the sandbox's processes: nothing uses the namespace any more.
        if let Err(e) = network::remove_leftover(&self.nets, id).await {
            first.get_or_insert(e);
        }
        if let Err(e) = SandboxCgroup::of(self.cgroups, id).remove() {
            first.get_or_insert(e);
        }
        let run_dir = self.dirs.sandbox_run_dir(id);
        if let Err(e) = unmount_if_mounted(&run_dir.join("rootfs")) {
            first.get_or_insert(e);
        }
        // After the root's overlay, whose upper layer is on it.
        if let Err(e) = disk::remove(&self.dirs, id) {
            first.get_or_insert(e);
        }
        for dir in [run_dir.clone(), self.dirs.run.join(format!(".new-{id}"))] {
            if let Err(e) = remove_dir_all_if_exists(&dir) {
                first.get_or_insert(Error::io(RT, format!("removing {}", dir.display()), e));
            }
        }
        first.map_or(Ok(()), Err)
    }
}

#[async_trait]
impl Runtime for GvisorRuntime {
    fn kind(&self) -> RuntimeKind {
        RT
    }

    async fn create(&self, spec: SandboxSpec) -> Result<Box<dyn Sandbox>> {
        if !crate::validate_id(&spec.id) {
            return Err(Error::InvalidSpec {
                runtime: RT,
                problem: format!("bad sandbox id {:?}", spec.id),
            });
        }
        if spec.vcpus == 0 || spec.memory_mib < 32 {
            return Err(Error::InvalidSpec {
                runtime: RT,
                problem: format!(
                    "{} vCPUs and {} MiB: need at least 1 vCPU and 32 MiB",
                    spec.vcpus, spec.memory_mib
                ),
            });
        }
        let base = spec.image.rootfs_dir.clone().ok_or_else(|| Error::Image {
            image: spec.image.name.clone(),
            problem: "has no unpacked rootfs/ tree, which the gvisor runtime needs".into(),
        })?;
        let agent = base.join(crate::image::AGENT_PATH.trim_start_matches('/'));
        if !agent.is_file() {
            return Err(Error::Image {
                image: spec.image.name.clone(),
                problem: format!(
                    "no agent at {}; rebuild the image with `make images install`",
                    agent.display()
                ),
            });
        }
        let mut paths = Paths::new(&self.shared.dirs, &spec.id);
        let mut lowers: Vec<&Path> = Vec::new();
        if let Some(layer) = &spec.host_layer {
            // The upper and work dirs live outside the run dir: destroy leaves them.
            paths.upper = layer.upper.clone();
            paths.work = layer.work.clone();
            lowers.extend(layer.lowers.iter().map(PathBuf::as_path));
        }
        lowers.push(&base);
        if paths.socket.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(Error::InvalidSpec {
                runtime: RT,
                problem: format!(
                    "socket path {} is too long for a Unix socket; use a shorter SANDCELL_RUN_DIR",
                    paths.socket.display()
                ),
            });
        }
        if spec.disk_mib.is_some() && spec.host_layer.is_some() {
            return Err(Error::InvalidSpec {
                runtime: RT,
                problem: "a disk and a host layer: a build sandbox writes to its host layer".into(),
            });
        }
        owner::create_run_dir(&self.shared.dirs, &spec.id, RT, spec.outlive_owner)?;
        let sandbox = GvisorSandbox::new(self.shared.clone(), &spec, paths);
        if let Some(mib) = spec.disk_mib
            && let Err(e) = disk::create(&self.shared.dirs, &spec.id, mib).await
        {
            let _ = sandbox.destroy().await;
            return Err(e);
        }
        if let Some(net) = &spec.network
            && let Err(e) = sandbox.attach_network(net).await
        {
            let _ = sandbox.destroy().await;
            return Err(e);
        }
        if let Err(e) = sandbox.prepare(&spec, &lowers).await {
            let _ = sandbox.destroy().await;
            return Err(e);
        }
        Ok(Box::new(sandbox))
    }

    async fn sweep(&self) -> Result<Vec<String>> {
        self.sweep_scope(Sweep::Attached).await
    }

    async fn sweep_unadopted(&self) -> Result<Vec<String>> {
        self.sweep_scope(Sweep::Unadopted).await
    }

    async fn adopt(&self, handle: &SandboxHandle) -> Result<Box<dyn Sandbox>> {
        let id = &handle.id;
        if handle.runtime != RT || !crate::validate_id(id) {
            return Err(Error::InvalidSpec {
                runtime: RT,
                problem: format!("cannot adopt {id:?} of the {} runtime", handle.runtime),
            });
        }
        let paths = Paths::new(&self.shared.dirs, id);
        if paths.socket != handle.agent_socket {
            return Err(Error::InvalidSpec {
                runtime: RT,
                problem: format!(
                    "sandbox {id} was started with its agent socket at {}, not {}: \
                     start the daemon with the same SANDCELL_RUN_DIR",
                    handle.agent_socket.display(),
                    paths.socket.display()
                ),
            });
        }
        let run_dir = self.shared.dirs.sandbox_run_dir(id);
        let pidfd = crate::detach::open(handle.pid, handle.start_time)
            .filter(|_| run_dir.is_dir() && self.shared.has_state(id));
        let Some(pidfd) = pidfd else {
            let removed = self.shared.remove_leftovers(id).await;
            return Err(Error::Gone {
                runtime: RT,
                id: id.clone(),
                problem: match removed {
                    Ok(()) => "it ended while it had no owner; its leftovers were removed".into(),
                    Err(e) => {
                        format!("it ended while it had no owner; removing its leftovers: {e}")
                    }
                },
            });
        };
        owner::adopt(&run_dir, RT)?;
        Ok(Box::new(GvisorSandbox::adopted(
            self.shared.clone(),
            handle.clone(),
            paths,
            pidfd,
        )))
    }

    async fn restore(
        &self,
        snapshot: &crate::SnapshotHandle,
        spec: crate::RestoreSpec,
    ) -> Result<Box<dyn Sandbox>> {
        let sandbox = sandbox::restore_new(self.shared.clone(), snapshot, spec).await?;
        Ok(Box::new(sandbox))
    }
}

impl GvisorRuntime {
    async fn sweep_scope(&self, scope: Sweep) -> Result<Vec<String>> {
        let shared = &self.shared;
        let mut cleaned = Vec::new();
        let mut first: Option<Error> = None;
        for (id, _) in owner::dead_sandboxes(&shared.dirs, RT, scope) {
            match shared.remove_leftovers(&id).await {
                Ok(()) => cleaned.push(id),
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        // Containers of our run dir whose sandbox dir is gone entirely. A live sandbox has
        // its run dir before anything else and loses it last, so these are orphans. (Only
        // ours: another run dir may share this runsc root. Cgroups are not listed for the
        // same reason: they are host-wide, and ours never outlive the run dir.)
        // Asking runsc costs a process spawn on every `sandcell run`; its state file names
        // tell whether there is anything to ask about first.
        let orphans = if shared.possible_orphans() {
            match shared.containers().await {
                Ok(list) => list,
                Err(e) => {
                    first.get_or_insert(e);
                    Vec::new()
                }
            }
        } else {
            Vec::new()
        };
        for (id, bundle) in orphans {
            let run_dir = shared.dirs.sandbox_run_dir(&id);
            let ours = bundle == run_dir.join("bundle");
            let has_dir = run_dir.exists() || shared.dirs.run.join(format!(".new-{id}")).exists();
            if !ours || has_dir || cleaned.contains(&id) || !crate::validate_id(&id) {
                continue;
            }
            match shared.remove_leftovers(&id).await {
                Ok(()) => cleaned.push(id),
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        // Disk files whose sandbox is gone (after the sandboxes above lost theirs).
        for id in disk::remove_orphans(&shared.dirs) {
            tracing::info!("gvisor: removed the orphaned disk of sandbox {id}");
        }
        match first {
            Some(e) if cleaned.is_empty() => Err(e),
            _ => Ok(cleaned),
        }
    }
}
