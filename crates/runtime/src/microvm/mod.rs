//! The `microvm` runtime: one `sandcell-vmm` process per sandbox, booting our guest kernel
//! with the agent as init.
//!
//! Files of sandbox `<id>`: `<run-dir>/<id>/{owner.json, vm.json, vsock.sock, control.sock,
//! console.log (the guest's serial console), vmm.log (the VMM's stderr)}` and the disk's
//! writable layer `<data-dir>/sandboxes/<id>/disk.overlay` (the image's rootfs.ext4 is the
//! read-only base and is never written). A jailed VMM (jail/) writes only in a directory
//! of its own in each: sockets and console log in `<run-dir>/<id>/vmm/`, disk tops and
//! snapshot output in `<data-dir>/sandboxes/<id>/vmm/`; the other files stay in the
//! sandbox's dirs, which stay root's.
//!
//! The host reaches the agent through the VMM's hybrid vsock socket ([`vsock`]). Stopping is
//! polite first (the agent powers the VM off), then firm (control `Shutdown`), then SIGKILL.

mod boot_snapshot;
pub mod jail;
mod network;
mod sandbox;
mod shared_dirs;
pub mod vsock;
mod warm_pool;

pub use sandbox::MicrovmSandbox;

use crate::owner::Sweep;
use crate::util::{kill_pid, remove_dir_all_if_exists};
use crate::{
    AGENT_PORT, Dirs, Error, Result, Runtime, RuntimeKind, Sandbox, SandboxHandle, SandboxSpec,
    owner,
};
use async_trait::async_trait;
use sandcell_net::NetRegistry;
use sandcell_proto::vmm::{DiskConfig, NetConfig, VmConfig, VsockConfig};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub(super) const RT: RuntimeKind = RuntimeKind::Microvm;
const GUEST_CID: u32 = 3;
/// Bound on one control-socket answer line.
pub(super) const MAX_CONTROL_LINE: u64 = 64 * 1024;
pub(super) const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);

/// `$SANDCELL_VMM`, else `sandcell-vmm` next to the running executable (and, for test
/// binaries in `target/<profile>/deps/`, one directory up).
pub fn find_vmm() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SANDCELL_VMM").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir.join("sandcell-vmm"), dir.parent()?.join("sandcell-vmm")]
        .into_iter()
        .find(|p| p.is_file())
}

/// The kernel command line: serial console, root on the virtio disk, the agent as init.
/// `KEY=VALUE` words without a dot become init's environment (the kernel hands them over).
fn cmdline(spec: &SandboxSpec) -> Result<String> {
    let mut words = vec![
        "console=ttyS0".to_string(),
        "reboot=k".into(),
        "panic=-1".into(),
        "quiet".into(),
        "root=/dev/vda".into(),
        "rootfstype=ext4".into(),
        "rw".into(),
        format!("init={}", crate::image::AGENT_PATH),
        format!("sandcell.listen=vsock:{AGENT_PORT}"),
        "SANDCELL_RUNTIME=microvm".into(),
    ];
    for (k, v) in &spec.env {
        let plain = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\'' && b != b'\\')
        };
        if !plain(k) || k.contains(['.', '=']) || !(v.is_empty() || plain(v)) {
            return Err(Error::InvalidSpec {
                runtime: RT,
                problem: format!(
                    "environment variable {k:?} cannot travel on a kernel command line \
                     (no spaces, quotes, dots in names); pass it per process instead"
                ),
            });
        }
        words.push(format!("{k}={v}"));
    }
    Ok(words.join(" "))
}

pub struct MicrovmRuntime {
    dirs: Dirs,
    vmm: PathBuf,
    /// The networks of this runtime's sandboxes (and its owner's warm pool).
    nets: NetRegistry,
    /// Set by [`MicrovmRuntime::with_template_snapshots`].
    templates: Option<Templates>,
    /// Set when the VMMs run jailed (`SANDCELL_VMM_JAIL=1`, jail/).
    jail: Option<jail::JailPolicy>,
}

/// Template snapshots and the warm VMM pool their restores use.
struct Templates {
    store: std::sync::Arc<boot_snapshot::TemplateSnapshots>,
    pool: std::sync::Arc<warm_pool::WarmPool>,
    /// Networked creates restore too ([`NET_TEMPLATES_ENV`]).
    networked: bool,
}

/// `SANDCELL_MICROVM_NET_TEMPLATES=0`: networked creates boot instead of restoring a
/// networked template snapshot into a pooled VMM given their TAP (boot_snapshot.rs), the
/// default. Proven in the nested harness: through a daemon with its networks
/// (`daemon_net_template`) and on the VMM alone (`net_pool_restore`).
pub const NET_TEMPLATES_ENV: &str = "SANDCELL_MICROVM_NET_TEMPLATES";

