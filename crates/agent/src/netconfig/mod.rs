//! The guest's network interface in a microVM: address, netmask, MTU, link up, default
//! route and resolver, from the kernel parameter
//! `sandcell.net=ip=ADDR/PREFIX,gw=GATEWAY[,mtu=N][,dns=ADDR][,if=NAME]` that the microvm
//! runtime puts on the command line (gVisor configures its interface itself and passes
//! no such parameter). Done with the classic SIOCSIF* / SIOCADDRT ioctls: the agent is a
//! static binary in images that may have no `ip`.
//!
//! The same parameters come again in `/init`'s `sandcellNet` when a snapshot is restored as
//! another sandbox (whose network has other addresses): [`configure`] then readdresses the
//! interface. It is written for both: it first removes whatever default route exists.
//!
//! IPv4 only. The interface defaults to the first one in /sys/class/net that is not `lo`
//! (the virtio-net device is the only other one a Sandcell guest has). The parameters'
//! format is [`NetParams`], in `sandcell-proto` (the runtime writes what the agent reads).

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use sandcell_proto::agent::net::NetParams;

/// Where the resolver goes when `dns=` is given.
pub const RESOLV_CONF: &str = "/etc/resolv.conf";

/// The interface to configure: the asked one, or the first non-loopback one.
fn pick_interface(asked: Option<&str>) -> io::Result<String> {
    if let Some(name) = asked {
        return Ok(name.to_owned());
    }
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "lo")
        .collect();
    names.sort();
    names
        .into_iter()
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no network interface but lo"))
}

/// Applies `p` (see [`configure_with`]), the resolver in /etc/resolv.conf.
pub fn configure(p: &NetParams) -> io::Result<String> {
    configure_with(p, Path::new(RESOLV_CONF))
}

/// Applies `p`: every default route removed, address, netmask, MTU, up, the default route
/// via `p.gateway`, then `resolv_conf` when `p.dns` is set. Returns the interface
/// configured.
///
/// At boot there is no default route yet. On a readdressed interface SIOCSIFADDR replaces
/// the old address (the kernel deletes it, and with it the routes through the interface,
/// then adds the new one); but an unchanged address with another gateway flushes nothing,
/// hence the explicit removal first. Applying the same `p` again ends in the same state: an
/// unchanged address or netmask is a no-op for the kernel, and the default route is removed
/// and added back (no default route for the microseconds between).
pub fn configure_with(p: &NetParams, resolv_conf: &Path) -> io::Result<String> {
    let name = pick_interface(p.interface.as_deref())?;
    let sock = inet_socket()?;
    let step = |what: &str, r: io::Result<()>| {
        r.map_err(|e| io::Error::new(e.kind(), format!("{what} on {name}: {e}")))
    };
    step(
        "SIOCDELRT of the old default routes",
        remove_default_routes(&sock),
    )?;
    step(
        "SIOCSIFADDR",
        set_addr(&sock, &name, libc::SIOCSIFADDR, p.addr),
    )?;
    step(
        "SIOCSIFNETMASK",
        set_addr(&sock, &name, libc::SIOCSIFNETMASK, p.netmask()),
    )?;
    if let Some(mtu) = p.mtu {
        step("SIOCSIFMTU", set_mtu(&sock, &name, mtu))?;
    }
    step("bringing the link up", link_up(&sock, &name))?;
    // Last: the gateway is reachable only once the address and link are in place.
    step("SIOCADDRT default route", default_route(&sock, p.gateway))?;
    if let Some(dns) = p.dns {
        std::fs::write(resolv_conf, format!("nameserver {dns}\n")).map_err(|e| {
            io::Error::new(e.kind(), format!("writing {}: {e}", resolv_conf.display()))
        })?;
    }
    Ok(name)
}

fn inet_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call; the result is checked.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor we just created and own.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain old data; all-zero is valid (empty name, zero union).
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    // The name was checked (or came from sysfs); at most IFNAMSIZ-1 bytes are copied so
    // the name stays NUL-terminated.
    for (dst, src) in ifr
        .ifr_name
        .iter_mut()
        .zip(name.as_bytes().iter().take(libc::IFNAMSIZ - 1))
    {
        *dst = *src as libc::c_char;
    }
    ifr
}

