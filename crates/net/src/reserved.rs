//! Destinations that egress rules may never open, and those only the operator may open.
//!
//! Two layers use this, for the same reason: the host itself sits next to every sandbox.
//! - Rules entering the API (create, live update): an `allowOut` IP/CIDR inside
//!   [`NEVER`]/[`NEVER6`], the sandbox pool or the host's own addresses is refused with the
//!   reason; one inside [`PRIVATE`]/[`PRIVATE6`] only if the operator allowed that range
//!   (`sandcell serve --allow-private-egress`), see [`Destinations::check_spec`].
//! - Names: the Host/SNI proxy connects from the host's namespace, around the per-sandbox
//!   chains, and our DNS server hands out what upstream says. Both refuse answers in the
//!   same ranges ([`Destinations::refusal`]), whatever the rules, so a name pointing at
//!   127.0.0.1, the metadata address, another sandbox or the host reaches nothing.
//!
//! The kernel side (nft.rs) keeps refusing all reserved ranges unless an explicit entry lies
//! inside one, and never lets an entry open the pool (it is cut out of `allow_reserved`).

use crate::policy::{AllowEntry, Cidr, Cidr6, EgressSpec, PolicyError};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// IPv4 ranges no rule opens, with what they are.
pub const NEVER: &[(Ipv4Addr, u8, &str)] = &[
    (Ipv4Addr::new(0, 0, 0, 0), 8, "\"this network\" (0.0.0.0/8)"),
    (Ipv4Addr::new(127, 0, 0, 0), 8, "loopback (127.0.0.0/8)"),
    (
        Ipv4Addr::new(169, 254, 0, 0),
        16,
        "link-local (169.254.0.0/16, with the cloud metadata address 169.254.169.254)",
    ),
    (Ipv4Addr::new(224, 0, 0, 0), 4, "multicast (224.0.0.0/4)"),
    (
        Ipv4Addr::new(240, 0, 0, 0),
        4,
        "reserved and broadcast (240.0.0.0/4)",
    ),
];

/// IPv4 ranges only `--allow-private-egress` opens.
pub const PRIVATE: &[(Ipv4Addr, u8, &str)] = &[
    (Ipv4Addr::new(10, 0, 0, 0), 8, "private (10.0.0.0/8)"),
    (
        Ipv4Addr::new(100, 64, 0, 0),
        10,
        "carrier-grade NAT (100.64.0.0/10)",
    ),
    (Ipv4Addr::new(172, 16, 0, 0), 12, "private (172.16.0.0/12)"),
    (
        Ipv4Addr::new(192, 168, 0, 0),
        16,
        "private (192.168.0.0/16)",
    ),
];

/// The sandboxes' own IPv6 addresses (network.rs: `fd5c:5c5c:<slot>::/64`).
pub const POOL6: (Ipv6Addr, u8) = (Ipv6Addr::new(0xfd5c, 0x5c5c, 0, 0, 0, 0, 0, 0), 32);

/// IPv6 ranges no rule opens.
pub const NEVER6: &[(Ipv6Addr, u8, &str)] = &[
    (Ipv6Addr::UNSPECIFIED, 128, "unspecified (::)"),
    (Ipv6Addr::LOCALHOST, 128, "loopback (::1)"),
    (
        Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0),
        96,
        "IPv4-mapped (::ffff:0:0/96)",
    ),
    (
        Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0),
        96,
        "NAT64 (64:ff9b::/96)",
    ),
    (
        Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0),
        48,
        "NAT64 (64:ff9b:1::/48)",
    ),
    (
        Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 0),
        64,
        "discard-only (100::/64)",
    ),
    (
        Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0),
        10,
        "link-local (fe80::/10)",
    ),
    (
        Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0),
        8,
        "multicast (ff00::/8)",
    ),
    (
        POOL6.0,
        POOL6.1,
        "the sandboxes' own IPv6 range (fd5c:5c5c::/32)",
    ),
];

/// IPv6 ranges only `--allow-private-egress` opens.
pub const PRIVATE6: &[(Ipv6Addr, u8, &str)] = &[(
    Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0),
    7,
    "unique local (fc00::/7)",
)];

fn v4(list: &'static [(Ipv4Addr, u8, &'static str)]) -> impl Iterator<Item = (Cidr, &'static str)> {
    list.iter()
        .filter_map(|&(a, p, why)| Cidr::new(a, p).map(|c| (c, why)))
}

fn v6(
    list: &'static [(Ipv6Addr, u8, &'static str)],
) -> impl Iterator<Item = (Cidr6, &'static str)> {
    list.iter()
        .filter_map(|&(a, p, why)| Cidr6::new(a, p).map(|c| (c, why)))
}

