//! Blobs (layers, configs, manifests) by digest: `<data-dir>/cache/blobs/sha256/<hex>`.
//! A blob appears under its name only once its content has been hashed and matched, by
//! rename, so a present blob is a verified one; pulling an image again reuses them.

use crate::digest::{Digest, HashingReader, is_over_limit};
use crate::{Error, Result};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
pub struct BlobCache {
    dir: PathBuf,
}

impl BlobCache {
    /// The cache under a Sandcell data directory.
    pub fn in_data_dir(data_dir: &Path) -> BlobCache {
        BlobCache::new(data_dir.join("cache/blobs/sha256"))
    }

    pub fn new(dir: PathBuf) -> BlobCache {
        BlobCache { dir }
    }

    pub fn path(&self, digest: &Digest) -> PathBuf {
        self.dir.join(digest.hex())
    }

    pub fn contains(&self, digest: &Digest) -> bool {
        self.path(digest).is_file()
    }

    pub fn open(&self, digest: &Digest) -> Result<File> {
        let path = self.path(digest);
        File::open(&path).map_err(Error::io("opening cached blob", path))
    }

    /// Reads a small cached document (manifest, config), bounded by `limit`.
    pub fn read_document(&self, digest: &Digest, limit: u64) -> Result<Vec<u8>> {
        let path = self.path(digest);
        let mut buf = Vec::new();
        self.open(digest)?
            .take(limit + 1)
            .read_to_end(&mut buf)
            .map_err(Error::io("reading cached blob", &path))?;
        if buf.len() as u64 > limit {
            return Err(Error::TooLarge {
                layer: digest.to_string(),
                what: "document".into(),
                limit,
                unit: "bytes",
            });
        }
        Ok(buf)
    }

    /// A temporary file in the cache directory (same filesystem, for the final rename).
    pub fn temp_file(&self) -> Result<(File, PathBuf)> {
        std::fs::create_dir_all(&self.dir).map_err(Error::io("creating blob cache", &self.dir))?;
        for attempt in 0..100u32 {
            let path = self.dir.join(format!(
                ".tmp-{}-{}-{attempt}",
                std::process::id(),
                unique()
            ));
            match File::options().write(true).create_new(true).open(&path) {
                Ok(f) => return Ok((f, path)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io("creating blob temp file", path)(e)),
            }
        }
        Err(Error::Io {
            what: "creating blob temp file",
            path: self.dir.clone(),
            source: std::io::Error::other("no free temporary name"),
        })
    }

    /// Moves a fully written temp file in as `expected` after checking `actual` matches.
    pub fn commit(
        &self,
        tmp: &Path,
        expected: &Digest,
        actual: &Digest,
        what: &str,
    ) -> Result<PathBuf> {
        if let Err(e) = expected.verify(actual, what) {
            let _ = std::fs::remove_file(tmp);
            return Err(e);
        }
        let dest = self.path(expected);
        std::fs::rename(tmp, &dest).map_err(Error::io("moving blob into the cache", &dest))?;
        Ok(dest)
    }

    /// Copies `reader` in, hashing it; with `expected`, the content must match it. At most
    /// `limit` bytes. Returns the digest and the size.
    pub fn insert_from_reader(
        &self,
        reader: impl Read,
        expected: Option<&Digest>,
        limit: u64,
        what: &str,
    ) -> Result<(Digest, u64)> {
        let (mut file, tmp) = self.temp_file()?;
        let mut hashing = HashingReader::new(reader, limit);
        let copied = std::io::copy(&mut hashing, &mut file).and_then(|_| file.flush());
        if let Err(e) = copied {
            let _ = std::fs::remove_file(&tmp);
            if is_over_limit(&e) {
                return Err(Error::TooLarge {
                    layer: what.to_string(),
                    what: "blob".into(),
                    limit,
                    unit: "bytes",
                });
            }
            return Err(Error::io("copying blob into the cache", tmp)(e));
        }
        let (actual, size) = hashing.finish().map_err(Error::io("hashing blob", &tmp))?;
        let expected = expected.unwrap_or(&actual).clone();
        self.commit(&tmp, &expected, &actual, what)?;
        Ok((actual, size))
    }
}

/// Nanoseconds now: uniqueness for temp names within a process, with the pid outside it.
pub(crate) fn unique() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifies_before_naming() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = BlobCache::new(tmp.path().join("c"));
        let good = Digest::of(b"hello");
        let (d, n) = cache
            .insert_from_reader(&b"hello"[..], Some(&good), 100, "t")
            .unwrap();
        assert_eq!((d.clone(), n), (good.clone(), 5));
        assert!(cache.contains(&good));
        let other = Digest::of(b"other");
        let e = cache
            .insert_from_reader(&b"hello!"[..], Some(&other), 100, "t")
            .unwrap_err();
        assert!(matches!(e, Error::DigestMismatch { .. }), "{e}");
        assert!(!cache.contains(&other));
        let e = cache
            .insert_from_reader(&b"hello"[..], None, 4, "t")
            .unwrap_err();
        assert!(matches!(e, Error::TooLarge { .. }), "{e}");
        // Nothing but the one good blob is left behind.
        assert_eq!(std::fs::read_dir(tmp.path().join("c")).unwrap().count(), 1);
    }
}
