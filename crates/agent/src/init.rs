//! PID 1 duties: the mounts every image expects, loopback up, hostname. Each step that fails is
//! logged to the console and skipped: a sandbox with a missing /run is better than no sandbox.
//! What is already mounted (gVisor provides /proc, /dev, ... from its OCI spec) is left alone.

use std::collections::HashSet;
use std::ffi::CString;
use std::io;
use std::path::Path;

use crate::log;

/// Settings read from the kernel command line (`sandcell.listen=`, `sandcell.hostname=`,
/// `sandcell.net=`: see [`crate::netconfig`]).
/// Dotted parameters are not passed to init as arguments, so the agent reads /proc/cmdline.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelArgs {
    pub listen: Option<String>,
    pub hostname: Option<String>,
    /// The raw value of `sandcell.net=` (parsed when applied, so that a bad value is
    /// logged rather than silently ignored).
    pub net: Option<String>,
    /// `sandcell.fs=TAG:PATH,...`: the virtio-fs shares (volumes) to mount at boot.
    pub fs: Vec<(String, String)>,
}

impl KernelArgs {
    pub fn parse(cmdline: &str) -> Self {
        let mut args = KernelArgs::default();
        for word in cmdline.split_ascii_whitespace() {
            if let Some(v) = word.strip_prefix("sandcell.listen=") {
                args.listen = Some(v.to_owned());
            } else if let Some(v) = word.strip_prefix("sandcell.hostname=") {
                args.hostname = Some(v.to_owned());
            } else if let Some(v) = word.strip_prefix("sandcell.net=") {
                args.net = Some(v.to_owned());
            } else if let Some(v) = word.strip_prefix("sandcell.fs=") {
                args.fs = v
                    .split(',')
                    .filter_map(|pair| pair.split_once(':'))
                    .map(|(tag, path)| (tag.to_owned(), path.to_owned()))
                    .collect();
            }
        }
        args
    }

    pub fn read() -> Self {
        std::fs::read_to_string("/proc/cmdline")
            .map(|s| KernelArgs::parse(&s))
            .unwrap_or_default()
    }
}

struct Mount {
    target: &'static str,
    fstype: &'static str,
    flags: libc::c_ulong,
    data: &'static str,
}

const MOUNTS: &[Mount] = &[
    Mount {
        target: "/proc",
        fstype: "proc",
        flags: libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        data: "",
    },
    Mount {
        target: "/sys",
        fstype: "sysfs",
        flags: libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        data: "",
    },
    Mount {
        target: "/dev",
        fstype: "devtmpfs",
        flags: libc::MS_NOSUID,
        data: "mode=0755",
    },
    Mount {
        target: "/dev/pts",
        fstype: "devpts",
        flags: libc::MS_NOSUID | libc::MS_NOEXEC,
        data: "newinstance,ptmxmode=0666,mode=0620,gid=5",
    },
    Mount {
        target: "/dev/shm",
        fstype: "tmpfs",
        flags: libc::MS_NOSUID | libc::MS_NODEV,
        data: "mode=1777",
    },
    Mount {
        target: "/tmp",
        fstype: "tmpfs",
        flags: libc::MS_NOSUID | libc::MS_NODEV,
        data: "mode=1777",
    },
    Mount {
        target: "/run",
        fstype: "tmpfs",
        flags: libc::MS_NOSUID | libc::MS_NODEV,
        data: "mode=0755",
    },
];

/// /dev entries devtmpfs does not create but programs expect (bash's `<(...)` needs /dev/fd).
const DEV_LINKS: &[(&str, &str)] = &[
    ("/proc/self/fd", "/dev/fd"),
    ("/proc/self/fd/0", "/dev/stdin"),
    ("/proc/self/fd/1", "/dev/stdout"),
    ("/proc/self/fd/2", "/dev/stderr"),
    ("pts/ptmx", "/dev/ptmx"),
];

/// Mount points listed in /proc/self/mountinfo (empty if /proc is not mounted yet).
fn mounted() -> HashSet<String> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return HashSet::new();
    };
    info.lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape_mountinfo)
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

fn mount(m: &Mount) -> io::Result<()> {
    if let Err(e) = std::fs::create_dir_all(m.target) {
        // A read-only root may already have the directory; mount(2) will tell.
        log!("creating {}: {e}", m.target);
    }
    let cstr = |s: &str| CString::new(s).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput));
    let (source, target, fstype, data) = (
        cstr(m.fstype)?,
        cstr(m.target)?,
        cstr(m.fstype)?,
        cstr(m.data)?,
    );
    // SAFETY: all pointers are NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            m.flags,
            data.as_ptr().cast(),
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Mounts what is not mounted yet. /proc goes first: it tells us what else already is.
pub fn mount_all() {
    for (i, m) in MOUNTS.iter().enumerate() {
        // Re-read after /proc is in place; before it, only /proc itself is checked (by /proc/self).
        let already = if i == 0 {
            Path::new("/proc/self").exists()
        } else {
            mounted().contains(m.target)
        };
        if already {
            continue;
        }
        if let Err(e) = mount(m) {
            log!("mounting {} on {}: {e}", m.fstype, m.target);
        }
    }
    for (target, link) in DEV_LINKS {
        if let Err(e) = std::os::unix::fs::symlink(target, link)
            && e.kind() != io::ErrorKind::AlreadyExists
        {
            log!("linking {link} -> {target}: {e}");
        }
    }
}

