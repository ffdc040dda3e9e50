//! The VMM thread: one event-manager epoll loop (control socket, signals, the exit latch,
//! device eventfds) plus the pause/resume and teardown logic.
//!
//! Pause: the vCPUs stop first (each completes its pending I/O, see kvm::vcpu), then every
//! device subscriber is taken out of the event manager, so no device touches guest memory
//! or raises an interrupt while paused; eventfds keep counting and are serviced on resume
//! (level-triggered epoll reports them again). Resume re-adds the devices first (their
//! `init` re-registers their fds), then lets the vCPUs run.

use sandcell_proto::sync::lock;
use std::fs::File;
use std::io::Read;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use event_manager::{
    EventManager, EventOps, EventSet, Events, MutEventSubscriber, SubscriberId, SubscriberOps,
};
use sandcell_proto::vmm::{ControlErrorKind, ControlRequest, ControlResponse, ExitStatus, VmState};

use crate::control::ControlServer;
use crate::devices::serial::ConsoleWatch;
use crate::exit::ExitLatch;
use crate::kvm::vcpu::{VcpuCommand, VcpuEvent, VcpuHandle};
use crate::machine::Machine;
use crate::snapshot::save::{SnapshotError, SnapshotParams};

pub type Subscriber = Arc<Mutex<dyn MutEventSubscriber + Send>>;
pub type Manager = EventManager<Subscriber>;

/// How long a pause may take before it is reported as failed.
const PAUSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a pause or a resume failed.
#[derive(Debug, thiserror::Error)]
pub enum RunStateError {
    #[error("the VM is stopping")]
    Stopping,
    #[error("{pending} vCPU(s) did not answer {command:?} within {timeout:?}")]
    NoAnswer {
        pending: usize,
        command: VcpuCommand,
        timeout: Duration,
    },
}

impl RunStateError {
    pub fn kind(&self) -> ControlErrorKind {
        match self {
            RunStateError::Stopping => ControlErrorKind::WrongState,
            RunStateError::NoAnswer { .. } => ControlErrorKind::Timeout,
        }
    }
}

/// Why a control request to a running VM failed; answered with [`Self::kind`] and the
/// message.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    RunState(#[from] RunStateError),
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error("the VM is stopping")]
    Stopping,
    #[error("this VMM already runs a VM; restore goes to a --wait-restore VMM")]
    AlreadyRunning,
}

impl RequestError {
    pub fn kind(&self) -> ControlErrorKind {
        match self {
            RequestError::RunState(e) => e.kind(),
            RequestError::Snapshot(e) => e.kind(),
            RequestError::Stopping | RequestError::AlreadyRunning => ControlErrorKind::WrongState,
        }
    }

    fn into_response(self) -> ControlResponse {
        ControlResponse::Error {
            kind: self.kind(),
            message: self.to_string(),
        }
    }
}

/// A device's event subscriber and, while it is registered, its id.
pub struct DeviceSubscriber {
    pub subscriber: Subscriber,
    pub id: Option<SubscriberId>,
}

/// Wakes the loop when the VM's end is decided.
pub struct ExitWatcher(pub Arc<ExitLatch>);

impl MutEventSubscriber for ExitWatcher {
    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new(self.0.event_fd(), EventSet::IN)) {
            tracing::error!("cannot watch the exit eventfd: {e}");
        }
    }

    fn process(&mut self, _events: Events, _ops: &mut EventOps) {
        let _ = self.0.event_fd().read();
    }
}

/// SIGTERM/SIGINT through a signalfd (the signals are blocked in every thread).
pub struct SignalWatcher {
    pub signalfd: File,
    pub latch: Arc<ExitLatch>,
}

