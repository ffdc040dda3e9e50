//! The egress policy, E2B's fields: `allow_internet_access`, `allowOut` (IP, CIDR, domain,
//! `*.domain`), `denyOut` (IP, CIDR).
//!
//! Semantics (what [`crate::nft`] and the DNS server enforce):
//! - no rules and internet allowed: open (everything but the always-blocked ranges);
//! - `allow_internet_access = false`: the same as `denyOut: 0.0.0.0/0`;
//! - any `allowOut` entry: everything not allowed is denied; `denyOut` is then moot;
//! - allow wins over deny;
//! - always blocked unless an `allowOut` CIDR lies entirely inside them ("explicitly"):
//!   [`RESERVED`] (private, link-local with the metadata address, CGNAT, loopback,
//!   multicast, reserved) and the sandbox pool; the host's own addresses are never reachable
//!   except our DNS server on the gateway address;
//! - DNS: only our server; it resolves a name only when the policy is open or the name
//!   matches a domain entry (so DNS tunnelling to other domains gets no answer);
//! - IPv6: the same rules with IPv6 CIDRs ([`Cidr6`], `2001:db8::/32`): an allow entry of
//!   either family makes both default-deny; `allow_internet_access = false` denies `::/0`
//!   too; [`RESERVED6`] as [`RESERVED`]. Domain rules open IPv4 only (the Host/SNI proxy
//!   and the learned set are IPv4): under a default-deny policy our DNS server answers no
//!   AAAA records, so clients use the IPv4 addresses the proxy checks.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// Ranges a sandbox never reaches unless an `allowOut` CIDR lies inside one of them.
pub const RESERVED: &[(Ipv4Addr, u8)] = &[
    (Ipv4Addr::new(0, 0, 0, 0), 8),
    (Ipv4Addr::new(10, 0, 0, 0), 8),
    (Ipv4Addr::new(100, 64, 0, 0), 10),
    (Ipv4Addr::new(127, 0, 0, 0), 8),
    (Ipv4Addr::new(169, 254, 0, 0), 16), // link-local, with the metadata address 169.254.169.254
    (Ipv4Addr::new(172, 16, 0, 0), 12),
    (Ipv4Addr::new(192, 168, 0, 0), 16),
    (Ipv4Addr::new(224, 0, 0, 0), 4), // multicast
    (Ipv4Addr::new(240, 0, 0, 0), 4), // reserved and broadcast
];

/// IPv6 ranges a sandbox never reaches unless an `allowOut` CIDR lies inside one of them:
/// unspecified and loopback, IPv4-mapped and NAT64 (IPv4 by another name), discard-only,
/// unique local (the sandboxes' own addresses among them), link-local, multicast.
pub const RESERVED6: &[(Ipv6Addr, u8)] = &[
    (Ipv6Addr::UNSPECIFIED, 128),
    (Ipv6Addr::LOCALHOST, 128),
    (Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0), 96),
    (Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96),
    (Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0), 48),
    (Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 0), 64),
    (Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0), 7),
    (Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10),
    (Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8),
];

/// An IPv6 network: address and prefix length, host bits cleared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr6 {
    pub addr: Ipv6Addr,
    pub prefix: u8,
}

fn mask6(prefix: u8) -> u128 {
    if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(prefix.min(128)))
    }
}

impl Cidr6 {
    pub fn new(addr: Ipv6Addr, prefix: u8) -> Option<Cidr6> {
        (prefix <= 128).then(|| Cidr6 {
            addr: Ipv6Addr::from(u128::from(addr) & mask6(prefix)),
            prefix,
        })
    }

    pub fn contains(&self, ip: Ipv6Addr) -> bool {
        u128::from(ip) & mask6(self.prefix) == u128::from(self.addr)
    }

    pub fn covers(&self, other: &Cidr6) -> bool {
        other.prefix >= self.prefix && self.contains(other.addr)
    }

    /// Whether the two share any address (then one covers the other).
    pub fn overlaps(&self, other: &Cidr6) -> bool {
        self.covers(other) || other.covers(self)
    }

    pub fn is_reserved_only(&self) -> bool {
        reserved_ranges6().iter().any(|r| r.covers(self))
    }
}

pub fn reserved_ranges6() -> Vec<Cidr6> {
    RESERVED6
        .iter()
        .filter_map(|&(a, p)| Cidr6::new(a, p))
        .collect()
}

