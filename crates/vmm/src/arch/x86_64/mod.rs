//! x86_64: guest layout, zero page, boot CPU state, CPUID, MSRs, LAPIC, MP table.

pub mod boot_params;
pub mod cpuid;
pub mod lapic;
pub mod layout;
pub mod mptable;
pub mod msr;
pub mod regs;

use kvm_bindings::{CpuId, Msrs};
use kvm_ioctls::VcpuFd;

#[derive(Debug, thiserror::Error)]
pub enum VcpuSetupError {
    #[error("KVM_SET_CPUID2 on vCPU {index} failed: {source}")]
    SetCpuid {
        index: u8,
        source: kvm_ioctls::Error,
    },
    #[error("building the boot MSR list failed: {0:?}")]
    MsrList(vmm_sys_util::fam::Error),
    #[error("KVM_SET_MSRS on vCPU {index} failed: {source}")]
    SetMsrs {
        index: u8,
        source: kvm_ioctls::Error,
    },
    #[error(
        "KVM_SET_MSRS on vCPU {index} set {written} of {wanted} MSRs (first refused: {first_refused:#x})"
    )]
    PartialMsrs {
        index: u8,
        written: usize,
        wanted: usize,
        first_refused: u32,
    },
    #[error("KVM_{op} on vCPU {index} failed: {source}")]
    Ioctl {
        op: &'static str,
        index: u8,
        source: kvm_ioctls::Error,
    },
}

/// Configures vCPU `index` of `count` for boot. The order matters:
/// 1. CPUID first: KVM validates later state against it (MSRs that exist, long mode
///    support for EFER.LME, x2APIC for the LAPIC state).
/// 2. MSRs.
/// 3. For the boot vCPU only, registers, special registers and FPU: the others stay in
///    wait-for-SIPI (the in-kernel LAPIC delivers INIT/SIPI when Linux starts them, which
///    resets their registers anyway).
/// 4. LAPIC LINTs last, read-modify-write of what KVM created with the in-kernel irqchip.
pub fn setup_vcpu(
    vcpu: &VcpuFd,
    index: u8,
    count: u8,
    supported_cpuid: &CpuId,
    entry: Option<u64>,
) -> Result<(), VcpuSetupError> {
    let io = |op| move |source| VcpuSetupError::Ioctl { op, index, source };

    let mut cpuid = supported_cpuid.clone();
    cpuid::normalize(cpuid.as_mut_slice(), index, count);
    vcpu.set_cpuid2(&cpuid)
        .map_err(|source| VcpuSetupError::SetCpuid { index, source })?;

    let entries = msr::boot_msr_entries();
    let msrs = Msrs::from_entries(&entries).map_err(VcpuSetupError::MsrList)?;
    let written = vcpu
        .set_msrs(&msrs)
        .map_err(|source| VcpuSetupError::SetMsrs { index, source })?;
    if written != entries.len() {
        // KVM_SET_MSRS stops at the first MSR it refuses.
        return Err(VcpuSetupError::PartialMsrs {
            index,
            written,
            wanted: entries.len(),
            first_refused: entries[written].index,
        });
    }

    if let Some(entry) = entry {
        vcpu.set_regs(&regs::boot_regs(entry))
            .map_err(io("SET_REGS"))?;
        let sregs = vcpu.get_sregs().map_err(io("GET_SREGS"))?;
        vcpu.set_sregs(&regs::long_mode_sregs(sregs))
            .map_err(io("SET_SREGS"))?;
        vcpu.set_fpu(&regs::boot_fpu()).map_err(io("SET_FPU"))?;
    }

    let mut lapic_state = vcpu.get_lapic().map_err(io("GET_LAPIC"))?;
    lapic::configure_lints(&mut lapic_state);
    vcpu.set_lapic(&lapic_state).map_err(io("SET_LAPIC"))?;
    Ok(())
}
