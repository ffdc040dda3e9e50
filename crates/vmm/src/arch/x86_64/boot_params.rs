//! The Linux zero page (`struct boot_params`) and the E820 memory map.
//!
//! Field meanings: Documentation/arch/x86/boot.rst ("THE REAL-MODE KERNEL HEADER",
//! "DETAILS OF HEADER FIELDS") and zero-page.rst.

use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};
use vm_memory::{Bytes, GuestAddress};

use super::layout::{CMDLINE, EBDA_START, HIMEM_START, ZERO_PAGE};
use crate::memory::{GuestMemory, RamRange};

pub const E820_RAM: u32 = 1;
pub const E820_RESERVED: u32 = 2;

/// The "HdrS" magic in `setup_header.header`.
const HDRS_MAGIC: u32 = 0x5372_6448;
/// `boot_flag`: the 0xAA55 boot sector signature.
const BOOT_FLAG: u16 = 0xaa55;
/// `type_of_loader` 0xff: "undefined" boot loader (no assigned ID).
const LOADER_UNDEFINED: u8 = 0xff;
/// `kernel_alignment` the kernel expects when the image does not say (2 MiB, the x86_64
/// CONFIG_PHYSICAL_ALIGN default).
const DEFAULT_KERNEL_ALIGNMENT: u32 = 0x20_0000;
/// `loadflags` bit 0: the protected-mode kernel is loaded at 0x100000.
const LOADED_HIGH: u8 = 0x1;
/// `loadflags` bit 7: the loader can use the heap (heap_end_ptr valid).
const CAN_USE_HEAP: u8 = 0x80;

#[derive(Debug, thiserror::Error)]
pub enum BootParamsError {
    #[error("the E820 map needs {0} entries, more than the zero page holds")]
    TooManyE820Entries(usize),
    #[error("writing boot_params at guest address {ZERO_PAGE:#x} failed: {0}")]
    Write(vm_memory::GuestMemoryError),
}

/// The E820 map for `ram`: conventional memory below the EBDA, the EBDA itself reserved
/// (it holds the MP table), then RAM from 1 MiB (the legacy VGA/ROM hole is left out) and
/// every range above.
pub fn e820_map(ram: &[RamRange]) -> Vec<boot_e820_entry> {
    let mut map = vec![
        boot_e820_entry {
            addr: 0,
            size: EBDA_START,
            r#type: E820_RAM,
        },
        boot_e820_entry {
            addr: EBDA_START,
            size: 0xa0000 - EBDA_START,
            r#type: E820_RESERVED,
        },
    ];
    for r in ram {
        let start = r.guest_addr.max(HIMEM_START);
        let end = r.guest_addr + r.size;
        if end > start {
            map.push(boot_e820_entry {
                addr: start,
                size: end - start,
                r#type: E820_RAM,
            });
        }
    }
    map
}

/// Builds the zero page. `header` is the bzImage's own setup header when there is one
/// (its fields like `setup_sects`, `version`, `xloadflags` must reach the kernel unchanged);
/// for an ELF vmlinux we synthesize the fields the kernel reads.
pub fn build_boot_params(
    header: Option<setup_header>,
    cmdline_len: usize,
    ram: &[RamRange],
) -> Result<boot_params, BootParamsError> {
    let mut params = boot_params::default();
    if let Some(h) = header {
        params.hdr = h;
    }
    let hdr = &mut params.hdr;
    hdr.type_of_loader = LOADER_UNDEFINED;
    hdr.boot_flag = BOOT_FLAG;
    hdr.header = HDRS_MAGIC;
    if hdr.kernel_alignment == 0 {
        hdr.kernel_alignment = DEFAULT_KERNEL_ALIGNMENT;
    }
    hdr.loadflags |= LOADED_HIGH | CAN_USE_HEAP;
    hdr.cmd_line_ptr = CMDLINE as u32;
    // cmdline_size excludes the terminating NUL.
    hdr.cmdline_size = cmdline_len as u32;

    let map = e820_map(ram);
    if map.len() > params.e820_table.len() {
        return Err(BootParamsError::TooManyE820Entries(map.len()));
    }
    for (slot, entry) in params.e820_table.iter_mut().zip(map.iter()) {
        *slot = *entry;
    }
    params.e820_entries = map.len() as u8;
    Ok(params)
}

pub fn write_boot_params(mem: &GuestMemory, params: &boot_params) -> Result<(), BootParamsError> {
    mem.write_obj(*params, GuestAddress(ZERO_PAGE))
        .map_err(BootParamsError::Write)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::ram_ranges;

    #[test]
    fn e820_excludes_the_legacy_hole_and_the_mmio_gap() {
        let map = e820_map(&ram_ranges(4 << 30));
        let ram: Vec<(u64, u64)> = map
            .iter()
            .filter(|e| { e.r#type } == E820_RAM)
            .map(|e| ({ e.addr }, { e.addr } + { e.size }))
            .collect();
        assert_eq!(
            ram,
            vec![
                (0, 0x9fc00),
                (0x10_0000, 0xc000_0000),
                (1 << 32, (1 << 32) + (1 << 30))
            ]
        );
        let total: u64 = ram.iter().map(|(s, e)| e - s).sum();
        // Everything but the 0x9fc00..1 MiB hole is usable.
        assert_eq!(total, (4 << 30) - (0x10_0000 - 0x9fc00));
    }

    #[test]
    fn boot_params_carry_the_protocol_fields() {
        let p = build_boot_params(None, 42, &ram_ranges(128 << 20)).expect("params");
        assert_eq!({ p.hdr.boot_flag }, 0xaa55);
        assert_eq!({ p.hdr.header }, 0x5372_6448);
        assert_eq!({ p.hdr.type_of_loader }, 0xff);
        assert_eq!({ p.hdr.cmd_line_ptr }, 0x20000);
        assert_eq!({ p.hdr.cmdline_size }, 42);
        assert_eq!({ p.hdr.kernel_alignment }, 0x20_0000);
        assert_eq!({ p.e820_entries }, 3);
        assert_eq!({ p.e820_table[2].addr }, 0x10_0000);
        assert_eq!({ p.e820_table[2].size }, (128 << 20) - 0x10_0000);
    }

    #[test]
    fn bzimage_header_fields_are_kept() {
        let h = setup_header {
            setup_sects: 27,
            version: 0x020f,
            kernel_alignment: 0x1000,
            ..Default::default()
        };
        let p = build_boot_params(Some(h), 1, &ram_ranges(64 << 20)).expect("params");
        assert_eq!({ p.hdr.setup_sects }, 27);
        assert_eq!({ p.hdr.version }, 0x020f);
        assert_eq!({ p.hdr.kernel_alignment }, 0x1000);
    }
}