impl MicrovmRuntime {
    /// Finds the VMM and checks for KVM. Sandboxes with a network get it through `nets` (its
    /// pool, if one is installed).
    pub fn new(dirs: Dirs, nets: NetRegistry) -> Result<MicrovmRuntime> {
        let vmm = find_vmm().ok_or_else(|| Error::Unavailable {
            runtime: RT,
            what: "sandcell-vmm was not found next to this program".into(),
            hint: "build it (`cargo build -p sandcell-vmm`) or set SANDCELL_VMM".into(),
        })?;
        if !Path::new("/dev/kvm").exists() {
            return Err(Error::Unavailable {
                runtime: RT,
                what: "/dev/kvm does not exist".into(),
                hint: "enable hardware virtualization (or nested virtualization) or use --runtime gvisor".into(),
            });
        }
        let (jail, why_not) = jail::JailSetting::from_env()?.resolve(jail::HostSupport::probe());
        match (&jail, why_not) {
            (Some(policy), _) => tracing::info!(
                "microvm runtime: every sandcell-vmm runs jailed (uids from {})",
                policy.uid_base
            ),
            // Info, not a warning: `sandcell run` shows only warnings, on its stderr, which
            // is the guest's. `serve` shows it.
            (None, Some(why)) => tracing::info!(
                "microvm runtime: sandcell-vmm runs WITHOUT its jail: {why}. Set {}=1 to \
                 require it (creates then fail where it cannot be made)",
                jail::ENABLE_ENV
            ),
            (None, None) => {}
        }
        Ok(MicrovmRuntime {
            dirs,
            vmm,
            nets,
            templates: None,
            jail,
        })
    }

    /// Creates restore a template snapshot (made on the first create of each image,
    /// kernel, memory, vCPUs, with or without a network) into one of `pool_size` idle
    /// pre-started VMMs instead of booting (boot_snapshot.rs, warm_pool.rs). Their
    /// environment then comes only from the agent's `/init`, which the caller must send
    /// (the daemon does); `pool_size` 0 turns it off.
    pub fn with_template_snapshots(mut self, pool_size: usize) -> MicrovmRuntime {
        self.templates = (pool_size > 0).then(|| Templates {
            store: std::sync::Arc::new(boot_snapshot::TemplateSnapshots::new(
                &self.dirs, &self.vmm, self.jail,
            )),
            // Jailed from their start, before their sandbox exists (jail/pooled.rs).
            pool: warm_pool::WarmPool::new(&self.dirs, &self.vmm, pool_size, self.jail),
            networked: std::env::var(NET_TEMPLATES_ENV).map_or(true, |v| v != "0"),
        });
        self
    }

    pub fn vmm_path(&self) -> &Path {
        &self.vmm
    }
}

pub(super) struct Paths {
    pub(super) config: PathBuf,
    pub(super) vsock: PathBuf,
    pub(super) control: PathBuf,
    pub(super) console: PathBuf,
    pub(super) vmm_log: PathBuf,
    pub(super) state_dir: PathBuf,
    pub(super) overlay: PathBuf,
    /// Where the VMM makes disk tops and snapshot output: the state dir, or its
    /// [`jail::VMM_DIR`] when jailed.
    pub(super) vmm_state_dir: PathBuf,
    /// Where the VMM's sockets are (the run dir, or its [`jail::VMM_DIR`] when jailed): also
    /// the volumes' virtiofsd sockets, which it connects to.
    pub(super) vmm_run_dir: PathBuf,
    /// The jailed layout: the VMM's files in [`jail::VMM_DIR`]s.
    pub(super) jailed: bool,
}

impl Paths {
    /// The files of an unjailed VMM's sandbox.
    pub(super) fn new(dirs: &Dirs, id: &str) -> Paths {
        Paths::layout(dirs, id, false)
    }

    /// The files of sandbox `id`; `jailed`: what the VMM writes is in its own directories
    /// (the module documentation), the rest in the sandbox's dirs, which stay root's.
    pub(super) fn layout(dirs: &Dirs, id: &str, jailed: bool) -> Paths {
        let run = dirs.sandbox_run_dir(id);
        let state_dir = dirs.sandbox_state_dir(id);
        let (vmm_run, vmm_state_dir) = match jailed {
            true => (run.join(jail::VMM_DIR), state_dir.join(jail::VMM_DIR)),
            false => (run.clone(), state_dir.clone()),
        };
        Paths {
            config: run.join("vm.json"),
            vsock: vmm_run.join("vsock.sock"),
            control: vmm_run.join("control.sock"),
            console: vmm_run.join("console.log"),
            vmm_log: run.join("vmm.log"),
            overlay: vmm_state_dir.join("disk.overlay"),
            state_dir,
            vmm_state_dir,
            vmm_run_dir: vmm_run,
            jailed,
        }
    }
}

