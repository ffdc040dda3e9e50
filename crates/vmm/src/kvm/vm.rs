//! The KVM VM: capability checks, the x86 system setup that must precede the vCPUs,
//! memory slots, irqfds and ioeventfds.

use std::path::Path;

use kvm_bindings::{
    CpuId, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE,
    KVM_MAX_CPUID_ENTRIES, KVM_PIT_SPEAKER_DUMMY, kvm_clock_data, kvm_irqchip, kvm_pit_config,
    kvm_pit_state2, kvm_userspace_memory_region,
};
use kvm_ioctls::{Cap, IoEventAddress, Kvm, VcpuFd, VmFd};
use serde::{Deserialize, Serialize};
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

use crate::arch::x86_64::layout::{KVM_IDENTITY_MAP, KVM_TSS};
use crate::memory::GuestMemory;

#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error(
        "/dev/kvm does not exist: this host has no KVM. Sandcell microVMs need KVM; use the \
         gvisor runtime on this host"
    )]
    NoKvm,
    #[error("opening /dev/kvm failed: {0} (is the user in the kvm group?)")]
    OpenKvm(kvm_ioctls::Error),
    #[error("KVM API version {0} is not the stable version 12")]
    ApiVersion(i32),
    #[error("the host's KVM lacks a capability the VMM needs: {0}")]
    MissingCap(&'static str),
    #[error("KVM_{op} failed: {source}")]
    Ioctl {
        op: &'static str,
        source: kvm_ioctls::Error,
    },
    #[error("KVM_SET_USER_MEMORY_REGION slot {slot} ({guest_addr:#x}+{size:#x}) failed: {source}")]
    MemorySlot {
        slot: u32,
        guest_addr: u64,
        size: u64,
        source: kvm_ioctls::Error,
    },
    #[error("KVM_IRQFD for GSI {gsi} failed: {source}")]
    Irqfd { gsi: u32, source: kvm_ioctls::Error },
    #[error("KVM_IOEVENTFD at {addr:#x} (datamatch {datamatch}) failed: {source}")]
    Ioeventfd {
        addr: u64,
        datamatch: u32,
        source: kvm_ioctls::Error,
    },
    #[error("the saved VM state is invalid: {0}")]
    BadState(String),
    #[error("KVM_CREATE_VCPU {index} failed: {source}")]
    CreateVcpu {
        index: u8,
        source: kvm_ioctls::Error,
    },
}

/// Whether /dev/kvm comes from the PVM module: it runs tiny payloads natively, but a stock
/// Linux kernel only through KVM's instruction emulator, which fails
/// (KVM_EXIT_INTERNAL_ERROR) or crawls (tests/nested/README.md: the nested-KVM harness).
pub fn host_kvm_is_pvm() -> bool {
    Path::new("/sys/module/kvm_pvm").exists()
}

/// Capabilities the VMM relies on, with why.
const REQUIRED_CAPS: &[(Cap, &str)] = &[
    (Cap::Irqchip, "KVM_CAP_IRQCHIP (in-kernel PIC/IOAPIC/LAPIC)"),
    (Cap::Pit2, "KVM_CAP_PIT2 (in-kernel PIT)"),
    (
        Cap::Irqfd,
        "KVM_CAP_IRQFD (device interrupts without exits)",
    ),
    (
        Cap::Ioeventfd,
        "KVM_CAP_IOEVENTFD (virtio queue notifications without exits)",
    ),
    (
        Cap::ImmediateExit,
        "KVM_CAP_IMMEDIATE_EXIT (race-free vCPU kicks for pause)",
    ),
    (Cap::UserMemory, "KVM_CAP_USER_MEMORY"),
    (Cap::SetTssAddr, "KVM_CAP_SET_TSS_ADDR"),
    (Cap::ExtCpuid, "KVM_CAP_EXT_CPUID"),
];

pub struct Vm {
    kvm: Kvm,
    fd: VmFd,
}

/// The VM-wide KVM state a snapshot keeps: the in-kernel PICs and IOAPIC, the PIT and
/// kvmclock. (Memory slots, irqfds and ioeventfds are rebuilt from the configuration.)
#[derive(Clone, Serialize, Deserialize)]
pub struct VmKvmState {
    pub pic_master: kvm_irqchip,
    pub pic_slave: kvm_irqchip,
    pub ioapic: kvm_irqchip,
    pub pit: kvm_pit_state2,
    pub clock: kvm_clock_data,
}

