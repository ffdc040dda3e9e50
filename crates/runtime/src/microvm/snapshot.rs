//! Snapshots of microVM sandboxes through `sandcell-vmm`'s control socket, and restores
//! into new `sandcell-vmm --restore` processes.
//!
//! - snapshot: control `snapshot {state_path, mem_path, mode, disk_new_top}`. The VMM
//!   pauses, saves and returns the VM to its previous state; the disk's writable top is
//!   frozen (O(1)) into an immutable layer and the VM continues on a new top in its state
//!   dir, so the snapshot and the parent never share a writable file.
//! - `full` writes the memory to `vm.mem`; `fork` freezes the memfd in place and `vm.mem` is
//!   a symlink into the parent VMM (`/proc/<pid>/fd/<n>`): restorable only while the parent
//!   runs.
//! - Frozen layers stay where the VMM froze them (the parent's state dir), and the
//!   manifest lists them. So they must outlive the parent: [`Sandbox::destroy`] of the
//!   parent removes them, which makes its snapshots unrestorable (refused by
//!   [`SnapshotHandle::check_files`]). Keeping layers alive by reference count is the
//!   daemon's job.
//! - pause_to_disk: a full snapshot that freezes the disk too (O(1)), then the VMM stops
//!   and every layer of the sandbox is hard-linked (or copied across filesystems) into the
//!   snapshot (`disk.layer.N`), so the paused snapshot outlives the sandbox.
//! - restore: `sandcell-vmm --restore STATE --mem MEM` with the new sandbox's vsock socket,
//!   its own new empty disk top over the manifest's layers (`--disk-layer`, where they are
//!   now), console log and control socket. (A warm pool of `--wait-restore` VMMs is the
//!   daemon's next step; the control request is the same.)
//!
//! - networks: a VM with a virtio-net device records it (`network` in the manifest). Its
//!   restore makes the new sandbox's network first (namespace, veth, TAP `sctap0`: the name
//!   the VM state opens), starts the VMM in it, and once the agent answers sends it `/init`
//!   with `sandcellNet`, the new address, gateway and resolver (the guest still has its
//!   source's). Connections open at the snapshot are gone, as on gVisor. Such a snapshot is
//!   never restored without a network (its VMM would open the TAP in the host's namespace),
//!   and a fork's children get their parent's rules.
//!
//! The guest's clock, RNG and identity are the caller's to refresh through the agent's
//! `/init` after a restore.

use super::*;
use crate::snapshot::{RestoreSpec, SnapshotFiles, SnapshotHandle, SnapshotKind};
use sandcell_proto::sync::lock;
use sandcell_proto::vmm::SnapshotMode;
use std::ffi::OsString;
use std::path::Path;
use std::sync::atomic::AtomicU32;

const STATE_FILE: &str = "vm.state";
const MEM_FILE: &str = "vm.mem";
/// A full snapshot writes all of guest memory: give the control exchange time for it.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(120);

/// What a microVM sandbox knows for its snapshots.
pub(super) struct SnapState {
    image: crate::Image,
    env: std::collections::BTreeMap<String, String>,
    /// Frozen disk layers under the current top, oldest first.
    pub(super) layers: Mutex<Vec<PathBuf>>,
    /// The writable top the VM runs on now.
    top: Mutex<PathBuf>,
    /// Numbers the tops made by snapshots.
    next_top: AtomicU32,
    /// The next start runs `sandcell-vmm` with these arguments instead of `--config`.
    restore_args: Mutex<Option<Vec<OsString>>>,
    /// A jailed restore of a fork: the parent's memfd, which the VMM reopens through
    /// `/proc/self/fd` (it cannot reach the parent's `/proc` from its jail).
    restore_fd: Mutex<Option<std::os::fd::OwnedFd>>,
}

impl SnapState {
    pub(super) fn new(spec: &SandboxSpec, top: &Path) -> SnapState {
        SnapState {
            image: spec.image.clone(),
            env: spec.env.clone(),
            layers: Mutex::new(Vec::new()),
            top: Mutex::new(top.to_path_buf()),
            next_top: AtomicU32::new(1),
            restore_args: Mutex::new(None),
            restore_fd: Mutex::new(None),
        }
    }

    pub(super) fn take_restore_args(&self) -> Option<Vec<OsString>> {
        lock(&self.restore_args).take()
    }

    pub(super) fn take_restore_fd(&self) -> Option<std::os::fd::OwnedFd> {
        lock(&self.restore_fd).take()
    }
}

