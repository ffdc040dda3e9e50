//! A vCPU thread's filter: `KVM_RUN`, the vCPU state ioctls of a snapshot save and of
//! resume (kvmclock), and what the port/MMIO handlers it runs do: serial output to its log
//! (rotated at a cap: rename, reopen, truncate), eventfd writes that notify the VMM thread
//! or raise an interrupt, channels and the kick signal. Installed when the thread starts,
//! before its first `KVM_RUN`. Observed with `strace -f` over the payload tests.

use super::Table;

pub(super) static TABLE: Table = Table {
    syscalls: &[
        libc::SYS_write,
        libc::SYS_close,
        libc::SYS_fcntl,
        // serial log rotation (devices::serial::CappedFile), a path the host chose
        libc::SYS_openat,
        libc::SYS_rename,
        libc::SYS_renameat,
        libc::SYS_ftruncate,
        libc::SYS_lseek,
        // the allocator (a thread gets its own arena)
        libc::SYS_mmap,
        libc::SYS_munmap,
        libc::SYS_mremap,
        libc::SYS_mprotect,
        libc::SYS_madvise,
        libc::SYS_brk,
        // channels, locks, the kick signal, thread exit
        libc::SYS_futex,
        libc::SYS_sched_yield,
        libc::SYS_clock_gettime,
        // a virtio device activated by the guest's DRIVER_OK write (an MMIO exit on this
        // thread) registers its queue eventfds and backend fds with the VMM's epoll
        // (seen in the nested harness: vsock's muxer)
        libc::SYS_epoll_ctl,
        libc::SYS_rt_sigprocmask,
        libc::SYS_rt_sigreturn,
        libc::SYS_sigaltstack,
        libc::SYS_restart_syscall,
        libc::SYS_exit,
    ],
    ioctls: &[
        (0xae80, "KVM_RUN"),
        // snapshot save (kvm::vcpu_state::save), on the vCPU's own thread
        (0x8004_ae98, "KVM_GET_MP_STATE"),
        (0x8090_ae81, "KVM_GET_REGS"),
        (0x8138_ae83, "KVM_GET_SREGS"),
        (0x9000_aea4, "KVM_GET_XSAVE"),
        (0x9000_aecf, "KVM_GET_XSAVE2"),
        (0x8188_aea6, "KVM_GET_XCRS"),
        (0x8080_aea1, "KVM_GET_DEBUGREGS"),
        (0x8400_ae8e, "KVM_GET_LAPIC"),
        (0xaea3, "KVM_GET_TSC_KHZ"),
        (0xc008_ae91, "KVM_GET_CPUID2"),
        (0xc008_ae88, "KVM_GET_MSRS"),
        (0x8040_ae9f, "KVM_GET_VCPU_EVENTS"),
        // resume: tell a kvmclock guest it was stopped
        (0xaead, "KVM_KVMCLOCK_CTRL"),
    ],
    arg_equals: &[],
};
