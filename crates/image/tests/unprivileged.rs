//! An import by an unprivileged user: the host tree cannot carry the image's owners, so
//! they are set in the ext4 image afterwards (debugfs), and the modes (setuid included) are
//! kept. The test runs as root and re-runs itself as `nobody` for the import; it fails
//! loudly without root.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use sandcell_image::cache::BlobCache;
use sandcell_image::{BuildOptions, Limits, NoProgress, build};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

const CHILD_ENV: &str = "SANDCELL_IMAGE_TEST_UNPRIVILEGED_DIR";
const NOBODY: u32 = 65534;

#[test]
fn unprivileged_build_keeps_owners_in_the_ext4() {
    if let Some(dir) = std::env::var_os(CHILD_ENV) {
        // The child, as nobody.
        let dir = Path::new(&dir);
        let cache = BlobCache::in_data_dir(&dir.join("data"));
        let image =
            sandcell_image::import::import(&dir.join("layout"), None, &cache, &Limits::default())
                .unwrap();
        let options = BuildOptions {
            data_dir: dir.join("data"),
            name: "unpriv".into(),
            agent: Some(dir.join("agent")),
            force: false,
            limits: Limits::default(),
        };
        build(&image, &options, &NoProgress).unwrap();
        return;
    }
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test needs root (to run its import as nobody)"
    );
    require_tool("debugfs", "e2fsprogs");
    let tmp = tempfile::Builder::new()
        .prefix("sc-unpriv")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut layout = Layout::new(&tmp.path().join("layout"));
    let desc = layout.image(&layered_image_layers(), "amd64", layered_image_config());
    layout.tag(desc, "v1");
    std::fs::copy(agent(), tmp.path().join("agent")).unwrap();
    let chmod = Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(tmp.path())
        .status()
        .unwrap();
    assert!(chmod.success());

    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "unprivileged_build_keeps_owners_in_the_ext4",
            "--nocapture",
        ])
        .env(CHILD_ENV, tmp.path())
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the import as nobody failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let image = tmp.path().join("data/images/unpriv");
    // The host tree belongs to nobody (no chown without root)...
    assert_eq!(
        std::fs::metadata(image.join("rootfs/owned")).unwrap().uid(),
        NOBODY
    );
    // ...the ext4 image has the image's owners, and the modes.
    let stat = |path: &str| {
        let out = Command::new("debugfs")
            .args(["-R", &format!("stat {path}")])
            .arg(image.join("rootfs.ext4"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let owned = stat("/owned");
    assert!(
        owned.contains("User:  1000") && owned.contains("Group:  1000"),
        "{owned}"
    );
    let prog = stat("/suid/prog");
    assert!(
        prog.contains("Mode:  04755") && prog.contains("User:     0"),
        "{prog}"
    );
    let agent = stat("/sbin/sandcell-agent");
    assert!(
        agent.contains("User:     0") && agent.contains("Mode:  0755"),
        "{agent}"
    );
    let home = stat("/home/user");
    assert!(home.contains("User:  1000"), "{home}");
}
