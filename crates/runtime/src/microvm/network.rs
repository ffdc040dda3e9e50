//! Networking of a microVM sandbox (opt-in: [`crate::SandboxSpec::network`]).
//!
//! The host side is the same as a gVisor sandbox's: `sandcell-net` builds the namespace
//! `sc-<id>` with a veth to the host, the egress policy (nftables on the host end) and our
//! DNS server on the gateway. Inside that namespace this module adds a TAP, [`TAP_NAME`],
//! and joins it to the veth end with two `tc` mirred redirects (every frame in on one goes
//! out of the other), so the guest's own kernel sits where gVisor's netstack would: it
//! gets the sandbox address, the gateway is its default route, and every packet still
//! crosses the host end where the policy is enforced. The veth end's address is removed
//! (the guest owns it now). `sandcell-vmm` is started inside the namespace and attaches
//! the TAP by name; the agent configures `eth0` from the `sandcell.net=` kernel parameter.

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};

use super::RT;
use crate::NetworkSpec;
use crate::{Error, Result};
use sandcell_net::{NetRegistry, Network, SandboxNet};

/// The TAP's name inside the sandbox's namespace (the same in every sandbox and clone:
/// each has its own namespace).
pub(super) const TAP_NAME: &str = "sctap0";
/// The guest's MTU: the veth's.
pub(super) const MTU: u32 = 1500;

fn net_error(what: String, e: sandcell_net::Error) -> Error {
    match e {
        sandcell_net::Error::Policy(p) => Error::InvalidSpec {
            runtime: RT,
            problem: p.to_string(),
        },
        other => Error::io(RT, what, std::io::Error::other(other)),
    }
}

/// The sandbox's network with the TAP in it. On failure nothing is left behind.
pub(super) async fn create(nets: &NetRegistry, id: &str, spec: &NetworkSpec) -> Result<SandboxNet> {
    let net = nets
        .attach(&spec.config, id, &spec.egress)
        .await
        .map_err(|e| net_error(format!("creating the network of sandbox {id}"), e))?;
    if let Err(e) = add_tap(net.network()).await {
        let _ = teardown(id, net).await;
        return Err(e);
    }
    Ok(net)
}

pub(super) async fn teardown(id: &str, net: SandboxNet) -> Result<()> {
    net.teardown()
        .await
        .map_err(|e| net_error(format!("removing the network of sandbox {id}"), e))
}

/// The commands that put the TAP between the guest and the veth end, in order: the TAP
/// up before the redirects point at it; the veth end's address removed last of the setup
/// (from then on only the guest answers for it).
pub(super) fn tap_commands(net: &Network) -> Vec<(&'static str, Vec<String>)> {
    let ns = net.netns.as_str();
    let veth = net.guest_if.as_str();
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut cmds = vec![
        (
            "ip",
            s(&["-n", ns, "tuntap", "add", "dev", TAP_NAME, "mode", "tap"]),
        ),
        (
            "ip",
            s(&[
                "-n",
                ns,
                "link",
                "set",
                TAP_NAME,
                "mtu",
                &MTU.to_string(),
                "up",
            ]),
        ),
    ];
    for (from, to) in [(veth, TAP_NAME), (TAP_NAME, veth)] {
        cmds.push(("tc", s(&["-n", ns, "qdisc", "add", "dev", from, "ingress"])));
        cmds.push((
            "tc",
            s(&[
                "-n", ns, "filter", "add", "dev", from, "parent", "ffff:", "protocol", "all",
                "u32", "match", "u8", "0", "0", "action", "mirred", "egress", "redirect", "dev",
                to,
            ]),
        ));
    }
    cmds.push(("ip", s(&["-n", ns, "addr", "flush", "dev", veth])));
    cmds
}

async fn add_tap(net: &Network) -> Result<()> {
    for (program, args) in tap_commands(net) {
        let out = tokio::process::Command::new(program)
            .args(&args)
            .output()
            .await
            .map_err(|e| Error::io(RT, format!("running {program}"), e))?;
        if !out.status.success() {
            return Err(Error::io(
                RT,
                format!("{program} {}", args.join(" ")),
                std::io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string()),
            ));
        }
    }
    Ok(())
}

/// The kernel parameter the agent configures `eth0` from (crates/agent netconfig.rs).
pub(super) fn kernel_param(net: &Network) -> String {
    format!("sandcell.net={}", init_value(net))
}

/// The same as the agent's `/init` `sandcellNet`: how a restored guest is readdressed.
pub(super) fn init_value(net: &Network) -> String {
    format!(
        "ip={}/{},gw={},mtu={MTU},dns={}",
        net.guest, net.prefix, net.gateway, net.gateway
    )
}

