//! Applies OCI layers (gzip, zstd or plain tar: the bytes decide), in order, to a root tree
//! on the host.
//!
//! Semantics (the OCI image spec's "Applying changesets", as Docker and containerd do them):
//! - `.wh.NAME` removes NAME (from the layers below; not from its own layer); the whiteout
//!   itself never appears. `.wh..wh..opq` empties its directory of what the layers below put
//!   there. Other `.wh..wh.*` names (aufs bookkeeping) are ignored.
//! - An entry replaces whatever is at its path, except that a directory over a directory is
//!   kept (its metadata updated).
//! - Owners, modes (setuid/setgid/sticky included), mtimes, xattrs (PAX `SCHILY.xattr.*`)
//!   and hard links are kept. Without root, owners and privileged xattrs cannot be set on the
//!   host: owners are then recorded ([`Unpacker::owners`]) for the ext4 image, and what
//!   could not be made is listed in [`Unpacker::notes`].
//!
//! Host safety (the tree is on the host, written as root, from an image anyone may push):
//! - Character and block device nodes are never made ([`Unpacker::notes`] says which): a
//!   sandbox gets its `/dev` from the runtime, and a node on the host (`/dev/sda`'s numbers
//!   under a layer dir) is a door to the host's devices for whoever reaches it.
//! - `trusted.*` xattrs (overlayfs's own metadata: `trusted.overlay.redirect`, `.opaque`,
//!   `.metacopy`, which the host's overlayfs would obey when the layer is a lower of a
//!   build step's mount) and `security.*` ones but `security.capability` (SELinux labels,
//!   IMA/EVM: the host's policy, not the image's) are left out.
//! - setuid/setgid bits and `security.capability` are kept: images need them (`sudo`,
//!   `passwd`, `ping`), and they only take effect inside the sandbox. On the host they must
//!   not be reachable by other users: the directories above the trees (`images/`,
//!   `cache/`) are made root-only ([`restrict_dir`]); the tree's own `/` keeps the image's
//!   mode, which the sandbox sees.
//!
//! Safety: entry paths are relative and without `..` ([`Error::UnsafePath`] otherwise).
//! Every directory on the way is resolved by us, inside the root: a symlink on the way is
//! followed as the image would see it (an absolute target starts again at the image's
//! root), and one that leads above the root is refused. The last component is never
//! followed (files are created with `O_EXCL|O_NOFOLLOW`, old ones unlinked first). Sizes
//! are bounded by [`Limits`]: the uncompressed stream is counted as it is read, whatever
//! the headers say, so a decompression bomb stops at the limit.

use crate::digest::{Digest, HashingReader, is_over_limit};
use crate::{Error, Limits, Result};
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::ffi::{CString, OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Symlinks followed while resolving one entry's directories (Linux's own limit).
const MAX_SYMLINK_HOPS: u32 = 40;
/// Longest entry path accepted (Linux PATH_MAX).
const MAX_PATH_BYTES: usize = 4096;
const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_MARKER: &str = ".wh..wh..opq";
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// What one layer did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LayerStats {
    pub entries: u64,
    pub whiteouts: u64,
    /// Bytes of the uncompressed tar stream.
    pub tar_bytes: u64,
}

/// Directory metadata applied at the end: a directory's mode may forbid writing into it
/// and its mtime moves as entries land in it.
#[derive(Debug, Clone, Copy)]
struct DirMeta {
    mode: u32,
    mtime: i64,
}

/// The metadata of one entry, PAX overrides applied.
struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: i64,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

pub struct Unpacker {
    root: PathBuf,
    limits: Limits,
    privileged: bool,
    entries: u64,
    image_bytes: u64,
    dirs: BTreeMap<PathBuf, DirMeta>,
    owners: BTreeMap<PathBuf, (u32, u32)>,
    notes: Vec<String>,
}

/// Per-layer state: what this layer made (whiteouts and opaque markers spare it).
struct LayerCtx<'a> {
    name: &'a str,
    created: HashSet<PathBuf>,
    stats: LayerStats,
}

/// The entry being applied, for its errors: its layer and its path as the tar has it.
struct EntryAt<'a> {
    layer: &'a str,
    shown: String,
}