impl MutEventSubscriber for SignalWatcher {
    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new(&self.signalfd, EventSet::IN)) {
            tracing::error!("cannot watch the signalfd: {e}");
        }
    }

    fn process(&mut self, _events: Events, _ops: &mut EventOps) {
        let mut info = [0u8; std::mem::size_of::<libc::signalfd_siginfo>()];
        while let Ok(n) = self.signalfd.read(&mut info) {
            if n < info.len() {
                break;
            }
            let signo = u32::from_ne_bytes([info[0], info[1], info[2], info[3]]);
            let name = if signo == libc::SIGTERM as u32 {
                "SIGTERM"
            } else {
                "SIGINT"
            };
            self.latch
                .request(ExitStatus::Stopped, format!("stopped by {name}"));
        }
    }
}

pub struct Vmm {
    pub(crate) em: Manager,
    pub(crate) latch: Arc<ExitLatch>,
    pub(crate) console: Arc<ConsoleWatch>,
    pub(crate) control: Option<Arc<Mutex<ControlServer>>>,
    pub(crate) vcpus: Vec<VcpuHandle>,
    pub(crate) vcpu_events: Receiver<VcpuEvent>,
    pub(crate) devices: Vec<DeviceSubscriber>,
    pub(crate) paused: bool,
    // Last: kept alive until the vCPU threads are joined (the memory slots point into its
    // guest memory).
    pub(crate) machine: Machine,
}

/// How the VM ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub status: ExitStatus,
    pub message: String,
    /// The last console output.
    pub console_tail: String,
}

impl Vmm {
    /// Runs the loop until the VM's end is decided, then stops the vCPUs.
    pub fn run(mut self) -> Outcome {
        // Before the loop's first turn, the first time a device handles what the guest put
        // in its queues; everything that needed more (building or restoring the VM) is done.
        if let Err(e) = crate::seccomp::install(crate::seccomp::ThreadKind::Vmm) {
            self.latch.request(ExitStatus::VmmError, e.to_string());
        }
        while !self.latch.is_set() {
            if let Err(e) = self.em.run() {
                self.latch.request(
                    ExitStatus::VmmError,
                    format!("the VMM event loop failed: {e}"),
                );
                break;
            }
            self.serve_control();
        }
        // Answer requests that arrived with the exit (e.g. the shutdown request itself).
        self.serve_control();
        for v in &self.vcpus {
            v.command(VcpuCommand::Finish);
        }
        for v in &mut self.vcpus {
            v.join();
        }
        let (status, message) = self.latch.reason().unwrap_or((
            ExitStatus::VmmError,
            "the VM ended without a recorded reason".into(),
        ));
        Outcome {
            status,
            message,
            console_tail: self.console.tail(),
        }
    }

    /// Whether console output goes to a file (then the tail is worth printing on failure).
    pub fn has_serial_log(&self) -> bool {
        self.machine.serial_log.is_some()
    }

    fn state(&self) -> VmState {
        if self.latch.is_set() {
            VmState::Stopping
        } else if self.paused {
            VmState::Paused
        } else {
            VmState::Running
        }
    }

    fn serve_control(&mut self) {
        let Some(control) = self.control.clone() else {
            return;
        };
        let requests = lock(&control).take_requests();
        self.answer(requests);
    }

    /// Executes `requests` in order and answers each on its connection.
    pub fn answer(
        &mut self,
        requests: Vec<(crate::control::ConnId, Result<ControlRequest, String>)>,
    ) {
        let Some(control) = self.control.clone() else {
            return;
        };
        for (id, req) in requests {
            let resp = match req {
                Ok(req) => self.handle(req),
                Err(message) => ControlResponse::Error {
                    kind: ControlErrorKind::BadRequest,
                    message,
                },
            };
            lock(&control).respond(id, &resp);
        }
    }