#[async_trait]
impl Runtime for MicrovmRuntime {
    fn kind(&self) -> RuntimeKind {
        RT
    }

    async fn create(&self, spec: SandboxSpec) -> Result<Box<dyn Sandbox>> {
        if !crate::validate_id(&spec.id) {
            return Err(Error::InvalidSpec {
                runtime: RT,
                problem: format!("bad sandbox id {:?}", spec.id),
            });
        }
        if !(1..=32).contains(&spec.vcpus) || !(32..=65536).contains(&spec.memory_mib) {
            return Err(Error::InvalidSpec {
                runtime: RT,
                problem: format!(
                    "{} vCPUs and {} MiB: need 1-32 vCPUs and 32-65536 MiB",
                    spec.vcpus, spec.memory_mib
                ),
            });
        }
        if spec.host_layer.is_some() {
            return Err(Error::InvalidSpec {
                runtime: RT,
                problem: "a host-backed root layer (build sandboxes) needs the gvisor runtime"
                    .into(),
            });
        }
        let base = spec.image.rootfs_ext4.clone().ok_or_else(|| Error::Image {
            image: spec.image.name.clone(),
            problem: "has no rootfs.ext4, which the microvm runtime needs".into(),
        })?;
        let kernel = spec
            .kernel
            .clone()
            .unwrap_or_else(|| self.dirs.default_kernel());
        if !kernel.is_file() {
            return Err(Error::Unavailable {
                runtime: RT,
                what: format!("no guest kernel at {}", kernel.display()),
                hint: "build and install it with `make kernel install`, or pass --kernel".into(),
            });
        }
        // A jail binds host paths only as they really are (no symbolic link on the way, such
        // as kernels/default): the VM is configured with the real paths, which it then
        // finds at the same place inside its jail.
        let (kernel, base) = match self.jail {
            Some(_) => (real_path(&kernel)?, real_path(&base)?),
            None => (kernel, base),
        };
        let mut cmdline = cmdline(&spec)?;
        let paths = Paths::layout(&self.dirs, &spec.id, self.jail.is_some());
        let shared = shared_dirs::plan(&spec.volumes, &paths.vmm_run_dir)?;
        if !shared.is_empty() {
            shared_dirs::virtiofsd()?;
            cmdline.push(' ');
            cmdline.push_str(&shared_dirs::kernel_param(&shared));
        }
        // Last of the checks, first of the things made: the network (network.rs).
        let net = match &spec.network {
            Some(n) => Some(network::create(&self.nets, &spec.id, n).await?),
            None => None,
        };
        let net_config = net.as_ref().map(|n| {
            cmdline.push(' ');
            cmdline.push_str(&network::kernel_param(n.network()));
            NetConfig {
                tap: network::TAP_NAME.into(),
                guest_mac: network::guest_mac(n.network().guest),
            }
        });
        let config = VmConfig {
            vcpus: spec.vcpus,
            memory_mib: spec.memory_mib,
            kernel,
            cmdline,
            disk: Some(DiskConfig {
                base: base.clone(),
                overlay: Some(paths.overlay.clone()),
                layers: Vec::new(),
            }),
            vsock: Some(VsockConfig {
                guest_cid: GUEST_CID,
                uds_path: paths.vsock.clone(),
            }),
            rng: true,
            net: net_config,
            fs: shared_dirs::fs_config(&shared),
            serial_log: Some(paths.console.clone()),
            control_socket: Some(paths.control.clone()),
        };
        if let Err(e) = owner::create_run_dir(&self.dirs, &spec.id, RT, spec.outlive_owner) {
            if let Some(net) = net {
                let _ = network::teardown(&spec.id, net).await;
            }
            return Err(e);
        }
        let sandbox = MicrovmSandbox::new(
            self.dirs.clone(),
            self.vmm.clone(),
            self.nets.clone(),
            &spec,
            paths,
        )
        .with_jail(self.jail, vec![config.kernel.clone(), base.clone()]);
        sandbox.set_shared_dirs(shared.clone());
        // A networked create restores a template snapshot with a net device, given this
        // sandbox's TAP (boot_snapshot.rs), unless turned off; the network is the sandbox's
        // either way. Volumes boot cold: no template snapshot has their devices.
        if let Some(t) = self
            .templates
            .as_ref()
            .filter(|t| (net.is_none() || t.networked) && shared.is_empty())
        {
            sandbox.set_template_plan(sandbox::TemplatePlan {
                store: t.store.clone(),
                pool: t.pool.clone(),
                key: boot_snapshot::TemplateKey {
                    rootfs: spec.image.rootfs_ext4.clone().unwrap_or_default(),
                    kernel: config.kernel.clone(),
                    vmm: self.vmm.clone(),
                    memory_mib: spec.memory_mib,
                    vcpus: spec.vcpus,
                    network: net.is_some(),
                },
                image: spec.image.clone(),
                network: spec.network.as_ref().map(|n| n.config.clone()),
            });
        }
        if let Some(net) = net {
            sandbox.set_network(net);
        }
        let prepared = (|| {
            std::fs::create_dir_all(&sandbox.paths.state_dir).map_err(|e| {
                Error::io(
                    RT,
                    format!("creating {}", sandbox.paths.state_dir.display()),
                    e,
                )
            })?;
            let json = serde_json::to_vec_pretty(&config)
                .map_err(|e| Error::io(RT, "encoding vm.json", e.into()))?;
            std::fs::write(&sandbox.paths.config, json).map_err(|e| {
                Error::io(RT, format!("writing {}", sandbox.paths.config.display()), e)
            })
        })();
        if let Err(e) = prepared {
            let _ = sandbox.destroy().await;
            return Err(e);
        }
        Ok(Box::new(sandbox))
    }

