//! `sandcell-vmm --config FILE.json | --config-json JSON [--debug-devices]`
//!
//! Boots one VM and exits with a `sandcell_proto::vmm::ExitStatus` code that says how it
//! ended; the reason is on stderr.

use sandcell_proto::vmm::ExitStatus;
use sandcell_vmm::{builder, config, logger};

fn main() {
    logger::init_from_env();
    let args = match config::parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => exit(ExitStatus::BadConfig, &e.to_string()),
    };
    if let Err(e) = config::validate(&args.config) {
        exit(
            ExitStatus::BadConfig,
            &format!("invalid VM configuration: {e}"),
        );
    }
    let opts = builder::BuildOptions {
        debug_devices: args.debug_devices,
    };
    let vmm = match builder::build(&args.config, opts) {
        Ok(v) => v,
        Err(e) => exit(
            ExitStatus::VmmError,
            &format!("setting up the VM failed: {e}"),
        ),
    };
    let outcome = vmm.run();
    let failed = !matches!(
        outcome.status,
        ExitStatus::PowerOff | ExitStatus::Stopped | ExitStatus::Reboot
    );
    if failed && args.config.serial_log.is_some() && !outcome.console_tail.is_empty() {
        eprintln!(
            "sandcell-vmm: last console output:\n{}",
            outcome.console_tail
        );
    }
    exit(outcome.status, &outcome.message);
}

fn exit(status: ExitStatus, message: &str) -> ! {
    eprintln!(
        "sandcell-vmm: {} (exit {}): {message}",
        status.describe(),
        status.code()
    );
    std::process::exit(status.code());
}
