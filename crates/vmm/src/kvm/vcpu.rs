//! vCPU threads: the run loop, exit dispatch to the buses, and the pause/resume state
//! machine.
//!
//! Each vCPU thread owns its `VcpuFd` and takes commands from an mpsc channel. The VMM
//! thread sends a command, then kicks the thread with `SIGRTMIN`: the signal interrupts a
//! running `KVM_RUN` (EINTR), and its handler also sets `kvm_run.immediate_exit`, which closes
//! the race of a signal arriving just before the thread enters `KVM_RUN` (KVM then returns
//! EINTR at once instead of running the guest until the next exit).
//!
//! States: Running -> (Pause) -> Paused -> (Resume) -> Running; any state -> (Finish) -> gone.
//! Once the VM's end is decided (ExitLatch set) a vCPU stops running guest code and only
//! answers commands until Finish.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::thread::JoinHandle;

use kvm_bindings::kvm_run;
use kvm_ioctls::{VcpuExit, VcpuFd};
use sandcell_proto::vmm::ExitStatus;
use vmm_sys_util::signal::{Killable, SIGRTMIN, register_signal_handler};

use super::vcpu_state::{self, SaveContext, VcpuState, VcpuStateError};
use crate::bus::Bus;
use crate::devices::serial::ConsoleWatch;
use crate::exit::ExitLatch;

#[derive(Debug, Clone)]
pub enum VcpuCommand {
    Pause,
    Resume,
    Finish,
    /// Read this vCPU's KVM state (only while paused; see kvm::vcpu_state).
    Save(Arc<SaveContext>),
}

#[derive(Debug)]
pub enum VcpuEvent {
    Paused(u8),
    Resumed(u8),
    Saved(u8, Box<Result<VcpuState, VcpuSaveError>>),
}

/// Why a vCPU answered a save request without its state.
#[derive(Debug, thiserror::Error)]
pub enum VcpuSaveError {
    /// KVM would not give the state (kept typed up to the control answer's kind).
    #[error(transparent)]
    State(#[from] VcpuStateError),
    #[error("vCPU {0} is not paused")]
    NotPaused(u8),
    #[error("the VM is stopping")]
    Stopping,
}

#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    #[error("registering the vCPU kick signal handler failed: {0}")]
    SignalHandler(vmm_sys_util::errno::Error),
    #[error("spawning the thread for vCPU {index} failed: {source}")]
    Spawn { index: u8, source: std::io::Error },
}

thread_local! {
    /// This thread's `kvm_run` page, for the kick signal handler. Const-initialized and
    /// without a destructor, so reading it from a signal handler is a plain TLS load.
    static KVM_RUN: Cell<*mut kvm_run> = const { Cell::new(std::ptr::null_mut()) };
}

extern "C" fn kick_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let run = KVM_RUN.with(|p| p.get());
    if !run.is_null() {
        // SAFETY: the pointer is this thread's kvm_run mapping, set by the vCPU thread while
        // its VcpuFd (which owns the mapping) is alive and cleared before it is dropped. A
        // volatile byte store is async-signal-safe; KVM reads the field on the next KVM_RUN.
        unsafe { std::ptr::addr_of_mut!((*run).immediate_exit).write_volatile(1) };
    }
}

/// The signal used to kick vCPU threads.
pub fn kick_signal() -> libc::c_int {
    SIGRTMIN()
}

/// Installs the kick handler (process-wide; once before spawning vCPU threads).
pub fn register_kick_handler() -> Result<(), VcpuError> {
    register_signal_handler(kick_signal(), kick_handler).map_err(VcpuError::SignalHandler)
}

/// How many unknown port/MMIO accesses a VM logs, so that a guest hammering an absent device
/// cannot flood the log.
const UNKNOWN_ACCESS_LOG_LIMIT: u32 = 64;

/// Counts the VM's unknown port/MMIO accesses (shared by its vCPUs) for the log limit.
#[derive(Debug, Default)]
pub struct UnknownAccessLog(AtomicU32);

impl UnknownAccessLog {
    fn record(&self, kind: &str, addr: u64, len: usize) {
        log_unknown(self.0.fetch_add(1, Ordering::Relaxed), kind, addr, len);
    }
}

