//! An overlayfs upper directory as an OCI layer: what a build step changed (a sandbox whose
//! root is a host overlayfs writes there) becomes a tar that [`crate::unpack`] (or any OCI
//! tool) applies over the step's base.
//!
//! overlayfs records a deletion as a character device 0/0 (→ `.wh.NAME`) and a directory
//! that replaced a lower one as `trusted.overlay.opaque=y` (→ the directory, then
//! `.wh..wh..opq` in it). Everything else is copied as it is: owners, modes, mtimes, xattrs
//! (the `trusted.overlay.*` bookkeeping left out) and hard links between files of the upper.
//! Redirected or metacopy-only entries (overlayfs features Sandcell does not enable) are
//! refused rather than exported wrongly.

use crate::{Error, Result};
use std::collections::HashMap;
use std::ffi::CString;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

const OVERLAY_XATTR_PREFIX: &str = "trusted.overlay.";

/// What [`layer_from_overlay_upper`] wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DiffStats {
    pub entries: u64,
    pub whiteouts: u64,
    pub opaque_dirs: u64,
}

/// Writes the changes held in `upper` as an uncompressed OCI layer tar to `out`, in a stable
/// (sorted) order.
pub fn layer_from_overlay_upper(upper: &Path, out: impl Write) -> Result<DiffStats> {
    let mut w = DiffWriter {
        tar: tar::Builder::new(out),
        upper: upper.to_path_buf(),
        links: HashMap::new(),
        stats: DiffStats::default(),
    };
    w.tar.follow_symlinks(false);
    w.walk(Path::new(""))?;
    w.tar
        .finish()
        .map_err(Error::io("writing the layer of", upper))?;
    Ok(w.stats)
}

struct DiffWriter<W: Write> {
    tar: tar::Builder<W>,
    upper: PathBuf,
    /// (dev, ino) of multiply-linked files already written → their path in the layer.
    links: HashMap<(u64, u64), PathBuf>,
    stats: DiffStats,
}

impl<W: Write> DiffWriter<W> {
    fn walk(&mut self, rel: &Path) -> Result<()> {
        let dir = self.upper.join(rel);
        let mut children: Vec<_> = std::fs::read_dir(&dir)
            .map_err(Error::io("listing", &dir))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<io::Result<_>>()
            .map_err(Error::io("listing", &dir))?;
        children.sort();
        for name in children {
            let rel = rel.join(&name);
            let host = self.upper.join(&rel);
            let meta = std::fs::symlink_metadata(&host).map_err(Error::io("looking at", &host))?;
            let xattrs = list_xattrs(&host).map_err(Error::io("reading the xattrs of", &host))?;
            if xattrs
                .iter()
                .any(|(k, _)| k == "trusted.overlay.redirect" || k == "trusted.overlay.metacopy")
            {
                return Err(Error::BadEntry {
                    layer: self.upper.display().to_string(),
                    path: rel.display().to_string(),
                    problem: "an overlayfs redirect or metacopy entry (mount without redirect_dir/metacopy)".into(),
                });
            }
            let ft = meta.file_type();
            if ft.is_char_device() && meta.rdev() == 0 {
                let whiteout = rel.with_file_name(format!(".wh.{}", name.to_string_lossy()));
                self.append_empty(&whiteout, &meta)?;
                self.stats.whiteouts += 1;
                continue;
            }
            let opaque = ft.is_dir()
                && xattrs
                    .iter()
                    .any(|(k, v)| k == "trusted.overlay.opaque" && v == b"y");
            self.append(&rel, &host, &meta, &xattrs)?;
            if opaque {
                self.append_empty(&rel.join(".wh..wh..opq"), &meta)?;
                self.stats.opaque_dirs += 1;
            }
            if ft.is_dir() {
                self.walk(&rel)?;
            }
        }
        Ok(())
    }

    /// An empty regular file (whiteout markers), root-owned.
    fn append_empty(&mut self, rel: &Path, meta: &std::fs::Metadata) -> Result<()> {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(meta.mtime().max(0) as u64);
        h.set_size(0);
        self.tar
            .append_data(&mut h, rel, io::empty())
            .map_err(Error::io("writing a whiteout for", rel))
    }

    fn append(
        &mut self,
        rel: &Path,
        host: &Path,
        meta: &std::fs::Metadata,
        xattrs: &[(String, Vec<u8>)],
    ) -> Result<()> {
        let kept: Vec<(String, &[u8])> = xattrs
            .iter()
            .filter(|(k, _)| !k.starts_with(OVERLAY_XATTR_PREFIX))
            .map(|(k, v)| (format!("SCHILY.xattr.{k}"), v.as_slice()))
            .collect();
        if !kept.is_empty() {
            self.tar
                .append_pax_extensions(kept.iter().map(|(k, v)| (k.as_str(), *v)))
                .map_err(Error::io("writing the xattrs of", host))?;
        }
        let mut h = tar::Header::new_gnu();
        h.set_metadata_in_mode(meta, tar::HeaderMode::Complete);
        let ft = meta.file_type();
        let io_err = Error::io("writing to the layer", host);
        self.stats.entries += 1;
        if ft.is_file() && meta.nlink() > 1 {
            if let Some(first) = self.links.get(&(meta.dev(), meta.ino())) {
                h.set_entry_type(tar::EntryType::Link);
                h.set_size(0);
                let first = first.clone();
                return self.tar.append_link(&mut h, rel, &first).map_err(io_err);
            }
            self.links
                .insert((meta.dev(), meta.ino()), rel.to_path_buf());
        }
        if ft.is_file() {
            let file = std::fs::File::open(host).map_err(Error::io("opening", host))?;
            self.tar.append_data(&mut h, rel, file).map_err(io_err)
        } else if ft.is_symlink() {
            let target = std::fs::read_link(host).map_err(Error::io("reading symlink", host))?;
            h.set_size(0);
            self.tar.append_link(&mut h, rel, &target).map_err(io_err)
        } else {
            // Directories, devices, fifos: the header says it all.
            h.set_size(0);
            self.tar
                .append_data(&mut h, rel, io::empty())
                .map_err(io_err)
        }
    }
}

/// Every xattr of `path` itself (a symlink is not followed), values included.
fn list_xattrs(path: &Path) -> io::Result<Vec<(String, Vec<u8>)>> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
    let mut names = vec![0u8; 4096];
    // SAFETY: c is NUL-terminated; names is writable for its length.
    let len = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if len < 0 {
        let e = io::Error::last_os_error();
        // Filesystems without xattrs have none to export.
        return if e.raw_os_error() == Some(libc::ENOTSUP) {
            Ok(Vec::new())
        } else {
            Err(e)
        };
    }
    names.truncate(len as usize);
    let mut out = Vec::new();
    for name in names.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let cname = CString::new(name)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "xattr name"))?;
        let mut value = vec![0u8; 65536];
        // SAFETY: both strings are NUL-terminated; value is writable for its length.
        let n = unsafe {
            libc::lgetxattr(
                c.as_ptr(),
                cname.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        value.truncate(n as usize);
        out.push((String::from_utf8_lossy(name).into_owned(), value));
    }
    Ok(out)
}
