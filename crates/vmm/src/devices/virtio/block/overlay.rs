//! Copy-on-write layers over a read-only base image: the SCOVL layer file format and the
//! layered disk ([`Overlay`]) built from a base, immutable layers and one writable top.
//!
//! The base image is opened read-only and never written. Every guest write lands in the
//! top layer. A layer file ("SCOVL", version 2; version 1 files are still read):
//!
//! ```text
//! offset 0     header, HEADER_SIZE (4 KiB) bytes, little endian:
//!                0  magic        8 bytes  b"SCOVL\0\0\0"
//!                8  version      u32      2 (1: fields up to data_off, checksum at 48)
//!               12  chunk_size   u32      4096
//!               16  disk_size    u64      size in bytes of the virtual disk (= base size)
//!               24  bitmap_off   u64      HEADER_SIZE
//!               32  bitmap_len   u64      ceil(chunks / 8)
//!               40  data_off     u64      bitmap_off + bitmap_len rounded up to chunk_size
//!               48  flags        u64      bit 0 FROZEN: immutable, never opened writable
//!               56  layer_id     u64      random, names this layer
//!               64  parent_id    u64      layer_id of the layer it was created over
//!                                         (0: directly over the base)
//!               72  checksum     u64      FNV-1a 64 of bytes 0..72
//!               rest zero
//! bitmap_off   one bit per chunk (bit i%8 of byte i/8): 1 = chunk i lives in this layer
//! data_off     chunk i at data_off + i * chunk_size (a sparse file: unwritten chunks are
//!              holes and take no space)
//! ```
//!
//! A disk is a chain: base, layers oldest first, then the top. Reads of a chunk come
//! from the newest layer that holds it ([`LayerIndex`] keeps that per chunk), else the
//! base. A write covering only part of a chunk the top lacks first copies that chunk up
//! from the chain's current view. The chain is checked when opened: every layer's
//! `parent_id` must be the `layer_id` below it, so layers cannot be reordered or mixed
//! between disks unnoticed.
//!
//! Freezing the top ([`Overlay::freeze_top`]) is O(1) in I/O: flush, set FROZEN in the
//! header, and start a new empty top whose parent is the frozen layer; the frozen file
//! becomes the chain's newest layer. [`flatten`] merges a chain into one layer directly
//! over the base, to bound chain length.
//!
//! Durability: data is written in place and the bitmap is kept in memory; `flush` (the
//! guest's FLUSH) syncs the data, then writes the dirty bitmap and syncs again, so a bit
//! set on disk always names a chunk whose data reached the disk before it. Writes not
//! flushed may be lost on a host crash, which is what virtio-blk promises. A writable
//! top is locked with an exclusive `flock`, read-only layers with shared ones, so no
//! layer is written while another VMM reads it.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

pub use super::layer_index::{LayerIndex, MAX_LAYERS};

pub const OVERLAY_MAGIC: [u8; 8] = *b"SCOVL\0\0\0";
pub const OVERLAY_VERSION: u32 = 2;
pub const CHUNK_SIZE: u64 = 4096;
pub const HEADER_SIZE: u64 = 4096;
const V1_FIELDS_LEN: usize = 48;
const V2_FIELDS_LEN: usize = 72;
const FLAG_FROZEN: u64 = 1;

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
    #[error("layer {path} is frozen (immutable): it cannot be a disk's writable top layer")]
    Frozen { path: PathBuf },
    #[error(
        "layer {path} was created over layer {parent:#x}, but the chain has {below:#x} below \
         it (0 = the base): layers out of order or from another disk"
    )]
    ChainMismatch {
        path: PathBuf,
        parent: u64,
        below: u64,
    },
    #[error("a chain of {0} layers is longer than the {MAX_LAYERS} allowed: flatten it")]
    TooManyLayers(usize),
    #[error("the disk has no writable top layer")]
    NoTop,
}

/// Header of a layer file; see the module documentation for the layout.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Header {
    version: u32,
    disk_size: u64,
    bitmap_off: u64,
    bitmap_len: u64,
    data_off: u64,
    flags: u64,
    layer_id: u64,
    parent_id: u64,
}

