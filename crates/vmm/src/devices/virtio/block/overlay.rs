//! Copy-on-write overlay over a read-only base image.
//!
//! The base image is opened read-only and never written. Every guest write lands in the
//! overlay file, whose format is ours ("SCOVL", version 1):
//!
//! ```text
//! offset 0     header, HEADER_SIZE (4 KiB) bytes, little endian:
//!                0  magic        8 bytes  b"SCOVL\0\0\0"
//!                8  version      u32      1
//!               12  chunk_size   u32      4096
//!               16  disk_size    u64      size in bytes of the virtual disk (= base size)
//!               24  bitmap_off   u64      HEADER_SIZE
//!               32  bitmap_len   u64      ceil(chunks / 8)
//!               40  data_off     u64      bitmap_off + bitmap_len rounded up to chunk_size
//!               48  checksum     u64      FNV-1a 64 of bytes 0..48
//!               rest zero
//! bitmap_off   one bit per chunk (bit i%8 of byte i/8): 1 = chunk i lives in the overlay
//! data_off     chunk i at data_off + i * chunk_size (a sparse file: unwritten chunks are
//!              holes and take no space)
//! ```
//!
//! Reads of chunks whose bit is clear come from the base. A write covering only part of
//! an unwritten chunk first copies that chunk up from the base. Durability: data is
//! written in place and the bitmap is kept in memory; `flush` (the guest's FLUSH)
//! syncs the data, then writes the dirty bitmap and syncs again, so a bit set on disk
//! always names a chunk whose data reached the disk before it. Writes not flushed may
//! be lost on a host crash, which is what virtio-blk promises.
//!
//! Reopening an existing overlay validates the header against the base (same disk
//! size) and refuses anything else. An exclusive `flock` keeps two VMMs off one overlay.
//! Layered disks (many immutable layers under one writable one) will build on this file.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

pub const OVERLAY_MAGIC: [u8; 8] = *b"SCOVL\0\0\0";
pub const OVERLAY_VERSION: u32 = 1;
pub const CHUNK_SIZE: u64 = 4096;
pub const HEADER_SIZE: u64 = 4096;
const HEADER_FIELDS_LEN: usize = 48;

#[derive(Debug, thiserror::Error)]
pub enum OverlayError {
    #[error("opening overlay {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("overlay {path} is in use by another process (flock): {source}")]
    Locked {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("I/O on overlay {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("overlay {path} is not a Sandcell overlay or is corrupt: {reason}")]
    BadHeader { path: PathBuf, reason: String },
    #[error(
        "overlay {path} was made for a {overlay_size}-byte disk, but the base is {base_size} bytes"
    )]
    SizeMismatch {
        path: PathBuf,
        overlay_size: u64,
        base_size: u64,
    },
}

/// Header of an overlay file; see the module documentation for the layout.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Header {
    disk_size: u64,
    bitmap_off: u64,
    bitmap_len: u64,
    data_off: u64,
}

impl Header {
    fn for_disk(disk_size: u64) -> Header {
        let chunks = disk_size.div_ceil(CHUNK_SIZE);
        let bitmap_len = chunks.div_ceil(8);
        let data_off = (HEADER_SIZE + bitmap_len).div_ceil(CHUNK_SIZE) * CHUNK_SIZE;
        Header {
            disk_size,
            bitmap_off: HEADER_SIZE,
            bitmap_len,
            data_off,
        }
    }