fn log_unknown(n: u32, kind: &str, addr: u64, len: usize) {
    if n < UNKNOWN_ACCESS_LOG_LIMIT {
        tracing::debug!("unhandled {kind} at {addr:#x} ({len} bytes)");
    } else if n == UNKNOWN_ACCESS_LOG_LIMIT {
        tracing::debug!("more unhandled port/MMIO accesses: no longer logged");
    }
}

/// What the vCPU thread needs besides its fd.
pub struct VcpuShared {
    pub pio: Arc<Bus>,
    pub mmio: Arc<Bus>,
    pub latch: Arc<ExitLatch>,
    pub console: Arc<ConsoleWatch>,
    pub events: Sender<VcpuEvent>,
    pub unknown_access: Arc<UnknownAccessLog>,
}

pub struct VcpuHandle {
    pub index: u8,
    commands: Sender<VcpuCommand>,
    thread: Option<JoinHandle<()>>,
}

impl VcpuHandle {
    /// Sends `cmd` and kicks the thread out of KVM_RUN. A vCPU whose thread is gone has
    /// nothing to do: the send fails silently and the caller's wait for an answer decides.
    pub fn command(&self, cmd: VcpuCommand) {
        if self.commands.send(cmd).is_err() {
            return;
        }
        if let Some(t) = &self.thread
            && let Err(e) = t.kill(kick_signal())
        {
            tracing::debug!("kicking vCPU {} failed: {e}", self.index);
        }
    }

    pub fn join(&mut self) {
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::error!("vCPU {} thread panicked", self.index);
        }
    }
}

/// Starts the thread of vCPU `index`. With `start_paused` (a restore that stays paused)
/// it waits for a Resume before running guest code.
pub fn spawn(
    index: u8,
    fd: VcpuFd,
    shared: VcpuShared,
    start_paused: bool,
) -> Result<VcpuHandle, VcpuError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new()
        .name(format!("vcpu{index}"))
        .spawn(move || {
            Vcpu {
                index,
                fd,
                shared,
                commands: rx,
            }
            .run(start_paused)
        })
        .map_err(|source| VcpuError::Spawn { index, source })?;
    Ok(VcpuHandle {
        index,
        commands: tx,
        thread: Some(thread),
    })
}

struct Vcpu {
    index: u8,
    fd: VcpuFd,
    shared: VcpuShared,
    commands: Receiver<VcpuCommand>,
}

/// What the loop does after handling one exit.
enum Next {
    Continue,
    /// The VM's end is decided: stop running guest code.
    Stop,
    /// KVM_EXIT_INTERNAL_ERROR: the caller reads the details from the vCPU and ends the VM.
    InternalError,
}

impl Vcpu {
    fn run(mut self, start_paused: bool) {
        // Before the first KVM_RUN: from then on the guest drives what this thread does.
        if let Err(e) = crate::seccomp::install(crate::seccomp::ThreadKind::Vcpu) {
            self.shared
                .latch
                .request(ExitStatus::VmmError, format!("vCPU {}: {e}", self.index));
            return;
        }
        let run_ptr: *mut kvm_run = self.fd.get_kvm_run();
        KVM_RUN.with(|p| p.set(run_ptr));
        if !start_paused || self.parked() {
            self.run_loop();
        }
        KVM_RUN.with(|p| p.set(std::ptr::null_mut()));
    }

    fn run_loop(&mut self) {
        loop {
            // Commands first: a kick that arrived since the last KVM_RUN has set
            // immediate_exit, so the KVM_RUN below would return at once anyway.
            match self.commands.try_recv() {
                Ok(VcpuCommand::Pause) => {
                    if !self.paused() {
                        return;
                    }
                }
                Ok(VcpuCommand::Resume) => {
                    let _ = self.shared.events.send(VcpuEvent::Resumed(self.index));
                }
                Ok(VcpuCommand::Save(_)) => self.refuse_save(),
                Ok(VcpuCommand::Finish) | Err(TryRecvError::Disconnected) => return,
                Err(TryRecvError::Empty) => {}
            }
            if self.shared.latch.is_set() {
                self.stopped();
                return;
            }
            let next = self.run_once();
            // Clear a kick that raced with the exit; its command is in the channel and is
            // read at the top of the loop.
            self.fd.set_kvm_immediate_exit(0);
            if let Next::Stop = next {
                self.stopped();
                return;
            }
        }
    }

