//! One microVM sandbox: its `sandcell-vmm` child, the control socket, and how it ends (see
//! the module docs of [`super`] for the files).

use super::jail::pooled::VmmView;
use super::jail::{JailInputs, JailPolicy, VmmJail};
use super::{CONTROL_TIMEOUT, MAX_CONTROL_LINE, Paths, RT, network, remove_files, vsock};
use sandcell_proto::sync::lock;
// A child module, so that snapshots can drive this sandbox's VMM and restores start one.
#[path = "snapshot.rs"]
mod snapshot;
// Also a child module: a create from a template snapshot starts this sandbox's VMM.
#[path = "boot_snapshot_restore.rs"]
mod boot_snapshot_restore;
use crate::supervise::{ExitCell, NotReady, poll_ready};
use crate::util::{kill_pid, last_line, log_tail, open_log};
use crate::{
    AGENT_PORT, AsyncStream, Dirs, Error, ResourceUsage, Result, RuntimeKind, Sandbox, SandboxExit,
    SandboxHandle, SandboxSpec, SandboxStatus,
};
use async_trait::async_trait;
pub(super) use boot_snapshot_restore::{POOL_MARK, TemplatePlan};
use sandcell_proto::vmm::{ControlRequest, ControlResponse, ExitStatus, VmState};
pub(super) use snapshot::restore_new;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

pub struct MicrovmSandbox {
    dirs: Dirs,
    vmm: PathBuf,
    /// The runtime's network registry: where this sandbox's network is found by its id.
    nets: sandcell_net::NetRegistry,
    id: String,
    boot_timeout: Duration,
    memory_mib: u32,
    pub(super) paths: Paths,
    /// The VMM's pid once started.
    pid: Mutex<Option<u32>>,
    paused: AtomicBool,
    stopping: Arc<AtomicBool>,
    exit: ExitCell,
    destroyed: tokio::sync::Mutex<bool>,
    /// [`SandboxSpec::outlive_owner`]: the VMM is started detached.
    outlive_owner: bool,
    vcpus: u8,
    /// Set once started detached (or adopted).
    handle: Mutex<Option<SandboxHandle>>,
    /// What snapshots record and build on (snapshot.rs).
    snap: snapshot::SnapState,
    /// The sandbox's network (network.rs), removed when the sandbox is destroyed.
    net: Mutex<Option<sandcell_net::SandboxNet>>,
    /// What the network was made from: a fork's children get the same.
    net_spec: Option<crate::NetworkSpec>,
    /// Adopted after a daemon restart with a network namespace: its network is not
    /// re-adopted, so whether its VM has a net device is unknown to snapshots.
    adopted_net: bool,
    /// Set when the first start restores a template snapshot into a pooled VMM instead of
    /// booting (boot_snapshot_restore.rs).
    template: Mutex<Option<TemplatePlan>>,
    /// Set when VMMs are jailed (jail/): the jail is made at each start.
    jail_policy: Option<JailPolicy>,
    /// The host files the VMM opens read-only (bound into its jail).
    jail_reads: Mutex<Vec<PathBuf>>,
    /// The running VMM's jail: its uid lease and cgroup, released once the VMM is gone.
    jail: Mutex<Option<VmmJail>>,
    /// The volumes served to the guest over virtio-fs, each by a virtiofsd of its own.
    shared_dirs: Mutex<Vec<super::shared_dirs::SharedDir>>,
    /// Their running virtiofsds (this daemon's starts only), stopped at destroy.
    virtiofsds: Mutex<Vec<tokio::process::Child>>,
    /// Set when the VMM came jailed from the warm pool: it sees its directories at the
    /// pool slot's paths (jail/pooled.rs).
    vmm_view: Mutex<Option<VmmView>>,
    /// The cgroup of an adopted jailed VMM (another daemon made it): removed once the VMM
    /// is gone, at its end or at destroy.
    adopted_cgroup: Arc<Mutex<Option<crate::cgroup::SandboxCgroup>>>,
}