/// Lets the VMM started by `cmd` inherit `fd` (at the same number): std opens every file
/// close-on-exec, and the flag is cleared in the child only.
pub(super) fn inherit_fd(cmd: &mut tokio::process::Command, fd: &std::os::fd::OwnedFd) {
    use std::os::fd::AsRawFd;
    let raw = fd.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and makes one system call
    // (fcntl, async-signal-safe) on a descriptor the parent keeps open until the spawn.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(raw, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A jailed VMM writes its snapshot in its own state dir (the destination is not in its
/// jail): a fresh directory there, the VMM's, for the two files.
fn jailed_snapshot_dir(sb: &MicrovmSandbox, uid: u32) -> Result<PathBuf> {
    let n = sb.snap.next_top.fetch_add(1, Ordering::SeqCst);
    let name = format!("snapshot.{n}");
    Ok(super::super::jail::vmm_dir(
        &sb.paths.vmm_state_dir,
        &name,
        uid,
    )?)
}

/// The `sandcell-vmm` arguments that restore a snapshot (`state`, `memory`, its disk
/// `layers` and `base` where they are now) into a sandbox with `paths`. The base is named
/// too: the saving VMM may have seen it elsewhere (a pooled jailed VMM reads a link).
fn restore_args(
    state: &Path,
    memory: &Path,
    (layers, base): (&[PathBuf], Option<&Path>),
    paths: &Paths,
) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::new();
    let mut push = |flag: &str, value: &Path| {
        args.push(flag.into());
        args.push(value.as_os_str().to_owned());
    };
    push("--restore", state);
    push("--mem", memory);
    push("--vsock-uds", &paths.vsock);
    push("--disk-overlay", &paths.overlay);
    for layer in layers {
        push("--disk-layer", layer);
    }
    if let Some(base) = base {
        push("--disk-base", base);
    }
    push("--serial-log", &paths.console);
    push("--control-socket", &paths.control);
    args
}

/// Sends `snapshot` to the VMM of `sb` into `dest`; `freeze_disk`: continue the VM on a new
/// top (for snapshots the parent outlives).
async fn take(
    sb: &MicrovmSandbox,
    dest: &Path,
    kind: SnapshotKind,
    freeze_disk: bool,
) -> Result<SnapshotHandle> {
    sb.require_running("snapshot")?;
    let network = sb.has_network("snapshot")?;
    if sb.paths.jailed && sb.jail_uid().is_none() {
        return Err(Error::Unsupported {
            runtime: RT,
            op: "snapshot",
            why: "this jailed sandbox was adopted after a daemon restart: its VMM's jail \
                  (uid, binds) is not re-adopted yet"
                .into(),
        });
    }
    let io = |what: String| move |e| Error::io(RT, what, e);
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
    }
    std::fs::create_dir(dest).map_err(io(format!(
        "creating snapshot directory {} (it must not exist)",
        dest.display()
    )))?;
    let (state_path, mem_path) = (dest.join(STATE_FILE), dest.join(MEM_FILE));
    let jailed = match sb.jail_uid() {
        Some(uid) => Some(jailed_snapshot_dir(sb, uid)?),
        None => None,
    };
    let written = jailed.as_deref().unwrap_or(dest);
    let old_top = lock(&sb.snap.top).clone();
    let new_top = freeze_disk.then(|| {
        let n = sb.snap.next_top.fetch_add(1, Ordering::SeqCst);
        sb.paths.vmm_state_dir.join(format!("disk.top.{n}"))
    });
    // Named as the VMM sees them (a pooled VMM sees its directories at the pool's paths).
    let request = ControlRequest::Snapshot {
        state_path: sb.in_vmm(&written.join(STATE_FILE)),
        mem_path: sb.in_vmm(&written.join(MEM_FILE)),
        mode: match kind {
            SnapshotKind::Full => SnapshotMode::Full,
            SnapshotKind::Fork => SnapshotMode::Fork,
        },
        disk_new_top: new_top.as_deref().map(|top| sb.in_vmm(top)),
    };
    let answered = sb.control_within(&request, SNAPSHOT_TIMEOUT).await;
    // Where the frozen top is from now on.
    let mut frozen = old_top;
    if let Some(from) = &jailed {
        if let Err(e) = answered {
            let _ = crate::util::remove_dir_all_if_exists(from);
            return Err(e);
        }
        let fork_owner = (kind == SnapshotKind::Fork).then(|| sb.pid()).flatten();
        let moved = super::super::jail::move_out(from, dest, STATE_FILE, MEM_FILE, fork_owner);
        // Removed without following links (std's remove_dir_all): whatever was refused.
        let _ = crate::util::remove_dir_all_if_exists(from);
        if let Err(e) = moved {
            let _ = crate::util::remove_dir_all_if_exists(dest);
            return Err(e.into());
        }
        if new_top.is_some() {
            // Frozen now, and read by restores under other uids: out of the VMM's reach.
            let name = frozen.file_name().unwrap_or_default().to_owned();
            frozen = super::super::jail::take_layer(
                &sb.paths.vmm_state_dir,
                &name,
                &sb.paths.state_dir,
            )?;
        }
    }
    answered?;
    let layers = {
        let mut layers = lock(&sb.snap.layers);
        if let Some(new_top) = new_top {
            layers.push(frozen);
            *lock(&sb.snap.top) = new_top;
        }
        layers.clone()
    };
    let handle = SnapshotHandle {
        format: crate::snapshot::SNAPSHOT_FORMAT,
        runtime: RT,
        kind,
        dir: dest.to_path_buf(),
        source_id: sb.id.clone(),
        image: (&sb.snap.image).into(),
        vcpus: sb.vcpus,
        memory_mib: sb.memory_mib,
        env: sb.snap.env.clone(),
        files: SnapshotFiles::Microvm {
            state: state_path,
            memory: mem_path,
            disk_base: sb.snap.image.rootfs_ext4.clone(),
            disk_layers: layers,
            disk_top: None,
            memory_owner_pid: (kind == SnapshotKind::Fork).then(|| sb.pid()).flatten(),
            network,
        },
    };
    handle.save()?;
    Ok(handle)
}