/// A locally administered unicast MAC made from the guest's address (unique per host pool
/// slot, stable across restores of the same sandbox).
pub(super) fn guest_mac(guest: Ipv4Addr) -> String {
    let [a, b, c, d] = guest.octets();
    format!("02:5c:{a:02x}:{b:02x}:{c:02x}:{d:02x}")
}

/// Opens the sandbox's namespace for [`join_netns`].
pub(super) fn open_netns(net: &Network) -> Result<std::fs::File> {
    let path = net.netns_path();
    std::fs::File::open(&path).map_err(|e| {
        Error::io(
            RT,
            format!("opening network namespace {}", path.display()),
            e,
        )
    })
}

/// The sandbox's TAP, attached from the daemon for a VMM started outside the namespace (a
/// pooled one, given it with its restore request: [`send_with_tap`]). The flags are the
/// VMM's own (`IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`); the VMM checks them. In a thread of
/// its own: `setns` changes the calling thread's namespace for good.
pub(super) async fn open_tap(net: &Network) -> Result<OwnedFd> {
    let ns = open_netns(net)?;
    let what = format!("attaching {TAP_NAME} in network namespace {}", net.netns);
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("sc-tap-attach".into())
        .spawn(move || {
            let flags = libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR;
            let _ = tx.send(attach_tap_in(&ns, flags));
        })
        .map_err(|e| Error::io(RT, what.clone(), e))?;
    match rx.await {
        Ok(attached) => attached
            .map(OwnedFd::from)
            .map_err(|e| Error::io(RT, what, e)),
        Err(_) => Err(Error::io(
            RT,
            what,
            std::io::Error::other("the attaching thread ended without an answer"),
        )),
    }
}

/// Moves the calling thread into namespace `ns` and attaches [`TAP_NAME`] there with
/// `flags` (a blocking descriptor, close-on-exec). The caller's thread must be one of its
/// own, ending after: it stays in that namespace.
pub(super) fn attach_tap_in(
    ns: &std::fs::File,
    flags: libc::c_int,
) -> std::io::Result<std::fs::File> {
    // SAFETY: setns on a namespace descriptor we hold; it changes only this thread.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let tun = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")?;
    // SAFETY: ifreq is plain old data; all-zero is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(TAP_NAME.as_bytes()) {
        *d = *s as libc::c_char;
    }
    ifr.ifr_ifru.ifru_flags = flags as libc::c_short;
    // SAFETY: TUNSETIFF (_IOW('T', 202, int)) reads the ifreq we own.
    if unsafe { libc::ioctl(tun.as_raw_fd(), 0x4004_54ca, &mut ifr) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(tun)
}

