//! Per-vCPU CPUID: what KVM supports, with the APIC ID and topology of each vCPU filled in.
//!
//! KVM's `KVM_GET_SUPPORTED_CPUID` describes the host's CPU, including the host's APIC IDs
//! and core counts. The guest must instead see one package with `count` cores, one thread
//! each, and APIC ID = vCPU index everywhere Linux looks (leaf 0x1 EBX, leaf 0xB/0x1F EDX,
//! AMD leaf 0x8000_001E), or SMP bring-up waits for CPUs that never answer.

use kvm_bindings::kvm_cpuid_entry2;

const LEAF_FEATURES: u32 = 0x1;
const LEAF_CACHE_PARAMS: u32 = 0x4;
const LEAF_EXT_TOPOLOGY: u32 = 0xb;
const LEAF_V2_EXT_TOPOLOGY: u32 = 0x1f;
const LEAF_AMD_FEATURES: u32 = 0x8000_0001;
const LEAF_AMD_SIZES: u32 = 0x8000_0008;
const LEAF_AMD_TOPOLOGY: u32 = 0x8000_001e;

const ECX_HYPERVISOR: u32 = 1 << 31;
const EDX_HTT: u32 = 1 << 28;
const AMD_ECX_CMP_LEGACY: u32 = 1 << 1;

/// Topology level types in leaf 0xB/0x1F ECX[15:8].
const LEVEL_SMT: u32 = 1;
const LEVEL_CORE: u32 = 2;

/// Number of APIC ID bits needed for `count` cores (ceil(log2(count))).
pub fn core_id_bits(count: u8) -> u32 {
    let count = u32::from(count.max(1));
    u32::BITS - (count - 1).leading_zeros()
}

/// Rewrites `entries` (a copy of the supported CPUID) for vCPU `index` of `count`.
pub fn normalize(entries: &mut [kvm_cpuid_entry2], index: u8, count: u8) {
    let apic_id = u32::from(index);
    let count32 = u32::from(count.max(1));
    let bits = core_id_bits(count);
    for e in entries.iter_mut() {
        match e.function {
            LEAF_FEATURES => {
                // EBX[31:24] initial APIC ID, [23:16] logical processors per package,
                // [15:8] CLFLUSH line size in quadwords (8 = 64 bytes).
                e.ebx = (apic_id << 24) | (count32 << 16) | (8 << 8) | (e.ebx & 0xff);
                e.ecx |= ECX_HYPERVISOR;
                if count32 > 1 {
                    e.edx |= EDX_HTT;
                } else {
                    e.edx &= !EDX_HTT;
                }
            }
            LEAF_CACHE_PARAMS => {
                // EAX[31:26] cores per package - 1; EAX[25:14] logical processors sharing
                // this cache - 1: private L1/L2, shared L3 and beyond.
                let level = (e.eax >> 5) & 0x7;
                let sharing = if level >= 3 { count32 - 1 } else { 0 };
                e.eax =
                    (e.eax & 0x3fff) | ((sharing & 0xfff) << 14) | (((count32 - 1) & 0x3f) << 26);
            }
            LEAF_EXT_TOPOLOGY | LEAF_V2_EXT_TOPOLOGY => {
                let (shift, logical, level_type) = match e.index {
                    0 => (0, 1, LEVEL_SMT),
                    1 => (bits, count32, LEVEL_CORE),
                    _ => (0, 0, 0),
                };
                e.eax = shift;
                e.ebx = logical;
                e.ecx = (level_type << 8) | (e.index & 0xff);
                e.edx = apic_id;
            }
            LEAF_AMD_FEATURES => {
                if count32 > 1 {
                    e.ecx |= AMD_ECX_CMP_LEGACY;
                } else {
                    e.ecx &= !AMD_ECX_CMP_LEGACY;
                }
            }
            LEAF_AMD_SIZES => {
                // ECX[7:0] cores - 1, ECX[15:12] APIC ID bits for the core ID.
                e.ecx = (e.ecx & !0xf0ff) | ((count32 - 1) & 0xff) | ((bits & 0xf) << 12);
            }
            LEAF_AMD_TOPOLOGY => {
                // EAX extended APIC ID; EBX[15:8] threads per core - 1 (0), [7:0] core ID;
                // ECX node ID 0, one node.
                e.eax = apic_id;
                e.ebx = apic_id & 0xff;
                e.ecx = 0;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(function: u32, index: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            ebx: 0xffff_ffff,
            edx: 0xffff_ffff,
            ..Default::default()
        }
    }

    #[test]
    fn core_id_bits_round_up() {
        assert_eq!(core_id_bits(1), 0);
        assert_eq!(core_id_bits(2), 1);
        assert_eq!(core_id_bits(3), 2);
        assert_eq!(core_id_bits(4), 2);
        assert_eq!(core_id_bits(32), 5);
    }

    #[test]
    fn apic_id_matches_the_vcpu_index_in_every_leaf() {
        let mut e = vec![
            entry(1, 0),
            entry(0xb, 0),
            entry(0xb, 1),
            entry(0xb, 2),
            entry(0x8000_001e, 0),
        ];
        normalize(&mut e, 3, 4);
        assert_eq!(e[0].ebx >> 24, 3);
        assert_eq!((e[0].ebx >> 16) & 0xff, 4);
        assert_ne!(e[0].edx & EDX_HTT, 0);
        assert_ne!(e[0].ecx & ECX_HYPERVISOR, 0);
        for leaf in &e[1..4] {
            assert_eq!(leaf.edx, 3);
        }
        assert_eq!((e[1].eax, e[1].ebx, e[1].ecx), (0, 1, 0x100));
        assert_eq!((e[2].eax, e[2].ebx, e[2].ecx), (2, 4, 0x201));
        assert_eq!((e[3].eax, e[3].ebx, e[3].ecx), (0, 0, 2));
        assert_eq!(e[4].eax, 3);
    }

    #[test]
    fn single_vcpu_has_no_htt() {
        let mut e = vec![entry(1, 0)];
        normalize(&mut e, 0, 1);
        assert_eq!(e[0].edx & EDX_HTT, 0);
        assert_eq!(e[0].ebx >> 24, 0);
    }

    #[test]
    fn cache_leaf_shares_only_the_last_level() {
        let mut l1 = entry(4, 0);
        l1.eax = 1 << 5 | 0x1; // level 1, data cache
        let mut l3 = entry(4, 3);
        l3.eax = 3 << 5 | 0x3;
        let mut e = vec![l1, l3];
        normalize(&mut e, 0, 8);
        assert_eq!((e[0].eax >> 14) & 0xfff, 0);
        assert_eq!((e[1].eax >> 14) & 0xfff, 7);
        assert_eq!(e[1].eax >> 26, 7);
        assert_eq!(e[0].eax & 0x3fff, 1 << 5 | 0x1);
    }
}
