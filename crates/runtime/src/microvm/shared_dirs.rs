//! Volumes on the microvm runtime: each volume's host directory (a JuiceFS mount) is
//! served to the guest over virtio-fs by a virtiofsd of its own, and the agent mounts it
//! at boot (`sandcell.fs=TAG:PATH,...` on the kernel command line).
//!
//! Why virtio-fs: the guest's file requests are parsed by virtiofsd, a well-kept program
//! that confines itself (`--sandbox=namespace`: a mount namespace whose root is the shared
//! directory, no network, seccomp), never by the host kernel (no guest-written filesystem
//! image is ever mounted on the host) and never by the VMM (which only hands virtiofsd the
//! rings). Both runtimes then share one JuiceFS mount per volume, so two sandboxes, the
//! content API and another daemon see the same files.
//!
//! virtiofsd serves one connection and exits when it ends: the VMM's exit ends it. The
//! sandbox still stops its virtiofsds at destroy, and when its VMM could not be started:
//! one whose VMM never connected would wait forever. A VM with a shared directory boots
//! cold (no template snapshot holds its device) and cannot be snapshotted (the VMM refuses: the open files'
//! state is in virtiofsd).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sandcell_proto::vmm::FsConfig;
use tokio::process::Child;

use super::RT;
use crate::{Error, Result, VolumeBind};

/// Where the daemon looks for virtiofsd when `SANDCELL_VIRTIOFSD` does not say: PATH,
/// then Debian's and QEMU's install places.
const VIRTIOFSD_ENV: &str = "SANDCELL_VIRTIOFSD";
const SEARCH_DIRS: [&str; 2] = ["/usr/libexec", "/usr/lib/qemu"];
/// How long a virtiofsd may take to listen.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(10);

/// One volume as the microvm sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SharedDir {
    pub tag: String,
    pub host: PathBuf,
    pub guest: String,
    pub socket: PathBuf,
}

/// The shared directories for `binds`, their sockets in `socket_dir` (the VMM's run dir,
/// which a jailed VMM sees at the same path). Guest paths travel on the kernel command
/// line, so they may not hold spaces, commas or colons.
pub(super) fn plan(binds: &[VolumeBind], socket_dir: &Path) -> Result<Vec<SharedDir>> {
    let bad = |problem: String| Error::InvalidSpec {
        runtime: RT,
        problem,
    };
    let mut dirs = Vec::with_capacity(binds.len());
    for (i, bind) in binds.iter().enumerate() {
        bind.guest_relative().map_err(bad)?;
        if bind
            .guest
            .bytes()
            .any(|b| !b.is_ascii_graphic() || b == b',' || b == b':')
        {
            return Err(bad(format!(
                "volume path {:?}: on the microvm runtime a mount path may not hold spaces, \
                 commas, colons or non-ASCII characters",
                bind.guest
            )));
        }
        if binds[..i].iter().any(|b| b.guest == bind.guest) {
            return Err(bad(format!("two volumes at {}", bind.guest)));
        }
        dirs.push(SharedDir {
            tag: format!("vol{i}"),
            host: bind.host.clone(),
            guest: bind.guest.clone(),
            socket: socket_dir.join(format!("fs{i}.sock")),
        });
    }
    Ok(dirs)
}

/// `sandcell.fs=vol0:/data,vol1:/mnt/x`: what the agent mounts at boot.
pub(super) fn kernel_param(dirs: &[SharedDir]) -> String {
    let list: Vec<String> = dirs
        .iter()
        .map(|d| format!("{}:{}", d.tag, d.guest))
        .collect();
    format!("sandcell.fs={}", list.join(","))
}

/// The VMM's virtio-fs devices for `dirs`.
pub(super) fn fs_config(dirs: &[SharedDir]) -> Vec<FsConfig> {
    dirs.iter()
        .map(|d| FsConfig {
            tag: d.tag.clone(),
            socket: d.socket.clone(),
        })
        .collect()
}

/// The virtiofsd to run, or why there is none.
pub(super) fn virtiofsd() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(VIRTIOFSD_ENV).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(SEARCH_DIRS.iter().map(PathBuf::from))
        .map(|d| d.join("virtiofsd"))
        .find(|p| p.is_file())
        .ok_or_else(|| Error::Unavailable {
            runtime: RT,
            what: "volumes on the microvm runtime need virtiofsd, which is not installed".into(),
            hint: format!(
                "build it with scripts/build-virtiofsd.sh (Debian 13: apt install virtiofsd), or set \
                 {VIRTIOFSD_ENV}"
            ),
        })
}

