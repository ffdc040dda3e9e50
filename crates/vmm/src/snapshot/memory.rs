//! Guest memory in snapshots: writing it out, mapping a saved image copy-on-write, and
//! freezing a running VM's memory in place for a fork.
//!
//! A VM's memory is in one of two states ([`MemorySource`]):
//! - `Memfd`: booted VMs. The memfd is mapped `MAP_SHARED`; guest writes land in it.
//! - `Image`: restored or forked VMs. An immutable image (a memory file, or a sealed
//!   memfd) is mapped `MAP_PRIVATE`: pages are read from the image (shared through the
//!   page cache with every other VM mapping it) until the guest writes them, which gives
//!   this VM a private anonymous copy. KVM maps read faults read-only, so reading a page
//!   does not copy it.
//!
//! Freezing (fork): a `Memfd` VM's memfd *is* the image. The VM is remapped `MAP_PRIVATE
//! | MAP_FIXED` over the same memfd at the same host addresses (KVM follows the change
//! through its MMU notifiers: the memory slots keep their userspace address), then the
//! memfd is sealed against writes, growth and shrinking. Cost: two syscalls per RAM
//! range, independent of memory size. An `Image` VM that forks again first materialises
//! its current view (image plus its private pages) into a new memfd: O(memory), since
//! the private pages are only reachable through the mapping.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use vm_memory::{FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use crate::memory::{GuestMemory, MemoryError, ram_ranges, sealable_memfd};

const PAGE: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotMemoryError {
    #[error("{what} memory file {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "memory file {path} is {actual} bytes, but the snapshot's guest has {expected} bytes \
         of memory (a truncated or foreign memory file)"
    )]
    SizeMismatch {
        path: PathBuf,
        actual: u64,
        expected: u64,
    },
    #[error("{path} is not a regular file")]
    NotAFile { path: PathBuf },
    #[error("mapping memory file {path} copy-on-write failed: {reason}")]
    Map { path: PathBuf, reason: String },
    #[error("{op} on the guest memory failed: {source}")]
    Syscall {
        op: &'static str,
        source: std::io::Error,
    },
    #[error(transparent)]
    Memory(#[from] MemoryError),
}

/// Where the guest memory mapping gets its pages.
#[derive(Debug)]
pub enum MemorySource {
    /// `MAP_SHARED` over this memfd: guest writes land in it.
    Memfd(File),
    /// `MAP_PRIVATE` over this immutable image.
    Image(File),
}

/// Writes all of guest memory to a new file at `path` (replaced if it exists). Pages the
/// guest never touched stay holes, so the file takes the space of the touched memory.
pub fn write_file(
    mem: &GuestMemory,
    source: &MemorySource,
    size: u64,
    path: &Path,
) -> Result<(), SnapshotMemoryError> {
    let io = |source| SnapshotMemoryError::Io {
        what: "writing the",
        path: path.to_path_buf(),
        source,
    };
    let out = File::create(path).map_err(io)?;
    out.set_len(size).map_err(io)?;
    match source {
        MemorySource::Memfd(memfd) => copy_data_ranges(memfd, &out, size).map_err(io)?,
        MemorySource::Image(_) => copy_from_mapping(mem, &out).map_err(io)?,
    }
    Ok(())
}

