//! Test fixtures shared by the image tests (crates/image/tests and crates/cli/tests include
//! this file): a real local registry (Debian's `docker-registry`, on loopback, a free port,
//! its own storage), OCI layouts written blob by blob, layers built entry by entry
//! (malicious ones included), and `skopeo` to push them. Nothing is mocked; a missing tool
//! fails the test with the package to install.

#![allow(dead_code)]

use sha2::{Digest as _, Sha256};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn require_tool(tool: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "{tool} is needed on $PATH: apt-get install {package} (see .ci/install-deps)"
    );
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", sha256_hex(bytes))
}

/// A `docker-registry serve` on 127.0.0.1, killed on drop.
pub struct Registry {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Registry {
    /// With `basic`, every request needs those credentials (htpasswd, bcrypt).
    pub fn start(basic: Option<(&str, &str)>) -> Registry {
        require_tool("docker-registry", "docker-registry");
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut config = format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.path().join("storage").display()
        );
        if let Some((user, pass)) = basic {
            require_tool("htpasswd", "apache2-utils");
            let htpasswd = dir.path().join("htpasswd");
            let out = Command::new("htpasswd")
                .args(["-Bbc"])
                .arg(&htpasswd)
                .args([user, pass])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "htpasswd: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: sandcell-test\n    path: {}\n",
                htpasswd.display()
            ));
        }
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting docker-registry");
        let mut registry = Registry {
            child,
            port,
            _dir: dir,
        };
        registry.wait_ready();
        registry
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let log = std::fs::read_to_string(self._dir.path().join("registry.log"))
                    .unwrap_or_default();
                panic!("docker-registry exited ({status}): {log}");
            }
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = s.write_all(b"GET /v2/ HTTP/1.0\r\n\r\n");
                let mut buf = [0u8; 12];
                if s.read_exact(&mut buf).is_ok() && buf.starts_with(b"HTTP/1.") {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "docker-registry did not answer on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `skopeo copy oci:LAYOUT:TAG docker://DEST` (with `--all` for indexes).
pub fn push(layout: &Path, tag: &str, dest: &str, creds: Option<(&str, &str)>) {
    require_tool("skopeo", "skopeo");
    let mut cmd = Command::new("skopeo");
    cmd.args([
        "--insecure-policy",
        "copy",
        "--all",
        "--preserve-digests",
        "--dest-tls-verify=false",
    ]);
    if let Some((u, p)) = creds {
        cmd.arg(format!("--dest-creds={u}:{p}"));
    }
    cmd.arg(format!("oci:{}:{tag}", layout.display()))
        .arg(format!("docker://{dest}"));
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "skopeo copy to {dest}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A layer built entry by entry, including entries no well-behaved tool would write.
pub struct LayerBuilder {
    tar: tar::Builder<Vec<u8>>,
}

pub struct Entry<'a> {
    pub path: &'a str,
    pub kind: tar::EntryType,
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    pub data: &'a [u8],
    pub link: Option<&'a str>,
    pub xattrs: &'a [(&'a str, &'a [u8])],
}

impl<'a> Entry<'a> {
    pub fn file(path: &'a str, data: &'a [u8]) -> Self {
        Entry {
            path,
            kind: tar::EntryType::Regular,
            mode: 0o644,
            uid: 0,
            gid: 0,
            data,
            link: None,
            xattrs: &[],
        }
    }
    pub fn dir(path: &'a str) -> Self {
        Entry {
            kind: tar::EntryType::Directory,
            mode: 0o755,
            ..Entry::file(path, b"")
        }
    }
    pub fn symlink(path: &'a str, target: &'a str) -> Self {
        Entry {
            kind: tar::EntryType::Symlink,
            mode: 0o777,
            link: Some(target),
            ..Entry::file(path, b"")
        }
    }
    pub fn hardlink(path: &'a str, target: &'a str) -> Self {
        Entry {
            kind: tar::EntryType::Link,
            link: Some(target),
            ..Entry::file(path, b"")
        }
    }
    pub fn mode(self, mode: u32) -> Self {
        Entry { mode, ..self }
    }
    pub fn owner(self, uid: u64, gid: u64) -> Self {
        Entry { uid, gid, ..self }
    }
}

impl Default for LayerBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl LayerBuilder {
    pub fn new() -> Self {
        LayerBuilder {
            tar: tar::Builder::new(Vec::new()),
        }
    }

    /// Appends `e` with its name written raw into the header (no sanitising: `../` and
    /// absolute names go in as given; names must fit the 100-byte field).
    pub fn add(&mut self, e: Entry<'_>) -> &mut Self {
        if !e.xattrs.is_empty() {
            let pax: Vec<(String, &[u8])> = e
                .xattrs
                .iter()
                .map(|(k, v)| (format!("SCHILY.xattr.{k}"), *v))
                .collect();
            self.tar
                .append_pax_extensions(pax.iter().map(|(k, v)| (k.as_str(), *v)))
                .unwrap();
        }
        let mut h = tar::Header::new_gnu();
        {
            let name = &mut h.as_old_mut().name;
            assert!(e.path.len() < name.len(), "test entry name too long");
            name[..e.path.len()].copy_from_slice(e.path.as_bytes());
        }
        h.set_entry_type(e.kind);
        h.set_mode(e.mode);
        h.set_uid(e.uid);
        h.set_gid(e.gid);
        h.set_mtime(1_700_000_000);
        h.set_size(e.data.len() as u64);
        if let Some(link) = e.link {
            let field = &mut h.as_old_mut().linkname;
            field[..link.len()].copy_from_slice(link.as_bytes());
        }
        h.set_cksum();
        self.tar.append(&h, e.data).unwrap();
        self
    }

    /// The uncompressed tar.
    pub fn tar(self) -> Vec<u8> {
        self.tar.into_inner().unwrap()
    }
}

pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

/// An OCI image layout written blob by blob.
pub struct Layout {
    pub dir: PathBuf,
    index: Vec<serde_json::Value>,
}

impl Layout {
    pub fn new(dir: &Path) -> Layout {
        std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
        std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
        Layout {
            dir: dir.to_path_buf(),
            index: Vec::new(),
        }
    }

    pub fn blob(&self, media_type: &str, bytes: &[u8]) -> serde_json::Value {
        std::fs::write(self.dir.join("blobs/sha256").join(sha256_hex(bytes)), bytes).unwrap();
        serde_json::json!({"mediaType": media_type, "digest": digest(bytes), "size": bytes.len()})
    }

    /// An image of these uncompressed layers (stored gzipped), for `arch`; returns the
    /// manifest's descriptor (platform set).
    pub fn image(
        &self,
        layers: &[Vec<u8>],
        arch: &str,
        config: serde_json::Value,
    ) -> serde_json::Value {
        let diff_ids: Vec<String> = layers.iter().map(|l| digest(l)).collect();
        let mut cfg = serde_json::json!({
            "architecture": arch, "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
            "config": config,
        });
        cfg["created"] = serde_json::json!("2023-11-14T22:13:20Z");
        let config_desc = self.blob(
            "application/vnd.oci.image.config.v1+json",
            &serde_json::to_vec(&cfg).unwrap(),
        );
        let layer_descs: Vec<_> = layers
            .iter()
            .map(|l| self.blob("application/vnd.oci.image.layer.v1.tar+gzip", &gzip(l)))
            .collect();
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config_desc, "layers": layer_descs,
        });
        let mut desc = self.blob(
            "application/vnd.oci.image.manifest.v1+json",
            &serde_json::to_vec(&manifest).unwrap(),
        );
        desc["platform"] = serde_json::json!({"architecture": arch, "os": "linux"});
        desc
    }

    /// An image index over `manifests`; returns its descriptor.
    pub fn index_of(&self, manifests: &[serde_json::Value]) -> serde_json::Value {
        let index = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": manifests,
        });
        self.blob(
            "application/vnd.oci.image.index.v1+json",
            &serde_json::to_vec(&index).unwrap(),
        )
    }

    /// Names `desc` `tag` in index.json (written at once).
    pub fn tag(&mut self, mut desc: serde_json::Value, tag: &str) {
        desc["annotations"] = serde_json::json!({"org.opencontainers.image.ref.name": tag});
        self.index.push(desc);
        let index = serde_json::json!({"schemaVersion": 2, "manifests": self.index});
        std::fs::write(
            self.dir.join("index.json"),
            serde_json::to_vec(&index).unwrap(),
        )
        .unwrap();
    }
}

