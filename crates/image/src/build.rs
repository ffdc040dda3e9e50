//! A [`ResolvedImage`] to a Sandcell image directory: layers unpacked in order, the agent
//! added, `mkfs.ext4 -d` of the tree, `config.json` beside them, all built in a hidden
//! directory next to the final one and renamed into place.

use crate::cache::{BlobCache, unique};
use crate::progress::{Event, Progress};
use crate::spec::ResolvedImage;
use crate::store;
use crate::unpack::Unpacker;
use crate::{Error, IMAGE_CONFIG_FILE, Limits, Result, valid_name};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the runtimes start the agent (crates/runtime `AGENT_PATH`).
pub const AGENT_PATH: &str = "/sbin/sandcell-agent";
/// The directories the agent mounts over or writes to at boot, made when an image lacks
/// them (mode).
const MOUNT_POINTS: &[(&str, u32)] = &[
    ("/dev", 0o755),
    ("/proc", 0o555),
    ("/sys", 0o555),
    ("/tmp", 0o1777),
    ("/run", 0o755),
    ("/etc", 0o755),
    ("/root", 0o700),
];

#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub data_dir: PathBuf,
    pub name: String,
    /// The static agent binary; `None`: the one in an installed image ([`store::find_agent`]).
    pub agent: Option<PathBuf>,
    /// Replace an existing image of that name (refused while sandboxes use it).
    pub force: bool,
    pub limits: Limits,
}

#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildReport {
    pub name: String,
    pub dir: PathBuf,
    pub manifest_digest: String,
    pub layers: usize,
    pub entries: u64,
    /// Bytes of all uncompressed layer streams.
    pub tar_bytes: u64,
    pub ext4_bytes: u64,
    /// Time spent applying the layers (and adding the agent), and in mkfs.ext4.
    pub unpack_seconds: f64,
    pub mkfs_seconds: f64,
    /// What could not be reproduced exactly (device nodes or privileged xattrs without root).
    pub notes: Vec<String>,
}

/// Builds `image` as `<data-dir>/images/<name>/`. Blocking (file system work): run it on a
/// blocking thread.
pub fn build(
    image: &ResolvedImage,
    options: &BuildOptions,
    progress: &dyn Progress,
) -> Result<BuildReport> {
    if !valid_name(&options.name) {
        return Err(Error::InvalidName(options.name.clone()));
    }
    let images = options.data_dir.join("images");
    let dest = images.join(&options.name);
    if dest.exists() && !options.force {
        return Err(Error::Exists(options.name.clone()));
    }
    let agent = match &options.agent {
        Some(path) => path.clone(),
        None => store::find_agent(&options.data_dir)?,
    };
    check_agent(&agent)?;
    std::fs::create_dir_all(&images).map_err(Error::io("creating", &images))?;
    let work = images.join(format!(
        ".build-{}-{}-{}",
        options.name,
        std::process::id(),
        unique()
    ));
    let result = build_in(image, options, &agent, &work, progress);
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&work);
            return Err(e);
        }
    };
    if let Err(e) = store::replace(&images, &options.name, &work) {
        let _ = std::fs::remove_dir_all(&work);
        return Err(e);
    }
    Ok(BuildReport {
        dir: dest,
        ..report
    })
}

fn build_in(
    image: &ResolvedImage,
    options: &BuildOptions,
    agent: &Path,
    work: &Path,
    progress: &dyn Progress,
) -> Result<BuildReport> {
    let cache = BlobCache::in_data_dir(&options.data_dir);
    let tree = work.join("rootfs");
    let unpack_started = std::time::Instant::now();
    let mut unpacker = Unpacker::new(&tree, options.limits)?;
    let (mut entries, mut tar_bytes) = (0, 0);
    for (index, layer) in image.layers.iter().enumerate() {
        progress.event(Event::Unpacking {
            index,
            total: image.layers.len(),
            digest: layer.digest.to_string(),
        });
        let blob = cache.open(&layer.digest)?;
        let stats = unpacker.apply_layer(blob, layer.digest.short(), layer.diff_id.as_ref())?;
        entries += stats.entries;
        tar_bytes += stats.tar_bytes;
    }
    add_sandcell_files(&mut unpacker, agent)?;
    unpacker.finish()?;

    let mut defaults = image.config.defaults();
    defaults.source = Some(image.source.clone());
    defaults.manifest_digest = Some(image.manifest_digest.to_string());
    let json = serde_json::to_vec_pretty(&defaults).map_err(|e| Error::Manifest {
        what: IMAGE_CONFIG_FILE.into(),
        problem: e.to_string(),
    })?;
    let config_path = work.join(IMAGE_CONFIG_FILE);
    std::fs::write(&config_path, json).map_err(Error::io("writing", &config_path))?;

    let unpack_seconds = unpack_started.elapsed().as_secs_f64();
    let mkfs_started = std::time::Instant::now();
    let ext4 = work.join("rootfs.ext4");
    make_ext4(&tree, &ext4, &options.name, unpacker.owners(), progress)?;
    let mkfs_seconds = mkfs_started.elapsed().as_secs_f64();
    let ext4_bytes = std::fs::metadata(&ext4)
        .map_err(Error::io("looking at", &ext4))?
        .len();
    Ok(BuildReport {
        name: options.name.clone(),
        dir: work.to_path_buf(),
        manifest_digest: image.manifest_digest.to_string(),
        layers: image.layers.len(),
        entries,
        tar_bytes,
        ext4_bytes,
        unpack_seconds,
        mkfs_seconds,
        notes: unpacker.notes().to_vec(),
    })
}

