//! Local images: an OCI layout directory (`oci-layout`, `index.json`, `blobs/sha256/`), or a
//! `docker save` tarball (the classic `manifest.json` form, or the OCI layout newer Docker
//! versions write into it). Blobs are copied into the [`BlobCache`] and verified on the way.

use crate::cache::BlobCache;
use crate::digest::Digest;
use crate::spec::{Descriptor, Document, ImageConfigFile, ResolvedImage, pick_linux_amd64};
use crate::{Error, Limits, Result};
use serde::Deserialize;
use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

const REF_NAME: &str = "org.opencontainers.image.ref.name";
/// Index → index → manifest nesting accepted.
const MAX_INDEX_DEPTH: usize = 4;

/// Imports `path` (a layout directory or a tar file). `tag` picks among several images
/// (the layout's `org.opencontainers.image.ref.name`, or a `RepoTags` entry).
pub fn import(
    path: &Path,
    tag: Option<&str>,
    cache: &BlobCache,
    limits: &Limits,
) -> Result<ResolvedImage> {
    let meta = std::fs::metadata(path).map_err(Error::io("opening", path))?;
    let source = path.display().to_string();
    if meta.is_dir() {
        let blobs = DirBlobs {
            dir: path.to_path_buf(),
        };
        let index = read_bounded(&path.join("index.json"), limits.max_document_bytes)?;
        from_layout(&index, tag, &blobs, cache, limits, source)
    } else {
        import_tar(path, tag, cache, limits, source)
    }
}

/// Where a layout's blobs come from.
trait Blobs {
    /// Makes `digest` present (verified) in the cache.
    fn fetch(&self, digest: &Digest, cache: &BlobCache, limits: &Limits) -> Result<()>;
}

struct DirBlobs {
    dir: PathBuf,
}

impl Blobs for DirBlobs {
    fn fetch(&self, digest: &Digest, cache: &BlobCache, limits: &Limits) -> Result<()> {
        if cache.contains(digest) {
            return Ok(());
        }
        // The hex is validated: no path can come out of it.
        let path = self.dir.join("blobs/sha256").join(digest.hex());
        let file = File::open(&path).map_err(Error::io("opening blob", &path))?;
        cache.insert_from_reader(
            file,
            Some(digest),
            limits.max_blob_bytes,
            &path.display().to_string(),
        )?;
        Ok(())
    }
}

/// A tarball's files, already in the cache: name → digest of its content.
struct TarBlobs {
    files: HashMap<String, (Digest, u64)>,
}

impl Blobs for TarBlobs {
    fn fetch(&self, digest: &Digest, _: &BlobCache, _: &Limits) -> Result<()> {
        let name = format!("blobs/sha256/{}", digest.hex());
        let (actual, _) = self.files.get(&name).ok_or_else(|| Error::Manifest {
            what: "the tarball".into(),
            problem: format!("{name} is missing"),
        })?;
        digest.verify(actual, name)
    }
}

fn from_layout(
    index: &[u8],
    tag: Option<&str>,
    blobs: &dyn Blobs,
    cache: &BlobCache,
    limits: &Limits,
    source: String,
) -> Result<ResolvedImage> {
    let doc = Document::parse(index, "index.json")?;
    let entries = doc.manifests.unwrap_or_default();
    let chosen: &Descriptor = match tag {
        Some(tag) => entries
            .iter()
            .find(|d| ref_name(d) == Some(tag))
            .ok_or_else(|| Error::Manifest {
                what: source.clone(),
                problem: format!("no image tagged {tag:?} (tags: {})", tags(&entries)),
            })?,
        None if entries.len() == 1 => &entries[0],
        None if entries.is_empty() => {
            return Err(Error::Manifest {
                what: source,
                problem: "index.json lists no image".into(),
            });
        }
        // Several: the platform ones of one image, or several images.
        None => match pick_linux_amd64(&entries, &source) {
            Ok(d) => d,
            Err(_) => {
                return Err(Error::Manifest {
                    what: source,
                    problem: format!(
                        "it holds several images; pick one with --tag (tags: {})",
                        tags(&entries)
                    ),
                });
            }
        },
    };
    let mut digest = Digest::parse(&chosen.digest)?;
    for _ in 0..MAX_INDEX_DEPTH {
        blobs.fetch(&digest, cache, limits)?;
        let doc = Document::parse(
            &cache.read_document(&digest, limits.max_document_bytes)?,
            digest.as_str(),
        )?;
        if doc.is_index() {
            let entries = doc.manifests.unwrap_or_default();
            digest = Digest::parse(&pick_linux_amd64(&entries, digest.as_str())?.digest)?;
            continue;
        }
        let config = doc.config.ok_or_else(|| Error::Manifest {
            what: digest.to_string(),
            problem: "a manifest without config".into(),
        })?;
        let config_digest = Digest::parse(&config.digest)?;
        blobs.fetch(&config_digest, cache, limits)?;
        let config_file = ImageConfigFile::parse(
            &cache.read_document(&config_digest, limits.max_document_bytes)?,
            config_digest.as_str(),
        )?;
        let mut listed = Vec::new();
        for layer in doc.layers.unwrap_or_default() {
            let d = Digest::parse(&layer.digest)?;
            blobs.fetch(&d, cache, limits)?;
            listed.push((d, layer.size));
        }
        let layers = ResolvedImage::layers_from(&listed, &config_file, &source)?;
        return Ok(ResolvedImage {
            source,
            manifest_digest: digest,
            config: config_file,
            layers,
        });
    }
    Err(Error::Manifest {
        what: source,
        problem: "indexes nested too deep".into(),
    })
}

