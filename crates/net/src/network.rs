//! One sandbox network: a named network namespace `sc-<id>` holding one end of a veth pair
//! (`scg<n>`, the sandbox's interface), the other end (`sch<n>`) on the host with the first
//! address of the /30 block `n` of the pool; NAT, policy and log in the table
//! `inet sandcell_<n>` (nft.rs); our DNS server on the host end's address (dns/).
//!
//! Naming is the bookkeeping: the host veth's alias is `sandcell:<id>`, the table is named by
//! the slot in the veth's name, the namespace by the id, so [`reconcile`] finds leftovers of
//! a crashed owner from the host's state alone.
//!
//! These functions block (they run `ip` and `nft`): call them from `spawn_blocking`. No
//! `setns` happens here (`ip -n` does it in its own process); runtimes put their sandbox in
//! the namespace through its path ([`Network::netns_path`]).

use crate::cmd::ip;
use crate::nft::{self, TableSpec};
use crate::policy::{Cidr, Policy};
use crate::{Error, Result};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

pub const NETNS_PREFIX: &str = "sc-";
pub const HOST_IF_PREFIX: &str = "sch";
pub const GUEST_IF_PREFIX: &str = "scg";
pub const ALIAS_PREFIX: &str = "sandcell:";
const SYSFS_NET: &str = "/sys/class/net";
const LOCK_FILE: &str = "/run/sandcell-net.lock";

/// Host-wide settings of sandbox networks.
#[derive(Debug, Clone)]
pub struct NetConfig {
    /// Where the /30 blocks come from; also always blocked as a destination.
    pub pool: Cidr,
    /// The resolvers our DNS server forwards allowed names to; by default the host's
    /// (`/etc/resolv.conf`).
    pub upstream_dns: Vec<std::net::SocketAddr>,
    /// Private ranges rules may open (`--allow-private-egress`; reserved.rs). Default none.
    pub allow_private: crate::reserved::AllowPrivate,
}

impl NetConfig {
    /// Pool 10.200.0.0/16, the host's resolvers.
    pub fn from_host() -> Result<NetConfig> {
        let text = std::fs::read_to_string("/etc/resolv.conf")
            .map_err(|e| Error::io("reading /etc/resolv.conf", e))?;
        let upstream_dns = resolvers_of(&text);
        if upstream_dns.is_empty() {
            return Err(Error::Config(
                "no IPv4 nameserver in /etc/resolv.conf for the sandboxes' DNS".into(),
            ));
        }
        Ok(NetConfig {
            pool: Cidr {
                addr: Ipv4Addr::new(10, 200, 0, 0),
                prefix: 16,
            },
            upstream_dns,
            allow_private: Default::default(),
        })
    }

    /// What rules and names may lead this host's sandboxes to (reserved.rs).
    pub fn destinations(&self) -> crate::reserved::Destinations {
        crate::reserved::Destinations {
            pool: self.pool,
            private: self.allow_private.clone(),
        }
    }
}

/// IPv4 `nameserver` lines of a resolv.conf, port 53.
pub fn resolvers_of(resolv_conf: &str) -> Vec<std::net::SocketAddr> {
    resolv_conf
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse::<Ipv4Addr>().ok())
        .map(|a| std::net::SocketAddr::from((a, 53)))
        .collect()
}

/// The host-side objects of one sandbox network (no DNS server: see [`crate::SandboxNet`]).
#[derive(Debug, Clone)]
pub struct Network {
    pub id: String,
    pub slot: u32,
    pub netns: String,
    pub host_if: String,
    pub guest_if: String,
    /// Host end: the sandbox's gateway and DNS server.
    pub gateway: Ipv4Addr,
    /// Sandbox end.
    pub guest: Ipv4Addr,
    pub prefix: u8,
    pub pool: Cidr,
}

impl Network {
    /// The names and addresses of network `id` in slot `slot` of the pool.
    fn at_slot(cfg: &NetConfig, id: &str, slot: u32) -> Network {
        let base = u32::from(cfg.pool.addr) + slot * 4;
        Network {
            id: id.to_string(),
            slot,
            netns: format!("{NETNS_PREFIX}{id}"),
            host_if: format!("{HOST_IF_PREFIX}{slot}"),
            guest_if: format!("{GUEST_IF_PREFIX}{slot}"),
            gateway: Ipv4Addr::from(base + 1),
            guest: Ipv4Addr::from(base + 2),
            prefix: 30,
            pool: cfg.pool,
        }
    }

