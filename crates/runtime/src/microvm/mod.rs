//! The `microvm` runtime: one `sandcell-vmm` process per sandbox, booting our guest kernel
//! with the agent as init.
//!
//! Files of sandbox `<id>`: `<run-dir>/<id>/{owner.json, vm.json, vsock.sock, control.sock,
//! console.log (the guest's serial console), vmm.log (the VMM's stderr)}` and the disk's
//! writable layer `<data-dir>/sandboxes/<id>/disk.overlay` (the image's rootfs.ext4 is the
//! read-only base and is never written).
//!
//! The host reaches the agent through the VMM's hybrid vsock socket ([`vsock`]). Stopping is
//! polite first (the agent powers the VM off), then firm (control `Shutdown`), then SIGKILL.

pub mod vsock;

use crate::supervise::{ExitCell, NotReady, poll_ready};
use crate::util::{kill_pid, last_line, log_tail, open_log, remove_dir_all_if_exists};
use crate::{
    AGENT_PORT, AsyncStream, Dirs, Error, ResourceUsage, Result, Runtime, RuntimeKind, Sandbox,
    SandboxExit, SandboxSpec, SandboxStatus, owner,
};
use async_trait::async_trait;
use sandcell_proto::vmm::{
    ControlRequest, ControlResponse, DiskConfig, ExitStatus, VmConfig, VmState, VsockConfig,
};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

const RT: RuntimeKind = RuntimeKind::Microvm;
const GUEST_CID: u32 = 3;
/// Bound on one control-socket answer line.
const MAX_CONTROL_LINE: u64 = 64 * 1024;
const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);

/// `$SANDCELL_VMM`, else `sandcell-vmm` next to the running executable (and, for test
/// binaries in `target/<profile>/deps/`, one directory up).
pub fn find_vmm() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SANDCELL_VMM").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir.join("sandcell-vmm"), dir.parent()?.join("sandcell-vmm")]
        .into_iter()
        .find(|p| p.is_file())
}

/// The kernel command line: serial console, root on the virtio disk, the agent as init.
/// `KEY=VALUE` words without a dot become init's environment (the kernel hands them over).
fn cmdline(spec: &SandboxSpec) -> Result<String> {
    let mut words = vec![
        "console=ttyS0".to_string(),
        "reboot=k".into(),
        "panic=-1".into(),
        "quiet".into(),
        "root=/dev/vda".into(),
        "rootfstype=ext4".into(),
        "rw".into(),
        format!("init={}", crate::image::AGENT_PATH),
        format!("sandcell.listen=vsock:{AGENT_PORT}"),
        "SANDCELL_RUNTIME=microvm".into(),
    ];
    for (k, v) in &spec.env {
        let plain = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\'' && b != b'\\')
        };
        if !plain(k) || k.contains(['.', '=']) || !(v.is_empty() || plain(v)) {
            return Err(Error::InvalidSpec {
                runtime: RT,
                problem: format!(
                    "environment variable {k:?} cannot travel on a kernel command line \
                     (no spaces, quotes, dots in names); pass it per process instead"
                ),
            });
        }
        words.push(format!("{k}={v}"));
    }
    Ok(words.join(" "))
}

pub struct MicrovmRuntime {
    dirs: Dirs,
    vmm: PathBuf,
}

impl MicrovmRuntime {
    pub fn new(dirs: Dirs) -> Result<MicrovmRuntime> {
        let vmm = find_vmm().ok_or_else(|| Error::Unavailable {
            runtime: RT,
            what: "sandcell-vmm was not found next to this program".into(),
            hint: "build it (`cargo build -p sandcell-vmm`) or set SANDCELL_VMM".into(),
        })?;
        if !Path::new("/dev/kvm").exists() {
            return Err(Error::Unavailable {
                runtime: RT,
                what: "/dev/kvm does not exist".into(),
                hint: "enable hardware virtualization (or nested virtualization) or use --runtime gvisor".into(),
            });
        }
        Ok(MicrovmRuntime { dirs, vmm })
    }

    pub fn vmm_path(&self) -> &Path {
        &self.vmm
    }
}

struct Paths {
    config: PathBuf,
    vsock: PathBuf,
    control: PathBuf,
    console: PathBuf,
    vmm_log: PathBuf,
    state_dir: PathBuf,
    overlay: PathBuf,
}

impl Paths {
    fn new(dirs: &Dirs, id: &str) -> Paths {
        let run = dirs.sandbox_run_dir(id);
        let state_dir = dirs.sandbox_state_dir(id);
        Paths {
            config: run.join("vm.json"),
            vsock: run.join("vsock.sock"),
            control: run.join("control.sock"),
            console: run.join("console.log"),
            vmm_log: run.join("vmm.log"),
            overlay: state_dir.join("disk.overlay"),
            state_dir,
        }
    }
}

