//! The jail's filesystem: a private mount namespace whose root is a small tmpfs holding only
//! the bound host paths, the device nodes the VMM needs and a /proc of its own.

use super::JailError;
use sandcell_proto::vmm::JailSpec;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

/// A path the runtime asks to show in the jail: absolute, existing, and reached through no
/// symbolic link (a link could point the bind somewhere the runtime did not mean).
pub(super) fn check_host_path(path: &Path) -> Result<(), JailError> {
    if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
        return Err(JailError::Invalid(format!(
            "{} is not an absolute path without ..",
            path.display()
        )));
    }
    let real = std::fs::canonicalize(path).map_err(|source| JailError::Path {
        what: "resolving",
        path: path.to_path_buf(),
        source,
    })?;
    if real != path {
        return Err(JailError::Invalid(format!(
            "{} goes through a symbolic link (to {})",
            path.display(),
            real.display()
        )));
    }
    Ok(())
}

/// `path` (absolute) inside `root`.
fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

fn cstr(path: &Path) -> Result<CString, JailError> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| JailError::Invalid(format!("{} holds a NUL byte", path.display())))
}

fn mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<(), JailError> {
    let err = |source| JailError::Path {
        what: "mount",
        path: target.to_path_buf(),
        source,
    };
    let source_c = source.map(cstr).transpose()?;
    let target_c = cstr(target)?;
    let fstype_c = fstype.map(|t| CString::new(t).expect("a literal without NUL"));
    let data_c = data.map(|d| CString::new(d).expect("a literal without NUL"));
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is null or a NUL-terminated string that outlives the call; the
    // kernel copies them. The result is checked.
    let rc = unsafe {
        libc::mount(
            ptr(&source_c),
            target_c.as_ptr(),
            ptr(&fstype_c),
            flags,
            ptr(&data_c).cast(),
        )
    };
    if rc != 0 {
        return Err(err(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// A mount point for a bind of a directory or a file. A target that exists already lies in
/// the view of an earlier (parent) bind: it is the host path itself, left as it is.
fn make_mount_point(target: &Path, dir: bool) -> Result<(), JailError> {
    if target.symlink_metadata().is_ok() {
        return Ok(());
    }
    let err = |source| JailError::Path {
        what: "creating the mount point",
        path: target.to_path_buf(),
        source,
    };
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(err)?;
    }
    if dir {
        std::fs::create_dir(target).map_err(err)
    } else {
        std::fs::File::create(target).map(drop).map_err(err)
    }
}

/// Step 1 (see the module documentation of `jail`).
pub(super) fn build_root(spec: &JailSpec) -> Result<(), JailError> {
    // SAFETY: unshare takes a flag word only; the result is checked.
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        return Err(JailError::sys("unshare(CLONE_NEWNS)"));
    }
    // First, before mounting anything: with "/" shared (systemd's default) every bind below
    // would propagate back into the host's namespace, and host mounts into the jail.
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )?;
    let root = spec.root.as_path();
    // Not nodev: the device nodes live here. Small: it holds directories and empty files.
    mount(
        Some(Path::new("tmpfs")),
        root,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("mode=0755,size=1m"),
    )?;
    // Parents before children, so a child's mount point is found inside its parent's view.
    let mut binds: Vec<_> = spec.binds.iter().collect();
    binds.sort_by_key(|b| b.path.components().count());
    for bind in binds {
        let target = under(root, &bind.path);
        let is_dir = std::fs::metadata(&bind.path)
            .map_err(|source| JailError::Path {
                what: "stat",
                path: bind.path.clone(),
                source,
            })?
            .is_dir();
        make_mount_point(&target, is_dir)?;
        mount(Some(&bind.path), &target, None, libc::MS_BIND, None)?;
        // A bind takes its flags only from a remount of itself.
        let mut flags =
            libc::MS_BIND | libc::MS_REMOUNT | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
        if !bind.writable {
            flags |= libc::MS_RDONLY;
        }
        mount(None, &target, None, flags, None)?;
    }
    for dev in &spec.devices {
        make_device(root, dev, spec.uid, spec.gid)?;
    }
    let proc_dir = root.join("proc");
    make_mount_point(&proc_dir, true)?;
    let proc_flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    // Its own processes only (hidepid=invisible, Linux 5.8); hidepid=2 on older kernels.
    mount(
        Some(Path::new("proc")),
        &proc_dir,
        Some("proc"),
        proc_flags,
        Some("hidepid=invisible"),
    )
    .or_else(|_| {
        mount(
            Some(Path::new("proc")),
            &proc_dir,
            Some("proc"),
            proc_flags,
            Some("hidepid=2"),
        )
    })
}

/// A character device node in the jail with the host node's device number, owned by the
/// jail's uid and gid, mode 0600: only this VMM opens it.
fn make_device(root: &Path, dev: &Path, uid: u32, gid: u32) -> Result<(), JailError> {
    let meta = std::fs::metadata(dev).map_err(|source| JailError::Path {
        what: "stat",
        path: dev.to_path_buf(),
        source,
    })?;
    if !meta.file_type().is_char_device() {
        return Err(JailError::Invalid(format!(
            "{} is not a character device",
            dev.display()
        )));
    }
    let target = under(root, dev);
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(|source| JailError::Path {
            what: "creating",
            path: parent.to_path_buf(),
            source,
        })?;
    }
    let target_c = cstr(&target)?;
    let sys = |what| JailError::Path {
        what,
        path: target.clone(),
        source: std::io::Error::last_os_error(),
    };
    // SAFETY: a NUL-terminated path that outlives the call; mode and device are plain
    // integers. The result is checked.
    if unsafe { libc::mknod(target_c.as_ptr(), libc::S_IFCHR | 0o600, meta.rdev()) } != 0 {
        return Err(sys("mknod"));
    }
    // SAFETY: as above.
    if unsafe { libc::chown(target_c.as_ptr(), uid, gid) } != 0 {
        return Err(sys("chown"));
    }
    Ok(())
}

