//! The nftables side: one table per sandbox network in the host's namespace,
//! `inet sandcell_<n>` (n = the network's slot, as in its host veth `sch<n>`), holding its
//! NAT, its egress policy and its denied-attempt log. One table per sandbox means teardown
//! is one `delete table`, a policy change touches nothing of other sandboxes, and a
//! leftover is recognisable by name alone.
//!
//! Why the host's namespace and not the sandbox's: gVisor (`--network=sandbox`) and a TAP
//! reader send the sandbox's frames straight onto the interface (packet socket), so the
//! sandbox namespace's netfilter never sees them; the first place they meet netfilter is
//! the host end of the veth. The sandbox cannot touch the host's namespace either way.
//!
//! Every change is a single `nft -f -` transaction: rules and sets switch atomically.

use crate::cmd;
use crate::hostcheck;
use crate::policy::{Cidr, Cidr6, Policy, reserved_ranges, reserved_ranges6};
use crate::{Error, Result};
use std::fmt::Write;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

pub const TABLE_PREFIX: &str = "sandcell_";

pub fn table_name(slot: u32) -> String {
    format!("{TABLE_PREFIX}{slot}")
}

/// What the rules of one sandbox network need to know.
#[derive(Debug, Clone)]
pub struct TableSpec {
    pub slot: u32,
    pub host_if: String,
    /// The host end's address: the sandbox's gateway and DNS server.
    pub gateway: Ipv4Addr,
    pub guest: Ipv4Addr,
    pub pool: Cidr,
    pub gateway6: Ipv6Addr,
    pub guest6: Ipv6Addr,
}

/// The whole table, created from scratch (an older table of the same name goes in the same
/// transaction), with `policy` and DNS-learned addresses in place.
pub fn create_script(t: &TableSpec, policy: &Policy, learned: &[(Ipv4Addr, Duration)]) -> String {
    let name = table_name(t.slot);
    let (hif, gw, guest) = (&t.host_if, t.gateway, t.guest);
    let (gw6, guest6) = (t.gateway6, t.guest6);
    let mut s = String::new();
    // `add` then `delete`: removes a leftover table of this name without failing when
    // there is none (nft 1.0.6 has no `destroy`).
    let _ = writeln!(s, "add table inet {name}\ndelete table inet {name}");
    let _ = writeln!(
        s,
        r#"table inet {name} {{
  set reserved {{ type ipv4_addr; flags interval; auto-merge; }}
  set allow {{ type ipv4_addr; flags interval; auto-merge; }}
  set allow_reserved {{ type ipv4_addr; flags interval; auto-merge; }}
  set deny {{ type ipv4_addr; flags interval; auto-merge; }}
  set dns_allow {{ type ipv4_addr; flags timeout; }}
  set reserved6 {{ type ipv6_addr; flags interval; auto-merge; }}
  set allow6 {{ type ipv6_addr; flags interval; auto-merge; }}
  set allow6_reserved {{ type ipv6_addr; flags interval; auto-merge; }}
  set deny6 {{ type ipv6_addr; flags interval; auto-merge; }}
  # Members of a private network this sandbox is in: reachable both ways (peers_script).
  set peers {{ type ipv4_addr; }}
  set denied {{ type ipv4_addr . inet_proto . inet_service; flags dynamic,timeout; timeout 1h; size 4096; }}
  counter denied_packets {{ }}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr {guest} oifname != "sch*" masquerade
    ip6 saddr {guest6} oifname != "sch*" masquerade
  }}
  chain forward {{
    type filter hook forward priority -10; policy accept;
    iifname "{hif}" jump egress
  }}
  # Later than every sandbox's egress chain (-10), so that a sandbox reaching for another
  # is refused and logged by its own table first.
  chain inbound {{
    type filter hook forward priority -5; policy accept;
    oifname "{hif}" ct state established,related accept
    oifname "{hif}" ip saddr @peers accept
    oifname "{hif}" drop
  }}
  # The sandbox's TCP (any port) to addresses only a domain rule opened goes to the
  # Host/SNI proxy on the gateway (hostcheck.rs); rules in `to_proxy` (policy_script).
  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    iifname "{hif}" jump to_proxy
  }}
  chain to_proxy {{ }}
  chain input {{
    type filter hook input priority -10; policy accept;
    iifname "{hif}" jump to_host
  }}
  chain to_host {{
    ct state established,related accept
    ip daddr {gw} udp dport 53 accept
    ip daddr {gw} tcp dport 53 accept
    ip daddr {gw} icmp type echo-request accept
    # IPv6 neighbour discovery (to solicited-node multicast or the gateway), ping of it.
    icmpv6 type {{ nd-neighbor-solicit, nd-neighbor-advert }} accept
    # Router solicitations and multicast listener reports: nothing answers them; dropped
    # quietly (they are not attempts to get out).
    icmpv6 type {{ nd-router-solicit, mld-listener-report, mld2-listener-report }} drop
    ip6 daddr {gw6} icmpv6 type echo-request accept
    ip daddr {gw} tcp dport {proxy} accept
    jump denied
  }}
  chain denied {{
    counter name denied_packets
    meta nfproto ipv4 meta l4proto {{ tcp, udp }} add @denied {{ ip daddr . meta l4proto . th dport }}
    limit rate 5/second log prefix "sandcell_{slot} denied: " level info
    meta l4proto tcp reject with tcp reset
    reject
  }}
  chain egress {{ }}
}}"#,
        slot = t.slot,
        proxy = hostcheck::PROXY_PORT,
    );
    let reserved: Vec<Cidr> = reserved_ranges(&t.pool);
    add_elements(&mut s, &name, "reserved", &reserved);
    add_elements(&mut s, &name, "reserved6", &reserved_ranges6());
    s.push_str(&policy_script(t, policy, learned));
    s
}