pub(super) async fn snapshot(
    sb: &MicrovmSandbox,
    dest: &Path,
    kind: SnapshotKind,
) -> Result<SnapshotHandle> {
    take(sb, dest, kind, true).await
}

pub(super) async fn pause_to_disk(sb: &MicrovmSandbox, dest: &Path) -> Result<SnapshotHandle> {
    sb.require_running("pause to disk")?;
    // Paused first, so that nothing changes between the save and the stop. The disk's top
    // is frozen like a snapshot's (O(1)); the new top the VM would go on with is never
    // used, since the VM stops next.
    sb.control(&ControlRequest::Pause).await?;
    let mut handle = take(sb, dest, SnapshotKind::Full, true).await?;
    sb.stopping.store(true, Ordering::SeqCst);
    let _ = sb.control(&ControlRequest::Shutdown).await;
    if !sb.exited_within(Duration::from_secs(5)).await
        && let Some(pid) = sb.pid()
    {
        kill_pid(pid, libc::SIGKILL);
        sb.exited_within(Duration::from_secs(2)).await;
    }
    // The sandbox's directory goes with it: the snapshot keeps its own links to the layers
    // (restores name them with --disk-layer). Links, not moves: the sandbox's earlier
    // snapshots name the same files.
    if let SnapshotFiles::Microvm { disk_layers, .. } = &mut handle.files {
        let mut kept = Vec::with_capacity(disk_layers.len());
        for (i, layer) in disk_layers.iter().enumerate() {
            let to = dest.join(format!("disk.layer.{i}"));
            link_or_copy(layer, &to)?;
            kept.push(to);
        }
        *disk_layers = kept;
    }
    handle.save()?;
    sb.destroy().await?;
    Ok(handle)
}

fn link_or_copy(from: &Path, to: &Path) -> Result<()> {
    let failed = |e| {
        Error::io(
            RT,
            format!("keeping {} as {}", from.display(), to.display()),
            e,
        )
    };
    match std::fs::hard_link(from, to) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            std::fs::copy(from, to).map(|_| ()).map_err(failed)
        }
        Err(e) => Err(failed(e)),
    }
}