/// How the VMM ending translates into how the sandbox ended.
pub(super) fn classify(
    status: std::process::ExitStatus,
    stopping: bool,
    detail: String,
) -> SandboxExit {
    if stopping {
        return SandboxExit::Destroyed;
    }
    if let Some(signal) = status.signal() {
        return SandboxExit::Killed { signal, detail };
    }
    let code = status.code().unwrap_or(-1);
    match ExitStatus::from_code(code) {
        Some(status) => SandboxExit::Vm { status, detail },
        None => SandboxExit::Exited { code, detail },
    }
}

impl MicrovmSandbox {
    pub(super) fn new(
        dirs: Dirs,
        vmm: PathBuf,
        nets: sandcell_net::NetRegistry,
        spec: &SandboxSpec,
        paths: Paths,
    ) -> MicrovmSandbox {
        let paths_overlay = paths.overlay.clone();
        MicrovmSandbox {
            dirs,
            vmm,
            nets,
            id: spec.id.clone(),
            boot_timeout: spec.boot_timeout,
            memory_mib: spec.memory_mib,
            paths,
            pid: Mutex::new(None),
            paused: AtomicBool::new(false),
            stopping: Arc::new(AtomicBool::new(false)),
            exit: ExitCell::new(),
            destroyed: tokio::sync::Mutex::new(false),
            outlive_owner: spec.outlive_owner,
            vcpus: spec.vcpus,
            handle: Mutex::new(None),
            snap: snapshot::SnapState::new(spec, &paths_overlay),
            net: Mutex::new(None),
            net_spec: spec.network.clone(),
            adopted_net: false,
            template: Mutex::new(None),
            jail_policy: None,
            jail_reads: Mutex::new(Vec::new()),
            jail: Mutex::new(None),
            shared_dirs: Mutex::new(Vec::new()),
            virtiofsds: Mutex::new(Vec::new()),
            vmm_view: Mutex::new(None),
            adopted_cgroup: Arc::new(Mutex::new(None)),
        }
    }

    /// Runs this sandbox's VMM in a jail of `policy` (jail/) that shows it `reads`.
    pub(super) fn with_jail(mut self, policy: Option<JailPolicy>, reads: Vec<PathBuf>) -> Self {
        self.jail_policy = policy;
        *lock(&self.jail_reads) = reads;
        self
    }

    /// The volumes its VMM serves over virtio-fs (shared_dirs.rs), started with it.
    pub(super) fn set_shared_dirs(&self, dirs: Vec<super::shared_dirs::SharedDir>) {
        *lock(&self.shared_dirs) = dirs;
    }

    pub(super) fn jail_policy(&self) -> Option<JailPolicy> {
        self.jail_policy
    }

    /// `host`, a path in the sandbox's directories, as its VMM names it (jail/pooled.rs).
    pub(super) fn in_vmm(&self, host: &std::path::Path) -> PathBuf {
        match &*lock(&self.vmm_view) {
            Some(view) => view.in_vmm(host),
            None => host.to_path_buf(),
        }
    }

    /// The running VMM's uid when it is jailed.
    pub(super) fn jail_uid(&self) -> Option<u32> {
        lock(&self.jail).as_ref().map(VmmJail::uid)
    }

    /// A VMM another process started detached and that still runs (checked by the caller):
    /// its end is learnt from a pidfd; its exit status is not ours to read, its log's last
    /// line tells why.
    pub(super) fn adopted(
        dirs: Dirs,
        vmm: PathBuf,
        nets: sandcell_net::NetRegistry,
        handle: SandboxHandle,
        paths: Paths,
        pidfd: std::os::fd::OwnedFd,
    ) -> MicrovmSandbox {
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
        let mut sandbox = MicrovmSandbox::new(dirs, vmm, nets, &spec, paths);
        sandbox.adopted_net = std::path::Path::new("/run/netns")
            .join(format!(
                "{}{}",
                sandcell_net::network::NETNS_PREFIX,
                handle.id
            ))
            .exists();
        *lock(&sandbox.pid) = Some(handle.pid);
        *lock(&sandbox.handle) = Some(handle.clone());
        *lock(&sandbox.adopted_cgroup) = super::jail::leftover_cgroup(&handle.id);
        let (stopping, exit, vmm_log, cgroup) = (
            sandbox.stopping.clone(),
            sandbox.exit.clone(),
            sandbox.paths.vmm_log.clone(),
            sandbox.adopted_cgroup.clone(),
        );
        let id = handle.id.clone();
        tokio::spawn(async move {
            crate::detach::exited(pidfd).await;
            // Its cgroup goes with it (the VMM we started lose theirs at destroy, with
            // their jail; nothing else removes this one).
            let left = lock(&cgroup).take();
            if let Some(Err(e)) = left.map(|c| c.remove()) {
                tracing::warn!(sandbox = %id, "removing the adopted VMM's cgroup: {e}");
            }
            exit.set(if stopping.load(Ordering::SeqCst) {
                SandboxExit::Destroyed
            } else {
                SandboxExit::Exited {
                    code: -1,
                    detail: format!(
                        "sandcell-vmm (pid {}, adopted) ended: {}",
                        handle.pid,
                        last_line(&vmm_log, 2048)
                    ),
                }
            });
        });
        sandbox
    }