impl fmt::Display for Cidr6 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl FromStr for Cidr6 {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Cidr6, PolicyError> {
        let bad = || PolicyError::BadCidr6(s.to_string());
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, p.parse::<u8>().map_err(|_| bad())?),
            None => (s, 128),
        };
        let addr: Ipv6Addr = a.parse().map_err(|_| bad())?;
        let c = Cidr6::new(addr, p).ok_or_else(bad)?;
        if c.addr != addr {
            return Err(bad());
        }
        Ok(c)
    }
}

/// An IPv4 network: address and prefix length, host bits cleared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr {
    pub addr: Ipv4Addr,
    pub prefix: u8,
}

impl Cidr {
    pub fn new(addr: Ipv4Addr, prefix: u8) -> Option<Cidr> {
        (prefix <= 32).then(|| Cidr {
            addr: Ipv4Addr::from(u32::from(addr) & mask(prefix)),
            prefix,
        })
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & mask(self.prefix) == u32::from(self.addr)
    }

    /// Whether all of `other` lies inside `self`.
    pub fn covers(&self, other: &Cidr) -> bool {
        other.prefix >= self.prefix && self.contains(other.addr)
    }

    /// Whether the two share any address (then one covers the other).
    pub fn overlaps(&self, other: &Cidr) -> bool {
        self.covers(other) || other.covers(self)
    }

    pub fn is_reserved_only(&self, pool: &Cidr) -> bool {
        reserved_ranges(pool).iter().any(|r| r.covers(self))
    }
}

pub(crate) fn mask(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix.min(32)))
    }
}

/// [`RESERVED`] and the sandbox pool.
pub fn reserved_ranges(pool: &Cidr) -> Vec<Cidr> {
    let mut v: Vec<Cidr> = RESERVED
        .iter()
        .filter_map(|&(a, p)| Cidr::new(a, p))
        .collect();
    v.push(*pool);
    v
}

pub fn is_reserved(ip: Ipv4Addr, pool: &Cidr) -> bool {
    reserved_ranges(pool).iter().any(|r| r.contains(ip))
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl FromStr for Cidr {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Cidr, PolicyError> {
        let bad = || PolicyError::BadCidr(s.to_string());
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, p.parse::<u8>().map_err(|_| bad())?),
            None => (s, 32),
        };
        let addr: Ipv4Addr = a.parse().map_err(|_| bad())?;
        // A CIDR with host bits set is most likely a typo: refuse rather than guess.
        let c = Cidr::new(addr, p).ok_or_else(bad)?;
        if c.addr != addr {
            return Err(bad());
        }
        Ok(c)
    }
}

/// A domain rule: `example.com` (that name only) or `*.example.com` (its subdomains, not
/// the name itself). Stored lowercase without a trailing dot.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DomainRule {
    Exact(String),
    Wildcard(String),
}

impl DomainRule {
    pub fn matches(&self, name: &str) -> bool {
        let name = name.trim_end_matches('.');
        match self {
            DomainRule::Exact(d) => name.eq_ignore_ascii_case(d),
            DomainRule::Wildcard(d) => {
                name.len() > d.len() + 1
                    && name.as_bytes()[name.len() - d.len() - 1] == b'.'
                    && name[name.len() - d.len()..].eq_ignore_ascii_case(d)
            }
        }
    }
}

/// A valid DNS name for a rule: labels of letters, digits, `-` and `_`, at most 63 bytes
/// each, 253 in all, at least two labels.
fn valid_domain(d: &str) -> bool {
    d.len() <= 253
        && d.split('.').count() >= 2
        && d.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// One `allowOut` entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AllowEntry {
    Net(Cidr),
    Net6(Cidr6),
    Domain(DomainRule),
}

impl FromStr for AllowEntry {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<AllowEntry, PolicyError> {
        let s = s.trim();
        if s.bytes().next().is_some_and(|b| b.is_ascii_digit()) && !s.contains(char::is_alphabetic)
        {
            return s.parse().map(AllowEntry::Net);
        }
        if s.contains(':') {
            return s.parse().map(AllowEntry::Net6);
        }
        let lower = s.trim_end_matches('.').to_ascii_lowercase();
        let (rule, base) = match lower.strip_prefix("*.") {
            Some(base) => (DomainRule::Wildcard(base.to_string()), base),
            None => (DomainRule::Exact(lower.clone()), lower.as_str()),
        };
        if !valid_domain(base) {
            return Err(PolicyError::BadDomain(s.to_string()));
        }
        Ok(AllowEntry::Domain(rule))
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("{0:?} is not an IPv4 address or CIDR with its host bits clear (e.g. 10.0.0.0/8)")]
    BadCidr(String),
    #[error("{0:?} is not a domain (`example.com` or `*.example.com`)")]
    BadDomain(String),
    #[error("{0:?} is not an IPv6 address or CIDR with its host bits clear (e.g. 2001:db8::/32)")]
    BadCidr6(String),
    /// A valid entry that would open a destination sandboxes never reach (reserved.rs).
    #[error("allowOut entry {entry:?} is refused: {why}")]
    Refused { entry: String, why: String },
    /// A `network.rules` entry that cannot be applied (rules.rs).
    #[error("network.rules: {0}")]
    BadRule(String),
}

