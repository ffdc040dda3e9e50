//! A bound on what a template build's RUN steps write on the host (issue 12, "Builds").
//!
//! A RUN step's root writes land in an overlayfs upper layer on the host (build_steps.rs).
//! With a [`BuildDisk`], that upper and its work dir live on a disk of the step's own: a
//! sparse ext4 file next to the layer being made (`<pending>/disk.ext4`), formatted and
//! loop-mounted by the host at `<pending>/disk` exactly as a sandbox's disk
//! (gvisor/disk.rs). The guest only ever writes files through runsc's gofer; the file's
//! blocks are written by the host's ext4 driver alone. So a step that writes past the disk
//! gets ENOSPC inside (a hard bound, no overshoot), and the host's data disk loses at most
//! the disk's size.
//!
//! The disk of a step is as large as what is left of the build's limit (`limit_mib` minus
//! what earlier RUN steps of the build kept), and never larger than the data disk's free
//! space above `host_reserve_mib`. A step that succeeds is copied out of its disk into the
//! layer directory (the layer cache lives on the data disk; a cross-device rename cannot
//! move it) with the snapshot flattener's rules (gvisor/flatten.rs: no link followed,
//! whiteouts and opaque directories kept, bounded in bytes), and the disk is unmounted and
//! deleted whatever happened. A crashed build's disk is unmounted and removed with the rest
//! of its pending layer by the next build's sweep (image crate, `sweep_abandoned`).
//!
//! Chosen over gVisor's own overlay (its upper lives in the sentry's memory or a file the
//! host does not see as a layer: the step's result must be a host directory) and over a
//! watchdog summing the layer's blocks (its overshoot is the write rate times its period).

use crate::gvisor::disk;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

const MIB: u64 = 1 << 20;
/// How a step's output (and the daemon's build reason) says the step filled its disk.
pub const FULL_PREFIX: &str = "sandcell: the step filled its disk of ";
/// A disk left with less free space than this after a failed step was filled by it.
const FULL_MARGIN: u64 = 4 * MIB;

/// Why a RUN step could not get its disk, or its layer out of it.
#[derive(Debug, thiserror::Error)]
pub enum BuildDiskError {
    #[error(
        "the build's RUN steps already wrote {used_mib} MiB of its limit of {limit_mib} MiB \
         (sandcell serve --build-disk-mib, sandcell template build --disk-mib): {left_mib} MiB \
         is left, less than a step's disk needs ({min_mib} MiB); write less in earlier steps \
         (remove caches in the step that makes them) or raise the limit"
    )]
    LimitReached {
        used_mib: u64,
        limit_mib: u32,
        left_mib: u64,
        min_mib: u32,
    },
    #[error(
        "the host's data disk has {free_mib} MiB free, {reserve_mib} MiB of which it keeps \
         (sandcell serve --min-free-disk-mib): no room for a RUN step's disk of at least \
         {min_mib} MiB; free space on the data disk (sandcell template prune) and build again"
    )]
    HostFull {
        free_mib: u64,
        reserve_mib: u64,
        min_mib: u32,
    },
    #[error("the step's layer directory {} has no parent to put its disk in", upper.display())]
    NoParent { upper: PathBuf },
    #[error("making the step's disk of {mib} MiB: {source}")]
    Make {
        mib: u32,
        #[source]
        source: crate::Error,
    },
    #[error("preparing the step's disk at {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "copying the step's layer out of its disk: {source}; \
         the layer may hold hard links, which are copied as separate files"
    )]
    CopyOut {
        #[source]
        source: crate::gvisor::flatten::FlattenError,
    },
    #[error("removing the step's disk: {source}")]
    Remove {
        #[source]
        source: crate::Error,
    },
}

/// The limit of one build's RUN writes, and what its steps kept so far.
#[derive(Debug)]
pub struct BuildDisk {
    limit_mib: u32,
    host_reserve_mib: u64,
    used: AtomicU64,
}

impl BuildDisk {
    /// A build whose RUN steps may keep `limit_mib` MiB in all, on a data disk that keeps
    /// `host_reserve_mib` MiB free.
    pub fn new(limit_mib: u32, host_reserve_mib: u64) -> BuildDisk {
        BuildDisk {
            limit_mib,
            host_reserve_mib,
            used: AtomicU64::new(0),
        }
    }

    pub fn limit_mib(&self) -> u32 {
        self.limit_mib
    }

