//! Seccomp-bpf filters per thread kind of `sandcell-vmm`, compiled with the rust-vmm
//! `seccompiler` crate from the tables next to this file ([`vmm_thread`], [`vcpu_thread`]).
//!
//! A thread installs its filter itself, right after the setup that needs more (opening
//! /dev/kvm, the disks, the TAP, the snapshot files, mapping guest memory, spawning the
//! vCPU threads) and before it handles anything the guest controls: a vCPU thread before its
//! first `KVM_RUN`, the VMM thread before its event loop services a device. Earlier would
//! forbid the setup; later would let a guest reach the unfiltered kernel surface.
//!
//! A syscall outside the table kills the whole process with SIGSYS (not just the thread: a
//! VMM missing a vCPU would hang its guest rather than end it, and the runtime must see a
//! crash). The library installs nothing unless the binary calls [`configure`], so unit
//! tests that run vCPUs in-process are not filtered.

mod vcpu_thread;
mod vmm_thread;

use std::collections::BTreeMap;
use std::sync::OnceLock;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// What a thread may do beyond its plain syscall list.
pub(crate) struct Table {
    /// Syscalls allowed with any arguments.
    pub syscalls: &'static [i64],
    /// `ioctl` request numbers allowed (argument 1), with their names for the reader.
    pub ioctls: &'static [(u64, &'static str)],
    /// Syscalls allowed only when argument `.1` equals `.2` (e.g. `socket` for AF_UNIX).
    pub arg_equals: &'static [(i64, u8, u64)],
}

/// The kinds of thread `sandcell-vmm` runs, each with its own filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadKind {
    /// The main thread: event loop, devices, control socket, snapshots.
    Vmm,
    /// A vCPU thread: KVM_RUN and the port/MMIO exits it dispatches.
    Vcpu,
}

impl ThreadKind {
    fn table(self) -> &'static Table {
        match self {
            ThreadKind::Vmm => &vmm_thread::TABLE,
            ThreadKind::Vcpu => &vcpu_thread::TABLE,
        }
    }
}

/// What happens to a syscall outside the filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No filter (`--no-seccomp`, for debugging; the library default).
    Off,
    /// The process is killed with SIGSYS (the default of the binary).
    Kill,
    /// The kernel logs the syscall (audit, `dmesg`) and lets it run: for finding what a new
    /// code path needs (`SANDCELL_VMM_SECCOMP=log`).
    Log,
}

static MODE: OnceLock<Mode> = OnceLock::new();

/// Sets the mode for every thread installed afterwards (once, from `main`, before any
/// thread starts). A second call is ignored.
pub fn configure(mode: Mode) {
    let _ = MODE.set(mode);
}

/// The configured mode ([`Mode::Off`] unless [`configure`] was called).
pub fn mode() -> Mode {
    MODE.get().copied().unwrap_or(Mode::Off)
}

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("building the {kind:?} thread's seccomp filter failed: {source}")]
    Build {
        kind: ThreadKind,
        source: seccompiler::BackendError,
    },
    #[error("compiling the {kind:?} thread's seccomp filter failed: {source}")]
    Compile {
        kind: ThreadKind,
        source: seccompiler::BackendError,
    },
    #[error("installing the {kind:?} thread's seccomp filter failed: {source}")]
    Install {
        kind: ThreadKind,
        source: seccompiler::Error,
    },
}

/// The BPF program of `kind` with `mismatch` for syscalls outside its table.
pub fn program(kind: ThreadKind, mismatch: SeccompAction) -> Result<BpfProgram, SeccompError> {
    let table = kind.table();
    let build = |source| SeccompError::Build { kind, source };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for &nr in table.syscalls {
        rules.insert(nr, Vec::new());
    }
    let mut ioctls = Vec::with_capacity(table.ioctls.len());
    for &(request, _) in table.ioctls {
        let cond = SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, request)
            .map_err(build)?;
        ioctls.push(SeccompRule::new(vec![cond]).map_err(build)?);
    }
    if !ioctls.is_empty() {
        rules.insert(libc::SYS_ioctl, ioctls);
    }
    for &(nr, arg, value) in table.arg_equals {
        let cond = SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, value)
            .map_err(build)?;
        rules
            .entry(nr)
            .or_default()
            .push(SeccompRule::new(vec![cond]).map_err(build)?);
    }
    let filter = SeccompFilter::new(rules, mismatch, SeccompAction::Allow, TargetArch::x86_64)
        .map_err(build)?;
    filter
        .try_into()
        .map_err(|source| SeccompError::Compile { kind, source })
}

/// Installs the filter of `kind` in the calling thread, as [`configure`]d. Sets
/// `no_new_privs` first (seccompiler does; an unprivileged process needs it to install a
/// filter, and it keeps an exec'd program from gaining privileges).
pub fn install(kind: ThreadKind) -> Result<(), SeccompError> {
    let mismatch = match mode() {
        Mode::Off => return Ok(()),
        Mode::Kill => SeccompAction::KillProcess,
        Mode::Log => SeccompAction::Log,
    };
    let bpf = program(kind, mismatch.clone())?;
    seccompiler::apply_filter(&bpf).map_err(|source| SeccompError::Install { kind, source })?;
    tracing::debug!("seccomp filter installed in the {kind:?} thread ({mismatch:?} outside it)");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_compiles() {
        for kind in [ThreadKind::Vmm, ThreadKind::Vcpu] {
            let bpf = program(kind, SeccompAction::KillProcess).expect("filter compiles");
            assert!(!bpf.is_empty());
        }
    }

    #[test]
    fn tables_list_each_syscall_once() {
        for kind in [ThreadKind::Vmm, ThreadKind::Vcpu] {
            let t = kind.table();
            let mut seen = std::collections::BTreeSet::new();
            for nr in t.syscalls {
                assert!(seen.insert(*nr), "{kind:?}: syscall {nr} listed twice");
                assert_ne!(
                    *nr,
                    libc::SYS_ioctl,
                    "{kind:?}: ioctl goes by request number"
                );
            }
        }
    }
}
