//! Saving and restoring one vCPU's KVM state (x86_64), in the orders KVM requires.
//!
//! Save runs on the vCPU's own thread while it is paused: the pause already re-entered
//! KVM_RUN with `immediate_exit` so that no port or MMIO instruction is left half done
//! (KVM completes it only on the next KVM_RUN; see kvm::vcpu).
//!
//! Save order, and why:
//! 1. `MP_STATE` first: KVM_GET_MP_STATE runs `kvm_apic_accept_events`, which may process
//!    a pending INIT/SIPI and change the registers and LAPIC read below.
//! 2. regs, sregs, xsave, xcrs, debugregs, LAPIC, TSC frequency, CPUID, MSRs.
//! 3. `VCPU_EVENTS` last: pending exceptions/interrupts/NMIs as of the end of the save.
//!
//! A zero `MSR_IA32_TSC_DEADLINE` is replaced by the vCPU's saved TSC (Firecracker's
//! `fix_zero_tsc_deadline_msr`): KVM reads the deadline back as 0 once it has expired,
//! and Firecracker saw restored guests that never got their next timer interrupt. A
//! deadline equal to the TSC fires at once after restore: a spurious tick is harmless, a
//! lost one can hang the guest. Writing it has no effect unless the LAPIC timer is in
//! TSC-deadline mode.

use kvm_bindings::{
    CpuId, KVM_MAX_CPUID_ENTRIES, Msrs, Xsave, kvm_cpuid_entry2, kvm_debugregs, kvm_lapic_state,
    kvm_mp_state, kvm_msr_entry, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave,
};
use kvm_ioctls::VcpuFd;
use serde::{Deserialize, Serialize};

use crate::arch::x86_64::msr::{MSR_IA32_TSC, MSR_IA32_TSC_DEADLINE};

/// Largest allowed difference between the saved and the host TSC frequency before the
/// restore asks KVM to scale the guest TSC (QEMU's and Firecracker's tolerance).
const TSC_TOLERANCE_PPM: u64 = 250;
/// `kvm_xsave` is 4 KiB; larger XSAVE areas (AMX) continue in `xsave_extra`.
const XSAVE_LEGACY_BYTES: usize = std::mem::size_of::<kvm_xsave>();

#[derive(Debug, thiserror::Error)]
pub enum VcpuStateError {
    #[error("KVM_{op} on vCPU {index} failed: {source}")]
    Ioctl {
        op: &'static str,
        index: u8,
        source: kvm_ioctls::Error,
    },
    #[error("vCPU {index}: building a {what} list failed: {source:?}")]
    Fam {
        index: u8,
        what: &'static str,
        source: vmm_sys_util::fam::Error,
    },
    #[error("KVM_SET_MSRS on vCPU {index} set {written} of {wanted} MSRs (refused: {refused:#x})")]
    PartialMsrs {
        index: u8,
        written: usize,
        wanted: usize,
        refused: u32,
    },
    #[error("vCPU {index}: the saved state has {what}")]
    Invalid { index: u8, what: String },
}

/// Everything KVM holds for one vCPU. KVM structs serialise as their raw bytes
/// (kvm-bindings' `serde` feature).
#[derive(Clone, Serialize, Deserialize)]
pub struct VcpuState {
    pub index: u8,
    pub mp_state: kvm_mp_state,
    pub regs: kvm_regs,
    pub sregs: kvm_sregs,
    /// The legacy 4 KiB XSAVE region (`kvm_xsave.region`, 1024 words). Kept as words:
    /// `kvm_xsave` itself cannot be cloned (it ends in a flexible array).
    pub xsave: Vec<u32>,
    /// The XSAVE area beyond 4 KiB (`KVM_GET_XSAVE2`), empty when the host has none.
    pub xsave_extra: Vec<u32>,
    /// `None` when the host has no KVM_CAP_XCRS.
    pub xcrs: Option<kvm_xcrs>,
    pub debug_regs: kvm_debugregs,
    pub lapic: kvm_lapic_state,
    pub tsc_khz: Option<u32>,
    pub cpuid: Vec<kvm_cpuid_entry2>,
    pub msrs: Vec<kvm_msr_entry>,
    pub events: kvm_vcpu_events,
}

