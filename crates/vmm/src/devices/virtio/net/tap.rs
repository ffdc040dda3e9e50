//! The host side of virtio-net: a TAP interface opened from `/dev/net/tun` with
//! `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`, non-blocking, with a 12-byte vnet header (the
//! virtio 1.x `virtio_net_hdr_v1`). The interface itself (its addresses, its namespace)
//! is made by whoever starts the VMM; the VMM attaches to it by name, in its own network
//! namespace ([`Tap::open`]), or is given one already attached ([`Tap::from_fd`]: a VMM
//! started ahead of its sandbox is in no namespace of the sandbox's).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_GUEST_TSO6,
};

use super::VNET_HDR_LEN;

// <linux/if_tun.h>: _IOW('T', nr, int/unsigned int).
pub(super) const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
// _IOR('T', 210, unsigned int).
const TUNGETIFF: libc::c_ulong = 0x8004_54d2;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;
/// Offload flags for TUNSETOFFLOAD: what the kernel may hand us (our RX direction).
pub const TUN_F_CSUM: u32 = 0x01;
pub const TUN_F_TSO4: u32 = 0x02;
pub const TUN_F_TSO6: u32 = 0x04;

/// Where frames go to and come from. The device only needs message semantics (one read
/// = one frame, one write = one frame) on a non-blocking fd it can poll; [`Tap`] is the
/// real one, unit tests use a socketpair.
pub trait NetBackend: AsRawFd + Send {
    /// Read one frame (vnet header first) into `buf`; `WouldBlock` when there is none.
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// Write one frame (vnet header first).
    fn send(&mut self, frame: &[u8]) -> io::Result<usize>;
    /// TUNSETOFFLOAD: which offloaded frames (partial checksums, TSO) the host may send
    /// us, as `TUN_F_*` bits. Only what the guest driver acknowledged.
    fn set_offload(&mut self, flags: u32) -> io::Result<()>;
    /// The interface name (saved in snapshots; a restore reopens it).
    fn name(&self) -> &str;
}

#[derive(Debug, thiserror::Error)]
pub enum TapError {
    #[error("TAP name {0:?} is empty, too long (max 15 bytes) or has a NUL")]
    BadName(String),
    #[error("opening /dev/net/tun: {0}")]
    OpenTun(#[source] io::Error),
    #[error("the descriptor given as the TAP is not one (TUNGETIFF: {0})")]
    NotATap(#[source] io::Error),
    #[error(
        "the TAP {name} given is attached with flags {flags:#x}: it needs IFF_TAP, IFF_NO_PI \
         and IFF_VNET_HDR"
    )]
    Mode { name: String, flags: i32 },
    #[error("{ioctl} on the TAP {name}: {source}")]
    Ioctl {
        ioctl: &'static str,
        name: String,
        source: io::Error,
    },
}

/// A TAP interface attached by name.
#[derive(Debug)]
pub struct Tap {
    file: File,
    name: String,
}

