//! The only place that wires the parts together: from a validated `VmConfig` (boot) or a
//! snapshot (`restore.rs`) to a running `Vmm` (vCPU threads started, VMM loop ready).
//!
//! Boot order, and why:
//! 1. Signals blocked and the kick handler installed before any thread exists (threads
//!    inherit the mask; see vmm::block_termination_signals); the event loop and the
//!    control socket ([`prelude`]; a `--wait-restore` VMM does this much ahead of time).
//! 2. The VM, guest memory and its KVM slots, then the VM-wide x86 setup (TSS/identity
//!    map, irqchip, PIT; before any vCPU, see kvm::vm). Memory slots go first because,
//!    measured on the build machines, KVM_SET_USER_MEMORY_REGION takes ~5 ms once the
//!    in-kernel irqchip and PIT exist and ~0.2 ms before: most of the VMM's start time.
//! 3. Everything written into guest memory: kernel first (it may be large and its
//!    placement is fixed by the image), then the zero page, command line, MP table, GDT/IDT
//!    and page tables, which live in fixed low pages the kernel never loads into.
//! 4. Devices: buses, irqfds, ioeventfds. Before the vCPUs run, so that the first guest
//!    access finds them.
//! 5. vCPUs created and configured, then their threads started: the guest runs from here.

mod restore;

pub use restore::{Prepared, RestoreSpec, prepare, restore, start};

use std::fs::OpenOptions;
use std::path::Path;
use std::sync::{Arc, Mutex};