    fn encode(&self) -> [u8; HEADER_SIZE as usize] {
        let mut b = [0u8; HEADER_SIZE as usize];
        b[0..8].copy_from_slice(&OVERLAY_MAGIC);
        b[8..12].copy_from_slice(&OVERLAY_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(CHUNK_SIZE as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.disk_size.to_le_bytes());
        b[24..32].copy_from_slice(&self.bitmap_off.to_le_bytes());
        b[32..40].copy_from_slice(&self.bitmap_len.to_le_bytes());
        b[40..48].copy_from_slice(&self.data_off.to_le_bytes());
        let sum = fnv1a64(&b[..HEADER_FIELDS_LEN]);
        b[48..56].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// Parse and check a header; the error string says which field is wrong.
    fn decode(b: &[u8; HEADER_SIZE as usize]) -> Result<Header, String> {
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(a)
        };
        if b[0..8] != OVERLAY_MAGIC {
            return Err("bad magic".into());
        }
        if u64_at(48) != fnv1a64(&b[..HEADER_FIELDS_LEN]) {
            return Err("header checksum mismatch".into());
        }
        let version = u32_at(8);
        if version != OVERLAY_VERSION {
            return Err(format!("unsupported version {version}"));
        }
        let chunk = u32_at(12);
        if u64::from(chunk) != CHUNK_SIZE {
            return Err(format!("unsupported chunk size {chunk}"));
        }
        let h = Header {
            disk_size: u64_at(16),
            bitmap_off: u64_at(24),
            bitmap_len: u64_at(32),
            data_off: u64_at(40),
        };
        if h != Header::for_disk(h.disk_size) {
            return Err("bitmap/data offsets do not match the disk size".into());
        }
        Ok(h)
    }
}

/// 64-bit FNV-1a: enough to catch a torn or hand-edited header (not an integrity MAC).
fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A base image plus its writable copy-on-write overlay.
#[derive(Debug)]
pub struct Overlay {
    base: File,
    file: File,
    path: PathBuf,
    header: Header,
    bitmap: Vec<u8>,
    bitmap_dirty: bool,
    writable: bool,
}

impl Overlay {
    /// Open the overlay at `path` over `base` (of `base_size` bytes). Writable overlays
    /// are created if missing and locked exclusively; read-only ones must exist and are
    /// locked shared.
    pub fn open(
        base: File,
        base_size: u64,
        path: &Path,
        writable: bool,
    ) -> Result<Overlay, OverlayError> {
        let open_err = |source| OverlayError::Open {
            path: path.to_owned(),
            source,
        };
        let io_err = |source| OverlayError::Io {
            path: path.to_owned(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(writable)
            .create(writable)
            .truncate(false)
            .open(path)
            .map_err(open_err)?;
        let lock = if writable {
            libc::LOCK_EX
        } else {
            libc::LOCK_SH
        };
        // SAFETY: flock on a file descriptor we own; no memory is passed.
        if unsafe { libc::flock(file.as_raw_fd(), lock | libc::LOCK_NB) } != 0 {
            return Err(OverlayError::Locked {
                path: path.to_owned(),
                source: io::Error::last_os_error(),
            });
        }
        let len = file.metadata().map_err(io_err)?.len();
        let header = if len == 0 && writable {
            let header = Header::for_disk(base_size);
            // Bitmap zeroes first, header last: a crash in between leaves a file with a
            // bad magic, refused on reopen rather than misread.
            file.write_all_at(&vec![0u8; header.bitmap_len as usize], header.bitmap_off)
                .map_err(io_err)?;
            file.set_len(header.data_off).map_err(io_err)?;
            file.sync_data().map_err(io_err)?;
            file.write_all_at(&header.encode(), 0).map_err(io_err)?;
            file.sync_data().map_err(io_err)?;
            header
        } else {
            let mut raw = [0u8; HEADER_SIZE as usize];
            if len < HEADER_SIZE {
                return Err(OverlayError::BadHeader {
                    path: path.to_owned(),
                    reason: format!("file is {len} bytes, shorter than the header"),
                });
            }
            file.read_exact_at(&mut raw, 0).map_err(io_err)?;
            let header = Header::decode(&raw).map_err(|reason| OverlayError::BadHeader {
                path: path.to_owned(),
                reason,
            })?;
            if header.disk_size != base_size {
                return Err(OverlayError::SizeMismatch {
                    path: path.to_owned(),
                    overlay_size: header.disk_size,
                    base_size,
                });
            }
            if len < header.bitmap_off + header.bitmap_len {
                return Err(OverlayError::BadHeader {
                    path: path.to_owned(),
                    reason: format!("file is {len} bytes, too short for its bitmap"),
                });
            }
            header
        };
        let mut bitmap = vec![0u8; header.bitmap_len as usize];
        file.read_exact_at(&mut bitmap, header.bitmap_off)
            .map_err(io_err)?;
        Ok(Overlay {
            base,
            file,
            path: path.to_owned(),
            header,
            bitmap,
            bitmap_dirty: false,
            writable,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size of the virtual disk in bytes.
    pub fn disk_size(&self) -> u64 {
        self.header.disk_size
    }

    fn chunk_present(&self, chunk: u64) -> bool {
        self.bitmap
            .get((chunk / 8) as usize)
            .is_some_and(|b| b & (1 << (chunk % 8)) != 0)
    }

    fn mark_chunk(&mut self, chunk: u64) {
        if let Some(b) = self.bitmap.get_mut((chunk / 8) as usize) {
            *b |= 1 << (chunk % 8);
            self.bitmap_dirty = true;
        }
    }

    /// Number of chunks held by the overlay (for tests and metrics).
    pub fn chunks_written(&self) -> u64 {
        self.bitmap.iter().map(|b| u64::from(b.count_ones())).sum()
    }

    /// Read `buf.len()` bytes at `offset`; the caller checked the range is in the disk.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut done = 0usize;
        while done < buf.len() {
            let pos = offset + done as u64;
            let chunk = pos / CHUNK_SIZE;
            let in_overlay = self.chunk_present(chunk);
            // Extend the run while following chunks come from the same file.
            let mut end_chunk = chunk + 1;
            let last_chunk = (offset + buf.len() as u64 - 1) / CHUNK_SIZE;
            while end_chunk <= last_chunk && self.chunk_present(end_chunk) == in_overlay {
                end_chunk += 1;
            }
            let run_end = (end_chunk * CHUNK_SIZE).min(offset + buf.len() as u64);
            let len = (run_end - pos) as usize;
            let dst = &mut buf[done..done + len];
            if in_overlay {
                self.file.read_exact_at(dst, self.header.data_off + pos)?;
            } else {
                read_base(&self.base, dst, pos)?;
            }
            done += len;
        }
        Ok(())
    }

    /// Write `buf` at `offset`; the caller checked the range is in the disk.
    pub fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::from(io::ErrorKind::PermissionDenied));
        }
        if buf.is_empty() {
            return Ok(());
        }
        let end = offset + buf.len() as u64;
        let first = offset / CHUNK_SIZE;
        let last = (end - 1) / CHUNK_SIZE;
        // Only the edge chunks can be partially covered; copy them up before the write
        // so the bytes the guest does not overwrite keep the base's content.
        if !offset.is_multiple_of(CHUNK_SIZE) {
            self.copy_up(first)?;
        }
        if !end.is_multiple_of(CHUNK_SIZE) {
            self.copy_up(last)?;
        }
        self.file.write_all_at(buf, self.header.data_off + offset)?;
        for chunk in first..=last {
            self.mark_chunk(chunk);
        }
        Ok(())
    }

    /// Copy chunk `chunk` from the base into the overlay unless it is already there.
    fn copy_up(&mut self, chunk: u64) -> io::Result<()> {
        if self.chunk_present(chunk) {
            return Ok(());
        }
        let mut data = [0u8; CHUNK_SIZE as usize];
        read_base(&self.base, &mut data, chunk * CHUNK_SIZE)?;
        self.file
            .write_all_at(&data, self.header.data_off + chunk * CHUNK_SIZE)?;
        self.mark_chunk(chunk);
        Ok(())
    }

    /// Make every completed write durable (see the module documentation for the order).
    pub fn flush(&mut self) -> io::Result<()> {
        if !self.writable {
            return Ok(());
        }
        self.file.sync_data()?;
        if self.bitmap_dirty {
            self.file
                .write_all_at(&self.bitmap, self.header.bitmap_off)?;
            self.file.sync_data()?;
            self.bitmap_dirty = false;
        }
        Ok(())
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        // Best effort: keep what the guest wrote even if it never flushed. Errors have
        // nowhere to go here; an unflushed write may be lost by contract.
        let _ = self.flush();
    }
}

/// Read from the base, zero-filling past its end (the last chunk may be partial).
pub fn read_base(base: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match base.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => {
                buf[done..].fill(0);
                return Ok(());
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
