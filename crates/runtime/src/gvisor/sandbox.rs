//! One gVisor sandbox: its files, its `runsc run` child, and how it ends (see the module
//! docs of [`super`] for the layout).

use super::{RT, Shared, bundle, network};
use sandcell_proto::sync::lock;
// A child module, so that checkpoint/restore can rebuild this sandbox's process in place.
#[path = "checkpoint.rs"]
mod checkpoint;
#[path = "files_pause.rs"]
mod files_pause;
use crate::cgroup::SandboxCgroup;
use crate::supervise::{ExitCell, NotReady, poll_ready};
use crate::util::{kill_pid, log_tail};
use crate::{
    AGENT_PORT, AsyncStream, Dirs, Error, ResourceUsage, Result, RuntimeKind, Sandbox, SandboxExit,
    SandboxHandle, SandboxSpec, SandboxStatus,
};
use async_trait::async_trait;
pub(super) use checkpoint::restore_new;
use sandcell_envd_client::{ClientError, EnvdClient};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const POWEROFF_TIMEOUT: Duration = Duration::from_millis(500);

pub(super) struct Paths {
    pub(super) bundle: PathBuf,
    pub(super) rootfs: PathBuf,
    pub(super) upper: PathBuf,
    pub(super) work: PathBuf,
    pub(super) host: PathBuf,
    pub(super) socket: PathBuf,
    pub(super) console: PathBuf,
}

impl Paths {
    pub(super) fn new(dirs: &Dirs, id: &str) -> Paths {
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
    /// Its network (network.rs), if the spec asked for one.
    net: tokio::sync::Mutex<Option<sandcell_net::SandboxNet>>,
    /// The namespace runsc joins, known once the network exists.
    netns: Mutex<Option<PathBuf>>,
    /// What the network was made from, with the egress policy in force now: what a fork
    /// child's network is made from (see checkpoint.rs).
    pub(super) network_spec: Mutex<Option<network::NetworkSpec>>,
    /// [`SandboxSpec::outlive_owner`]: `runsc run` is started detached.
    outlive_owner: bool,
    vcpus: u8,
    /// Set once started detached (or adopted).
    handle: Mutex<Option<SandboxHandle>>,
    /// What a snapshot records (checkpoint.rs); the image is unknown for adopted sandboxes.
    image: crate::Image,
    env: std::collections::BTreeMap<String, String>,
    /// The next [`Sandbox::start`] runs `runsc restore` from this checkpoint image.
    restore_from: Mutex<Option<PathBuf>>,
    /// Bumped when a checkpoint replaces the `runsc` process: the end of an older one is
    /// then not the sandbox's end.
    launch: Arc<std::sync::atomic::AtomicU64>,
    /// [`SandboxSpec::host_layer`] or [`SandboxSpec::disk_mib`]: runsc keeps no memory
    /// overlay over the root.
    host_writes: bool,
    /// [`SandboxSpec::disk_mib`] (disk.rs), recorded in its snapshots.
    pub(super) disk_mib: Option<u32>,
    /// The frozen layers between its upper and the image tree (top first): a restored
    /// sandbox's snapshot layer. A checkpoint flattens them with the upper (flatten.rs).
    pub(super) lowers: Mutex<Vec<PathBuf>>,
}

impl GvisorSandbox {
    pub(super) fn new(shared: Arc<Shared>, spec: &SandboxSpec, paths: Paths) -> GvisorSandbox {
        GvisorSandbox {
            cgroup: SandboxCgroup::of(shared.cgroups, &spec.id),
            shared,
            id: spec.id.clone(),
            memory_mib: spec.memory_mib,
            boot_timeout: spec.boot_timeout,
            paths,
            phase: Mutex::new(Phase::Created),
            paused: AtomicBool::new(false),
            stopping: Arc::new(AtomicBool::new(false)),
            exit: ExitCell::new(),
            destroyed: tokio::sync::Mutex::new(false),
            net: tokio::sync::Mutex::new(None),
            netns: Mutex::new(None),
            network_spec: Mutex::new(None),
            outlive_owner: spec.outlive_owner,
            vcpus: spec.vcpus,
            handle: Mutex::new(None),
            image: spec.image.clone(),
            env: spec.env.clone(),
            restore_from: Mutex::new(None),
            launch: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            host_writes: spec.host_layer.is_some() || spec.disk_mib.is_some(),
            disk_mib: spec.disk_mib,
            lowers: Mutex::new(Vec::new()),
        }
    }