impl EntryAt<'_> {
    fn bad(&self, problem: String) -> Error {
        Error::BadEntry {
            layer: self.layer.into(),
            path: self.shown.clone(),
            problem,
        }
    }

    fn unsafe_path(&self, problem: &'static str) -> Error {
        Error::UnsafePath {
            layer: self.layer.into(),
            path: self.shown.clone(),
            problem,
        }
    }
}

impl Unpacker {
    /// Unpacks into `root` (created if missing; normally empty).
    pub fn new(root: &Path, limits: Limits) -> Result<Unpacker> {
        fs::create_dir_all(root).map_err(Error::io("creating the root tree", root))?;
        let root = fs::canonicalize(root).map_err(Error::io("resolving the root tree", root))?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let privileged = unsafe { libc::geteuid() } == 0;
        Ok(Unpacker {
            root,
            limits,
            privileged,
            entries: 0,
            image_bytes: 0,
            dirs: BTreeMap::new(),
            owners: BTreeMap::new(),
            notes: Vec::new(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Owners that could not be set on the host (unprivileged run), by path relative to
    /// the root: the ext4 image gets them afterwards.
    pub fn owners(&self) -> &BTreeMap<PathBuf, (u32, u32)> {
        &self.owners
    }

    /// Things left out (device nodes, privileged xattrs without root), for the report.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Applies one layer blob (gzip, zstd or plain tar; the bytes decide). `diff_id`, when
    /// given, must be the digest of the uncompressed tar.
    pub fn apply_layer(
        &mut self,
        blob: impl Read,
        name: &str,
        diff_id: Option<&Digest>,
    ) -> Result<LayerStats> {
        let mut buffered = BufReader::with_capacity(256 * 1024, blob);
        let magic = buffered
            .fill_buf()
            .map_err(|e| self.read_error(name, e))?
            .get(..4)
            .map(<[u8]>::to_vec)
            .unwrap_or_default();
        let stream: Box<dyn Read> = if magic.starts_with(&[0x1f, 0x8b]) {
            Box::new(flate2::read::MultiGzDecoder::new(buffered))
        } else if magic == ZSTD_MAGIC {
            Box::new(ZstdFrames::Between(buffered))
        } else {
            Box::new(buffered)
        };
        let budget = self
            .limits
            .max_layer_bytes
            .min(self.limits.max_image_bytes.saturating_sub(self.image_bytes));
        let mut counted = HashingReader::new(stream, budget);
        let mut ctx = LayerCtx {
            name,
            created: HashSet::new(),
            stats: LayerStats::default(),
        };
        {
            let mut archive = tar::Archive::new(&mut counted);
            let entries = archive.entries().map_err(|e| self.read_error(name, e))?;
            for entry in entries {
                let entry = entry.map_err(|e| self.read_error(name, e))?;
                self.apply_entry(entry, &mut ctx)?;
            }
        }
        // The tar's end blocks and padding belong to the stream the diff_id covers.
        let (actual, bytes) = counted.finish().map_err(|e| self.read_error(name, e))?;
        self.image_bytes += bytes;
        ctx.stats.tar_bytes = bytes;
        if let Some(expected) = diff_id {
            expected.verify(
                &actual,
                format!("layer {name} (uncompressed, the config's diff_id)"),
            )?;
        }
        Ok(ctx.stats)
    }

    /// Sets the directories' modes and mtimes, deepest first. Call once, after the last
    /// layer and anything else added to the tree.
    pub fn finish(&mut self) -> Result<()> {
        for (rel, meta) in std::mem::take(&mut self.dirs).iter().rev() {
            let host = self.root.join(rel);
            match fs::symlink_metadata(&host) {
                Ok(m) if m.is_dir() => {}
                _ => continue,
            }
            fs::set_permissions(&host, fs::Permissions::from_mode(meta.mode))
                .map_err(Error::io("setting the mode of", &host))?;
            set_mtime_nofollow(&host, meta.mtime)
                .map_err(Error::io("setting the mtime of", &host))?;
        }
        Ok(())
    }

    /// Puts a root-owned copy of `from` at `path` (an absolute path inside the image, its
    /// directories resolved like a layer entry's), replacing what is there.
    pub fn install_file(&mut self, path: &str, from: &Path, mode: u32) -> Result<()> {
        let (parent, name) = self.split_inside(path)?;
        let rel = parent.join(&name);
        self.remove_existing(&rel)?;
        let host = self.root.join(&rel);
        let mut src = File::open(from).map_err(Error::io("opening", from))?;
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&host)
            .map_err(Error::io("creating file", &host))?;
        io::copy(&mut src, &mut file).map_err(Error::io("copying into", &host))?;
        self.set_root_owner(&rel)?;
        file.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(Error::io("setting the mode of", &host))
    }

    /// Makes the directory `path` (absolute inside the image) with `mode` if nothing is
    /// there; an existing directory or symlink is left alone.
    pub fn ensure_dir(&mut self, path: &str, mode: u32) -> Result<()> {
        let (parent, name) = self.split_inside(path)?;
        let rel = parent.join(&name);
        let host = self.root.join(&rel);
        if fs::symlink_metadata(&host).is_ok() {
            return Ok(());
        }
        fs::create_dir(&host).map_err(Error::io("creating directory", &host))?;
        self.set_root_owner(&rel)?;
        self.dirs.insert(rel, DirMeta { mode, mtime: 0 });
        Ok(())
    }

    fn split_inside(&self, path: &str) -> Result<(PathBuf, OsString)> {
        let mut components =
            normalize(path.trim_start_matches('/').as_bytes()).map_err(|problem| {
                Error::UnsafePath {
                    layer: "sandcell".into(),
                    path: path.into(),
                    problem,
                }
            })?;
        let name = components.pop().ok_or_else(|| Error::UnsafePath {
            layer: "sandcell".into(),
            path: path.into(),
            problem: "the root itself",
        })?;
        let parent = self
            .resolve_dir(&components, true, "sandcell", path)?
            .unwrap_or_default();
        Ok((parent, name))
    }

    fn set_root_owner(&mut self, rel: &Path) -> Result<()> {
        let host = self.root.join(rel);
        if self.privileged {
            std::os::unix::fs::lchown(&host, Some(0), Some(0))
                .map_err(Error::io("setting the owner of", &host))
        } else {
            self.owners.insert(rel.to_path_buf(), (0, 0));
            Ok(())
        }
    }

    /// An I/O error while reading a layer: over the byte budget it is [`Error::TooLarge`].
    fn read_error(&self, layer: &str, e: io::Error) -> Error {
        if is_over_limit(&e) {
            return Error::TooLarge {
                layer: layer.into(),
                what: "the uncompressed layer (or the image's total)".into(),
                limit: self.limits.max_layer_bytes.min(self.limits.max_image_bytes),
                unit: "bytes",
            };
        }
        Error::BadEntry {
            layer: layer.into(),
            path: String::new(),
            problem: format!("reading the layer: {e}"),
        }
    }

    /// Applies one tar entry of a layer: checks its path and limits, then a whiteout
    /// removes, anything else is created (replacing what an earlier layer had there).
    fn apply_entry<R: Read>(
        &mut self,
        mut entry: tar::Entry<'_, R>,
        ctx: &mut LayerCtx<'_>,
    ) -> Result<()> {
        let raw_path = entry.path_bytes().into_owned();
        let at = EntryAt {
            layer: ctx.name,
            shown: String::from_utf8_lossy(&raw_path).into_owned(),
        };
        self.count_entry(ctx)?;
        let mut components = normalize(&raw_path).map_err(|p| at.unsafe_path(p))?;
        let header = entry.header();
        let kind = header.entry_type();
        let size = header.size().unwrap_or(0);
        let device = (
            header.device_major().ok().flatten().unwrap_or(0),
            header.device_minor().ok().flatten().unwrap_or(0),
        );
        if size > self.limits.max_file_bytes {
            return Err(Error::TooLarge {
                layer: at.layer.into(),
                what: format!("file {:?}", at.shown),
                limit: self.limits.max_file_bytes,
                unit: "bytes",
            });
        }
        let meta =
            entry_meta(&mut entry).map_err(|e| at.bad(format!("reading its header: {e}")))?;

        let Some(name) = components.pop() else {
            // "./": the root directory itself.
            if kind.is_dir() {
                self.dirs.insert(
                    PathBuf::new(),
                    DirMeta {
                        mode: meta.mode,
                        mtime: meta.mtime,
                    },
                );
                self.set_owner_and_xattrs(Path::new(""), &meta, ctx)?;
                return Ok(());
            }
            return Err(at.bad("the root can only be a directory".into()));
        };

        // Whiteouts: never created, they remove.
        let name_str = name.to_string_lossy();
        if let Some(target) = name_str.strip_prefix(WHITEOUT_PREFIX) {
            return self.apply_whiteout(&components, &name_str, target, ctx, &at);
        }

        let parent = self
            .resolve_dir(&components, true, at.layer, &at.shown)?
            .ok_or_else(|| at.bad("its directory could not be made".into()))?;
        let rel = parent.join(&name);
        let host = self.root.join(&rel);
        ctx.created.insert(rel.clone());

        use tar::EntryType as T;
        match kind {
            T::Directory => self.create_dir(&rel, &host, &meta, ctx),
            T::Regular | T::Continuous | T::GNUSparse => {
                self.create_file(&mut entry, &rel, &host, &meta, ctx, &at)
            }
            T::Symlink => self.create_symlink(&entry, &rel, &host, &meta, ctx, &at),
            T::Link => self.create_hard_link(&entry, &rel, &host, &at),
            // Never on the host (see the module's doc): what was there is still replaced.
            T::Char | T::Block => {
                self.remove_existing(&rel)?;
                self.notes.push(format!(
                    "{}: device node {}:{} skipped (the sandbox's /dev comes from the runtime)",
                    at.shown, device.0, device.1
                ));
                Ok(())
            }
            T::Fifo => {
                let node = (libc::S_IFIFO, libc::makedev(device.0, device.1));
                self.create_device(node, &rel, &host, &meta, ctx, &at)
            }
            // PAX and GNU long-name headers are consumed by the tar reader; anything else
            // has no meaning in a root filesystem.
            other => Err(at.bad(format!("unsupported entry type {other:?}"))),
        }
    }

    /// Counts an entry against the image's entry limit.
    fn count_entry(&mut self, ctx: &mut LayerCtx<'_>) -> Result<()> {
        self.entries += 1;
        ctx.stats.entries += 1;
        if self.entries > self.limits.max_entries {
            return Err(Error::TooLarge {
                layer: ctx.name.into(),
                what: "the number of entries".into(),
                limit: self.limits.max_entries,
                unit: "entries",
            });
        }
        Ok(())
    }

    /// A whiteout `name` (`.wh.<target>`) in directory `components`: removes what earlier
    /// layers have there (`.wh..wh..opq`: all of the directory's content).
    fn apply_whiteout(
        &mut self,
        components: &[OsString],
        name: &str,
        target: &str,
        ctx: &mut LayerCtx<'_>,
        at: &EntryAt<'_>,
    ) -> Result<()> {
        ctx.stats.whiteouts += 1;
        let Some(parent) = self.resolve_dir(components, false, at.layer, &at.shown)? else {
            return Ok(()); // nothing below to hide
        };
        if name == OPAQUE_MARKER {
            return self.make_opaque(&parent, ctx);
        }
        if target.starts_with(WHITEOUT_PREFIX) {
            return Ok(()); // aufs metadata (.wh..wh.plnk and such)
        }
        if target.is_empty() || target == "." || target == ".." {
            return Err(at.unsafe_path("a whiteout of no name, '.' or '..'"));
        }
        let rel = parent.join(target);
        if !ctx.created.contains(&rel) {
            self.remove_existing(&rel)?;
        }
        Ok(())
    }

    fn create_dir(
        &mut self,
        rel: &Path,
        host: &Path,
        meta: &Meta,
        ctx: &LayerCtx<'_>,
    ) -> Result<()> {
        let existing = fs::symlink_metadata(host);
        if !matches!(existing, Ok(ref m) if m.is_dir()) {
            self.remove_existing(rel)?;
            fs::create_dir(host).map_err(Error::io("creating directory", host))?;
        }
        self.dirs.insert(
            rel.to_path_buf(),
            DirMeta {
                mode: meta.mode,
                mtime: meta.mtime,
            },
        );
        self.set_owner_and_xattrs(rel, meta, ctx)
    }

    fn create_file<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        rel: &Path,
        host: &Path,
        meta: &Meta,
        ctx: &LayerCtx<'_>,
        at: &EntryAt<'_>,
    ) -> Result<()> {
        self.remove_existing(rel)?;
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(host)
            .map_err(Error::io("creating file", host))?;
        io::copy(entry, &mut file).map_err(|e| {
            if is_over_limit(&e) {
                self.read_error(at.layer, e)
            } else {
                at.bad(format!("writing {}: {e}", host.display()))
            }
        })?;
        // Owner first: chown clears setuid/setgid, so the mode comes after it.
        self.set_owner_and_xattrs(rel, meta, ctx)?;
        file.set_permissions(fs::Permissions::from_mode(meta.mode))
            .map_err(Error::io("setting the mode of", host))?;
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(meta.mtime.max(0) as u64);
        file.set_times(fs::FileTimes::new().set_modified(t).set_accessed(t))
            .map_err(Error::io("setting the mtime of", host))
    }

    fn create_symlink<R: Read>(
        &mut self,
        entry: &tar::Entry<'_, R>,
        rel: &Path,
        host: &Path,
        meta: &Meta,
        ctx: &LayerCtx<'_>,
        at: &EntryAt<'_>,
    ) -> Result<()> {
        let target = entry
            .link_name_bytes()
            .ok_or_else(|| at.bad("a symlink without a target".into()))?
            .into_owned();
        self.remove_existing(rel)?;
        std::os::unix::fs::symlink(OsStr::from_bytes(&target), host)
            .map_err(Error::io("creating symlink", host))?;
        self.set_owner_and_xattrs(rel, meta, ctx)?;
        set_mtime_nofollow(host, meta.mtime).map_err(Error::io("setting the mtime of", host))
    }

    /// A hard link to an entry of this or an earlier layer (never to a directory).
    fn create_hard_link<R: Read>(
        &mut self,
        entry: &tar::Entry<'_, R>,
        rel: &Path,
        host: &Path,
        at: &EntryAt<'_>,
    ) -> Result<()> {
        let raw_target = entry
            .link_name_bytes()
            .ok_or_else(|| at.bad("a hard link without a target".into()))?
            .into_owned();
        let mut target = normalize(&raw_target).map_err(|p| at.unsafe_path(p))?;
        let target_name = target
            .pop()
            .ok_or_else(|| at.bad("a hard link to the root".into()))?;
        let target_dir = self
            .resolve_dir(&target, false, at.layer, &at.shown)?
            .ok_or_else(|| at.bad("its hard link target does not exist".into()))?;
        let target_host = self.root.join(target_dir.join(&target_name));
        match fs::symlink_metadata(&target_host) {
            Ok(m) if m.is_dir() => return Err(at.bad("a hard link to a directory".into())),
            Ok(_) => {}
            Err(e) => {
                return Err(at.bad(format!(
                    "its hard link target {}: {e}",
                    target_host.display()
                )));
            }
        }
        if target_host != host {
            self.remove_existing(rel)?;
            // linkat without AT_SYMLINK_FOLLOW: a symlink target is linked itself.
            fs::hard_link(&target_host, host).map_err(Error::io("creating hard link", host))?;
        }
        Ok(())
    }

    /// A character or block device or a FIFO; without root, device nodes are skipped (a
    /// note says which).
    fn create_device(
        &mut self,
        (file_type, dev): (libc::mode_t, libc::dev_t),
        rel: &Path,
        host: &Path,
        meta: &Meta,
        ctx: &LayerCtx<'_>,
        at: &EntryAt<'_>,
    ) -> Result<()> {
        self.remove_existing(rel)?;
        match mknod(host, file_type | (meta.mode & 0o7777), dev) {
            Ok(()) => {
                self.set_owner_and_xattrs(rel, meta, ctx)?;
                fs::set_permissions(host, fs::Permissions::from_mode(meta.mode))
                    .map_err(Error::io("setting the mode of", host))
            }
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied && !self.privileged => {
                self.notes.push(format!(
                    "{}: device node not created without root",
                    at.shown
                ));
                Ok(())
            }
            Err(e) => Err(Error::io("creating device node", host)(e)),
        }
    }

    /// The directory `components` name, relative to the root, with every symlink on the
    /// way resolved inside the root. Missing directories are made (mode 0755, like Docker)
    /// when `create`, else `None` is returned.
    fn resolve_dir(
        &self,
        components: &[OsString],
        create: bool,
        layer: &str,
        shown: &str,
    ) -> Result<Option<PathBuf>> {
        let escape = |problem| Error::UnsafePath {
            layer: layer.into(),
            path: shown.into(),
            problem,
        };
        let mut stack: Vec<OsString> = Vec::new();
        let mut queue: VecDeque<OsString> = components.iter().cloned().collect();
        let mut hops = 0;
        while let Some(c) = queue.pop_front() {
            if c.is_empty() || c == "." {
                continue;
            }
            if c == ".." {
                // Only symlink targets bring these (entry paths with `..` are refused).
                if stack.pop().is_none() {
                    return Err(escape("a symlink on its way leads out of the root"));
                }
                continue;
            }
            let mut rel: PathBuf = stack.iter().collect();
            rel.push(&c);
            let host = self.root.join(&rel);
            match fs::symlink_metadata(&host) {
                Ok(m) if m.file_type().is_symlink() => {
                    hops += 1;
                    if hops > MAX_SYMLINK_HOPS {
                        return Err(escape("too many symlinks on its way"));
                    }
                    let target =
                        fs::read_link(&host).map_err(Error::io("reading symlink", &host))?;
                    let bytes = target.as_os_str().as_bytes();
                    if bytes.starts_with(b"/") {
                        stack.clear();
                    }
                    for part in bytes.split(|b| *b == b'/').rev() {
                        queue.push_front(OsStr::from_bytes(part).to_owned());
                    }
                }
                Ok(m) if m.is_dir() => stack.push(c),
                Ok(_) => {
                    return Err(Error::BadEntry {
                        layer: layer.into(),
                        path: shown.into(),
                        problem: format!("{} on its way is not a directory", rel.display()),
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    if !create {
                        return Ok(None);
                    }
                    fs::create_dir(&host).map_err(Error::io("creating directory", &host))?;
                    fs::set_permissions(&host, fs::Permissions::from_mode(0o755))
                        .map_err(Error::io("setting the mode of", &host))?;
                    stack.push(c);
                }
                Err(e) => return Err(Error::io("looking at", host)(e)),
            }
        }
        Ok(Some(stack.iter().collect()))
    }

    /// Removes whatever is at `rel` (never following a symlink), and forgets what was
    /// recorded under it.
    fn remove_existing(&mut self, rel: &Path) -> Result<()> {
        let host = self.root.join(rel);
        let removed = match fs::symlink_metadata(&host) {
            Ok(m) if m.is_dir() => fs::remove_dir_all(&host),
            Ok(_) => fs::remove_file(&host),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => Err(e),
        };
        removed.map_err(Error::io("removing", &host))?;
        let under: Vec<PathBuf> = self
            .dirs
            .range(rel.to_path_buf()..)
            .map(|(k, _)| k)
            .take_while(|k| k.starts_with(rel))
            .cloned()
            .collect();
        for k in under {
            self.dirs.remove(&k);
        }
        let under: Vec<PathBuf> = self
            .owners
            .range(rel.to_path_buf()..)
            .map(|(k, _)| k)
            .take_while(|k| k.starts_with(rel))
            .cloned()
            .collect();
        for k in under {
            self.owners.remove(&k);
        }
        Ok(())
    }

    /// `.wh..wh..opq`: removes from `dir` everything this layer did not make.
    fn make_opaque(&mut self, dir: &Path, ctx: &LayerCtx<'_>) -> Result<()> {
        let host = self.root.join(dir);
        let listing = fs::read_dir(&host).map_err(Error::io("listing", &host))?;
        let mut doomed = Vec::new();
        for child in listing {
            let child = child.map_err(Error::io("listing", &host))?;
            let rel = dir.join(child.file_name());
            if !ctx.created.contains(&rel) {
                doomed.push(rel);
            }
        }
        for rel in doomed {
            self.remove_existing(&rel)?;
        }
        Ok(())
    }

    fn set_owner_and_xattrs(&mut self, rel: &Path, meta: &Meta, ctx: &LayerCtx<'_>) -> Result<()> {
        let host = self.root.join(rel);
        if self.privileged {
            std::os::unix::fs::lchown(&host, Some(meta.uid), Some(meta.gid))
                .map_err(Error::io("setting the owner of", &host))?;
        } else {
            let m = fs::symlink_metadata(&host).map_err(Error::io("looking at", &host))?;
            if (m.uid(), m.gid()) != (meta.uid, meta.gid) {
                self.owners.insert(rel.to_path_buf(), (meta.uid, meta.gid));
            } else {
                self.owners.remove(rel);
            }
        }
        for (name, value) in &meta.xattrs {
            if !kept_xattr(name) {
                self.notes.push(format!(
                    "{}: xattr {} left out (host-side metadata)",
                    rel.display(),
                    String::from_utf8_lossy(name)
                ));
                continue;
            }
            match lsetxattr(&host, name, value) {
                Ok(()) => {}
                Err(e) if !self.privileged && e.kind() == io::ErrorKind::PermissionDenied => {
                    self.notes.push(format!(
                        "{}: xattr {} not set without root",
                        rel.display(),
                        String::from_utf8_lossy(name)
                    ));
                }
                Err(e) => {
                    return Err(Error::BadEntry {
                        layer: ctx.name.into(),
                        path: rel.display().to_string(),
                        problem: format!("setting xattr {}: {e}", String::from_utf8_lossy(name)),
                    });
                }
            }
        }
        Ok(())
    }
}

/// A zstd stream of one or more frames (`zstd` writes one; parallel compressors several).
enum ZstdFrames<R: BufRead> {
    Between(R),
    In(Box<ruzstd::decoding::StreamingDecoder<R, ruzstd::decoding::FrameDecoder>>),
    Done,
}

impl<R: BufRead> Read for ZstdFrames<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            match std::mem::replace(self, ZstdFrames::Done) {
                ZstdFrames::Done => return Ok(0),
                ZstdFrames::Between(mut src) => {
                    if src.fill_buf()?.is_empty() {
                        return Ok(0);
                    }
                    let decoder = ruzstd::decoding::StreamingDecoder::new(src).map_err(|e| {
                        io::Error::new(io::ErrorKind::InvalidData, format!("zstd: {e}"))
                    })?;
                    *self = ZstdFrames::In(Box::new(decoder));
                }
                ZstdFrames::In(mut decoder) => {
                    let n = decoder.read(buf)?;
                    if n == 0 {
                        // End of this frame: another may follow.
                        *self = ZstdFrames::Between(decoder.into_inner());
                        continue;
                    }
                    *self = ZstdFrames::In(decoder);
                    return Ok(n);
                }
            }
        }
    }
}

/// An entry path as components: relative, no `..`, `.` and empty parts dropped (a leading
/// `./` is common and harmless).
fn normalize(raw: &[u8]) -> std::result::Result<Vec<OsString>, &'static str> {
    if raw.len() > MAX_PATH_BYTES {
        return Err("longer than PATH_MAX");
    }
    if raw.starts_with(b"/") {
        return Err("an absolute path");
    }
    let mut out = Vec::new();
    for part in raw.split(|b| *b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return Err("a '..' component"),
            _ => out.push(OsStr::from_bytes(part).to_owned()),
        }
    }
    Ok(out)
}