/// Replaces the policy: sets and the `egress` chain, in the same transaction as the caller's
/// other lines. `learned` are DNS answers still allowed under `policy`, with their time left.
pub fn policy_script(t: &TableSpec, policy: &Policy, learned: &[(Ipv4Addr, Duration)]) -> String {
    let name = table_name(t.slot);
    let mut s = String::new();
    for set in [
        "allow",
        "allow_reserved",
        "deny",
        "dns_allow",
        "allow6",
        "allow6_reserved",
        "deny6",
    ] {
        let _ = writeln!(s, "flush set inet {name} {set}");
    }
    let (reserved_allow, allow): (Vec<Cidr>, Vec<Cidr>) = policy
        .allow_nets
        .iter()
        .partition(|c| c.is_reserved_only(&t.pool));
    // Whatever the rules say (reserved.rs refuses such entries at the API already), the
    // pool and the never-opened ranges are cut out of what an entry opens: 10.0.0.0/8
    // opens 10/8 without the other sandboxes in it.
    let mut never: Vec<Cidr> = crate::reserved::NEVER
        .iter()
        .filter_map(|&(a, p, _)| Cidr::new(a, p))
        .collect();
    never.push(t.pool);
    let reserved_allow: Vec<Cidr> = reserved_allow
        .into_iter()
        .flat_map(|c| {
            never.iter().fold(vec![c], |parts, r| {
                parts
                    .into_iter()
                    .flat_map(|p| crate::reserved::subtract(p, r))
                    .collect()
            })
        })
        .collect();
    add_elements(&mut s, &name, "allow", &allow);
    add_elements(&mut s, &name, "allow_reserved", &reserved_allow);
    add_elements(&mut s, &name, "deny", &policy.deny_nets);
    let (reserved_allow6, allow6): (Vec<Cidr6>, Vec<Cidr6>) = policy
        .allow_nets6
        .iter()
        .partition(|c| c.is_reserved_only());
    add_elements(&mut s, &name, "allow6", &allow6);
    add_elements(&mut s, &name, "allow6_reserved", &reserved_allow6);
    add_elements(&mut s, &name, "deny6", &policy.deny_nets6);
    s.push_str(&learn_script(t.slot, learned));
    let _ = writeln!(s, "flush chain inet {name} to_proxy");
    let to_proxy = format!(
        "meta l4proto tcp dnat ip to {}:{}",
        t.gateway,
        hostcheck::PROXY_PORT
    );
    let rules: Vec<String> = if policy.tunnel.is_none() {
        // Addresses an IP rule allows are reached directly; TCP to those only a domain rule
        // opened (DNS answers), on any port, goes through the proxy, which lets through only
        // TLS and HTTP naming an allowed host. DNS and DNS over TLS stay refused (chain
        // egress), whatever the address.
        vec![
            "ip daddr @allow return".to_string(),
            "ip daddr @allow_reserved return".to_string(),
            "tcp dport { 53, 853 } return".to_string(),
            format!("ip daddr @dns_allow {to_proxy}"),
        ]
    } else {
        // An egress proxy (tunnel.rs): every TCP connection the egress chain would accept
        // goes to the proxy on the gateway instead (which reaches it through the SOCKS5
        // proxy), in the egress chain's order; what it would refuse is left to it (return).
        let mut v = vec![
            "ip daddr @peers return".to_string(),
            "tcp dport { 53, 853 } return".to_string(),
            format!("ip daddr @allow_reserved {to_proxy}"),
            "ip daddr @reserved return".to_string(),
            format!("ip daddr @allow {to_proxy}"),
            format!("ip daddr @dns_allow {to_proxy}"),
        ];
        if !policy.default_deny() {
            v.push("ip daddr @deny return".to_string());
            v.push(format!("meta nfproto ipv4 {to_proxy}"));
        }
        v
    };
    for r in rules {
        let _ = writeln!(s, "add rule inet {name} to_proxy {r}");
    }
    let _ = writeln!(s, "flush chain inet {name} egress");
    let mut rule = |r: &str| {
        let _ = writeln!(s, "add rule inet {name} egress {r}");
    };
    rule("ct state established,related accept");
    // Private-network peers (in the pool, so before the reserved ranges); their own table
    // lets the packet in only if this sandbox is in their `peers` set too.
    rule("ip daddr @peers accept");
    if policy.tunnel.is_some() {
        // The proxy on the gateway is IPv4: with an egress proxy, IPv6 TCP would leave
        // directly, so it is refused (clients fall back to IPv4).
        rule("meta nfproto ipv6 meta l4proto tcp jump denied");
    }
    rule("ip daddr @allow_reserved accept");
    rule("ip daddr @reserved jump denied");
    rule("ip6 daddr @allow6_reserved accept");
    rule("ip6 daddr @reserved6 jump denied");
    // Our DNS server (on the host, see chain to_host) is the only resolver: plain DNS and
    // DNS over TLS to anything else is refused, allowed IP or not.
    rule("meta l4proto { tcp, udp } th dport { 53, 853 } jump denied");
    rule("ip daddr @allow accept");
    rule("ip6 daddr @allow6 accept");
    // A domain-only address gets no UDP or ICMP (nothing checks a name there); its TCP
    // never comes here (redirected to the proxy, chain to_proxy).
    if policy.default_deny() {
        rule("jump denied");
    } else {
        rule("ip daddr @deny jump denied");
        rule("ip6 daddr @deny6 jump denied");
        rule("accept");
    }
    s
}