/// What `ip` is when it is not a public address (any range of [`NEVER`], [`PRIVATE`],
/// [`NEVER6`], [`PRIVATE6`]; an IPv4-mapped address by its IPv4 one); `None`: public. For
/// checks with no sandbox pool or operator choice in them (registry pulls).
pub fn not_public(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(ip) => v4(NEVER)
            .chain(v4(PRIVATE))
            .find(|(r, _)| r.contains(ip))
            .map(|(_, why)| why),
        IpAddr::V6(ip) => {
            if let Some(mapped) = ip.to_ipv4_mapped() {
                return not_public(IpAddr::V4(mapped));
            }
            v6(NEVER6)
                .chain(v6(PRIVATE6))
                .find(|(r, _)| r.contains(ip))
                .map(|(_, why)| why)
        }
    }
}

/// The private ranges the operator opened to rules (`--allow-private-egress`), each inside
/// [`PRIVATE`] or [`PRIVATE6`]. Empty by default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowPrivate {
    pub v4: Vec<Cidr>,
    pub v6: Vec<Cidr6>,
}

impl FromStr for AllowPrivate {
    type Err = PolicyError;
    /// A comma-separated list of CIDRs (`10.1.0.0/16,fd00:1::/48`); empty: none.
    fn from_str(s: &str) -> Result<AllowPrivate, PolicyError> {
        let mut out = AllowPrivate::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let refused = |why: &str| PolicyError::Refused {
                entry: item.to_string(),
                why: why.to_string(),
            };
            match item.parse::<AllowEntry>()? {
                AllowEntry::Net(c) => {
                    if !v4(PRIVATE).any(|(r, _)| r.covers(&c)) {
                        return Err(refused(
                            "only private ranges (10/8, 172.16/12, 192.168/16, 100.64/10) can be \
                             opened by the operator",
                        ));
                    }
                    out.v4.push(c);
                }
                AllowEntry::Net6(c) => {
                    // One overlapping the sandboxes' fd5c:5c5c::/32 is fine: rules inside
                    // it are refused all the same (check_v6).
                    if !v6(PRIVATE6).any(|(r, _)| r.covers(&c)) {
                        return Err(refused(
                            "only unique-local ranges (fc00::/7) can be opened by the operator",
                        ));
                    }
                    out.v6.push(c);
                }
                AllowEntry::Domain(_) => return Err(refused("a CIDR is needed here, not a name")),
            }
        }
        Ok(out)
    }
}

fn pool6() -> Cidr6 {
    Cidr6 {
        addr: POOL6.0,
        prefix: POOL6.1,
    }
}

/// What a daemon's sandboxes may be pointed at: the sandbox pool (never) and the private
/// ranges the operator opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destinations {
    pub pool: Cidr,
    pub private: AllowPrivate,
}

