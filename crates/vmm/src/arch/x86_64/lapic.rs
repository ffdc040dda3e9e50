//! Local APIC LINT0/LINT1 wiring, as a PC BIOS leaves it: LINT0 in ExtINT mode (the 8259
//! PIC's output reaches the CPU through it, which Linux uses for the timer check before the
//! IOAPIC is set up) and LINT1 as NMI.

use kvm_bindings::kvm_lapic_state;

/// Offsets of the LVT LINT0/LINT1 registers in the APIC register page.
const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
/// Delivery mode field, bits 10:8 of an LVT entry.
const DELIVERY_MODE_MASK: u32 = 0x700;
const MODE_NMI: u32 = 0x4;
const MODE_EXTINT: u32 = 0x7;

fn read_reg(state: &kvm_lapic_state, offset: usize) -> u32 {
    let b = &state.regs[offset..offset + 4];
    u32::from_le_bytes([b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8])
}

fn write_reg(state: &mut kvm_lapic_state, offset: usize, value: u32) {
    for (i, byte) in value.to_le_bytes().iter().enumerate() {
        state.regs[offset + i] = *byte as _;
    }
}

fn with_mode(reg: u32, mode: u32) -> u32 {
    (reg & !DELIVERY_MODE_MASK) | (mode << 8)
}

/// Sets LINT0 to ExtINT and LINT1 to NMI in a LAPIC state read from KVM.
pub fn configure_lints(state: &mut kvm_lapic_state) {
    let lvt0 = read_reg(state, APIC_LVT0);
    write_reg(state, APIC_LVT0, with_mode(lvt0, MODE_EXTINT));
    let lvt1 = read_reg(state, APIC_LVT1);
    write_reg(state, APIC_LVT1, with_mode(lvt1, MODE_NMI));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lints_get_extint_and_nmi_and_keep_other_bits() {
        let mut s = kvm_lapic_state::default();
        write_reg(&mut s, APIC_LVT0, 0x0001_0000); // masked
        write_reg(&mut s, APIC_LVT1, 0x0001_0700);
        configure_lints(&mut s);
        assert_eq!(read_reg(&s, APIC_LVT0), 0x0001_0700);
        assert_eq!(read_reg(&s, APIC_LVT1), 0x0001_0400);
    }
}
