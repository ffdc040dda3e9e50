//! Snapshots of sandboxes, shared by both runtimes: what one is made of ([`SnapshotHandle`],
//! also written as `snapshot.json` in the snapshot's directory) and what a restore changes
//! ([`RestoreSpec`]).
//!
//! A snapshot directory holds the runtime's own files:
//!
//! - gvisor ([`crate::gvisor`], checkpoint.rs): `checkpoint/` (`runsc checkpoint`'s image:
//!   every process, the sandbox's memory, and with `--overlay2=root:memory` the writes to
//!   its root), `upper/` (a copy of the host overlayfs upper layer at the checkpoint: the
//!   restored sandbox's root is a new upper over `[upper/, image tree]`; the root's layers
//!   flattened, see gvisor/flatten.rs). A filesystem-only pause has `upper/` alone.
//! - microvm ([`crate::microvm`], snapshot.rs): `vm.state`, `vm.mem` (full) or a symlink to
//!   the parent VMM's frozen memory (fork: valid while that VMM lives), and the frozen disk
//!   layers.
//!
//! Restores get a new id, new sockets and a new writable layer; everything else (processes,
//! memory, files) is the snapshot's. The caller then tells the agent the new identity with
//! `POST /init` (env vars, access token, wall clock).

use crate::{Error, Image, Result, RuntimeKind};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Version of `snapshot.json`; a different one is refused.
pub const SNAPSHOT_FORMAT: u32 = 1;
/// The manifest's file name in a snapshot directory.
pub const MANIFEST: &str = "snapshot.json";
/// Bound on reading a manifest (it is a few hundred bytes).
const MAX_MANIFEST: u64 = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotKind {
    /// Self-contained files: restorable after the sandbox (and the host) are gone.
    Full,
    /// As cheap as the runtime can make it for restores while the sandbox still runs
    /// (microvm: the memory is frozen in place, not written out; the snapshot lives only as
    /// long as the sandbox's VMM). gvisor has no cheaper way: same as `Full`.
    Fork,
}

/// Where the sandbox's root came from, so that a restore can find it again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotImage {
    pub name: String,
    pub rootfs_dir: Option<PathBuf>,
    pub rootfs_ext4: Option<PathBuf>,
}

impl From<&Image> for SnapshotImage {
    fn from(i: &Image) -> Self {
        SnapshotImage {
            name: i.name.clone(),
            rootfs_dir: i.rootfs_dir.clone(),
            rootfs_ext4: i.rootfs_ext4.clone(),
        }
    }
}

impl From<&SnapshotImage> for Image {
    fn from(i: &SnapshotImage) -> Self {
        Image {
            name: i.name.clone(),
            rootfs_dir: i.rootfs_dir.clone(),
            rootfs_ext4: i.rootfs_ext4.clone(),
        }
    }
}

/// The runtime's files of a snapshot (absolute paths, inside [`SnapshotHandle::dir`] except
/// where said).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "runtime", rename_all = "lowercase")]
pub enum SnapshotFiles {
    Gvisor {
        /// `runsc checkpoint --image-path`; `None`: a filesystem-only pause
        /// ([`crate::Sandbox::pause_files_to_disk`]), whose restore boots a fresh sandbox on
        /// the saved files.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        checkpoint_dir: Option<PathBuf>,
        /// The frozen copy of the host overlayfs upper layer.
        upper_dir: PathBuf,
        /// The sandbox's disk size ([`crate::SandboxSpec::disk_mib`]), if it had a disk: a
        /// restore gets one of the same size.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        disk_mib: Option<u32>,
    },
    Microvm {
        state: PathBuf,
        /// Full: a file. Fork: a `/proc/<pid>/fd/<n>` symlink into the parent VMM.
        memory: PathBuf,
        /// The read-only base image and the frozen layers above it, oldest first.
        disk_base: Option<PathBuf>,
        disk_layers: Vec<PathBuf>,
        /// A paused sandbox's writable top (pause to disk): each restore starts on a copy.
        #[serde(default)]
        disk_top: Option<PathBuf>,
        /// Fork: the parent VMM's pid; the memory is gone when it is.
        memory_owner_pid: Option<u32>,
        /// The VM has a virtio-net device (its TAP is opened by name when restored): a
        /// restore needs a network to put it in (microvm/network.rs).
        #[serde(default)]
        network: bool,
    },
}

/// A snapshot: plain data, stored by the caller (the daemon's database) or read back from
/// the snapshot directory with [`SnapshotHandle::load`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotHandle {
    pub format: u32,
    pub runtime: RuntimeKind,
    pub kind: SnapshotKind,
    pub dir: PathBuf,
    /// The sandbox it was taken of.
    pub source_id: String,
    pub image: SnapshotImage,
    pub vcpus: u8,
    pub memory_mib: u32,
    /// The environment the sandbox was created with (its processes keep it).
    pub env: BTreeMap<String, String>,
    pub files: SnapshotFiles,
}

impl SnapshotHandle {
    /// Writes `snapshot.json` into [`SnapshotHandle::dir`] (atomically).
    pub fn save(&self) -> Result<()> {
        let json = serde_json::to_vec_pretty(self)
            .map_err(|e| Error::host("encoding snapshot.json", e.into()))?;
        let path = self.dir.join(MANIFEST);
        crate::util::write_atomic(&path, &json)
            .map_err(|e| Error::host(format!("writing {}", path.display()), e))
    }

