//! Guest memory: a memfd mapped shared, wrapped as a vm-memory `GuestMemoryMmap`.
//!
//! Backing RAM with a memfd (rather than anonymous memory) keeps a file descriptor for the
//! whole of guest RAM: a later snapshot can write it out or a fork can remap it private
//! without copying. RAM that does not fit below the MMIO gap continues at
//! 4 GiB; both pieces are consecutive ranges of the same memfd.

use std::ffi::CStr;
use std::fs::File;
use std::os::fd::FromRawFd;

use vm_memory::{FileOffset, GuestAddress};

use crate::arch::x86_64::layout::{MMIO_GAP_END, MMIO_GAP_START};

/// Guest memory as every part of the VMM sees it (devices read and write through this).
pub type GuestMemory = vm_memory::GuestMemoryMmap<()>;

#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("memfd_create for guest memory failed: {0}")]
    MemfdCreate(std::io::Error),
    #[error("ftruncate of the guest memory memfd to {size} bytes failed: {source}")]
    Truncate { size: u64, source: std::io::Error },
    #[error("mapping guest memory ({size} bytes) failed: {source}")]
    Map {
        size: u64,
        source: vm_memory::mmap::FromRangesError,
    },
    #[error("duplicating the guest memory memfd failed: {0}")]
    Dup(std::io::Error),
    #[error("guest memory size {0} bytes is not a multiple of the 4 KiB page size")]
    Unaligned(u64),
}

/// One contiguous range of guest RAM: where it is in the guest and where in the memfd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RamRange {
    pub guest_addr: u64,
    pub size: u64,
    pub file_offset: u64,
}

/// Splits `size` bytes of RAM around the MMIO gap: everything up to the gap start stays
/// below 4 GiB, the rest continues at 4 GiB.
pub fn ram_ranges(size: u64) -> Vec<RamRange> {
    if size <= MMIO_GAP_START {
        return vec![RamRange {
            guest_addr: 0,
            size,
            file_offset: 0,
        }];
    }
    vec![
        RamRange {
            guest_addr: 0,
            size: MMIO_GAP_START,
            file_offset: 0,
        },
        RamRange {
            guest_addr: MMIO_GAP_END,
            size: size - MMIO_GAP_START,
            file_offset: MMIO_GAP_START,
        },
    ]
}

/// A new memfd of `size` bytes that can later be sealed (a fork freezes guest memory by
/// sealing it against writes, see snapshot::memory).
pub fn sealable_memfd(name: &CStr, size: u64) -> Result<File, MemoryError> {
    // SAFETY: `name` is a valid NUL-terminated string; the flags are constants. The result is
    // checked before use.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(MemoryError::MemfdCreate(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
    let file = unsafe { File::from_raw_fd(fd) };
    // The memfd starts empty; its size must cover every mapping before mmap, or touching
    // the pages would SIGBUS. Pages are allocated lazily, on first touch.
    file.set_len(size)
        .map_err(|source| MemoryError::Truncate { size, source })?;
    Ok(file)
}

/// Creates the memfd, sizes it and maps every range `MAP_SHARED`.
/// Returns the memory and the memfd (kept for snapshots; the mappings hold their own dups).
pub fn create_guest_memory(size: u64) -> Result<(GuestMemory, File), MemoryError> {
    if !size.is_multiple_of(4096) {
        return Err(MemoryError::Unaligned(size));
    }
    let name: &CStr = c"sandcell-guest-ram";
    let file = sealable_memfd(name, size)?;

    let mut ranges: Vec<(GuestAddress, usize, Option<FileOffset>)> = Vec::new();
    for r in ram_ranges(size) {
        // Each mapping keeps its own descriptor for the memfd (vm-memory holds it in the
        // FileOffset), so the returned `file` can be closed independently.
        let dup = file.try_clone().map_err(MemoryError::Dup)?;
        ranges.push((
            GuestAddress(r.guest_addr),
            r.size as usize,
            Some(FileOffset::new(dup, r.file_offset)),
        ));
    }
    // vm-memory maps file-backed ranges MAP_SHARED | MAP_NORESERVE, which is what we want:
    // writes land in the memfd, and nothing is reserved up front.
    let mem = GuestMemory::from_ranges_with_files(ranges)
        .map_err(|source| MemoryError::Map { size, source })?;
    Ok((mem, file))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestMemoryBackend};

    #[test]
    fn small_memory_is_one_range_below_the_gap() {
        assert_eq!(
            ram_ranges(128 << 20),
            vec![RamRange {
                guest_addr: 0,
                size: 128 << 20,
                file_offset: 0
            }]
        );
    }

    #[test]
    fn large_memory_is_split_around_the_mmio_gap() {
        let r = ram_ranges(4 << 30);
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0],
            RamRange {
                guest_addr: 0,
                size: MMIO_GAP_START,
                file_offset: 0
            }
        );
        assert_eq!(r[1].guest_addr, 1 << 32);
        assert_eq!(r[1].size, (4 << 30) - MMIO_GAP_START);
        assert_eq!(r[1].file_offset, MMIO_GAP_START);
    }

    #[test]
    fn guest_memory_is_backed_by_the_memfd() {
        let (mem, file) = create_guest_memory(2 << 20).expect("guest memory");
        mem.write_obj(0x1234_5678u32, GuestAddress(0x1000))
            .expect("write");
        let mut buf = [0u8; 4];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut buf, 0x1000).expect("read memfd");
        assert_eq!(u32::from_le_bytes(buf), 0x1234_5678);
        assert_eq!(mem.num_regions(), 1);
    }

    #[test]
    fn unaligned_size_is_refused() {
        assert!(matches!(
            create_guest_memory(4097),
            Err(MemoryError::Unaligned(4097))
        ));
    }
}