/// The static agent the images get: `$SANDCELL_AGENT`, or the installed minimal image's.
pub fn agent() -> PathBuf {
    let path = std::env::var_os("SANDCELL_AGENT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("SANDCELL_DATA_DIR")
                .map_or_else(|| PathBuf::from("/var/lib/sandcell"), PathBuf::from)
                .join("images/minimal/rootfs/sbin/sandcell-agent")
        });
    assert!(
        path.is_file(),
        "the static agent is needed at {} (run `make images install`, or set SANDCELL_AGENT)",
        path.display()
    );
    path
}

/// A static busybox for images that must run a shell (Debian's busybox-static).
pub fn busybox() -> Vec<u8> {
    let path = std::env::var("BUSYBOX").unwrap_or_else(|_| "/bin/busybox".into());
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}; apt-get install busybox-static"))
}

/// The layered image most tests use: whiteouts, an opaque directory, hard links (within a
/// layer and across layers), setuid/setgid/sticky modes, owners, an xattr, a file replaced
/// by a directory and a directory by a symlink. Busybox in the first layer for sandboxes.
pub fn layered_image_layers() -> Vec<Vec<u8>> {
    use tar::EntryType as T;
    let busybox = busybox();
    let mut l1 = LayerBuilder::new();
    l1.add(Entry::dir("bin")).add(Entry {
        mode: 0o755,
        ..Entry::file("bin/busybox", &busybox)
    });
    for applet in [
        "sh", "ls", "stat", "cat", "test", "getfattr", "id", "sleep", "echo", "pwd", "env",
    ] {
        let name: &'static str = Box::leak(format!("bin/{applet}").into_boxed_str());
        l1.add(Entry::symlink(name, "busybox"));
    }
    l1.add(Entry::dir("etc"))
        .add(Entry::file(
            "etc/passwd",
            b"root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n",
        ))
        .add(Entry::file("etc/group", b"root:x:0:\nuser:x:1000:\n"))
        .add(Entry::dir("home"))
        .add(Entry::dir("home/user").owner(1000, 1000))
        .add(Entry::dir("data"))
        .add(Entry::file("data/keep", b"kept"))
        .add(Entry::file("data/removed.txt", b"gone soon"))
        .add(Entry::dir("data/gone"))
        .add(Entry::file("data/gone/inner", b"inner"))
        .add(Entry::dir("opq"))
        .add(Entry::file("opq/a", b"a"))
        .add(Entry::dir("opq/b"))
        .add(Entry::file("opq/b/c", b"c"))
        .add(Entry::dir("hl"))
        .add(Entry::file("hl/orig", b"original"))
        .add(Entry::file("swap/was-file", b"a file below"))
        .add(Entry::dir("swap/was-dir"))
        .add(Entry::file("swap/was-dir/x", b"x"));
    let mut l2 = LayerBuilder::new();
    l2.add(Entry {
        kind: T::Regular,
        ..Entry::file("data/.wh.removed.txt", b"")
    })
    .add(Entry::file("data/.wh.gone", b""))
    .add(Entry::file("opq/.wh..wh..opq", b""))
    .add(Entry::file("opq/new", b"new"))
    .add(Entry::hardlink("hl/link", "hl/orig"))
    .add(Entry::file("hl/l2", b"layer two"))
    .add(Entry::hardlink("hl/l2link", "./hl/l2"))
    .add(Entry::dir("suid"))
    .add(Entry {
        mode: 0o4755,
        ..Entry::file("suid/prog", b"#!/bin/sh\nid -u\n")
    })
    .add(Entry::dir("suid/sgid").mode(0o2775).owner(0, 1000))
    .add(Entry::dir("suid/sticky").mode(0o1777))
    .add(Entry::file("owned", b"mine").mode(0o640).owner(1000, 1000))
    .add(Entry {
        xattrs: &[("user.sandcell", b"hello")],
        ..Entry::file("xattr", b"x")
    })
    .add(Entry::dir("swap/was-file"))
    .add(Entry::symlink("swap/was-dir", "../data"));
    vec![l1.tar(), l2.tar()]
}

/// The config the layered image carries (Env, WorkingDir, User, Entrypoint, Cmd).
pub fn layered_image_config() -> serde_json::Value {
    serde_json::json!({
        "Env": ["PATH=/bin", "GREETING=hello from the image"],
        "WorkingDir": "/data",
        "User": "user",
        "Entrypoint": ["/bin/sh", "-c"],
        "Cmd": ["echo hi"],
    })
}