impl Destinations {
    /// Why a sandbox may never reach `ip` through a name (proxy, DNS answers); `None`: it
    /// may (the rules still decide). `host` are the host's own addresses
    /// ([`host_addresses`]).
    pub fn refusal(&self, ip: IpAddr, host: &[IpAddr]) -> Option<&'static str> {
        if host.contains(&ip) {
            return Some("an address of the host itself");
        }
        match ip {
            IpAddr::V4(ip) => {
                if self.pool.contains(ip) {
                    return Some("the sandbox pool (other sandboxes)");
                }
                if let Some((_, why)) = v4(NEVER).find(|(r, _)| r.contains(ip)) {
                    return Some(why);
                }
                let (_, why) = v4(PRIVATE).find(|(r, _)| r.contains(ip))?;
                (!self.private.v4.iter().any(|c| c.contains(ip))).then_some(why)
            }
            IpAddr::V6(ip) => {
                if let Some(mapped) = ip.to_ipv4_mapped() {
                    return self
                        .refusal(IpAddr::V4(mapped), host)
                        .or(Some("IPv4-mapped (::ffff:0:0/96)"));
                }
                if let Some((_, why)) = v6(NEVER6).find(|(r, _)| r.contains(ip)) {
                    return Some(why);
                }
                let (_, why) = v6(PRIVATE6).find(|(r, _)| r.contains(ip))?;
                (!self.private.v6.iter().any(|c| c.contains(ip))).then_some(why)
            }
        }
    }

    /// Refuses the `allowOut` IP/CIDR entries of `spec` that would open a destination the
    /// API never opens (or a private one the operator did not open). `denyOut` and domain
    /// entries are not checked: a deny opens nothing, names are checked when they resolve.
    pub fn check_spec(&self, spec: &EgressSpec, host: &[IpAddr]) -> Result<(), PolicyError> {
        for entry in &spec.allow_out {
            let refused = |why: String| PolicyError::Refused {
                entry: entry.trim().to_string(),
                why,
            };
            match entry.parse::<AllowEntry>()? {
                AllowEntry::Net(c) => self.check_v4(&c, host).map_err(refused)?,
                AllowEntry::Net6(c) => self.check_v6(&c, host).map_err(refused)?,
                AllowEntry::Domain(_) => {}
            }
        }
        Ok(())
    }

    fn check_v4(&self, c: &Cidr, host: &[IpAddr]) -> Result<(), String> {
        if self.pool.covers(c) {
            return Err(format!(
                "it lies in the sandbox pool {} (other sandboxes); sandboxes reach each other \
                 only through private networks",
                self.pool
            ));
        }
        if let Some((_, why)) = v4(NEVER).find(|(r, _)| r.covers(c)) {
            return Err(format!("it lies in {why}, which sandboxes never reach"));
        }
        if let Some((_, why)) = v4(PRIVATE).find(|(r, _)| r.covers(c))
            && !self.private.v4.iter().any(|a| a.covers(c))
        {
            return Err(format!(
                "it lies in {why}; the operator opens private ranges with \
                 `sandcell serve --allow-private-egress CIDR,...`"
            ));
        }
        // A wide range (0.0.0.0/0, a /8) may contain the host: the kernel refuses the host's
        // addresses whatever the rules. A narrow one naming the host is a mistake or an attack.
        let hit = host.iter().find_map(|a| match a {
            IpAddr::V4(a) if c.prefix >= 16 && c.contains(*a) => Some(*a),
            _ => None,
        });
        if let Some(a) = hit {
            return Err(format!(
                "it contains {a}, an address of this host, which sandboxes never reach"
            ));
        }
        Ok(())
    }

    fn check_v6(&self, c: &Cidr6, host: &[IpAddr]) -> Result<(), String> {
        if let Some((_, why)) = v6(NEVER6).find(|(r, _)| r.covers(c)) {
            return Err(format!("it lies in {why}, which sandboxes never reach"));
        }
        if let Some((_, why)) = v6(PRIVATE6).find(|(r, _)| r.covers(c))
            && !self.private.v6.iter().any(|a| a.covers(c))
        {
            return Err(format!(
                "it lies in {why}; the operator opens private ranges with \
                 `sandcell serve --allow-private-egress CIDR,...`"
            ));
        }
        if c.overlaps(&pool6()) && c.prefix > 0 {
            return Err("it overlaps the sandboxes' own IPv6 range fd5c:5c5c::/32".into());
        }
        let hit = host.iter().find_map(|a| match a {
            IpAddr::V6(a) if c.prefix >= 48 && c.contains(*a) => Some(*a),
            _ => None,
        });
        if let Some(a) = hit {
            return Err(format!(
                "it contains {a}, an address of this host, which sandboxes never reach"
            ));
        }
        Ok(())
    }
}

