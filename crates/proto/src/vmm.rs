//! `sandcell-vmm`: boot configuration, control protocol, exit statuses.
//!
//! The VMM is started as `sandcell-vmm --config <file.json>` (or `--config-json '<json>'`),
//! from a snapshot (`--restore STATE --mem MEM`), or idle, waiting for a `restore` request
//! (`--wait-restore --control-socket PATH`).
//! Its control socket speaks newline-delimited JSON: one [`ControlRequest`] per line in, one
//! [`ControlResponse`] per line out, in order.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The agent's port on every transport (vsock port in a microVM), as in E2B's envd.
pub const AGENT_PORT: u32 = 49983;

/// Everything `sandcell-vmm` needs to boot a VM. The VMM owns nothing persistent: all of it
/// arrives here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    /// Number of vCPUs, 1..=32.
    pub vcpus: u8,
    /// Guest memory in MiB, 16..=65536 (a tiny payload may use less: min 1).
    pub memory_mib: u32,
    /// An ELF vmlinux (or bzImage) to boot.
    pub kernel: PathBuf,
    /// The kernel command line; the VMM appends its virtio-mmio device declarations.
    #[serde(default)]
    pub cmdline: String,
    /// Root disk: a read-only base image and an optional writable file that receives every
    /// write (reads of blocks never written come from the base).
    #[serde(default)]
    pub disk: Option<DiskConfig>,
    /// Hybrid vsock: host side Unix socket path; guest CID.
    #[serde(default)]
    pub vsock: Option<VsockConfig>,
    /// Add a virtio-rng device.
    #[serde(default)]
    pub rng: bool,
    /// A virtio-net device on a TAP interface of the VMM's network namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net: Option<NetConfig>,
    /// Shared directories (virtio-fs), each served by a vhost-user backend (virtiofsd) on a
    /// Unix socket. A VM with one cannot be snapshotted: the filesystem's state is in the
    /// backend.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fs: Vec<FsConfig>,
    /// File that receives the guest's serial console output.
    #[serde(default)]
    pub serial_log: Option<PathBuf>,
    /// Unix socket on which the VMM serves the control protocol.
    #[serde(default)]
    pub control_socket: Option<PathBuf>,
}

/// The jail a `sandcell-vmm` enters before it opens anything of its VM (`--jail JSON`): its
/// own mount namespace whose root holds only `binds` (each at its host path, so the VM's
/// configuration needs no rewriting), the listed device nodes and its own /proc, then an
/// unprivileged uid/gid with no capabilities, `no_new_privs` and resource limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JailSpec {
    /// The uid and gid the VMM runs as: not 0, and not shared with another VMM.
    pub uid: u32,
    pub gid: u32,
    /// An empty directory: a private tmpfs is mounted on it and becomes the VMM's `/`.
    pub root: PathBuf,
    /// Host paths visible in the jail, at the same path; parents before children.
    #[serde(default)]
    pub binds: Vec<JailBind>,
    /// Device nodes recreated in the jail, owned by `uid` (e.g. /dev/kvm, /dev/net/tun).
    #[serde(default)]
    pub devices: Vec<PathBuf>,
    /// RLIMIT_NOFILE.
    pub max_open_files: u64,
    /// RLIMIT_FSIZE: no file the VMM writes (disk top, memory snapshot, logs) grows past it.
    /// At least the guest memory: the guest memory memfd counts too.
    pub max_file_bytes: u64,
    /// RLIMIT_NPROC for `uid` (its threads: vCPUs plus a few).
    pub max_threads: u64,
}

/// One host path shown in a [`JailSpec`]'s root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JailBind {
    /// Absolute, with no symbolic link on the way (the jail refuses it otherwise).
    pub path: PathBuf,
    /// Read-write; otherwise read-only. Either way nosuid, nodev, noexec.
    #[serde(default)]
    pub writable: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskConfig {
    /// The base image, opened read-only and never written.
    pub base: PathBuf,
    /// The writable layer. Created if missing. When absent the disk is read-only.
    #[serde(default)]
    pub overlay: Option<PathBuf>,
    /// Immutable copy-on-write layers between the base and `overlay`, oldest first (each
    /// one a frozen SCOVL layer file; see `sandcell-vmm`'s block/overlay.rs and layer_index.rs). Reads look
    /// from the top down: overlay, the last layer, ..., the first layer, the base.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VsockConfig {
    /// Guest context id (>= 3).
    pub guest_cid: u32,
    /// Host side: connect here and send `CONNECT <port>\n`; guest-initiated connections to
    /// port P reach `<uds_path>_P`.
    pub uds_path: PathBuf,
}

