//! `sandcell-vmm --wait-restore --control-socket PATH`: a VMM process started ahead of
//! time (exec, dynamic loading, signal setup, event loop, control socket, /dev/kvm opened
//! and KVM_CREATE_VM all done), idle
//! until a `restore` request names a snapshot. It then becomes that VM and serves the same
//! control socket, so the connection that asked for the restore gets the answer and can
//! go on with `pause`, `snapshot` and so on.
//!
//! While waiting: `status` answers `waiting`, `shutdown` (or SIGTERM) exits Stopped,
//! anything else is refused. A failed restore is answered with its error and the
//! process keeps waiting.

use sandcell_proto::sync::lock;
use std::path::Path;

use sandcell_proto::vmm::{ControlErrorKind, ControlRequest, ControlResponse, ExitStatus, VmState};

use crate::builder::{self, BuildError, RestoreSpec};
use crate::control::ConnId;
use crate::vmm::Vmm;

type Request = (ConnId, Result<ControlRequest, String>);

/// Waits for a successful restore and returns the VM, with the requests that arrived
/// after the restore request already answered. Err: how the process must exit instead.
pub fn wait_for_restore(control_socket: &Path) -> Result<Vmm, (ExitStatus, String)> {
    let mut p = builder::prelude(Some(control_socket))
        .map_err(|e| (ExitStatus::VmmError, format!("starting the VMM: {e}")))?;
    let Some(control) = p.control.clone() else {
        return Err((ExitStatus::VmmError, "no control socket".into()));
    };
    loop {
        if p.vm.is_none() {
            // Ahead of the request; a failure here is reported by the restore's own try.
            p.vm = crate::kvm::vm::Vm::new().ok();
        }
        if let Some((status, message)) = p.latch.reason() {
            return Err((status, message));
        }
        if let Err(e) = p.em.run() {
            return Err((
                ExitStatus::VmmError,
                format!("the VMM event loop failed: {e}"),
            ));
        }
        let requests = lock(&control).take_requests();
        let mut rest = requests.into_iter();
        while let Some((id, req)) = rest.next() {
            let resp = match req {
                Ok(ControlRequest::Restore {
                    state_path,
                    mem_path,
                    overrides,
                    paused,
                }) => {
                    let spec = RestoreSpec {
                        state_path,
                        mem_path,
                        overrides,
                        paused,
                    };
                    // The TAP, when the request says it came with it (one descriptor); any
                    // other descriptor is closed here.
                    let mut fds = lock(&control).take_fds(id).into_iter();
                    let tap = fds.next().filter(|_| spec.overrides.net_tap_fd);
                    drop(fds);
                    match builder::prepare(&mut p, &spec, tap) {
                        Ok(prepared) => return started(p, prepared, id, rest.collect()),
                        Err(e) => restore_failed(&e),
                    }
                }
                Ok(ControlRequest::Status) => ControlResponse::Ok {
                    state: VmState::Waiting,
                },
                Ok(ControlRequest::Shutdown) => {
                    p.latch
                        .request(ExitStatus::Stopped, "stopped through the control socket");
                    ControlResponse::Ok {
                        state: VmState::Stopping,
                    }
                }
                Ok(_) => ControlResponse::Error {
                    kind: ControlErrorKind::WrongState,
                    message: "no VM yet: this VMM waits for a restore request".into(),
                },
                Err(message) => ControlResponse::Error {
                    kind: ControlErrorKind::BadRequest,
                    message,
                },
            };
            lock(&control).respond(id, &resp);
        }
    }
}

/// Starts the restored VM, answers the restore request with the VM's state (as a
/// `status` would) and executes what came after it.
fn started(
    p: builder::Prelude,
    prepared: builder::Prepared,
    id: ConnId,
    rest: Vec<Request>,
) -> Result<Vmm, (ExitStatus, String)> {
    let control = p.control.clone();
    match builder::start(p, prepared) {
        Ok(mut vmm) => {
            let mut answered = vec![(id, Ok(ControlRequest::Status))];
            answered.extend(rest);
            vmm.answer(answered);
            Ok(vmm)
        }
        Err(e) => {
            let answer = restore_failed(&e);
            if let Some(c) = control {
                lock(&c).respond(id, &answer);
            }
            Err((ExitStatus::VmmError, format!("restore failed: {e}")))
        }
    }
}

/// The answer to a failed restore: a vCPU state KVM refused, a snapshot at fault (the
/// same request would fail again), or the host.
fn restore_failed(e: &BuildError) -> ControlResponse {
    let kind = match e {
        BuildError::VcpuState(_) => ControlErrorKind::VcpuState,
        e if e.is_bad_input() => ControlErrorKind::BadSnapshot,
        _ => ControlErrorKind::Host,
    };
    ControlResponse::Error {
        kind,
        message: format!("restore failed: {e}"),
    }
}
