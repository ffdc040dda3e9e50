//! The only place that wires the parts together: from a validated `VmConfig` to a running
//! `Vmm` (vCPU threads started, VMM loop ready to run).
//!
//! Order, and why:
//! 1. Signals blocked and the kick handler installed before any thread exists (threads
//!    inherit the mask; see vmm::block_termination_signals).
//! 2. The VM, guest memory and its KVM slots, then the VM-wide x86 setup (TSS/identity
//!    map, irqchip, PIT; before any vCPU, see kvm::vm). Memory slots go first because,
//!    measured on the build machines, KVM_SET_USER_MEMORY_REGION takes ~5 ms once the
//!    in-kernel irqchip and PIT exist and ~0.2 ms before: most of the VMM's start time.
//! 4. Everything written into guest memory: kernel first (it may be large and its
//!    placement is fixed by the image), then the zero page, command line, MP table, GDT/IDT
//!    and page tables, which live in fixed low pages the kernel never loads into.
//! 5. Devices: buses, irqfds, ioeventfds. Before the vCPUs run, so that the first guest
//!    access finds them.
//! 6. vCPUs created and configured, then their threads started: the guest runs from here.

use std::fs::OpenOptions;
use std::sync::{Arc, Mutex};

use event_manager::{MutEventSubscriber, SubscriberOps};
use sandcell_proto::vmm::VmConfig;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::arch::x86_64::layout::{
    DEBUG_MMIO_START, FIRST_DEVICE_IRQ, LAST_DEVICE_IRQ, SERIAL_IRQ, VIRTIO_MMIO_SIZE,
    VIRTIO_MMIO_START,
};
use crate::arch::x86_64::{self, boot_params, mptable, regs};
use crate::bus::{Bus, BusError, SharedBusDevice};
use crate::control::{ControlError, ControlServer};
use crate::devices::IrqTrigger;
use crate::devices::debug::{DEBUG_LEN, DEBUG_PORT_BASE, DebugDevice};
use crate::devices::i8042::{I8042, I8042_BASE, I8042_LEN};
use crate::devices::power::PowerPort;
use crate::devices::serial::{
    COM1_BASE, COM1_LEN, ConsoleOutput, ConsoleSink, ConsoleWatch, SerialConsole,
};
use crate::devices::virtio::{self, MmioTransport, QUEUE_NOTIFY_OFFSET, VirtioDevice};
use crate::exit::ExitLatch;
use crate::kvm::vcpu::{self, VcpuShared};
use crate::kvm::vm::{Vm, VmError};
use crate::loader::{self, LoaderError, VirtioMmioDecl};
use crate::memory::{self, MemoryError, ram_ranges};
use crate::vmm::{DeviceSubscriber, ExitWatcher, Manager, SignalWatcher, Subscriber, Vmm};

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
    let started = std::time::Instant::now();
    let signalfd = crate::vmm::block_termination_signals().map_err(BuildError::Signals)?;
    vcpu::register_kick_handler()?;

    let vm = Vm::new()?;
    crate::log_debug!("build: VM created at {:?}", started.elapsed());
    let mem_bytes = u64::from(cfg.memory_mib) << 20;
    let (mem, _memfd) = memory::create_guest_memory(mem_bytes)?;
    crate::log_debug!("build: guest memory mapped at {:?}", started.elapsed());
    vm.register_memory(&mem)?;
    vm.setup_x86()?;
    crate::log_debug!("build: guest memory registered at {:?}", started.elapsed());

    let kernel = loader::load_kernel(&mem, &cfg.kernel)?;
    crate::log_debug!("build: kernel loaded at {:?}", started.elapsed());
    if crate::kvm::vm::host_kvm_is_pvm() && kernel_looks_like_linux(&cfg.kernel) {
        // Measured here: a vmlinux fails after ~10 s, a bzImage spends minutes emulating
        // its decompressor with no console output. Say so up front.
        crate::log_warn!(
            "this host's /dev/kvm is PVM (kvm_pvm): a stock Linux kernel runs only through \
             KVM's instruction emulator and will fail or take minutes; use the gvisor runtime \
             here (sandcell run --runtime gvisor)"
        );
    }

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
    let mut devices = Vec::new();
    if let Some(disk) = &cfg.disk {
        let block = virtio::block::Block::new(virtio::block::BlockConfig {
            base: disk.base.clone(),
            overlay: disk.overlay.clone(),
            read_only: false,
        })
        .map_err(|e| BuildError::Device {
            what: "virtio-blk",
            message: e.to_string(),
        })?;
        devices.push(attach_virtio(
            &vm,
            &mem,
            &mut mmio,
            &mut placer,
            Arc::new(Mutex::new(block)),
        )?);
    }
    if cfg.rng {
        let rng = virtio::rng::Rng::new().map_err(|e| BuildError::Device {
            what: "virtio-rng",
            message: e.to_string(),
        })?;
        devices.push(attach_virtio(
            &vm,
            &mem,
            &mut mmio,
            &mut placer,
            Arc::new(Mutex::new(rng)),
        )?);
    }
    if let Some(vsock) = &cfg.vsock {
        let dev = virtio::vsock::Vsock::new(u64::from(vsock.guest_cid), vsock.uds_path.clone())
            .map_err(|e| BuildError::Device {
                what: "virtio-vsock",
                message: e.to_string(),
            })?;
        devices.push(attach_virtio(
            &vm,
            &mem,
            &mut mmio,
            &mut placer,
            Arc::new(Mutex::new(dev)),
        )?);
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
    crate::log_debug!("build: boot structures written at {:?}", started.elapsed());

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
    crate::log_debug!("build: supported CPUID read at {:?}", started.elapsed());
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

    crate::log_debug!("build: vCPUs started at {:?}", started.elapsed());
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

/// A real kernel rather than a test payload of a few hundred bytes: only used to decide
/// whether the PVM warning is worth printing.
fn kernel_looks_like_linux(path: &std::path::Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.len() > 1 << 20)
}

/// Puts one virtio device behind an MMIO transport: bus window, queue notifications as
/// ioeventfds (a QueueNotify write then never leaves KVM), interrupt as irqfd.
fn attach_virtio<D>(
    vm: &Vm,
    mem: &memory::GuestMemory,
    mmio: &mut Bus,
    placer: &mut VirtioPlacer,
    device: Arc<Mutex<D>>,
) -> Result<DeviceSubscriber, BuildError>
where
    D: VirtioDevice + MutEventSubscriber + Send + 'static,
{
    let (base, irq) = placer.next()?;
    let irq_evt = eventfd("a virtio interrupt")?;
    vm.register_irqfd(&irq_evt, irq)?;
    let transport = MmioTransport::new(
        mem.clone(),
        device.clone() as Arc<Mutex<dyn VirtioDevice>>,
        irq_evt,
    )
    .map_err(|e| BuildError::Device {
        what: "virtio-mmio transport",
        message: e.to_string(),
    })?;
    for (index, evt) in transport.queue_notify_evts().into_iter().enumerate() {
        vm.register_mmio_ioeventfd(evt, base + QUEUE_NOTIFY_OFFSET, index as u32)?;
    }
    mmio.insert(
        base,
        VIRTIO_MMIO_SIZE,
        Arc::new(Mutex::new(transport)) as SharedBusDevice,
    )?;
    Ok(DeviceSubscriber {
        subscriber: device as Subscriber,
        id: None,
    })
}