fn sockaddr_in(addr: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(addr).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr are both 16 bytes; the kernel reads the bytes as
    // a sockaddr_in because sa_family says AF_INET.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

fn ioctl(sock: &OwnedFd, request: libc::c_ulong, arg: *mut libc::c_void) -> io::Result<()> {
    // SAFETY: callers pass a pointer to a live structure of the type `request` expects.
    if unsafe { libc::ioctl(sock.as_raw_fd(), request, arg) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_addr(sock: &OwnedFd, name: &str, request: libc::c_ulong, addr: Ipv4Addr) -> io::Result<()> {
    let mut ifr = ifreq(name);
    ifr.ifr_ifru.ifru_addr = sockaddr_in(addr);
    ioctl(sock, request, (&mut ifr as *mut libc::ifreq).cast())
}

fn set_mtu(sock: &OwnedFd, name: &str, mtu: u32) -> io::Result<()> {
    let mut ifr = ifreq(name);
    ifr.ifr_ifru.ifru_mtu = mtu as libc::c_int;
    ioctl(
        sock,
        libc::SIOCSIFMTU,
        (&mut ifr as *mut libc::ifreq).cast(),
    )
}

fn link_up(sock: &OwnedFd, name: &str) -> io::Result<()> {
    let mut ifr = ifreq(name);
    ioctl(
        sock,
        libc::SIOCGIFFLAGS,
        (&mut ifr as *mut libc::ifreq).cast(),
    )?;
    // SAFETY: SIOCGIFFLAGS succeeded, so ifru_flags is the union member the kernel wrote.
    unsafe { ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
    ioctl(
        sock,
        libc::SIOCSIFFLAGS,
        (&mut ifr as *mut libc::ifreq).cast(),
    )
}

/// `struct rtentry` of <linux/route.h> (the libc crate has it for musl only).
#[repr(C)]
struct RtEntry {
    rt_pad1: libc::c_ulong,
    rt_dst: libc::sockaddr,
    rt_gateway: libc::sockaddr,
    rt_genmask: libc::sockaddr,
    rt_flags: libc::c_ushort,
    rt_pad2: libc::c_short,
    rt_pad3: libc::c_ulong,
    rt_pad4: *mut libc::c_void,
    rt_metric: libc::c_short,
    rt_dev: *mut libc::c_char,
    rt_mtu: libc::c_ulong,
    rt_window: libc::c_ulong,
    rt_irtt: libc::c_ushort,
}

const RTF_UP: libc::c_ushort = 0x0001;
const RTF_GATEWAY: libc::c_ushort = 0x0002;

/// A route to 0.0.0.0/0 (main table, no device named: the kernel picks it from the gateway).
fn default_rtentry(gateway: Ipv4Addr, flags: libc::c_ushort) -> RtEntry {
    RtEntry {
        rt_pad1: 0,
        rt_dst: sockaddr_in(Ipv4Addr::UNSPECIFIED),
        rt_gateway: sockaddr_in(gateway),
        rt_genmask: sockaddr_in(Ipv4Addr::UNSPECIFIED),
        rt_flags: flags,
        rt_pad2: 0,
        rt_pad3: 0,
        rt_pad4: std::ptr::null_mut(),
        rt_metric: 0,
        rt_dev: std::ptr::null_mut(),
        rt_mtu: 0,
        rt_window: 0,
        rt_irtt: 0,
    }
}

/// More default routes than a guest could have: the bound on [`remove_default_routes`].
const MAX_DEFAULT_ROUTES: usize = 16;

/// Removes every default route, whatever its gateway. SIOCDELRT of 0.0.0.0/0 without a
/// gateway matches any gateway and deletes one route a call; ESRCH says none is left.
fn remove_default_routes(sock: &OwnedFd) -> io::Result<()> {
    for _ in 0..MAX_DEFAULT_ROUTES {
        let mut rt = default_rtentry(Ipv4Addr::UNSPECIFIED, RTF_UP);
        match ioctl(sock, libc::SIOCDELRT, (&mut rt as *mut RtEntry).cast()) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other(format!(
        "still a default route after removing {MAX_DEFAULT_ROUTES}"
    )))
}

fn default_route(sock: &OwnedFd, gateway: Ipv4Addr) -> io::Result<()> {
    let mut rt = default_rtentry(gateway, RTF_UP | RTF_GATEWAY);
    match ioctl(sock, libc::SIOCADDRT, (&mut rt as *mut RtEntry).cast()) {
        // Already there (an init that ran before, or a restored guest): fine.
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
        r => r,
    }
}

#[cfg(test)]
mod tap_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rtentry_has_the_kernel_layout() {
        // x86_64 <linux/route.h>: 120 bytes, rt_flags at 56, rt_dev at 88.
        assert_eq!(std::mem::size_of::<RtEntry>(), 120);
        assert_eq!(std::mem::offset_of!(RtEntry, rt_dev), 88);
        assert_eq!(std::mem::offset_of!(RtEntry, rt_flags), 56);
    }
}