/// The policy as the API gives it (E2B's field names on the wire).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EgressSpec {
    #[serde(rename = "allow_internet_access", default = "yes")]
    pub allow_internet_access: bool,
    #[serde(default)]
    pub allow_out: Vec<String>,
    #[serde(default)]
    pub deny_out: Vec<String>,
    /// E2B's `rules`: per domain, header transforms with `${e2b.secrets.<name>}`
    /// placeholders the egress proxy fills on the host (rules.rs).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub rules: crate::rules::Rules,
}

fn yes() -> bool {
    true
}

impl Default for EgressSpec {
    fn default() -> Self {
        EgressSpec {
            allow_internet_access: true,
            allow_out: Vec::new(),
            deny_out: Vec::new(),
            rules: Default::default(),
        }
    }
}

/// A parsed, checked policy.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Policy {
    pub allow_nets: Vec<Cidr>,
    pub allow_domains: Vec<DomainRule>,
    /// `denyOut`, plus 0.0.0.0/0 when internet access is off.
    pub deny_nets: Vec<Cidr>,
    pub allow_nets6: Vec<Cidr6>,
    /// `denyOut`'s IPv6 entries, plus ::/0 when internet access is off.
    pub deny_nets6: Vec<Cidr6>,
    /// Header transforms by domain (lowercase), checked against `allowOut`.
    pub transforms: crate::rules::Transforms,
    /// E2B's `egressProxy`, checked: all allowed TCP goes through it (tunnel.rs). Not part
    /// of [`EgressSpec`]: set with [`crate::SandboxNet::set_egress`].
    pub tunnel: Option<std::sync::Arc<crate::tunnel::Tunnel>>,
}

impl Policy {
    /// Open: no rules.
    pub fn open() -> Policy {
        Policy::default()
    }

    pub fn from_spec(spec: &EgressSpec) -> Result<Policy, PolicyError> {
        let mut p = Policy::default();
        for e in &spec.allow_out {
            match e.parse()? {
                AllowEntry::Net(c) => p.allow_nets.push(c),
                AllowEntry::Net6(c) => p.allow_nets6.push(c),
                AllowEntry::Domain(d) => p.allow_domains.push(d),
            }
        }
        for e in &spec.deny_out {
            if e.contains(':') {
                p.deny_nets6.push(e.trim().parse()?);
                continue;
            }
            p.deny_nets.push(e.trim().parse()?);
        }
        if !spec.allow_internet_access {
            p.deny_nets = vec![Cidr {
                addr: Ipv4Addr::UNSPECIFIED,
                prefix: 0,
            }];
            p.deny_nets6 = vec![Cidr6 {
                addr: Ipv6Addr::UNSPECIFIED,
                prefix: 0,
            }];
        }
        p.allow_nets6.sort();
        p.allow_nets6.dedup();
        p.deny_nets6.sort();
        p.deny_nets6.dedup();
        p.allow_nets.sort();
        p.allow_nets.dedup();
        p.allow_domains.sort();
        p.allow_domains.dedup();
        p.deny_nets.sort();
        p.deny_nets.dedup();
        p.transforms = crate::rules::transforms(&spec.rules, &p)?;
        Ok(p)
    }

    /// Nothing outside the sandbox's gateway and private-network peers is reachable: no
    /// allow rule and internet access off. (Such a sandbox has no connection a tighter
    /// policy would have to cut.)
    pub fn allows_nothing(&self) -> bool {
        !self.default_deny()
            && self.tunnel.is_none()
            && self.deny_nets.iter().any(|c| c.prefix == 0)
            && self.deny_nets6.iter().any(|c| c.prefix == 0)
    }

    /// Any allow rule makes everything else denied.
    pub fn default_deny(&self) -> bool {
        !self.allow_nets.is_empty()
            || !self.allow_domains.is_empty()
            || !self.allow_nets6.is_empty()
    }