impl Vm {
    /// Opens /dev/kvm, checks it and creates the VM. The caller registers guest memory,
    /// then calls [`Vm::setup_x86`] before creating vCPUs.
    pub fn new() -> Result<Vm, VmError> {
        if !Path::new("/dev/kvm").exists() {
            return Err(VmError::NoKvm);
        }
        let kvm = Kvm::new().map_err(VmError::OpenKvm)?;
        let api = kvm.get_api_version();
        if api != 12 {
            return Err(VmError::ApiVersion(api));
        }
        for (cap, name) in REQUIRED_CAPS {
            if !kvm.check_extension(*cap) {
                return Err(VmError::MissingCap(name));
            }
        }
        let fd = kvm.create_vm().map_err(|source| VmError::Ioctl {
            op: "CREATE_VM",
            source,
        })?;
        Ok(Vm { kvm, fd })
    }

    /// The VM-wide x86 devices and pages. Call after registering guest memory (it is much
    /// cheaper before the irqchip exists, see builder.rs) and before creating vCPUs.
    ///
    /// Order (each step's constraint):
    /// 1. `KVM_SET_IDENTITY_MAP_ADDR` must happen before any vCPU exists (KVM refuses it
    ///    afterwards); `KVM_SET_TSS_ADDR` must precede the first `KVM_RUN` on Intel. Both
    ///    go to pages in the MMIO gap that nothing else uses.
    /// 2. `KVM_CREATE_IRQCHIP` before the vCPUs, so each vCPU gets an in-kernel LAPIC.
    /// 3. `KVM_CREATE_PIT2` after the irqchip: the PIT delivers IRQ 0 through it. The
    ///    dummy speaker makes KVM answer port 0x61 itself.
    pub fn setup_x86(&self) -> Result<(), VmError> {
        let fd = &self.fd;
        let io = |op| move |source| VmError::Ioctl { op, source };

        fd.set_identity_map_address(KVM_IDENTITY_MAP)
            .map_err(io("SET_IDENTITY_MAP_ADDR"))?;
        fd.set_tss_address(KVM_TSS as usize)
            .map_err(io("SET_TSS_ADDR"))?;
        fd.create_irq_chip().map_err(io("CREATE_IRQCHIP"))?;
        let pit = kvm_pit_config {
            flags: KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        };
        fd.create_pit2(pit).map_err(io("CREATE_PIT2"))?;
        Ok(())
    }

    pub fn fd(&self) -> &VmFd {
        &self.fd
    }

    pub fn has_cap(&self, cap: Cap) -> bool {
        self.kvm.check_extension(cap)
    }

    /// KVM_CAP_XSAVE2: the size in bytes of a vCPU's XSAVE area (0: the host lacks it,
    /// and the 4 KiB KVM_GET_XSAVE is all there is).
    pub fn xsave2_size(&self) -> usize {
        usize::try_from(self.fd.check_extension_int(Cap::Xsave2)).unwrap_or(0)
    }

    /// The snapshot MSR allow-list (arch::x86_64::msr) narrowed to what this host's KVM
    /// can save and restore.
    pub fn snapshot_msrs(&self) -> Result<Vec<u32>, VmError> {
        let list = self
            .kvm
            .get_msr_index_list()
            .map_err(|source| VmError::Ioctl {
                op: "GET_MSR_INDEX_LIST",
                source,
            })?;
        Ok(list
            .as_slice()
            .iter()
            .copied()
            .filter(|&i| crate::arch::x86_64::msr::is_snapshot_msr(i))
            .collect())
    }

    /// Reads the VM-wide state. The vCPUs must be paused (and their state already saved:
    /// see snapshot::save for the order).
    pub fn save_state(&self) -> Result<VmKvmState, VmError> {
        let io = |op| move |source| VmError::Ioctl { op, source };
        let chip = |id| -> Result<kvm_irqchip, VmError> {
            let mut c = kvm_irqchip {
                chip_id: id,
                ..Default::default()
            };
            self.fd.get_irqchip(&mut c).map_err(io("GET_IRQCHIP"))?;
            Ok(c)
        };
        Ok(VmKvmState {
            pit: self.fd.get_pit2().map_err(io("GET_PIT2"))?,
            clock: self.fd.get_clock().map_err(io("GET_CLOCK"))?,
            pic_master: chip(KVM_IRQCHIP_PIC_MASTER)?,
            pic_slave: chip(KVM_IRQCHIP_PIC_SLAVE)?,
            ioapic: chip(KVM_IRQCHIP_IOAPIC)?,
        })
    }