pub(super) async fn fork(
    sb: &MicrovmSandbox,
    count: usize,
    dest: &Path,
) -> Result<Vec<Box<dyn Sandbox>>> {
    if count == 0 {
        return Ok(Vec::new());
    }
    let handle = take(sb, dest, SnapshotKind::Fork, true).await?;
    let mut restores = tokio::task::JoinSet::new();
    for _ in 0..count {
        let mut spec = RestoreSpec::new(crate::new_sandbox_id()?);
        spec.boot_timeout = sb.boot_timeout;
        spec.outlive_owner = sb.outlive_owner;
        spec.network = sb.network_spec();
        let (dirs, vmm, nets) = (sb.dirs.clone(), sb.vmm.clone(), sb.nets.clone());
        let (handle, jail) = (handle.clone(), sb.jail_policy());
        restores.spawn(async move { restore_new(&dirs, &vmm, &nets, jail, &handle, spec).await });
    }
    let mut children: Vec<Box<dyn Sandbox>> = Vec::with_capacity(count);
    let mut first: Option<Error> = None;
    while let Some(joined) = restores.join_next().await {
        match joined {
            Ok(Ok(child)) => children.push(Box::new(child)),
            Ok(Err(e)) => {
                first.get_or_insert(e);
            }
            Err(e) => {
                first.get_or_insert(Error::io(RT, "a restore task", std::io::Error::other(e)));
            }
        }
    }
    if let Some(e) = first {
        for child in &children {
            let _ = child.destroy().await;
        }
        return Err(e);
    }
    Ok(children)
}

/// A new sandbox restored from a microvm snapshot, running once its agent answers.
pub(in crate::microvm) async fn restore_new(
    dirs: &Dirs,
    vmm: &Path,
    nets: &sandcell_net::NetRegistry,
    jail: Option<super::super::jail::JailPolicy>,
    snapshot: &SnapshotHandle,
    restore: RestoreSpec,
) -> Result<MicrovmSandbox> {
    let SnapshotFiles::Microvm {
        state,
        memory,
        disk_base,
        disk_layers,
        disk_top,
        network: has_net_device,
        memory_owner_pid,
    } = &snapshot.files
    else {
        return Err(Error::InvalidSpec {
            runtime: RT,
            problem: format!(
                "snapshot {} is of the {} runtime",
                snapshot.dir.display(),
                snapshot.runtime
            ),
        });
    };
    if !crate::validate_id(&restore.id) {
        return Err(Error::InvalidSpec {
            runtime: RT,
            problem: format!("bad sandbox id {:?}", restore.id),
        });
    }
    snapshot.check_files()?;
    // The VM's devices are fixed by its state: a net device needs its TAP (opened by name,
    // in the VMM's namespace), and a VM without one cannot be given a network.
    match (has_net_device, restore.network.is_some()) {
        (true, false) => {
            return Err(Error::InvalidSpec {
                runtime: RT,
                problem: format!(
                    "snapshot {} is of a sandbox with a network: restore it with one",
                    snapshot.dir.display()
                ),
            });
        }
        (false, true) => tracing::info!(
            sandbox = %restore.id,
            "microvm sandbox restored without a network (snapshot {} was taken of a \
             sandbox without one)",
            snapshot.dir.display()
        ),
        _ => {}
    }
    let mut spec = SandboxSpec::new(restore.id.clone(), (&snapshot.image).into());
    if *has_net_device {
        spec.network = restore.network.clone();
    }
    spec.vcpus = snapshot.vcpus;
    spec.memory_mib = snapshot.memory_mib;
    spec.env = snapshot.env.clone();
    spec.boot_timeout = restore.boot_timeout;
    spec.outlive_owner = restore.outlive_owner;
    let paths = Paths::layout(dirs, &spec.id, jail.is_some());
    // Made first, as for a create: on failure nothing else exists yet.
    let net = match &spec.network {
        Some(n) => Some(network::create(nets, &spec.id, n).await?),
        None => None,
    };
    let readdress = net.as_ref().map(|n| network::init_value(n.network()));
    if let Err(e) = crate::owner::create_run_dir(dirs, &spec.id, RT, spec.outlive_owner) {
        if let Some(net) = net {
            let _ = network::teardown(&spec.id, net).await;
        }
        return Err(e);
    }
    let sandbox = MicrovmSandbox::new(dirs.clone(), vmm.to_path_buf(), nets.clone(), &spec, paths)
        .with_jail(jail, Vec::new());
    if let Some(net) = net {
        // The VMM starts in its namespace, where the TAP has the name the VM state names.
        sandbox.set_network(net);
    }
    *lock(&sandbox.snap.layers) = disk_layers.clone();
    let started = async {
        let state_dir = &sandbox.paths.state_dir;
        std::fs::create_dir_all(state_dir)
            .map_err(|e| Error::io(RT, format!("creating {}", state_dir.display()), e))?;
        // Pauses that kept the disk's top unfrozen (before --disk-layer existed) saved a
        // top path that no longer exists; the VMM would refuse them less clearly.
        if let Some(top) = disk_top {
            return Err(Error::Snapshot {
                path: top.clone(),
                problem: "an unfrozen paused disk top (an older pause): cannot be restored".into(),
            });
        }
        let memory = match jail {
            Some(_) => jailed_restore_files(
                &sandbox,
                state,
                (memory, *memory_owner_pid),
                disk_base,
                disk_layers,
            )?,
            None => memory.clone(),
        };
        *lock(&sandbox.snap.restore_args) = Some(restore_args(
            state,
            &memory,
            (disk_layers, disk_base.as_deref()),
            &sandbox.paths,
        ));
        sandbox.start().await?;
        // The guest still has its source's address, gateway and resolver: the agent
        // readdresses eth0 before anyone else talks to it.
        if let Some(value) = readdress {
            readdress_guest(&sandbox, value).await?;
        }
        Ok(())
    };
    if let Err(e) = started.await {
        let _ = sandbox.destroy().await;
        return Err(Error::Snapshot {
            path: snapshot.dir.clone(),
            problem: format!("restoring it as {}: {e}", restore.id),
        });
    }
    Ok(sandbox)
}

