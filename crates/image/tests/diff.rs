//! A real overlayfs mount over an unpacked tree, changed the ways a build step changes a
//! root (files removed, a directory replaced, modes, hard links, xattrs); its upper directory
//! exported as an OCI layer and applied with our unpacker over the base must give exactly
//! the merged view. Needs root (mount); fails loudly without it.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use sandcell_image::Limits;
use sandcell_image::diff::layer_from_overlay_upper;
use sandcell_image::unpack::Unpacker;
use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Path → (kind, mode, uid, gid, content or link target, hard-link group) of every entry.
fn listing(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut inodes: BTreeMap<u64, PathBuf> = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            let m = std::fs::symlink_metadata(&path).unwrap();
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            let what = if m.is_dir() {
                stack.push(path.clone());
                "dir".to_string()
            } else if m.file_type().is_symlink() {
                format!("link {}", std::fs::read_link(&path).unwrap().display())
            } else if !m.is_file() {
                // A fifo or device: never read (a fifo would block).
                format!("special {:o}", m.mode() & 0o170000)
            } else {
                let group = if m.nlink() > 1 {
                    let first = inodes.entry(m.ino()).or_insert_with(|| rel.clone()).clone();
                    format!(" linked-with {}", first.display())
                } else {
                    String::new()
                };
                format!("file {}{group}", sha256_hex(&std::fs::read(&path).unwrap()))
            };
            out.insert(
                rel,
                format!("{what} {:o} {}:{}", m.mode() & 0o7777, m.uid(), m.gid()),
            );
        }
    }
    out
}

fn sh(script: &str, dir: &Path) {
    let out = Command::new("sh")
        .arg("-ec")
        .arg(script)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn an_overlay_upper_exported_and_applied_gives_the_merged_tree() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "this test needs root (an overlayfs mount)");
    let tmp = tempfile::Builder::new()
        .prefix("sc-diff")
        .tempdir_in("/tmp")
        .unwrap();
    let (lower, upper, work, merged) = (
        tmp.path().join("lower"),
        tmp.path().join("upper"),
        tmp.path().join("work"),
        tmp.path().join("merged"),
    );
    for d in [&upper, &work, &merged] {
        std::fs::create_dir(d).unwrap();
    }
    let mut base = Unpacker::new(&lower, Limits::default()).unwrap();
    for layer in layered_image_layers() {
        base.apply_layer(&layer[..], "base", None).unwrap();
    }
    base.finish().unwrap();

    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    let out = Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o", &opts])
        .arg(&merged)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mount overlay: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let mounted = Unmount(merged.clone());
    // What a RUN step might do.
    sh(
        "rm data/keep; rm -r hl; rm -rf opq && mkdir opq && echo fresh > opq/only; \
         echo changed > owned; chmod 4750 owned; mkdir -p new/deep; echo n > new/deep/file; \
         ln new/deep/file new/hard; ln -s ../data new/sym; chown 1000:1000 new/deep; \
         chmod 1777 new; mkfifo new/fifo",
        &merged,
    );
    let xattr_file = merged.join("new/deep/file");
    let c = std::ffi::CString::new(xattr_file.as_os_str().as_bytes()).unwrap();
    // SAFETY: NUL-terminated strings and a valid value slice.
    let rc = unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            c"user.step".as_ptr(),
            b"run".as_ptr().cast(),
            3,
            0,
        )
    };
    assert_eq!(rc, 0, "setxattr: {}", std::io::Error::last_os_error());
    let expected = listing(&merged);
    drop(mounted);

    let mut layer = Vec::new();
    let stats = layer_from_overlay_upper(&upper, &mut layer).unwrap();
    assert!(stats.whiteouts >= 2 && stats.opaque_dirs == 1, "{stats:?}");

    // The base again, then the exported layer over it.
    let result = tmp.path().join("result");
    let mut unpacker = Unpacker::new(&result, Limits::default()).unwrap();
    for l in layered_image_layers() {
        unpacker.apply_layer(&l[..], "base", None).unwrap();
    }
    unpacker.apply_layer(&layer[..], "step", None).unwrap();
    unpacker.finish().unwrap();
    let got = listing(&result);
    let diff: Vec<_> = expected
        .iter()
        .filter(|(k, v)| got.get(*k) != Some(v))
        .map(|(k, v)| format!("{}: expected {v}, got {:?}", k.display(), got.get(k)))
        .chain(
            got.keys()
                .filter(|k| !expected.contains_key(*k))
                .map(|k| format!("{}: unexpected", k.display())),
        )
        .collect();
    assert!(
        diff.is_empty(),
        "the applied layer differs from the merged view:\n{}",
        diff.join("\n")
    );
    let mode = std::fs::metadata(result.join("owned"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o4750);
}