    /// A sandbox another process started detached and that still runs (checked by the
    /// caller): its end is learnt from a pidfd of its `runsc run` process.
    pub(super) fn adopted(
        shared: Arc<Shared>,
        handle: SandboxHandle,
        paths: Paths,
        pidfd: std::os::fd::OwnedFd,
    ) -> GvisorSandbox {
        let mut spec = SandboxSpec::new(
            handle.id.clone(),
            crate::Image {
                name: String::new(),
                rootfs_dir: None,
                rootfs_ext4: None,
            },
        );
        spec.memory_mib = handle.memory_mib;
        spec.vcpus = handle.vcpus;
        spec.outlive_owner = true;
        let sandbox = GvisorSandbox::new(shared, &spec, paths);
        *lock(&sandbox.phase) = Phase::Started(handle.pid);
        *lock(&sandbox.handle) = Some(handle.clone());
        let (stopping, cgroup, exit, memory_mib, console) = (
            sandbox.stopping.clone(),
            sandbox.cgroup.clone(),
            sandbox.exit.clone(),
            sandbox.memory_mib,
            sandbox.paths.console.clone(),
        );
        tokio::spawn(async move {
            crate::detach::exited(pidfd).await;
            // Not our child: its exit status is not ours to read.
            let ended = if stopping.load(Ordering::SeqCst) {
                SandboxExit::Destroyed
            } else if cgroup.oom_kills() > 0 {
                SandboxExit::OutOfMemory {
                    limit_mib: memory_mib,
                }
            } else {
                SandboxExit::Exited {
                    code: -1,
                    detail: format!(
                        "runsc run (pid {}, adopted) ended; its exit status is unknown{}",
                        handle.pid,
                        log_tail(&console, "sandbox log", 2048, 8)
                    ),
                }
            };
            exit.set(ended);
        });
        sandbox
    }

    /// Builds the sandbox's network; before [`GvisorSandbox::prepare`], whose bundle names
    /// its namespace.
    pub(super) async fn attach_network(&self, spec: &network::NetworkSpec) -> Result<()> {
        let net = network::create(&self.shared.nets, &self.id, spec).await?;
        *lock(&self.netns) = Some(net.network().netns_path());
        *self.net.lock().await = Some(net);
        *lock(&self.network_spec) = Some(spec.clone());
        Ok(())
    }

    /// Replaces the egress policy live (new connections follow it at once).
    pub async fn set_egress(&self, egress: &sandcell_net::EgressSpec) -> Result<()> {
        match &*self.net.lock().await {
            Some(net) => {
                net.set_policy(egress)
                    .await
                    .map_err(|e| Error::InvalidSpec {
                        runtime: RT,
                        problem: format!("egress policy of {}: {e}", self.id),
                    })?;
                if let Some(spec) = lock(&self.network_spec).as_mut() {
                    spec.egress = egress.clone();
                }
                Ok(())
            }
            None => Err(Error::InvalidSpec {
                runtime: RT,
                problem: format!("sandbox {} was created without a network", self.id),
            }),
        }
    }

    /// What the egress policy refused for this sandbox (`None`: it has no network).
    pub async fn denied(&self) -> Result<Option<sandcell_net::DeniedLog>> {
        match &*self.net.lock().await {
            Some(net) => net.denied().await.map(Some).map_err(|e| {
                Error::io(
                    RT,
                    format!("reading the denied log of {}", self.id),
                    std::io::Error::other(e),
                )
            }),
            None => Ok(None),
        }
    }

    /// The sandbox's addresses and namespace, if it has a network.
    pub async fn network_addresses(&self) -> Option<sandcell_net::Network> {
        self.net.lock().await.as_ref().map(|n| n.network().clone())
    }