/// Starts a virtiofsd for each of `dirs` and waits until each listens; the sockets are
/// then handed to `vmm_uid` (a jailed VMM's) so that it can connect. `detach`: the
/// virtiofsds outlive the daemon like the VMM does. Returns them for [`stop`]: one whose
/// VMM never connected would wait for it forever. On an error, those already started are
/// stopped.
pub(super) async fn start(
    dirs: &[SharedDir],
    vmm_uid: Option<u32>,
    detach: bool,
) -> Result<Vec<Child>> {
    let mut started = Vec::with_capacity(dirs.len());
    if dirs.is_empty() {
        return Ok(started);
    }
    let program = virtiofsd()?;
    for d in dirs {
        match start_one(&program, d, vmm_uid, detach).await {
            Ok(child) => started.push(child),
            Err(e) => {
                stop(&mut started);
                return Err(e);
            }
        }
    }
    Ok(started)
}

/// Stops `children` (SIGKILL; a virtiofsd whose VMM is gone has nothing left to serve).
/// tokio reaps them.
pub(super) fn stop(children: &mut Vec<Child>) {
    for mut child in children.drain(..) {
        let _ = child.start_kill();
    }
}

async fn start_one(
    program: &Path,
    d: &SharedDir,
    vmm_uid: Option<u32>,
    detach: bool,
) -> Result<Child> {
    // A socket left by an earlier start of this sandbox would make virtiofsd fail.
    let _ = std::fs::remove_file(&d.socket);
    let mut cmd = tokio::process::Command::new(program);
    if detach {
        crate::detach::detached(&mut cmd);
    } else {
        crate::util::supervised(&mut cmd);
    }
    cmd.arg(format!("--socket-path={}", d.socket.display()))
        .arg(format!("--shared-dir={}", d.host.display()))
        // Its own mount namespace rooted at the shared directory, no network: a lookup of
        // ".." or a symlink a guest planted cannot leave the volume.
        .args(["--sandbox=namespace", "--cache=auto", "--log-level=warn"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(false);
    let what = || format!("virtiofsd for {}", d.host.display());
    let mut child = cmd.spawn().map_err(|e| {
        Error::io(
            RT,
            format!("starting {} for {}", program.display(), d.host.display()),
            e,
        )
    })?;
    let deadline = Instant::now() + LISTEN_TIMEOUT;
    while !d.socket.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            let problem = format!("exited before listening ({status})");
            return Err(Error::io(RT, what(), std::io::Error::other(problem)));
        }
        if Instant::now() > deadline {
            let _ = child.start_kill();
            let problem = format!("no socket at {} in 10 s", d.socket.display());
            return Err(Error::io(RT, what(), std::io::Error::other(problem)));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if let Some(uid) = vmm_uid
        // lchown: the socket's directory is the VMM's, so a link there is never followed.
        && let Err(e) = std::os::unix::fs::lchown(&d.socket, Some(uid), Some(uid))
    {
        let _ = child.start_kill();
        return Err(Error::io(
            RT,
            format!("handing {} to uid {uid}", d.socket.display()),
            e,
        ));
    }
    Ok(child)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bind(guest: &str) -> VolumeBind {
        VolumeBind {
            host: PathBuf::from("/var/lib/sandcell/volumes/v"),
            guest: guest.into(),
        }
    }

    #[test]
    fn volumes_become_tagged_devices_and_one_kernel_parameter() {
        let dirs = plan(&[bind("/data"), bind("/mnt/x")], Path::new("/run/s/vmm")).unwrap();
        assert_eq!(kernel_param(&dirs), "sandcell.fs=vol0:/data,vol1:/mnt/x");
        let fs = fs_config(&dirs);
        assert_eq!(fs[1].tag, "vol1");
        assert_eq!(fs[1].socket, PathBuf::from("/run/s/vmm/fs1.sock"));
    }

    #[test]
    fn paths_that_cannot_travel_on_the_command_line_are_refused() {
        for bad in [
            "/",
            "relative",
            "/a/../b",
            "/with space",
            "/a,b",
            "/a:b",
            "/caf\u{e9}",
        ] {
            assert!(plan(&[bind(bad)], Path::new("/r")).is_err(), "{bad}");
        }
        assert!(plan(&[bind("/d"), bind("/d")], Path::new("/r")).is_err());
    }
}