/// Writes `line` on `stream` with `tap` as its `SCM_RIGHTS` descriptor (the VMM takes it
/// with the request those bytes start). Ours is closed once sent: the VMM holds the TAP.
pub(super) async fn send_with_tap(
    stream: &tokio::net::UnixStream,
    line: &[u8],
    tap: OwnedFd,
) -> std::io::Result<()> {
    let mut sent = 0;
    let mut tap = Some(tap);
    while sent < line.len() {
        stream.writable().await?;
        let rest = &line[sent..];
        let fd = tap.as_ref().map(AsRawFd::as_raw_fd);
        match stream.try_io(tokio::io::Interest::WRITABLE, || sendmsg(stream, rest, fd)) {
            Ok(n) => {
                sent += n;
                // The descriptor went with the first bytes that went.
                tap = None;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One `sendmsg` of `data`, with `fd` as an `SCM_RIGHTS` message when given.
fn sendmsg(
    stream: &tokio::net::UnixStream,
    data: &[u8],
    fd: Option<std::os::fd::RawFd>,
) -> std::io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // Room for one descriptor's SCM_RIGHTS message (u64s: cmsghdr alignment).
    let mut control = [0u64; 4];
    // SAFETY: msghdr is plain old data; all-zero is a valid (empty) value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        let len = std::mem::size_of::<libc::c_int>() as u32;
        msg.msg_control = control.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE/CMSG_LEN are arithmetic; CMSG_FIRSTHDR of a header whose
        // control buffer (32 bytes) holds CMSG_SPACE(4) = 24 bytes is non-null and in it,
        // and CMSG_DATA points at its 4-byte payload, also in it.
        unsafe {
            msg.msg_controllen = libc::CMSG_SPACE(len) as usize;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(len) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>(), fd);
        }
    }
    // SAFETY: msg points at our live iovec (over `data`) and control buffer; MSG_NOSIGNAL:
    // a VMM that went away is an error, not SIGPIPE.
    let n = unsafe { libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// The VMM starts inside the sandbox's namespace (it attaches the TAP by name there).
pub(super) fn join_netns(cmd: &mut tokio::process::Command, netns: &std::fs::File) {
    let fd = netns.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and makes one system call
    // (setns, async-signal-safe) on a descriptor the parent keeps open across the spawn.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn network() -> Network {
        Network {
            id: "sb1".into(),
            slot: 7,
            netns: "sc-sb1".into(),
            host_if: "sch7".into(),
            guest_if: "scg7".into(),
            gateway: Ipv4Addr::new(10, 200, 0, 29),
            guest: Ipv4Addr::new(10, 200, 0, 30),
            prefix: 30,
            pool: "10.200.0.0/16".parse().expect("cidr"),
        }
    }

    #[test]
    fn the_guest_gets_the_sandbox_address_and_the_gateway() {
        let n = network();
        assert_eq!(
            kernel_param(&n),
            "sandcell.net=ip=10.200.0.30/30,gw=10.200.0.29,mtu=1500,dns=10.200.0.29"
        );
        assert_eq!(guest_mac(n.guest), "02:5c:0a:c8:00:1e");
        // A restored guest is readdressed with the same value through /init, which the
        // agent parses as it parses the kernel parameter.
        let parsed = sandcell_proto::agent::net::NetParams::parse(&init_value(&n)).unwrap();
        assert_eq!(parsed.addr, n.guest);
        assert_eq!(parsed.prefix, 30);
        assert_eq!(parsed.gateway, n.gateway);
        assert_eq!(parsed.dns, Some(n.gateway));
    }

    #[test]
    fn the_tap_is_joined_to_the_veth_both_ways_inside_the_namespace() {
        let cmds = tap_commands(&network());
        let lines: Vec<String> = cmds
            .iter()
            .map(|(p, a)| format!("{p} {}", a.join(" ")))
            .collect();
        assert!(lines.iter().all(|l| l.contains(" -n sc-sb1 ")), "{lines:?}");
        assert_eq!(lines[0], "ip -n sc-sb1 tuntap add dev sctap0 mode tap");
        assert!(lines.iter().any(|l| l.ends_with(
            "dev scg7 parent ffff: protocol all u32 match u8 0 0 action mirred egress redirect dev sctap0"
        )));
        assert!(lines.iter().any(|l| l.ends_with(
            "dev sctap0 parent ffff: protocol all u32 match u8 0 0 action mirred egress redirect dev scg7"
        )));
        assert_eq!(
            lines.last().map(String::as_str),
            Some("ip -n sc-sb1 addr flush dev scg7")
        );
    }

    /// The real plumbing (sandcell-net's namespace, `ip tuntap`, the tc redirects) on this
    /// host: a frame written to the TAP, where the VMM's net device would write it, is an
    /// ARP request from the guest address; the host end's answer comes back on the TAP.
    /// Needs root and /dev/net/tun (and what sandcell-net needs: ip, tc, nft); fails loudly
    /// without them.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_guest_frame_on_the_tap_reaches_the_host_end_and_its_answer_comes_back() {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(euid, 0, "needs root (namespaces, TAPs)");
        assert!(
            std::path::Path::new("/dev/net/tun").exists(),
            "needs /dev/net/tun"
        );
        let _l = sandcell_net::testing::Internet::lock();
        let spec = test_spec();
        let id = crate::new_sandbox_id().expect("id");
        let net = create(&NetRegistry::new(), &id, &spec)
            .await
            .expect("network with a TAP");
        let n = net.network().clone();
        // A thread of its own: setns changes the calling thread's namespace for good.
        let answer = std::thread::spawn(move || arp_through_tap(&n))
            .join()
            .expect("the TAP thread panicked");
        teardown(&id, net).await.expect("teardown");
        let gateway_mac = answer.expect("ARP through the TAP");
        assert_ne!(gateway_mac, [0u8; 6]);
    }

    fn test_spec() -> NetworkSpec {
        NetworkSpec {
            egress: sandcell_net::EgressSpec {
                allow_internet_access: true,
                allow_out: vec![],
                deny_out: vec![],
                rules: Default::default(),
            },
            config: sandcell_net::NetConfig {
                pool: "10.203.0.0/16".parse().expect("cidr"),
                upstream_dns: vec![],
                allow_private: Default::default(),
            },
        }
    }

    /// The daemon's half of a pooled VMM's network: the TAP attached in the sandbox's
    /// namespace from here, sent with a request line. What arrives on the other end is the
    /// line and a descriptor of the sandbox's TAP, with the VMM's flags (the VMM's half is
    /// tested in sandcell-vmm: net::tests, control::tests). Needs root and /dev/net/tun.
    #[tokio::test(flavor = "multi_thread")]
    async fn the_sandboxs_tap_goes_with_the_request_line() {
        assert_eq!(
            // SAFETY: geteuid has no preconditions.
            unsafe { libc::geteuid() },
            0,
            "needs root (namespaces, TAPs)"
        );
        let _l = sandcell_net::testing::Internet::lock();
        let id = crate::new_sandbox_id().expect("id");
        let net = create(&NetRegistry::new(), &id, &test_spec())
            .await
            .expect("network with a TAP");
        let tap = open_tap(net.network()).await;
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("pair");
        ours.set_nonblocking(true).expect("nonblocking");
        let ours = tokio::net::UnixStream::from_std(ours).expect("tokio stream");
        let sent = match tap {
            Ok(tap) => send_with_tap(&ours, b"{\"op\":\"status\"}\n", tap).await,
            Err(e) => Err(std::io::Error::other(e.to_string())),
        };
        let received = recv_one_fd(&theirs);
        teardown(&id, net).await.expect("teardown");
        sent.expect("sent");
        let (line, fd) = received;
        assert_eq!(line, b"{\"op\":\"status\"}\n");
        let fd = fd.expect("a descriptor came with the line");
        // SAFETY: ifreq is plain old data; all-zero is valid.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        // SAFETY: TUNGETIFF (_IOR('T', 210, int)) fills the ifreq we own.
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), 0x8004_54d2, &mut ifr) };
        assert_eq!(rc, 0, "TUNGETIFF: {}", std::io::Error::last_os_error());
        let name: Vec<u8> = ifr
            .ifr_name
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| *c as u8)
            .collect();
        assert_eq!(name, TAP_NAME.as_bytes());
        // SAFETY: TUNGETIFF filled the flags member.
        let flags = i32::from(unsafe { ifr.ifr_ifru.ifru_flags });
        let want = libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR;
        assert_eq!(flags & want, want, "{flags:#x}");
    }

    /// One recvmsg: the bytes and the first descriptor that came with them.
    fn recv_one_fd(stream: &std::os::unix::net::UnixStream) -> (Vec<u8>, Option<OwnedFd>) {
        use std::os::fd::FromRawFd;
        let mut buf = [0u8; 256];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut control = [0u64; 8];
        // SAFETY: test code: a zeroed msghdr pointed at live buffers of the given sizes; the
        // descriptor read from the SCM_RIGHTS payload is ours to own.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = std::mem::size_of_val(&control);
            let n = libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
            assert!(n > 0, "recvmsg: {}", std::io::Error::last_os_error());
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            let fd = (!cmsg.is_null() && (*cmsg).cmsg_type == libc::SCM_RIGHTS).then(|| {
                OwnedFd::from_raw_fd(std::ptr::read_unaligned(
                    libc::CMSG_DATA(cmsg).cast::<libc::c_int>(),
                ))
            });
            (buf[..n as usize].to_vec(), fd)
        }
    }

    /// In the sandbox's namespace: attach the TAP, send "who has <gateway>, tell <guest>",
    /// read frames until the answer (bounded). Returns the gateway's MAC.
    fn arp_through_tap(n: &Network) -> std::result::Result<[u8; 6], String> {
        let ns = open_netns(n).map_err(|e| e.to_string())?;
        let tun = attach_tap_in(&ns, libc::IFF_TAP | libc::IFF_NO_PI)
            .map_err(|e| format!("attaching {TAP_NAME}: {e}"))?;
        let mac = [0x02, 0x5c, 0, 0, 0, 0x42];
        let mut f = Vec::with_capacity(42);
        f.extend([0xff; 6]);
        f.extend(mac);
        f.extend([0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
        f.extend(mac);
        f.extend(n.guest.octets());
        f.extend([0; 6]);
        f.extend(n.gateway.octets());
        use std::io::{Read, Write};
        let mut tun = tun;
        let mut buf = [0u8; 2048];
        for round in 0..50 {
            // Asked again now and then, as a guest's ARP would: the first request can
            // arrive while the host end is still coming up (seen here: no answer to it).
            if round % 5 == 0 {
                tun.write_all(&f)
                    .map_err(|e| format!("writing to the TAP: {e}"))?;
            }
            let mut pfd = libc::pollfd {
                fd: tun.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd we own; the timeout only bounds a broken setup.
            if unsafe { libc::poll(&mut pfd, 1, 200) } <= 0 {
                continue;
            }
            let len = tun
                .read(&mut buf)
                .map_err(|e| format!("reading the TAP: {e}"))?;
            let fr = &buf[..len];
            // ARP reply (op 2) from the gateway to our MAC.
            if len >= 42
                && fr[12..14] == [0x08, 0x06]
                && fr[20..22] == [0, 2]
                && fr[28..32] == n.gateway.octets()
                && fr[32..38] == mac
            {
                let mut sha = [0u8; 6];
                sha.copy_from_slice(&fr[22..28]);
                return Ok(sha);
            }
        }
        Err("no ARP answer from the gateway came back through the TAP".into())
    }
}