    /// The IPv6 decision, as the nftables rules make it.
    pub fn ip6_allowed(&self, ip: Ipv6Addr) -> bool {
        let explicit = |c: &Cidr6| c.contains(ip);
        if reserved_ranges6().iter().any(|r| r.contains(ip)) {
            return self
                .allow_nets6
                .iter()
                .filter(|c| c.is_reserved_only())
                .any(explicit);
        }
        if self.allow_nets6.iter().any(explicit) {
            return true;
        }
        !self.default_deny() && !self.deny_nets6.iter().any(explicit)
    }

    /// Whether our DNS server resolves `name`: any name when the internet is open (even
    /// with some `denyOut`: the sandbox can send data to most of the internet anyway), else only names a domain rule
    /// matches, so that a sandbox cannot tunnel data out through DNS queries.
    pub fn resolves(&self, name: &str) -> bool {
        let denies_all = self.deny_nets.iter().any(|c| c.prefix == 0);
        (!self.default_deny() && !denies_all) || self.domain_allowed(name)
    }

    pub fn domain_allowed(&self, name: &str) -> bool {
        self.allow_domains.iter().any(|d| d.matches(name))
    }

    /// The IP decision, as the nftables rules make it (used by the proxy and the DNS
    /// server's learning, and to test the rules' intent).
    pub fn ip_allowed(&self, ip: Ipv4Addr, pool: &Cidr) -> bool {
        let explicit = |c: &Cidr| c.contains(ip);
        if is_reserved(ip, pool) {
            return self
                .allow_nets
                .iter()
                .filter(|c| c.is_reserved_only(pool))
                .any(explicit);
        }
        if self.allow_nets.iter().any(explicit) {
            return true;
        }
        !self.default_deny() && !self.deny_nets.iter().any(explicit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> Cidr {
        "10.200.0.0/16".parse().unwrap()
    }

    fn policy(allow_internet: bool, allow: &[&str], deny: &[&str]) -> Policy {
        Policy::from_spec(&EgressSpec {
            allow_internet_access: allow_internet,
            allow_out: allow.iter().map(|s| s.to_string()).collect(),
            deny_out: deny.iter().map(|s| s.to_string()).collect(),
            rules: Default::default(),
        })
        .unwrap()
    }

    #[test]
    fn only_a_closed_policy_without_allows_lets_nothing_out() {
        assert!(policy(false, &[], &[]).allows_nothing());
        // open, or anything allowed: a tighter policy may have connections to cut
        assert!(!policy(true, &[], &[]).allows_nothing());
        assert!(
            !policy(true, &[], &["0.0.0.0/0"]).allows_nothing(),
            "IPv6 stays open"
        );
        assert!(!policy(false, &["1.2.3.4"], &[]).allows_nothing());
        assert!(!policy(false, &["example.com"], &[]).allows_nothing());
        assert!(!policy(false, &["2001:db8::/32"], &[]).allows_nothing());
    }

    #[test]
    fn parses_entries() {
        assert_eq!(
            "1.2.3.4".parse::<AllowEntry>().unwrap(),
            AllowEntry::Net(Cidr {
                addr: Ipv4Addr::new(1, 2, 3, 4),
                prefix: 32
            })
        );
        assert!(matches!(
            "10.0.0.0/8".parse::<AllowEntry>().unwrap(),
            AllowEntry::Net(_)
        ));
        assert_eq!(
            "*.Example.COM.".parse::<AllowEntry>().unwrap(),
            AllowEntry::Domain(DomainRule::Wildcard("example.com".into()))
        );
        for bad in [
            "10.0.0.1/8",
            "1.2.3.4/33",
            "300.1.1.1",
            "*",
            "com",
            "a..b",
            "*.*.x.com",
            "::1/64",
            "2001:db8::1/32",
            "2001:db8:::1",
            "ex ample.com",
        ] {
            assert!(bad.parse::<AllowEntry>().is_err(), "{bad}");
        }
    }

    #[test]
    fn wildcard_matches_subdomains_only() {
        let w = DomainRule::Wildcard("example.com".into());
        assert!(w.matches("a.example.com"));
        assert!(w.matches("A.B.Example.com."));
        assert!(!w.matches("example.com"));
        assert!(!w.matches("badexample.com"));
        assert!(!w.matches("example.com.evil.net"));
        let e = DomainRule::Exact("example.com".into());
        assert!(e.matches("EXAMPLE.com."));
        assert!(!e.matches("a.example.com"));
    }

    #[test]
    fn ip_decisions_follow_e2b_semantics() {
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        let open = Policy::open();
        assert!(open.ip_allowed(ip("8.8.8.8"), &pool()));
        assert!(!open.ip_allowed(ip("169.254.169.254"), &pool()));
        assert!(!open.ip_allowed(ip("10.200.0.6"), &pool()));
        assert!(!open.ip_allowed(ip("192.168.1.1"), &pool()));

        let off = policy(false, &[], &[]);
        assert!(!off.ip_allowed(ip("8.8.8.8"), &pool()));
        assert!(!off.resolves("example.com"));

        let deny = policy(true, &[], &["1.2.3.0/24"]);
        assert!(!deny.ip_allowed(ip("1.2.3.4"), &pool()));
        assert!(deny.ip_allowed(ip("1.2.4.4"), &pool()));

        // allow wins over deny, and any allow is default-deny
        let both = policy(true, &["1.2.3.4"], &["1.2.3.0/24"]);
        assert!(both.ip_allowed(ip("1.2.3.4"), &pool()));
        assert!(!both.ip_allowed(ip("1.2.3.5"), &pool()));
        assert!(!both.ip_allowed(ip("9.9.9.9"), &pool()));

        // reserved ranges only by an entry that lies inside them
        let all = policy(true, &["0.0.0.0/0"], &[]);
        assert!(all.ip_allowed(ip("8.8.8.8"), &pool()));
        assert!(!all.ip_allowed(ip("169.254.169.254"), &pool()));
        let meta = policy(false, &["169.254.169.254"], &[]);
        assert!(meta.ip_allowed(ip("169.254.169.254"), &pool()));
        let lan = policy(true, &["192.168.0.0/16"], &[]);
        assert!(lan.ip_allowed(ip("192.168.3.3"), &pool()));
    }

    #[test]
    fn dns_resolves_only_allowed_names_unless_open() {
        assert!(Policy::open().resolves("anything.example"));
        let p = policy(false, &["*.good.com", "api.x.org"], &[]);
        assert!(p.resolves("a.good.com"));
        assert!(p.resolves("api.x.org"));
        assert!(!p.resolves("good.com"));
        assert!(!p.resolves("exfil-data.evil.net"));
        let cidr_only = policy(true, &["1.1.1.1"], &[]);
        assert!(!cidr_only.resolves("example.com"));
        let denied_some = policy(true, &[], &["1.0.0.0/8"]);
        assert!(denied_some.resolves("example.com"));
    }

    #[test]
    fn spec_reads_e2b_field_names() {
        let s: EgressSpec = serde_json::from_str(
            r#"{"allow_internet_access": false, "allowOut": ["a.com"], "denyOut": ["1.1.1.1"]}"#,
        )
        .unwrap();
        assert!(!s.allow_internet_access);
        assert_eq!(s.allow_out, vec!["a.com"]);
        let d: EgressSpec = serde_json::from_str("{}").unwrap();
        assert!(d.allow_internet_access);
    }

    #[test]
    fn ipv6_rules_follow_the_same_semantics() {
        assert!(matches!(
            "2001:db8::/32".parse::<AllowEntry>().unwrap(),
            AllowEntry::Net6(_)
        ));
        let a: Ipv6Addr = "2001:db8:100::10".parse().unwrap();
        let b: Ipv6Addr = "2001:db8:100::20".parse().unwrap();
        let ula: Ipv6Addr = "fd00::1".parse().unwrap();
        let open = policy(true, &[], &[]);
        assert!(open.ip6_allowed(a) && !open.ip6_allowed(ula));
        let deny = policy(true, &[], &["2001:db8:100::20"]);
        assert!(deny.ip6_allowed(a) && !deny.ip6_allowed(b));
        let allow = policy(true, &["2001:db8:100::10/128"], &[]);
        assert!(allow.ip6_allowed(a) && !allow.ip6_allowed(b));
        // an IPv6 allow entry makes IPv4 default-deny too, and the other way round
        assert!(!allow.ip_allowed(Ipv4Addr::new(1, 1, 1, 1), &pool()));
        assert!(!policy(true, &["1.1.1.1"], &[]).ip6_allowed(a));
        assert!(!policy(false, &[], &[]).ip6_allowed(a));
        assert!(policy(true, &["fd00::/64"], &[]).ip6_allowed(ula));
    }
}
