//! Pulls and imports against a real local registry (`docker-registry` on loopback) holding
//! images made here, checked in the unpacked tree and the ext4 image. Needs docker-registry,
//! skopeo, htpasswd (apache2-utils), busybox-static, e2fsprogs and the installed agent;
//! fails loudly without them. The in-sandbox checks are in crates/cli/tests/image_gvisor.rs.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use sandcell_image::cache::BlobCache;
use sandcell_image::registry::{Auth, PullOptions, pull};
use sandcell_image::{BuildOptions, Error, Event, Limits, NoProgress, Progress, build};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Mutex;

fn options(data: &Path, name: &str) -> BuildOptions {
    BuildOptions {
        data_dir: data.to_path_buf(),
        name: name.into(),
        agent: Some(agent()),
        force: false,
        limits: Limits::default(),
    }
}

fn insecure(registry: &Registry) -> PullOptions {
    PullOptions {
        insecure_registries: vec![registry.host()],
        ..PullOptions::default()
    }
}

/// Records which layers were fetched and which came from the cache.
#[derive(Default)]
struct Recorder(Mutex<Vec<(String, bool)>>);

impl Progress for Recorder {
    fn event(&self, e: Event) {
        if let Event::LayerStart { digest, cached, .. } = e {
            self.0.lock().unwrap().push((digest, cached));
        }
    }
}

fn lgetxattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 256];
    // SAFETY: both strings are NUL-terminated, buf is writable for its length.
    let len =
        unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (len >= 0).then(|| buf[..len as usize].to_vec())
}

