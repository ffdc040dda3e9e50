//! The jail of an idle pooled VMM (warm_pool.rs): made before its sandbox exists, so with
//! the largest sandbox's limits and under the pool slot's name, and given to the sandbox
//! when a create takes the VMM.
//!
//! At spawn ([`prepare`]): a uid of its own, a cgroup `sandcell/pool-<slot>`, and the
//! jail's two writable directories, `vmm/` in the slot's run and state dirs. No read-only
//! host path is bound: which template snapshot it will restore is not known yet, and a
//! running jail cannot be given a new mount by the daemon. At take:
//! - [`link_inputs`]: the snapshot's files (state, memory, base image, frozen layers) are
//!   hard-linked into the VMM's state directory. They are root's, mode 0644: the VMM reads
//!   them and can neither write nor re-own them. Links need one filesystem (the data dir
//!   holds template snapshots, images and sandbox state); otherwise the create boots cold.
//! - [`VmmJail::assign`]: the VMM moves into a cgroup of the sandbox's, of its size, before
//!   the restore maps guest memory (memory is charged where it is first touched).
//! - the caller renames the two writable directories to the sandbox's `vmm/` dirs. The VMM
//!   keeps seeing them where its jail bound them, at the slot's paths (a bind follows the
//!   directory, not its name), so what is sent to it names those ([`VmmView`]).

use super::{
    EXTRA_TASKS, JailError, JailInputs, JailPolicy, MEMORY_OVERHEAD_MIB, VmmJail, hand_over, io,
};
use crate::cgroup::{CgroupVersion, SandboxCgroup};
use std::path::{Path, PathBuf};

/// The largest sandbox a pooled VMM may become (`VmConfig`'s bounds): its rlimits are set
/// at exec, before the size is known. Its cgroup gets the real size at take.
const MAX_VCPUS: u8 = 32;
const MAX_MEMORY_MIB: u32 = 65_536;

/// The jail of an idle VMM of pool slot `name`, whose writable directories are made in
/// `slot_run` and `slot_state` (both the daemon's, mode 0700).
pub(in crate::microvm) fn prepare(
    policy: &JailPolicy,
    name: &str,
    slot_run: &Path,
    slot_state: &Path,
) -> Result<VmmJail, JailError> {
    VmmJail::prepare(
        policy,
        &JailInputs {
            id: name,
            run_dir: slot_run,
            state_dir: slot_state,
            reads: &[],
            vcpus: MAX_VCPUS,
            memory_mib: MAX_MEMORY_MIB,
            netns: None,
        },
    )
}

impl VmmJail {
    /// Makes this pooled VMM's jail sandbox `id`'s: the VMM moves into a cgroup of the
    /// sandbox's name (the sweep of a dead daemon's sandboxes finds it by the id), sized for
    /// `memory_mib` and `vcpus`, and the pool's cgroup goes. Before the restore maps guest
    /// memory: memory is charged to the cgroup it is first touched in.
    pub(in crate::microvm) fn assign(
        &mut self,
        id: &str,
        memory_mib: u32,
        vcpus: u8,
    ) -> Result<(), JailError> {
        let cgroup = |e| JailError::Cgroup(Box::new(e));
        let sized = SandboxCgroup::create(
            CgroupVersion::V2,
            id,
            memory_mib.saturating_add(MEMORY_OVERHEAD_MIB),
            vcpus,
        )
        .map_err(cgroup)?;
        let moved = sized
            .set_pids_max(u64::from(vcpus) + EXTRA_TASKS)
            .and_then(|()| self.cgroup.move_processes_to(&sized));
        if let Err(e) = moved {
            // The VMM stays in the pool's cgroup, which its discard removes.
            let _ = sized.remove();
            return Err(cgroup(e));
        }
        let pool = std::mem::replace(&mut self.cgroup, sized);
        pool.remove().map_err(cgroup)
    }
}

/// Hard-links each `(name, file)` into the pooled VMM's state directory `vmm_state` (its
/// jail's view and the host's are the same path until the directory is renamed), after
/// making each file root's and mode 0644 ([`hand_over`]). Returns the links, in order.
/// An existing name (the VMM may have made one) is an error, never replaced.
pub(in crate::microvm) fn link_inputs(
    vmm_state: &Path,
    files: &[(String, &Path)],
) -> Result<Vec<PathBuf>, JailError> {
    let mut links = Vec::with_capacity(files.len());
    for (name, file) in files {
        hand_over(file)?;
        let link = vmm_state.join(name);
        std::fs::hard_link(file, &link).map_err(io("linking the pooled VMM's input", &link))?;
        links.push(link);
    }
    Ok(links)
}

/// Where a pooled VMM sees the sandbox's `vmm/` directories: at the pool slot's paths its
/// jail bound, which the host renamed since.
#[derive(Debug, Clone)]
pub(in crate::microvm) struct VmmView {
    /// (the host's path now, the VMM's path) of the run and of the state directory.
    pub(in crate::microvm) run: (PathBuf, PathBuf),
    pub(in crate::microvm) state: (PathBuf, PathBuf),
}

impl VmmView {
    /// `host`, a path in one of the sandbox's `vmm/` directories, as the VMM names it;
    /// any other path as it is.
    pub(in crate::microvm) fn in_vmm(&self, host: &Path) -> PathBuf {
        for (now, seen) in [&self.run, &self.state] {
            if let Ok(rest) = host.strip_prefix(now) {
                return seen.join(rest);
            }
        }
        host.to_path_buf()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_in_the_renamed_directories_are_named_as_the_vmm_sees_them() {
        let view = VmmView {
            run: ("/run/s/sb1/vmm".into(), "/run/s/.vmm-pool/7-1/vmm".into()),
            state: (
                "/d/sandboxes/sb1/vmm".into(),
                "/d/sandboxes/.vmm-pool/7-1/vmm".into(),
            ),
        };
        assert_eq!(
            view.in_vmm(Path::new("/d/sandboxes/sb1/vmm/snapshot.3/vm.state")),
            Path::new("/d/sandboxes/.vmm-pool/7-1/vmm/snapshot.3/vm.state")
        );
        assert_eq!(
            view.in_vmm(Path::new("/run/s/sb1/vmm/vsock.sock")),
            Path::new("/run/s/.vmm-pool/7-1/vmm/vsock.sock")
        );
        // Not in either (a sibling whose name only starts alike): unchanged.
        assert_eq!(
            view.in_vmm(Path::new("/run/s/sb1/vmm2/x")),
            Path::new("/run/s/sb1/vmm2/x")
        );
    }

    #[test]
    fn inputs_are_linked_as_root_files_and_an_existing_name_is_not_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("mem");
        std::fs::write(&src, b"guest memory").unwrap();
        let vmm = tmp.path().join("vmm");
        std::fs::create_dir(&vmm).unwrap();
        let links = link_inputs(&vmm, &[("in.mem".into(), &src)]).unwrap();
        assert_eq!(std::fs::read(&links[0]).unwrap(), b"guest memory");
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(&links[0]).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o644));
        // The VMM made the name first (here a link to another file): refused, left alone.
        let other = tmp.path().join("other");
        std::fs::write(&other, b"x").unwrap();
        std::os::unix::fs::symlink(&other, vmm.join("in.state")).unwrap();
        assert!(link_inputs(&vmm, &[("in.state".into(), &src)]).is_err());
        assert_eq!(std::fs::read(&other).unwrap(), b"x");
    }
}