    /// The network `id` made earlier (by this or a dead process), if its veth and namespace
    /// are still there: what a restarted owner takes over.
    pub fn find(cfg: &NetConfig, id: &str) -> Result<Option<Network>> {
        let slot = used_slots()?
            .into_iter()
            .find(|s| alias_of(&format!("{HOST_IF_PREFIX}{s}")).as_deref() == Some(id));
        let found = slot.map(|slot| Network::at_slot(cfg, id, slot));
        Ok(found.filter(|n| n.netns_path().exists()))
    }

    /// The host end's IPv6 address (`fd5c:5c5c:<slot>::1/64`, unique local: the slot is
    /// unique on the host, so is the /64), the sandbox's IPv6 gateway.
    pub fn gateway6(&self) -> Ipv6Addr {
        slot_v6(self.slot, 1)
    }

    /// The sandbox end's IPv6 address (`fd5c:5c5c:<slot>::2/64`).
    pub fn guest6(&self) -> Ipv6Addr {
        slot_v6(self.slot, 2)
    }

    pub fn netns_path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.netns)
    }

    pub(crate) fn table_spec(&self) -> TableSpec {
        TableSpec {
            slot: self.slot,
            host_if: self.host_if.clone(),
            gateway: self.gateway,
            guest: self.guest,
            pool: self.pool,
            gateway6: self.gateway6(),
            guest6: self.guest6(),
        }
    }

    /// Builds the network of sandbox `id` with `policy` in force from the first packet.
    ///
    /// Order matters:
    /// 1. forwarding on (idempotent, host-wide; nothing of ours works without it);
    /// 2. a slot, under a host-wide file lock, claimed by creating the veth pair: the host
    ///    end's name `sch<n>` is the claim other processes see. The peer is created directly
    ///    inside the new namespace, so the sandbox's end never exists in the host namespace;
    /// 3. the nftables table (NAT + policy) BEFORE any link is up: no packet of the sandbox
    ///    ever passes unfiltered;
    /// 4. addresses, links up, the sandbox's default route (last: the first moment the
    ///    sandbox can send anything).
    ///
    /// On failure everything made so far is removed.
    pub fn create(cfg: &NetConfig, id: &str, policy: &Policy) -> Result<Network> {
        if !valid_id(id) {
            return Err(Error::Config(format!(
                "bad sandbox id {id:?} for a network"
            )));
        }
        if cfg.pool.prefix > 29 {
            return Err(Error::Config(format!("pool {} is too small", cfg.pool)));
        }
        enable_forwarding()?;
        let netns = format!("{NETNS_PREFIX}{id}");
        ip(&["netns", "add", &netns])?;
        let net = match claim_slot(cfg, id, &netns) {
            Ok(net) => net,
            Err(e) => {
                let _ = ip(&["netns", "delete", &netns]);
                return Err(e);
            }
        };
        if let Err(e) = net.configure(policy) {
            let _ = net.teardown();
            return Err(e);
        }
        Ok(net)
    }

    fn configure(&self, policy: &Policy) -> Result<()> {
        nft::apply(&nft::create_script(&self.table_spec(), policy, &[]))?;
        let (h, g, ns) = (&self.host_if, &self.guest_if, &self.netns);
        let gw = format!("{}/{}", self.gateway, self.prefix);
        let guest = format!("{}/{}", self.guest, self.prefix);
        ip(&["addr", "add", &gw, "dev", h])?;
        ip(&["link", "set", h, "up"])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
        ip(&["-n", ns, "addr", "add", &guest, "dev", g])?;
        ip(&["-n", ns, "link", "set", g, "up"])?;
        // IPv6 the same way (nodad: the addresses are ours alone, and duplicate address
        // detection would hold them unusable for a second or more).
        let gw6 = format!("{}/64", self.gateway6());
        let guest6 = format!("{}/64", self.guest6());
        ip(&["-6", "addr", "add", &gw6, "dev", h, "nodad"])?;
        ip(&["-n", ns, "-6", "addr", "add", &guest6, "dev", g, "nodad"])?;
        ip(&[
            "-n",
            ns,
            "route",
            "add",
            "default",
            "via",
            &self.gateway.to_string(),
        ])?;
        ip(&[
            "-n",
            ns,
            "-6",
            "route",
            "add",
            "default",
            "via",
            &self.gateway6().to_string(),
        ])?;
        Ok(())
    }

    /// Gives the sandbox's interface its IPv4 and IPv6 addresses and default routes again
    /// (idempotent): for a restore into a namespace a checkpointed gVisor sandbox left
    /// (gVisor's netstack takes the addresses over from the interface, deleting them
    /// there, and a restore builds its netstack from what the namespace holds then).
    pub fn readdress(&self) -> Result<()> {
        let (g, ns) = (&self.guest_if, &self.netns);
        let guest = format!("{}/{}", self.guest, self.prefix);
        let guest6 = format!("{}/64", self.guest6());
        ip(&["-n", ns, "addr", "replace", &guest, "dev", g])?;
        ip(&[
            "-n", ns, "-6", "addr", "replace", &guest6, "dev", g, "nodad",
        ])?;
        ip(&["-n", ns, "link", "set", g, "up"])?;
        let gw = self.gateway.to_string();
        ip(&["-n", ns, "route", "replace", "default", "via", &gw])?;
        let gw6 = self.gateway6().to_string();
        ip(&["-n", ns, "-6", "route", "replace", "default", "via", &gw6])?;
        Ok(())
    }

    /// Replaces the policy atomically; `learned` are DNS answers to keep (see dns/).
    pub fn set_policy(
        &self,
        policy: &Policy,
        learned: &[(Ipv4Addr, std::time::Duration)],
    ) -> Result<()> {
        nft::apply(&nft::policy_script(&self.table_spec(), policy, learned))
    }

    /// Removes the table, the namespace and the veth pair (deleting the namespace deletes
    /// its veth end, and with it the pair). Keeps going on errors, reports the first.
    pub fn teardown(&self) -> Result<()> {
        let _lock = HostLock::take()?;
        remove_parts(&self.netns, &self.host_if, self.slot, Some(&self.id))
    }
}