#[async_trait]
impl Runtime for MicrovmRuntime {
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
        if !(1..=32).contains(&spec.vcpus) || !(32..=65536).contains(&spec.memory_mib) {
            return Err(Error::InvalidSpec {
                runtime: RT,
                problem: format!(
                    "{} vCPUs and {} MiB: need 1-32 vCPUs and 32-65536 MiB",
                    spec.vcpus, spec.memory_mib
                ),
            });
        }
        let base = spec.image.rootfs_ext4.clone().ok_or_else(|| Error::Image {
            image: spec.image.name.clone(),
            problem: "has no rootfs.ext4, which the microvm runtime needs".into(),
        })?;
        let kernel = spec
            .kernel
            .clone()
            .unwrap_or_else(|| self.dirs.default_kernel());
        if !kernel.is_file() {
            return Err(Error::Unavailable {
                runtime: RT,
                what: format!("no guest kernel at {}", kernel.display()),
                hint: "build and install it with `make kernel install`, or pass --kernel".into(),
            });
        }
        let paths = Paths::new(&self.dirs, &spec.id);
        let config = VmConfig {
            vcpus: spec.vcpus,
            memory_mib: spec.memory_mib,
            kernel,
            cmdline: cmdline(&spec)?,
            disk: Some(DiskConfig {
                base,
                overlay: Some(paths.overlay.clone()),
            }),
            vsock: Some(VsockConfig {
                guest_cid: GUEST_CID,
                uds_path: paths.vsock.clone(),
            }),
            rng: true,
            serial_log: Some(paths.console.clone()),
            control_socket: Some(paths.control.clone()),
        };
        owner::create_run_dir(&self.dirs, &spec.id, RT)?;
        let sandbox = MicrovmSandbox {
            dirs: self.dirs.clone(),
            vmm: self.vmm.clone(),
            id: spec.id.clone(),
            boot_timeout: spec.boot_timeout,
            memory_mib: spec.memory_mib,
            paths,
            pid: Mutex::new(None),
            paused: AtomicBool::new(false),
            stopping: Arc::new(AtomicBool::new(false)),
            exit: ExitCell::new(),
            destroyed: tokio::sync::Mutex::new(false),
        };
        let prepared = (|| {
            std::fs::create_dir_all(&sandbox.paths.state_dir).map_err(|e| {
                Error::io(
                    RT,
                    format!("creating {}", sandbox.paths.state_dir.display()),
                    e,
                )
            })?;
            let json = serde_json::to_vec_pretty(&config)
                .map_err(|e| Error::io(RT, "encoding vm.json", e.into()))?;
            std::fs::write(&sandbox.paths.config, json).map_err(|e| {
                Error::io(RT, format!("writing {}", sandbox.paths.config.display()), e)
            })
        })();
        if let Err(e) = prepared {
            let _ = sandbox.destroy().await;
            return Err(e);
        }
        Ok(Box::new(sandbox))
    }

    async fn sweep(&self) -> Result<Vec<String>> {
        let mut cleaned = Vec::new();
        for (id, dir) in owner::dead_sandboxes(&self.dirs, RT) {
            // A VMM whose owner died may still run: its pid is in vmm.pid, and its command
            // line names its config (a reused pid would not).
            if let Some(pid) = std::fs::read_to_string(dir.join("vmm.pid"))
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
            {
                let config = dir.join("vm.json");
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                if String::from_utf8_lossy(&cmdline).contains(&*config.to_string_lossy()) {
                    kill_pid(pid, libc::SIGKILL);
                }
            }
            remove_files(&self.dirs, &id)?;
            cleaned.push(id);
        }
        Ok(cleaned)
    }
}

fn remove_files(dirs: &Dirs, id: &str) -> Result<()> {
    for dir in [
        dirs.sandbox_run_dir(id),
        dirs.run.join(format!(".new-{id}")),
        dirs.sandbox_state_dir(id),
    ] {
        remove_dir_all_if_exists(&dir)
            .map_err(|e| Error::io(RT, format!("removing {}", dir.display()), e))?;
    }
    Ok(())
}

pub struct MicrovmSandbox {
    dirs: Dirs,
    vmm: PathBuf,
    id: String,
    boot_timeout: Duration,
    memory_mib: u32,
    paths: Paths,
    /// The VMM's pid once started.
    pid: Mutex<Option<u32>>,
    paused: AtomicBool,
    stopping: Arc<AtomicBool>,
    exit: ExitCell,
    destroyed: tokio::sync::Mutex<bool>,
}