/// Adds DNS-learned addresses to `dns_allow`, each with its own timeout. `add` + `delete` +
/// `add` so that an address already there gets the new timeout.
pub fn learn_script(slot: u32, learned: &[(Ipv4Addr, Duration)]) -> String {
    let name = table_name(slot);
    let mut s = String::new();
    for (ip, ttl) in learned {
        let secs = ttl.as_secs().max(1);
        let _ = writeln!(
            s,
            "add element inet {name} dns_allow {{ {ip} timeout {secs}s }}\n\
             delete element inet {name} dns_allow {{ {ip} }}\n\
             add element inet {name} dns_allow {{ {ip} timeout {secs}s }}"
        );
    }
    s
}

/// Replaces the `peers` set: the guest addresses of the members of this sandbox's private
/// networks.
pub fn peers_script(slot: u32, peers: &[Ipv4Addr]) -> String {
    let name = table_name(slot);
    let mut s = format!("flush set inet {name} peers\n");
    if !peers.is_empty() {
        let list: Vec<String> = peers.iter().map(Ipv4Addr::to_string).collect();
        let _ = writeln!(s, "add element inet {name} peers {{ {} }}", list.join(", "));
    }
    s
}

fn add_elements<C: std::fmt::Display>(s: &mut String, table: &str, set: &str, nets: &[C]) {
    if nets.is_empty() {
        return;
    }
    let list: Vec<String> = nets.iter().map(C::to_string).collect();
    let _ = writeln!(
        s,
        "add element inet {table} {set} {{ {} }}",
        list.join(", ")
    );
}

pub fn apply(script: &str) -> Result<()> {
    cmd::nft_script(script)
}

