//! Boot CPU state for the 64-bit Linux boot protocol: GDT, IDT, identity page tables,
//! long-mode segment/control registers, general registers and FPU.
//!
//! The 64-bit boot protocol (Documentation/arch/x86/boot.rst, "64-bit BOOT PROTOCOL") wants:
//! long mode with paging on, an identity map covering the kernel, the zero page and the
//! command line; `__BOOT_CS` (0x10 in Linux, any flat 64-bit code segment works) and flat
//! data segments; interrupts off; `rsi` = address of `boot_params`.

use kvm_bindings::{kvm_fpu, kvm_regs, kvm_segment, kvm_sregs};
use vm_memory::{Bytes, GuestAddress};

use super::layout::{BOOT_GDT, BOOT_IDT, BOOT_STACK, PD, PD_PAGES, PDPT, PML4, ZERO_PAGE};
use crate::memory::GuestMemory;

#[derive(Debug, thiserror::Error)]
pub enum RegsError {
    #[error("writing the boot {what} at guest address {addr:#x} failed: {source}")]
    WriteGuest {
        what: &'static str,
        addr: u64,
        source: vm_memory::GuestMemoryError,
    },
}

const CR0_PE: u64 = 1 << 0;
const CR0_ET: u64 = 1 << 4;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;

/// One segment descriptor, kept decoded so that the same value produces both the GDT bytes
/// in guest memory and the hidden part of the segment register (`kvm_segment`): the two
/// must agree or the first segment reload by the guest changes its view of memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    pub base: u32,
    /// 20-bit limit, in 4 KiB units when `granularity` is set.
    pub limit: u32,
    /// Access byte: present(7) dpl(6:5) s(4) type(3:0).
    pub access: u8,
    /// Flags nibble: granularity(3) db(2) long(1) avl(0).
    pub flags: u8,
}

impl Descriptor {
    pub const NULL: Descriptor = Descriptor {
        base: 0,
        limit: 0,
        access: 0,
        flags: 0,
    };
    /// Flat 64-bit code: present, ring 0, code, execute/read, accessed; G and L set.
    pub const CODE64: Descriptor = Descriptor {
        base: 0,
        limit: 0xfffff,
        access: 0x9b,
        flags: 0xa,
    };
    /// Flat data: present, ring 0, data, read/write, accessed; G and D/B set.
    pub const DATA: Descriptor = Descriptor {
        base: 0,
        limit: 0xfffff,
        access: 0x93,
        flags: 0xc,
    };
    /// A busy 64-bit TSS (type 0xb) as KVM wants for TR; the kernel loads its own TR later.
    pub const TSS: Descriptor = Descriptor {
        base: 0,
        limit: 0xfffff,
        access: 0x8b,
        flags: 0x8,
    };

    /// The 8-byte GDT encoding (Intel SDM vol. 3, 3.4.5).
    pub fn encode(&self) -> u64 {
        let base = u64::from(self.base);
        let limit = u64::from(self.limit);
        (limit & 0xffff)
            | ((base & 0xff_ffff) << 16)
            | (u64::from(self.access) << 40)
            | (((limit >> 16) & 0xf) << 48)
            | (u64::from(self.flags & 0xf) << 52)
            | (((base >> 24) & 0xff) << 56)
    }

    /// The segment register value KVM loads for this descriptor at GDT index `index`.
    pub fn to_kvm_segment(&self, index: u16) -> kvm_segment {
        let granular = self.flags & 0x8 != 0;
        let present = (self.access >> 7) & 1;
        kvm_segment {
            base: u64::from(self.base),
            limit: if granular {
                (self.limit << 12) | 0xfff
            } else {
                self.limit
            },
            selector: index * 8,
            type_: self.access & 0xf,
            present,
            dpl: (self.access >> 5) & 0x3,
            db: (self.flags >> 2) & 1,
            s: (self.access >> 4) & 1,
            l: (self.flags >> 1) & 1,
            g: u8::from(granular),
            avl: self.flags & 1,
            unusable: u8::from(present == 0),
            padding: 0,
        }
    }
}

/// The boot GDT: null, code (selector 0x08), data (0x10), TSS (0x18).
pub const BOOT_GDT_TABLE: [Descriptor; 4] = [
    Descriptor::NULL,
    Descriptor::CODE64,
    Descriptor::DATA,
    Descriptor::TSS,
];

/// Writes the GDT and a one-entry null IDT into guest memory.
pub fn write_gdt_idt(mem: &GuestMemory) -> Result<(), RegsError> {
    for (i, d) in BOOT_GDT_TABLE.iter().enumerate() {
        let addr = BOOT_GDT + (i as u64) * 8;
        mem.write_obj(d.encode(), GuestAddress(addr))
            .map_err(|source| RegsError::WriteGuest {
                what: "GDT",
                addr,
                source,
            })?;
    }
    mem.write_obj(0u64, GuestAddress(BOOT_IDT))
        .map_err(|source| RegsError::WriteGuest {
            what: "IDT",
            addr: BOOT_IDT,
            source,
        })?;
    Ok(())
}