    /// Reads the snapshot in `dir`, refusing a missing, oversized, unparsable or
    /// other-version manifest, and one whose files are missing.
    pub fn load(dir: &Path) -> Result<SnapshotHandle> {
        let path = dir.join(MANIFEST);
        let corrupt = |problem: String| Error::Snapshot {
            path: path.clone(),
            problem,
        };
        let bytes = read_capped(&path, MAX_MANIFEST).map_err(|e| corrupt(e.to_string()))?;
        let handle: SnapshotHandle =
            serde_json::from_slice(&bytes).map_err(|e| corrupt(format!("not a manifest: {e}")))?;
        if handle.format != SNAPSHOT_FORMAT {
            return Err(corrupt(format!(
                "format {} (this Sandcell reads {SNAPSHOT_FORMAT})",
                handle.format
            )));
        }
        handle.check_files()?;
        Ok(handle)
    }

    /// Fails with [`Error::Snapshot`] naming the first file of the snapshot that is missing.
    pub fn check_files(&self) -> Result<()> {
        let missing = |path: &Path, what: &str| Error::Snapshot {
            path: path.to_path_buf(),
            problem: format!("{what} is missing"),
        };
        match &self.files {
            SnapshotFiles::Gvisor {
                checkpoint_dir,
                upper_dir,
                ..
            } => {
                if let Some(dir) = checkpoint_dir
                    && !dir.join("checkpoint.img").is_file()
                {
                    return Err(missing(dir, "the runsc checkpoint image"));
                }
                if !upper_dir.is_dir() {
                    return Err(missing(upper_dir, "the frozen root layer"));
                }
            }
            SnapshotFiles::Microvm {
                state,
                memory,
                disk_layers,
                disk_top,
                ..
            } => {
                if let Some(top) = disk_top.as_ref().filter(|t| !t.is_file()) {
                    return Err(missing(top, "the paused disk top"));
                }
                if !state.is_file() {
                    return Err(missing(state, "the VM state file"));
                }
                // A fork's memory is a /proc symlink: `exists` follows it.
                if !memory.exists() {
                    return Err(missing(
                        memory,
                        "the memory image (a fork snapshot lives only as long as its parent)",
                    ));
                }
                if let Some(layer) = disk_layers.iter().find(|l| !l.is_file()) {
                    return Err(missing(layer, "a disk layer"));
                }
            }
        }
        Ok(())
    }

    /// Removes the snapshot's directory.
    pub fn delete(&self) -> Result<()> {
        crate::util::remove_dir_all_if_exists(&self.dir)
            .map_err(|e| Error::host(format!("removing snapshot {}", self.dir.display()), e))
    }
}

fn read_capped(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(max + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::other(format!("larger than {max} bytes")));
    }
    Ok(bytes)
}

/// What a restored sandbox gets of its own.
#[derive(Debug, Clone)]
pub struct RestoreSpec {
    /// A new sandbox id (see [`crate::new_sandbox_id`]).
    pub id: String,
    /// How long [`crate::Runtime::restore`] waits for the restored agent to accept
    /// connections.
    pub boot_timeout: Duration,
    /// As [`crate::SandboxSpec::outlive_owner`].
    pub outlive_owner: bool,
    /// The restored sandbox's network, made new for it (gvisor: a new namespace and
    /// address; gVisor's netstack is rebuilt from that namespace on restore, so connections
    /// that were open at the snapshot are gone and programs see the new address). `None`:
    /// no network. [`crate::Sandbox::fork`] gives each child its parent's.
    pub network: Option<crate::NetworkSpec>,
}

impl RestoreSpec {
    pub fn new(id: String) -> RestoreSpec {
        RestoreSpec {
            id,
            boot_timeout: Duration::from_secs(30),
            outlive_owner: false,
            network: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(dir: &Path) -> SnapshotHandle {
        SnapshotHandle {
            format: SNAPSHOT_FORMAT,
            runtime: RuntimeKind::Gvisor,
            kind: SnapshotKind::Full,
            dir: dir.to_path_buf(),
            source_id: "sc-1".into(),
            image: SnapshotImage {
                name: "minimal".into(),
                rootfs_dir: Some("/i/rootfs".into()),
                rootfs_ext4: None,
            },
            vcpus: 1,
            memory_mib: 256,
            env: BTreeMap::new(),
            files: SnapshotFiles::Gvisor {
                checkpoint_dir: Some(dir.join("checkpoint")),
                upper_dir: dir.join("upper"),
                disk_mib: None,
            },
        }
    }

    #[test]
    fn manifest_round_trips_and_checks_its_files() {
        let tmp = tempfile::tempdir().unwrap();
        let h = handle(tmp.path());
        h.save().unwrap();
        let err = SnapshotHandle::load(tmp.path()).unwrap_err().to_string();
        assert!(err.contains("checkpoint image is missing"), "{err}");
        std::fs::create_dir_all(tmp.path().join("checkpoint")).unwrap();
        std::fs::write(tmp.path().join("checkpoint/checkpoint.img"), b"x").unwrap();
        std::fs::create_dir_all(tmp.path().join("upper")).unwrap();
        assert_eq!(SnapshotHandle::load(tmp.path()).unwrap(), h);
    }

    #[test]
    fn garbage_and_other_versions_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join(MANIFEST), b"{not json").unwrap();
        let err = SnapshotHandle::load(tmp.path()).unwrap_err().to_string();
        assert!(err.contains("not a manifest"), "{err}");
        let mut h = handle(tmp.path());
        h.format = 99;
        h.save().unwrap();
        let err = SnapshotHandle::load(tmp.path()).unwrap_err().to_string();
        assert!(err.contains("format 99"), "{err}");
        let none = tmp.path().join("nothing");
        assert!(SnapshotHandle::load(&none).is_err());
    }
}
