//! `sandcell template prune [--older-than DAYS] [--dry-run] [--json]`: bounds the build
//! caches, which builds only ever add to.
//!
//! - `<data-dir>/cache/layers/<key>/`: a layer is removed when no image's `template.json`
//!   references it (its `layers` and its steps' `layer`), it is older than `DAYS` (its
//!   directory's last change, mtime or ctime, whichever is later: about when it was built),
//!   and nothing has it open or mounted ([`store::users_of`]).
//! - `<data-dir>/cache/e2b-files/<keyID>/<hash>/` (COPY archives uploaded through the
//!   template API): removed when older than `DAYS`. The SDKs ask whether an archive is
//!   present before each build and upload it again when it is not.
//!
//! Nothing is removed when an image's `template.json` cannot be read (what it references
//! would be unknown). Run it while no build is running: a build that takes an old
//! unreferenced layer from the cache, or an old upload, could lose it halfway and fail
//! (run it again then).

use sandcell_image::store;
use sandcell_image::template::TEMPLATE_FILE;
use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(clap::Args)]
pub struct PruneArgs {
    /// Keep what changed in the last DAYS days (0: remove everything unreferenced)
    #[arg(long, default_value_t = 7, value_name = "DAYS")]
    pub older_than: u32,
    /// Only print what would be removed
    #[arg(long)]
    pub dry_run: bool,
    #[arg(long)]
    pub json: bool,
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

pub fn run(data_dir: &Path, args: &PruneArgs) -> Result<Pruned, PruneError> {
    let age = Duration::from_secs(u64::from(args.older_than) * 86_400);
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
        let record = sandcell_image::template::read_record(&dir)
            .ok_or_else(|| PruneError::BadRecord { path: path.clone() })?;
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

/// Prints the result; the exit status.
pub fn report(result: Result<Pruned, PruneError>, json: bool) -> i32 {
    match result {
        Ok(p) if json => {
            println!("{}", serde_json::to_string(&p).unwrap_or_default());
            0
        }
        Ok(p) => {
            let verb = if p.dry_run { "would remove" } else { "removed" };
            for layer in &p.layers {
                println!("{verb} layer {layer}");
            }
            for upload in &p.uploads {
                println!("{verb} upload {upload}");
            }
            println!(
                "{verb} {} layers, {} uploads, {} bytes",
                p.layers.len(),
                p.uploads.len(),
                p.bytes
            );
            0
        }
        Err(e) => {
            eprintln!("sandcell: {e}");
            1
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn args(older_than: u32, dry_run: bool) -> PruneArgs {
        PruneArgs {
            older_than,
            dry_run,
            json: false,
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
        let kept = run(d, &args(7, false)).unwrap();
        assert!(
            kept.layers.is_empty() && kept.uploads.is_empty(),
            "{kept:?}"
        );
        // A dry run with no age limit names what would go and removes nothing.
        let dry = run(d, &args(0, true)).unwrap();
        assert_eq!(dry.layers, ["old1", "old2"]);
        assert_eq!(dry.uploads, ["key1/abcd"]);
        assert!(dry.bytes >= 8, "{dry:?}");
        assert!(exists(d, "cache/layers/old1/tree/f"));
        let pruned = run(d, &args(0, false)).unwrap();
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
        let err = run(d, &args(0, false)).unwrap_err();
        assert!(matches!(err, PruneError::BadRecord { .. }), "{err}");
        assert!(exists(d, "cache/layers/old1/tree/f"));
        assert!(exists(d, "cache/e2b-files/key1/abcd/file"));
    }
}