/// Copies the data ranges of `src` (SEEK_DATA/SEEK_HOLE: pages the guest touched) into
/// `dst` at the same offsets, in the kernel (sendfile: copy_file_range refuses to cross
/// filesystems, and a memfd is never on the target's filesystem).
fn copy_data_ranges(src: &File, dst: &File, size: u64) -> std::io::Result<()> {
    let mut pos: i64 = 0;
    let size = size as i64;
    while pos < size {
        // SAFETY: lseek on a descriptor we own; no memory is passed.
        let data = unsafe { libc::lseek(src.as_raw_fd(), pos, libc::SEEK_DATA) };
        if data < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                return Ok(()); // no data after pos
            }
            return Err(e);
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(src.as_raw_fd(), data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let end = hole.min(size);
        // SAFETY: as above; positions the output where this range goes.
        if unsafe { libc::lseek(dst.as_raw_fd(), data, libc::SEEK_SET) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut off: libc::off_t = data;
        while off < end {
            let want = ((end - off) as usize).min(1 << 30);
            // SAFETY: both descriptors are ours; `off` is a valid off_t the kernel updates.
            let n = unsafe { libc::sendfile(dst.as_raw_fd(), src.as_raw_fd(), &mut off, want) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
            }
        }
        pos = end;
    }
    Ok(())
}

/// Writes every non-zero page of the guest memory mapping into `dst` at its file offset
/// (the RAM ranges' layout); zero pages stay holes.
fn copy_from_mapping(mem: &GuestMemory, dst: &File) -> std::io::Result<()> {
    for (region, range) in mem.iter().zip(ram_ranges(mem_size(mem))) {
        let len = region.len() as usize;
        // SAFETY: the region is a live mapping of `len` bytes that outlives this call; the
        // vCPUs are paused and the devices are out of the event loop, so nothing writes
        // it while it is read.
        let bytes = unsafe { std::slice::from_raw_parts(region.as_ptr() as *const u8, len) };
        let mut start = 0;
        while start < len {
            // Runs of non-zero pages, written with one pwrite each.
            while start < len && is_zero(&bytes[start..start + PAGE.min(len - start)]) {
                start += PAGE;
            }
            let mut end = start;
            while end < len && !is_zero(&bytes[end..end + PAGE.min(len - end)]) {
                end += PAGE;
            }
            let end = end.min(len);
            if start < end {
                dst.write_all_at(&bytes[start..end], range.file_offset + start as u64)?;
            }
            start = end;
        }
    }
    Ok(())
}

fn is_zero(page: &[u8]) -> bool {
    // Word-wise: this runs over all of guest memory.
    let (head, words, tail) = {
        // SAFETY: u64 has no invalid bit patterns; align_to splits at alignment.
        unsafe { page.align_to::<u64>() }
    };
    head.iter().all(|&b| b == 0) && words.iter().all(|&w| w == 0) && tail.iter().all(|&b| b == 0)
}

fn mem_size(mem: &GuestMemory) -> u64 {
    mem.iter().map(|r| r.len()).sum()
}

/// Opens a memory image and checks it against the snapshot's memory size (a short file
/// would SIGBUS the VMM on first touch of the missing pages).
pub fn open_image(path: &Path, size: u64) -> Result<File, SnapshotMemoryError> {
    let io = |source| SnapshotMemoryError::Io {
        what: "opening the",
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(SnapshotMemoryError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    if meta.len() != size {
        return Err(SnapshotMemoryError::SizeMismatch {
            path: path.to_path_buf(),
            actual: meta.len(),
            expected: size,
        });
    }
    Ok(file)
}

/// Maps `image` copy-on-write as guest memory of `size` bytes (layout: memory::ram_ranges).
pub fn map_image(image: &File, size: u64, path: &Path) -> Result<GuestMemory, SnapshotMemoryError> {
    let map_err = |reason: String| SnapshotMemoryError::Map {
        path: path.to_path_buf(),
        reason,
    };
    let mut regions = Vec::new();
    for r in ram_ranges(size) {
        let dup = image
            .try_clone()
            .map_err(|e| map_err(format!("dup: {e}")))?;
        let mapping = vm_memory::mmap::MmapRegionBuilder::<()>::new(r.size as usize)
            .with_file_offset(FileOffset::new(dup, r.file_offset))
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_NORESERVE)
            .build()
            .map_err(|e| map_err(e.to_string()))?;
        regions.push(
            vm_memory::GuestRegionMmap::new(mapping, GuestAddress(r.guest_addr))
                .ok_or_else(|| map_err("region address overflow".into()))?,
        );
    }
    GuestMemory::from_regions(regions).map_err(|e| map_err(e.to_string()))
}

/// Freezes guest memory in place (module documentation): afterwards `source` is an
/// `Image` over a sealed memfd, and the returned file is that image (for children).
pub fn freeze(
    mem: &GuestMemory,
    source: &mut MemorySource,
    size: u64,
) -> Result<File, SnapshotMemoryError> {
    let image = match source {
        MemorySource::Memfd(memfd) => memfd
            .try_clone()
            .map_err(|source| SnapshotMemoryError::Syscall { op: "dup", source })?,
        MemorySource::Image(_) => {
            let fresh = sealable_memfd(c"sandcell-guest-ram-image", size)?;
            copy_from_mapping(mem, &fresh).map_err(|source| SnapshotMemoryError::Syscall {
                op: "pwrite",
                source,
            })?;
            fresh
        }
    };
    remap_private(mem, &image)?;
    // After the remap no shared writable mapping is left, which F_SEAL_WRITE requires.
    let seals = libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on a memfd we own; no memory is passed.
    if unsafe { libc::fcntl(image.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(SnapshotMemoryError::Syscall {
            op: "fcntl(F_ADD_SEALS)",
            source: std::io::Error::last_os_error(),
        });
    }
    let keep = image
        .try_clone()
        .map_err(|source| SnapshotMemoryError::Syscall { op: "dup", source })?;
    *source = MemorySource::Image(keep);
    Ok(image)
}

/// Replaces each region's mapping, at the same address and size, with a private mapping
/// of `image` at the region's file offset.
fn remap_private(mem: &GuestMemory, image: &File) -> Result<(), SnapshotMemoryError> {
    for (region, range) in mem.iter().zip(ram_ranges(mem_size(mem))) {
        let addr = region.as_ptr();
        let len = region.len() as usize;
        // SAFETY: `addr..addr+len` is exactly one live mapping owned by `mem` (vm-memory
        // unmaps it on drop, which stays correct: same address and length). MAP_FIXED
        // replaces it atomically. Nothing accesses guest memory meanwhile: vCPUs are
        // paused and devices are out of the event loop. KVM's memory slots point at the
        // same addresses and drop their old translations through MMU notifiers.
        let p = unsafe {
            libc::mmap(
                addr.cast(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_FIXED | libc::MAP_NORESERVE,
                image.as_raw_fd(),
                range.file_offset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            // The old mapping may be gone: nothing sane can continue with this VM.
            return Err(SnapshotMemoryError::Syscall {
                op: "mmap(MAP_PRIVATE|MAP_FIXED)",
                source: std::io::Error::last_os_error(),
            });
        }
    }
    Ok(())
}

/// Points `link` at `target` (atomically replacing whatever `link` was).
pub fn replace_symlink(target: &Path, link: &Path) -> Result<(), SnapshotMemoryError> {
    let io = |source| SnapshotMemoryError::Io {
        what: "linking the",
        path: link.to_path_buf(),
        source,
    };
    let mut tmp = link.as_os_str().to_owned();
    tmp.push(format!(".tmp{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).map_err(io)?;
    std::fs::rename(&tmp, link).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::Bytes;

    #[test]
    fn a_written_file_is_sparse_and_maps_back_copy_on_write() {
        let dir = tempfile::tempdir().expect("tempdir");
        let size = 8 << 20;
        let (mem, memfd) = crate::memory::create_guest_memory(size).expect("memory");
        mem.write_obj(0xdead_beefu32, GuestAddress(0x1000))
            .expect("w");
        mem.write_obj(0x1234_5678u32, GuestAddress(size - 4))
            .expect("w");
        let path = dir.path().join("mem");
        write_file(&mem, &MemorySource::Memfd(memfd), size, &path).expect("write");
        let meta = std::fs::metadata(&path).expect("meta");
        assert_eq!(meta.len(), size);
        use std::os::unix::fs::MetadataExt;
        assert!(meta.blocks() * 512 < size / 2, "holes stay holes");

        let image = open_image(&path, size).expect("open");
        let a = map_image(&image, size, &path).expect("map");
        let b = map_image(&image, size, &path).expect("map");
        assert_eq!(
            a.read_obj::<u32>(GuestAddress(0x1000)).expect("r"),
            0xdead_beef
        );
        a.write_obj(1u32, GuestAddress(0x1000)).expect("w");
        assert_eq!(
            b.read_obj::<u32>(GuestAddress(0x1000)).expect("r"),
            0xdead_beef
        );
        assert_eq!(
            b.read_obj::<u32>(GuestAddress(size - 4)).expect("r"),
            0x1234_5678
        );
        let mut on_disk = [0u8; 4];
        std::fs::File::open(&path)
            .expect("open")
            .read_exact_at(&mut on_disk, 0x1000)
            .expect("read");
        assert_eq!(
            u32::from_le_bytes(on_disk),
            0xdead_beef,
            "the file is untouched"
        );

        // A private mapping writes out its own view.
        let again = dir.path().join("mem2");
        write_file(&a, &MemorySource::Image(image), size, &again).expect("write");
        let c = map_image(&open_image(&again, size).expect("open"), size, &again).expect("map");
        assert_eq!(c.read_obj::<u32>(GuestAddress(0x1000)).expect("r"), 1);
        assert_eq!(
            c.read_obj::<u32>(GuestAddress(size - 4)).expect("r"),
            0x1234_5678
        );
    }

    #[test]
    fn short_files_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("mem");
        std::fs::write(&path, vec![0u8; 4096]).expect("write");
        assert!(matches!(
            open_image(&path, 8192),
            Err(SnapshotMemoryError::SizeMismatch { .. })
        ));
    }

    #[test]
    fn freezing_keeps_the_view_and_seals_the_image() {
        let size = 4 << 20;
        let (mem, memfd) = crate::memory::create_guest_memory(size).expect("memory");
        mem.write_obj(7u64, GuestAddress(0x2000)).expect("w");
        let mut source = MemorySource::Memfd(memfd);
        let image = freeze(&mem, &mut source, size).expect("freeze");
        assert!(matches!(source, MemorySource::Image(_)));
        assert_eq!(mem.read_obj::<u64>(GuestAddress(0x2000)).expect("r"), 7);
        // The VM writes privately from now on; the image keeps the frozen content.
        mem.write_obj(8u64, GuestAddress(0x2000)).expect("w");
        let mut buf = [0u8; 8];
        image.read_exact_at(&mut buf, 0x2000).expect("read image");
        assert_eq!(u64::from_le_bytes(buf), 7);
        assert!(image.write_all_at(&[1], 0).is_err(), "the image is sealed");
        // A second freeze materialises the current view into a new image.
        let second = freeze(&mem, &mut source, size).expect("freeze again");
        second.read_exact_at(&mut buf, 0x2000).expect("read");
        assert_eq!(u64::from_le_bytes(buf), 8);
        image.read_exact_at(&mut buf, 0x2000).expect("read");
        assert_eq!(u64::from_le_bytes(buf), 7, "the first image is unchanged");
    }
}
