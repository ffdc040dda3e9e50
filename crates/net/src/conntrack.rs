//! Cutting connections a tightened policy no longer allows.
//!
//! nftables decides on a connection's first packet; later ones pass as `ct state
//! established` (nft.rs, chain `egress`). So a live policy change would leave a sandbox's
//! open connections to now-denied destinations running. After the new rules are in force,
//! [`flush`] deletes the conntrack entries (host namespace, where the sandbox's traffic is
//! tracked) of the sandbox's connections whose destination the new policy refuses: their
//! next packet is then judged as new, by the new rules, and refused (TCP gets a reset).
//!
//! Connections through the Host/SNI proxy end at the host: the proxy itself re-checks them
//! on every policy change (hostcheck.rs). Uses `conntrack` (conntrack-tools); without it
//! the change still applies to new connections, and a warning says what was left open.

use crate::cmd;
use std::net::IpAddr;

/// The destinations of the tracked connections from `source` (orig direction), distinct.
fn destinations(source: IpAddr) -> crate::Result<Vec<IpAddr>> {
    let family = if source.is_ipv4() { "ipv4" } else { "ipv6" };
    let src = source.to_string();
    let out = cmd::conntrack(&["-L", "-f", family, "-s", &src])?;
    let mut dests: Vec<IpAddr> = out.lines().filter_map(first_dst).collect();
    dests.sort();
    dests.dedup();
    Ok(dests)
}

/// The orig-direction `dst=` of one `conntrack -L` line.
pub(crate) fn first_dst(line: &str) -> Option<IpAddr> {
    line.split_whitespace()
        .find_map(|t| t.strip_prefix("dst="))
        .and_then(|a| a.parse().ok())
}

/// Deletes the tracked connections from `source` to every destination `keep` refuses;
/// how many destinations were cut.
pub fn flush(source: IpAddr, keep: impl Fn(IpAddr) -> bool) -> crate::Result<usize> {
    let mut cut = 0;
    for dst in destinations(source)? {
        if keep(dst) {
            continue;
        }
        let family = if source.is_ipv4() { "ipv4" } else { "ipv6" };
        let (s, d) = (source.to_string(), dst.to_string());
        // Exit status 1 when the entry went away meanwhile: that is the goal anyway.
        let _ = cmd::conntrack(&["-D", "-f", family, "-s", &s, "-d", &d]);
        cut += 1;
    }
    Ok(cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_original_destination() {
        let l = "tcp      6 431999 ESTABLISHED src=10.201.0.2 dst=198.51.100.10 sport=40000 \
                 dport=80 src=198.51.100.10 dst=198.51.100.1 sport=80 dport=40000 [ASSURED] \
                 mark=0 use=1";
        assert_eq!(first_dst(l), Some("198.51.100.10".parse().unwrap()));
        let l6 = "tcp 6 10 ESTABLISHED src=fd5c:5c5c:0:1::2 dst=2001:db8:100::10 sport=1 dport=80";
        assert_eq!(first_dst(l6), Some("2001:db8:100::10".parse().unwrap()));
        assert_eq!(first_dst("conntrack v1.4.7: 0 flow entries"), None);
    }
}