/// Everything `layered_image_layers` promises, in the unpacked tree.
fn check_layered_tree(root: &Path) {
    let meta =
        |p: &str| std::fs::symlink_metadata(root.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    let absent = |p: &str| {
        assert!(
            std::fs::symlink_metadata(root.join(p)).is_err(),
            "{p} should be gone"
        )
    };
    // Whiteouts: the file and the directory are gone, their neighbour stays, no .wh. left.
    absent("data/removed.txt");
    absent("data/gone");
    absent("data/.wh.removed.txt");
    assert_eq!(std::fs::read(root.join("data/keep")).unwrap(), b"kept");
    // Opaque directory: only what the upper layer put there.
    let mut opq: Vec<_> = std::fs::read_dir(root.join("opq"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    opq.sort();
    assert_eq!(opq, ["new"]);
    // Hard links, across layers and within one.
    assert_eq!(meta("hl/orig").ino(), meta("hl/link").ino());
    assert_eq!(meta("hl/orig").nlink(), 2);
    assert_eq!(meta("hl/l2").ino(), meta("hl/l2link").ino());
    // Modes and owners.
    assert_eq!(meta("suid/prog").mode() & 0o7777, 0o4755);
    assert_eq!((meta("suid/prog").uid(), meta("suid/prog").gid()), (0, 0));
    assert_eq!(meta("suid/sgid").mode() & 0o7777, 0o2775);
    assert_eq!(meta("suid/sgid").gid(), 1000);
    assert_eq!(meta("suid/sticky").mode() & 0o7777, 0o1777);
    assert_eq!(
        (
            meta("owned").uid(),
            meta("owned").gid(),
            meta("owned").mode() & 0o777
        ),
        (1000, 1000, 0o640)
    );
    assert_eq!(meta("home/user").uid(), 1000);
    assert_eq!(
        lgetxattr(&root.join("xattr"), "user.sandcell").as_deref(),
        Some(&b"hello"[..])
    );
    // Replacements: a file by a directory, a directory by a symlink.
    assert!(meta("swap/was-file").is_dir());
    assert!(meta("swap/was-dir").file_type().is_symlink());
    // The agent and the mount points.
    assert_eq!(meta("sbin/sandcell-agent").mode() & 0o777, 0o755);
    for dir in ["proc", "sys", "dev", "tmp", "run"] {
        assert!(meta(dir).is_dir(), "{dir}");
    }
    assert_eq!(meta("tmp").mode() & 0o7777, 0o1777);
}

fn check_ext4(ext4: &Path) {
    require_tool("debugfs", "e2fsprogs");
    let out = std::process::Command::new("debugfs")
        .args(["-R", "stat /suid/prog"])
        .arg(ext4)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Mode:  04755"),
        "debugfs stat /suid/prog: {text}"
    );
    let out = std::process::Command::new("debugfs")
        .args(["-R", "stat /owned"])
        .arg(ext4)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("User:  1000") && text.contains("Group:  1000"),
        "debugfs stat /owned: {text}"
    );
    let out = std::process::Command::new("debugfs")
        .args(["-R", "stat /hl/orig"])
        .arg(ext4)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Links: 2"), "debugfs stat /hl/orig: {text}");
    let out = std::process::Command::new("e2fsck")
        .args(["-fn"])
        .arg(ext4)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "e2fsck: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn pulls_by_tag_and_digest_and_unpacks_exactly() {
    let registry = Registry::start(None);
    let tmp = tempfile::tempdir().unwrap();
    let mut layout = Layout::new(&tmp.path().join("layout"));
    let desc = layout.image(&layered_image_layers(), "amd64", layered_image_config());
    layout.tag(desc, "v1");
    push(
        &layout.dir,
        "v1",
        &format!("{}/test/layers:v1", registry.host()),
        None,
    );

    let data = tmp.path().join("data");
    let cache = BlobCache::in_data_dir(&data);
    let recorder = Recorder::default();
    let reference = format!("{}/test/layers:v1", registry.host());
    let image = pull(&reference, &cache, &insecure(&registry), &recorder)
        .await
        .unwrap();
    assert_eq!(image.layers.len(), 2);
    assert!(recorder.0.lock().unwrap().iter().all(|(_, cached)| !cached));
    let report = tokio::task::spawn_blocking({
        let (image, opts) = (image.clone(), options(&data, "layers"));
        move || build(&image, &opts, &NoProgress)
    })
    .await
    .unwrap()
    .unwrap();
    let dir = data.join("images/layers");
    assert_eq!(report.dir, dir);
    check_layered_tree(&dir.join("rootfs"));
    check_ext4(&dir.join("rootfs.ext4"));
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["env"][1], "GREETING=hello from the image");
    assert_eq!(
        (config["workingDir"].as_str(), config["user"].as_str()),
        (Some("/data"), Some("user"))
    );
    assert_eq!(
        (config["entrypoint"][0].as_str(), config["cmd"][0].as_str()),
        (Some("/bin/sh"), Some("echo hi"))
    );
    assert_eq!(config["manifestDigest"], image.manifest_digest.as_str());
    // No build leftovers beside the image.
    let names: Vec<_> = std::fs::read_dir(data.join("images"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["layers"]);

    // By digest: the same manifest; the layers come from the cache.
    let by_digest = format!("{}/test/layers@{}", registry.host(), image.manifest_digest);
    let recorder = Recorder::default();
    let again = pull(&by_digest, &cache, &insecure(&registry), &recorder)
        .await
        .unwrap();
    assert_eq!(again.manifest_digest, image.manifest_digest);
    assert!(recorder.0.lock().unwrap().iter().all(|(_, cached)| *cached));
    // The same name again is refused without force, accepted with it.
    let e = build(&again, &options(&data, "layers"), &NoProgress).unwrap_err();
    assert!(matches!(e, Error::Exists(_)), "{e}");
    build(
        &again,
        &BuildOptions {
            force: true,
            ..options(&data, "layers")
        },
        &NoProgress,
    )
    .unwrap();
    check_layered_tree(&dir.join("rootfs"));

    // A digest the registry does not have.
    let missing = format!("{}/test/layers@sha256:{}", registry.host(), "0".repeat(64));
    let e = pull(&missing, &cache, &insecure(&registry), &NoProgress)
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Registry { .. } | Error::RegistryStatus { .. }),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn resolves_a_multi_arch_index_to_linux_amd64() {
    let registry = Registry::start(None);
    let tmp = tempfile::tempdir().unwrap();
    let mut layout = Layout::new(&tmp.path().join("layout"));
    let arm = {
        let mut l = LayerBuilder::new();
        l.add(Entry::file("arch", b"arm64"));
        layout.image(&[l.tar()], "arm64", serde_json::json!({}))
    };
    let amd = {
        let mut l = LayerBuilder::new();
        l.add(Entry::file("arch", b"amd64"));
        layout.image(
            &[l.tar()],
            "amd64",
            serde_json::json!({"Env": ["ARCH=amd64"]}),
        )
    };
    // arm64 first: picking the first entry would be wrong.
    let index = layout.index_of(&[arm, amd.clone()]);
    let index_digest = index["digest"].as_str().unwrap().to_string();
    layout.tag(index, "multi");
    push(
        &layout.dir,
        "multi",
        &format!("{}/test/multi:latest", registry.host()),
        None,
    );

    let data = tmp.path().join("data");
    let cache = BlobCache::in_data_dir(&data);
    for reference in [
        format!("{}/test/multi:latest", registry.host()),
        format!("{}/test/multi@{index_digest}", registry.host()),
    ] {
        let image = pull(&reference, &cache, &insecure(&registry), &NoProgress)
            .await
            .unwrap();
        assert_eq!(
            image.manifest_digest.as_str(),
            amd["digest"].as_str().unwrap(),
            "{reference}"
        );
        assert_eq!(image.config.defaults().env, ["ARCH=amd64"]);
    }
    let image = pull(
        &format!("{}/test/multi:latest", registry.host()),
        &cache,
        &insecure(&registry),
        &NoProgress,
    )
    .await
    .unwrap();
    build(&image, &options(&data, "multi"), &NoProgress).unwrap();
    assert_eq!(
        std::fs::read(data.join("images/multi/rootfs/arch")).unwrap(),
        b"amd64"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn basic_auth_needs_the_right_credentials() {
    let registry = Registry::start(Some(("alice", "s3cret")));
    let tmp = tempfile::tempdir().unwrap();
    let mut layout = Layout::new(&tmp.path().join("layout"));
    let mut l = LayerBuilder::new();
    l.add(Entry::file("hello", b"authenticated"));
    let desc = layout.image(&[l.tar()], "amd64", serde_json::json!({}));
    layout.tag(desc, "v1");
    let reference = format!("{}/private/app:v1", registry.host());
    push(&layout.dir, "v1", &reference, Some(("alice", "s3cret")));

    let cache = BlobCache::in_data_dir(&tmp.path().join("data"));
    let e = pull(&reference, &cache, &insecure(&registry), &NoProgress)
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Registry { .. } | Error::RegistryStatus { .. }),
        "anonymous: {e}"
    );
    let wrong = PullOptions {
        auth: Auth::Basic {
            username: "alice".into(),
            password: "wrong".into(),
        },
        ..insecure(&registry)
    };
    let e = pull(&reference, &cache, &wrong, &NoProgress)
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Registry { .. } | Error::RegistryStatus { .. }),
        "wrong password: {e}"
    );
    let right = PullOptions {
        auth: Auth::Basic {
            username: "alice".into(),
            password: "s3cret".into(),
        },
        ..insecure(&registry)
    };
    let image = pull(&reference, &cache, &right, &NoProgress).await.unwrap();
    build(
        &image,
        &options(&tmp.path().join("data"), "private"),
        &NoProgress,
    )
    .unwrap();
    assert_eq!(
        std::fs::read(tmp.path().join("data/images/private/rootfs/hello")).unwrap(),
        b"authenticated"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn malicious_layers_are_refused_and_leave_nothing() {
    let registry = Registry::start(None);
    let tmp = tempfile::tempdir().unwrap();
    let mut layout = Layout::new(&tmp.path().join("layout"));
    let victim = tmp.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("dotdot", {
            let mut l = LayerBuilder::new();
            l.add(Entry::file("../../../../victim/owned", b"x"));
            l.tar()
        }),
        ("absolute", {
            let mut l = LayerBuilder::new();
            l.add(Entry::file("/etc/sandcell-test-escape", b"x"));
            l.tar()
        }),
        ("symlink-escape", {
            // A symlink leading above the root, then a file written through it.
            let mut l = LayerBuilder::new();
            l.add(Entry::symlink("up", "../../../../../../../.."))
                .add(Entry::file(
                    Box::leak(format!("up{}/owned", victim.display()).into_boxed_str()),
                    b"x",
                ));
            l.tar()
        }),
        ("symlink-chain-escape", {
            let mut l = LayerBuilder::new();
            l.add(Entry::dir("a"))
                .add(Entry::symlink("a/b", "../c"))
                .add(Entry::symlink("c", "../.."))
                .add(Entry::file("a/b/owned", b"x"));
            l.tar()
        }),
        ("hardlink-escape", {
            let mut l = LayerBuilder::new();
            l.add(Entry::hardlink("passwd", "../../../../etc/passwd"));
            l.tar()
        }),
    ];
    let mut tags = Vec::new();
    for (name, layer) in cases {
        let desc = layout.image(&[layer], "amd64", serde_json::json!({}));
        layout.tag(desc, name);
        tags.push(name);
    }
    for tag in &tags {
        push(
            &layout.dir,
            tag,
            &format!("{}/evil/img:{tag}", registry.host()),
            None,
        );
    }
    let data = tmp.path().join("data");
    let cache = BlobCache::in_data_dir(&data);
    for tag in tags {
        let image = pull(
            &format!("{}/evil/img:{tag}", registry.host()),
            &cache,
            &insecure(&registry),
            &NoProgress,
        )
        .await
        .unwrap();
        let e = build(&image, &options(&data, "evil"), &NoProgress).unwrap_err();
        assert!(matches!(e, Error::UnsafePath { .. }), "{tag}: {e}");
        let left: Vec<_> = std::fs::read_dir(data.join("images")).unwrap().collect();
        assert!(left.is_empty(), "{tag}: the failed build left {left:?}");
    }
    assert!(!victim.join("owned").exists());
    assert!(!Path::new("/etc/sandcell-test-escape").exists());
}

