//! Root images: `<data-dir>/images/<name>/` holds `rootfs.ext4` (for microVMs) and the
//! unpacked tree `rootfs/` (for gVisor), both read-only to the runtimes. The agent lives at
//! [`AGENT_PATH`] in both.

use crate::{Error, Result};
use std::path::{Path, PathBuf};

/// Where every image carries the agent.
pub const AGENT_PATH: &str = "/sbin/sandcell-agent";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// What the user named (`minimal` or a path), for messages.
    pub name: String,
    /// The unpacked tree, if the image has one.
    pub rootfs_dir: Option<PathBuf>,
    /// The ext4 image, if the image has one.
    pub rootfs_ext4: Option<PathBuf>,
}

impl Image {
    /// `name_or_path` is an image name under `<images_dir>` (`minimal`), an image directory
    /// (holding `rootfs/` and/or `rootfs.ext4`), a root tree (holding `sbin/`), or an ext4 file.
    pub fn resolve(images_dir: &Path, name_or_path: &str) -> Result<Image> {
        let is_name = !name_or_path.is_empty()
            && name_or_path
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
            && !name_or_path.starts_with('.');
        let dir = if is_name {
            images_dir.join(name_or_path)
        } else {
            PathBuf::from(name_or_path)
        };
        let fail = |problem: String| Error::Image {
            image: name_or_path.to_string(),
            problem,
        };
        let meta = std::fs::metadata(&dir).map_err(|e| {
            fail(if is_name {
                format!(
                    "{} does not exist ({e}); build and install the images with `make images install` \
                     (or pass --image PATH / --data-dir)",
                    dir.display()
                )
            } else {
                format!("{}: {e}", dir.display())
            })
        })?;
        let dir =
            std::fs::canonicalize(&dir).map_err(|e| fail(format!("{}: {e}", dir.display())))?;
        let image = if meta.is_file() {
            Image {
                name: name_or_path.into(),
                rootfs_dir: None,
                rootfs_ext4: Some(dir),
            }
        } else if dir.join("sbin").is_dir() {
            Image {
                name: name_or_path.into(),
                rootfs_dir: Some(dir),
                rootfs_ext4: None,
            }
        } else {
            let tree = dir.join("rootfs");
            let ext4 = dir.join("rootfs.ext4");
            Image {
                name: name_or_path.into(),
                rootfs_dir: tree.is_dir().then_some(tree),
                rootfs_ext4: ext4.is_file().then_some(ext4),
            }
        };
        if image.rootfs_dir.is_none() && image.rootfs_ext4.is_none() {
            return Err(fail(
                "holds neither rootfs/ nor rootfs.ext4; rebuild it with `make images install`"
                    .into(),
            ));
        }
        Ok(image)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_names_dirs_trees_and_files() {
        let tmp = tempfile::tempdir().unwrap();
        let images = tmp.path().join("images");
        std::fs::create_dir_all(images.join("minimal/rootfs/sbin")).unwrap();
        std::fs::write(images.join("minimal/rootfs.ext4"), b"").unwrap();

        let named = Image::resolve(&images, "minimal").unwrap();
        assert!(named.rootfs_dir.unwrap().ends_with("minimal/rootfs"));
        assert!(named.rootfs_ext4.unwrap().ends_with("minimal/rootfs.ext4"));

        let tree = images.join("minimal/rootfs");
        let by_tree = Image::resolve(&images, tree.to_str().unwrap()).unwrap();
        assert!(by_tree.rootfs_ext4.is_none());

        let missing = Image::resolve(&images, "nope").unwrap_err().to_string();
        assert!(missing.contains("make images"), "{missing}");
    }
}