/// Step 2: `root` becomes `/`; the host's tree, stacked under it by pivot_root, is detached.
pub(super) fn pivot_into(root: &Path) -> Result<(), JailError> {
    std::env::set_current_dir(root).map_err(|source| JailError::Path {
        what: "chdir",
        path: root.to_path_buf(),
        source,
    })?;
    let dot = CString::new(".").expect("a literal without NUL");
    // pivot_root(".", "."): the new root and the old one on the same directory; the old one
    // ends up on top, and the umount below takes it away (no directory for it needed).
    // SAFETY: two NUL-terminated strings that outlive the call; the result is checked.
    if unsafe { libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) } != 0 {
        return Err(JailError::sys("pivot_root"));
    }
    // SAFETY: as above.
    if unsafe { libc::umount2(dot.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(JailError::sys("detaching the host's root"));
    }
    std::env::set_current_dir("/").map_err(|source| JailError::Path {
        what: "chdir",
        path: PathBuf::from("/"),
        source,
    })?;
    // The tmpfs takes no new files: only writable binds take writes. Device nodes on a
    // read-only mount still open for writing.
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NOEXEC,
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_paths_must_be_absolute_real_and_link_free() {
        let dir = tempfile::tempdir().expect("tempdir");
        let real = std::fs::canonicalize(dir.path()).expect("canonical");
        assert!(check_host_path(&real).is_ok());
        assert!(check_host_path(Path::new("relative/x")).is_err());
        assert!(check_host_path(&real.join("../x")).is_err());
        assert!(check_host_path(&real.join("missing")).is_err());
        let link = real.join("link");
        std::os::unix::fs::symlink("/etc", &link).expect("symlink");
        let err = check_host_path(&link).expect_err("a link is refused");
        assert!(err.to_string().contains("symbolic link"), "{err}");
    }

    #[test]
    fn under_keeps_the_host_path() {
        assert_eq!(
            under(Path::new("/jail"), Path::new("/var/lib/x")),
            PathBuf::from("/jail/var/lib/x")
        );
    }
}