fn ref_name(d: &Descriptor) -> Option<&str> {
    d.annotations.as_ref()?.get(REF_NAME).map(String::as_str)
}

fn tags(entries: &[Descriptor]) -> String {
    let t: Vec<&str> = entries.iter().filter_map(ref_name).collect();
    if t.is_empty() {
        "none".into()
    } else {
        t.join(", ")
    }
}

/// `docker save`'s `manifest.json`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SaveEntry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

fn import_tar(
    path: &Path,
    tag: Option<&str>,
    cache: &BlobCache,
    limits: &Limits,
    source: String,
) -> Result<ResolvedImage> {
    let file = File::open(path).map_err(Error::io("opening", path))?;
    let mut archive = tar::Archive::new(std::io::BufReader::new(file));
    let bad = |problem: String| Error::Manifest {
        what: source.clone(),
        problem,
    };
    let mut files = HashMap::new();
    let entries = archive
        .entries()
        .map_err(|e| bad(format!("not a tar file: {e}")))?;
    for entry in entries {
        let entry = entry.map_err(|e| bad(format!("reading the tar: {e}")))?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let raw = entry.path_bytes().into_owned();
        let name = String::from_utf8(raw).map_err(|_| bad("a non-UTF-8 file name".into()))?;
        let parts: Vec<&str> = name
            .split('/')
            .filter(|p| !p.is_empty() && *p != ".")
            .collect();
        if name.starts_with('/') || parts.contains(&"..") {
            return Err(Error::UnsafePath {
                layer: source.clone(),
                path: name,
                problem: "an absolute or '..' path in the tarball",
            });
        }
        let (digest, size) = cache.insert_from_reader(entry, None, limits.max_blob_bytes, &name)?;
        files.insert(parts.join("/"), (digest, size));
    }
    let blobs = TarBlobs { files };
    let read = |name: &str| -> Result<Vec<u8>> {
        let (d, _) = blobs
            .files
            .get(name)
            .ok_or_else(|| bad(format!("{name} is missing")))?;
        cache.read_document(d, limits.max_document_bytes)
    };
    if blobs.files.contains_key("index.json") && blobs.files.contains_key("oci-layout") {
        return from_layout(&read("index.json")?, tag, &blobs, cache, limits, source);
    }
    let saved: Vec<SaveEntry> = serde_json::from_slice(&read("manifest.json")?)
        .map_err(|e| bad(format!("manifest.json: {e}")))?;
    let entry = match tag {
        Some(tag) => saved
            .iter()
            .find(|e| {
                e.repo_tags
                    .as_ref()
                    .is_some_and(|t| t.iter().any(|t| same_tag(t, tag)))
            })
            .ok_or_else(|| bad(format!("no image tagged {tag:?}")))?,
        None if saved.len() == 1 => &saved[0],
        None => {
            return Err(bad(format!(
                "it holds {} images; pick one with --tag",
                saved.len()
            )));
        }
    };
    let config_bytes = read(&entry.config)?;
    let (config_digest, _) = &blobs.files[&entry.config];
    let config = ImageConfigFile::parse(&config_bytes, &entry.config)?;
    let mut listed = Vec::new();
    for layer in &entry.layers {
        let (d, size) = blobs
            .files
            .get(layer)
            .ok_or_else(|| bad(format!("layer {layer} is missing")))?;
        listed.push((d.clone(), *size));
    }
    let layers = ResolvedImage::layers_from(&listed, &config, &source)?;
    // Classic saves have no manifest blob: the config's digest is the image id.
    Ok(ResolvedImage {
        source,
        manifest_digest: config_digest.clone(),
        config,
        layers,
    })
}

/// `docker.io/library/app:v1`, `library/app:v1` and `app:v1` are one tag.
fn same_tag(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    let whole = |s: &str| crate::registry::parse_reference(s).ok().map(|r| r.whole());
    whole(a).is_some_and(|w| Some(w) == whole(b))
}

fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    File::open(path)
        .and_then(|f| f.take(limit + 1).read_to_end(&mut buf))
        .map_err(Error::io("reading", path))?;
    if buf.len() as u64 > limit {
        return Err(Error::TooLarge {
            layer: path.display().to_string(),
            what: "document".into(),
            limit,
            unit: "bytes",
        });
    }
    Ok(buf)
}
