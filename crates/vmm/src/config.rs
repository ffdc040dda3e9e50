//! Command-line arguments and VM configuration validation. Everything here runs before
//! /dev/kvm is opened; a refusal exits with `ExitStatus::BadConfig`.

use std::fs::File;
use std::path::{Path, PathBuf};

use sandcell_proto::vmm::VmConfig;

use crate::arch::x86_64::layout::CMDLINE_MAX_SIZE;

pub const MIN_VCPUS: u8 = 1;
pub const MAX_VCPUS: u8 = 32;
pub const MIN_MEMORY_MIB: u32 = 1;
pub const MAX_MEMORY_MIB: u32 = 65536;
/// The largest configuration file read (a VmConfig is a few hundred bytes).
const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// sockaddr_un.sun_path holds 108 bytes including the NUL.
const MAX_SOCKET_PATH: usize = 107;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{USAGE}")]
    Usage,
    #[error("unknown argument {0:?}; {USAGE}")]
    UnknownArgument(String),
    #[error("reading the configuration file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the configuration file {path} is larger than {MAX_CONFIG_BYTES} bytes")]
    TooLarge { path: PathBuf },
    #[error("parsing the VM configuration: {0}")]
    Parse(serde_json::Error),
    #[error("net: {0}")]
    Net(String),
    #[error("vcpus = {0}: must be between {MIN_VCPUS} and {MAX_VCPUS}")]
    Vcpus(u8),
    #[error("memory_mib = {0}: must be between {MIN_MEMORY_MIB} and {MAX_MEMORY_MIB}")]
    Memory(u32),
    #[error("{what} {path}: cannot be opened for reading: {source}")]
    Unreadable {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} {path}: is not a regular file")]
    NotAFile { what: &'static str, path: PathBuf },
    #[error("{what} {path}: the directory {dir} does not exist")]
    NoParentDir {
        what: &'static str,
        path: PathBuf,
        dir: PathBuf,
    },
    #[error("{what} {path}: longer than {MAX_SOCKET_PATH} bytes, the limit for a Unix socket path")]
    SocketPathTooLong { what: &'static str, path: PathBuf },
    #[error("vsock guest_cid = {0}: must be at least 3 (0-2 are reserved) and not u32::MAX")]
    GuestCid(u32),
    #[error("the kernel command line is {0} bytes; at most {max} fit", max = CMDLINE_MAX_SIZE - 1)]
    CmdlineTooLong(usize),
    #[error("the kernel command line contains a NUL byte")]
    CmdlineNul,
    #[error("fs: {0}")]
    Fs(String),
}

/// What `sandcell-vmm` was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    pub config: VmConfig,
    /// Add the test-only debug devices (see devices::debug).
    pub debug_devices: bool,
}

/// Every way `sandcell-vmm` can be started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Boot a VM from its configuration.
    Boot(Args),
    /// Restore a VM from a snapshot.
    Restore {
        spec: crate::builder::RestoreSpec,
        control_socket: Option<PathBuf>,
    },
    /// Start idle, bind the control socket, and wait for a `restore` request.
    WaitRestore { control_socket: PathBuf },
    /// `sandcell-vmm flatten`: merge a layer chain into one layer and exit.
    Flatten {
        base: PathBuf,
        layers: Vec<PathBuf>,
        out: PathBuf,
    },
}

pub const USAGE: &str =
    "usage: sandcell-vmm (--config FILE.json | --config-json JSON) [--debug-devices]
       sandcell-vmm --restore STATE --mem MEM [--control-socket PATH] [--paused]
                    [--vsock-uds PATH] [--disk-overlay PATH] [--disk-layer PATH]... [--disk-base PATH]
                    [--serial-log PATH] [--net-tap NAME] [--overrides-json JSON]
       sandcell-vmm --wait-restore --control-socket PATH
       sandcell-vmm flatten --base IMAGE [--layer LAYER]... --out LAYER";