    /// Pause: finish any PIO/MMIO the last exit left pending by entering KVM_RUN once with
    /// immediate_exit set (KVM completes the instruction, e.g. loads an IN result into the
    /// register, and returns EINTR without running further), then report Paused and wait.
    /// Returns false if the vCPU must end.
    fn paused(&mut self) -> bool {
        self.fd.set_kvm_immediate_exit(1);
        let next = self.run_once();
        self.fd.set_kvm_immediate_exit(0);
        if let Next::Stop = next {
            // The pending I/O ended the VM (e.g. it was the power-off write).
            let _ = self.shared.events.send(VcpuEvent::Paused(self.index));
            self.stopped();
            return false;
        }
        let _ = self.shared.events.send(VcpuEvent::Paused(self.index));
        self.parked()
    }

    /// Paused: answer commands until Resume (true) or Finish (false). On Resume, tell a
    /// kvmclock guest it was stopped (KVM_KVMCLOCK_CTRL sets PVCLOCK_GUEST_STOPPED, so its
    /// soft-lockup watchdog ignores the gap). It is done here, just before running again,
    /// and not at pause time: a flag set at pause would be written into a snapshot's
    /// memory and never cleared in the restored guest.
    fn parked(&mut self) -> bool {
        loop {
            match self.commands.recv() {
                Ok(VcpuCommand::Resume) => {
                    let _ = self.fd.kvmclock_ctrl();
                    let _ = self.shared.events.send(VcpuEvent::Resumed(self.index));
                    return true;
                }
                Ok(VcpuCommand::Pause) => {
                    let _ = self.shared.events.send(VcpuEvent::Paused(self.index));
                }
                Ok(VcpuCommand::Save(ctx)) => {
                    let state =
                        vcpu_state::save(&self.fd, self.index, &ctx).map_err(VcpuSaveError::from);
                    let _ = self
                        .shared
                        .events
                        .send(VcpuEvent::Saved(self.index, Box::new(state)));
                }
                Ok(VcpuCommand::Finish) | Err(_) => return false,
            }
        }
    }

    fn refuse_save(&self) {
        let _ = self.shared.events.send(VcpuEvent::Saved(
            self.index,
            Box::new(Err(VcpuSaveError::NotPaused(self.index))),
        ));
    }

    /// The VM is ending: never run guest code again, answer commands until Finish.
    fn stopped(&mut self) {
        while let Ok(cmd) = self.commands.recv() {
            let ev = match cmd {
                VcpuCommand::Pause => VcpuEvent::Paused(self.index),
                VcpuCommand::Resume => VcpuEvent::Resumed(self.index),
                VcpuCommand::Save(_) => {
                    VcpuEvent::Saved(self.index, Box::new(Err(VcpuSaveError::Stopping)))
                }
                VcpuCommand::Finish => return,
            };
            let _ = self.shared.events.send(ev);
        }
    }

    /// One KVM_RUN and the handling of its exit.
    fn run_once(&mut self) -> Next {
        let result = self.fd.run();
        let next = dispatch(&self.shared, self.index, result);
        if let Next::InternalError = next {
            let detail = internal_error_detail(&mut self.fd);
            let msg = kvm_cannot_run_message(self.index, &detail);
            self.shared.latch.request(ExitStatus::KvmInternalError, msg);
            return Next::Stop;
        }
        next
    }
}

