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
//! its current view into a new memfd: the image's data ranges copied in the kernel, then
//! the pages this VM made private (found in /proc/self/pagemap), so the cost follows what
//! the guest touched, not its memory size. A full snapshot of an `Image` VM writes its
//! file the same way.

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
        MemorySource::Image(image) => copy_image_view(mem, image, &out, size).map_err(io)?,
    }
    Ok(())
}

/// Writes the current view of an `Image` VM (`image` mapped `MAP_PRIVATE`, plus the pages
/// the guest has written since, which are private anonymous copies) into the empty `dst`.
/// The image's data ranges go first, kernel to kernel; then every private page over them.
/// Pages the guest never wrote are never read through the mapping (reading them would
/// fault each one in: seconds for a large guest under nested virtualization). Without a
/// readable pagemap, the whole mapping is copied instead.
fn copy_image_view(mem: &GuestMemory, image: &File, dst: &File, size: u64) -> std::io::Result<()> {
    let pagemap = match File::open("/proc/self/pagemap") {
        Ok(f) => f,
        Err(e) => {
            tracing::debug!("/proc/self/pagemap: {e}; copying all guest memory");
            return copy_from_mapping(mem, dst);
        }
    };
    copy_data_ranges(image, dst, size)?;
    for (region, range) in mem.iter().zip(ram_ranges(mem_size(mem))) {
        let base = region.as_ptr() as usize;
        // SAFETY: the region is a live mapping of `len` bytes that outlives this call; the
        // vCPUs are paused and the devices are out of the event loop, so nothing writes
        // it while it is read. Only pages the pagemap shows present are read.
        let bytes = unsafe {
            std::slice::from_raw_parts(region.as_ptr() as *const u8, region.len() as usize)
        };
        for (start, end) in private_runs(&pagemap, base, bytes.len())? {
            dst.write_all_at(&bytes[start..end], range.file_offset + start as u64)?;
        }
    }
    Ok(())
}

/// Byte ranges (relative to `base`) of the pages of `base..base+len` that are private to
/// this process: present and not file-backed (a copy-on-write copy), or swapped out (only
/// anonymous pages swap). pagemap: one u64 per page; bit 63 present, 62 swapped, 61
/// file-page or shared-anonymous (kernel Documentation/admin-guide/mm/pagemap.rst).
fn private_runs(pagemap: &File, base: usize, len: usize) -> std::io::Result<Vec<(usize, usize)>> {
    const BATCH: usize = 4096;
    let pages = len / PAGE;
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut buf = vec![0u8; BATCH * 8];
    let mut page = 0;
    while page < pages {
        let n = BATCH.min(pages - page);
        let offset = ((base / PAGE + page) * 8) as u64;
        pagemap.read_exact_at(&mut buf[..n * 8], offset)?;
        for (i, entry) in buf[..n * 8].chunks_exact(8).enumerate() {
            let mut word = [0u8; 8];
            word.copy_from_slice(entry);
            let e = u64::from_ne_bytes(word);
            let (present, swapped, file) = (e >> 63 & 1 == 1, e >> 62 & 1 == 1, e >> 61 & 1 == 1);
            if !((present && !file) || swapped) {
                continue;
            }
            let start = (page + i) * PAGE;
            match runs.last_mut() {
                Some(last) if last.1 == start => last.1 = start + PAGE,
                _ => runs.push((start, start + PAGE)),
            }
        }
        page += n;
    }
    Ok(runs)
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
        MemorySource::Image(image) => {
            let fresh = sealable_memfd(c"sandcell-guest-ram-image", size)?;
            copy_image_view(mem, image, &fresh, size).map_err(|source| {
                SnapshotMemoryError::Syscall {
                    op: "copying the guest's view into a new image",
                    source,
                }
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
    fn an_image_view_is_the_image_plus_exactly_the_private_pages() {
        let dir = tempfile::tempdir().expect("tempdir");
        let size = 8 << 20;
        let (mem, memfd) = crate::memory::create_guest_memory(size).expect("memory");
        for (addr, v) in [(0x1000u64, 1u64), (0x3000, 3), (0x5000, 5)] {
            mem.write_obj(v, GuestAddress(addr)).expect("w");
        }
        let path = dir.path().join("mem");
        write_file(&mem, &MemorySource::Memfd(memfd), size, &path).expect("write");
        let image = open_image(&path, size).expect("open");
        let view = map_image(&image, size, &path).expect("map");
        // 0x1000 only read (a file page), 0x3000 overwritten, 0x5000 zeroed, 0x7000 (a hole
        // in the image) written, 0x9000 never touched.
        assert_eq!(view.read_obj::<u64>(GuestAddress(0x1000)).expect("r"), 1);
        view.write_obj(33u64, GuestAddress(0x3000)).expect("w");
        view.write_obj(0u64, GuestAddress(0x5000)).expect("w");
        view.write_obj(77u64, GuestAddress(0x7000)).expect("w");
        let runs = private_runs(
            &File::open("/proc/self/pagemap").expect("pagemap"),
            view.iter().next().expect("region").as_ptr() as usize,
            0x10000,
        )
        .expect("pagemap");
        assert_eq!(
            runs,
            vec![(0x3000, 0x4000), (0x5000, 0x6000), (0x7000, 0x8000)]
        );

        let out = dir.path().join("view");
        write_file(&view, &MemorySource::Image(image), size, &out).expect("write view");
        let f = File::open(&out).expect("open");
        let word = |addr: u64| {
            let mut b = [0u8; 8];
            f.read_exact_at(&mut b, addr).expect("read");
            u64::from_le_bytes(b)
        };
        assert_eq!(
            [
                word(0x1000),
                word(0x3000),
                word(0x5000),
                word(0x7000),
                word(0x9000)
            ],
            [1, 33, 0, 77, 0]
        );
        use std::os::unix::fs::MetadataExt;
        assert!(
            f.metadata().expect("meta").blocks() * 512 < size / 2,
            "holes stay holes"
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