/// Parses `argv[1..]` into a [`Command`]. Nothing is validated yet.
pub fn parse_command<I: IntoIterator<Item = String>>(args: I) -> Result<Command, ConfigError> {
    let args: Vec<String> = args.into_iter().collect();
    if args.first().is_some_and(|a| a == "flatten") {
        return parse_flatten(&args[1..]);
    }
    if !args
        .iter()
        .any(|a| a == "--restore" || a == "--wait-restore")
    {
        return parse_args(args).map(Command::Boot);
    }
    let mut it = args.into_iter();
    let mut state = None;
    let mut mem = None;
    let mut wait = false;
    let mut paused = false;
    let mut control_socket = None;
    let mut overrides = sandcell_proto::vmm::RestoreOverrides::default();
    let value = |it: &mut std::vec::IntoIter<String>| it.next().ok_or(ConfigError::Usage);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--restore" => state = Some(PathBuf::from(value(&mut it)?)),
            "--mem" => mem = Some(PathBuf::from(value(&mut it)?)),
            "--wait-restore" => wait = true,
            "--paused" => paused = true,
            "--control-socket" => control_socket = Some(PathBuf::from(value(&mut it)?)),
            "--vsock-uds" => overrides.vsock_uds_path = Some(value(&mut it)?.into()),
            "--disk-overlay" => overrides.disk_overlay = Some(value(&mut it)?.into()),
            "--disk-layer" => overrides
                .disk_layers
                .get_or_insert_with(Vec::new)
                .push(value(&mut it)?.into()),
            "--disk-base" => overrides.disk_base = Some(value(&mut it)?.into()),
            "--serial-log" => overrides.serial_log = Some(value(&mut it)?.into()),
            "--net-tap" => overrides.net_tap = Some(value(&mut it)?),
            "--overrides-json" => {
                overrides = serde_json::from_str(&value(&mut it)?).map_err(ConfigError::Parse)?;
            }
            _ => return Err(ConfigError::UnknownArgument(arg)),
        }
    }
    match (wait, state, mem, control_socket) {
        (true, None, None, Some(control_socket)) if !paused => {
            Ok(Command::WaitRestore { control_socket })
        }
        (false, Some(state_path), Some(mem_path), control_socket) => Ok(Command::Restore {
            spec: crate::builder::RestoreSpec {
                state_path,
                mem_path,
                overrides,
                paused,
            },
            control_socket,
        }),
        _ => Err(ConfigError::Usage),
    }
}

fn parse_flatten(args: &[String]) -> Result<Command, ConfigError> {
    let mut it = args.iter();
    let (mut base, mut out, mut layers) = (None, None, Vec::new());
    while let Some(arg) = it.next() {
        let mut value = || it.next().map(PathBuf::from).ok_or(ConfigError::Usage);
        match arg.as_str() {
            "--base" => base = Some(value()?),
            "--layer" => layers.push(value()?),
            "--out" => out = Some(value()?),
            _ => return Err(ConfigError::UnknownArgument(arg.clone())),
        }
    }
    match (base, out) {
        (Some(base), Some(out)) => Ok(Command::Flatten { base, layers, out }),
        _ => Err(ConfigError::Usage),
    }
}

/// A `--wait-restore` VMM's control socket path.
pub fn validate_restore_socket(path: &Path) -> Result<(), ConfigError> {
    socket_path("control_socket", path)
}

/// Checks a restore's paths before anything is opened.
pub fn validate_restore(
    spec: &crate::builder::RestoreSpec,
    control_socket: Option<&Path>,
) -> Result<(), ConfigError> {
    readable_file("snapshot state file", &spec.state_path)?;
    readable_file("snapshot memory file", &spec.mem_path)?;
    let o = &spec.overrides;
    if let Some(uds) = &o.vsock_uds_path {
        let longest = PathBuf::from(format!("{}_{}", uds.display(), u16::MAX));
        socket_path("vsock uds_path", &longest)?;
    }
    if let Some(overlay) = &o.disk_overlay {
        if overlay.exists() {
            readable_file("disk overlay", overlay)?;
        } else {
            creatable("disk overlay", overlay)?;
        }
    }
    for layer in o.disk_layers.iter().flatten() {
        readable_file("disk layer", layer)?;
    }
    if let Some(base) = &o.disk_base {
        readable_file("disk base", base)?;
    }
    if let Some(log) = &o.serial_log {
        creatable("serial_log", log)?;
    }
    if let Some(sock) = control_socket {
        socket_path("control_socket", sock)?;
    }
    Ok(())
}

