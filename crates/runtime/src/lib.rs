//! The `Runtime` interface: what the platform needs from an isolation technology, and its two
//! implementations:
//!
//! - [`gvisor`]: drives `runsc` as an OCI runtime; works on any Linux host.
//! - [`microvm`]: drives `sandcell-vmm` (one KVM microVM per sandbox).
//!
//! Both run the same static `sandcell-agent` as PID 1 and give the host a bidirectional byte
//! stream to it ([`Sandbox::connect`]); everything above (agent protocol, API) is shared.
//! [`select`] picks one (`auto`: a cached microVM self-test, else gVisor) and [`host`]
//! describes the machine for `sandcell doctor`.
//!
//! Files of a sandbox: `<run-dir>/<id>/` (default `/run/sandcell/<id>/`: sockets, bundle, logs,
//! the owner record) and, for disk layers, `<data-dir>/sandboxes/<id>/`. Destroying a sandbox
//! removes both, and [`Runtime::sweep`] removes those whose owning process died.

pub mod build_disk;
pub mod build_steps;
pub mod capped_log;
pub mod cgroup;
mod detach;
pub mod dirs;
mod error;
pub mod gvisor;
pub mod host;
pub mod image;
pub mod microvm;
pub mod nofollow;
mod owner;
pub mod select;
pub mod snapshot;
pub mod subreaper;
mod supervise;
mod util;

pub use dirs::Dirs;
pub use error::{Error, Result};
pub use gvisor::network::NetworkSpec;
pub use image::Image;
pub use sandcell_net as net;
pub use snapshot::{RestoreSpec, SnapshotHandle, SnapshotKind};

use async_trait::async_trait;
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};

pub use sandcell_proto::vmm::AGENT_PORT;

/// A bidirectional byte stream to a port of a sandbox (a Unix socket or a hybrid-vsock
/// connection).
pub trait AsyncStream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> AsyncStream for T {}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeKind {
    Microvm,
    Gvisor,
}

impl RuntimeKind {
    pub fn name(self) -> &'static str {
        match self {
            RuntimeKind::Microvm => "microvm",
            RuntimeKind::Gvisor => "gvisor",
        }
    }
}

impl fmt::Display for RuntimeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What to run: the same for every runtime.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    /// Unique on this host; see [`new_sandbox_id`]. Letters, digits, `-` and `_` only.
    pub id: String,
    pub image: Image,
    pub vcpus: u8,
    pub memory_mib: u32,
    /// Environment of the agent (PID 1), inherited by the processes it starts.
    pub env: BTreeMap<String, String>,
    /// Guest kernel (microvm only); `None` = `<data-dir>/kernels/default/vmlinux`.
    pub kernel: Option<std::path::PathBuf>,
    /// How long [`Sandbox::start`] waits for the agent to accept connections.
    pub boot_timeout: Duration,
    /// A network with an egress policy (gvisor only for now); `None`: no network
    /// (loopback only).
    pub network: Option<NetworkSpec>,
    /// false (`sandcell run`): the sandbox dies with the process that created it (parent-death
    /// signal) and the next sweep removes its files. true (the daemon): it keeps running when
    /// its creator dies, and a new process takes it over with [`Runtime::adopt`] and the
    /// [`Sandbox::handle`] saved earlier; plain [`Runtime::sweep`]s leave it alone.
    pub outlive_owner: bool,
    /// Build sandboxes (`sandcell template build` RUN steps; gvisor only, the microvm
    /// runtime refuses it): the root's writes land in a host directory that outlives the
    /// sandbox instead of gVisor's memory. `None`: the usual throwaway root.
    pub host_layer: Option<HostLayer>,
    /// A disk of this many MiB for the root's writes (gvisor only; E2B's `diskSizeMB`): a
    /// sparse ext4 file on the data disk under the root's overlay, so a full disk is ENOSPC
    /// inside and the memory limit stays the memory limit (gvisor/disk.rs). `None`: the
    /// root's writes live in the sandbox's memory.
    pub disk_mib: Option<u32>,
    /// Host directories the sandbox sees read-write: the daemon's persistent volumes, each
    /// a JuiceFS mount on the host. gvisor binds them through the gofer; microvm serves
    /// each with a virtiofsd of its own over virtio-fs (microvm/shared_dirs.rs). Empty: none.
    pub volumes: Vec<VolumeBind>,
}

/// A host directory the sandbox sees at `guest` (an absolute, normalized path, not `/`).
/// The host side is the daemon's, never guest-writable before the bind: the guest only
/// reaches what is under it, through the gofer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeBind {
    pub host: std::path::PathBuf,
    pub guest: String,
}