    /// Layer, mount, cgroup and bundle: everything before a process runs. `lowers`: the
    /// image tree, under the frozen layers of a snapshot if restoring one (top first).
    pub(super) async fn prepare(&self, spec: &SandboxSpec, lowers: &[&Path]) -> Result<()> {
        let p = &self.paths;
        for dir in [&p.bundle, &p.rootfs, &p.upper, &p.work, &p.host] {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::io(RT, format!("creating {}", dir.display()), e))?;
        }
        mount_overlay(lowers, &p.upper, &p.work, &p.rootfs)?;
        // The root's layers may come from a guest (a build step's, a snapshot's): nothing
        // the host makes in it follows a link there (crate::nofollow).
        let mount_point = Path::new(bundle::HOST_DIR_IN_SANDBOX.trim_start_matches('/'));
        crate::nofollow::open_dir_in(&p.rootfs, mount_point, true).map_err(|e| {
            Error::io(
                RT,
                format!(
                    "creating mount point {} in {}",
                    mount_point.display(),
                    p.rootfs.display()
                ),
                e,
            )
        })?;
        if let Some(net) = &*self.net.lock().await {
            network::write_resolv_conf(&p.rootfs, net)?;
        }
        SandboxCgroup::create(self.shared.cgroups, &self.id, spec.memory_mib, spec.vcpus)?;
        let netns = lock(&self.netns).clone();
        let mut config = bundle::config(&bundle::BundleSpec {
            rootfs: &p.rootfs,
            host_dir: &p.host,
            env: &spec.env,
            memory_mib: spec.memory_mib,
            vcpus: spec.vcpus,
            cgroups_path: &self.cgroup.oci_path(),
            hostname: &self.id,
            netns: netns.as_deref(),
        });
        if self.host_writes {
            // runsc puts a tmpfs on an empty /tmp the spec does not mount: /tmp bound to
            // itself keeps a build step's writes there in the host layer too.
            let tmp = p.rootfs.join("tmp");
            crate::nofollow::open_dir_in(&p.rootfs, Path::new("tmp"), true)
                .map_err(|e| Error::io(RT, format!("creating {}", tmp.display()), e))?;
            if let Some(mounts) = config["mounts"].as_array_mut() {
                mounts.push(serde_json::json!({
                    "destination": "/tmp", "type": "bind", "source": tmp,
                    "options": ["rbind", "rw"],
                }));
            }
            // Only with a disk: without the bind, /tmp is runsc's own tmpfs and sockets in it
            // are saved by a checkpoint already (and mount points in it would make it
            // non-empty, so runsc would not mount that tmpfs); a template build's step
            // (a host layer) is never checkpointed, and the mount points would end up in the
            // layer. After the bind: a later mount goes on top of an earlier one. The mount
            // points are made on this sandbox's own disk without following a link there.
            for rel in bundle::SOCKET_DIRS
                .iter()
                .filter(|_| self.disk_mib.is_some())
            {
                crate::nofollow::open_dir_in(&p.rootfs, Path::new(rel), true)
                    .map_err(|e| Error::io(RT, format!("creating /{rel} in the root"), e))?;
                if let Some(mounts) = config["mounts"].as_array_mut() {
                    mounts.push(bundle::socket_dir_mount(rel));
                }
            }
        }
        for bind in &spec.volumes {
            let mount = bundle::volume_mount(&p.rootfs, bind)?;
            if let Some(mounts) = config["mounts"].as_array_mut() {
                mounts.push(mount);
            }
        }
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

    /// An envd client of the agent's socket, connecting without following a link there
    /// (the guest can write in the socket's directory: crate::nofollow).
    fn agent_client(&self) -> EnvdClient<impl sandcell_envd_client::Connector> {
        let socket = self.paths.socket.clone();
        EnvdClient::new(move || {
            let socket = socket.clone();
            async move { crate::nofollow::connect_unix(&socket).await }
        })
    }

    fn console_tail(&self) -> String {
        log_tail(&self.paths.console, "sandbox log", 4096, 20)
    }

