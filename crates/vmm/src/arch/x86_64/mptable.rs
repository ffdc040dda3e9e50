//! An Intel MultiProcessor Specification 1.4 table, so that a kernel without ACPI finds the
//! other CPUs, the IOAPIC and the ISA interrupt routing.
//!
//! Layout (MP spec chapter 4): the 16-byte floating pointer at the start of the EBDA (one
//! of the places Linux scans), the configuration table right after it: header, one
//! processor entry per vCPU, one ISA bus, one IOAPIC, 24 I/O interrupt entries (ISA IRQ n
//! to IOAPIC pin n: KVM's default GSI routing is the identity), then LINT0 = ExtINT and
//! LINT1 = NMI for every local APIC. Both structures carry byte checksums summing to zero.

use vm_memory::{Bytes, GuestAddress};

use super::layout::{EBDA_START, IOAPIC_START, LAPIC_START};
use crate::memory::GuestMemory;

pub const MAX_CPUS: u8 = 32;
const FLOATING_POINTER_LEN: usize = 16;
const HEADER_LEN: usize = 44;
const IOAPIC_PINS: u8 = 24;
const SPEC_REV_1_4: u8 = 4;
const APIC_VERSION: u8 = 0x14;
const IOAPIC_VERSION: u8 = 0x11;

const ENTRY_PROCESSOR: u8 = 0;
const ENTRY_BUS: u8 = 1;
const ENTRY_IOAPIC: u8 = 2;
const ENTRY_IO_INTERRUPT: u8 = 3;
const ENTRY_LOCAL_INTERRUPT: u8 = 4;
const INT_TYPE_INT: u8 = 0;
const INT_TYPE_NMI: u8 = 1;
const INT_TYPE_EXTINT: u8 = 3;
const CPU_ENABLED: u8 = 1;
const CPU_BOOTSTRAP: u8 = 2;
/// Family 6 in the CPU signature; FPU (bit 0) and APIC (bit 9) in the feature flags.
const CPU_SIGNATURE: u32 = 0x600;
const CPU_FEATURES: u32 = (1 << 0) | (1 << 9);

#[derive(Debug, thiserror::Error)]
pub enum MpTableError {
    #[error("{0} vCPUs do not fit in the MP table (at most {MAX_CPUS})")]
    TooManyCpus(u8),
    #[error("writing the MP table at guest address {EBDA_START:#x} failed: {0}")]
    Write(vm_memory::GuestMemoryError),
}

fn checksum(bytes: &[u8]) -> u8 {
    let sum = bytes.iter().fold(0u8, |acc, b| acc.wrapping_add(*b));
    0u8.wrapping_sub(sum)
}

