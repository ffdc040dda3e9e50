//! Model-specific registers set on every vCPU before its first run.
//!
//! A fresh KVM vCPU has these at zero or at reset values; Linux expects a "BIOS" to have
//! left fast strings on and MTRRs enabled with write-back as the default type (otherwise
//! all of RAM is uncached until the kernel fixes up MTRRs, and early boot crawls).

use kvm_bindings::kvm_msr_entry;

pub const MSR_IA32_TSC: u32 = 0x10;
pub const MSR_IA32_SYSENTER_CS: u32 = 0x174;
pub const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
pub const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
pub const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
pub const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;
pub const MSR_STAR: u32 = 0xc000_0081;
pub const MSR_LSTAR: u32 = 0xc000_0082;
pub const MSR_CSTAR: u32 = 0xc000_0083;
pub const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
pub const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;

const MISC_ENABLE_FAST_STRING: u64 = 1;
const MTRR_ENABLE: u64 = 1 << 11;
const MTRR_TYPE_WRBACK: u64 = 6;

/// The boot MSR values, in the order they are written.
pub fn boot_msr_entries() -> Vec<kvm_msr_entry> {
    let e = |index, data| kvm_msr_entry {
        index,
        data,
        ..Default::default()
    };
    vec![
        e(MSR_IA32_SYSENTER_CS, 0),
        e(MSR_IA32_SYSENTER_ESP, 0),
        e(MSR_IA32_SYSENTER_EIP, 0),
        e(MSR_STAR, 0),
        e(MSR_CSTAR, 0),
        e(MSR_KERNEL_GS_BASE, 0),
        e(MSR_SYSCALL_MASK, 0),
        e(MSR_LSTAR, 0),
        e(MSR_IA32_TSC, 0),
        e(MSR_IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
        e(MSR_MTRR_DEF_TYPE, MTRR_ENABLE | MTRR_TYPE_WRBACK),
    ]
}

/// `MSR_IA32_TSC_DEADLINE`: restored after `MSR_IA32_TSC` (see kvm::vcpu_state).
pub const MSR_IA32_TSC_DEADLINE: u32 = 0x6e0;

/// MSRs a snapshot saves, as (first index, count) ranges. An allow-list rather than the
/// host's whole `KVM_GET_MSR_INDEX_LIST`, so that the saved set does not change with the
/// host kernel (a restore on another kernel then sets the same MSRs). Registers that live
/// in `kvm_sregs` (EFER, FS/GS base, APIC base) are not here: SET_SREGS restores them.
const SNAPSHOT_MSR_RANGES: &[(u32, u32)] = &[
    (MSR_IA32_TSC, 1),
    (0x11, 2), // MSR_KVM_WALL_CLOCK, MSR_KVM_SYSTEM_TIME (legacy kvmclock)
    (0x3b, 1), // IA32_TSC_ADJUST
    (0x48, 1), // IA32_SPEC_CTRL
    (MSR_IA32_SYSENTER_CS, 3),
    (MSR_IA32_MISC_ENABLE, 1),
    (0x200, 16), // variable-range MTRRs (8 base/mask pairs)
    (0x250, 1),  // fixed-range MTRRs
    (0x258, 2),
    (0x268, 8),
    (0x277, 1), // IA32_PAT
    (MSR_MTRR_DEF_TYPE, 1),
    (MSR_IA32_TSC_DEADLINE, 1),
    (0xda0, 1), // IA32_XSS
    (MSR_STAR, 4),
    (MSR_KERNEL_GS_BASE, 2), // and TSC_AUX
    (0x4b56_4d00, 8),        // KVM paravirtual MSRs: kvmclock, async PF, steal time, PV EOI
];

/// Whether `index` is one of the MSRs a snapshot saves.
pub fn is_snapshot_msr(index: u32) -> bool {
    SNAPSHOT_MSR_RANGES
        .iter()
        .any(|&(start, count)| index >= start && index - start < count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allow_list_has_what_a_guest_needs_and_not_sregs_msrs() {
        for msr in [
            MSR_IA32_TSC,
            MSR_IA32_TSC_DEADLINE,
            MSR_LSTAR,
            MSR_SYSCALL_MASK,
            0xc000_0103,
            0x4b56_4d01,
            0x20f,
        ] {
            assert!(is_snapshot_msr(msr), "{msr:#x}");
        }
        for msr in [0xc000_0080u32, 0xc000_0100, 0x1b, 0x210, 0x4b56_4d08] {
            assert!(!is_snapshot_msr(msr), "{msr:#x}");
        }
    }
}
