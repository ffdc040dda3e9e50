//! Powering the sandbox off, as PID 1.
//!
//! Our guest kernel has no ACPI, so `reboot(RB_POWER_OFF)` alone would only halt the vCPUs;
//! the VMM learns of the power-off through a write to its paravirtual port
//! ([`sandcell_proto::vmm::POWER_PORT`]). Order matters: `sync` first, so the disk is
//! consistent before the VM may vanish mid-call; then the port; then `reboot` for VMMs
//! (or gVisor) that do not know our port; then exiting, which ends a gVisor sandbox.

use std::io;

use sandcell_proto::vmm::{POWER_OFF, POWER_PORT};

/// The inode of the initial PID namespace (the kernel's `PROC_PID_INIT_INO`).
const INITIAL_PID_NS: &str = "pid:[4026531836]";

pub fn power_off() -> ! {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    // Only the machine's own init may poke I/O ports: as PID 1 of a container (a PID namespace
    // on a host where we are root) the port would be the host's.
    if is_machine_init()
        && let Err(e) = write_power_port()
    {
        crate::log!("power port 0x{POWER_PORT:x}: {e}");
    }
    // SAFETY: reboot(2) with a valid command; on success it does not return.
    if unsafe { libc::reboot(libc::RB_POWER_OFF) } < 0 {
        crate::log!("reboot(RB_POWER_OFF): {}", io::Error::last_os_error());
    }
    std::process::exit(0)
}

/// PID 1 of the initial PID namespace. Without /proc, or a kernel without PID namespaces, we
/// cannot be inside a container's namespace (containers always have /proc): assume the machine.
fn is_machine_init() -> bool {
    std::process::id() == 1
        && match std::fs::read_link("/proc/self/ns/pid") {
            Ok(ns) => ns.as_os_str() == INITIAL_PID_NS,
            Err(_) => true,
        }
}

#[cfg(target_arch = "x86_64")]
fn write_power_port() -> io::Result<()> {
    // SAFETY: ioperm(2) only changes this process's I/O permission bitmap, for one port.
    if unsafe { libc::ioperm(libc::c_ulong::from(POWER_PORT), 1, 1) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: ioperm above granted access to exactly this port. The write touches no memory;
    // on our VMM it ends the VM, elsewhere the port is unassigned (or QEMU's fw_cfg selector,
    // which ignores a 1-byte write) and execution continues to the fallbacks.
    unsafe {
        std::arch::asm!("out dx, al", in("dx") POWER_PORT, in("al") POWER_OFF, options(nomem, nostack, preserves_flags));
    }
    Ok(())
}

#[cfg(not(target_arch = "x86_64"))]
fn write_power_port() -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "no port I/O on this architecture",
    ))
}