/// virtio-net: the host side is a TAP interface the VMM attaches to by name (opened with
/// a 12-byte vnet header; created if missing, which needs CAP_NET_ADMIN). Whoever starts
/// the VMM gives the TAP its addresses and routes, usually in a network namespace of the
/// sandbox's own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetConfig {
    /// The TAP interface name (at most 15 bytes).
    pub tap: String,
    /// The guest's MAC address, `aa:bb:cc:dd:ee:ff`.
    pub guest_mac: String,
}

/// A virtio-fs device: the guest mounts it with `mount -t virtiofs <tag> <dir>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FsConfig {
    /// The mount tag the guest sees: 1 to 36 bytes, no NUL.
    pub tag: String,
    /// The vhost-user backend's listening Unix socket (virtiofsd `--socket-path`).
    pub socket: PathBuf,
}

/// One request line on the control socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ControlRequest {
    Status,
    Pause,
    Resume,
    /// Stop the VM now (no guest cooperation) and exit with [`ExitStatus::Stopped`].
    Shutdown,
    /// Save the VM into a state file and a memory image. A running VM is paused for the
    /// save and afterwards returns to the state it was in (a paused one stays paused).
    Snapshot {
        /// The state file (vCPUs, VM, devices), written whole, tens of KiB.
        state_path: PathBuf,
        /// The memory image. `full`: a file with all of guest memory (sparse where the
        /// guest never wrote). `fork`: a symlink to the frozen memory of this VMM process
        /// (`/proc/<pid>/fd/<n>`), valid while this process lives.
        mem_path: PathBuf,
        #[serde(default)]
        mode: SnapshotMode,
        /// Freeze the disk's writable top layer (O(1): it becomes an immutable layer of
        /// the snapshot) and continue this VM on a new empty top layer at this path.
        /// Restores of the snapshot then need their own top (`disk_overlay` override).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        disk_new_top: Option<PathBuf>,
    },
    /// Only in a VMM started with `--wait-restore`: become the VM saved in `state_path`
    /// and `mem_path` (mapped copy-on-write, shared with every other restore of it).
    Restore {
        state_path: PathBuf,
        mem_path: PathBuf,
        #[serde(default)]
        overrides: RestoreOverrides,
        /// Leave the vCPUs paused after the restore (a `resume` starts them).
        #[serde(default)]
        paused: bool,
    },
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotMode {
    /// Write all of guest memory out to `mem_path`.
    #[default]
    Full,
    /// Freeze guest memory in place (no copy): this VM continues copy-on-write over the
    /// frozen image, and `mem_path` points at it. For restoring forks while this VMM runs.
    Fork,
}

/// What a restored VM changes from the saved one (per-clone resources).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreOverrides {
    /// The vsock's host-side Unix socket path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsock_uds_path: Option<PathBuf>,
    /// The disk's writable top layer (created empty if missing) over the saved layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_overlay: Option<PathBuf>,
    /// Where the saved immutable disk layers are now, oldest first, one for each saved
    /// layer (a snapshot that moved its layers into its own directory). Default: the
    /// saved paths.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_layers: Option<Vec<PathBuf>>,
    /// Where the disk's read-only base image is now (default: the saved path). A jailed
    /// VMM sees its inputs where its jail shows them, not where the saving VMM did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_base: Option<PathBuf>,
    /// The TAP the net device attaches to (default: the saved name, opened in the
    /// restoring process's network namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_tap: Option<String>,
    /// The TAP is the file descriptor sent with this request (`SCM_RIGHTS` on the
    /// control socket), already attached (`TUNSETIFF`) by the sender in the sandbox's
    /// network namespace: a VMM started ahead of its sandbox, in no such namespace, can
    /// still be given its network. Only on a `restore` request; `net_tap` is then unused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub net_tap_fd: bool,
    /// The file that receives serial console output (default: the saved one, or stdout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial_log: Option<PathBuf>,
}

/// One response line on the control socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum ControlResponse {
    Ok {
        state: VmState,
    },
    Error {
        /// What kind of failure, for a caller that must decide what to do next; the
        /// message says what failed on what, for people. Answers of VMMs that predate
        /// the field read as [`ControlErrorKind::Other`].
        #[serde(default)]
        kind: ControlErrorKind,
        message: String,
    },
}