use event_manager::{MutEventSubscriber, SubscriberOps};
use kvm_ioctls::VcpuFd;
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
    COM1_BASE, COM1_LEN, CappedFile, ConsoleOutput, ConsoleSink, ConsoleWatch, SERIAL_LOG_CAP,
    SerialConsole,
};
use crate::devices::virtio::mmio::MmioState;
use crate::devices::virtio::{self, MmioTransport, QUEUE_NOTIFY_OFFSET, VirtioDevice};
use crate::exit::ExitLatch;
use crate::kvm::vcpu::{self, VcpuShared};
use crate::kvm::vm::{Vm, VmError};
use crate::loader::{self, LoaderError, VirtioMmioDecl};
use crate::machine::{DebugPair, DeviceSet, Machine, VirtioHandle, VirtioSlot};
use crate::memory::{self, MemoryError, ram_ranges};
use crate::snapshot::Persist;
use crate::snapshot::memory::MemorySource;
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
    #[error(transparent)]
    StateFile(#[from] crate::snapshot::file::StateFileError),
    #[error("the snapshot {path} is invalid: {reason}")]
    BadSnapshot { path: String, reason: String },
    #[error(transparent)]
    SnapshotMemory(#[from] crate::snapshot::memory::SnapshotMemoryError),
    #[error(transparent)]
    VcpuState(#[from] crate::kvm::vcpu_state::VcpuStateError),
    #[error(transparent)]
    DeviceState(#[from] crate::snapshot::DeviceStateError),
}

impl BuildError {
    /// Whether the input (a snapshot and its files) is at fault rather than the host:
    /// `sandcell-vmm` then exits with BadConfig.
    pub fn is_bad_input(&self) -> bool {
        use crate::kvm::vcpu_state::VcpuStateError;
        use crate::snapshot::memory::SnapshotMemoryError as M;
        matches!(
            self,
            BuildError::StateFile(_)
                | BuildError::BadSnapshot { .. }
                | BuildError::DeviceState(_)
                | BuildError::VcpuState(VcpuStateError::Invalid { .. })
                | BuildError::SnapshotMemory(
                    M::SizeMismatch { .. } | M::NotAFile { .. } | M::Io { .. }
                )
        )
    }
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

/// The process-wide parts that exist before (and without) a VM: blocked termination
/// signals and the vCPU kick handler, the event loop with its exit and signal watchers,
/// and the control socket.
pub struct Prelude {
    pub em: Manager,
    pub latch: Arc<ExitLatch>,
    pub console: Arc<ConsoleWatch>,
    pub control: Option<Arc<Mutex<ControlServer>>>,
    /// A VM created ahead of time (KVM_CREATE_VM, nothing else: memory slots must come
    /// before the irqchip, and the memory size is not known yet), used by a restore.
    pub vm: Option<Vm>,
}

pub fn prelude(control_socket: Option<&Path>) -> Result<Prelude, BuildError> {
    let signalfd = crate::vmm::block_termination_signals().map_err(BuildError::Signals)?;
    vcpu::register_kick_handler()?;
    let latch = Arc::new(ExitLatch::new().map_err(|source| BuildError::EventFd {
        what: "the exit latch",
        source,
    })?);
    let mut em = Manager::new().map_err(BuildError::EventManager)?;
    em.add_subscriber(Arc::new(Mutex::new(ExitWatcher(latch.clone()))) as Subscriber);
    em.add_subscriber(Arc::new(Mutex::new(SignalWatcher {
        signalfd,
        latch: latch.clone(),
    })) as Subscriber);
    let control = match control_socket {
        Some(path) => {
            let server = Arc::new(Mutex::new(ControlServer::bind(path)?));
            em.add_subscriber(server.clone() as Subscriber);
            Some(server)
        }
        None => None,
    };
    Ok(Prelude {
        em,
        latch,
        console: Arc::new(ConsoleWatch::default()),
        control,
        vm: None,
    })
}

/// Every virtio-mmio placement, in order: 4 KiB windows from VIRTIO_MMIO_START, IRQs from
/// FIRST_DEVICE_IRQ. Devices take them in order; a snapshot's devices must sit where
/// this order put them.
pub fn virtio_slots() -> Vec<(u64, u32)> {
    (FIRST_DEVICE_IRQ..=LAST_DEVICE_IRQ)
        .enumerate()
        .map(|(i, irq)| (VIRTIO_MMIO_START + i as u64 * VIRTIO_MMIO_SIZE, irq))
        .collect()
}

/// Builds the VM and starts its vCPUs. The caller then runs `Vmm::run` on this thread.
pub fn build(cfg: &VmConfig, opts: BuildOptions) -> Result<Vmm, BuildError> {
    let p = prelude(cfg.control_socket.as_deref())?;
    build_with(p, cfg, opts)
}

fn build_with(p: Prelude, cfg: &VmConfig, opts: BuildOptions) -> Result<Vmm, BuildError> {
    let started = std::time::Instant::now();
    let vm = Vm::new()?;
    tracing::debug!("build: VM created at {:?}", started.elapsed());
    let mem_bytes = u64::from(cfg.memory_mib) << 20;
    let (mem, memfd) = memory::create_guest_memory(mem_bytes)?;
    tracing::debug!("build: guest memory mapped at {:?}", started.elapsed());
    vm.register_memory(&mem)?;
    vm.setup_x86()?;
    tracing::debug!("build: guest memory registered at {:?}", started.elapsed());

    let kernel = loader::load_kernel(&mem, &cfg.kernel)?;
    tracing::debug!("build: kernel loaded at {:?}", started.elapsed());
    if crate::kvm::vm::host_kvm_is_pvm() && kernel_looks_like_linux(&cfg.kernel) {
        // Measured here: a vmlinux fails after ~10 s, a bzImage spends minutes emulating
        // its decompressor with no console output. Say so up front.
        tracing::warn!(
            "this host's /dev/kvm is PVM (kvm_pvm): a stock Linux kernel runs only through \
             KVM's instruction emulator and will fail or take minutes; use the gvisor runtime \
             here (sandcell run --runtime gvisor)"
        );
    }

    let mut pio = Bus::new();
    let mut mmio = Bus::new();
    let (serial, debug) = attach_legacy(
        &vm,
        &mem,
        &p,
        &mut pio,
        &mut mmio,
        cfg.serial_log.as_deref(),
        LegacyState::Fresh {
            debug_devices: opts.debug_devices,
        },
    )?;

    // virtio devices.
    let mut slots = virtio_slots().into_iter();
    let mut decls = Vec::new();
    let mut virtio = Vec::new();
    let mut handles = Vec::new();
    if let Some(disk) = &cfg.disk {
        let block = virtio::block::Block::new(virtio::block::BlockConfig {
            base: disk.base.clone(),
            overlay: disk.overlay.clone(),
            layers: disk.layers.clone(),
            read_only: false,
        })
        .map_err(|e| device_err("virtio-blk", e))?;
        handles.push(VirtioHandle::Block(Arc::new(Mutex::new(block))));
    }
    if cfg.rng {
        let rng = virtio::rng::Rng::new().map_err(|e| device_err("virtio-rng", e))?;
        handles.push(VirtioHandle::Rng(Arc::new(Mutex::new(rng))));
    }
    if let Some(vsock) = &cfg.vsock {
        let dev = virtio::vsock::Vsock::new(u64::from(vsock.guest_cid), vsock.uds_path.clone())
            .map_err(|e| device_err("virtio-vsock", e))?;
        handles.push(VirtioHandle::Vsock(Arc::new(Mutex::new(dev))));
    }
    if let Some(net) = &cfg.net {
        handles.push(VirtioHandle::Net(Arc::new(Mutex::new(net_device(net)?))));
    }
    for fs in &cfg.fs {
        let dev =
            virtio::fs::Fs::new(&fs.tag, &fs.socket).map_err(|e| device_err("virtio-fs", e))?;
        handles.push(VirtioHandle::Fs(Arc::new(Mutex::new(dev))));
    }
    for handle in handles {
        let (base, irq) = slots.next().ok_or(BuildError::OutOfIrqs)?;
        decls.push(VirtioMmioDecl {
            base,
            size: VIRTIO_MMIO_SIZE,
            irq,
        });
        virtio.push(attach_virtio(
            &vm, &mem, &mut mmio, base, irq, handle, None,
        )?);
    }

    // Boot structures in guest memory.
    let cmdline = loader::build_cmdline(&cfg.cmdline, &decls)?;
    let cmdline_len = loader::write_cmdline(&mem, &cmdline)?;
    let params =
        boot_params::build_boot_params(kernel.setup_header, cmdline_len, &ram_ranges(mem_bytes))?;
    boot_params::write_boot_params(&mem, &params)?;
    // Written for one vCPU too: it is also how a kernel without ACPI learns about the
    // IOAPIC and the ISA interrupt routing.
    mptable::write(&mem, cfg.vcpus)?;
    regs::write_gdt_idt(&mem)?;
    regs::write_page_tables(&mem)?;
    tracing::debug!("build: boot structures written at {:?}", started.elapsed());

    // vCPUs: all created and configured before any runs, so that the boot vCPU never
    // starts APs that KVM does not know yet.
    let supported_cpuid = vm.supported_cpuid()?;
    tracing::debug!("build: supported CPUID read at {:?}", started.elapsed());
    let mut fds = Vec::with_capacity(usize::from(cfg.vcpus));
    for index in 0..cfg.vcpus {
        let fd = vm.create_vcpu(index)?;
        let entry = (index == 0).then_some(kernel.entry);
        x86_64::setup_vcpu(&fd, index, cfg.vcpus, &supported_cpuid, entry)?;
        fds.push(fd);
    }
    let machine = Machine {
        vcpu_count: cfg.vcpus,
        memory_bytes: mem_bytes,
        serial_log: cfg.serial_log.clone(),
        devices: DeviceSet {
            serial,
            debug,
            virtio,
        },
        memory_source: MemorySource::Memfd(memfd),
        frozen_images: Vec::new(),
        memory: mem,
        vm,
    };
    let vmm = finish(p, machine, fds, pio, mmio, false)?;
    tracing::debug!("build: vCPUs started at {:?}", started.elapsed());
    Ok(vmm)
}

/// The net device on its TAP, attached by name in this process's network namespace.
fn net_device(net: &sandcell_proto::vmm::NetConfig) -> Result<virtio::net::Net, BuildError> {
    let mac = virtio::net::parse_mac(&net.guest_mac).ok_or_else(|| BuildError::Device {
        what: "virtio-net",
        message: format!(
            "guest_mac {:?} is not a MAC address (aa:bb:cc:dd:ee:ff)",
            net.guest_mac
        ),
    })?;
    let tap = virtio::net::Tap::open(&net.tap).map_err(|e| device_err("virtio-net", e))?;
    virtio::net::Net::new(Box::new(tap), mac).map_err(|e| device_err("virtio-net", e))
}

fn device_err(what: &'static str, e: impl std::fmt::Display) -> BuildError {
    BuildError::Device {
        what,
        message: e.to_string(),
    }
}

/// A real kernel rather than a test payload of a few hundred bytes: only used to decide
/// whether the PVM warning is worth printing.
fn kernel_looks_like_linux(path: &std::path::Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.len() > 1 << 20)
}

/// How the legacy devices start: new, or from a snapshot.
enum LegacyState<'a> {
    Fresh { debug_devices: bool },
    Saved(&'a crate::snapshot::state::DevicesState),
}

/// COM1 (IRQ 4 through an irqfd), the i8042, the power port and, if asked for, the debug
/// devices. From a snapshot, this runs after the irqchip state is restored: the serial
/// device re-raises a pending interrupt, which SET_IRQCHIP would otherwise overwrite.
fn attach_legacy(
    vm: &Vm,
    mem: &memory::GuestMemory,
    p: &Prelude,
    pio: &mut Bus,
    mmio: &mut Bus,
    serial_log: Option<&Path>,
    state: LegacyState<'_>,
) -> Result<(Arc<Mutex<SerialConsole>>, Option<DebugPair>), BuildError> {
    let serial_evt = eventfd("the serial interrupt")?;
    vm.register_irqfd(&serial_evt, SERIAL_IRQ)?;
    let out = match serial_log {
        Some(path) => ConsoleOutput::File(CappedFile::new(
            OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(true)
                .open(path)
                .map_err(|source| BuildError::SerialLog {
                    path: path.display().to_string(),
                    source,
                })?,
            path,
            SERIAL_LOG_CAP,
        )),
        None => ConsoleOutput::Stdout,
    };
    let sink = ConsoleSink::new(out, p.console.clone());
    let (com1, debug_state) = match state {
        LegacyState::Fresh { debug_devices } => (
            SerialConsole::new(IrqTrigger(serial_evt), sink),
            debug_devices.then(Default::default),
        ),
        LegacyState::Saved(s) => (
            SerialConsole::restore((IrqTrigger(serial_evt), sink), &s.serial)?,
            s.debug,
        ),
    };
    let serial = Arc::new(Mutex::new(com1));
    pio.insert(COM1_BASE, COM1_LEN, serial.clone())?;
    pio.insert(
        I8042_BASE,
        I8042_LEN,
        Arc::new(Mutex::new(I8042::new(p.latch.clone(), p.console.clone()))),
    )?;
    pio.insert(
        u64::from(sandcell_proto::vmm::POWER_PORT),
        1,
        Arc::new(Mutex::new(PowerPort::new(p.latch.clone()))),
    )?;
    let debug = match debug_state {
        Some((pio_state, mmio_state)) => {
            let restore = |s| match DebugDevice::restore(mem.clone(), s) {
                Ok(d) => Arc::new(Mutex::new(d)),
                Err(never) => match never {},
            };
            let on_pio = restore(&pio_state);
            let on_mmio = restore(&mmio_state);
            pio.insert(DEBUG_PORT_BASE, DEBUG_LEN, on_pio.clone())?;
            mmio.insert(DEBUG_MMIO_START, DEBUG_LEN, on_mmio.clone())?;
            Some((on_pio, on_mmio))
        }
        None => None,
    };
    Ok((serial, debug))
}

/// Puts one virtio device behind an MMIO transport: bus window, queue notifications as
/// ioeventfds (a QueueNotify write then never leaves KVM), interrupt as irqfd. With a
/// saved transport state, the transport (and the device's queues) are restored from it.
fn attach_virtio(
    vm: &Vm,
    mem: &memory::GuestMemory,
    mmio: &mut Bus,
    base: u64,
    irq: u32,
    device: VirtioHandle,
    saved: Option<&MmioState>,
) -> Result<VirtioSlot, BuildError> {
    let dyn_device: Arc<Mutex<dyn VirtioDevice>> = match &device {
        VirtioHandle::Block(d) => d.clone(),
        VirtioHandle::Net(d) => d.clone(),
        VirtioHandle::Rng(d) => d.clone(),
        VirtioHandle::Vsock(d) => d.clone(),
        VirtioHandle::Fs(d) => d.clone(),
    };
    let irq_evt = eventfd("a virtio interrupt")?;
    vm.register_irqfd(&irq_evt, irq)?;
    let transport = match saved {
        None => MmioTransport::new(mem.clone(), dyn_device, irq_evt)
            .map_err(|e| device_err("virtio-mmio transport", e))?,
        Some(state) => MmioTransport::restore((mem.clone(), dyn_device, irq_evt), state)?,
    };
    for (index, evt) in transport.queue_notify_evts().into_iter().enumerate() {
        vm.register_mmio_ioeventfd(evt, base + QUEUE_NOTIFY_OFFSET, index as u32)?;
    }
    let transport = Arc::new(Mutex::new(transport));
    mmio.insert(base, VIRTIO_MMIO_SIZE, transport.clone() as SharedBusDevice)?;
    Ok(VirtioSlot {
        base,
        irq,
        transport,
        device,
    })
}

fn subscriber(handle: &VirtioHandle) -> Subscriber {
    match handle {
        VirtioHandle::Block(d) => d.clone() as Arc<Mutex<dyn MutEventSubscriber + Send>>,
        VirtioHandle::Net(d) => d.clone(),
        VirtioHandle::Rng(d) => d.clone(),
        VirtioHandle::Vsock(d) => d.clone(),
        VirtioHandle::Fs(d) => d.clone(),
    }
}

/// The common end of boot and restore: device subscribers into the event loop (unless
/// the VM starts paused: resume adds them), vCPU threads started.
fn finish(
    mut p: Prelude,
    machine: Machine,
    fds: Vec<VcpuFd>,
    pio: Bus,
    mmio: Bus,
    start_paused: bool,
) -> Result<Vmm, BuildError> {
    let mut devices: Vec<DeviceSubscriber> = machine
        .devices
        .virtio
        .iter()
        .map(|s| DeviceSubscriber {
            subscriber: subscriber(&s.device),
            id: None,
        })
        .collect();
    if !start_paused {
        for d in &mut devices {
            d.id = Some(p.em.add_subscriber(d.subscriber.clone()));
        }
    }
    let (events_tx, events_rx) = std::sync::mpsc::channel();
    let pio = Arc::new(pio);
    let mmio = Arc::new(mmio);
    let mut vcpus = Vec::with_capacity(fds.len());
    let unknown_access = Arc::new(vcpu::UnknownAccessLog::default());
    for (index, fd) in fds.into_iter().enumerate() {
        let shared = VcpuShared {
            pio: pio.clone(),
            mmio: mmio.clone(),
            latch: p.latch.clone(),
            console: p.console.clone(),
            events: events_tx.clone(),
            unknown_access: unknown_access.clone(),
        };
        vcpus.push(vcpu::spawn(index as u8, fd, shared, start_paused)?);
    }
    Ok(Vmm {
        em: p.em,
        latch: p.latch,
        console: p.console,
        control: p.control,
        vcpus,
        vcpu_events: events_rx,
        devices,
        paused: start_paused,
        machine,
    })
}
