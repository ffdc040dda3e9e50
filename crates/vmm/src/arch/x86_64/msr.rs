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