/// How the VMM ending translates into how the sandbox ended.
fn classify(status: std::process::ExitStatus, stopping: bool, detail: String) -> SandboxExit {
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
    fn pid(&self) -> Option<u32> {
        *self.pid.lock().unwrap_or_else(|p| p.into_inner())
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
        let fail = |problem: String| Error::Control {
            runtime: RT,
            id: self.id.clone(),
            path: self.paths.control.clone(),
            problem,
        };
        let exchange = async {
            let mut stream = tokio::net::UnixStream::connect(&self.paths.control)
                .await
                .map_err(|e| fail(e.to_string()))?;
            let mut line = serde_json::to_vec(request).map_err(|e| fail(e.to_string()))?;
            line.push(b'\n');
            stream
                .write_all(&line)
                .await
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
                Ok(ControlResponse::Error { message }) => Err(fail(message)),
                Err(e) => Err(fail(format!("bad answer {:?}: {e}", reply.trim()))),
            }
        };
        tokio::time::timeout(CONTROL_TIMEOUT, exchange)
            .await
            .unwrap_or_else(|_| Err(fail(format!("no answer within {CONTROL_TIMEOUT:?}"))))
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

    async fn start(&self) -> Result<()> {
        if self.pid().is_some() || *self.destroyed.lock().await {
            return Err(Error::WrongState {
                runtime: RT,
                id: self.id.clone(),
                state: "started".into(),
                op: "start",
            });
        }
        let log = open_log(&self.paths.vmm_log)
            .map_err(|e| Error::io(RT, format!("opening {}", self.paths.vmm_log.display()), e))?;
        let log2 = log
            .try_clone()
            .map_err(|e| Error::io(RT, "duplicating the log fd", e))?;
        let mut command = tokio::process::Command::new(&self.vmm);
        let mut child = crate::util::supervised(&mut command)
            .arg("--config")
            .arg(&self.paths.config)
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| Error::io(RT, format!("starting {}", self.vmm.display()), e))?;
        let pid = child.id().unwrap_or(0);
        *self.pid.lock().unwrap_or_else(|p| p.into_inner()) = Some(pid);
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

    async fn destroy(&self) -> Result<()> {
        let mut done = self.destroyed.lock().await;
        if *done {
            return Ok(());
        }
        self.stopping.store(true, Ordering::SeqCst);
        if let Some(pid) = self.pid().filter(|_| self.exit.get().is_none()) {
            // Politely: the agent syncs and powers off. Then firmly. Then SIGKILL.
            let client =
                sandcell_agent::client::AgentClient::new(vsock_connector(self.paths.vsock.clone()));
            let _ = tokio::time::timeout(Duration::from_secs(1), client.poweroff()).await;
            if !self.exited_within(Duration::from_secs(2)).await {
                let _ = self.control(&ControlRequest::Shutdown).await;
                if !self.exited_within(Duration::from_secs(2)).await {
                    kill_pid(pid, libc::SIGKILL);
                    self.exited_within(Duration::from_secs(2)).await;
                }
            }
        }
        let removed = remove_files(&self.dirs, &self.id);
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::Image;

    fn spec() -> SandboxSpec {
        SandboxSpec::new(
            "sc-1".into(),
            Image {
                name: "t".into(),
                rootfs_dir: None,
                rootfs_ext4: Some("/i/rootfs.ext4".into()),
            },
        )
    }

    #[test]
    fn cmdline_boots_the_agent_and_carries_plain_env() {
        let mut s = spec();
        s.env.insert("FOO".into(), "bar".into());
        let c = cmdline(&s).unwrap();
        assert!(c.contains("init=/sbin/sandcell-agent"), "{c}");
        assert!(c.contains("sandcell.listen=vsock:49983"), "{c}");
        assert!(c.ends_with("FOO=bar"), "{c}");
        s.env.insert("BAD".into(), "two words".into());
        assert!(cmdline(&s).is_err());
    }

    #[test]
    fn vmm_exit_codes_map_to_clear_reasons() {
        let status = |code: i32| std::process::ExitStatus::from_raw(code << 8);
        let e = classify(status(6), false, String::new());
        assert_eq!(
            e,
            SandboxExit::Vm {
                status: ExitStatus::KvmInternalError,
                detail: String::new()
            }
        );
        assert!(e.to_string().contains("--runtime gvisor"));
        assert_eq!(
            classify(status(6), true, String::new()),
            SandboxExit::Destroyed
        );
        assert!(matches!(
            classify(status(99), false, String::new()),
            SandboxExit::Exited { code: 99, .. }
        ));
    }
}