/// Mounts the virtio-fs share `tag` at `path` (made first if missing): a volume on the
/// microvm runtime.
pub fn mount_shared(tag: &str, path: &str) -> io::Result<()> {
    if !path.starts_with('/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not an absolute path",
        ));
    }
    std::fs::create_dir_all(path)?;
    let c = |s: &str| CString::new(s).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e));
    let (source, target, fstype) = (c(tag)?, c(path)?, c("virtiofs")?);
    // SAFETY: NUL-terminated strings that live across the call; no data argument.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            std::ptr::null(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Brings `lo` up (SIOCGIFFLAGS, then SIOCSIFFLAGS with IFF_UP).
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: plain socket(2) call; the result is checked.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor we just created and own.
    let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
    let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
    // SAFETY: ifreq is plain old data; all-zero is valid (empty name, zero flags).
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the name and writes the flags of the ifreq we own.
    if unsafe { libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut ifr) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFFLAGS succeeded, so ifru_flags is the union member the kernel wrote.
    unsafe { ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
    // SAFETY: SIOCSIFFLAGS reads the ifreq we own.
    if unsafe { libc::ioctl(fd, libc::SIOCSIFFLAGS, &ifr) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub fn set_hostname(name: &str) -> io::Result<()> {
    // SAFETY: a pointer and length of a live byte slice.
    if unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The hostname the kernel starts with, before anyone sets one.
fn hostname_unset() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| matches!(h.trim(), "" | "(none)"))
        .unwrap_or(true)
}

/// Everything PID 1 does before serving. `mounts: false` for sandboxes that provide them.
/// Returns the kernel's parameters (readable once /proc is mounted).
pub fn become_init(mounts: bool, hostname: Option<&str>) -> KernelArgs {
    if mounts {
        mount_all();
    }
    let kernel = KernelArgs::read();
    let hostname = hostname.or(kernel.hostname.as_deref());
    if let Err(e) = loopback_up() {
        log!("bringing lo up: {e}");
    }
    if let Some(net) = &kernel.net {
        match sandcell_proto::agent::net::NetParams::parse(net) {
            Ok(p) => match crate::netconfig::configure(&p) {
                Ok(name) => log!("network: {name} {}/{} via {}", p.addr, p.prefix, p.gateway),
                Err(e) => log!("configuring the network ({net}): {e}"),
            },
            Err(e) => log!("sandcell.net={net}: {e}"),
        }
    }
    for (tag, path) in &kernel.fs {
        match mount_shared(tag, path) {
            Ok(()) => log!("volume {tag} mounted at {path}"),
            Err(e) => log!("mounting volume {tag} at {path}: {e}"),
        }
    }
    // An explicit name always wins; otherwise only a kernel-default name is replaced (gVisor
    // sets the one from its OCI spec).
    let name = match hostname {
        Some(n) => Some(n),
        None if hostname_unset() => Some("sandcell"),
        None => None,
    };
    if let Some(name) = name
        && let Err(e) = set_hostname(name)
    {
        log!("setting the hostname to {name}: {e}");
    }
    kernel
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_our_kernel_parameters() {
        let args = KernelArgs::parse(
            "console=ttyS0 sandcell.listen=vsock:1234 quiet sandcell.hostname=box-1\n",
        );
        assert_eq!(args.listen.as_deref(), Some("vsock:1234"));
        assert_eq!(args.hostname.as_deref(), Some("box-1"));
        let fs = KernelArgs::parse("quiet sandcell.fs=vol0:/data,vol1:/mnt/x,junk");
        assert_eq!(
            fs.fs,
            vec![
                ("vol0".into(), "/data".into()),
                ("vol1".into(), "/mnt/x".into())
            ]
        );
        let args = KernelArgs::parse("quiet sandcell.net=ip=10.0.0.2/30,gw=10.0.0.1");
        assert_eq!(args.net.as_deref(), Some("ip=10.0.0.2/30,gw=10.0.0.1"));
        assert_eq!(KernelArgs::parse("console=ttyS0"), KernelArgs::default());
    }

    #[test]
    fn unescapes_mount_points() {
        assert_eq!(unescape_mountinfo("/mnt/a\\040b"), "/mnt/a b");
    }
}