/// The addresses of the host's interfaces now (`getifaddrs`); empty if that fails (the
/// kernel's input chain still refuses them to sandboxes). Cheap enough to call per
/// connection: addresses come and go (DHCP, VPNs), so nothing is cached.
pub fn host_addresses() -> Vec<IpAddr> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points to a sockaddr whose family says its real type.
            let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
            if family == libc::AF_INET {
                // SAFETY: family AF_INET: the sockaddr is a sockaddr_in.
                let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                out.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                    sin.sin_addr.s_addr,
                ))));
            } else if family == libc::AF_INET6 {
                // SAFETY: family AF_INET6: the sockaddr is a sockaddr_in6.
                let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
                out.push(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs and is freed once; no node is used after this.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// `c` without the addresses of `r`, as CIDRs (nft.rs cuts the pool out of allowed
/// reserved ranges with it).
pub fn subtract(c: Cidr, r: &Cidr) -> Vec<Cidr> {
    if !c.overlaps(r) {
        return vec![c];
    }
    if r.covers(&c) || c.prefix >= 32 {
        return Vec::new();
    }
    let half = 1u32 << (31 - u32::from(c.prefix));
    let lo = Cidr {
        addr: c.addr,
        prefix: c.prefix + 1,
    };
    let hi = Cidr {
        addr: Ipv4Addr::from(u32::from(c.addr) | half),
        prefix: c.prefix + 1,
    };
    let mut out = subtract(lo, r);
    out.extend(subtract(hi, r));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dest(private: &str) -> Destinations {
        Destinations {
            pool: "10.200.0.0/16".parse().unwrap(),
            private: private.parse().unwrap(),
        }
    }

    fn allow(entries: &[&str]) -> EgressSpec {
        EgressSpec {
            allow_out: entries.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn refused(d: &Destinations, entry: &str, host: &[IpAddr]) -> bool {
        matches!(
            d.check_spec(&allow(&[entry]), host),
            Err(PolicyError::Refused { .. })
        )
    }

    #[test]
    fn the_api_never_opens_loopback_link_local_the_pool_or_the_host() {
        let host: Vec<IpAddr> = vec![
            "203.0.113.5".parse().unwrap(),
            "2001:db8::5".parse().unwrap(),
        ];
        let d = dest("10.0.0.0/8,192.168.0.0/16,fd00::/8");
        for e in [
            "127.0.0.0/8",
            "127.0.0.1",
            "169.254.169.254",
            "169.254.0.0/16",
            "0.0.0.0/8",
            "10.200.0.0/16",
            "10.200.3.2",
            "224.0.0.1",
            "255.255.255.255",
            "203.0.113.5",
            "203.0.113.0/24",
            "::1",
            "fe80::/10",
            "::ffff:127.0.0.1",
            "fd5c:5c5c::/32",
            "fd5c:5c5c:0:3::2",
            "ff02::1",
            "2001:db8::5",
        ] {
            assert!(refused(&d, e, &host), "{e} accepted");
        }
        // wide ranges and the internet stay allowed; private ones the operator opened too
        for e in [
            "0.0.0.0/0",
            "8.8.8.8",
            "203.0.0.0/8",
            "10.0.0.0/8",
            "10.1.2.3",
            "192.168.1.0/24",
            "fd00:1::/48",
            "2001:db8:1::/48",
            "::/0",
            "*.bars.test",
        ] {
            assert!(d.check_spec(&allow(&[e]), &host).is_ok(), "{e} refused");
        }
    }

    #[test]
    fn private_ranges_need_the_operator() {
        let d = dest("");
        for e in [
            "10.0.0.0/8",
            "10.1.2.3",
            "172.16.0.0/12",
            "192.168.1.1",
            "100.64.0.1",
            "fd00::1",
        ] {
            assert!(refused(&d, e, &[]), "{e} accepted");
        }
        let err = d
            .check_spec(&allow(&["a.test", "192.168.1.1"]), &[])
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("192.168.1.1") && msg.contains("--allow-private-egress"),
            "{msg}"
        );
        // the flag takes private ranges only
        assert!("8.8.8.0/24".parse::<AllowPrivate>().is_err());
        assert!("127.0.0.0/8".parse::<AllowPrivate>().is_err());
        assert!("2001:db8::/32".parse::<AllowPrivate>().is_err());
        assert!("10.1.0.0/16, fd00::/8".parse::<AllowPrivate>().is_ok());
    }

    #[test]
    fn names_never_lead_to_reserved_addresses() {
        let d = dest("192.168.0.0/16");
        let host: Vec<IpAddr> = vec!["203.0.113.5".parse().unwrap()];
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        for bad in [
            "127.0.0.1",
            "169.254.169.254",
            "10.200.0.2",
            "10.1.1.1",
            "0.0.0.0",
            "203.0.113.5",
            "::1",
            "::ffff:127.0.0.1",
            "fd5c:5c5c:0:1::2",
            "fe80::1",
            "fd00::1",
        ] {
            assert!(d.refusal(ip(bad), &host).is_some(), "{bad}");
        }
        for good in ["198.51.100.10", "192.168.3.3", "2001:db8::10"] {
            assert_eq!(d.refusal(ip(good), &host), None, "{good}");
        }
    }

    #[test]
    fn only_public_addresses_are_public() {
        for (ip, what) in [
            ("127.0.0.1", "loopback"),
            ("10.1.2.3", "private"),
            ("100.64.0.1", "carrier-grade"),
            ("169.254.169.254", "link-local"),
            ("0.0.0.0", "this network"),
            ("255.255.255.255", "broadcast"),
            ("::ffff:192.168.1.1", "private"),
            ("64:ff9b::a00:1", "NAT64"),
            ("fd00::1", "unique local"),
            ("fe80::1", "link-local"),
            ("::1", "loopback"),
        ] {
            let why = not_public(ip.parse().unwrap());
            assert!(why.is_some_and(|w| w.contains(what)), "{ip}: {why:?}");
        }
        for ip in [
            "8.8.8.8",
            "203.0.113.10",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert_eq!(not_public(ip.parse().unwrap()), None, "{ip}");
        }
    }

    #[test]
    fn subtract_cuts_the_pool_out() {
        let pool: Cidr = "10.200.0.0/16".parse().unwrap();
        let parts = subtract("10.0.0.0/8".parse().unwrap(), &pool);
        assert_eq!(parts.len(), 8);
        assert!(parts.iter().all(|p| !p.overlaps(&pool)));
        let total: u64 = parts.iter().map(|p| 1u64 << (32 - p.prefix)).sum();
        assert_eq!(total, (1 << 24) - (1 << 16));
        assert_eq!(subtract(pool, &pool), Vec::<Cidr>::new());
        let other: Cidr = "192.168.0.0/16".parse().unwrap();
        assert_eq!(subtract(other, &pool), vec![other]);
    }
}
