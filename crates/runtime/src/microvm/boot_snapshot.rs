//! Templates are snapshots: the first create from an (image, kernel, memory, vCPUs, with
//! or without a network) boots a template VM once, waits for its agent and saves a full
//! snapshot of it ([`super::sandbox`]'s pause to disk: memory, state and the disk's
//! frozen layers, self-contained). Later creates restore that snapshot into a VMM of the
//! [`super::warm_pool`] with their own empty disk top, and the caller's `/init` gives each
//! its identity, clock and fresh RNG entropy.
//!
//! A networked template VM boots in a network of its own with no egress, torn down with
//! it: its snapshot has a net device. A networked create restores it with its own network's
//! TAP, which the daemon attaches in the sandbox's namespace and passes to the pooled VMM
//! (that VMM started outside any sandbox's namespace), then readdresses the guest.
//!
//! Snapshots live in `<data-dir>/template-snapshots/<key>/`, `<key>` a hash of what the
//! snapshot depends on (the paths, sizes and modification times of the image's
//! rootfs.ext4, of the kernel and of the VMM binary, memory and vCPUs), so a rebuilt image
//! or kernel makes a new one. A `ready` file marks a finished snapshot: a directory without
//! it is a build that died and is redone. Concurrent first uses in one process make one
//! snapshot (a lock per key); two daemons on one data dir are not supported anyway.

use super::{MicrovmRuntime, RT};
use crate::snapshot::SnapshotHandle;
use crate::util::remove_dir_all_if_exists;
use crate::{Dirs, Error, Result, Runtime, SandboxSpec};
use sandcell_proto::sync::lock;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const DIR: &str = "template-snapshots";
const READY: &str = "ready";

/// What a template snapshot is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TemplateKey {
    pub(super) rootfs: PathBuf,
    pub(super) kernel: PathBuf,
    pub(super) vmm: PathBuf,
    pub(super) memory_mib: u32,
    pub(super) vcpus: u8,
    /// The template VM has a net device (for networked creates).
    pub(super) network: bool,
}