impl std::fmt::Debug for VcpuState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VcpuState")
            .field("index", &self.index)
            .field("rip", &format_args!("{:#x}", self.regs.rip))
            .field("msrs", &self.msrs.len())
            .finish_non_exhaustive()
    }
}

/// What the VM-wide code knows and the vCPU thread needs for a save.
#[derive(Debug, Clone)]
pub struct SaveContext {
    /// Snapshot MSRs the host supports (allow-list ∩ KVM_GET_MSR_INDEX_LIST).
    pub msrs: Vec<u32>,
    /// KVM_CHECK_EXTENSION(KVM_CAP_XSAVE2): the XSAVE area size in bytes, 0 if unknown.
    pub xsave2_size: usize,
    pub has_xcrs: bool,
}

fn io(op: &'static str, index: u8) -> impl Fn(kvm_ioctls::Error) -> VcpuStateError {
    move |source| VcpuStateError::Ioctl { op, index, source }
}

/// Reads the state of vCPU `index` (paused, on its own thread), in the order above.
pub fn save(fd: &VcpuFd, index: u8, ctx: &SaveContext) -> Result<VcpuState, VcpuStateError> {
    let mp_state = fd.get_mp_state().map_err(io("GET_MP_STATE", index))?;
    let regs = fd.get_regs().map_err(io("GET_REGS", index))?;
    let sregs = fd.get_sregs().map_err(io("GET_SREGS", index))?;
    let (xsave, xsave_extra) = save_xsave(fd, index, ctx.xsave2_size)?;
    let xcrs = if ctx.has_xcrs {
        Some(fd.get_xcrs().map_err(io("GET_XCRS", index))?)
    } else {
        None
    };
    let debug_regs = fd.get_debug_regs().map_err(io("GET_DEBUGREGS", index))?;
    let lapic = fd.get_lapic().map_err(io("GET_LAPIC", index))?;
    // Not every host can report it (no stable TSC); the restore then leaves the TSC
    // frequency as the host's.
    let tsc_khz = fd.get_tsc_khz().ok();
    let cpuid = fd
        .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
        .map_err(io("GET_CPUID2", index))?
        .as_slice()
        .to_vec();
    let mut msrs = save_msrs(fd, index, &ctx.msrs)?;
    fix_zero_tsc_deadline(&mut msrs);
    let events = fd.get_vcpu_events().map_err(io("GET_VCPU_EVENTS", index))?;
    Ok(VcpuState {
        index,
        mp_state,
        regs,
        sregs,
        xsave,
        xsave_extra,
        xcrs,
        debug_regs,
        lapic,
        tsc_khz,
        cpuid,
        msrs,
        events,
    })
}

fn save_xsave(
    fd: &VcpuFd,
    index: u8,
    xsave2_size: usize,
) -> Result<(Vec<u32>, Vec<u32>), VcpuStateError> {
    if xsave2_size <= XSAVE_LEGACY_BYTES {
        let x = fd.get_xsave().map_err(io("GET_XSAVE", index))?;
        return Ok((x.region.to_vec(), Vec::new()));
    }
    let extra = (xsave2_size - XSAVE_LEGACY_BYTES).div_ceil(4);
    let mut x = Xsave::new(extra).map_err(|source| VcpuStateError::Fam {
        index,
        what: "XSAVE",
        source,
    })?;
    // SAFETY: `x` was allocated with room for the whole area KVM_CAP_XSAVE2 announced.
    unsafe { fd.get_xsave2(&mut x) }.map_err(io("GET_XSAVE2", index))?;
    let region = x.as_fam_struct_ref().xsave.region.to_vec();
    Ok((region, x.as_slice().to_vec()))
}

/// KVM_GET_MSRS stops at the first MSR it cannot read and returns how many it read: the
/// unreadable one is dropped and the read repeated, so one odd MSR costs only itself.
fn save_msrs(fd: &VcpuFd, index: u8, list: &[u32]) -> Result<Vec<kvm_msr_entry>, VcpuStateError> {
    let mut wanted: Vec<kvm_msr_entry> = list
        .iter()
        .map(|&i| kvm_msr_entry {
            index: i,
            ..Default::default()
        })
        .collect();
    loop {
        let mut msrs = Msrs::from_entries(&wanted).map_err(|source| VcpuStateError::Fam {
            index,
            what: "MSR",
            source,
        })?;
        let n = fd.get_msrs(&mut msrs).map_err(io("GET_MSRS", index))?;
        if n >= wanted.len() {
            return Ok(msrs.as_slice().to_vec());
        }
        tracing::debug!(
            "vCPU {index}: MSR {:#x} is not readable, left out of the snapshot",
            wanted[n].index
        );
        wanted.remove(n);
    }
}

