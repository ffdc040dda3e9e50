//! Networking of a gVisor sandbox (opt-in: [`crate::SandboxSpec::network`]). Without it the
//! sandbox runs with `--network=none` (loopback only), as before.
//!
//! With it, `sandcell-net` builds the sandbox's namespace `sc-<id>` (veth to the host,
//! egress policy, our DNS server on the gateway) BEFORE the bundle is written, because the
//! bundle names that namespace: runsc joins it (`linux.namespaces[network].path`) and, with
//! `--network=sandbox`, gVisor's own netstack takes over the veth end and its address and
//! route. The sandbox's `/etc/resolv.conf` (in its overlay, never the image) points at our
//! DNS server. The network is removed after the sandbox's processes are gone.

use super::RT;
use crate::{Error, Result};
use sandcell_net::{EgressSpec, NetConfig, NetRegistry, SandboxNet};
use std::path::Path;

/// Networking for a sandbox: its egress policy and the host-wide settings.
#[derive(Debug, Clone)]
pub struct NetworkSpec {
    pub egress: EgressSpec,
    pub config: NetConfig,
}

impl NetworkSpec {
    /// `egress` with the host's defaults (pool 10.200.0.0/16, the host's resolvers).
    pub fn from_host(egress: EgressSpec) -> Result<NetworkSpec> {
        let config =
            NetConfig::from_host().map_err(|e| net_error("reading the host's DNS settings", e))?;
        Ok(NetworkSpec { egress, config })
    }
}

fn net_error(what: &str, e: sandcell_net::Error) -> Error {
    match e {
        sandcell_net::Error::Policy(p) => Error::InvalidSpec {
            runtime: RT,
            problem: p.to_string(),
        },
        other => Error::io(RT, what.to_string(), std::io::Error::other(other)),
    }
}

/// Through the runtime's network registry: from its warm pool if one is installed (the
/// daemon's), and findable by the sandbox id ([`crate::Sandbox::network`]).
pub(super) async fn create(nets: &NetRegistry, id: &str, spec: &NetworkSpec) -> Result<SandboxNet> {
    nets.attach(&spec.config, id, &spec.egress)
        .await
        .map_err(|e| net_error(&format!("creating the network of sandbox {id}"), e))
}

/// `nameserver <gateway>` as the sandbox's resolv.conf (written through the overlay mount,
/// so it lands in the sandbox's upper layer).
pub(super) fn write_resolv_conf(rootfs: &Path, net: &SandboxNet) -> Result<()> {
    let file = rootfs.join("etc/resolv.conf");
    // A symlink (to systemd-resolved's file, or one a build step planted: the root's layers
    // can be a guest's) is replaced, never written through (crate::nofollow).
    let text = format!("nameserver {}\n", net.network().gateway);
    crate::nofollow::write_file_in(rootfs, Path::new("etc/resolv.conf"), text.as_bytes())
        .map_err(|e| Error::io(RT, format!("writing {}", file.display()), e))
}

pub(super) async fn teardown(id: &str, net: SandboxNet) -> Result<()> {
    net.teardown()
        .await
        .map_err(|e| net_error(&format!("removing the network of sandbox {id}"), e))
}

/// Removes what a sandbox of a dead owner left of its network; cheap when it had none.
pub(super) async fn remove_leftover(nets: &NetRegistry, id: &str) -> Result<()> {
    let what = format!("removing the leftover network of sandbox {id}");
    // One the runtime's registry holds (e.g. an adopted sandbox's, registered by the daemon).
    nets.release(id).await.map_err(|e| net_error(&what, e))?;
    let id = id.to_string();
    tokio::task::spawn_blocking(move || sandcell_net::network::remove(&id))
        .await
        .map_err(|e| Error::io(RT, what.clone(), std::io::Error::other(e)))?
        .map_err(|e| net_error(&what, e))
}

/// Makes `cmd` (runsc) start inside the network namespace open as `netns`, in a mount
/// namespace of its own where `/proc/sys/net/core` is hidden. `netns` must stay open until
/// the command is spawned.
///
/// Why: runsc 20221219 (Debian bookworm) takes its interfaces from the namespace it runs
/// in, and refuses to ("cannot run with network enabled in root network namespace") when
/// `/proc/sys/net/core/rmem_default` exists, its test for the root namespace; kernels since
/// 6.x have that file in every namespace. Newer runsc releases test differently; hiding the
/// directory from runsc alone (the sandbox never sees the host's /proc) is harmless there.
/// The mount namespace is a slave of the host's: our unmounts still reach it.
pub(super) fn enter_netns(cmd: &mut tokio::process::Command, netns: &std::fs::File) {
    use std::os::fd::AsRawFd;
    let fd = netns.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and only makes system calls
    // (setns, unshare, mount: async-signal-safe) with static C strings and a descriptor the
    // parent keeps open across the spawn; it allocates nothing. The child is
    // single-threaded there, so its namespace changes affect nothing else.
    unsafe {
        cmd.pre_exec(move || {
            let last = std::io::Error::last_os_error;
            if libc::setns(fd, libc::CLONE_NEWNET) != 0 || libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(last());
            }
            let none = std::ptr::null();
            if libc::mount(
                none,
                c"/".as_ptr(),
                none,
                libc::MS_REC | libc::MS_SLAVE,
                none.cast(),
            ) != 0
                || libc::mount(
                    c"tmpfs".as_ptr(),
                    c"/proc/sys/net/core".as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_RDONLY,
                    none.cast(),
                ) != 0
            {
                return Err(last());
            }
            Ok(())
        });
    }
}

/// Makes `cmd` start in the network namespace open as `netns` (nothing else changes).
/// `netns` must stay open until the command is spawned.
pub(super) fn join_netns(cmd: &mut tokio::process::Command, netns: &std::fs::File) {
    use std::os::fd::AsRawFd;
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

/// Gives the sandbox's interface its IPv4 and IPv6 addresses and default routes again, for a
/// restore into the namespace a checkpointed sandbox left: gVisor's netstack takes the
/// addresses over from the host interface when it starts (it deletes them there, so that the
/// host stack does not answer for them), and a restore builds its netstack from what the
/// namespace holds then ([`sandcell_net::Network::readdress`]).
pub(super) async fn readdress(net: &sandcell_net::Network) -> Result<()> {
    let net = net.clone();
    let what = format!("re-addressing the network {} for a restore", net.netns);
    tokio::task::spawn_blocking(move || net.readdress())
        .await
        .map_err(|e| Error::io(RT, what.clone(), std::io::Error::other(e)))?
        .map_err(|e| net_error(&what, e))
}