/// Identity-maps the first 4 GiB with 2 MiB pages: PML4[0] -> PDPT, PDPT[g] -> PD page g
/// (four consecutive pages from PD), PD[g][i] = (g * 512 + i) * 2 MiB. That covers the
/// kernel (loaded at 1 MiB or 16 MiB), the zero page, the command line and the MMIO gap
/// (so that early code, and our test payloads, can reach devices); the kernel builds its
/// own page tables early in startup_64.
pub fn write_page_tables(mem: &GuestMemory) -> Result<(), RegsError> {
    const PRESENT_RW: u64 = 0x3;
    const HUGE: u64 = 0x80;
    let w = |value: u64, addr: u64, what| {
        mem.write_obj(value, GuestAddress(addr))
            .map_err(|source| RegsError::WriteGuest { what, addr, source })
    };
    w(PDPT | PRESENT_RW, PML4, "PML4")?;
    for g in 0..PD_PAGES {
        let pd = PD + g * 0x1000;
        w(pd | PRESENT_RW, PDPT + g * 8, "PDPT")?;
        for i in 0..512u64 {
            w(
                ((g * 512 + i) << 21) | PRESENT_RW | HUGE,
                pd + i * 8,
                "page directory",
            )?;
        }
    }
    Ok(())
}

/// Long-mode special registers, starting from what KVM reports for a fresh vCPU (which
/// carries e.g. the APIC base) and replacing segments, descriptor tables and control bits.
pub fn long_mode_sregs(mut sregs: kvm_sregs) -> kvm_sregs {
    let code = Descriptor::CODE64.to_kvm_segment(1);
    let data = Descriptor::DATA.to_kvm_segment(2);
    let tss = Descriptor::TSS.to_kvm_segment(3);

    sregs.gdt.base = BOOT_GDT;
    sregs.gdt.limit = (BOOT_GDT_TABLE.len() * 8 - 1) as u16;
    sregs.idt.base = BOOT_IDT;
    sregs.idt.limit = 7;

    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = tss;

    // Paging must be described (CR3, PAE) before CR0.PG and EFER.LME/LMA take effect
    // together; KVM applies the whole struct at once, but the values must be consistent:
    // long mode = PE + PG + PAE + LME (+ LMA, which KVM also derives).
    sregs.cr3 = PML4;
    sregs.cr4 |= CR4_PAE;
    sregs.cr0 |= CR0_PE | CR0_ET | CR0_PG;
    sregs.efer |= EFER_LME | EFER_LMA;
    sregs
}

/// General registers at the kernel entry point.
pub fn boot_regs(entry: u64) -> kvm_regs {
    kvm_regs {
        // Bit 1 of RFLAGS is reserved and must be 1; IF stays clear.
        rflags: 0x2,
        rip: entry,
        rsp: BOOT_STACK,
        rbp: BOOT_STACK,
        // The 64-bit boot protocol passes the zero page in rsi.
        rsi: ZERO_PAGE,
        ..Default::default()
    }
}

/// The FPU state after FNINIT (FCW 0x37f: all exceptions masked, extended precision) and
/// the SSE default MXCSR (0x1f80: all exceptions masked, round to nearest).
pub fn boot_fpu() -> kvm_fpu {
    kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::create_guest_memory;

    #[test]
    fn descriptors_encode_to_the_usual_flat_values() {
        assert_eq!(Descriptor::CODE64.encode(), 0x00af_9b00_0000_ffff);
        assert_eq!(Descriptor::DATA.encode(), 0x00cf_9300_0000_ffff);
        assert_eq!(Descriptor::TSS.encode(), 0x008f_8b00_0000_ffff);
        assert_eq!(Descriptor::NULL.encode(), 0);
    }

    #[test]
    fn code_segment_is_long_mode_ring0() {
        let cs = Descriptor::CODE64.to_kvm_segment(1);
        assert_eq!(cs.selector, 8);
        assert_eq!(
            (cs.l, cs.db, cs.g, cs.present, cs.dpl, cs.s),
            (1, 0, 1, 1, 0, 1)
        );
        assert_eq!(cs.limit, 0xffff_ffff);
        assert_eq!(Descriptor::NULL.to_kvm_segment(0).unusable, 1);
    }

    #[test]
    fn sregs_enable_long_mode_paging() {
        let s = long_mode_sregs(kvm_sregs::default());
        assert_eq!(s.cr0 & (CR0_PE | CR0_PG), CR0_PE | CR0_PG);
        assert_ne!(s.cr4 & CR4_PAE, 0);
        assert_eq!(s.efer & (EFER_LME | EFER_LMA), EFER_LME | EFER_LMA);
        assert_eq!(s.cr3, PML4);
        assert_eq!(s.tr.selector, 0x18);
        assert_eq!(s.gdt.limit, 31);
    }

    #[test]
    fn page_tables_identity_map_the_first_4_gib() {
        let (mem, _f) = create_guest_memory(2 << 20).expect("memory");
        write_page_tables(&mem).expect("page tables");
        let pml4: u64 = mem.read_obj(GuestAddress(PML4)).expect("pml4");
        assert_eq!(pml4 & !0xfff, PDPT);
        let pde: u64 = mem.read_obj(GuestAddress(PD + 8 * 511)).expect("pde");
        assert_eq!(pde & !0xfff, 511 << 21);
        assert_eq!(pde & 0x83, 0x83);
        // The last 2 MiB page below 4 GiB (the MMIO gap's top) is mapped too.
        let pdpte: u64 = mem.read_obj(GuestAddress(PDPT + 3 * 8)).expect("pdpte");
        assert_eq!(pdpte & !0xfff, PD + 3 * 0x1000);
        let pde: u64 = mem
            .read_obj(GuestAddress(PD + 3 * 0x1000 + 8 * 511))
            .expect("pde");
        assert_eq!(pde & !0xfff, (4u64 << 30) - (2 << 20));
    }
}