    async fn sweep(&self) -> Result<Vec<String>> {
        self.sweep_scope(Sweep::Attached)
    }

    async fn sweep_unadopted(&self) -> Result<Vec<String>> {
        self.sweep_scope(Sweep::Unadopted)
    }

    async fn adopt(&self, handle: &SandboxHandle) -> Result<Box<dyn Sandbox>> {
        let id = &handle.id;
        if handle.runtime != RT || !crate::validate_id(id) {
            return Err(Error::InvalidSpec {
                runtime: RT,
                problem: format!("cannot adopt {id:?} of the {} runtime", handle.runtime),
            });
        }
        // Started jailed or not (by this daemon or an earlier one): its sockets say.
        let paths = [false, true]
            .map(|jailed| Paths::layout(&self.dirs, id, jailed))
            .into_iter()
            .find(|p| p.vsock == handle.agent_socket)
            .unwrap_or_else(|| Paths::new(&self.dirs, id));
        if paths.vsock != handle.agent_socket
            || handle.control_socket.as_ref() != Some(&paths.control)
        {
            return Err(Error::InvalidSpec {
                runtime: RT,
                problem: format!(
                    "sandbox {id} was started with its sockets at {} and {:?}: start the \
                     daemon with the same SANDCELL_RUN_DIR",
                    handle.agent_socket.display(),
                    handle.control_socket
                ),
            });
        }
        let Some(pidfd) = crate::detach::open(handle.pid, handle.start_time) else {
            let removed = remove_files(&self.dirs, id).and(remove_leftover_cgroup(id));
            return Err(Error::Gone {
                runtime: RT,
                id: id.clone(),
                problem: match removed {
                    Ok(()) => "its VMM ended while it had no owner; its files were removed".into(),
                    Err(e) => format!("its VMM ended while it had no owner; {e}"),
                },
            });
        };
        owner::adopt(&self.dirs.sandbox_run_dir(id), RT)?;
        Ok(Box::new(MicrovmSandbox::adopted(
            self.dirs.clone(),
            self.vmm.clone(),
            self.nets.clone(),
            handle.clone(),
            paths,
            pidfd,
        )))
    }

    async fn restore(
        &self,
        snapshot: &crate::SnapshotHandle,
        spec: crate::RestoreSpec,
    ) -> Result<Box<dyn Sandbox>> {
        // A snapshot with a net device is restored into a new network (snapshot.rs).
        let sandbox =
            sandbox::restore_new(&self.dirs, &self.vmm, &self.nets, self.jail, snapshot, spec)
                .await?;
        Ok(Box::new(sandbox))
    }

    fn stop_prestarted(&self) {
        if let Some(t) = &self.templates {
            t.pool.stop();
        }
    }
}