impl Header {
    fn new(disk_size: u64, parent_id: u64) -> Header {
        let chunks = disk_size.div_ceil(CHUNK_SIZE);
        let bitmap_len = chunks.div_ceil(8);
        let data_off = (HEADER_SIZE + bitmap_len).div_ceil(CHUNK_SIZE) * CHUNK_SIZE;
        Header {
            version: OVERLAY_VERSION,
            disk_size,
            bitmap_off: HEADER_SIZE,
            bitmap_len,
            data_off,
            flags: 0,
            layer_id: random_id(),
            parent_id,
        }
    }

    fn frozen(&self) -> bool {
        self.flags & FLAG_FROZEN != 0
    }

    /// Always written as version 2 (a version-1 file gets upgraded when it is written).
    fn encode(&self) -> [u8; HEADER_SIZE as usize] {
        let mut b = [0u8; HEADER_SIZE as usize];
        b[0..8].copy_from_slice(&OVERLAY_MAGIC);
        b[8..12].copy_from_slice(&OVERLAY_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(CHUNK_SIZE as u32).to_le_bytes());
        for (off, v) in [
            (16, self.disk_size),
            (24, self.bitmap_off),
            (32, self.bitmap_len),
            (40, self.data_off),
            (48, self.flags),
            (56, self.layer_id),
            (64, self.parent_id),
        ] {
            b[off..off + 8].copy_from_slice(&v.to_le_bytes());
        }
        let sum = fnv1a64(&b[..V2_FIELDS_LEN]);
        b[72..80].copy_from_slice(&sum.to_le_bytes());
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
        let version = u32_at(8);
        let fields = match version {
            1 => V1_FIELDS_LEN,
            2 => V2_FIELDS_LEN,
            _ => return Err(format!("unsupported version {version}")),
        };
        if u64_at(fields) != fnv1a64(&b[..fields]) {
            return Err("header checksum mismatch".into());
        }
        let chunk = u32_at(12);
        if u64::from(chunk) != CHUNK_SIZE {
            return Err(format!("unsupported chunk size {chunk}"));
        }
        let (flags, layer_id, parent_id) = if version == 2 {
            (u64_at(48), u64_at(56), u64_at(64))
        } else {
            (0, 0, 0)
        };
        let h = Header {
            version,
            disk_size: u64_at(16),
            bitmap_off: u64_at(24),
            bitmap_len: u64_at(32),
            data_off: u64_at(40),
            flags,
            layer_id,
            parent_id,
        };
        let expect = Header::new(h.disk_size, 0);
        if (h.bitmap_off, h.bitmap_len, h.data_off)
            != (expect.bitmap_off, expect.bitmap_len, expect.data_off)
        {
            return Err("bitmap/data offsets do not match the disk size".into());
        }
        if flags & !FLAG_FROZEN != 0 {
            return Err(format!("unknown flags {flags:#x}"));
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

/// A non-zero random layer id (0 means "the base").
fn random_id() -> u64 {
    let mut b = [0u8; 8];
    loop {
        // An error (none is expected from getrandom here) or a zero id: draw again.
        if sandcell_proto::random::fill(&mut b).is_ok() && u64::from_ne_bytes(b) != 0 {
            return u64::from_ne_bytes(b);
        }
    }
}

/// One layer file: its header, its chunk bitmap and its data.
#[derive(Debug)]
pub struct LayerFile {
    file: File,
    path: PathBuf,
    header: Header,
    bitmap: Vec<u8>,
    bitmap_dirty: bool,
    writable: bool,
}

impl LayerFile {
    /// Opens the layer at `path` for a disk of `disk_size` bytes. Writable layers are
    /// created (over `parent_id`) if missing and locked exclusively; read-only ones must
    /// exist and are locked shared.
    pub fn open(
        path: &Path,
        disk_size: u64,
        writable: bool,
        parent_id: u64,
    ) -> Result<LayerFile, OverlayError> {
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
            let header = Header::new(disk_size, parent_id);
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
            if header.disk_size != disk_size {
                return Err(OverlayError::SizeMismatch {
                    path: path.to_owned(),
                    overlay_size: header.disk_size,
                    base_size: disk_size,
                });
            }
            if len < header.bitmap_off + header.bitmap_len {
                return Err(OverlayError::BadHeader {
                    path: path.to_owned(),
                    reason: format!("file is {len} bytes, too short for its bitmap"),
                });
            }
            if writable && header.frozen() {
                return Err(OverlayError::Frozen {
                    path: path.to_owned(),
                });
            }
            header
        };
        let mut bitmap = vec![0u8; header.bitmap_len as usize];
        file.read_exact_at(&mut bitmap, header.bitmap_off)
            .map_err(io_err)?;
        Ok(LayerFile {
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

    pub fn layer_id(&self) -> u64 {
        self.header.layer_id
    }

    pub fn parent_id(&self) -> u64 {
        self.header.parent_id
    }

    pub fn is_frozen(&self) -> bool {
        self.header.frozen()
    }

    pub fn bitmap(&self) -> &[u8] {
        &self.bitmap
    }

    pub fn has_chunk(&self, chunk: u64) -> bool {
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

    /// Number of chunks this layer holds.
    pub fn chunks(&self) -> u64 {
        self.bitmap.iter().map(|b| u64::from(b.count_ones())).sum()
    }

    /// Reads disk bytes at `offset` from this layer's data area (the caller knows the
    /// chunks are here).
    fn read_data(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, self.header.data_off + offset)
    }

    /// Writes disk bytes at `offset` and marks their chunks (whole chunks, or chunks the
    /// caller already copied up).
    fn write_data(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::from(io::ErrorKind::PermissionDenied));
        }
        if buf.is_empty() {
            return Ok(());
        }
        self.file.write_all_at(buf, self.header.data_off + offset)?;
        let last = (offset + buf.len() as u64 - 1) / CHUNK_SIZE;
        for chunk in offset / CHUNK_SIZE..=last {
            self.mark_chunk(chunk);
        }
        Ok(())
    }

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

    /// Makes the layer immutable: flush, set FROZEN in the header, sync, and drop to a
    /// shared lock (others may now read it as a layer).
    pub fn freeze(&mut self) -> io::Result<()> {
        self.flush()?;
        self.header.flags |= FLAG_FROZEN;
        self.header.version = OVERLAY_VERSION;
        self.file.write_all_at(&self.header.encode(), 0)?;
        self.file.sync_data()?;
        self.writable = false;
        // SAFETY: flock on our own descriptor; converting the lock cannot fail for a
        // lock we hold except on signals, which only leaves the exclusive lock in place.
        unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
        Ok(())
    }
}

impl Drop for LayerFile {
    fn drop(&mut self) {
        // Best effort: keep what the guest wrote even if it never flushed. Errors have
        // nowhere to go here; an unflushed write may be lost by contract.
        let _ = self.flush();
    }
}

/// A layered copy-on-write disk: base, immutable layers (oldest first), optional top.
#[derive(Debug)]
pub struct Overlay {
    base: File,
    disk_size: u64,
    layers: Vec<LayerFile>,
    top: Option<LayerFile>,
    /// Per chunk: 0 = base, i = layers[i-1], layers.len()+1 = top.
    index: LayerIndex,
}

impl Overlay {
    /// A base with one overlay file (no middle layers): writable (created if missing)
    /// or read-only.
    pub fn open(
        base: File,
        base_size: u64,
        path: &Path,
        writable: bool,
    ) -> Result<Overlay, OverlayError> {
        if writable {
            Overlay::open_chain(base, base_size, &[], Some(path))
        } else {
            Overlay::open_chain(base, base_size, &[path.to_path_buf()], None)
        }
    }

    /// Opens a chain: `layers` read-only, oldest first, and `top` writable (created over
    /// the newest layer if missing). Checks sizes and parent links.
    pub fn open_chain(
        base: File,
        disk_size: u64,
        layers: &[PathBuf],
        top: Option<&Path>,
    ) -> Result<Overlay, OverlayError> {
        if layers.len() + 1 > MAX_LAYERS {
            return Err(OverlayError::TooManyLayers(layers.len()));
        }
        let mut opened: Vec<LayerFile> = Vec::with_capacity(layers.len());
        for path in layers {
            let below = opened.last().map_or(0, LayerFile::layer_id);
            let layer = LayerFile::open(path, disk_size, false, 0)?;
            check_parent(&layer, below)?;
            opened.push(layer);
        }
        let below = opened.last().map_or(0, LayerFile::layer_id);
        let top = match top {
            Some(path) => {
                let layer = LayerFile::open(path, disk_size, true, below)?;
                check_parent(&layer, below)?;
                Some(layer)
            }
            None => None,
        };
        let mut index = LayerIndex::new(disk_size.div_ceil(CHUNK_SIZE));
        for (i, layer) in opened.iter().chain(top.iter()).enumerate() {
            index.add_layer(layer.bitmap(), (i + 1) as u8);
        }
        Ok(Overlay {
            base,
            disk_size,
            layers: opened,
            top,
            index,
        })
    }

    /// Size of the virtual disk in bytes.
    pub fn disk_size(&self) -> u64 {
        self.disk_size
    }

    /// The read-only layers, oldest first.
    pub fn layer_paths(&self) -> Vec<PathBuf> {
        self.layers.iter().map(|l| l.path().to_path_buf()).collect()
    }

    pub fn top_path(&self) -> Option<&Path> {
        self.top.as_ref().map(LayerFile::path)
    }

    /// Number of chunks held by the writable top (for tests and metrics).
    pub fn chunks_written(&self) -> u64 {
        self.top.as_ref().map_or(0, LayerFile::chunks)
    }

    fn source_read(&self, source: u8, buf: &mut [u8], pos: u64) -> io::Result<()> {
        let i = usize::from(source);
        if i == 0 {
            read_base(&self.base, buf, pos)
        } else if i <= self.layers.len() {
            self.layers[i - 1].read_data(buf, pos)
        } else {
            match &self.top {
                Some(t) => t.read_data(buf, pos),
                None => Err(io::Error::other("layer index names a missing top")),
            }
        }
    }

    /// Read `buf.len()` bytes at `offset`; the caller checked the range is in the disk.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let end = offset + buf.len() as u64;
        let mut pos = offset;
        while pos < end {
            let chunk = pos / CHUNK_SIZE;
            let last = (end - 1) / CHUNK_SIZE;
            let (source, run) = self.index.run(chunk, last);
            let run_end = ((chunk + run) * CHUNK_SIZE).min(end);
            let from = (pos - offset) as usize;
            let to = (run_end - offset) as usize;
            self.source_read(source, &mut buf[from..to], pos)?;
            pos = run_end;
        }
        Ok(())
    }

    /// Write `buf` at `offset` into the top; the caller checked the range is in the disk.
    pub fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        let top_source = (self.layers.len() + 1) as u8;
        if self.top.is_none() {
            return Err(io::Error::from(io::ErrorKind::PermissionDenied));
        }
        if buf.is_empty() {
            return Ok(());
        }
        let end = offset + buf.len() as u64;
        let first = offset / CHUNK_SIZE;
        let last = (end - 1) / CHUNK_SIZE;
        // Only the edge chunks can be partially covered; copy them up from the current
        // view before the write so the bytes the guest does not overwrite keep it.
        if !offset.is_multiple_of(CHUNK_SIZE) {
            self.copy_up(first)?;
        }
        if !end.is_multiple_of(CHUNK_SIZE) {
            self.copy_up(last)?;
        }
        if let Some(top) = self.top.as_mut() {
            top.write_data(buf, offset)?;
        }
        for chunk in first..=last {
            self.index.set(chunk, top_source);
        }
        Ok(())
    }

    fn copy_up(&mut self, chunk: u64) -> io::Result<()> {
        let top_source = (self.layers.len() + 1) as u8;
        if self.index.get(chunk) == top_source {
            return Ok(());
        }
        let mut data = [0u8; CHUNK_SIZE as usize];
        self.source_read(self.index.get(chunk), &mut data, chunk * CHUNK_SIZE)?;
        if let Some(top) = self.top.as_mut() {
            top.write_data(&data, chunk * CHUNK_SIZE)?;
        }
        self.index.set(chunk, top_source);
        Ok(())
    }

    /// Make every completed write durable (see the module documentation for the order).
    pub fn flush(&mut self) -> io::Result<()> {
        match self.top.as_mut() {
            Some(t) => t.flush(),
            None => Ok(()),
        }
    }

    /// Freezes the top into the chain's newest immutable layer and continues on a new
    /// empty top at `new_top` (module documentation). Returns the frozen layer's path.
    pub fn freeze_top(&mut self, new_top: &Path) -> Result<PathBuf, OverlayError> {
        if self.layers.len() + 2 > MAX_LAYERS {
            return Err(OverlayError::TooManyLayers(self.layers.len() + 1));
        }
        let Some(top) = self.top.as_mut() else {
            return Err(OverlayError::NoTop);
        };
        let io_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| OverlayError::Io { path, source }
        };
        let top_path = top.path().to_path_buf();
        let fresh = LayerFile::open(new_top, self.disk_size, true, top.layer_id())?;
        if fresh.parent_id() != top.layer_id() {
            // An existing file at `new_top` belongs elsewhere.
            return Err(OverlayError::ChainMismatch {
                path: new_top.to_path_buf(),
                parent: fresh.parent_id(),
                below: top.layer_id(),
            });
        }
        top.freeze().map_err(io_err(&top_path))?;
        // The index needs no change: the old top keeps its number as the newest layer,
        // and the new top takes the next one.
        if let Some(old) = self.top.replace(fresh) {
            self.layers.push(old);
        }
        Ok(top_path)
    }
}