impl VolumeBind {
    /// `guest` below `/`: refused unless it is a plain absolute path (no `..`, `.`, or
    /// empty part, not `/` itself). Both runtimes make the mount point from it.
    pub fn guest_relative(&self) -> std::result::Result<&std::path::Path, String> {
        let rel = std::path::Path::new(&self.guest)
            .strip_prefix("/")
            .map_err(|_| format!("volume path {:?} is not absolute", self.guest))?;
        let plain = rel
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !plain || rel.as_os_str().is_empty() {
            return Err(format!(
                "volume path {:?} must be a plain absolute path below /",
                self.guest
            ));
        }
        Ok(rel)
    }
}

/// A root whose writes reach the host: an overlayfs with `lowers` (top first) above the
/// image tree and `upper` as its writable layer (overlayfs whiteouts and opaque markers
/// included), which the caller turns into a layer once the sandbox is gone. runsc runs with
/// `--overlay2=none` for it, so that writes go through to the host overlay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostLayer {
    pub lowers: Vec<std::path::PathBuf>,
    /// Created if missing; on the same filesystem as `work`.
    pub upper: std::path::PathBuf,
    /// overlayfs's work directory (created if missing, emptied by overlayfs).
    pub work: std::path::PathBuf,
}

/// What finds a running sandbox again after its owner died (see
/// [`SandboxSpec::outlive_owner`]): saved by the owner (the daemon stores it in its database)
/// and given to [`Runtime::adopt`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SandboxHandle {
    pub runtime: RuntimeKind,
    pub id: String,
    /// The host process that embodies the sandbox (`runsc run`, `sandcell-vmm`) ...
    pub pid: u32,
    /// ... and its start time (field 22 of /proc/<pid>/stat), so that a reused pid never
    /// passes for it.
    pub start_time: u64,
    pub vcpus: u8,
    pub memory_mib: u32,
    /// The socket the agent is reached through (gvisor: the agent's Unix socket; microvm:
    /// the VMM's hybrid vsock socket).
    pub agent_socket: std::path::PathBuf,
    /// The VMM's control socket (microvm only).
    #[serde(default)]
    pub control_socket: Option<std::path::PathBuf>,
}

impl SandboxSpec {
    pub fn new(id: String, image: Image) -> Self {
        SandboxSpec {
            id,
            image,
            vcpus: 1,
            memory_mib: 512,
            env: BTreeMap::new(),
            kernel: None,
            boot_timeout: default_boot_timeout(),
            network: None,
            outlive_owner: false,
            host_layer: None,
            disk_mib: None,
            volumes: Vec::new(),
        }
    }
}

/// A fresh sandbox id: `sc-` and 16 hex digits from the kernel's RNG.
/// How long a new sandbox's agent may take to answer: 30 s, or `SANDCELL_BOOT_TIMEOUT_SECS`
/// (1 to 600) on a slow host, such as a microVM under nested virtualization in emulation.
pub fn default_boot_timeout() -> Duration {
    const DEFAULT: Duration = Duration::from_secs(30);
    let Ok(value) = std::env::var("SANDCELL_BOOT_TIMEOUT_SECS") else {
        return DEFAULT;
    };
    match value.parse::<u64>() {
        Ok(secs @ 1..=600) => Duration::from_secs(secs),
        _ => {
            tracing::warn!(
                "SANDCELL_BOOT_TIMEOUT_SECS={value:?} is not a number of seconds from 1 to 600; using {DEFAULT:?}"
            );
            DEFAULT
        }
    }
}

pub fn new_sandbox_id() -> Result<String> {
    let hex = sandcell_proto::random::hex(8).map_err(|source| Error::Host {
        what: "getrandom for a sandbox id".into(),
        source,
    })?;
    Ok(format!("sc-{hex}"))
}

/// Ids become file names, cgroup names and runsc container ids: keep them boring.
pub fn validate_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// How a sandbox ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxExit {
    /// Destroyed (or stopped) on our request.
    Destroyed,
    /// The sandbox's memory use reached its limit and the host killed it.
    OutOfMemory { limit_mib: u32 },
    /// The runtime process (runsc, sandcell-vmm) exited by itself.
    Exited { code: i32, detail: String },
    /// The runtime process was killed by a signal we did not send.
    Killed { signal: i32, detail: String },
    /// The microVM ended with one of the VMM's documented statuses.
    Vm {
        status: sandcell_proto::vmm::ExitStatus,
        detail: String,
    },
}