    /// Asks the agent to power off; true if the request went out (the agent may exit
    /// before it answers).
    async fn poweroff(&self) -> bool {
        let client = self.agent_client();
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
        let probe = || async move { crate::nofollow::connect_unix(socket).await.is_ok() };
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

fn mount_overlay(lowers: &[&Path], upper: &Path, work: &Path, target: &Path) -> Result<()> {
    for p in lowers.iter().copied().chain([upper, work]) {
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
    let lower: Vec<String> = lowers.iter().map(|l| l.display().to_string()).collect();
    // No redirects or metacopy: a snapshot flattens the upper into a plain layer (flatten.rs).
    let options = format!(
        "lowerdir={},upperdir={},workdir={},redirect_dir=off,metacopy=off",
        lower.join(":"),
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

    fn handle(&self) -> Option<SandboxHandle> {
        lock(&self.handle).clone()
    }

    fn network(&self) -> Option<sandcell_net::SandboxNet> {
        self.shared.nets.get(&self.id)
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
        // The guest writes what it likes to its stdout: through a writer that caps the file.
        let log = crate::capped_log::spawn(&self.paths.console, crate::capped_log::CONSOLE_LOG_CAP)
            .map_err(|e| {
                Error::io(
                    RT,
                    format!(
                        "starting the console writer of {}",
                        self.paths.console.display()
                    ),
                    e,
                )
            })?;
        let log2 = log
            .try_clone()
            .map_err(|e| Error::io(RT, "duplicating the log fd", e))?;
        let netns_path = lock(&self.netns).clone();
        let restore_from = lock(&self.restore_from).take();
        let mut command = match &restore_from {
            Some(image) => self.shared.restore_command(
                &self.paths.bundle,
                &self.id,
                netns_path.is_some(),
                self.host_writes,
                image,
            ),
            None => self.shared.run_command_root(
                &self.paths.bundle,
                &self.id,
                netns_path.is_some(),
                self.host_writes,
            ),
        };
        // Opened here and kept until the spawn below (enter_netns uses its descriptor).
        let netns = match &netns_path {
            Some(path) => Some(std::fs::File::open(path).map_err(|e| {
                Error::io(
                    RT,
                    format!("opening network namespace {}", path.display()),
                    e,
                )
            })?),
            None => None,
        };
        if let Some(ns) = &netns {
            network::enter_netns(&mut command, ns);
        }
        if self.outlive_owner {
            crate::detach::detached(&mut command);
        } else {
            crate::util::supervised(&mut command);
        }
        let spawned = command.stdout(log).stderr(log2).spawn();
        // Ordering: the command holds our copies of the log pipe; they must be closed now, so
        // that the console writer ends with runsc (it reads until the last writer is gone).
        drop(command);
        let mut child = spawned.map_err(|e| {
            Error::io(
                RT,
                format!("starting {}", self.shared.runsc.path.display()),
                e,
            )
        })?;
        let pid = child.id().unwrap_or(0);
        *lock(&self.phase) = Phase::Started(pid);
        if self.outlive_owner
            && let Some(start_time) = crate::owner::process_start_time(pid)
        {
            *lock(&self.handle) = Some(SandboxHandle {
                runtime: RT,
                id: self.id.clone(),
                pid,
                start_time,
                vcpus: self.vcpus,
                memory_mib: self.memory_mib,
                agent_socket: self.paths.socket.clone(),
                control_socket: None,
            });
        }

        let (stopping, cgroup, exit, memory_mib, console) = (
            self.stopping.clone(),
            self.cgroup.clone(),
            self.exit.clone(),
            self.memory_mib,
            self.paths.console.clone(),
        );
        let (launch, this_launch) = (self.launch.clone(), self.launch.load(Ordering::SeqCst));
        tokio::spawn(async move {
            let status = child.wait().await;
            if launch.load(Ordering::SeqCst) != this_launch {
                // Checkpointed and replaced by a restored runsc (checkpoint.rs).
                return;
            }
            let ended = match status {
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
        let stream = crate::nofollow::connect_unix(&self.paths.socket)
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
        let netns = lock(&self.netns).clone();
        self.shared
            .runsc_ok_in(netns.as_deref(), &["pause", &self.id])
            .await?;
        self.paused.store(true, Ordering::SeqCst);
        Ok(())
    }

    async fn resume(&self) -> Result<()> {
        self.require_running("resume")?;
        let netns = lock(&self.netns).clone();
        self.shared
            .runsc_ok_in(netns.as_deref(), &["resume", &self.id])
            .await?;
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

    fn console_tail(&self, max_bytes: u64) -> Vec<String> {
        crate::util::tail_lines(&self.paths.console, max_bytes)
    }

    async fn disk_usage(&self) -> Option<crate::DiskUsage> {
        self.disk_mib?;
        super::disk::usage(&self.shared.dirs, &self.id)
    }

    async fn usage(&self) -> Result<ResourceUsage> {
        Ok(self.cgroup.usage())
    }

    async fn wait(&self) -> SandboxExit {
        self.exit.wait().await
    }

    async fn snapshot(
        &self,
        dest: &Path,
        kind: crate::SnapshotKind,
    ) -> Result<crate::SnapshotHandle> {
        checkpoint::snapshot(self, dest, kind).await
    }

    async fn pause_to_disk(&self, dest: &Path) -> Result<crate::SnapshotHandle> {
        checkpoint::pause_to_disk(self, dest).await
    }

    async fn pause_files_to_disk(&self, dest: &Path) -> Result<crate::SnapshotHandle> {
        files_pause::pause_files_to_disk(self, dest).await
    }

    async fn fork(&self, count: usize, dest: &Path) -> Result<Vec<Box<dyn Sandbox>>> {
        checkpoint::fork(self, count, dest).await
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
        if let Some(net) = self.net.lock().await.take()
            && let Err(e) = network::teardown(&self.id, net).await
        {
            first.get_or_insert(e);
        }
        if let Err(e) = self.shared.remove_leftovers(&self.id).await {
            first.get_or_insert(e);
        }
        self.exit.set(SandboxExit::Destroyed);
        *done = true;
        first.map_or(Ok(()), Err)
    }
}