/// The stable kinds of control-request failures (their names are part of the protocol).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ControlErrorKind {
    /// The request line is not a valid request.
    BadRequest,
    /// The VM is not in a state that allows the request (stopping; no VM yet; a VM
    /// already running where a restore was asked).
    WrongState,
    /// vCPUs did not answer a pause, resume or save in time.
    Timeout,
    /// KVM refused to read or write a vCPU's state (snapshot or restore).
    VcpuState,
    /// The snapshot named by a restore is unusable (corrupt, foreign, mismatched
    /// files); the same request will fail again.
    BadSnapshot,
    /// The host failed (I/O, KVM, memory): possibly transient.
    Host,
    /// No kind given (an older VMM), or one this side does not know (a newer VMM).
    #[default]
    #[serde(other)]
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VmState {
    Running,
    Paused,
    Stopping,
    /// A `--wait-restore` VMM that has no VM yet.
    Waiting,
}

/// The VMM's process exit statuses. Each way a VM can end has its own, so that a supervisor
/// can tell a guest that powered off from one that crashed without parsing logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum ExitStatus {
    /// The guest powered off (the agent wrote to the power port; see [`POWER_PORT`]).
    PowerOff = 0,
    /// The VMM failed (setup or runtime error); the message is on stderr.
    VmmError = 1,
    /// The configuration was refused before anything started.
    BadConfig = 2,
    /// The guest rebooted (i8042 CPU reset). Sandcell treats a reboot as the end of the VM.
    Reboot = 3,
    /// The guest triple-faulted (KVM_EXIT_SHUTDOWN).
    TripleFault = 4,
    /// The guest kernel panicked ("Kernel panic" seen on the console before the reset that
    /// `panic=-1` causes).
    GuestPanic = 5,
    /// KVM could not run the guest (KVM_EXIT_INTERNAL_ERROR / FAIL_ENTRY): typically a host
    /// whose KVM cannot boot this guest (PVM).
    KvmInternalError = 6,
    /// Stopped through the control socket or by SIGTERM/SIGINT.
    Stopped = 7,
}

impl ExitStatus {
    pub fn code(self) -> i32 {
        self as i32
    }

    pub fn from_code(code: i32) -> Option<ExitStatus> {
        Some(match code {
            0 => ExitStatus::PowerOff,
            1 => ExitStatus::VmmError,
            2 => ExitStatus::BadConfig,
            3 => ExitStatus::Reboot,
            4 => ExitStatus::TripleFault,
            5 => ExitStatus::GuestPanic,
            6 => ExitStatus::KvmInternalError,
            7 => ExitStatus::Stopped,
            _ => return None,
        })
    }

    pub fn describe(self) -> &'static str {
        match self {
            ExitStatus::PowerOff => "the guest powered off",
            ExitStatus::VmmError => "the VMM failed",
            ExitStatus::BadConfig => "the VM configuration was refused",
            ExitStatus::Reboot => "the guest rebooted",
            ExitStatus::TripleFault => "the guest triple-faulted",
            ExitStatus::GuestPanic => "the guest kernel panicked",
            ExitStatus::KvmInternalError => "KVM could not run the guest",
            ExitStatus::Stopped => "the VM was stopped",
        }
    }
}

/// A paravirtual power port of ours: a 1-byte write of [`POWER_OFF`] ends the VM with
/// [`ExitStatus::PowerOff`]. The guest kernel has no ACPI, so `poweroff(2)` alone cannot tell
/// the VMM; the agent (PID 1, with `ioperm`) writes here after syncing its disks.
pub const POWER_PORT: u16 = 0x0510;
pub const POWER_OFF: u8 = 0x00;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_answers_without_a_kind_or_with_an_unknown_one_still_parse() {
        let old: ControlResponse =
            serde_json::from_str(r#"{"result":"error","message":"the VM is stopping"}"#)
                .expect("an answer of a VMM without kinds");
        assert_eq!(
            old,
            ControlResponse::Error {
                kind: ControlErrorKind::Other,
                message: "the VM is stopping".into()
            }
        );
        let newer: ControlResponse =
            serde_json::from_str(r#"{"result":"error","kind":"from_the_future","message":"m"}"#)
                .expect("an answer with a kind this side does not know");
        assert!(matches!(
            newer,
            ControlResponse::Error {
                kind: ControlErrorKind::Other,
                ..
            }
        ));
    }

    #[test]
    fn error_kinds_are_written_by_name() {
        let line = serde_json::to_string(&ControlResponse::Error {
            kind: ControlErrorKind::VcpuState,
            message: "m".into(),
        })
        .expect("serializes");
        assert_eq!(
            line,
            r#"{"result":"error","kind":"vcpu_state","message":"m"}"#
        );
        let back: ControlResponse = serde_json::from_str(&line).expect("parses");
        assert!(matches!(
            back,
            ControlResponse::Error {
                kind: ControlErrorKind::VcpuState,
                ..
            }
        ));
    }
}