/// Mode, owner, mtime (PAX `uid`/`gid`/`mtime` override the header's) and PAX xattrs.
fn entry_meta<R: Read>(entry: &mut tar::Entry<'_, R>) -> io::Result<Meta> {
    let header = entry.header();
    let mut meta = Meta {
        mode: header.mode()? & 0o7777,
        uid: u32::try_from(header.uid()?).unwrap_or(u32::MAX),
        gid: u32::try_from(header.gid()?).unwrap_or(u32::MAX),
        mtime: i64::try_from(header.mtime().unwrap_or(0)).unwrap_or(0),
        xattrs: Vec::new(),
    };
    if let Some(pax) = entry.pax_extensions()? {
        for ext in pax {
            let ext = ext?;
            let Ok(key) = ext.key() else { continue };
            let value = ext.value_bytes();
            let number = || {
                std::str::from_utf8(value)
                    .ok()
                    .and_then(|v| v.split('.').next()?.parse::<i64>().ok())
            };
            match key {
                "uid" => {
                    meta.uid = number()
                        .and_then(|n| u32::try_from(n).ok())
                        .unwrap_or(meta.uid)
                }
                "gid" => {
                    meta.gid = number()
                        .and_then(|n| u32::try_from(n).ok())
                        .unwrap_or(meta.gid)
                }
                "mtime" => meta.mtime = number().unwrap_or(meta.mtime),
                _ => {
                    if let Some(name) = key.strip_prefix("SCHILY.xattr.") {
                        meta.xattrs.push((name.as_bytes().to_vec(), value.to_vec()));
                    }
                }
            }
        }
    }
    Ok(meta)
}