/// What every Sandcell image needs beside its own files: the mount points the agent uses
/// and the agent itself.
pub(crate) fn add_sandcell_files(unpacker: &mut Unpacker, agent: &Path) -> Result<()> {
    for (dir, mode) in MOUNT_POINTS {
        unpacker.ensure_dir(dir, *mode)?;
    }
    unpacker.install_file(AGENT_PATH, agent, 0o755)
}

/// The agent must be a static ELF: it runs in images that have no (or another) libc.
pub(crate) fn check_agent(path: &Path) -> Result<()> {
    let fail = |problem: String| Error::Agent {
        path: path.to_path_buf(),
        problem,
    };
    let bytes = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
    if bytes.get(..4) != Some(b"\x7fELF") {
        return Err(fail("not an ELF binary".into()));
    }
    if has_interpreter(&bytes).ok_or_else(|| fail("not a valid 64-bit ELF".into()))? {
        return Err(fail(
            "dynamically linked (it has PT_INTERP); the agent must be static (+crt-static)".into(),
        ));
    }
    Ok(())
}

/// Whether a 64-bit little-endian ELF names a program interpreter; `None` if malformed.
fn has_interpreter(elf: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    let u16_at = |o: usize| Some(u16::from_le_bytes(elf.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(elf.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(elf.get(o..o + 8)?.try_into().ok()?));
    if elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        return None; // not ELFCLASS64 / ELFDATA2LSB
    }
    let phoff = usize::try_from(u64_at(0x20)?).ok()?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    for i in 0..phnum {
        if u32_at(phoff.checked_add(i.checked_mul(phentsize)?)?)? == PT_INTERP {
            return Some(true);
        }
    }
    Some(false)
}

/// Blocks in use under `tree` and the number of inodes.
fn usage(tree: &Path) -> Result<(u64, u64)> {
    let (mut bytes, mut inodes) = (0u64, 0u64);
    let mut stack = vec![tree.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for child in std::fs::read_dir(&dir).map_err(Error::io("listing", &dir))? {
            let child = child.map_err(Error::io("listing", &dir))?;
            let meta = child
                .metadata()
                .map_err(Error::io("looking at", child.path()))?;
            bytes += meta.blocks() * 512;
            inodes += 1;
            if meta.is_dir() {
                stack.push(child.path());
            }
        }
    }
    Ok((bytes, inodes))
}

/// `mkfs.ext4 -d`: content plus a tenth and 64 MiB of headroom (journal, metadata, a little
/// room to write), inodes for every file plus slack. No root, no mount. Owners the host tree
/// could not carry (unprivileged builds) are then set with debugfs.
pub(crate) fn make_ext4(
    tree: &Path,
    ext4: &Path,
    name: &str,
    owners: &std::collections::BTreeMap<PathBuf, (u32, u32)>,
    progress: &dyn Progress,
) -> Result<()> {
    const MIB: u64 = 1 << 20;
    let (bytes, inodes) = usage(tree)?;
    let size_mib = (bytes + bytes / 10).div_ceil(MIB) + 64;
    let inodes = inodes + inodes / 10 + 4096;
    progress.event(Event::Mkfs { size_mib });
    let label: String = name.chars().take(16).collect();
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-t", "ext4", "-m", "0", "-E", "root_owner=0:0"])
        .arg("-N")
        .arg(inodes.to_string())
        .arg("-L")
        .arg(&label)
        .arg("-d")
        .arg(tree)
        .arg(ext4)
        .arg(format!("{size_mib}M"))
        .output()
        .map_err(|e| Error::Tool {
            tool: "mkfs.ext4",
            problem: format!("cannot run it ({e}); install e2fsprogs >= 1.43 (-d)"),
        })?;
    if !out.status.success() {
        return Err(Error::Tool {
            tool: "mkfs.ext4",
            problem: format!(
                "{} on {}: {}",
                out.status,
                ext4.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    if owners.is_empty() {
        return Ok(());
    }
    let mut cmds = String::new();
    for (rel, (uid, gid)) in owners {
        let path = format!("/{}", rel.display());
        if path.contains(['"', '\n']) {
            continue;
        }
        cmds.push_str(&format!(
            "sif \"{path}\" uid {uid}\nsif \"{path}\" gid {gid}\n"
        ));
    }
    let cmd_file = ext4.with_extension("debugfs");
    std::fs::write(&cmd_file, cmds).map_err(Error::io("writing", &cmd_file))?;
    let out = Command::new("debugfs")
        .arg("-w")
        .arg("-f")
        .arg(&cmd_file)
        .arg(ext4)
        .output()
        .map_err(|e| Error::Tool {
            tool: "debugfs",
            problem: format!("cannot run it ({e}); install e2fsprogs"),
        })?;
    let _ = std::fs::remove_file(&cmd_file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success()
        || stderr
            .lines()
            .any(|l| l.contains("not found") || l.contains("rror"))
    {
        return Err(Error::Tool {
            tool: "debugfs",
            problem: format!("setting owners in {}: {}", ext4.display(), stderr.trim()),
        });
    }
    Ok(())
}