/// What a jailed restore's VMM reads, bound into its jail and readable by its uid (the
/// snapshot may come from an unjailed VMM: its files were root's alone). Returns the path
/// the VMM is to open the memory at: a fork's is the parent's memfd, passed as a descriptor.
/// `memory` comes with the pid of the VMM whose memfd a fork's memory link names.
fn jailed_restore_files(
    sb: &MicrovmSandbox,
    state: &Path,
    (memory, memory_owner): (&Path, Option<u32>),
    base: &Option<PathBuf>,
    layers: &[PathBuf],
) -> Result<PathBuf> {
    use super::super::jail::{hand_over, private_dir};
    let mut reads: Vec<PathBuf> = vec![state.to_path_buf()];
    let is_link = std::fs::symlink_metadata(memory).is_ok_and(|m| m.file_type().is_symlink());
    let memory_arg = if is_link {
        let fd = open_fork_memory(memory, memory_owner)?;
        let arg = PathBuf::from(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&fd)
        ));
        *lock(&sb.snap.restore_fd) = Some(fd);
        arg
    } else {
        reads.push(memory.to_path_buf());
        memory.to_path_buf()
    };
    reads.extend(layers.iter().cloned());
    for file in &reads {
        hand_over(file)?;
        if let Some(dir) = file.parent() {
            private_dir(dir)?;
        }
    }
    reads.extend(base.iter().cloned());
    *lock(&sb.jail_reads) = reads;
    Ok(memory_arg)
}

/// Opens a fork's memory through its link, which the parent VMM wrote (a jailed one could
/// have been taken over by its guest): only a link to one of that VMM's descriptors
/// (`/proc/<owner>/fd/<n>`) is followed, and only a memfd is kept, so a restore never maps
/// a host file the link was turned to.
fn open_fork_memory(memory: &Path, owner: Option<u32>) -> Result<std::os::fd::OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let target = std::fs::read_link(memory)
        .map_err(|e| Error::io(RT, format!("reading the link {}", memory.display()), e))?;
    let refused = || super::super::jail::JailError::BadMemoryLink {
        path: memory.to_path_buf(),
        target: target.to_string_lossy().into_owned(),
        owner,
    };
    let linked = owner.is_some_and(|pid| {
        super::super::jail::is_fork_memory_link(target.as_os_str().as_bytes(), pid)
    });
    if !linked {
        return Err(refused().into());
    }
    let file = std::fs::File::open(memory)
        .map_err(|e| Error::io(RT, format!("opening {}", memory.display()), e))?;
    let fd = std::os::fd::OwnedFd::from(file);
    // Our own descriptor table: what the descriptor is, as the kernel names it.
    let opened = std::fs::read_link(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&fd)
    ))
    .unwrap_or_default();
    if !opened.as_os_str().as_bytes().starts_with(b"/memfd:") {
        return Err(refused().into());
    }
    Ok(fd)
}

