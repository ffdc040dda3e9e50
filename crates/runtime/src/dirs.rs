//! Where Sandcell keeps things on the host.
//!
//! - data dir (`--data-dir`, `$SANDCELL_DATA_DIR`, default `/var/lib/sandcell`): images,
//!   kernels, runsc's state root, per-sandbox disk layers, host-probe caches.
//! - run dir (`$SANDCELL_RUN_DIR`, default `/run/sandcell`): one directory per live sandbox
//!   with its sockets, bundle, logs and owner record. Tests point both at temp dirs.

use std::path::{Path, PathBuf};

pub const DEFAULT_DATA_DIR: &str = "/var/lib/sandcell";
pub const DEFAULT_RUN_DIR: &str = "/run/sandcell";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dirs {
    pub data: PathBuf,
    pub run: PathBuf,
}

impl Dirs {
    pub fn new(data: impl Into<PathBuf>, run: impl Into<PathBuf>) -> Dirs {
        Dirs {
            data: data.into(),
            run: run.into(),
        }
    }

    /// `data` if given, else `$SANDCELL_DATA_DIR`, else the default; the run dir from
    /// `$SANDCELL_RUN_DIR` or the default.
    pub fn from_env(data: Option<PathBuf>) -> Dirs {
        let env = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        Dirs {
            data: data
                .or_else(|| env("SANDCELL_DATA_DIR"))
                .unwrap_or_else(|| DEFAULT_DATA_DIR.into()),
            run: env("SANDCELL_RUN_DIR").unwrap_or_else(|| DEFAULT_RUN_DIR.into()),
        }
    }

    pub fn images(&self) -> PathBuf {
        self.data.join("images")
    }

    pub fn default_kernel(&self) -> PathBuf {
        self.data.join("kernels/default/vmlinux")
    }

    /// runsc's `--root`: its container state.
    pub fn runsc_root(&self) -> PathBuf {
        self.data.join("runsc")
    }

    /// Per-sandbox files that live as long as the sandbox: sockets, bundle, logs.
    pub fn sandbox_run_dir(&self, id: &str) -> PathBuf {
        self.run.join(id)
    }

    /// Per-sandbox disk data (the microVM's writable disk layer).
    pub fn sandbox_state_dir(&self, id: &str) -> PathBuf {
        self.data.join("sandboxes").join(id)
    }

    /// Small host-probe caches (runsc capabilities, the microVM self-test verdict).
    pub fn cache_file(&self, name: &str) -> PathBuf {
        self.data.join("cache").join(name)
    }
}

/// Creates `path` and its parents with mode 0700 for the last component.
pub(crate) fn create_private_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::DirBuilder::new().mode(0o700).create(path)
}