/// Builds the floating pointer and the configuration table as they will sit in memory
/// starting at `base`.
pub fn build(cpus: u8, base: u64) -> Result<Vec<u8>, MpTableError> {
    if cpus == 0 || cpus > MAX_CPUS {
        return Err(MpTableError::TooManyCpus(cpus));
    }
    let ioapic_id = cpus;
    let table_addr = base + FLOATING_POINTER_LEN as u64;

    let mut entries: Vec<u8> = Vec::new();
    let mut count: u16 = 0;
    for cpu in 0..cpus {
        let flags = CPU_ENABLED | if cpu == 0 { CPU_BOOTSTRAP } else { 0 };
        entries.extend_from_slice(&[ENTRY_PROCESSOR, cpu, APIC_VERSION, flags]);
        entries.extend_from_slice(&CPU_SIGNATURE.to_le_bytes());
        entries.extend_from_slice(&CPU_FEATURES.to_le_bytes());
        entries.extend_from_slice(&[0u8; 8]);
        count += 1;
    }
    entries.extend_from_slice(&[ENTRY_BUS, 0]);
    entries.extend_from_slice(b"ISA   ");
    count += 1;
    entries.extend_from_slice(&[ENTRY_IOAPIC, ioapic_id, IOAPIC_VERSION, 1]);
    entries.extend_from_slice(&(IOAPIC_START as u32).to_le_bytes());
    count += 1;
    for pin in 0..IOAPIC_PINS {
        // type, interrupt type, flags (u16: bus-default polarity and trigger), bus, bus IRQ,
        // IOAPIC id, IOAPIC pin.
        entries.extend_from_slice(&[
            ENTRY_IO_INTERRUPT,
            INT_TYPE_INT,
            0,
            0,
            0,
            pin,
            ioapic_id,
            pin,
        ]);
        count += 1;
    }
    for (kind, lint) in [(INT_TYPE_EXTINT, 0u8), (INT_TYPE_NMI, 1u8)] {
        // Destination local APIC 0xff: every local APIC.
        entries.extend_from_slice(&[ENTRY_LOCAL_INTERRUPT, kind, 0, 0, 0, 0, 0xff, lint]);
        count += 1;
    }

    let table_len = HEADER_LEN + entries.len();
    let mut table = Vec::with_capacity(table_len);
    table.extend_from_slice(b"PCMP");
    table.extend_from_slice(&(table_len as u16).to_le_bytes());
    table.push(SPEC_REV_1_4);
    table.push(0); // checksum, filled below
    table.extend_from_slice(b"SANDCELL");
    table.extend_from_slice(b"MICROVM     ");
    table.extend_from_slice(&0u32.to_le_bytes()); // OEM table pointer
    table.extend_from_slice(&0u16.to_le_bytes()); // OEM table size
    table.extend_from_slice(&count.to_le_bytes());
    table.extend_from_slice(&(LAPIC_START as u32).to_le_bytes());
    table.extend_from_slice(&0u16.to_le_bytes()); // extended table length
    table.push(0); // extended table checksum
    table.push(0); // reserved
    table.extend_from_slice(&entries);
    table[7] = checksum(&table);

    let mut fp = Vec::with_capacity(FLOATING_POINTER_LEN);
    fp.extend_from_slice(b"_MP_");
    fp.extend_from_slice(&(table_addr as u32).to_le_bytes());
    fp.push(1); // length in 16-byte units
    fp.push(SPEC_REV_1_4);
    fp.push(0); // checksum, filled below
    fp.extend_from_slice(&[0u8; 5]); // feature bytes: table present, no IMCR (virtual wire)
    fp[10] = checksum(&fp);

    fp.extend_from_slice(&table);
    Ok(fp)
}

/// Writes the MP table for `cpus` vCPUs at the start of the EBDA.
pub fn write(mem: &GuestMemory, cpus: u8) -> Result<(), MpTableError> {
    let bytes = build(cpus, EBDA_START)?;
    mem.write_slice(&bytes, GuestAddress(EBDA_START))
        .map_err(MpTableError::Write)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(b: &[u8]) -> u8 {
        b.iter().fold(0u8, |a, x| a.wrapping_add(*x))
    }

    #[test]
    fn checksums_sum_to_zero_and_lengths_match() {
        for cpus in [1u8, 2, 7, 32] {
            let t = build(cpus, EBDA_START).expect("table");
            assert_eq!(&t[0..4], b"_MP_");
            assert_eq!(sum(&t[0..16]), 0, "floating pointer checksum, {cpus} cpus");
            let table = &t[16..];
            assert_eq!(&table[0..4], b"PCMP");
            let len = u16::from_le_bytes([table[4], table[5]]) as usize;
            assert_eq!(len, table.len());
            assert_eq!(sum(table), 0, "table checksum, {cpus} cpus");
            let count = u16::from_le_bytes([table[34], table[35]]);
            assert_eq!(count as usize, cpus as usize + 1 + 1 + 24 + 2);
            let fp_addr = u32::from_le_bytes([t[4], t[5], t[6], t[7]]) as u64;
            assert_eq!(fp_addr, EBDA_START + 16);
            // The whole thing stays inside the 1 KiB EBDA.
            assert!(t.len() <= 1024);
        }
    }

    #[test]
    fn only_cpu_zero_is_the_bootstrap_processor() {
        let t = build(3, EBDA_START).expect("table");
        let procs = &t[16 + 44..];
        for cpu in 0..3usize {
            let e = &procs[cpu * 20..cpu * 20 + 20];
            assert_eq!(e[0], 0);
            assert_eq!(e[1] as usize, cpu);
            assert_eq!(e[3] & 2 != 0, cpu == 0);
        }
    }

    #[test]
    fn too_many_cpus_is_an_error() {
        assert!(matches!(
            build(33, EBDA_START),
            Err(MpTableError::TooManyCpus(33))
        ));
        assert!(build(0, EBDA_START).is_err());
    }
}
