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
//! on every policy change (hostcheck.rs). The table is read from `/proc/net/nf_conntrack`
//! (no process: every create with egress rules asks, and a fresh sandbox has nothing to
//! cut), or with `conntrack -L` where the kernel has no such file; entries are deleted
//! with `conntrack -D` (conntrack-tools); without it the change still applies to new
//! connections, and a warning says what was left open.

use crate::cmd;
use std::io::BufRead;
use std::net::IpAddr;

/// The host namespace's connection table, as the kernel prints it
/// (`CONFIG_NF_CONNTRACK_PROCFS`): one entry a line, in `conntrack -L`'s format behind a
/// leading family column.
const PROC_TABLE: &str = "/proc/net/nf_conntrack";

/// The destinations of the tracked connections from `source` (orig direction), distinct.
fn destinations(source: IpAddr) -> crate::Result<Vec<IpAddr>> {
    let mut dests = match std::fs::File::open(PROC_TABLE) {
        Ok(f) => from_table(std::io::BufReader::new(f), source)
            .map_err(|e| crate::Error::io(format!("reading {PROC_TABLE}"), e))?,
        Err(_) => {
            let family = if source.is_ipv4() { "ipv4" } else { "ipv6" };
            let src = source.to_string();
            let out = cmd::conntrack(&["-L", "-f", family, "-s", &src])?;
            out.lines().filter_map(first_dst).collect()
        }
    };
    dests.sort();
    dests.dedup();
    Ok(dests)
}

/// The orig-direction destinations of the entries whose orig-direction source is `source`.
/// Addresses are compared parsed: the kernel prints IPv6 ones uncompressed.
fn from_table(table: impl BufRead, source: IpAddr) -> std::io::Result<Vec<IpAddr>> {
    let mut dests = Vec::new();
    for line in table.lines() {
        let line = line?;
        let src = line
            .split_whitespace()
            .find_map(|t| t.strip_prefix("src="))
            .and_then(|a| a.parse::<IpAddr>().ok());
        if src == Some(source)
            && let Some(dst) = first_dst(&line)
        {
            dests.push(dst);
        }
    }
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

    #[test]
    fn reads_the_kernels_table_for_one_source() {
        let table = "\
ipv4     2 tcp      6 431999 ESTABLISHED src=10.201.0.2 dst=198.51.100.10 sport=40000 dport=80 src=198.51.100.10 dst=198.51.100.1 sport=80 dport=40000 [ASSURED] mark=0 zone=0 use=2
ipv4     2 udp      17 20 src=10.201.0.6 dst=1.1.1.1 sport=5000 dport=53 src=1.1.1.1 dst=10.201.0.6 sport=53 dport=5000 mark=0 zone=0 use=2
ipv4     2 tcp      6 100 TIME_WAIT src=198.51.100.10 dst=10.201.0.2 sport=80 dport=41000 src=10.201.0.2 dst=198.51.100.10 sport=41000 dport=80 mark=0 zone=0 use=2
ipv6     10 tcp      6 300 ESTABLISHED src=fd5c:5c5c:0000:0007:0000:0000:0000:0002 dst=2001:0db8:0100:0000:0000:0000:0000:0010 sport=1 dport=80 src=2001:0db8:0100:0000:0000:0000:0000:0010 dst=fd5c:5c5c:0000:0007:0000:0000:0000:0002 sport=80 dport=1 mark=0 zone=0 use=2
";
        let v4 = from_table(table.as_bytes(), "10.201.0.2".parse().unwrap()).unwrap();
        // Only entries it started: the reply-direction match (third line) is not its own.
        assert_eq!(v4, vec!["198.51.100.10".parse::<IpAddr>().unwrap()]);
        let v6 = from_table(table.as_bytes(), "fd5c:5c5c:0:7::2".parse().unwrap()).unwrap();
        assert_eq!(v6, vec!["2001:db8:100::10".parse::<IpAddr>().unwrap()]);
        assert!(
            from_table(table.as_bytes(), "10.9.9.9".parse().unwrap())
                .unwrap()
                .is_empty()
        );
    }
}