fn cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
}

fn lsetxattr(path: &Path, name: &[u8], value: &[u8]) -> io::Result<()> {
    let path = cstring(path)?;
    let name = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in xattr name"))?;
    // SAFETY: both strings are NUL-terminated and live across the call; value/len describe a
    // valid slice; lsetxattr does not keep the pointers.
    let rc = unsafe {
        libc::lsetxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn mknod(path: &Path, mode: u32, dev: libc::dev_t) -> io::Result<()> {
    let path = cstring(path)?;
    // SAFETY: the path is NUL-terminated and outlives the call.
    let rc = unsafe { libc::mknod(path.as_ptr(), mode, dev) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets atime and mtime of `path` itself (a symlink is not followed).
pub(crate) fn set_mtime_nofollow(path: &Path, secs: i64) -> io::Result<()> {
    let path = cstring(path)?;
    let t = libc::timespec {
        tv_sec: secs as libc::time_t,
        tv_nsec: 0,
    };
    let times = [t, t];
    // SAFETY: the path is NUL-terminated, `times` is two valid timespecs, both outlive the call.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            path.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether an image's xattr is set on the host tree (see the module's doc).
fn kept_xattr(name: &[u8]) -> bool {
    name == b"security.capability"
        || !(name.starts_with(b"trusted.") || name.starts_with(b"security."))
}

/// Makes `dir` (created if missing) traversable by root only (0700): the image and layer
/// trees below it keep setuid files, which no other host user may reach.
pub fn restrict_dir(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).map_err(Error::io("creating", dir))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
        .map_err(Error::io("setting the mode of", dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_side_xattrs_are_left_out() {
        assert!(kept_xattr(b"user.mime_type"));
        assert!(kept_xattr(b"security.capability"));
        for name in [
            &b"trusted.overlay.redirect"[..],
            b"trusted.overlay.opaque",
            b"security.selinux",
            b"security.ima",
        ] {
            assert!(!kept_xattr(name), "{}", String::from_utf8_lossy(name));
        }
    }

    #[test]
    fn device_nodes_are_skipped_and_fifos_made() {
        let layer = {
            let mut b = tar::Builder::new(Vec::new());
            for (path, kind, mode) in [
                ("dev/sda", tar::EntryType::Block, 0o660),
                ("dev/mem", tar::EntryType::Char, 0o640),
                ("run/fifo", tar::EntryType::Fifo, 0o600),
                ("bin/su", tar::EntryType::Regular, 0o4755),
            ] {
                let mut h = tar::Header::new_gnu();
                h.set_entry_type(kind);
                h.set_mode(mode);
                h.set_size(0);
                h.set_uid(0);
                h.set_gid(0);
                h.set_mtime(0);
                if kind == tar::EntryType::Block {
                    h.set_device_major(8).unwrap();
                }
                h.set_cksum();
                b.append_data(&mut h, path, std::io::empty()).unwrap();
            }
            b.into_inner().unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let mut u = Unpacker::new(&root, Limits::default()).unwrap();
        u.apply_layer(&layer[..], "test layer", None).unwrap();
        assert!(fs::symlink_metadata(root.join("dev/sda")).is_err());
        assert!(fs::symlink_metadata(root.join("dev/mem")).is_err());
        let notes = u.notes().join("\n");
        assert!(
            notes.contains("dev/sda") && notes.contains("8:0"),
            "{notes}"
        );
        use std::os::unix::fs::FileTypeExt;
        let fifo = fs::symlink_metadata(root.join("run/fifo")).unwrap();
        assert!(fifo.file_type().is_fifo());
        // setuid is the image's: kept (the tree's parents are root-only instead).
        let su = fs::symlink_metadata(root.join("bin/su")).unwrap();
        assert_eq!(su.mode() & 0o7777, 0o4755);
        restrict_dir(dir.path()).unwrap();
        let top = fs::metadata(dir.path()).unwrap();
        assert_eq!(top.mode() & 0o777, 0o700);
    }

    #[test]
    fn normalizes_and_refuses() {
        let ok = |s: &str| {
            normalize(s.as_bytes()).map(|v| {
                v.into_iter()
                    .map(|c| c.into_string().unwrap_or_default())
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(
            ok("./a//b/./c/"),
            Ok(vec!["a".to_string(), "b".into(), "c".into()])
        );
        assert_eq!(ok("./"), Ok(vec![]));
        assert_eq!(ok("a/../b"), Err("a '..' component"));
        assert_eq!(ok("/etc/passwd"), Err("an absolute path"));
    }
}