/// Removes a network's parts. The caller holds the [`HostLock`]: the slot (the veth's and
/// the table's name) is only ever touched while it is provably this network's, i.e. its
/// veth carries `owner`'s alias (`None`: a nameless leftover, found under the same lock).
/// Order: the table and the veth first (while they are ours; deleting the veth frees the
/// slot for the next claim), then the namespace (named by the id, never reused).
fn remove_parts(netns: &str, host_if: &str, slot: u32, owner: Option<&str>) -> Result<()> {
    let mut first = None;
    let link_exists = PathBuf::from(SYSFS_NET).join(host_if).exists();
    let ours = alias_of(host_if).as_deref() == owner;
    if ours || !link_exists {
        // The table first: while the link still exists, no packet passes without its
        // rules. (No link: a table alone is left only by a crash between the two steps.)
        if (ours || owner.is_none())
            && let Err(e) = nft::delete_table(slot)
        {
            first.get_or_insert(e);
        }
        if link_exists
            && let Err(e) = ip(&["link", "delete", host_if])
            && PathBuf::from(SYSFS_NET).join(host_if).exists()
        {
            first.get_or_insert(e);
        }
    }
    if PathBuf::from("/run/netns").join(netns).exists()
        && let Err(e) = ip(&["netns", "delete", netns])
    {
        first.get_or_insert(e);
    }
    first.map_or(Ok(()), Err)
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The address `host` of slot `slot`'s IPv6 /64.
fn slot_v6(slot: u32, host: u16) -> Ipv6Addr {
    let (hi, lo) = ((slot >> 16) as u16, slot as u16);
    Ipv6Addr::new(0xfd5c, 0x5c5c, hi, lo, 0, 0, 0, host)
}

/// Turns on IPv4 and IPv6 forwarding host-wide (idempotent): nothing of ours works without
/// it. IPv6 forwarding makes Linux ignore router advertisements on interfaces whose
/// `accept_ra` is 1: a host that takes its IPv6 default route from them must set
/// `accept_ra` to 2 on its uplink (documented in the README).
pub fn enable_forwarding() -> Result<()> {
    for path in [
        "/proc/sys/net/ipv4/ip_forward",
        "/proc/sys/net/ipv6/conf/all/forwarding",
    ] {
        if std::fs::read_to_string(path).is_ok_and(|v| v.trim() == "1") {
            continue;
        }
        std::fs::write(path, "1").map_err(|e| Error::io(format!("writing 1 to {path}"), e))?;
    }
    Ok(())
}

/// Host links named `sch<n>`: the slots in use.
fn used_slots() -> Result<Vec<u32>> {
    let dir =
        std::fs::read_dir(SYSFS_NET).map_err(|e| Error::io(format!("listing {SYSFS_NET}"), e))?;
    Ok(dir
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix(HOST_IF_PREFIX)?
                .parse()
                .ok()
        })
        .collect())
}

