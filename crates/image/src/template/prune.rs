//! Bounds the build caches, which builds only ever add to (`sandcell template prune`, and
//! the daemon's periodic prune).
//!
//! - `<data-dir>/cache/layers/<key>/`: a layer is removed when no image's `template.json`
//!   references it (its `layers` and its steps' `layer`), it is older than the limit (its
//!   directory's last change, mtime or ctime, whichever is later: about when it was built),
//!   and nothing has it open or mounted ([`store::users_of`]).
//! - `<data-dir>/cache/e2b-files/<keyID>/<hash>/` (COPY archives uploaded through the
//!   template API): removed when older than the limit. The SDKs ask whether an archive is
//!   present before each build and upload it again when it is not.
//!
//! Nothing is removed when an image's `template.json` cannot be read (what it references
//! would be unknown).
//!
//! Builds and prunes exclude each other through [`CacheLock`] (`flock` on
//! `<data-dir>/cache/.build-lock`): every build holds it shared for its whole run, a prune
//! takes it exclusive and refuses to start while a build runs, so a build never loses an old
//! unreferenced layer or upload it is taking from the cache, whichever process runs it.

use super::TEMPLATE_FILE;
use crate::store;
use std::collections::BTreeSet;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What to prune.
#[derive(Debug, Clone, Copy, Default)]
pub struct PruneOptions {
    /// Keep what changed in the last this many days (0: remove everything unreferenced).
    pub older_than_days: u32,
    /// Only say what would be removed.
    pub dry_run: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum PruneError {
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: unreadable, so what it references is unknown: nothing was pruned", path.display())]
    BadRecord { path: PathBuf },
    #[error("a template build is running on {}: prune again when it ends", path.display())]
    Busy { path: PathBuf },
}

/// The build cache's lock (see the module's doc); released when dropped.
#[derive(Debug)]
pub struct CacheLock {
    _file: std::fs::File,
}

impl CacheLock {
    fn open(data_dir: &Path) -> Result<(std::fs::File, PathBuf), PruneError> {
        let cache = data_dir.join("cache");
        std::fs::create_dir_all(&cache).map_err(io("creating", &cache))?;
        let path = cache.join(".build-lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io("opening", &path))?;
        Ok((file, path))
    }

    fn flock(file: &std::fs::File, op: libc::c_int) -> std::io::Result<()> {
        loop {
            // SAFETY: flock on a file descriptor this function borrows; no memory is passed.
            let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
            if rc == 0 {
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// A build's hold: shared, waits for a prune to end.
    pub fn shared(data_dir: &Path) -> Result<CacheLock, PruneError> {
        let (file, path) = Self::open(data_dir)?;
        Self::flock(&file, libc::LOCK_SH).map_err(io("locking", &path))?;
        Ok(CacheLock { _file: file })
    }

    /// A prune's hold: exclusive; [`PruneError::Busy`] while a build holds it.
    pub fn exclusive(data_dir: &Path) -> Result<CacheLock, PruneError> {
        let (file, path) = Self::open(data_dir)?;
        match Self::flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
            Ok(()) => Ok(CacheLock { _file: file }),
            Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Err(PruneError::Busy { path }),
            Err(e) => Err(io("locking", &path)(e)),
        }
    }
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> PruneError {
    let path = path.to_path_buf();
    move |source| PruneError::Io { what, path, source }
}

/// What was (or, in a dry run, would be) removed.
#[derive(Debug, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Pruned {
    pub layers: Vec<String>,
    /// `<keyID>/<hash>`
    pub uploads: Vec<String>,
    pub bytes: u64,
    pub dry_run: bool,
}

/// Prunes the caches of `data_dir` (refused while a build runs: [`PruneError::Busy`]).
pub fn prune(data_dir: &Path, args: &PruneOptions) -> Result<Pruned, PruneError> {
    let _lock = CacheLock::exclusive(data_dir)?;
    let age = Duration::from_secs(u64::from(args.older_than_days) * 86_400);
    let cutoff = SystemTime::now()
        .checked_sub(age)
        .unwrap_or(UNIX_EPOCH)
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut out = Pruned {
        dry_run: args.dry_run,
        ..Pruned::default()
    };
    let referenced = referenced_layers(&data_dir.join("images"))?;
    let layers = data_dir.join("cache/layers");
    for (name, path) in entries(&layers)? {
        if referenced.contains(&name)
            || changed_at(&path) > cutoff
            || !store::users_of(&path).is_empty()
        {
            continue;
        }
        out.bytes += remove(&layers, &name, args.dry_run)?;
        out.layers.push(name);
    }
    let uploads = data_dir.join("cache/e2b-files");
    for (key, key_dir) in entries(&uploads)? {
        for (hash, path) in entries(&key_dir)? {
            if changed_at(&path) > cutoff {
                continue;
            }
            out.bytes += remove(&key_dir, &hash, args.dry_run)?;
            out.uploads.push(format!("{key}/{hash}"));
        }
    }
    Ok(out)
}

/// Every layer key (and, to be safe, every path component) that a `template.json` under
/// `images` names, hidden directories (builds being moved into place) included.
fn referenced_layers(images: &Path) -> Result<BTreeSet<String>, PruneError> {
    let mut keys = BTreeSet::new();
    let listing = match std::fs::read_dir(images) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(keys),
        Err(e) => return Err(io("listing", images)(e)),
    };
    for entry in listing {
        let dir = entry.map_err(io("listing", images))?.path();
        let path = dir.join(TEMPLATE_FILE);
        if !path.is_file() {
            continue;
        }
        let record =
            super::read_record(&dir).ok_or_else(|| PruneError::BadRecord { path: path.clone() })?;
        let named = record
            .layers
            .iter()
            .chain(record.steps.iter().filter_map(|s| s.layer.as_ref()));
        for layer in named {
            keys.extend(
                Path::new(layer)
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned()),
            );
        }
    }
    Ok(keys)
}

/// The entries of `dir` not hidden (builds' work directories start with '.'), by name.
fn entries(dir: &Path) -> Result<Vec<(String, PathBuf)>, PruneError> {
    let listing = match std::fs::read_dir(dir) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io("listing", dir)(e)),
    };
    let mut out = Vec::new();
    for entry in listing {
        let entry = entry.map_err(io("listing", dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') && entry.file_type().is_ok_and(|t| t.is_dir()) {
            out.push((name, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// Unix seconds of the later of `path`'s mtime and ctime (a rename into place or an
/// extraction setting old mtimes still leaves the ctime recent); 0 when unreadable.
fn changed_at(path: &Path) -> u64 {
    std::fs::symlink_metadata(path)
        .map_or(0, |m| u64::try_from(m.mtime().max(m.ctime())).unwrap_or(0))
}

/// Removes `parent/name` (renamed away first, so a half-removed entry is never taken for a
/// whole one; `.old-<pid>-` is what the next build sweeps if this is interrupted); its
/// size in bytes.
fn remove(parent: &Path, name: &str, dry_run: bool) -> Result<u64, PruneError> {
    let path = parent.join(name);
    let bytes = size_of(&path);
    if dry_run {
        return Ok(bytes);
    }
    let doomed = parent.join(format!(".old-{}-prune-{name}", std::process::id()));
    std::fs::rename(&path, &doomed).map_err(io("moving away", &path))?;
    std::fs::remove_dir_all(&doomed).map_err(io("removing", &doomed))?;
    Ok(bytes)
}

/// Bytes of the files under `path` (symbolic links not followed).
fn size_of(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    std::fs::read_dir(path).map_or(0, |l| l.flatten().map(|e| size_of(&e.path())).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(older_than_days: u32, dry_run: bool) -> PruneOptions {
        PruneOptions {
            older_than_days,
            dry_run,
        }
    }

    fn file(path: &Path, content: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }

    /// A data dir with an image referencing layers `kept` (in `layers`) and `step` (a
    /// step's), unreferenced layers `old1` and `old2`, and one upload.
    fn data_dir() -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        for key in ["kept", "step", "old1", "old2"] {
            file(&d.join("cache/layers").join(key).join("tree/f"), key);
        }
        file(&d.join("cache/layers/.tmp-1-x/tree/f"), "a build's");
        file(&d.join("cache/e2b-files/key1/abcd/file"), "uploaded");
        let record = serde_json::json!({
            "name": "tpl", "kind": "dockerfile", "dockerfile": "/x/Dockerfile",
            "context": "/x", "base": "minimal", "created": 1,
            "steps": [{"number": 1, "stage": 0, "text": "RUN x", "layer": "step",
                       "cached": false, "seconds": 0.1}],
            "layers": ["kept"], "builtSteps": 1, "cachedSteps": 0, "ext4Bytes": 0,
            "seconds": 1.0,
        });
        file(&d.join("images/tpl/template.json"), &record.to_string());
        file(&d.join("images/minimal/rootfs/etc/hostname"), "installed");
        tmp
    }

    fn exists(d: &Path, rel: &str) -> bool {
        d.join(rel).exists()
    }

    #[test]
    fn removes_only_unreferenced_layers_and_uploads_older_than_the_limit() {
        let tmp = data_dir();
        let d = tmp.path();
        // Everything is fresh: a 7-day limit keeps all of it.
        let kept = prune(d, &args(7, false)).unwrap();
        assert!(
            kept.layers.is_empty() && kept.uploads.is_empty(),
            "{kept:?}"
        );
        // A dry run with no age limit names what would go and removes nothing.
        let dry = prune(d, &args(0, true)).unwrap();
        assert_eq!(dry.layers, ["old1", "old2"]);
        assert_eq!(dry.uploads, ["key1/abcd"]);
        assert!(dry.bytes >= 8, "{dry:?}");
        assert!(exists(d, "cache/layers/old1/tree/f"));
        let pruned = prune(d, &args(0, false)).unwrap();
        assert_eq!(pruned.layers, ["old1", "old2"]);
        assert_eq!(pruned.uploads, ["key1/abcd"]);
        for gone in [
            "cache/layers/old1",
            "cache/layers/old2",
            "cache/e2b-files/key1/abcd",
        ] {
            assert!(!exists(d, gone), "{gone}");
        }
        for stays in [
            "cache/layers/kept/tree/f",
            "cache/layers/step/tree/f",
            "cache/layers/.tmp-1-x/tree/f",
            "images/tpl/template.json",
            "images/minimal/rootfs/etc/hostname",
        ] {
            assert!(exists(d, stays), "{stays}");
        }
        let leftovers: Vec<_> = std::fs::read_dir(d.join("cache/layers"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".old-"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn an_unreadable_template_record_prunes_nothing() {
        let tmp = data_dir();
        let d = tmp.path();
        file(&d.join("images/broken/template.json"), "{not json");
        let err = prune(d, &args(0, false)).unwrap_err();
        assert!(matches!(err, PruneError::BadRecord { .. }), "{err}");
        assert!(exists(d, "cache/layers/old1/tree/f"));
        assert!(exists(d, "cache/e2b-files/key1/abcd/file"));
    }

    #[test]
    fn a_running_build_holds_off_a_prune() {
        let tmp = data_dir();
        let d = tmp.path();
        let build = CacheLock::shared(d).unwrap();
        // Another build shares it.
        let other = CacheLock::shared(d).unwrap();
        let err = prune(d, &args(0, false)).unwrap_err();
        assert!(matches!(err, PruneError::Busy { .. }), "{err}");
        assert!(exists(d, "cache/layers/old1"), "removed during a build");
        drop((build, other));
        let pruned = prune(d, &args(0, false)).unwrap();
        assert!(pruned.layers.contains(&"old1".to_string()), "{pruned:?}");
    }
}