fn fix_zero_tsc_deadline(msrs: &mut [kvm_msr_entry]) {
    let tsc = msrs
        .iter()
        .find(|m| m.index == MSR_IA32_TSC)
        .map(|m| m.data);
    if let (Some(tsc), Some(deadline)) = (
        tsc,
        msrs.iter_mut().find(|m| m.index == MSR_IA32_TSC_DEADLINE),
    ) && deadline.data == 0
    {
        deadline.data = tsc;
    }
}

/// Checks a decoded state before any of it reaches KVM.
pub fn validate(state: &VcpuState, index: u8) -> Result<(), VcpuStateError> {
    let invalid = |what: String| Err(VcpuStateError::Invalid { index, what });
    if state.index != index {
        return invalid(format!("index {} in position {index}", state.index));
    }
    if state.cpuid.is_empty() || state.cpuid.len() > KVM_MAX_CPUID_ENTRIES {
        return invalid(format!("{} CPUID entries", state.cpuid.len()));
    }
    if state.msrs.len() > kvm_bindings::KVM_MAX_MSR_ENTRIES {
        return invalid(format!("{} MSRs", state.msrs.len()));
    }
    if state.xsave.len() != XSAVE_LEGACY_BYTES / 4 {
        return invalid(format!("an XSAVE region of {} words", state.xsave.len()));
    }
    // The XSAVE area is at most a few pages even with AMX.
    if state.xsave_extra.len() > 64 * 1024 {
        return invalid(format!(
            "an XSAVE area of {} words",
            state.xsave_extra.len()
        ));
    }
    Ok(())
}

/// Writes a saved state into a fresh vCPU that has not run yet. Order, and why:
/// 1. CPUID first: KVM checks later state (MSRs that exist, long mode for EFER, x2APIC
///    for the LAPIC) against it, and refuses KVM_SET_CPUID2 after the first KVM_RUN.
/// 2. TSC frequency, before anything that derives from the TSC.
/// 3. MP_STATE.
/// 4. regs before VCPU_EVENTS: KVM_SET_REGS clears pending exceptions.
/// 5. sregs before the LAPIC: SET_SREGS restores the APIC base, which places the LAPIC.
/// 6. xsave, xcrs, debugregs.
/// 7. LAPIC before MSRs: TSC_DEADLINE only takes with the LAPIC in deadline mode.
/// 8. MSRs, with TSC_DEADLINE in a second call after IA32_TSC (a deadline written before
///    the TSC it refers to would be judged against the wrong clock).
/// 9. VCPU_EVENTS last, so nothing above clears the pending events again.
/// 10. KVMCLOCK_CTRL: tells a kvmclock guest it was stopped, so its soft-lockup watchdog
///     does not fire on the jump (EINVAL when the guest has no kvmclock: ignored).
pub fn restore(
    fd: &VcpuFd,
    state: &VcpuState,
    has_tsc_control: bool,
) -> Result<(), VcpuStateError> {
    let index = state.index;
    let cpuid = CpuId::from_entries(&state.cpuid).map_err(|source| VcpuStateError::Fam {
        index,
        what: "CPUID",
        source,
    })?;
    fd.set_cpuid2(&cpuid).map_err(io("SET_CPUID2", index))?;
    restore_tsc_khz(fd, index, state.tsc_khz, has_tsc_control)?;
    fd.set_mp_state(state.mp_state)
        .map_err(io("SET_MP_STATE", index))?;
    fd.set_regs(&state.regs).map_err(io("SET_REGS", index))?;
    fd.set_sregs(&state.sregs).map_err(io("SET_SREGS", index))?;
    restore_xsave(fd, index, &state.xsave, &state.xsave_extra)?;
    if let Some(xcrs) = &state.xcrs {
        fd.set_xcrs(xcrs).map_err(io("SET_XCRS", index))?;
    }
    fd.set_debug_regs(&state.debug_regs)
        .map_err(io("SET_DEBUGREGS", index))?;
    fd.set_lapic(&state.lapic).map_err(io("SET_LAPIC", index))?;
    let (deadline, others): (Vec<kvm_msr_entry>, Vec<kvm_msr_entry>) = state
        .msrs
        .iter()
        .partition(|m| m.index == MSR_IA32_TSC_DEADLINE);
    set_msrs(fd, index, &others)?;
    set_msrs(fd, index, &deadline)?;
    fd.set_vcpu_events(&state.events)
        .map_err(io("SET_VCPU_EVENTS", index))?;
    if let Err(e) = fd.kvmclock_ctrl() {
        tracing::debug!("vCPU {index}: KVM_KVMCLOCK_CTRL: {e} (guest without kvmclock?)");
    }
    Ok(())
}