/// Names of our tables (`sandcell_<n>`) present now, with their slot.
pub fn our_tables() -> Result<Vec<(String, u32)>> {
    let out = cmd::nft(&["list", "tables", "inet"])?;
    Ok(out
        .lines()
        .filter_map(|l| l.trim().strip_prefix("table inet "))
        .filter_map(|n| {
            let slot = n.strip_prefix(TABLE_PREFIX)?.parse().ok()?;
            Some((n.to_string(), slot))
        })
        .collect())
}

pub fn delete_table(slot: u32) -> Result<()> {
    let name = table_name(slot);
    cmd::nft_script(&format!(
        "add table inet {name}\ndelete table inet {name}\n"
    ))
}

/// One denied destination of a sandbox: what it tried to reach, as the kernel saw it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeniedFlow {
    pub dest: Ipv4Addr,
    /// `tcp` or `udp`.
    pub protocol: String,
    pub port: u16,
}

/// The denied TCP/UDP destinations seen in the last hour and the total count of denied
/// packets (all protocols, IPv6 included).
pub fn denied(slot: u32) -> Result<(Vec<DeniedFlow>, u64)> {
    let name = table_name(slot);
    let set = cmd::nft(&["-j", "list", "set", "inet", &name, "denied"])?;
    let counter = cmd::nft(&["-j", "list", "counter", "inet", &name, "denied_packets"])?;
    let parse = |what: &str, text: &str| -> Result<serde_json::Value> {
        serde_json::from_str(text).map_err(|e| Error::Parse {
            what: format!("`nft -j list {what}` of {name}"),
            problem: e.to_string(),
        })
    };
    let set = parse("set", &set)?;
    let counter = parse("counter", &counter)?;
    let mut flows = Vec::new();
    collect_concats(&set, &mut flows);
    let packets = find_key(&counter, "packets")
        .and_then(|v| v.as_u64())
        .unwrap_or(0);
    Ok((flows, packets))
}

fn collect_concats(v: &serde_json::Value, out: &mut Vec<DeniedFlow>) {
    match v {
        serde_json::Value::Object(m) => {
            if let Some(serde_json::Value::Array(c)) = m.get("concat")
                && let [ip, proto, port] = c.as_slice()
                && let Some(dest) = ip.as_str().and_then(|s| s.parse().ok())
            {
                let protocol = match proto {
                    serde_json::Value::String(s) => s.clone(),
                    serde_json::Value::Number(n) if n.as_u64() == Some(6) => "tcp".into(),
                    serde_json::Value::Number(n) if n.as_u64() == Some(17) => "udp".into(),
                    other => other.to_string(),
                };
                let port = port
                    .as_u64()
                    .and_then(|p| u16::try_from(p).ok())
                    .unwrap_or(0);
                out.push(DeniedFlow {
                    dest,
                    protocol,
                    port,
                });
                return;
            }
            m.values().for_each(|v| collect_concats(v, out));
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| collect_concats(v, out)),
        _ => {}
    }
}

