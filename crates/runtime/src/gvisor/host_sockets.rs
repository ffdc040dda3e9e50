//! The Unix sockets a gVisor sandbox holds bound in its agent directory, read from the
//! host: runsc cannot checkpoint a sandbox holding one, and a failed save ends the sandbox,
//! so checkpoint.rs looks before it saves.
//!
//! With `--host-uds=create` a guest's `bind` in `/run/sandcell-host` (a host directory) is
//! done by runsc's gofer on the host; the gofer lists it in its network namespace's
//! `/proc/<pid>/net/unix` under the path the guest bound (`/run/sandcell-host/<name>`: the
//! gofer runs chrooted in the sandbox's root). The gofer and the sandbox process are
//! children of `runsc run`. The agent's own listener may linger there a while after the
//! agent closed it (the gofer closes lazily), so one `agent.sock` is tolerated; the guest
//! cannot bind that name while the agent's socket file exists (checkpoint.rs removes the
//! file only after this check).

use super::bundle::{AGENT_SOCKET, HOST_DIR_IN_SANDBOX};
use std::collections::BTreeSet;

/// Names of the sockets bound in the agent directory by a process of the sandbox whose
/// `runsc run` is `runsc_pid` (sorted; empty when there are none).
pub(crate) fn bound_in_agent_dir(runsc_pid: u32) -> Vec<String> {
    let tables: Vec<String> = children(runsc_pid)
        .into_iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/net/unix")).ok())
        .collect();
    offending(&tables)
}

/// The direct children of `pid`.
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// From `/proc/net/unix` tables: the names bound under the agent directory, one
/// `agent.sock` excepted (see the module docs).
fn offending(tables: &[String]) -> Vec<String> {
    let prefix = format!("{HOST_DIR_IN_SANDBOX}/");
    // (inode, name): one socket seen through several processes of one namespace is one.
    let mut bound: BTreeSet<(String, String)> = BTreeSet::new();
    for line in tables.iter().flat_map(|t| t.lines().skip(1)) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(inode), Some(path)) = (fields.get(6), fields.get(7)) else {
            continue;
        };
        if let Some(name) = path.strip_prefix(&prefix) {
            bound.insert(((*inode).to_string(), name.to_string()));
        }
    }
    let agent = bound.iter().filter(|(_, n)| n == AGENT_SOCKET).count();
    let mut names: Vec<String> = bound
        .into_iter()
        .map(|(_, n)| n)
        .filter(|n| n != AGENT_SOCKET || agent > 1)
        .collect();
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "Num       RefCount Protocol Flags    Type St Inode Path\n";

    #[test]
    fn guest_sockets_are_found_and_the_agents_lingering_one_is_not() {
        let gofer = format!(
            "{HEAD}000000000804a7a9: 00000002 00000000 00010000 0001 01 2001512 /run/sandcell-host/guest.sock\n\
             00000000653a9312: 00000002 00000000 00010000 0001 01 2001507 /run/sandcell-host/agent.sock\n\
             0000000090b14c0f: 00000002 00000000 00010000 0001 01 1993020 /tmp/x/runsc-sc-1.sock\n\
             0000000090b14c10: 00000003 00000000 00000000 0001 03 1993021\n"
        );
        // The same namespace read through a second process.
        let sandbox = gofer.clone();
        assert_eq!(offending(&[gofer, sandbox]), vec!["guest.sock".to_string()]);
    }

    #[test]
    fn a_second_agent_sock_is_the_guests() {
        let t = format!(
            "{HEAD}0: 00000002 00000000 00010000 0001 01 7 /run/sandcell-host/agent.sock\n\
             0: 00000002 00000000 00010000 0001 01 8 /run/sandcell-host/agent.sock\n"
        );
        assert_eq!(offending(&[t]), vec!["agent.sock".to_string()]);
        let one = format!(
            "{HEAD}0: 00000002 00000000 00010000 0001 01 7 /run/sandcell-host/agent.sock\n"
        );
        assert!(offending(&[one]).is_empty());
    }
}
