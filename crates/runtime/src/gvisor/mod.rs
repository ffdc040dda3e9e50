//! The `gvisor` runtime: one `runsc` container per sandbox, the agent as its PID 1.
//!
//! Files of sandbox `<id>` under `<run-dir>/<id>/`:
//!
//! ```text
//! owner.json        who created it (see owner.rs)
//! bundle/config.json the OCI spec (bundle.rs)
//! layer/{upper,work} host overlayfs layer over the image tree
//! rootfs/           the overlayfs mount: the container's root
//! host/agent.sock   the agent's socket (bind-mounted at /run/sandcell-host)
//! console.log       output of `runsc run` (the agent's stdout/stderr and runsc's errors)
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
//! so its exit tells us when and how the sandbox ended.

pub mod bundle;
pub mod runsc;

pub use runsc::RunscInfo;

use crate::cgroup::{self, CgroupVersion, SandboxCgroup};
use crate::supervise::{ExitCell, NotReady, poll_ready};
use crate::util::{kill_pid, log_tail, open_log, remove_dir_all_if_exists, unmount_if_mounted};
use crate::{
    AGENT_PORT, AsyncStream, Dirs, Error, ResourceUsage, Result, Runtime, RuntimeKind, Sandbox,
    SandboxExit, SandboxSpec, SandboxStatus, owner,
};
use async_trait::async_trait;
use sandcell_agent::client::{AgentClient, ClientError, UnixConnector};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const RT: RuntimeKind = RuntimeKind::Gvisor;
const POWEROFF_TIMEOUT: Duration = Duration::from_millis(500);
/// `sun_path` holds 108 bytes with the NUL.
const MAX_SOCKET_PATH: usize = 107;

pub struct GvisorRuntime {
    shared: Arc<Shared>,
}

struct Shared {
    dirs: Dirs,
    runsc: RunscInfo,
    cgroups: CgroupVersion,
}

impl GvisorRuntime {
    /// Finds runsc (see [`RunscInfo::detect`]) and the cgroup hierarchy.
    pub async fn new(dirs: Dirs) -> Result<GvisorRuntime> {
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
            }),
        })
    }

    pub fn runsc(&self) -> &RunscInfo {
        &self.shared.runsc
    }

    /// The `runsc` command line that starts sandbox `id` from `bundle` in the foreground,
    /// exactly as this runtime runs it (for comparisons in benchmarks).
    pub fn run_command(&self, bundle: &Path, id: &str) -> tokio::process::Command {
        self.shared.run_command(bundle, id)
    }

    pub fn runsc_root(&self) -> PathBuf {
        self.shared.dirs.runsc_root()
    }
}