fn check_parent(layer: &LayerFile, below: u64) -> Result<(), OverlayError> {
    // Version-1 files carry no ids (both 0): accepted directly over the base only.
    if layer.parent_id() != below {
        return Err(OverlayError::ChainMismatch {
            path: layer.path().to_path_buf(),
            parent: layer.parent_id(),
            below,
        });
    }
    Ok(())
}

/// Merges a chain (base at `base`, `layers` oldest first) into one new frozen layer at
/// `out`, directly over the base: chunk by chunk, the newest layer's copy wins. The
/// result reads exactly like the chain. `out` must not exist.
pub fn flatten(base: &Path, layers: &[PathBuf], out: &Path) -> Result<(), OverlayError> {
    let open_err = |source| OverlayError::Open {
        path: base.to_path_buf(),
        source,
    };
    let base_file = File::open(base).map_err(open_err)?;
    let size = base_file.metadata().map_err(open_err)?.len();
    if out.exists() {
        return Err(OverlayError::Open {
            path: out.to_path_buf(),
            source: io::Error::from(io::ErrorKind::AlreadyExists),
        });
    }
    let chain = Overlay::open_chain(base_file, size, layers, None)?;
    let mut merged = LayerFile::open(out, size, true, 0)?;
    let io_err = |source| OverlayError::Io {
        path: out.to_path_buf(),
        source,
    };
    let chunks = size.div_ceil(CHUNK_SIZE);
    let mut buf = vec![0u8; CHUNK_SIZE as usize];
    for chunk in 0..chunks {
        let source = chain.index.get(chunk);
        if source == 0 {
            continue;
        }
        let pos = chunk * CHUNK_SIZE;
        let len = (size - pos).min(CHUNK_SIZE) as usize;
        chain
            .source_read(source, &mut buf[..len], pos)
            .map_err(io_err)?;
        merged.write_data(&buf[..len], pos).map_err(io_err)?;
    }
    merged.freeze().map_err(io_err)
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
