//! The agent's interface configuration (what `sandcell.net=` does at boot and `/init`'s
//! `sandcellNet` does after a restore) on a real interface: a TAP in a network namespace
//! of its own (the test's thread only, so the host's network is never touched). Needs root
//! (CAP_NET_ADMIN, /dev/net/tun) and fails loudly without it.

use std::fs::{File, OpenOptions};
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::path::Path;

use sandcell_proto::agent::net::NetParams;

use super::configure_with;

const TAP: &str = "sctest0";

/// A default or connected route of /proc/thread-self/net/route.
#[derive(Debug, PartialEq, Eq)]
struct Route {
    iface: String,
    dst: Ipv4Addr,
    gateway: Ipv4Addr,
    mask: Ipv4Addr,
}

/// The kernel prints each address as the hex of its in-memory (network order) u32.
fn hex_addr(hex: &str) -> Ipv4Addr {
    let v = u32::from_str_radix(hex, 16).expect("a hex address in /proc/net/route");
    Ipv4Addr::from(v.to_ne_bytes())
}

fn routes() -> Vec<Route> {
    let text = std::fs::read_to_string("/proc/thread-self/net/route").expect("reading routes");
    text.lines()
        .skip(1)
        .map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            Route {
                iface: f[0].to_owned(),
                dst: hex_addr(f[1]),
                gateway: hex_addr(f[2]),
                mask: hex_addr(f[7]),
            }
        })
        .collect()
}

/// The addresses this namespace owns (fib_trie's `/32 host LOCAL` entries).
fn local_addresses() -> Vec<Ipv4Addr> {
    let text = std::fs::read_to_string("/proc/thread-self/net/fib_trie").expect("fib_trie");
    let lines: Vec<&str> = text.lines().collect();
    let mut found: Vec<Ipv4Addr> = lines
        .windows(2)
        .filter(|w| w[1].trim() == "/32 host LOCAL")
        .filter_map(|w| w[0].trim().trim_start_matches("|--").trim().parse().ok())
        .filter(|a: &Ipv4Addr| !a.is_loopback())
        .collect();
    found.sort();
    found.dedup();
    found
}

fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain old data; all-zero is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(name.as_bytes()) {
        *dst = *src as libc::c_char;
    }
    ifr
}

/// A TAP named [`TAP`]; it has carrier while the returned file is open.
fn open_tap() -> File {
    let tun = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .expect("opening /dev/net/tun");
    let mut ifr = ifreq(TAP);
    ifr.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF reads (and writes back the name of) the ifreq we own.
    let rc = unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETIFF, &mut ifr) };
    assert!(
        rc >= 0,
        "TUNSETIFF {TAP}: {}",
        std::io::Error::last_os_error()
    );
    tun
}

fn mtu() -> i32 {
    // SAFETY: plain socket(2); checked below and closed at the end.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
    let mut ifr = ifreq(TAP);
    // SAFETY: SIOCGIFMTU writes the MTU into the ifreq we own.
    let rc = unsafe { libc::ioctl(fd, libc::SIOCGIFMTU, &mut ifr) };
    let err = std::io::Error::last_os_error();
    // SAFETY: `fd` is ours and closed once.
    unsafe { libc::close(fd) };
    assert!(rc >= 0, "SIOCGIFMTU {TAP}: {err}");
    // SAFETY: SIOCGIFMTU succeeded: ifru_mtu is the member the kernel wrote.
    unsafe { ifr.ifr_ifru.ifru_mtu }
}

fn net(value: &str) -> NetParams {
    NetParams::parse(&format!("{value},if={TAP}")).expect("valid parameters")
}

fn default_gateways() -> Vec<Ipv4Addr> {
    routes()
        .iter()
        .filter(|r| r.dst == Ipv4Addr::UNSPECIFIED && r.mask == Ipv4Addr::UNSPECIFIED)
        .map(|r| r.gateway)
        .collect()
}

fn readdress_in_a_private_namespace(resolv: &Path) {
    // SAFETY: unshare(CLONE_NEWNET) moves this thread alone into a new network namespace.
    let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    assert!(
        rc == 0,
        "unshare(CLONE_NEWNET): {}",
        std::io::Error::last_os_error()
    );
    let _tap = open_tap();

    // Boot: as sandcell.net= configures it.
    let boot = net("ip=10.0.0.2/24,gw=10.0.0.1,mtu=1400,dns=10.0.0.1");
    assert_eq!(
        configure_with(&boot, resolv).expect("boot configuration"),
        TAP
    );
    assert_eq!(local_addresses(), [Ipv4Addr::new(10, 0, 0, 2)]);
    assert_eq!(default_gateways(), [Ipv4Addr::new(10, 0, 0, 1)]);
    assert_eq!(mtu(), 1400);
    assert_eq!(
        std::fs::read_to_string(resolv).ok().as_deref(),
        Some("nameserver 10.0.0.1\n")
    );

    // Restored as another sandbox: a new address, prefix, gateway, resolver; twice (the
    // host may send the same /init again).
    let moved = net("ip=10.1.0.2/16,gw=10.1.0.1,mtu=1500,dns=10.1.0.1");
    for round in 1..=2 {
        assert_eq!(configure_with(&moved, resolv).expect("readdress"), TAP);
        assert_eq!(
            local_addresses(),
            [Ipv4Addr::new(10, 1, 0, 2)],
            "round {round}"
        );
        assert_eq!(
            default_gateways(),
            [Ipv4Addr::new(10, 1, 0, 1)],
            "round {round}"
        );
        let connected: Vec<(Ipv4Addr, Ipv4Addr)> = routes()
            .iter()
            .filter(|r| r.gateway == Ipv4Addr::UNSPECIFIED && r.iface == TAP)
            .map(|r| (r.dst, r.mask))
            .collect();
        assert_eq!(
            connected,
            [(Ipv4Addr::new(10, 1, 0, 0), Ipv4Addr::new(255, 255, 0, 0))],
            "round {round}: only the new subnet is connected"
        );
        assert_eq!(mtu(), 1500);
        assert_eq!(
            std::fs::read_to_string(resolv).ok().as_deref(),
            Some("nameserver 10.1.0.1\n")
        );
    }

    // The same address with another gateway (the kernel flushes no route here: the old
    // default route must be removed by hand); without dns= the resolver stays.
    let regateway = net("ip=10.1.0.2/16,gw=10.1.0.254");
    assert_eq!(
        configure_with(&regateway, resolv).expect("new gateway"),
        TAP
    );
    assert_eq!(default_gateways(), [Ipv4Addr::new(10, 1, 0, 254)]);
    assert_eq!(local_addresses(), [Ipv4Addr::new(10, 1, 0, 2)]);
    assert_eq!(
        std::fs::read_to_string(resolv).ok().as_deref(),
        Some("nameserver 10.1.0.1\n")
    );
}

#[test]
fn an_interface_is_readdressed_and_its_default_route_replaced() {
    // SAFETY: geteuid cannot fail and touches no memory.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test makes a network namespace and a TAP: run it as root"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let resolv = dir.path().join("resolv.conf");
    std::thread::spawn(move || readdress_in_a_private_namespace(&resolv))
        .join()
        .expect("the readdress checks passed");
}
