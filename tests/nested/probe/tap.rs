//! `nested-probe control --tap NAME`: the TAP attached here (in this process's network
//! namespace, with sandcell-vmm's flags) and sent with the request line as an `SCM_RIGHTS`
//! descriptor, as the runtime gives a pooled `--wait-restore` VMM its sandbox's network
//! (crates/runtime/src/microvm/network.rs `open_tap`, `send_with_tap`).
//!
//! std only (the probe is built with plain rustc): the few libc calls and structs needed are
//! declared here, for x86_64 Linux.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;

// <linux/if_tun.h>: TUNSETIFF = _IOW('T', 202, int); the flags sandcell-vmm's Tap uses.
const TUNSETIFF: u64 = 0x4004_54ca;
const IFF_TAP: i16 = 0x0002;
const IFF_NO_PI: i16 = 0x1000;
const IFF_VNET_HDR: i16 = 0x4000;
const SOL_SOCKET: i32 = 1;
const SCM_RIGHTS: i32 = 1;

/// `struct ifreq`: the name, then a 24-byte union whose first member we set (the flags).
#[repr(C)]
struct IfReq {
    name: [u8; 16],
    flags: i16,
    _rest: [u8; 22],
}

#[repr(C)]
struct IoVec {
    base: *const u8,
    len: usize,
}

/// `struct msghdr` (x86_64: repr(C) adds the same padding).
#[repr(C)]
struct MsgHdr {
    name: *mut u8,
    namelen: u32,
    iov: *const IoVec,
    iovlen: usize,
    control: *mut u8,
    controllen: usize,
    flags: i32,
}

/// One `cmsghdr` carrying one descriptor, padded to `CMSG_SPACE(4)` = 24 bytes.
#[repr(C)]
struct CmsgOneFd {
    len: usize,
    level: i32,
    kind: i32,
    fd: i32,
    _pad: i32,
}

unsafe extern "C" {
    fn ioctl(fd: i32, request: u64, ...) -> i32;
    fn sendmsg(fd: i32, msg: *const MsgHdr, flags: i32) -> isize;
}

/// Attaches the TAP `name` (it must exist, or we need CAP_NET_ADMIN to make it).
pub fn attach(name: &str) -> Result<File, String> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= 16 {
        return Err(format!("bad TAP name {name:?}"));
    }
    let tun = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .map_err(|e| format!("/dev/net/tun: {e}"))?;
    let mut ifr = IfReq {
        name: [0; 16],
        flags: IFF_TAP | IFF_NO_PI | IFF_VNET_HDR,
        _rest: [0; 22],
    };
    ifr.name[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: TUNSETIFF reads (and may write the name into) the ifreq we own, laid out as
    // the kernel's.
    if unsafe { ioctl(tun.as_raw_fd(), TUNSETIFF, &mut ifr as *mut IfReq) } < 0 {
        return Err(format!("TUNSETIFF {name}: {}", std::io::Error::last_os_error()));
    }
    Ok(tun)
}

/// Writes `data` on `stream`, `fd` going with its first bytes.
pub fn send_with_fd(stream: &mut UnixStream, data: &[u8], fd: RawFd) -> Result<(), String> {
    let iov = IoVec {
        base: data.as_ptr(),
        len: data.len(),
    };
    let mut cmsg = CmsgOneFd {
        len: 20, // CMSG_LEN(4): the 16-byte header and one int
        level: SOL_SOCKET,
        kind: SCM_RIGHTS,
        fd,
        _pad: 0,
    };
    let msg = MsgHdr {
        name: std::ptr::null_mut(),
        namelen: 0,
        iov: &iov,
        iovlen: 1,
        control: (&mut cmsg as *mut CmsgOneFd).cast(),
        controllen: std::mem::size_of::<CmsgOneFd>(),
        flags: 0,
    };
    // SAFETY: msg points at live, correctly laid out iovec and cmsghdr values.
    let n = unsafe { sendmsg(stream.as_raw_fd(), &msg, 0) };
    if n < 0 {
        return Err(format!("sendmsg: {}", std::io::Error::last_os_error()));
    }
    stream
        .write_all(&data[n as usize..])
        .map_err(|e| format!("write: {e}"))
}