    /// Gives the sandbox its network: the VMM starts in its namespace, and it is removed
    /// with the sandbox.
    pub(super) fn set_network(&self, net: sandcell_net::SandboxNet) {
        *lock(&self.net) = Some(net);
    }

    /// Makes the first start restore a template snapshot (see boot_snapshot_restore.rs).
    pub(super) fn set_template_plan(&self, plan: TemplatePlan) {
        *lock(&self.template) = Some(plan);
    }

    /// Whether the VM has a virtio-net device (its snapshots need a network to restore
    /// into). Refused for an adopted sandbox that had a network (not re-adopted yet).
    pub(super) fn has_network(&self, op: &'static str) -> Result<bool> {
        if self.adopted_net {
            return Err(Error::Unsupported {
                runtime: RT,
                op,
                why: "this sandbox was adopted after a daemon restart and its network is not \
                      re-adopted yet"
                    .into(),
            });
        }
        Ok(self.net_spec.is_some())
    }

    /// The network a fork's children get: the parent's rules, new addresses.
    pub(super) fn network_spec(&self) -> Option<crate::NetworkSpec> {
        self.net_spec.clone()
    }

    fn pid(&self) -> Option<u32> {
        *lock(&self.pid)
    }

    fn require_running(&self, op: &'static str) -> Result<()> {
        let state = if self.pid().is_none() {
            "created"
        } else if self.exit.get().is_some() {
            "exited"
        } else {
            return Ok(());
        };
        Err(Error::WrongState {
            runtime: RT,
            id: self.id.clone(),
            state: state.into(),
            op,
        })
    }

    /// The tails of the serial console and of the VMM's own log.
    fn logs_tail(&self) -> String {
        let mut s = log_tail(&self.paths.console, "guest console", 4096, 25);
        s.push_str(&log_tail(&self.paths.vmm_log, "sandcell-vmm log", 2048, 10));
        s
    }

    async fn control(&self, request: &ControlRequest) -> Result<VmState> {
        self.control_within(request, CONTROL_TIMEOUT).await
    }

    /// One control exchange, answered within `timeout`.
    async fn control_within(&self, request: &ControlRequest, timeout: Duration) -> Result<VmState> {
        self.control_passing(request, None, timeout).await
    }