impl Shared {
    fn runsc(&self) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.runsc.path);
        cmd.arg(format!("--root={}", self.dirs.runsc_root().display()))
            .stdin(std::process::Stdio::null());
        cmd
    }

    fn run_command(&self, bundle: &Path, id: &str) -> tokio::process::Command {
        let mut cmd = self.runsc();
        cmd.arg(format!("--platform={}", self.runsc.platform))
            .arg("--network=none")
            .arg("--host-uds=create");
        if self.runsc.overlay2 {
            cmd.arg("--overlay2=root:memory");
        }
        cmd.arg("run")
            .arg(format!("--bundle={}", bundle.display()))
            .arg(id);
        cmd
    }

    /// `runsc ARGS`, failing with its stderr.
    async fn runsc_ok(&self, args: &[&str]) -> Result<String> {
        let out = self
            .runsc()
            .args(args)
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
    async fn containers(&self) -> Result<Vec<(String, PathBuf)>> {
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
    fn has_state(&self, id: &str) -> bool {
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
    fn possible_orphans(&self) -> bool {
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
    async fn force_delete(&self, id: &str) -> Result<()> {
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
    async fn kill(&self, id: &str) -> Result<()> {
        self.runsc_ok(&["kill", id, "KILL"]).await.map(|_| ())
    }

    /// Everything a sandbox leaves on the host, once its runsc processes are gone or told
    /// to go: runsc state, cgroup (and any process still in it), mount, directories.
    /// Keeps going after a failure and reports the first one.
    async fn remove_leftovers(&self, id: &str) -> Result<()> {
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
        if let Err(e) = SandboxCgroup::of(self.cgroups, id).remove() {
            first.get_or_insert(e);
        }
        let run_dir = self.dirs.sandbox_run_dir(id);
        if let Err(e) = unmount_if_mounted(&run_dir.join("rootfs")) {
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
        let paths = Paths::new(&self.shared.dirs, &spec.id);
        if paths.socket.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(Error::InvalidSpec {
                runtime: RT,
                problem: format!(
                    "socket path {} is too long for a Unix socket; use a shorter SANDCELL_RUN_DIR",
                    paths.socket.display()
                ),
            });
        }
        owner::create_run_dir(&self.shared.dirs, &spec.id, RT)?;
        let sandbox = GvisorSandbox {
            shared: self.shared.clone(),
            id: spec.id.clone(),
            memory_mib: spec.memory_mib,
            boot_timeout: spec.boot_timeout,
            cgroup: SandboxCgroup::of(self.shared.cgroups, &spec.id),
            paths,
            phase: Mutex::new(Phase::Created),
            paused: AtomicBool::new(false),
            stopping: Arc::new(AtomicBool::new(false)),
            exit: ExitCell::new(),
            destroyed: tokio::sync::Mutex::new(false),
        };
        if let Err(e) = sandbox.prepare(&spec, &base) {
            let _ = sandbox.destroy().await;
            return Err(e);
        }
        Ok(Box::new(sandbox))
    }

    async fn sweep(&self) -> Result<Vec<String>> {
        let shared = &self.shared;
        let mut cleaned = Vec::new();
        let mut first: Option<Error> = None;
        for (id, _) in owner::dead_sandboxes(&shared.dirs, RT) {
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
        match first {
            Some(e) if cleaned.is_empty() => Err(e),
            _ => Ok(cleaned),
        }
    }
}

struct Paths {
    bundle: PathBuf,
    rootfs: PathBuf,
    upper: PathBuf,
    work: PathBuf,
    host: PathBuf,
    socket: PathBuf,
    console: PathBuf,
}

impl Paths {
    fn new(dirs: &Dirs, id: &str) -> Paths {
        let run_dir = dirs.sandbox_run_dir(id);
        Paths {
            bundle: run_dir.join("bundle"),
            rootfs: run_dir.join("rootfs"),
            upper: run_dir.join("layer/upper"),
            work: run_dir.join("layer/work"),
            host: run_dir.join("host"),
            socket: run_dir.join("host").join(bundle::AGENT_SOCKET),
            console: run_dir.join("console.log"),
        }
    }
}

enum Phase {
    Created,
    /// `runsc run` was spawned with this pid.
    Started(u32),
    Destroyed,
}

pub struct GvisorSandbox {
    shared: Arc<Shared>,
    id: String,
    memory_mib: u32,
    boot_timeout: Duration,
    cgroup: SandboxCgroup,
    paths: Paths,
    phase: Mutex<Phase>,
    paused: AtomicBool,
    /// Set before we stop the sandbox, so that its end reads as [`SandboxExit::Destroyed`].
    stopping: Arc<AtomicBool>,
    exit: ExitCell,
    /// Serializes `destroy`; true once it completed.
    destroyed: tokio::sync::Mutex<bool>,
}

impl GvisorSandbox {
    /// Layer, mount, cgroup and bundle: everything before a process runs.
    fn prepare(&self, spec: &SandboxSpec, base: &Path) -> Result<()> {
        let p = &self.paths;
        for dir in [&p.bundle, &p.rootfs, &p.upper, &p.work, &p.host] {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::io(RT, format!("creating {}", dir.display()), e))?;
        }
        mount_overlay(base, &p.upper, &p.work, &p.rootfs)?;
        let mount_point = p
            .rootfs
            .join(bundle::HOST_DIR_IN_SANDBOX.trim_start_matches('/'));
        std::fs::create_dir_all(&mount_point).map_err(|e| {
            Error::io(
                RT,
                format!("creating mount point {}", mount_point.display()),
                e,
            )
        })?;
        SandboxCgroup::create(self.shared.cgroups, &self.id, spec.memory_mib, spec.vcpus)?;
        let config = bundle::config(&bundle::BundleSpec {
            rootfs: &p.rootfs,
            host_dir: &p.host,
            env: &spec.env,
            memory_mib: spec.memory_mib,
            vcpus: spec.vcpus,
            cgroups_path: &self.cgroup.oci_path(),
            hostname: &self.id,
        });
        let json = serde_json::to_vec_pretty(&config)
            .map_err(|e| Error::io(RT, "encoding config.json", e.into()))?;
        let file = p.bundle.join("config.json");
        std::fs::write(&file, json)
            .map_err(|e| Error::io(RT, format!("writing {}", file.display()), e))
    }

    /// The bundle directory (`config.json`), e.g. to run it with runsc directly.
    pub fn bundle_dir(&self) -> &Path {
        &self.paths.bundle
    }

    fn phase_name(&self) -> &'static str {
        match *lock(&self.phase) {
            Phase::Created => "created",
            Phase::Started(_) if self.exit.get().is_some() => "exited",
            Phase::Started(_) => "running",
            Phase::Destroyed => "destroyed",
        }
    }

    fn require_running(&self, op: &'static str) -> Result<()> {
        match self.phase_name() {
            "running" => Ok(()),
            state => Err(Error::WrongState {
                runtime: RT,
                id: self.id.clone(),
                state: state.into(),
                op,
            }),
        }
    }

    fn console_tail(&self) -> String {
        log_tail(&self.paths.console, "sandbox log", 4096, 20)
    }

    /// Asks the agent to power off; true if the request went out (the agent may exit
    /// before it answers).
    async fn poweroff(&self) -> bool {
        let client = AgentClient::new(UnixConnector(self.paths.socket.clone()));
        match tokio::time::timeout(POWEROFF_TIMEOUT, client.poweroff()).await {
            Ok(Ok(())) => true,
            Ok(Err(ClientError::Connect(_))) | Err(_) => false,
            Ok(Err(_)) => true,
        }
    }

    async fn ended_within(&self, timeout: Duration) -> bool {
        tokio::time::timeout(timeout, self.exit.wait())
            .await
            .is_ok()
    }

    async fn wait_ready(&self) -> Result<()> {
        let socket = &self.paths.socket;
        let probe = || async move { tokio::net::UnixStream::connect(socket).await.is_ok() };
        match poll_ready(&self.exit, self.boot_timeout, probe).await {
            Ok(()) => Ok(()),
            Err(NotReady::Ended(exit)) => Err(Error::EndedDuringStart {
                runtime: RT,
                id: self.id.clone(),
                exit,
                console: self.console_tail(),
            }),
            Err(NotReady::Timeout) => Err(Error::BootTimeout {
                runtime: RT,
                id: self.id.clone(),
                timeout: self.boot_timeout,
                console: self.console_tail(),
            }),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn mount_overlay(lower: &Path, upper: &Path, work: &Path, target: &Path) -> Result<()> {
    for p in [lower, upper, work] {
        let s = p.to_string_lossy();
        if s.contains([',', ':', '\\']) {
            return Err(Error::InvalidSpec {
                runtime: RT,
                problem: format!(
                    "path {s} contains ',', ':' or '\\', which overlayfs options cannot hold"
                ),
            });
        }
    }
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    let c_target = crate::util::path_cstring(target)?;
    let c_options = std::ffi::CString::new(options.clone()).map_err(|_| Error::InvalidSpec {
        runtime: RT,
        problem: "NUL byte in overlay options".into(),
    })?;
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            c"overlay".as_ptr(),
            c_target.as_ptr(),
            c"overlay".as_ptr(),
            0,
            c_options.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(Error::io(
            RT,
            format!(
                "mounting overlayfs ({options}) on {} (needs root and overlayfs)",
                target.display()
            ),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// How `runsc run` ending translates into how the sandbox ended.
fn classify(
    status: std::process::ExitStatus,
    stopping: bool,
    oom_kills: u64,
    memory_mib: u32,
    log: String,
) -> SandboxExit {
    if stopping {
        SandboxExit::Destroyed
    } else if oom_kills > 0 {
        SandboxExit::OutOfMemory {
            limit_mib: memory_mib,
        }
    } else if let Some(signal) = status.signal() {
        SandboxExit::Killed {
            signal,
            detail: format!("runsc run was killed{log}"),
        }
    } else if let Some(signal) = status
        .code()
        .filter(|c| (129..160).contains(c))
        .map(|c| c - 128)
    {
        // runsc reports a killed sandbox the shell's way. The agent, PID 1 inside, cannot
        // be killed from within, so the signal came from the host.
        SandboxExit::Killed {
            signal,
            detail: format!("runsc run exited with status {}{log}", 128 + signal),
        }
    } else {
        SandboxExit::Exited {
            code: status.code().unwrap_or(-1),
            detail: format!("runsc run exited{log}"),
        }
    }
}

#[async_trait]
impl Sandbox for GvisorSandbox {
    fn id(&self) -> &str {
        &self.id
    }

    fn runtime(&self) -> RuntimeKind {
        RT
    }

    async fn start(&self) -> Result<()> {
        if !matches!(*lock(&self.phase), Phase::Created) {
            let state = self.phase_name();
            return Err(Error::WrongState {
                runtime: RT,
                id: self.id.clone(),
                state: state.into(),
                op: "start",
            });
        }
        let log = open_log(&self.paths.console)
            .map_err(|e| Error::io(RT, format!("opening {}", self.paths.console.display()), e))?;
        let log2 = log
            .try_clone()
            .map_err(|e| Error::io(RT, "duplicating the log fd", e))?;
        let mut command = self.shared.run_command(&self.paths.bundle, &self.id);
        let mut child = crate::util::supervised(&mut command)
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| {
                Error::io(
                    RT,
                    format!("starting {}", self.shared.runsc.path.display()),
                    e,
                )
            })?;
        let pid = child.id().unwrap_or(0);
        *lock(&self.phase) = Phase::Started(pid);

        let (stopping, cgroup, exit, memory_mib, console) = (
            self.stopping.clone(),
            self.cgroup.clone(),
            self.exit.clone(),
            self.memory_mib,
            self.paths.console.clone(),
        );
        tokio::spawn(async move {
            let ended = match child.wait().await {
                Ok(status) => classify(
                    status,
                    stopping.load(Ordering::SeqCst),
                    cgroup.oom_kills(),
                    memory_mib,
                    log_tail(&console, "sandbox log", 2048, 8),
                ),
                Err(e) => SandboxExit::Exited {
                    code: -1,
                    detail: format!("waiting for runsc run: {e}"),
                },
            };
            exit.set(ended);
        });
        self.wait_ready().await
    }

    async fn connect(&self, port: u32) -> Result<Box<dyn AsyncStream>> {
        if port != AGENT_PORT {
            return Err(Error::PortUnsupported { runtime: RT, port });
        }
        self.require_running("connect")?;
        let stream = tokio::net::UnixStream::connect(&self.paths.socket)
            .await
            .map_err(|e| Error::Connect {
                runtime: RT,
                id: self.id.clone(),
                port,
                problem: format!("{}: {e}", self.paths.socket.display()),
            })?;
        Ok(Box::new(stream))
    }

    async fn pause(&self) -> Result<()> {
        self.require_running("pause")?;
        self.shared.runsc_ok(&["pause", &self.id]).await?;
        self.paused.store(true, Ordering::SeqCst);
        Ok(())
    }

    async fn resume(&self) -> Result<()> {
        self.require_running("resume")?;
        self.shared.runsc_ok(&["resume", &self.id]).await?;
        self.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    async fn status(&self) -> Result<SandboxStatus> {
        if let Some(exit) = self.exit.get() {
            return Ok(SandboxStatus::Exited(exit));
        }
        Ok(match *lock(&self.phase) {
            Phase::Created => SandboxStatus::Created,
            Phase::Started(_) if self.paused.load(Ordering::SeqCst) => SandboxStatus::Paused,
            Phase::Started(_) => SandboxStatus::Running,
            Phase::Destroyed => SandboxStatus::Exited(SandboxExit::Destroyed),
        })
    }

    async fn usage(&self) -> Result<ResourceUsage> {
        Ok(self.cgroup.usage())
    }

    async fn wait(&self) -> SandboxExit {
        self.exit.wait().await
    }

    async fn destroy(&self) -> Result<()> {
        let mut done = self.destroyed.lock().await;
        if *done {
            return Ok(());
        }
        self.stopping.store(true, Ordering::SeqCst);
        let phase = std::mem::replace(&mut *lock(&self.phase), Phase::Destroyed);
        let mut first: Option<Error> = None;
        if let Phase::Started(pid) = phase {
            // Politely first: the agent exits (PID 1 exiting ends a gVisor sandbox) and our
            // `runsc run` child cleans up and returns, as for any finished container, with no
            // runsc process to spawn. Then by force: SIGKILL to the container through runsc.
            let polite = self.exit.get().is_none() && self.poweroff().await;
            if !(polite && self.ended_within(Duration::from_secs(2)).await) {
                // A sandbox that already ended refuses the kill: nothing to do then.
                if self.exit.get().is_none()
                    && let Err(e) = self.shared.kill(&self.id).await
                    && self.exit.get().is_none()
                {
                    first.get_or_insert(e);
                }
                if !self.ended_within(Duration::from_secs(5)).await {
                    kill_pid(pid, libc::SIGKILL);
                    self.ended_within(Duration::from_secs(2)).await;
                }
            }
        }
        if let Err(e) = self.shared.remove_leftovers(&self.id).await {
            first.get_or_insert(e);
        }
        self.exit.set(SandboxExit::Destroyed);
        *done = true;
        first.map_or(Ok(()), Err)
    }
}
