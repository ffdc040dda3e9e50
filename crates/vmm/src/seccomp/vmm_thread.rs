//! The VMM (main) thread's filter: the event loop (epoll, eventfds, signalfd), the
//! virtio devices' backends (disk files, TAP, vsock Unix sockets), the control socket,
//! snapshots (state and memory files, memfd freeze for forks), logging, and teardown.
//! Installed after the VM is built or restored, before the loop's first turn, so nothing
//! here is needed for opening /dev/kvm, creating the VM or the vCPUs, or mapping memory.
//!
//! Observed with `strace -f` over the payload tests (see docs/vmm.md#seccomp) plus the paths
//! those cannot reach here (virtio-net's TUNSETOFFLOAD, vsock's guest-initiated connects).
//! glibc's `rename`/`unlink`/`symlink` use the old syscalls, newer ones the `*at` forms.

use super::Table;

pub(super) static TABLE: Table = Table {
    syscalls: &[
        // I/O on the fds it holds: disks, TAP, sockets, eventfds, signalfd, logs
        libc::SYS_read,
        libc::SYS_write,
        libc::SYS_readv,
        libc::SYS_writev,
        libc::SYS_pread64,
        libc::SYS_pwrite64,
        libc::SYS_lseek,
        libc::SYS_close,
        libc::SYS_fcntl,
        libc::SYS_fstat,
        libc::SYS_newfstatat,
        libc::SYS_statx,
        libc::SYS_fdatasync,
        libc::SYS_fsync,
        libc::SYS_ftruncate,
        libc::SYS_flock,
        // full snapshots copy the touched memory out
        libc::SYS_sendfile,
        // the event loop
        libc::SYS_epoll_wait,
        libc::SYS_epoll_pwait,
        libc::SYS_epoll_ctl,
        // vsock's muxer arms and disarms its connection-timeout tick (a timerfd)
        libc::SYS_timerfd_settime,
        libc::SYS_timerfd_gettime,
        // control socket and vsock's host side (socket: AF_UNIX only, see arg_equals)
        libc::SYS_accept4,
        libc::SYS_connect,
        libc::SYS_recvfrom,
        libc::SYS_sendto,
        libc::SYS_recvmsg,
        libc::SYS_sendmsg,
        libc::SYS_shutdown,
        libc::SYS_getsockopt,
        // snapshots: state/memory files written through a rename, a new disk top layer,
        // the fork's memfd and its /proc link; the control socket removed on exit
        libc::SYS_openat,
        libc::SYS_rename,
        libc::SYS_renameat,
        libc::SYS_renameat2,
        libc::SYS_unlink,
        libc::SYS_unlinkat,
        libc::SYS_symlink,
        libc::SYS_symlinkat,
        libc::SYS_memfd_create,
        // memory: the allocator, guest memory mappings
        libc::SYS_mmap,
        libc::SYS_munmap,
        libc::SYS_mremap,
        libc::SYS_mprotect,
        libc::SYS_madvise,
        libc::SYS_brk,
        // threads: locks, channels, kicking (SIGRTMIN) and joining the vCPU threads
        libc::SYS_futex,
        libc::SYS_sched_yield,
        libc::SYS_tgkill,
        libc::SYS_getpid,
        libc::SYS_gettid,
        libc::SYS_clock_gettime,
        libc::SYS_rt_sigprocmask,
        libc::SYS_rt_sigreturn,
        libc::SYS_sigaltstack,
        libc::SYS_restart_syscall,
        libc::SYS_getrandom,
        libc::SYS_exit,
        libc::SYS_exit_group,
    ],
    ioctls: &[
        // snapshot save, VM-wide state (kvm::vm::save_state, snapshot::save)
        (0xc208_ae62, "KVM_GET_IRQCHIP"),
        (0x8070_ae9f, "KVM_GET_PIT2"),
        (0x8030_ae7c, "KVM_GET_CLOCK"),
        (0xc004_ae02, "KVM_GET_MSR_INDEX_LIST"),
        (0xae03, "KVM_CHECK_EXTENSION"),
        // virtio-net activation: the offloads the guest acked
        (0x4004_54d0, "TUNSETOFFLOAD"),
        // std sets sockets non-blocking with it
        (0x5421, "FIONBIO"),
    ],
    arg_equals: &[(libc::SYS_socket, 0, libc::AF_UNIX as u64)],
};