#[test]
fn imports_oci_layouts_and_docker_save_tarballs() {
    require_tool("skopeo", "skopeo");
    let tmp = tempfile::tempdir().unwrap();
    let mut layout = Layout::new(&tmp.path().join("layout"));
    let desc = layout.image(&layered_image_layers(), "amd64", layered_image_config());
    layout.tag(desc, "v1");
    let data = tmp.path().join("data");
    let cache = BlobCache::in_data_dir(&data);

    let image =
        sandcell_image::import::import(&layout.dir, None, &cache, &Limits::default()).unwrap();
    build(&image, &options(&data, "from-layout"), &NoProgress).unwrap();
    check_layered_tree(&data.join("images/from-layout/rootfs"));

    // docker save's format, written by skopeo (uncompressed layers, manifest.json).
    let tarball = tmp.path().join("saved.tar");
    let out = std::process::Command::new("skopeo")
        .args(["--insecure-policy", "copy"])
        .arg(format!("oci:{}:v1", layout.dir.display()))
        .arg(format!(
            "docker-archive:{}:sandcell/saved:v1",
            tarball.display()
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "skopeo: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let image = sandcell_image::import::import(
        &tarball,
        Some("sandcell/saved:v1"),
        &cache,
        &Limits::default(),
    )
    .unwrap();
    assert_eq!(
        image.config.defaults().working_dir.as_deref(),
        Some("/data")
    );
    build(&image, &options(&data, "from-save"), &NoProgress).unwrap();
    check_layered_tree(&data.join("images/from-save/rootfs"));
    let e = sandcell_image::import::import(&tarball, Some("nope:v1"), &cache, &Limits::default())
        .unwrap_err();
    assert!(e.to_string().contains("no image tagged"), "{e}");
}