fn restore_tsc_khz(
    fd: &VcpuFd,
    index: u8,
    saved: Option<u32>,
    has_tsc_control: bool,
) -> Result<(), VcpuStateError> {
    let (Some(saved), Ok(host)) = (saved, fd.get_tsc_khz()) else {
        return Ok(());
    };
    let diff = u64::from(saved.abs_diff(host));
    if diff * 1_000_000 <= u64::from(host) * TSC_TOLERANCE_PPM {
        return Ok(());
    }
    if !has_tsc_control {
        tracing::warn!(
            "vCPU {index}: the snapshot's TSC runs at {saved} kHz, this host's at {host} kHz, \
             and KVM cannot scale it (no KVM_CAP_TSC_CONTROL): guest time will drift"
        );
        return Ok(());
    }
    fd.set_tsc_khz(saved).map_err(io("SET_TSC_KHZ", index))
}

fn restore_xsave(
    fd: &VcpuFd,
    index: u8,
    region: &[u32],
    extra: &[u32],
) -> Result<(), VcpuStateError> {
    if extra.is_empty() {
        let mut xsave = kvm_xsave::default();
        xsave.region.copy_from_slice(region);
        // SAFETY: a plain 4 KiB kvm_xsave; KVM reads only that much for KVM_SET_XSAVE.
        return unsafe { fd.set_xsave(&xsave) }.map_err(io("SET_XSAVE", index));
    }
    let mut x = Xsave::new(extra.len()).map_err(|source| VcpuStateError::Fam {
        index,
        what: "XSAVE",
        source,
    })?;
    // SAFETY: only the fixed-size region is written; the FAM length is left as allocated.
    unsafe { x.as_mut_fam_struct() }
        .xsave
        .region
        .copy_from_slice(region);
    x.as_mut_slice().copy_from_slice(extra);
    // SAFETY: `x` holds the legacy area plus `extra.len()` words, the size it was saved
    // with; KVM reads at most the host's XSAVE2 size, which validate() bounded.
    unsafe { fd.set_xsave2(&x) }.map_err(io("SET_XSAVE2", index))
}

fn set_msrs(fd: &VcpuFd, index: u8, entries: &[kvm_msr_entry]) -> Result<(), VcpuStateError> {
    if entries.is_empty() {
        return Ok(());
    }
    let msrs = Msrs::from_entries(entries).map_err(|source| VcpuStateError::Fam {
        index,
        what: "MSR",
        source,
    })?;
    let written = fd.set_msrs(&msrs).map_err(io("SET_MSRS", index))?;
    if written != entries.len() {
        return Err(VcpuStateError::PartialMsrs {
            index,
            written,
            wanted: entries.len(),
            refused: entries[written].index,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msr(index: u32, data: u64) -> kvm_msr_entry {
        kvm_msr_entry {
            index,
            data,
            ..Default::default()
        }
    }

    #[test]
    fn a_zero_tsc_deadline_becomes_the_tsc() {
        let mut m = vec![msr(MSR_IA32_TSC, 5000), msr(MSR_IA32_TSC_DEADLINE, 0)];
        fix_zero_tsc_deadline(&mut m);
        assert_eq!(m[1].data, 5000);
        let mut m = vec![msr(MSR_IA32_TSC, 5000), msr(MSR_IA32_TSC_DEADLINE, 9000)];
        fix_zero_tsc_deadline(&mut m);
        assert_eq!(m[1].data, 9000, "an armed deadline is kept");
    }
}