    /// [`Self::control_within`], with `tap` sent along the request's bytes (a pooled VMM's
    /// restore: network.rs [`network::send_with_tap`]).
    async fn control_passing(
        &self,
        request: &ControlRequest,
        tap: Option<std::os::fd::OwnedFd>,
        timeout: Duration,
    ) -> Result<VmState> {
        let fail = |problem: String| Error::Control {
            runtime: RT,
            id: self.id.clone(),
            path: self.paths.control.clone(),
            problem,
        };
        let exchange = async {
            // Not through a link: a jailed VMM owns the socket's directory.
            let mut stream = crate::nofollow::connect_unix(&self.paths.control)
                .await
                .map_err(|e| fail(e.to_string()))?;
            let mut line = serde_json::to_vec(request).map_err(|e| fail(e.to_string()))?;
            line.push(b'\n');
            match tap {
                Some(tap) => network::send_with_tap(&stream, &line, tap).await,
                None => stream.write_all(&line).await,
            }
            .map_err(|e| fail(format!("sending: {e}")))?;
            let mut reply = String::new();
            let mut reader =
                tokio::io::BufReader::new(tokio::io::AsyncReadExt::take(stream, MAX_CONTROL_LINE));
            reader
                .read_line(&mut reply)
                .await
                .map_err(|e| fail(format!("reading the answer: {e}")))?;
            match serde_json::from_str::<ControlResponse>(reply.trim()) {
                Ok(ControlResponse::Ok { state }) => Ok(state),
                Ok(ControlResponse::Error { message, .. }) => Err(fail(message)),
                Err(e) => Err(fail(format!("bad answer {:?}: {e}", reply.trim()))),
            }
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or_else(|_| Err(fail(format!("no answer within {timeout:?}"))))
    }

    /// Waits up to `timeout` for the VMM to exit; true if it did.
    async fn exited_within(&self, timeout: Duration) -> bool {
        tokio::time::timeout(timeout, self.exit.wait())
            .await
            .is_ok()
    }
}

#[async_trait]
impl Sandbox for MicrovmSandbox {
    fn id(&self) -> &str {
        &self.id
    }

    fn runtime(&self) -> RuntimeKind {
        RT
    }

    fn network(&self) -> Option<sandcell_net::SandboxNet> {
        self.nets.get(&self.id)
    }

    fn handle(&self) -> Option<SandboxHandle> {
        lock(&self.handle).clone()
    }

    async fn start(&self) -> Result<()> {
        if self.pid().is_some() || *self.destroyed.lock().await {
            return Err(Error::WrongState {
                runtime: RT,
                id: self.id.clone(),
                state: "started".into(),
                op: "start",
            });
        }
        let plan = lock(&self.template).take();
        if let Some(plan) = plan {
            match boot_snapshot_restore::start(self, plan).await {
                boot_snapshot_restore::Outcome::Started(result) => return result,
                boot_snapshot_restore::Outcome::ColdBoot(why) => tracing::warn!(
                    sandbox = %self.id,
                    "microvm sandbox booting cold: the template snapshot path failed: {why}"
                ),
            }
        }
        let log = open_log(&self.paths.vmm_log)
            .map_err(|e| Error::io(RT, format!("opening {}", self.paths.vmm_log.display()), e))?;
        let log2 = log
            .try_clone()
            .map_err(|e| Error::io(RT, "duplicating the log fd", e))?;
        let mut command = tokio::process::Command::new(&self.vmm);
        if self.outlive_owner {
            crate::detach::detached(&mut command);
        } else {
            crate::util::supervised(&mut command);
        }
        match self.snap.take_restore_args() {
            Some(args) => command.args(args),
            None => command.arg("--config").arg(&self.paths.config),
        };
        // Kept open until the child has started: its pre-exec setns uses the descriptor.
        let netns = match lock(&self.net).as_ref() {
            Some(net) => Some(network::open_netns(net.network())?),
            None => None,
        };
        if let Some(file) = &netns {
            network::join_netns(&mut command, file);
        }
        // After the namespace is open (the TAP in it is handed to the jail's uid).
        let jail = self.prepare_jail(&mut command, netns.as_ref())?;
        // The volumes' virtiofsds listen before the VMM connects to them; their sockets
        // go to the jail's uid.
        let shared = lock(&self.shared_dirs).clone();
        let vmm_uid = jail.as_ref().map(VmmJail::uid);
        let mut virtiofsds =
            match super::shared_dirs::start(&shared, vmm_uid, self.outlive_owner).await {
                Ok(children) => children,
                Err(e) => {
                    if let Some(jail) = jail {
                        let _ = jail.release();
                    }
                    return Err(e);
                }
            };
        // A fork's memory: a descriptor of the parent's memfd, kept open until the spawn.
        let inherited = self.snap.take_restore_fd();
        if let Some(fd) = &inherited {
            snapshot::inherit_fd(&mut command, fd);
        }
        let spawned = command
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| Error::io(RT, format!("starting {}", self.vmm.display()), e));
        drop(inherited);
        let child = match spawned {
            Ok(child) => child,
            Err(e) => {
                super::shared_dirs::stop(&mut virtiofsds);
                if let Some(jail) = jail {
                    let _ = jail.release();
                }
                return Err(e);
            }
        };
        *lock(&self.jail) = jail;
        *lock(&self.virtiofsds) = virtiofsds;
        let pid = child.id().unwrap_or(0);
        self.supervise(child, pid).await
    }