    pub fn handle(&mut self, req: ControlRequest) -> ControlResponse {
        let result: Result<(), RequestError> = match req {
            ControlRequest::Status => Ok(()),
            ControlRequest::Pause => self.pause().map_err(RequestError::from),
            ControlRequest::Resume => self.resume().map_err(RequestError::from),
            ControlRequest::Shutdown => {
                self.latch
                    .request(ExitStatus::Stopped, "stopped through the control socket");
                Ok(())
            }
            ControlRequest::Snapshot {
                state_path,
                mem_path,
                mode,
                disk_new_top,
            } => {
                if self.latch.is_set() {
                    Err(RequestError::Stopping)
                } else {
                    self.snapshot(SnapshotParams {
                        state_path: &state_path,
                        mem_path: &mem_path,
                        mode,
                        disk_new_top: disk_new_top.as_deref(),
                    })
                    .map_err(RequestError::from)
                }
            }
            ControlRequest::Restore { .. } => Err(RequestError::AlreadyRunning),
        };
        match result {
            Ok(()) => ControlResponse::Ok {
                state: self.state(),
            },
            Err(e) => e.into_response(),
        }
    }

    pub(crate) fn pause(&mut self) -> Result<(), RunStateError> {
        if self.latch.is_set() {
            return Err(RunStateError::Stopping);
        }
        if self.paused {
            return Ok(());
        }
        if let Err(e) = self.broadcast(VcpuCommand::Pause, |e| matches!(e, VcpuEvent::Paused(_))) {
            // Some vCPUs may have paused: let them run again rather than leave the VM half
            // stopped while reporting it running.
            let _ = self.broadcast(VcpuCommand::Resume, |e| matches!(e, VcpuEvent::Resumed(_)));
            return Err(e);
        }
        for d in &mut self.devices {
            if let Some(id) = d.id.take()
                && let Err(e) = self.em.remove_subscriber(id)
            {
                tracing::warn!("pausing a device: removing its subscriber failed: {e}");
            }
        }
        self.paused = true;
        Ok(())
    }

    pub(crate) fn resume(&mut self) -> Result<(), RunStateError> {
        if self.latch.is_set() {
            return Err(RunStateError::Stopping);
        }
        if !self.paused {
            return Ok(());
        }
        for d in &mut self.devices {
            if d.id.is_none() {
                d.id = Some(self.em.add_subscriber(d.subscriber.clone()));
            }
        }
        self.broadcast(VcpuCommand::Resume, |e| matches!(e, VcpuEvent::Resumed(_)))?;
        self.paused = false;
        Ok(())
    }

    /// Sends `cmd` to every vCPU and waits until each has answered with an event that
    /// satisfies `answered`.
    fn broadcast(
        &mut self,
        cmd: VcpuCommand,
        answered: impl Fn(&VcpuEvent) -> bool,
    ) -> Result<(), RunStateError> {
        // Answers left over from an earlier timed-out request must not count now.
        while self.vcpu_events.try_recv().is_ok() {}
        for v in &self.vcpus {
            v.command(cmd.clone());
        }
        let deadline = Instant::now() + PAUSE_TIMEOUT;
        let mut pending = self.vcpus.len();
        while pending > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.vcpu_events.recv_timeout(left) {
                Ok(ev) if answered(&ev) => pending -= 1,
                Ok(_) => {}
                Err(_) => {
                    return Err(RunStateError::NoAnswer {
                        pending,
                        command: cmd,
                        timeout: PAUSE_TIMEOUT,
                    });
                }
            }
        }
        Ok(())
    }
}

/// Blocks SIGTERM and SIGINT in the calling thread (and so in every thread it spawns
/// afterwards) and returns a signalfd that receives them. Must run before any thread is
/// spawned, or a thread with the default disposition could take the signal and kill the
/// process without an orderly exit.
pub fn block_termination_signals() -> std::io::Result<File> {
    use std::os::fd::FromRawFd;
    // SAFETY: sigset_t is plain data; sigemptyset initializes it before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t; the signal numbers are valid constants.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
    }
    // SAFETY: `set` is initialized; a null old-set pointer is allowed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    // SAFETY: `set` is initialized; -1 asks for a new signalfd. The result is checked.
    let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}