impl MicrovmRuntime {
    fn sweep_scope(&self, scope: Sweep) -> Result<Vec<String>> {
        let mut cleaned = Vec::new();
        for (id, dir) in owner::dead_sandboxes(&self.dirs, RT, scope) {
            // A VMM whose owner died may still run: its pid is in vmm.pid, and its command
            // line names its config (a reused pid would not).
            if let Some(pid) = std::fs::read_to_string(dir.join("vmm.pid"))
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
            {
                let config = dir.join("vm.json");
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let cmdline = String::from_utf8_lossy(&cmdline);
                // A VMM from the warm pool names the pool's socket it was started with.
                let pooled = std::fs::read_to_string(dir.join(sandbox::POOL_MARK))
                    .is_ok_and(|socket| !socket.is_empty() && cmdline.contains(&socket));
                if pooled || cmdline.contains(&*config.to_string_lossy()) {
                    kill_pid(pid, libc::SIGKILL);
                }
            }
            remove_files(&self.dirs, &id)?;
            // A jailed VMM's cgroup (none otherwise): after the VMM, which was in it.
            if let Err(e) = remove_leftover_cgroup(&id) {
                tracing::warn!(sandbox = %id, "removing the leftover VMM cgroup: {e}");
            }
            // Its network, if it had one (cheap when not): after the VMM, which used it.
            if let Err(e) = sandcell_net::network::remove(&id) {
                tracing::warn!(sandbox = %id, "removing the leftover network: {e}");
            }
            cleaned.push(id);
        }
        Ok(cleaned)
    }
}

fn real_path(path: &Path) -> Result<PathBuf> {
    std::fs::canonicalize(path)
        .map_err(|e| Error::io(RT, format!("resolving {}", path.display()), e))
}

/// Removes the cgroup of a jailed VMM this daemon did not start, if there is one (what is
/// left in it is killed).
pub(super) fn remove_leftover_cgroup(id: &str) -> Result<()> {
    jail::leftover_cgroup(id).map_or(Ok(()), |cgroup| cgroup.remove())
}

pub(super) fn remove_files(dirs: &Dirs, id: &str) -> Result<()> {
    for dir in [
        dirs.sandbox_run_dir(id),
        dirs.run.join(format!(".new-{id}")),
        dirs.sandbox_state_dir(id),
    ] {
        remove_dir_all_if_exists(&dir)
            .map_err(|e| Error::io(RT, format!("removing {}", dir.display()), e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::sandbox::classify;
    use super::*;
    use crate::Image;
    use crate::SandboxExit;
    use sandcell_proto::vmm::ExitStatus;
    use std::os::unix::process::ExitStatusExt;

    fn spec() -> SandboxSpec {
        SandboxSpec::new(
            "sc-1".into(),
            Image {
                name: "t".into(),
                rootfs_dir: None,
                rootfs_ext4: Some("/i/rootfs.ext4".into()),
            },
        )
    }

    #[test]
    fn cmdline_boots_the_agent_and_carries_plain_env() {
        let mut s = spec();
        s.env.insert("FOO".into(), "bar".into());
        let c = cmdline(&s).unwrap();
        assert!(c.contains("init=/sbin/sandcell-agent"), "{c}");
        assert!(c.contains("sandcell.listen=vsock:49983"), "{c}");
        assert!(c.ends_with("FOO=bar"), "{c}");
        s.env.insert("BAD".into(), "two words".into());
        assert!(cmdline(&s).is_err());
    }

    #[test]
    fn vmm_exit_codes_map_to_clear_reasons() {
        let status = |code: i32| std::process::ExitStatus::from_raw(code << 8);
        let e = classify(status(6), false, String::new());
        assert_eq!(
            e,
            SandboxExit::Vm {
                status: ExitStatus::KvmInternalError,
                detail: String::new()
            }
        );
        assert!(e.to_string().contains("--runtime gvisor"));
        assert_eq!(
            classify(status(6), true, String::new()),
            SandboxExit::Destroyed
        );
        assert!(matches!(
            classify(status(99), false, String::new()),
            SandboxExit::Exited { code: 99, .. }
        ));
    }

    /// A VMM killed by its seccomp filter (sandcell-vmm's tests/seccomp.rs shows it dies of
    /// SIGSYS) is reported as a crash with the reason, not as a stop or a VM status.
    #[test]
    fn a_vmm_killed_by_sigsys_is_reported_as_a_seccomp_crash() {
        let status = std::process::Command::new("sh")
            .args(["-c", "kill -SYS $$"])
            .status()
            .expect("running sh");
        let e = classify(status, false, "vmm log tail".into());
        assert_eq!(
            e,
            SandboxExit::Killed {
                signal: libc::SIGSYS,
                detail: "vmm log tail".into()
            }
        );
        let said = e.to_string();
        assert!(
            said.contains("crashed") && said.contains("seccomp"),
            "{said}"
        );
        assert_eq!(
            classify(status, true, String::new()),
            SandboxExit::Destroyed
        );
    }
}
