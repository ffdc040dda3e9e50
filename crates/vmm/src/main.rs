//! `sandcell-vmm --config FILE.json | --config-json JSON [--debug-devices]`
//! `sandcell-vmm --restore STATE --mem MEM [overrides]`
//! `sandcell-vmm --wait-restore --control-socket PATH`
//! `sandcell-vmm flatten --base IMAGE [--layer LAYER]... --out LAYER`
//!
//! Every form takes `--no-seccomp` (debugging: no syscall filters). The filters are on
//! otherwise; `SANDCELL_VMM_SECCOMP=log` makes them log what they would kill (see
//! `sandcell_vmm::seccomp`). Every VM form takes `--jail JSON` (a
//! `sandcell_proto::vmm::JailSpec`): the VMM enters it before it opens anything of its VM
//! (see `sandcell_vmm::jail`).
//!
//! Runs one VM and exits with a `sandcell_proto::vmm::ExitStatus` code that says how it
//! ended; the reason is on stderr. A refused configuration or snapshot exits BadConfig.

use sandcell_proto::vmm::{ExitStatus, JailSpec};
use sandcell_vmm::builder::{self, BuildError};
use sandcell_vmm::config::{self, Command};
use sandcell_vmm::seccomp::{self, Mode};
use sandcell_vmm::vmm::Vmm;
use sandcell_vmm::{jail, logger, pool};

fn main() {
    logger::init_from_env();
    let (args, no_seccomp): (Vec<String>, Vec<String>) =
        std::env::args().skip(1).partition(|a| a != "--no-seccomp");
    seccomp::configure(seccomp_mode(!no_seccomp.is_empty()));
    no_core_dumps();
    let (args, jail_spec) = match take_jail(args) {
        Ok(v) => v,
        Err(message) => exit(ExitStatus::BadConfig, &message),
    };
    let command = match config::parse_command(args) {
        Ok(c) => c,
        Err(e) => exit(ExitStatus::BadConfig, &e.to_string()),
    };
    // After the command line (a --config file is read from the host's tree), before the VM
    // opens anything: its kernel, disks, sockets and /dev/kvm are reached inside the jail.
    if let Some(Err(e)) = jail_spec.as_ref().map(jail::enter) {
        let status = if e.is_bad_input() {
            ExitStatus::BadConfig
        } else {
            ExitStatus::VmmError
        };
        exit(status, &e.to_string());
    }
    let vmm = match command {
        Command::Boot(args) => {
            if let Err(e) = config::validate(&args.config) {
                exit(
                    ExitStatus::BadConfig,
                    &format!("invalid VM configuration: {e}"),
                );
            }
            let opts = builder::BuildOptions {
                debug_devices: args.debug_devices,
            };
            built(builder::build(&args.config, opts), "setting up the VM")
        }
        Command::Restore {
            spec,
            control_socket,
        } => {
            if let Err(e) = config::validate_restore(&spec, control_socket.as_deref()) {
                exit(ExitStatus::BadConfig, &format!("invalid restore: {e}"));
            }
            let vmm = builder::prelude(control_socket.as_deref())
                .and_then(|p| builder::restore(p, &spec));
            built(vmm, "restoring the VM")
        }
        Command::WaitRestore { control_socket } => {
            if let Err(e) = config::validate_restore_socket(&control_socket) {
                exit(ExitStatus::BadConfig, &e.to_string());
            }
            match pool::wait_for_restore(&control_socket) {
                Ok(vmm) => vmm,
                Err((status, message)) => exit(status, &message),
            }
        }
        Command::Flatten { base, layers, out } => {
            match sandcell_vmm::devices::virtio::block::overlay::flatten(&base, &layers, &out) {
                Ok(()) => std::process::exit(0),
                Err(e) => exit(ExitStatus::BadConfig, &format!("flatten: {e}")),
            }
        }
    };
    let serial_logged = vmm.has_serial_log();
    let outcome = vmm.run();
    let failed = !matches!(
        outcome.status,
        ExitStatus::PowerOff | ExitStatus::Stopped | ExitStatus::Reboot
    );
    if failed && serial_logged && !outcome.console_tail.is_empty() {
        eprintln!(
            "sandcell-vmm: last console output:\n{}",
            outcome.console_tail
        );
    }
    exit(outcome.status, &outcome.message);
}

fn built(vmm: Result<Vmm, BuildError>, what: &str) -> Vmm {
    match vmm {
        Ok(v) => v,
        Err(e) if e.is_bad_input() => exit(ExitStatus::BadConfig, &format!("{what} failed: {e}")),
        Err(e) => exit(ExitStatus::VmmError, &format!("{what} failed: {e}")),
    }
}

fn exit(status: ExitStatus, message: &str) -> ! {
    eprintln!(
        "sandcell-vmm: {} (exit {}): {message}",
        status.describe(),
        status.code()
    );
    std::process::exit(status.code());
}

/// Takes `--jail JSON` out of the arguments.
fn take_jail(args: Vec<String>) -> Result<(Vec<String>, Option<JailSpec>), String> {
    let Some(at) = args.iter().position(|a| a == "--jail") else {
        return Ok((args, None));
    };
    let mut args = args;
    if at + 1 >= args.len() {
        return Err("--jail needs a JSON jail specification".into());
    }
    let json = args.remove(at + 1);
    args.remove(at);
    if args.iter().any(|a| a == "--jail") {
        return Err("--jail given twice".into());
    }
    let spec = serde_json::from_str(&json).map_err(|e| format!("invalid --jail JSON: {e}"))?;
    Ok((args, Some(spec)))
}

/// The filters are on unless `--no-seccomp`; `SANDCELL_VMM_SECCOMP=log` only logs.
fn seccomp_mode(no_seccomp: bool) -> Mode {
    if no_seccomp {
        return Mode::Off;
    }
    match std::env::var("SANDCELL_VMM_SECCOMP").as_deref() {
        Ok("log") => Mode::Log,
        _ => Mode::Kill,
    }
}

/// A core dump of a VMM would hold its guest's memory, and a seccomp kill (SIGSYS) dumps
/// core by default: none, ever (hard limit too, so nothing in this process can raise it).
fn no_core_dumps() {
    let zero = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `zero` is a valid rlimit that outlives the call; the result is checked.
    if unsafe { libc::setrlimit(libc::RLIMIT_CORE, &zero) } != 0 {
        let e = std::io::Error::last_os_error();
        exit(
            ExitStatus::VmmError,
            &format!("setting RLIMIT_CORE to 0 failed: {e}"),
        );
    }
}
