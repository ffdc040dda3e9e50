//! The storage behind a virtio-blk device: a read-only base image, optionally under
//! immutable copy-on-write layers and a writable top layer (`overlay.rs`).

use std::fs::File;
use std::io;
use std::path::PathBuf;

use super::overlay::{Overlay, OverlayError, read_base};

/// Sector size of the virtio-blk protocol.
pub const SECTOR_SIZE: u64 = 512;

/// How to build a block device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockConfig {
    /// Base image (raw). Opened read-only, never written.
    pub base: PathBuf,
    /// Writable top layer (created if missing). `None` makes a read-only disk.
    pub overlay: Option<PathBuf>,
    /// Immutable layers between the base and the top, oldest first.
    pub layers: Vec<PathBuf>,
    /// Expose the disk read-only even with an overlay (which must then exist).
    pub read_only: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("opening base image {path}: {source}")]
    OpenBase {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("base image {path} has {size} bytes, less than one 512-byte sector")]
    BaseTooSmall { path: PathBuf, size: u64 },
    #[error(transparent)]
    Overlay(#[from] OverlayError),
}

/// A disk image: the base alone (read-only) or base + overlay.
#[derive(Debug)]
pub enum Disk {
    Base { file: File, size: u64 },
    Overlay(Overlay),
}

impl Disk {
    pub fn open(cfg: &BlockConfig) -> Result<Disk, DiskError> {
        let open_err = |source| DiskError::OpenBase {
            path: cfg.base.clone(),
            source,
        };
        let base = File::open(&cfg.base).map_err(open_err)?;
        let size = base.metadata().map_err(open_err)?.len();
        if size < SECTOR_SIZE {
            return Err(DiskError::BaseTooSmall {
                path: cfg.base.clone(),
                size,
            });
        }
        Ok(match (&cfg.overlay, cfg.layers.is_empty()) {
            (None, true) => Disk::Base { file: base, size },
            (Some(path), true) => Disk::Overlay(Overlay::open(base, size, path, !cfg.read_only)?),
            (top, false) => {
                let mut layers = cfg.layers.clone();
                // A read-only disk reads its top like any other layer.
                let top = match (top, cfg.read_only) {
                    (Some(t), true) => {
                        layers.push(t.clone());
                        None
                    }
                    (t, _) => t.as_deref(),
                };
                Disk::Overlay(Overlay::open_chain(base, size, &layers, top)?)
            }
        })
    }

    /// Size in bytes of what the guest may address: whole sectors only.
    pub fn capacity(&self) -> u64 {
        let size = match self {
            Disk::Base { size, .. } => *size,
            Disk::Overlay(o) => o.disk_size(),
        };
        size / SECTOR_SIZE * SECTOR_SIZE
    }

    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match self {
            Disk::Base { file, .. } => read_base(file, buf, offset),
            Disk::Overlay(o) => o.read_at(buf, offset),
        }
    }

    pub fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        match self {
            Disk::Base { .. } => Err(io::Error::from(io::ErrorKind::PermissionDenied)),
            Disk::Overlay(o) => o.write_at(buf, offset),
        }
    }

    /// The layered disk, when there is one.
    pub fn overlay_mut(&mut self) -> Option<&mut Overlay> {
        match self {
            Disk::Base { .. } => None,
            Disk::Overlay(o) => Some(o),
        }
    }

    /// FLUSH: make completed writes durable (fdatasync on the overlay).
    pub fn flush(&mut self) -> io::Result<()> {
        match self {
            Disk::Base { .. } => Ok(()),
            Disk::Overlay(o) => o.flush(),
        }
    }
}