/// Takes the lowest free slot of the pool by creating its veth pair, under the lock.
fn claim_slot(cfg: &NetConfig, id: &str, netns: &str) -> Result<Network> {
    let _lock = HostLock::take()?;
    let used = used_slots()?;
    let slots = 1u32 << (30 - u32::from(cfg.pool.prefix));
    let slot = (0..slots)
        .find(|s| !used.contains(s))
        .ok_or_else(|| Error::PoolExhausted(cfg.pool.to_string()))?;
    let net = Network::at_slot(cfg, id, slot);
    ip(&[
        "link",
        "add",
        &net.host_if,
        "type",
        "veth",
        "peer",
        "name",
        &net.guest_if,
        "netns",
        netns,
    ])?;
    if let Err(e) = ip(&[
        "link",
        "set",
        &net.host_if,
        "alias",
        &format!("{ALIAS_PREFIX}{id}"),
    ]) {
        let _ = ip(&["link", "delete", &net.host_if]);
        return Err(e);
    }
    Ok(net)
}

/// An exclusive `flock` on [`LOCK_FILE`], released on drop (or when the process dies).
struct HostLock(std::fs::File);

impl HostLock {
    fn take() -> Result<HostLock> {
        use std::os::fd::AsRawFd;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK_FILE)
            .map_err(|e| Error::io(format!("opening {LOCK_FILE}"), e))?;
        // SAFETY: flock on a file descriptor we own; no memory is involved.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(Error::io(
                format!("locking {LOCK_FILE}"),
                std::io::Error::last_os_error(),
            ));
        }
        Ok(HostLock(f))
    }
}

impl Drop for HostLock {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: as in take; closing the file would release it too.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// The sandbox id of a host veth, from its alias.
fn alias_of(host_if: &str) -> Option<String> {
    let a = std::fs::read_to_string(PathBuf::from(SYSFS_NET).join(host_if).join("ifalias")).ok()?;
    a.trim().strip_prefix(ALIAS_PREFIX).map(String::from)
}

/// Removes the network of sandbox `id` if any part of it is left (its owner died). Looks
/// only at sysfs and /run/netns first: no process is spawned when there is nothing.
pub fn remove(id: &str) -> Result<()> {
    let _lock = HostLock::take()?;
    let netns = format!("{NETNS_PREFIX}{id}");
    let slot = used_slots()?
        .into_iter()
        .find(|s| alias_of(&format!("{HOST_IF_PREFIX}{s}")).as_deref() == Some(id));
    match slot {
        Some(slot) => remove_parts(&netns, &format!("{HOST_IF_PREFIX}{slot}"), slot, Some(id)),
        None if PathBuf::from("/run/netns").join(&netns).exists() => {
            ip(&["netns", "delete", &netns]).map(|_| ())
        }
        None => Ok(()),
    }
}

/// Removes every sandbox network on this host whose id `keep` rejects, and every part of
/// one that lost the rest (a table without its veth, a veth without alias, a namespace
/// `sc-*` without veth). Returns the ids (or names, for nameless parts) removed. Run it at
/// start-up with `keep` = the sandboxes still alive.
pub fn reconcile(keep: &dyn Fn(&str) -> bool) -> Result<Vec<String>> {
    let _lock = HostLock::take()?;
    let mut removed = Vec::new();
    let mut first: Option<Error> = None;
    let mut kept_slots = Vec::new();
    let mut kept_netns = Vec::new();
    for slot in used_slots()? {
        let host_if = format!("{HOST_IF_PREFIX}{slot}");
        match alias_of(&host_if) {
            Some(id) if keep(&id) => {
                kept_slots.push(slot);
                kept_netns.push(format!("{NETNS_PREFIX}{id}"));
            }
            owner => {
                let id = owner.clone().unwrap_or_else(|| host_if.clone());
                let netns = format!("{NETNS_PREFIX}{id}");
                match remove_parts(&netns, &host_if, slot, owner.as_deref()) {
                    Ok(()) => removed.push(id),
                    Err(e) => {
                        first.get_or_insert(e);
                    }
                }
            }
        }
    }
    match nft::our_tables() {
        Ok(tables) => {
            for (name, slot) in tables {
                if !kept_slots.contains(&slot) {
                    match nft::delete_table(slot) {
                        Ok(()) => removed.push(name),
                        Err(e) => {
                            first.get_or_insert(e);
                        }
                    }
                }
            }
        }
        Err(e) => {
            first.get_or_insert(e);
        }
    }
    if let Ok(dir) = std::fs::read_dir("/run/netns") {
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(id) = name.strip_prefix(NETNS_PREFIX) else {
                continue;
            };
            if kept_netns.contains(&name) || keep(id) {
                continue;
            }
            match ip(&["netns", "delete", &name]) {
                Ok(_) => removed.push(name),
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
    }
    match first {
        Some(e) if removed.is_empty() => Err(e),
        _ => Ok(removed),
    }
}