/// Parses `argv[1..]` of a boot. The configuration is parsed but not yet validated.
pub fn parse_args<I: IntoIterator<Item = String>>(args: I) -> Result<Args, ConfigError> {
    let mut it = args.into_iter();
    let mut config = None;
    let mut debug_devices = false;
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--config" => {
                let path = PathBuf::from(it.next().ok_or(ConfigError::Usage)?);
                config = Some(read_config_file(&path)?);
            }
            "--config-json" => {
                let json = it.next().ok_or(ConfigError::Usage)?;
                config = Some(serde_json::from_str(&json).map_err(ConfigError::Parse)?);
            }
            "--debug-devices" => debug_devices = true,
            "-h" | "--help" => return Err(ConfigError::Usage),
            _ => return Err(ConfigError::UnknownArgument(arg)),
        }
    }
    Ok(Args {
        config: config.ok_or(ConfigError::Usage)?,
        debug_devices,
    })
}

fn read_config_file(path: &Path) -> Result<VmConfig, ConfigError> {
    use std::io::Read;
    let file = File::open(path).map_err(|source| ConfigError::Read {
        path: path.into(),
        source,
    })?;
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(ConfigError::TooLarge { path: path.into() });
    }
    serde_json::from_str(&text).map_err(ConfigError::Parse)
}

fn readable_file(what: &'static str, path: &Path) -> Result<(), ConfigError> {
    let f = File::open(path).map_err(|source| ConfigError::Unreadable {
        what,
        path: path.into(),
        source,
    })?;
    let meta = f.metadata().map_err(|source| ConfigError::Unreadable {
        what,
        path: path.into(),
        source,
    })?;
    if !meta.is_file() {
        return Err(ConfigError::NotAFile {
            what,
            path: path.into(),
        });
    }
    Ok(())
}

/// The file will be created: its directory must exist.
fn creatable(what: &'static str, path: &Path) -> Result<(), ConfigError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(ConfigError::NoParentDir {
            what,
            path: path.into(),
            dir: dir.into(),
        });
    }
    Ok(())
}

fn socket_path(what: &'static str, path: &Path) -> Result<(), ConfigError> {
    if path.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(ConfigError::SocketPathTooLong {
            what,
            path: path.into(),
        });
    }
    creatable(what, path)
}

/// At most this many shared directories per VM (each takes an MMIO slot and an IRQ).
pub const MAX_FS_DEVICES: usize = 8;

/// Tags the guest can tell apart and backend sockets that can exist; the backend itself
/// is checked when the device connects.
fn validate_fs(fs: &[sandcell_proto::vmm::FsConfig]) -> Result<(), ConfigError> {
    if fs.len() > MAX_FS_DEVICES {
        return Err(ConfigError::Fs(format!(
            "{} shared directories; at most {MAX_FS_DEVICES}",
            fs.len()
        )));
    }
    for (i, f) in fs.iter().enumerate() {
        crate::devices::virtio::fs::config_space(&f.tag)
            .map_err(|e| ConfigError::Fs(e.to_string()))?;
        if fs[..i].iter().any(|g| g.tag == f.tag) {
            return Err(ConfigError::Fs(format!("tag {:?} is given twice", f.tag)));
        }
        socket_path("fs socket", &f.socket)?;
    }
    Ok(())
}

