//! The only place that wires the parts together: from a validated `VmConfig` to a running
//! `Vmm` (vCPU threads started, VMM loop ready to run).
//!
//! Order, and why:
//! 1. Signals blocked and the kick handler installed before any thread exists (threads
//!    inherit the mask; see vmm::block_termination_signals).
//! 2. The VM (TSS/identity map, irqchip, PIT: before any vCPU, see kvm::vm).
//! 3. Guest memory, then its KVM slots.
//! 4. Everything written into guest memory: kernel first (it may be large and its
//!    placement is fixed by the image), then the zero page, command line, MP table, GDT/IDT
//!    and page tables, which live in fixed low pages the kernel never loads into.
//! 5. Devices: buses, irqfds, ioeventfds. Before the vCPUs run, so that the first guest
//!    access finds them.
//! 6. vCPUs created and configured, then their threads started: the guest runs from here.

use std::fs::OpenOptions;
use std::sync::{Arc, Mutex};

use event_manager::SubscriberOps;
use sandcell_proto::vmm::VmConfig;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::arch::x86_64::layout::{
    DEBUG_MMIO_START, FIRST_DEVICE_IRQ, LAST_DEVICE_IRQ, SERIAL_IRQ, VIRTIO_MMIO_SIZE,
    VIRTIO_MMIO_START,
};
use crate::arch::x86_64::{self, boot_params, mptable, regs};
use crate::bus::{Bus, BusError};
use crate::control::{ControlError, ControlServer};
use crate::devices::IrqTrigger;
use crate::devices::debug::{DEBUG_LEN, DEBUG_PORT_BASE, DebugDevice};
use crate::devices::i8042::{I8042, I8042_BASE, I8042_LEN};
use crate::devices::power::PowerPort;
use crate::devices::serial::{
    COM1_BASE, COM1_LEN, ConsoleOutput, ConsoleSink, ConsoleWatch, SerialConsole,
};
use crate::exit::ExitLatch;
use crate::kvm::vcpu::{self, VcpuShared};
use crate::kvm::vm::{Vm, VmError};
use crate::loader::{self, LoaderError, VirtioMmioDecl};
use crate::memory::{self, MemoryError, ram_ranges};
use crate::vmm::{ExitWatcher, Manager, SignalWatcher, Subscriber, Vmm};

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Vm(#[from] VmError),
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error(transparent)]
    Loader(#[from] LoaderError),
    #[error(transparent)]
    BootParams(#[from] boot_params::BootParamsError),
    #[error(transparent)]
    MpTable(#[from] mptable::MpTableError),
    #[error(transparent)]
    Regs(#[from] regs::RegsError),
    #[error(transparent)]
    VcpuSetup(#[from] x86_64::VcpuSetupError),
    #[error(transparent)]
    Vcpu(#[from] vcpu::VcpuError),
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error("placing a device on the bus: {0}")]
    Bus(#[from] BusError),
    #[error("creating an eventfd for {what}: {source}")]
    EventFd {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("setting up SIGTERM/SIGINT handling: {0}")]
    Signals(std::io::Error),
    #[error("creating the event manager: {0}")]
    EventManager(event_manager::Error),
    #[error("opening the serial log {path}: {source}")]
    SerialLog {
        path: String,
        source: std::io::Error,
    },
    #[error("creating the {what} device: {message}")]
    Device { what: &'static str, message: String },
    #[error("too many virtio devices: no interrupt line left after IRQ {LAST_DEVICE_IRQ}")]
    OutOfIrqs,
}

/// Options that are not part of the VM configuration.
#[derive(Debug, Clone, Copy, Default)]
pub struct BuildOptions {
    /// Add the test-only debug devices (devices::debug) on PIO and MMIO.
    pub debug_devices: bool,
}

fn eventfd(what: &'static str) -> Result<EventFd, BuildError> {
    EventFd::new(EFD_NONBLOCK).map_err(|source| BuildError::EventFd { what, source })
}

/// Places virtio-mmio devices: 4 KiB windows from VIRTIO_MMIO_START, IRQs from
/// FIRST_DEVICE_IRQ.
struct VirtioPlacer {
    next_base: u64,
    next_irq: u32,
    decls: Vec<VirtioMmioDecl>,
}

impl VirtioPlacer {
    fn next(&mut self) -> Result<(u64, u32), BuildError> {
        if self.next_irq > LAST_DEVICE_IRQ {
            return Err(BuildError::OutOfIrqs);
        }
        let slot = (self.next_base, self.next_irq);
        self.decls.push(VirtioMmioDecl {
            base: slot.0,
            size: VIRTIO_MMIO_SIZE,
            irq: slot.1,
        });
        self.next_base += VIRTIO_MMIO_SIZE;
        self.next_irq += 1;
        Ok(slot)
    }
}

/// Builds the VM and starts its vCPUs. The caller then runs `Vmm::run` on this thread.
pub fn build(cfg: &VmConfig, opts: BuildOptions) -> Result<Vmm, BuildError> {
    let signalfd = crate::vmm::block_termination_signals().map_err(BuildError::Signals)?;
    vcpu::register_kick_handler()?;

    let vm = Vm::new()?;
    let mem_bytes = u64::from(cfg.memory_mib) << 20;
    let (mem, _memfd) = memory::create_guest_memory(mem_bytes)?;
    vm.register_memory(&mem)?;

    let kernel = loader::load_kernel(&mem, &cfg.kernel)?;

    let latch = Arc::new(ExitLatch::new().map_err(|source| BuildError::EventFd {
        what: "the exit latch",
        source,
    })?);
    let console = Arc::new(ConsoleWatch::default());
    let mut em = Manager::new().map_err(BuildError::EventManager)?;
    let mut pio = Bus::new();
    let mut mmio = Bus::new();

    // COM1 on IRQ 4 through an irqfd.
    let serial_evt = eventfd("the serial interrupt")?;
    vm.register_irqfd(&serial_evt, SERIAL_IRQ)?;
    let out = match &cfg.serial_log {
        Some(path) => ConsoleOutput::File(
            OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(true)
                .open(path)
                .map_err(|source| BuildError::SerialLog {
                    path: path.display().to_string(),
                    source,
                })?,
        ),
        None => ConsoleOutput::Stdout,
    };
    let com1 = SerialConsole::new(
        IrqTrigger(serial_evt),
        ConsoleSink::new(out, console.clone()),
    );
    pio.insert(COM1_BASE, COM1_LEN, Arc::new(Mutex::new(com1)))?;
    pio.insert(
        I8042_BASE,
        I8042_LEN,
        Arc::new(Mutex::new(I8042::new(latch.clone(), console.clone()))),
    )?;
    pio.insert(
        u64::from(sandcell_proto::vmm::POWER_PORT),
        1,
        Arc::new(Mutex::new(PowerPort::new(latch.clone()))),
    )?;
    if opts.debug_devices {
        pio.insert(
            DEBUG_PORT_BASE,
            DEBUG_LEN,
            Arc::new(Mutex::new(DebugDevice::new(mem.clone()))),
        )?;
        mmio.insert(
            DEBUG_MMIO_START,
            DEBUG_LEN,
            Arc::new(Mutex::new(DebugDevice::new(mem.clone()))),
        )?;
    }

    // virtio devices.
    let mut placer = VirtioPlacer {
        next_base: VIRTIO_MMIO_START,
        next_irq: FIRST_DEVICE_IRQ,
        decls: Vec::new(),
    };
    let mut devices: Vec<crate::vmm::DeviceSubscriber> = Vec::new();
    if cfg.disk.is_some() || cfg.rng {
        return Err(BuildError::Device {
            what: "virtio",
            message: "virtio devices are not available in this build yet".into(),
        });
    }
    if cfg.vsock.is_some() {
        return Err(BuildError::Device {
            what: "virtio-vsock",
            message: "not available in this build yet".into(),
        });
    }
    for d in &mut devices {
        d.id = Some(em.add_subscriber(d.subscriber.clone()));
    }

    // Boot structures in guest memory.
    let cmdline = loader::build_cmdline(&cfg.cmdline, &placer.decls)?;
    let cmdline_len = loader::write_cmdline(&mem, &cmdline)?;
    let params =
        boot_params::build_boot_params(kernel.setup_header, cmdline_len, &ram_ranges(mem_bytes))?;
    boot_params::write_boot_params(&mem, &params)?;
    // Written for one vCPU too: it is also how a kernel without ACPI learns about the
    // IOAPIC and the ISA interrupt routing.
    mptable::write(&mem, cfg.vcpus)?;
    regs::write_gdt_idt(&mem)?;
    regs::write_page_tables(&mem)?;

    // Event sources of the VMM thread itself.
    em.add_subscriber(Arc::new(Mutex::new(ExitWatcher(latch.clone()))) as Subscriber);
    em.add_subscriber(Arc::new(Mutex::new(SignalWatcher {
        signalfd,
        latch: latch.clone(),
    })) as Subscriber);
    let control = match &cfg.control_socket {
        Some(path) => {
            let server = Arc::new(Mutex::new(ControlServer::bind(path)?));
            em.add_subscriber(server.clone() as Subscriber);
            Some(server)
        }
        None => None,
    };

    // vCPUs: all created and configured before any runs, so that the boot vCPU never
    // starts APs that KVM does not know yet.
    let supported_cpuid = vm.supported_cpuid()?;
    let mut fds = Vec::with_capacity(usize::from(cfg.vcpus));
    for index in 0..cfg.vcpus {
        let fd = vm.create_vcpu(index)?;
        let entry = (index == 0).then_some(kernel.entry);
        x86_64::setup_vcpu(&fd, index, cfg.vcpus, &supported_cpuid, entry)?;
        fds.push(fd);
    }
    let (events_tx, events_rx) = std::sync::mpsc::channel();
    let pio = Arc::new(pio);
    let mmio = Arc::new(mmio);
    let mut vcpus = Vec::with_capacity(fds.len());
    for (index, fd) in fds.into_iter().enumerate() {
        let shared = VcpuShared {
            pio: pio.clone(),
            mmio: mmio.clone(),
            latch: latch.clone(),
            console: console.clone(),
            events: events_tx.clone(),
        };
        vcpus.push(vcpu::spawn(index as u8, fd, shared)?);
    }

    Ok(Vmm {
        em,
        latch,
        console,
        control,
        vcpus,
        vcpu_events: events_rx,
        devices,
        paused: false,
        _memory: mem,
        _vm: vm,
    })
}