/// Handles one exit. Runs with the `kvm_run` page borrowed (the exit's data lives there),
/// so anything that needs the vCPU fd again is returned to the caller instead.
fn dispatch(sh: &VcpuShared, index: u8, result: Result<VcpuExit<'_>, kvm_ioctls::Error>) -> Next {
    let exit = match result {
        Ok(exit) => exit,
        Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
            return if sh.latch.is_set() {
                Next::Stop
            } else {
                Next::Continue
            };
        }
        Err(e) => {
            sh.latch.request(
                ExitStatus::VmmError,
                format!("KVM_RUN on vCPU {} failed: {e}", index),
            );
            return Next::Stop;
        }
    };
    match exit {
        VcpuExit::IoIn(port, data) => {
            if !sh.pio.read(u64::from(port), data) {
                // Nothing answers: an ISA bus floats high.
                data.fill(0xff);
                sh.unknown_access
                    .record("port read", u64::from(port), data.len());
            }
        }
        VcpuExit::IoOut(port, data) => {
            if !sh.pio.write(u64::from(port), data) {
                sh.unknown_access
                    .record("port write", u64::from(port), data.len());
            }
        }
        VcpuExit::MmioRead(addr, data) => {
            if !sh.mmio.read(addr, data) {
                data.fill(0xff);
                sh.unknown_access.record("MMIO read", addr, data.len());
            }
        }
        VcpuExit::MmioWrite(addr, data) => {
            if !sh.mmio.write(addr, data) {
                sh.unknown_access.record("MMIO write", addr, data.len());
            }
        }
        // With the in-kernel LAPIC, HLT is handled inside KVM; these are benign.
        VcpuExit::Hlt | VcpuExit::Intr | VcpuExit::IrqWindowOpen => {}
        VcpuExit::Shutdown => {
            if sh.console.panic_seen() {
                sh.latch.request(
                    ExitStatus::GuestPanic,
                    "the guest kernel panicked, then triple-faulted",
                );
            } else {
                sh.latch.request(
                    ExitStatus::TripleFault,
                    format!("vCPU {} triple-faulted (KVM_EXIT_SHUTDOWN)", index),
                );
            }
        }
        VcpuExit::SystemEvent(kind, _) => {
            let (status, what) = match kind {
                kvm_bindings::KVM_SYSTEM_EVENT_SHUTDOWN => (ExitStatus::PowerOff, "shutdown"),
                kvm_bindings::KVM_SYSTEM_EVENT_RESET => (ExitStatus::Reboot, "reset"),
                kvm_bindings::KVM_SYSTEM_EVENT_CRASH => (ExitStatus::GuestPanic, "crash"),
                _ => (ExitStatus::VmmError, "unknown"),
            };
            sh.latch
                .request(status, format!("KVM system event {kind} ({what})"));
        }
        VcpuExit::InternalError => return Next::InternalError,
        VcpuExit::FailEntry(reason, cpu) => {
            let detail = format!(
                "KVM_EXIT_FAIL_ENTRY, hardware entry failure reason {reason:#x} on host CPU {cpu}"
            );
            sh.latch.request(
                ExitStatus::KvmInternalError,
                kvm_cannot_run_message(index, &detail),
            );
        }
        other => {
            sh.latch.request(
                ExitStatus::VmmError,
                format!(
                    "vCPU {} stopped on an exit the VMM does not handle: {other:?}",
                    index
                ),
            );
        }
    }
    if sh.latch.is_set() {
        Next::Stop
    } else {
        Next::Continue
    }
}

/// Describes a KVM_EXIT_INTERNAL_ERROR: suberror, its data words, and where the guest was.
fn internal_error_detail(fd: &mut VcpuFd) -> String {
    let run = fd.get_kvm_run();
    // SAFETY: the exit reason was KVM_EXIT_INTERNAL_ERROR, so `internal` is the union member
    // the kernel filled in.
    let internal = unsafe { run.__bindgen_anon_1.internal };
    let ndata = (internal.ndata as usize).min(internal.data.len());
    let suberror = match internal.suberror {
        kvm_bindings::KVM_INTERNAL_ERROR_EMULATION => "instruction emulation failed",
        kvm_bindings::KVM_INTERNAL_ERROR_SIMUL_EX => "exception while delivering an exception",
        kvm_bindings::KVM_INTERNAL_ERROR_DELIVERY_EV => "event delivery failed",
        _ => "other",
    };
    let rip = fd
        .get_regs()
        .map(|r| format!("{:#x}", r.rip))
        .unwrap_or_else(|_| "unknown".into());
    format!(
        "KVM_EXIT_INTERNAL_ERROR suberror {} ({suberror}), data {:x?}, guest rip {rip}",
        internal.suberror,
        &internal.data[..ndata]
    )
}

/// The message for KvmInternalError: this is (almost always) the host, not the guest.
pub fn kvm_cannot_run_message(index: u8, detail: &str) -> String {
    let pvm = crate::kvm::vm::host_kvm_is_pvm();
    format!(
        "the host's KVM cannot run this guest (vCPU {index}: {detail}). {}Use the gvisor \
         runtime on this host (sandcell run --runtime gvisor), or run on a host with hardware \
         virtualization (VT-x/AMD-V, /proc/cpuinfo flags vmx or svm).",
        if pvm {
            "This host's /dev/kvm is PVM (module kvm_pvm), which runs only PVM-enlightened \
             guests, not a stock Linux kernel. "
        } else {
            ""
        }
    )
}