/// Checks everything that can be checked before the VM exists.
pub fn validate(cfg: &VmConfig) -> Result<(), ConfigError> {
    if !(MIN_VCPUS..=MAX_VCPUS).contains(&cfg.vcpus) {
        return Err(ConfigError::Vcpus(cfg.vcpus));
    }
    if !(MIN_MEMORY_MIB..=MAX_MEMORY_MIB).contains(&cfg.memory_mib) {
        return Err(ConfigError::Memory(cfg.memory_mib));
    }
    readable_file("kernel", &cfg.kernel)?;
    if cfg.cmdline.contains('\0') {
        return Err(ConfigError::CmdlineNul);
    }
    if cfg.cmdline.len() >= CMDLINE_MAX_SIZE {
        return Err(ConfigError::CmdlineTooLong(cfg.cmdline.len()));
    }
    if let Some(disk) = &cfg.disk {
        readable_file("disk base image", &disk.base)?;
        for layer in &disk.layers {
            readable_file("disk layer", layer)?;
        }
        if let Some(overlay) = &disk.overlay {
            if overlay.exists() {
                readable_file("disk overlay", overlay)?;
            } else {
                creatable("disk overlay", overlay)?;
            }
        }
    }
    validate_fs(&cfg.fs)?;
    if let Some(vsock) = &cfg.vsock {
        if vsock.guest_cid < 3 || vsock.guest_cid == u32::MAX {
            return Err(ConfigError::GuestCid(vsock.guest_cid));
        }
        // Guest-initiated connections go to `<uds_path>_<port>`: leave room for the suffix
        // of any 16-bit port (the agent's is 49983).
        let longest = PathBuf::from(format!("{}_{}", vsock.uds_path.display(), u16::MAX));
        socket_path("vsock uds_path", &longest)?;
    }
    if let Some(net) = &cfg.net {
        if crate::devices::virtio::net::parse_mac(&net.guest_mac).is_none() {
            return Err(ConfigError::Net(format!(
                "guest_mac {:?} is not a MAC address (aa:bb:cc:dd:ee:ff)",
                net.guest_mac
            )));
        }
        if net.tap.is_empty() || net.tap.len() >= libc::IFNAMSIZ || net.tap.contains('\0') {
            return Err(ConfigError::Net(format!(
                "tap {:?}: an interface name is 1 to 15 bytes",
                net.tap
            )));
        }
    }
    if let Some(log) = &cfg.serial_log {
        creatable("serial_log", log)?;
    }
    if let Some(sock) = &cfg.control_socket {
        socket_path("control_socket", sock)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandcell_proto::vmm::{DiskConfig, VsockConfig};

    fn base(dir: &Path) -> VmConfig {
        let kernel = dir.join("kernel");
        std::fs::write(&kernel, b"\x7fELF").expect("write kernel");
        VmConfig {
            vcpus: 1,
            memory_mib: 128,
            kernel,
            cmdline: String::new(),
            disk: None,
            vsock: None,
            rng: false,
            net: None,
            fs: Vec::new(),
            serial_log: None,
            control_socket: None,
        }
    }

    #[test]
    fn shared_directories_need_distinct_valid_tags() {
        let d = tempfile::tempdir().expect("tempdir");
        let fs = |tag: &str| sandcell_proto::vmm::FsConfig {
            tag: tag.into(),
            socket: d.path().join(format!("{}.sock", tag.len())),
        };
        let with = |fs: Vec<sandcell_proto::vmm::FsConfig>| VmConfig {
            fs,
            ..base(d.path())
        };
        validate(&with(vec![fs("vol0"), fs("data")])).expect("two tags");
        for bad in [
            vec![fs("")],
            vec![fs(&"x".repeat(37))],
            vec![fs("a\0b")],
            vec![fs("v"), fs("v")],
        ] {
            let err = validate(&with(bad.clone())).expect_err("refused");
            assert!(matches!(err, ConfigError::Fs(_)), "{bad:?}: {err}");
        }
        let many = (0..=MAX_FS_DEVICES).map(|i| fs(&format!("t{i}"))).collect();
        assert!(matches!(validate(&with(many)), Err(ConfigError::Fs(_))));
        let far = sandcell_proto::vmm::FsConfig {
            tag: "t".into(),
            socket: d.path().join("x".repeat(120)),
        };
        assert!(matches!(
            validate(&with(vec![far])),
            Err(ConfigError::SocketPathTooLong { .. })
        ));
    }

    #[test]
    fn a_plain_config_passes() {
        let d = tempfile::tempdir().expect("tempdir");
        validate(&base(d.path())).expect("valid");
    }

    #[test]
    fn bounds_are_enforced() {
        let d = tempfile::tempdir().expect("tempdir");
        for vcpus in [0u8, 33] {
            let c = VmConfig {
                vcpus,
                ..base(d.path())
            };
            assert!(matches!(validate(&c), Err(ConfigError::Vcpus(v)) if v == vcpus));
        }
        for memory_mib in [0u32, 65537] {
            let c = VmConfig {
                memory_mib,
                ..base(d.path())
            };
            assert!(matches!(validate(&c), Err(ConfigError::Memory(_))));
        }
        validate(&VmConfig {
            vcpus: 32,
            memory_mib: 65536,
            ..base(d.path())
        })
        .expect("max ok");
    }

    #[test]
    fn missing_files_are_named_in_the_error() {
        let d = tempfile::tempdir().expect("tempdir");
        let c = VmConfig {
            kernel: d.path().join("nope"),
            ..base(d.path())
        };
        let err = validate(&c).expect_err("missing kernel").to_string();
        assert!(err.contains("kernel") && err.contains("nope"), "{err}");

        let c = VmConfig {
            kernel: d.path().to_path_buf(),
            ..base(d.path())
        };
        assert!(matches!(validate(&c), Err(ConfigError::NotAFile { .. })));

        let c = VmConfig {
            disk: Some(DiskConfig {
                base: d.path().join("base.img"),
                overlay: None,
                layers: Vec::new(),
            }),
            ..base(d.path())
        };
        assert!(matches!(
            validate(&c),
            Err(ConfigError::Unreadable {
                what: "disk base image",
                ..
            })
        ));

        let c = VmConfig {
            serial_log: Some(d.path().join("no/such/dir/log")),
            ..base(d.path())
        };
        assert!(matches!(validate(&c), Err(ConfigError::NoParentDir { .. })));
    }

    #[test]
    fn net_devices_are_checked() {
        let d = tempfile::tempdir().expect("tempdir");
        let net = |tap: &str, mac: &str| VmConfig {
            net: Some(sandcell_proto::vmm::NetConfig {
                tap: tap.into(),
                guest_mac: mac.into(),
            }),
            ..base(d.path())
        };
        assert!(validate(&net("tap0", "02:5c:00:00:00:01")).is_ok());
        for (tap, mac) in [
            ("tap0", "02:5c:00:00:01"),
            ("tap0", "not a mac"),
            ("", "02:5c:00:00:00:01"),
            ("a-name-longer-than-15", "02:5c:00:00:00:01"),
        ] {
            assert!(
                matches!(validate(&net(tap, mac)), Err(ConfigError::Net(_))),
                "{tap:?} {mac:?} accepted"
            );
        }
    }

    #[test]
    fn vsock_and_socket_paths_are_checked() {
        let d = tempfile::tempdir().expect("tempdir");
        let c = VmConfig {
            vsock: Some(VsockConfig {
                guest_cid: 2,
                uds_path: d.path().join("v.sock"),
            }),
            ..base(d.path())
        };
        assert!(matches!(validate(&c), Err(ConfigError::GuestCid(2))));
        let long = d.path().join("x".repeat(120));
        let c = VmConfig {
            control_socket: Some(long),
            ..base(d.path())
        };
        assert!(matches!(
            validate(&c),
            Err(ConfigError::SocketPathTooLong { .. })
        ));
    }

    #[test]
    fn arguments_parse() {
        let d = tempfile::tempdir().expect("tempdir");
        let cfg = base(d.path());
        let json = serde_json::to_string(&cfg).expect("json");
        let a = parse_args([
            "--config-json".to_string(),
            json.clone(),
            "--debug-devices".into(),
        ])
        .expect("args");
        assert_eq!(a.config, cfg);
        assert!(a.debug_devices);
        let file = d.path().join("vm.json");
        std::fs::write(&file, &json).expect("write");
        let a = parse_args(["--config".to_string(), file.display().to_string()]).expect("args");
        assert_eq!(a.config, cfg);
        assert!(matches!(
            parse_args(Vec::<String>::new()),
            Err(ConfigError::Usage)
        ));
        assert!(matches!(
            parse_args(["--bogus".to_string()]),
            Err(ConfigError::UnknownArgument(_))
        ));
        assert!(matches!(
            parse_args(["--config-json".to_string(), "{\"vcpus\":1}".into()]),
            Err(ConfigError::Parse(_))
        ));
    }
}