impl Tap {
    /// Attach to the TAP `name` (created if it does not exist, which needs CAP_NET_ADMIN;
    /// a persistent TAP owned by our user needs nothing), non-blocking, vnet header on.
    pub fn open(name: &str) -> Result<Tap, TapError> {
        let mut ifr = ifreq_for(name)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(TapError::OpenTun)?;
        let flags = libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR;
        ifr.ifr_ifru.ifru_flags = flags as libc::c_short;
        // SAFETY: TUNSETIFF reads (and may write the final name into) the ifreq we own.
        if unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF, &mut ifr) } < 0 {
            return Err(TapError::Ioctl {
                ioctl: "TUNSETIFF",
                name: name.to_owned(),
                source: io::Error::last_os_error(),
            });
        }
        Tap::attached(file, name.to_owned())
    }

    /// A TAP another process attached (`TUNSETIFF` in the sandbox's network namespace) and
    /// passed to us. Checked to be a TAP with the flags [`Tap::open`] asks for (the kernel
    /// says which, and its name), then made non-blocking with the same header size and
    /// offloads.
    pub fn from_fd(fd: OwnedFd) -> Result<Tap, TapError> {
        let file = File::from(fd);
        // SAFETY: ifreq is plain old data; all-zero is a valid value.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        // SAFETY: TUNGETIFF writes the name and flags into the ifreq we own; on any other
        // kind of file it fails (ENOTTY, EBADFD) and writes nothing.
        if unsafe { libc::ioctl(file.as_raw_fd(), TUNGETIFF, &mut ifr) } < 0 {
            return Err(TapError::NotATap(io::Error::last_os_error()));
        }
        let name: Vec<u8> = ifr
            .ifr_name
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| *c as u8)
            .collect();
        let name = String::from_utf8_lossy(&name).into_owned();
        // SAFETY: TUNGETIFF filled the union's flags member.
        let flags = i32::from(unsafe { ifr.ifr_ifru.ifru_flags });
        let want = libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR;
        if flags & want != want {
            return Err(TapError::Mode { name, flags });
        }
        // SAFETY: F_GETFL/F_SETFL on our open file; no memory is passed.
        let nonblocking = unsafe {
            let fl = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
            fl >= 0 && libc::fcntl(file.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK) >= 0
        };
        if !nonblocking {
            return Err(TapError::Ioctl {
                ioctl: "fcntl(O_NONBLOCK)",
                name,
                source: io::Error::last_os_error(),
            });
        }
        Tap::attached(file, name)
    }

    /// The setup after the attach, the same for both ways in.
    fn attached(file: File, name: String) -> Result<Tap, TapError> {
        let tap = Tap { file, name };
        let ioctl_err = |ioctl, source| TapError::Ioctl {
            ioctl,
            name: tap.name.clone(),
            source,
        };
        // Ordering: the header size must be set before any frame moves, or the first
        // frames would carry the 10-byte legacy header and be misparsed on both sides.
        let hdr_len = VNET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads one int from the pointer, which is live.
        if unsafe { libc::ioctl(tap.file.as_raw_fd(), TUNSETVNETHDRSZ, &hdr_len) } < 0 {
            return Err(ioctl_err("TUNSETVNETHDRSZ", io::Error::last_os_error()));
        }
        // No offloads until the guest says it can take them (set at activation).
        if let Err(source) = tap.offload(0) {
            return Err(ioctl_err("TUNSETOFFLOAD", source));
        }
        Ok(tap)
    }

    fn offload(&self, flags: u32) -> io::Result<()> {
        // TUNSETOFFLOAD takes its argument by value.
        // SAFETY: no memory is passed; the fd is our open TAP.
        if unsafe { libc::ioctl(self.file.as_raw_fd(), TUNSETOFFLOAD, flags as libc::c_ulong) } < 0
        {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

fn ifreq_for(name: &str) -> Result<libc::ifreq, TapError> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(TapError::BadName(name.to_owned()));
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value (empty name, no flags).
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    Ok(ifr)
}

/// The `TUN_F_*` offloads that match the guest's acknowledged receive features.
pub fn offload_flags(acked_features: u64) -> u32 {
    let has = |bit: u32| acked_features & (1u64 << bit) != 0;
    if !has(VIRTIO_NET_F_GUEST_CSUM) {
        // TSO without checksum offload is meaningless (and refused by the kernel).
        return 0;
    }
    let mut flags = TUN_F_CSUM;
    if has(VIRTIO_NET_F_GUEST_TSO4) {
        flags |= TUN_F_TSO4;
    }
    if has(VIRTIO_NET_F_GUEST_TSO6) {
        flags |= TUN_F_TSO6;
    }
    flags
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

impl NetBackend for Tap {
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.file.read(buf)
    }

    fn send(&mut self, frame: &[u8]) -> io::Result<usize> {
        self.file.write(frame)
    }

    fn set_offload(&mut self, flags: u32) -> io::Result<()> {
        self.offload(flags)
    }

    fn name(&self) -> &str {
        &self.name
    }
}