    async fn connect(&self, port: u32) -> Result<Box<dyn AsyncStream>> {
        self.require_running("connect")?;
        let stream = vsock::connect(&self.paths.vsock, port)
            .await
            .map_err(|e| Error::Connect {
                runtime: RT,
                id: self.id.clone(),
                port,
                problem: e.to_string(),
            })?;
        Ok(Box::new(stream))
    }

    async fn pause(&self) -> Result<()> {
        self.require_running("pause")?;
        self.control(&ControlRequest::Pause).await?;
        self.paused.store(true, Ordering::SeqCst);
        Ok(())
    }

    async fn resume(&self) -> Result<()> {
        self.require_running("resume")?;
        self.control(&ControlRequest::Resume).await?;
        self.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    async fn status(&self) -> Result<SandboxStatus> {
        if let Some(exit) = self.exit.get() {
            return Ok(SandboxStatus::Exited(exit));
        }
        if *self.destroyed.lock().await {
            return Ok(SandboxStatus::Exited(SandboxExit::Destroyed));
        }
        Ok(match self.pid() {
            None => SandboxStatus::Created,
            Some(_) if self.paused.load(Ordering::SeqCst) => SandboxStatus::Paused,
            Some(_) => SandboxStatus::Running,
        })
    }

    async fn usage(&self) -> Result<ResourceUsage> {
        let mut usage = ResourceUsage {
            memory_limit_bytes: Some(u64::from(self.memory_mib) << 20),
            ..Default::default()
        };
        if let Some(pid) = self.pid().filter(|_| self.exit.get().is_none()) {
            let (rss, cpu) = crate::host::process_usage(pid);
            usage.memory_bytes = rss;
            usage.cpu_usec = cpu;
        }
        Ok(usage)
    }

    async fn wait(&self) -> SandboxExit {
        self.exit.wait().await
    }

    async fn snapshot(
        &self,
        dest: &std::path::Path,
        kind: crate::SnapshotKind,
    ) -> Result<crate::SnapshotHandle> {
        snapshot::snapshot(self, dest, kind).await
    }

    async fn pause_to_disk(&self, dest: &std::path::Path) -> Result<crate::SnapshotHandle> {
        snapshot::pause_to_disk(self, dest).await
    }

    async fn fork(&self, count: usize, dest: &std::path::Path) -> Result<Vec<Box<dyn Sandbox>>> {
        snapshot::fork(self, count, dest).await
    }

    async fn destroy(&self) -> Result<()> {
        let mut done = self.destroyed.lock().await;
        if *done {
            return Ok(());
        }
        self.stopping.store(true, Ordering::SeqCst);
        if let Some(pid) = self.pid().filter(|_| self.exit.get().is_none()) {
            // Politely: the agent syncs and powers off. Then firmly. Then SIGKILL.
            let client =
                sandcell_envd_client::EnvdClient::new(vsock_connector(self.paths.vsock.clone()));
            let _ = tokio::time::timeout(Duration::from_secs(1), client.poweroff()).await;
            if !self.exited_within(Duration::from_secs(2)).await {
                let _ = self.control(&ControlRequest::Shutdown).await;
                if !self.exited_within(Duration::from_secs(2)).await {
                    kill_pid(pid, libc::SIGKILL);
                    self.exited_within(Duration::from_secs(2)).await;
                }
            }
        }
        // The VMM is gone (or as gone as it gets): its virtiofsds have nothing left to
        // serve, its cgroup goes, its uid is freed.
        super::shared_dirs::stop(&mut lock(&self.virtiofsds));
        let jail = lock(&self.jail).take();
        let released = jail.map_or(Ok(()), VmmJail::release);
        let adopted = lock(&self.adopted_cgroup).take();
        let released = released.and(adopted.map_or(Ok(()), |c| c.remove()));
        let removed = remove_files(&self.dirs, &self.id).and(released);
        let net = lock(&self.net).take();
        let removed = match net {
            // After the VMM is gone: the namespace goes, and the TAP with it.
            Some(net) => removed.and(network::teardown(&self.id, net).await),
            None => removed,
        };
        self.exit.set(SandboxExit::Destroyed);
        *done = true;
        removed
    }
}

/// A connector to the agent through the hybrid vsock socket at `uds`.
fn vsock_connector(
    uds: PathBuf,
) -> impl Fn() -> std::pin::Pin<
    Box<dyn std::future::Future<Output = std::io::Result<tokio::net::UnixStream>> + Send>,
> + Send
+ Sync
+ 'static {
    move || {
        let uds = uds.clone();
        Box::pin(async move { vsock::connect(&uds, AGENT_PORT).await })
    }
}

