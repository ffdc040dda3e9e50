//! The guest physical address map, in one place.
//!
//! ```text
//! 0x0000_0000  real-mode IVT / BDA (RAM, left zero)
//! 0x0000_0500  GDT (4 entries)            BOOT_GDT
//! 0x0000_0520  IDT (one null gate)        BOOT_IDT
//! 0x0000_7000  boot_params "zero page"    ZERO_PAGE
//! 0x0000_8ff0  boot stack top             BOOT_STACK
//! 0x0000_9000  PML4, PDPT, 4 x PD (identity map of the first 4 GiB, 2 MiB pages)
//! 0x0002_0000  kernel command line        CMDLINE (COMMAND_LINE_SIZE bytes)
//! 0x0009_fc00  EBDA: MP tables            EBDA_START (not RAM in the E820 map)
//! 0x000a_0000  legacy VGA/ROM hole        (not RAM in the E820 map)
//! 0x0010_0000  kernel (HIMEM_START)       RAM up to the MMIO gap
//! 0xc000_0000  MMIO gap (1 GiB): virtio-mmio devices from 0xd000_0000,
//!              IOAPIC 0xfec0_0000, LAPIC 0xfee0_0000, KVM identity map + TSS below 4 GiB
//! 0x1_0000_0000 RAM that did not fit below the gap
//! ```
//! The low addresses mirror what Linux expects of a "BIOS-less" direct boot; the choices of
//! exact addresses are ours.

/// Start of the GDT that the boot vCPU uses (long mode code/data + TSS descriptors).
pub const BOOT_GDT: u64 = 0x500;
/// A one-entry IDT with a null gate: any exception before the kernel loads its own IDT
/// escalates to a triple fault, which is what we want (a clean `KVM_EXIT_SHUTDOWN`).
pub const BOOT_IDT: u64 = 0x520;
/// `boot_params` (the Linux "zero page"); its address goes to the kernel in `rsi`.
pub const ZERO_PAGE: u64 = 0x7000;
/// Initial `rsp`/`rbp` for the boot vCPU (grows down, below the page tables).
pub const BOOT_STACK: u64 = 0x8ff0;
/// Identity page tables: one PML4, one PDPT, PD_PAGES page directories of 2 MiB pages
/// (0xb000..0xf000, maps the first 4 GiB including the MMIO gap).
pub const PML4: u64 = 0x9000;
pub const PDPT: u64 = 0xa000;
pub const PD: u64 = 0xb000;
pub const PD_PAGES: u64 = 4;
/// The kernel command line and its maximum size including the NUL (x86 COMMAND_LINE_SIZE).
pub const CMDLINE: u64 = 0x20000;
pub const CMDLINE_MAX_SIZE: usize = 2048;
/// Extended BIOS data area: the top KiB of base memory, where Linux scans for an MP table.
pub const EBDA_START: u64 = 0x9fc00;
/// Where the kernel is loaded and where RAM above the legacy hole starts.
pub const HIMEM_START: u64 = 0x10_0000;

/// The MMIO gap below 4 GiB: guest RAM never overlaps it.
pub const MMIO_GAP_START: u64 = 0xc000_0000;
pub const MMIO_GAP_END: u64 = 0x1_0000_0000;
/// virtio-mmio devices are placed from here, 4 KiB apart.
pub const VIRTIO_MMIO_START: u64 = 0xd000_0000;
pub const VIRTIO_MMIO_SIZE: u64 = 0x1000;
/// A debug device for tests (only with `--debug-devices`), at the top of the device window.
pub const DEBUG_MMIO_START: u64 = 0xdfff_f000;
pub const IOAPIC_START: u64 = 0xfec0_0000;
pub const LAPIC_START: u64 = 0xfee0_0000;
/// KVM needs three pages for the real-mode TSS and one for the EPT identity map on Intel;
/// both sit just below the top of the gap, in addresses no device uses.
pub const KVM_IDENTITY_MAP: u64 = 0xfffb_c000;
pub const KVM_TSS: u64 = 0xfffb_d000;

/// First interrupt line given to virtio devices (0-4 are the PIT, keyboard, cascade, COM2,
/// COM1); the IOAPIC has 24 pins.
pub const FIRST_DEVICE_IRQ: u32 = 5;
pub const LAST_DEVICE_IRQ: u32 = 23;
/// COM1's interrupt line.
pub const SERIAL_IRQ: u32 = 4;