    /// Writes the VM-wide state, after the vCPUs' (see snapshot::restore for why).
    /// kvmclock resumes where it stopped: the flags are cleared so that KVM does not
    /// take KVM_CLOCK_REALTIME from the saved data and jump the guest clock forward by
    /// the snapshot's age (the guest agent sets the wall clock after a restore).
    pub fn restore_state(&self, state: &VmKvmState) -> Result<(), VmError> {
        let io = |op| move |source| VmError::Ioctl { op, source };
        for (chip, id) in [
            (&state.pic_master, KVM_IRQCHIP_PIC_MASTER),
            (&state.pic_slave, KVM_IRQCHIP_PIC_SLAVE),
            (&state.ioapic, KVM_IRQCHIP_IOAPIC),
        ] {
            if chip.chip_id != id {
                return Err(VmError::BadState(format!(
                    "irqchip {id} is saved with chip id {}",
                    chip.chip_id
                )));
            }
        }
        self.fd.set_pit2(&state.pit).map_err(io("SET_PIT2"))?;
        let clock = kvm_clock_data {
            flags: 0,
            ..state.clock
        };
        self.fd.set_clock(&clock).map_err(io("SET_CLOCK"))?;
        self.fd
            .set_irqchip(&state.pic_master)
            .map_err(io("SET_IRQCHIP"))?;
        self.fd
            .set_irqchip(&state.pic_slave)
            .map_err(io("SET_IRQCHIP"))?;
        self.fd
            .set_irqchip(&state.ioapic)
            .map_err(io("SET_IRQCHIP"))?;
        Ok(())
    }

    pub fn supported_cpuid(&self) -> Result<CpuId, VmError> {
        self.kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(|source| VmError::Ioctl {
                op: "GET_SUPPORTED_CPUID",
                source,
            })
    }

    /// One memory slot per guest memory region, in region order.
    pub fn register_memory(&self, mem: &GuestMemory) -> Result<(), VmError> {
        for (slot, region) in mem.iter().enumerate() {
            let slot = slot as u32;
            let guest_addr = region.start_addr().0;
            let size = region.len();
            let userspace_addr = region.as_ptr() as u64;
            let desc = kvm_userspace_memory_region {
                slot,
                flags: 0,
                guest_phys_addr: guest_addr,
                memory_size: size,
                userspace_addr,
            };
            // SAFETY: the region is a live mapping of `size` bytes owned by `mem`, which the
            // VMM keeps alive (builder hands a clone to the Vmm) for as long as the VM fd
            // exists; KVM accesses guest memory only through this mapping.
            unsafe { self.fd.set_user_memory_region(desc) }.map_err(|source| {
                VmError::MemorySlot {
                    slot,
                    guest_addr,
                    size,
                    source,
                }
            })?;
        }
        Ok(())
    }

    pub fn register_irqfd(&self, evt: &EventFd, gsi: u32) -> Result<(), VmError> {
        self.fd
            .register_irqfd(evt, gsi)
            .map_err(|source| VmError::Irqfd { gsi, source })
    }

    /// A 32-bit MMIO write of `datamatch` at `addr` signals `evt` inside KVM, with no exit.
    pub fn register_mmio_ioeventfd(
        &self,
        evt: &EventFd,
        addr: u64,
        datamatch: u32,
    ) -> Result<(), VmError> {
        self.fd
            .register_ioevent(evt, &IoEventAddress::Mmio(addr), datamatch)
            .map_err(|source| VmError::Ioeventfd {
                addr,
                datamatch,
                source,
            })
    }

    pub fn create_vcpu(&self, index: u8) -> Result<VcpuFd, VmError> {
        self.fd
            .create_vcpu(u64::from(index))
            .map_err(|source| VmError::CreateVcpu { index, source })
    }
}