impl MicrovmSandbox {
    /// With a jail policy: the jail of this start (uid, cgroup, binds), `--jail` added to
    /// `command`. The create fails here, with [`crate::Error::Jail`], if it cannot be made.
    fn prepare_jail(
        &self,
        command: &mut tokio::process::Command,
        netns: Option<&std::fs::File>,
    ) -> Result<Option<VmmJail>> {
        let Some(policy) = &self.jail_policy else {
            return Ok(None);
        };
        let reads = lock(&self.jail_reads).clone();
        let run_dir = self.dirs.sandbox_run_dir(&self.id);
        let inputs = JailInputs {
            id: &self.id,
            run_dir: &run_dir,
            state_dir: &self.paths.state_dir,
            reads: &reads,
            vcpus: self.vcpus,
            memory_mib: self.memory_mib,
            netns,
        };
        let jail = VmmJail::prepare(policy, &inputs)?;
        if let Err(e) = jail.apply(command) {
            let _ = jail.release();
            return Err(e.into());
        }
        tracing::info!(sandbox = %self.id, uid = jail.uid(), "sandcell-vmm starts jailed");
        Ok(Some(jail))
    }

    /// Makes the started VMM `child` (pid `pid`) this sandbox's: its pid and handle, the
    /// task that learns its end, then waits for the agent to answer.
    async fn supervise(&self, mut child: tokio::process::Child, pid: u32) -> Result<()> {
        *lock(&self.pid) = Some(pid);
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
                agent_socket: self.paths.vsock.clone(),
                control_socket: Some(self.paths.control.clone()),
            });
        }
        let pid_file = self.dirs.sandbox_run_dir(&self.id).join("vmm.pid");
        std::fs::write(&pid_file, pid.to_string())
            .map_err(|e| Error::io(RT, format!("writing {}", pid_file.display()), e))?;

        let (stopping, exit, vmm_log) = (
            self.stopping.clone(),
            self.exit.clone(),
            self.paths.vmm_log.clone(),
        );
        tokio::spawn(async move {
            let ended = match child.wait().await {
                // The VMM's last line is its verdict; the full logs go with start errors.
                Ok(status) => classify(
                    status,
                    stopping.load(Ordering::SeqCst),
                    last_line(&vmm_log, 2048),
                ),
                Err(e) => SandboxExit::Exited {
                    code: -1,
                    detail: format!("waiting for sandcell-vmm: {e}"),
                },
            };
            exit.set(ended);
        });

        let uds = &self.paths.vsock;
        let probe = || async move { vsock::connect(uds, AGENT_PORT).await.is_ok() };
        match poll_ready(&self.exit, self.boot_timeout, probe).await {
            Ok(()) => Ok(()),
            Err(NotReady::Ended(exit)) => Err(Error::EndedDuringStart {
                runtime: RT,
                id: self.id.clone(),
                exit,
                console: self.logs_tail(),
            }),
            Err(NotReady::Timeout) => Err(Error::BootTimeout {
                runtime: RT,
                id: self.id.clone(),
                timeout: self.boot_timeout,
                console: self.logs_tail(),
            }),
        }
    }
}