    /// Bytes the build's successful RUN steps kept so far.
    pub fn used_bytes(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Makes and mounts the disk of the step whose layer is `upper` (its parent, the
    /// pending layer's directory, holds the disk).
    pub async fn prepare(&self, upper: &Path) -> Result<StepDisk, BuildDiskError> {
        let dir = upper
            .parent()
            .ok_or_else(|| BuildDiskError::NoParent {
                upper: upper.to_path_buf(),
            })?
            .to_path_buf();
        let used = self.used_bytes();
        let left = (u64::from(self.limit_mib) * MIB).saturating_sub(used);
        let min = u64::from(disk::MIN_DISK_MIB) * MIB;
        if left < min {
            return Err(BuildDiskError::LimitReached {
                used_mib: used / MIB,
                limit_mib: self.limit_mib,
                left_mib: left / MIB,
                min_mib: disk::MIN_DISK_MIB,
            });
        }
        let mut size = left;
        let mut bound = Bound::Limit;
        if let Some(st) = disk::statvfs(&dir) {
            let free = st.f_bavail.saturating_mul(st.f_frsize);
            let room = free.saturating_sub(self.host_reserve_mib * MIB);
            if room < min {
                return Err(BuildDiskError::HostFull {
                    free_mib: free / MIB,
                    reserve_mib: self.host_reserve_mib,
                    min_mib: disk::MIN_DISK_MIB,
                });
            }
            if room < size {
                size = room;
                bound = Bound::HostFree;
            }
        }
        let mib = u32::try_from(size / MIB).unwrap_or(u32::MAX);
        let step = StepDisk {
            file: dir.join("disk.ext4"),
            mount: dir.join("disk"),
            mib,
            bound,
            limit_mib: self.limit_mib,
            used_before: used,
        };
        if let Err(source) = disk::make(&step.file, &step.mount, mib).await {
            let _ = step.remove();
            return Err(BuildDiskError::Make { mib, source });
        }
        for sub in [step.upper(), step.work()] {
            if let Err(source) = std::fs::create_dir(&sub) {
                let _ = step.remove();
                return Err(BuildDiskError::Io { path: sub, source });
            }
        }
        Ok(step)
    }

    /// Copies the step's layer out of its disk into `upper` (an empty directory, replaced)
    /// and counts it against the build's limit.
    pub fn copy_out(&self, step: &StepDisk, upper: &Path) -> Result<u64, BuildDiskError> {
        let io = |source| BuildDiskError::Io {
            path: upper.to_path_buf(),
            source,
        };
        std::fs::remove_dir(upper).map_err(io)?;
        let left = (u64::from(self.limit_mib) * MIB).saturating_sub(self.used_bytes());
        let copied = crate::gvisor::flatten::flatten(&[&step.upper()], upper, left)
            .map_err(|source| BuildDiskError::CopyOut { source })?;
        self.used.fetch_add(copied.bytes, Ordering::Relaxed);
        Ok(copied.bytes)
    }
}

/// What sized a step's disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// What is left of the build's limit.
    Limit,
    /// The data disk's free space above the host's reserve.
    HostFree,
}

/// A RUN step's mounted disk: the overlay's upper and work dirs are on it.
#[derive(Debug)]
pub struct StepDisk {
    file: PathBuf,
    mount: PathBuf,
    mib: u32,
    bound: Bound,
    limit_mib: u32,
    used_before: u64,
}

impl StepDisk {
    /// The overlay upper dir on the disk.
    pub fn upper(&self) -> PathBuf {
        self.mount.join("upper")
    }

    pub fn work(&self) -> PathBuf {
        self.mount.join("work")
    }

    pub fn mib(&self) -> u32 {
        self.mib
    }

    /// Whether the step left (nearly) no free space on its disk.
    pub fn is_full(&self) -> bool {
        disk::statvfs(&self.mount)
            .is_some_and(|st| st.f_bavail.saturating_mul(st.f_frsize) < FULL_MARGIN)
    }

    /// What a step that filled its disk is told (appended to its output).
    pub fn full_message(&self) -> String {
        match self.bound {
            Bound::Limit => format!(
                "{FULL_PREFIX}{} MiB (No space left on device): the \
                 build's RUN steps may write {} MiB in all (sandcell serve --build-disk-mib, \
                 sandcell template build --disk-mib), {} MiB of which earlier steps kept; \
                 write less in this step or raise the limit\n",
                self.mib,
                self.limit_mib,
                self.used_before / MIB
            ),
            Bound::HostFree => format!(
                "{FULL_PREFIX}{} MiB (No space left on device), all \
                 the host's data disk had free above what it keeps (sandcell serve \
                 --min-free-disk-mib); free space on the data disk (sandcell template prune) \
                 and build again\n",
                self.mib
            ),
        }
    }

    /// Unmounts and deletes the disk (what the step wrote goes with it).
    pub fn remove(&self) -> Result<(), BuildDiskError> {
        disk::unmount_and_delete(&self.mount, &self.file)
            .map_err(|source| BuildDiskError::Remove { source })?;
        match std::fs::remove_dir(&self.mount) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(BuildDiskError::Io {
                path: self.mount.clone(),
                source: e,
            }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_spent_limit_is_refused_naming_it() {
        let d = BuildDisk::new(100, 0);
        d.used.store(50 * MIB, Ordering::Relaxed);
        let e = d
            .prepare(Path::new("/nonexistent/pending/tree"))
            .await
            .unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, BuildDiskError::LimitReached { .. }), "{text}");
        assert!(text.contains("50 MiB of its limit of 100 MiB"), "{text}");
        assert!(text.contains("--build-disk-mib"), "{text}");
    }
}