impl fmt::Display for SandboxExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use sandcell_proto::vmm::ExitStatus;
        match self {
            SandboxExit::Destroyed => write!(f, "the sandbox was stopped"),
            SandboxExit::OutOfMemory { limit_mib } => write!(
                f,
                "the sandbox ran out of memory (limit {limit_mib} MiB) and was killed; \
                 raise --memory"
            ),
            SandboxExit::Exited { code, detail } => {
                write!(
                    f,
                    "the sandbox ended by itself (exit status {code}){}",
                    suffix(detail)
                )
            }
            SandboxExit::Killed {
                signal: libc::SIGSYS,
                detail,
            } => write!(
                f,
                "the sandbox crashed: its runtime process made a system call outside its \
                 seccomp filter and was killed (SIGSYS){}",
                suffix(detail)
            ),
            SandboxExit::Killed { signal, detail } => {
                write!(
                    f,
                    "the sandbox was killed by signal {signal}{}",
                    suffix(detail)
                )
            }
            SandboxExit::Vm {
                status: ExitStatus::KvmInternalError,
                detail,
            } => write!(
                f,
                "this host's KVM cannot run the guest kernel (e.g. PVM); use --runtime gvisor{}",
                suffix(detail)
            ),
            SandboxExit::Vm { status, detail } => {
                write!(
                    f,
                    "{} (sandcell-vmm exit status {}){}",
                    status.describe(),
                    status.code(),
                    suffix(detail)
                )
            }
        }
    }
}

fn suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(": {detail}")
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxStatus {
    /// Created, not started.
    Created,
    Running,
    Paused,
    Exited(SandboxExit),
}

/// Resource use as the host sees it; `None` where the runtime cannot tell.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ResourceUsage {
    pub memory_bytes: Option<u64>,
    pub memory_limit_bytes: Option<u64>,
    /// CPU time consumed, user + system, in microseconds.
    pub cpu_usec: Option<u64>,
    /// The part of `memory_bytes` that is page cache (reclaimable file pages).
    pub memory_cache_bytes: Option<u64>,
}

/// A sandbox's disk as the host sees it: what its writes take and may take.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskUsage {
    pub used_bytes: u64,
    pub total_bytes: u64,
}

/// An isolation technology.
#[async_trait]
pub trait Runtime: Send + Sync {
    fn kind(&self) -> RuntimeKind;

    /// Prepares a sandbox (files, layers, limits) without starting anything in it.
    async fn create(&self, spec: SandboxSpec) -> Result<Box<dyn Sandbox>>;

    /// Removes every leftover of sandboxes of this runtime whose owning process is gone
    /// (crashed CLI or daemon), except those made to outlive their owner
    /// ([`SandboxSpec::outlive_owner`]). Returns the ids cleaned.
    async fn sweep(&self) -> Result<Vec<String>>;

    /// As [`Runtime::sweep`], and also the sandboxes made to outlive their owner whose
    /// owner is gone and that nobody adopted: what a restarted daemon calls once it has
    /// adopted those it knows.
    async fn sweep_unadopted(&self) -> Result<Vec<String>>;

    /// Takes over a sandbox made with [`SandboxSpec::outlive_owner`] whose owner died, from
    /// the [`Sandbox::handle`] that owner saved: this process becomes its owner. A sandbox
    /// that ended meanwhile has its leftovers removed and gives [`Error::Gone`].
    async fn adopt(&self, handle: &SandboxHandle) -> Result<Box<dyn Sandbox>>;

    /// A new, running sandbox from a snapshot ([`Sandbox::snapshot`]), returned once its
    /// agent accepts connections. Its processes, memory and files are the snapshot's; its
    /// id, sockets and writable layer are its own. The caller then gives the agent the new
    /// identity (`POST /init`: env vars, access token, clock).
    async fn restore(
        &self,
        snapshot: &SnapshotHandle,
        spec: RestoreSpec,
    ) -> Result<Box<dyn Sandbox>>;

    /// Kills what the runtime keeps pre-started ahead of creates (microvm: the idle VMMs of
    /// its warm pool) and starts no more: for an owner that exits, whose runtime may never
    /// be dropped before the process ends. Sandboxes are not touched.
    fn stop_prestarted(&self) {}
}

/// One sandbox. Every method takes `&self` so that one task can wait for the sandbox's end
/// while others talk to it.
#[async_trait]
pub trait Sandbox: Send + Sync {
    fn id(&self) -> &str;
    fn runtime(&self) -> RuntimeKind;

    /// How to find this sandbox again after this process dies ([`Runtime::adopt`]); `Some`
    /// once a sandbox made with [`SandboxSpec::outlive_owner`] has started.
    fn handle(&self) -> Option<SandboxHandle>;

    /// The sandbox's network, if it has one (made with [`SandboxSpec::network`], or taken
    /// over by the owner into the runtime's [`net::NetRegistry`] after an adoption).
    fn network(&self) -> Option<net::SandboxNet>;