impl TemplateKey {
    /// The key's directory name: 16 hex digits of a stable hash (FNV-1a) of the inputs and
    /// of their files' sizes and modification times. Err: a file cannot be read.
    pub(super) fn digest(&self) -> std::io::Result<String> {
        let mut text = format!("v1 mem={} vcpus={}", self.memory_mib, self.vcpus);
        // Appended only when set: the keys (and snapshots) of templates without a network
        // stay what they were.
        if self.network {
            text.push_str(" net");
        }
        for path in [&self.rootfs, &self.kernel, &self.vmm] {
            let meta = std::fs::metadata(path)?;
            let mtime = meta
                .modified()?
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            text.push_str(&format!(
                "\n{} {} {}",
                path.display(),
                meta.len(),
                mtime.as_nanos()
            ));
        }
        Ok(format!("{:016x}", fnv1a(text.as_bytes())))
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The template snapshots of one runtime.
pub(super) struct TemplateSnapshots {
    dirs: Dirs,
    vmm: PathBuf,
    /// The template VMs boot jailed when every VMM is (they run the template's image).
    jail: Option<super::jail::JailPolicy>,
    /// One lock per key: the first use builds, the others wait for it.
    building: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl TemplateSnapshots {
    pub(super) fn new(
        dirs: &Dirs,
        vmm: &Path,
        jail: Option<super::jail::JailPolicy>,
    ) -> TemplateSnapshots {
        TemplateSnapshots {
            dirs: dirs.clone(),
            vmm: vmm.to_path_buf(),
            jail,
            building: Mutex::new(HashMap::new()),
        }
    }

    fn dir_of(&self, digest: &str) -> PathBuf {
        self.dirs.data.join(DIR).join(digest)
    }

    /// The snapshot for `key`, built now if there is none (`image` and `boot_timeout` are
    /// the template VM's, `network` its network's settings when `key.network`). Returns it
    /// and whether it was built by this call.
    pub(super) async fn get_or_build(
        &self,
        key: &TemplateKey,
        image: &crate::Image,
        network: Option<&sandcell_net::NetConfig>,
        boot_timeout: Duration,
    ) -> Result<(SnapshotHandle, bool)> {
        let digest = key.digest().map_err(|e| {
            Error::io(
                RT,
                format!("reading the template files of {}", key.rootfs.display()),
                e,
            )
        })?;
        let lock = lock(&self.building)
            .entry(digest.clone())
            .or_default()
            .clone();
        let _held = lock.lock().await;
        let dir = self.dir_of(&digest);
        if dir.join(READY).is_file() {
            return Ok((SnapshotHandle::load(&dir)?, false));
        }
        remove_dir_all_if_exists(&dir)
            .map_err(|e| Error::io(RT, format!("removing {}", dir.display()), e))?;
        let handle = self
            .build(&digest, &dir, key, image, network, boot_timeout)
            .await?;
        let ready = dir.join(READY);
        std::fs::write(&ready, b"")
            .map_err(|e| Error::io(RT, format!("writing {}", ready.display()), e))?;
        Ok((handle, true))
    }

    /// Boots the template VM (no env; a network with no egress when the key has one),
    /// waits for its agent, pauses it to disk into `dir` (which ends the VM; its network
    /// goes with its destroy).
    async fn build(
        &self,
        digest: &str,
        dir: &Path,
        key: &TemplateKey,
        image: &crate::Image,
        network: Option<&sandcell_net::NetConfig>,
        boot_timeout: Duration,
    ) -> Result<SnapshotHandle> {
        let network = match (key.network, network) {
            (false, _) => None,
            (true, Some(config)) => Some(crate::NetworkSpec {
                egress: sandcell_net::EgressSpec {
                    allow_internet_access: false,
                    allow_out: Vec::new(),
                    deny_out: Vec::new(),
                    rules: Default::default(),
                },
                config: config.clone(),
            }),
            (true, None) => {
                return Err(Error::InvalidSpec {
                    runtime: RT,
                    problem: "a networked template snapshot needs the network's settings".into(),
                });
            }
        };
        // A registry of their own (slots are claimed host-wide, so it shares no address).
        let cold = MicrovmRuntime {
            dirs: self.dirs.clone(),
            vmm: self.vmm.clone(),
            nets: sandcell_net::NetRegistry::new(),
            templates: None,
            jail: self.jail,
        };
        let mut spec = SandboxSpec::new(
            format!("tpl-{digest}-{}", std::process::id()),
            image.clone(),
        );
        spec.kernel = Some(key.kernel.clone());
        spec.memory_mib = key.memory_mib;
        spec.vcpus = key.vcpus;
        spec.boot_timeout = boot_timeout;
        spec.network = network;
        let sandbox = cold.create(spec).await?;
        let made = async {
            sandbox.start().await?;
            sandbox.pause_to_disk(dir).await
        }
        .await;
        // A pause to disk ends the VM and destroys the sandbox, its network with it.
        if made.is_err() {
            let _ = sandbox.destroy().await;
            let _ = remove_dir_all_if_exists(dir);
        }
        made
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(dir: &Path) -> TemplateKey {
        for f in ["rootfs.ext4", "vmlinux", "sandcell-vmm"] {
            std::fs::write(dir.join(f), f).unwrap();
        }
        TemplateKey {
            rootfs: dir.join("rootfs.ext4"),
            kernel: dir.join("vmlinux"),
            vmm: dir.join("sandcell-vmm"),
            memory_mib: 256,
            vcpus: 1,
            network: false,
        }
    }

    #[test]
    fn the_key_changes_with_the_image_and_the_shape_only() {
        let tmp = tempfile::tempdir().unwrap();
        let k = key(tmp.path());
        let d = k.digest().unwrap();
        assert_eq!(d.len(), 16);
        assert_eq!(k.digest().unwrap(), d, "stable");
        let mut other = k.clone();
        other.memory_mib = 512;
        assert_ne!(other.digest().unwrap(), d);
        let mut other = k.clone();
        other.vcpus = 2;
        assert_ne!(other.digest().unwrap(), d);
        let mut other = k.clone();
        other.network = true;
        assert_ne!(
            other.digest().unwrap(),
            d,
            "a networked template is another"
        );
        // A rebuilt rootfs (another size) is another template.
        std::fs::write(&k.rootfs, "rebuilt rootfs").unwrap();
        assert_ne!(k.digest().unwrap(), d);
        // A missing kernel is an error, not a key.
        std::fs::remove_file(&k.kernel).unwrap();
        assert!(k.digest().is_err());
    }

    #[tokio::test]
    async fn a_ready_snapshot_is_loaded_and_an_unfinished_one_is_not() {
        let tmp = tempfile::tempdir().unwrap();
        let k = key(tmp.path());
        let dirs = Dirs::new(tmp.path().join("data"), tmp.path().join("run"));
        let store = TemplateSnapshots::new(&dirs, &k.vmm, None);
        let dir = store.dir_of(&k.digest().unwrap());
        std::fs::create_dir_all(&dir).unwrap();
        // Marked ready but without a manifest: loading refuses it (not a silent cold boot).
        std::fs::write(dir.join(READY), b"").unwrap();
        let image = crate::Image {
            name: "t".into(),
            rootfs_dir: None,
            rootfs_ext4: Some(k.rootfs.clone()),
        };
        let err = store
            .get_or_build(&k, &image, None, Duration::from_secs(1))
            .await
            .err()
            .unwrap();
        assert!(err.to_string().contains("snapshot.json"), "{err}");
    }

    #[tokio::test]
    async fn concurrent_first_uses_share_one_lock_per_key() {
        let tmp = tempfile::tempdir().unwrap();
        let k = key(tmp.path());
        let dirs = Dirs::new(tmp.path().join("data"), tmp.path().join("run"));
        let store = Arc::new(TemplateSnapshots::new(&dirs, &k.vmm, None));
        let digest = k.digest().unwrap();
        let lock_of = |s: &TemplateSnapshots| {
            s.building
                .lock()
                .unwrap()
                .entry(digest.clone())
                .or_default()
                .clone()
        };
        let (a, b) = (lock_of(&store), lock_of(&store));
        assert!(Arc::ptr_eq(&a, &b));
        let held = a.lock().await;
        assert!(
            b.try_lock().is_err(),
            "a second first use waits for the build"
        );
        drop(held);
        assert!(b.try_lock().is_ok());
    }
}
