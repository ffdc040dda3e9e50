//! Flattening is checked against overlayfs itself: the kernel's view of `[layers..., image]`
//! and of `[flattened, image]` must be the same tree (root only: whiteouts, trusted xattrs
//! and mounts need it; the gvisor runtime's tests run as root).

use super::*;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt, symlink};

fn whiteout(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is a valid string; makes a character device 0/0 (an overlayfs whiteout).
    assert_eq!(unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR, 0) }, 0);
}

fn opaque(path: &Path) {
    let dir = crate::nofollow::open_dir(path).unwrap();
    set_xattr(&dir, OPAQUE, b"y").unwrap();
}

fn is_opaque(path: &Path) -> bool {
    let dir = crate::nofollow::open_dir(path).unwrap();
    get_xattr(&dir, OPAQUE).unwrap() == Some(b"y".to_vec())
}

fn write(path: &Path, contents: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, contents).unwrap();
}

/// Every entry under `root`: its type and contents (file text, link target), mode.
fn tree(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = fs::symlink_metadata(&path).unwrap();
            let mode = meta.permissions().mode() & 0o7777;
            let what = if meta.is_dir() {
                todo.push(path.clone());
                format!("dir {mode:o}")
            } else if meta.file_type().is_symlink() {
                format!("link {}", fs::read_link(&path).unwrap().display())
            } else if meta.file_type().is_fifo() {
                format!("fifo {mode:o}")
            } else {
                format!("file {mode:o} {}", fs::read_to_string(&path).unwrap())
            };
            out.insert(path.strip_prefix(root).unwrap().to_path_buf(), what);
        }
    }
    out
}

struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = crate::util::unmount_if_mounted(&self.0);
    }
}

/// A read-only overlayfs of `lowers` (top first) at `target`.
fn mount(lowers: &[&Path], target: &Path) -> Mount {
    fs::create_dir_all(target).unwrap();
    let lower: Vec<String> = lowers.iter().map(|l| l.display().to_string()).collect();
    let options = CString::new(format!("lowerdir={}", lower.join(":"))).unwrap();
    let c_target = CString::new(target.as_os_str().as_bytes()).unwrap();
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            c"overlay".as_ptr(),
            c_target.as_ptr(),
            c"overlay".as_ptr(),
            libc::MS_RDONLY,
            options.as_ptr().cast(),
        )
    };
    assert_eq!(rc, 0, "mount: {}", io::Error::last_os_error());
    Mount(target.to_path_buf())
}

#[test]
fn the_flattened_layer_shows_what_the_stack_showed() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let (image, deep, top) = (t.join("image"), t.join("deep"), t.join("top"));
    let outside = t.join("outside");
    fs::create_dir_all(&outside).unwrap();
    // The image.
    write(&image.join("etc/keep"), "image keep");
    write(&image.join("etc/gone"), "image gone");
    write(&image.join("opaque/x"), "image x");
    write(&image.join("hidden/x"), "image hidden");
    write(&image.join("back/x"), "image back");
    write(&image.join("file"), "image file");
    write(&image.join("becomes-dir/img"), "image under a deep file");
    write(&image.join("wh-dir/x"), "image under a deep whiteout");
    // A snapshot's layer: deletes hidden/, adds, replaces file.
    write(&deep.join("etc/new"), "deep new");
    write(&deep.join("opaque/y"), "deep y");
    write(&deep.join("file"), "deep file");
    write(&deep.join("becomes-dir"), "deep plain file");
    whiteout(&deep.join("hidden"));
    write(&deep.join("linked/a"), "deep linked");
    whiteout(&deep.join("wh-dir"));
    // The sandbox's own upper on top.
    write(&top.join("etc/newer"), "top newer");
    whiteout(&top.join("etc/gone"));
    whiteout(&top.join("etc/new"));
    write(&top.join("opaque/z"), "top z");
    opaque(&top.join("opaque"));
    write(&top.join("hidden/again"), "top again"); // a dir over the deep whiteout
    opaque(&top.join("hidden"));
    write(&top.join("becomes-dir/inner"), "top inner"); // a dir over a deep file
    write(&top.join("wh-dir/new"), "top over a whiteout"); // a plain dir over one
    fs::create_dir_all(top.join("back")).unwrap(); // plain dir: merges with the image
    write(&top.join("back/y"), "top back");
    symlink(&outside, top.join("linked")).unwrap(); // a guest's link over a deep dir
    symlink("/etc/passwd", top.join("passwd")).unwrap();
    fs::set_permissions(top.join("etc/newer"), fs::Permissions::from_mode(0o4750)).unwrap();
    let c = CString::new(top.join("fifo").as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is a valid string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o640) }, 0);

    let flat = t.join("flat");
    let copied = flatten(&[&top, &deep], &flat, 1 << 20).unwrap();
    assert!(copied.bytes > 0 && copied.entries > 10, "{copied:?}");

    let stack = mount(&[&top, &deep, &image], &t.join("m-stack"));
    let flat_view = mount(&[&flat, &image], &t.join("m-flat"));
    let (want, got) = (tree(&stack.0), tree(&flat_view.0));
    assert_eq!(got, want);
    assert_eq!(want[Path::new("opaque/z")], "file 644 top z");
    assert!(!want.contains_key(Path::new("opaque/x")));
    assert!(!want.contains_key(Path::new("hidden/x")));
    assert!(want.contains_key(Path::new("back/x")));
    assert!(!want.contains_key(Path::new("becomes-dir/img")));
    assert!(!want.contains_key(Path::new("wh-dir/x")));
    assert_eq!(want[Path::new("etc/newer")], "file 4750 top newer");
    drop((stack, flat_view));

    // The layer itself: whiteouts kept for the image, links copied as links, nothing
    // written through them.
    let meta = fs::symlink_metadata(flat.join("etc/gone")).unwrap();
    assert!(meta.file_type().is_char_device() && meta.rdev() == 0);
    assert!(is_opaque(&flat.join("becomes-dir")) && is_opaque(&flat.join("hidden")));
    assert!(is_opaque(&flat.join("wh-dir")));
    assert!(!is_opaque(&flat.join("back")));
    assert_eq!(fs::read_link(flat.join("linked")).unwrap(), outside);
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
    assert_eq!(
        fs::read_link(flat.join("passwd")).unwrap(),
        Path::new("/etc/passwd")
    );
}

#[test]
fn sizes_and_depths_are_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let layer = tmp.path().join("layer");
    write(&layer.join("big"), &"x".repeat(4096));
    let err = flatten(&[&layer], &tmp.path().join("a"), 1000).unwrap_err();
    assert!(
        matches!(err, FlattenError::TooLarge { limit: 1000 }),
        "{err}"
    );

    let mut deep = tmp.path().join("deep");
    for _ in 0..=MAX_DEPTH {
        deep.push("d");
    }
    fs::create_dir_all(&deep).unwrap();
    let err = flatten(&[&tmp.path().join("deep")], &tmp.path().join("b"), 1 << 20).unwrap_err();
    assert!(matches!(err, FlattenError::TooDeep { .. }), "{err}");
    // The destination must be new.
    assert!(flatten(&[&layer], &tmp.path().join("b"), 1 << 20).is_err());
}