/// Sends the agent `/init` with only `sandcellNet` (its other fields are the caller's).
pub(super) async fn readdress_guest(sb: &MicrovmSandbox, value: String) -> Result<()> {
    let client = sandcell_envd_client::EnvdClient::new(vsock_connector(sb.paths.vsock.clone()));
    let request = sandcell_proto::agent::InitRequest {
        sandcell_net: Some(value.clone()),
        ..Default::default()
    };
    tokio::time::timeout(CONTROL_TIMEOUT, client.init(&request))
        .await
        .map_err(|_| {
            Error::io(
                RT,
                format!("readdressing the guest ({value})"),
                std::io::ErrorKind::TimedOut.into(),
            )
        })?
        .map_err(|e| {
            Error::io(
                RT,
                format!("readdressing the guest ({value})"),
                std::io::Error::other(e.to_string()),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restores_get_their_own_sockets_and_disk_top() {
        let dirs = Dirs::new("/d", "/r");
        let paths = Paths::new(&dirs, "sc-2");
        let args = restore_args(
            Path::new("/s/vm.state"),
            Path::new("/s/vm.mem"),
            (
                &[PathBuf::from("/s/disk.layer.0")],
                Some(Path::new("/i/rootfs.ext4")),
            ),
            &paths,
        );
        let args: Vec<String> = args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args,
            [
                "--restore",
                "/s/vm.state",
                "--mem",
                "/s/vm.mem",
                "--vsock-uds",
                "/r/sc-2/vsock.sock",
                "--disk-overlay",
                "/d/sandboxes/sc-2/disk.overlay",
                "--disk-layer",
                "/s/disk.layer.0",
                "--disk-base",
                "/i/rootfs.ext4",
                "--serial-log",
                "/r/sc-2/console.log",
                "--control-socket",
                "/r/sc-2/control.sock",
            ]
        );
    }

    /// A handle of a snapshot whose files exist under `dir`, with or without a net device.
    fn handle_in(dir: &Path, network: bool) -> SnapshotHandle {
        for f in [STATE_FILE, MEM_FILE, "disk.layer.0"] {
            std::fs::write(dir.join(f), b"x").unwrap();
        }
        SnapshotHandle {
            format: crate::snapshot::SNAPSHOT_FORMAT,
            runtime: RT,
            kind: SnapshotKind::Full,
            dir: dir.to_path_buf(),
            source_id: "sc-1".into(),
            image: crate::snapshot::SnapshotImage {
                name: "t".into(),
                rootfs_dir: None,
                rootfs_ext4: None,
            },
            vcpus: 1,
            memory_mib: 128,
            env: Default::default(),
            files: SnapshotFiles::Microvm {
                state: dir.join(STATE_FILE),
                memory: dir.join(MEM_FILE),
                disk_base: None,
                disk_layers: vec![dir.join("disk.layer.0")],
                disk_top: None,
                memory_owner_pid: None,
                network,
            },
        }
    }

    #[tokio::test]
    async fn a_snapshot_with_a_net_device_is_not_restored_without_a_network() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = Dirs::new(tmp.path().join("d"), tmp.path().join("r"));
        let snap = tmp.path().join("snap");
        std::fs::create_dir_all(&snap).unwrap();
        let handle = handle_in(&snap, true);
        let spec = RestoreSpec::new("sc-restored".into());
        let nets = sandcell_net::NetRegistry::new();
        let vmm = Path::new("/nonexistent/vmm");
        let err = match restore_new(&dirs, vmm, &nets, None, &handle, spec).await {
            Ok(_) => panic!("restored a networked VM without a network"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("with a network: restore it with one"), "{err}");
        // Refused before anything was made for it.
        assert!(!dirs.sandbox_run_dir("sc-restored").exists());
    }

    #[test]
    fn handles_from_before_the_network_flag_read_as_without_one() {
        let tmp = tempfile::tempdir().unwrap();
        let mut json = serde_json::to_value(handle_in(tmp.path(), true)).unwrap();
        // Internally tagged: `{"runtime": "microvm", "state": ..., "network": true}`.
        let files = json["files"].as_object_mut().unwrap();
        assert_eq!(files.remove("network"), Some(serde_json::Value::Bool(true)));
        let handle: SnapshotHandle = serde_json::from_value(json).unwrap();
        assert!(matches!(
            handle.files,
            SnapshotFiles::Microvm { network: false, .. }
        ));
    }

    #[test]
    fn snapshot_requests_freeze_the_disk_on_a_new_top() {
        let request = ControlRequest::Snapshot {
            state_path: "/s/vm.state".into(),
            mem_path: "/s/vm.mem".into(),
            mode: SnapshotMode::Fork,
            disk_new_top: Some("/d/sandboxes/sc-1/disk.top.1".into()),
        };
        let json = serde_json::to_value(&request).unwrap();
        assert_eq!(json["op"], "snapshot");
        assert_eq!(json["mode"], "fork");
        assert_eq!(json["disk_new_top"], "/d/sandboxes/sc-1/disk.top.1");
    }
}