    /// Starts the sandbox and returns once the agent accepts connections (or fails with the
    /// console tail when the sandbox ends or the boot timeout passes first).
    async fn start(&self) -> Result<()>;

    /// A new byte stream to `port` of the sandbox (the agent is [`AGENT_PORT`]).
    async fn connect(&self, port: u32) -> Result<Box<dyn AsyncStream>>;

    async fn pause(&self) -> Result<()>;
    async fn resume(&self) -> Result<()>;
    async fn status(&self) -> Result<SandboxStatus>;
    async fn usage(&self) -> Result<ResourceUsage>;
    /// The last lines (at most `max_bytes` of them) of what the sandbox's init (the agent)
    /// and the runtime wrote to its console, oldest first; guest-written text, so the
    /// caller treats it as untrusted. Default: the runtime keeps no console.
    fn console_tail(&self, max_bytes: u64) -> Vec<String> {
        let _ = max_bytes;
        Vec::new()
    }
    /// Its disk, where the runtime can measure it from the host (default: it cannot).
    async fn disk_usage(&self) -> Option<DiskUsage> {
        None
    }

    /// Resolves when the sandbox has ended, with how. Cancel-safe.
    async fn wait(&self) -> SandboxExit;

    /// Stops the sandbox if it runs and removes every file, socket, mount, cgroup and
    /// process of it. Idempotent.
    async fn destroy(&self) -> Result<()>;

    /// Saves the running sandbox into `dest` (a new directory) and keeps it running (see
    /// [`snapshot`] for what each runtime writes and can do). gvisor: the runsc in use
    /// cannot checkpoint and keep running, so the sandbox is checkpointed (it stops) and
    /// restored in place at once: its processes continue, but open connections to it end.
    async fn snapshot(&self, dest: &std::path::Path, kind: SnapshotKind) -> Result<SnapshotHandle>;

    /// A full snapshot into `dest`, then the sandbox stops and its files are removed
    /// (except the snapshot): resume with [`Runtime::restore`].
    async fn pause_to_disk(&self, dest: &std::path::Path) -> Result<SnapshotHandle>;

    /// A filesystem-only pause (E2B's `pause(memory=False)`): the sandbox's files are saved
    /// into `dest` and it stops (its processes end); [`Runtime::restore`] of the handle
    /// boots a fresh sandbox on those files. Default: the runtime cannot.
    async fn pause_files_to_disk(&self, dest: &std::path::Path) -> Result<SnapshotHandle> {
        let _ = dest;
        Err(Error::Unsupported {
            runtime: self.runtime(),
            op: "pause without memory",
            why: "this runtime saves only whole sandboxes (memory: true)".into(),
        })
    }

    /// `count` new running sandboxes that continue from this one's present state, each on
    /// its own writable layer; the parent keeps running (gvisor: restored in place, as for
    /// [`Sandbox::snapshot`]). The snapshot they come from is kept in `dest` (the caller
    /// deletes it when the last of them is gone; microvm fork snapshots live only as long as
    /// the parent). Children made before a failure are destroyed.
    async fn fork(&self, count: usize, dest: &std::path::Path) -> Result<Vec<Box<dyn Sandbox>>>;
}

/// Opens one stream to the agent of a sandbox per call: what the agent client needs.
#[derive(Clone)]
pub struct SandboxConnector(pub std::sync::Arc<dyn Sandbox>);

impl sandcell_envd_client::Connector for SandboxConnector {
    type Io = Box<dyn AsyncStream>;
    fn connect(&self) -> impl std::future::Future<Output = std::io::Result<Self::Io>> + Send {
        let sandbox = self.0.clone();
        async move {
            sandbox
                .connect(AGENT_PORT)
                .await
                .map_err(std::io::Error::other)
        }
    }
}

/// A client of the agent of `sandbox`.
pub fn agent_client(
    sandbox: std::sync::Arc<dyn Sandbox>,
) -> sandcell_envd_client::EnvdClient<SandboxConnector> {
    sandcell_envd_client::EnvdClient::new(SandboxConnector(sandbox))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_fresh_and_valid() {
        let a = new_sandbox_id().unwrap();
        let b = new_sandbox_id().unwrap();
        assert_ne!(a, b);
        assert!(validate_id(&a), "{a}");
        assert!(!validate_id("../x"));
        assert!(!validate_id(".hidden"));
        assert!(!validate_id(""));
    }

    #[test]
    fn kvm_internal_error_says_what_to_do() {
        let e = SandboxExit::Vm {
            status: sandcell_proto::vmm::ExitStatus::KvmInternalError,
            detail: String::new(),
        };
        assert!(e.to_string().contains("--runtime gvisor"), "{e}");
    }
}