fn find_key<'a>(v: &'a serde_json::Value, key: &str) -> Option<&'a serde_json::Value> {
    match v {
        serde_json::Value::Object(m) => m
            .get(key)
            .or_else(|| m.values().find_map(|v| find_key(v, key))),
        serde_json::Value::Array(a) => a.iter().find_map(|v| find_key(v, key)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::EgressSpec;

    fn spec() -> TableSpec {
        TableSpec {
            slot: 7,
            host_if: "sch7".into(),
            gateway: Ipv4Addr::new(10, 200, 0, 29),
            guest: Ipv4Addr::new(10, 200, 0, 30),
            pool: "10.200.0.0/16".parse().unwrap(),
            gateway6: "fd5c:5c5c:0:7::1".parse().unwrap(),
            guest6: "fd5c:5c5c:0:7::2".parse().unwrap(),
        }
    }

    #[test]
    fn default_deny_policy_ends_in_denied() {
        let p = Policy::from_spec(&EgressSpec {
            allow_internet_access: true,
            allow_out: vec![
                "1.2.3.0/24".into(),
                "169.254.169.254".into(),
                "192.168.1.0/24".into(),
                "10.0.0.0/8".into(),
                "a.com".into(),
            ],
            deny_out: vec![],
            rules: Default::default(),
        })
        .unwrap();
        let s = policy_script(
            &spec(),
            &p,
            &[(Ipv4Addr::new(5, 6, 7, 8), Duration::from_secs(60))],
        );
        assert!(
            s.contains("add element inet sandcell_7 allow { 1.2.3.0/24 }"),
            "{s}"
        );
        // link-local and the pool are cut out of what reserved entries open
        assert!(!s.contains("169.254"), "{s}");
        assert!(!s.contains("10.200.0.0"), "{s}");
        assert!(s.contains("192.168.1.0/24"), "{s}");
        assert!(
            s.contains("10.0.0.0/9") && s.contains("10.201.0.0/16"),
            "{s}"
        );
        assert!(s.contains("dns_allow { 5.6.7.8 timeout 60s }"), "{s}");
        assert!(s.trim_end().ends_with("egress jump denied"), "{s}");
    }

    #[test]
    fn open_policy_ends_in_accept_after_deny() {
        let p = Policy::from_spec(&EgressSpec {
            allow_internet_access: false,
            ..Default::default()
        })
        .unwrap();
        let s = policy_script(&spec(), &p, &[]);
        assert!(s.contains("deny { 0.0.0.0/0 }"), "{s}");
        assert!(s.contains("egress ip daddr @deny jump denied\n"), "{s}");
        assert!(s.trim_end().ends_with("egress accept"), "{s}");
        let c = create_script(&spec(), &p, &[]);
        assert!(c.contains(r#"ip saddr 10.200.0.30 oifname != "sch*" masquerade"#));
        assert!(c.contains("10.200.0.0/16"));
    }

    #[test]
    fn an_egress_proxy_takes_all_allowed_tcp_and_no_ipv6_tcp() {
        let proxy = crate::tunnel::EgressProxy {
            address: "203.0.113.9:1080".into(),
            ..Default::default()
        };
        let tunnel = Some(std::sync::Arc::new(proxy.parse().unwrap()));
        let mut open = Policy::from_spec(&EgressSpec::default()).unwrap();
        open.tunnel = tunnel.clone();
        let s = policy_script(&spec(), &open, &[]);
        let dnat = "meta l4proto tcp dnat ip to 10.200.0.29:15001";
        let rules: Vec<&str> = s.lines().filter(|l| l.contains(" to_proxy ")).collect();
        // What egress refuses is left to it; everything else is taken, in egress's order.
        assert_eq!(
            rules,
            [
                "add rule inet sandcell_7 to_proxy ip daddr @peers return".to_string(),
                "add rule inet sandcell_7 to_proxy tcp dport { 53, 853 } return".into(),
                format!("add rule inet sandcell_7 to_proxy ip daddr @allow_reserved {dnat}"),
                "add rule inet sandcell_7 to_proxy ip daddr @reserved return".into(),
                format!("add rule inet sandcell_7 to_proxy ip daddr @allow {dnat}"),
                format!("add rule inet sandcell_7 to_proxy ip daddr @dns_allow {dnat}"),
                "add rule inet sandcell_7 to_proxy ip daddr @deny return".into(),
                format!("add rule inet sandcell_7 to_proxy meta nfproto ipv4 {dnat}"),
            ]
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
            "{s}"
        );
        assert!(s.contains("egress meta nfproto ipv6 meta l4proto tcp jump denied"));
        // Default deny: only what is allowed goes to the proxy.
        let mut closed = Policy::from_spec(&EgressSpec {
            allow_out: vec!["a.com".into()],
            ..Default::default()
        })
        .unwrap();
        closed.tunnel = tunnel;
        let s = policy_script(&spec(), &closed, &[]);
        assert!(
            !s.contains("@deny return") && !s.contains("nfproto ipv4 meta"),
            "{s}"
        );
        // Without a proxy: as before, IP-allowed addresses go direct.
        let s = policy_script(&spec(), &Policy::open(), &[]);
        assert!(s.contains("to_proxy ip daddr @allow return"), "{s}");
        assert!(!s.contains("nfproto ipv6 meta l4proto tcp"), "{s}");
    }

    #[test]
    fn reads_denied_flows_from_nft_json() {
        let j: serde_json::Value = serde_json::from_str(
            r#"{"nftables":[{"metainfo":{}},{"set":{"name":"denied","elem":[
              {"elem":{"val":{"concat":["198.51.100.20","tcp",80]},"timeout":3600,"expires":3500}},
              {"concat":["1.1.1.1",17,53]}]}}]}"#,
        )
        .unwrap();
        let mut v = Vec::new();
        collect_concats(&j, &mut v);
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].dest, Ipv4Addr::new(198, 51, 100, 20));
        assert_eq!(v[0].port, 80);
        assert_eq!(v[1].protocol, "udp");
    }
}
