//! The jail `sandcell-vmm` enters (`--jail JSON`, a [`JailSpec`]) before it opens anything
//! of its VM: what a guest that escapes into the VMM process finds around it.
//!
//! In order, each step needing what the previous one still has:
//! 1. [`mounts::build_root`]: a private mount namespace, a tmpfs on `spec.root` holding only
//!    the bound host paths (at their own paths, so the VM configuration needs no rewriting),
//!    the listed device nodes owned by the jail's uid, and a /proc that shows only the jail's
//!    own processes. Needs CAP_SYS_ADMIN and CAP_MKNOD: before the credentials change.
//! 2. [`mounts::pivot_into`]: the tmpfs becomes `/`, the host's tree is detached, and the new
//!    root is made read-only (only writable binds take writes).
//! 3. [`creds::limit`]: rlimits (open files, file size, threads; core dumps are already off).
//!    Before the uid change, while the hard limits can still be set to anything.
//! 4. [`creds::drop_privileges`]: the capability bounding set emptied (needs CAP_SETPCAP),
//!    no supplementary groups, gid then uid (gid first: after the uid change it could no
//!    longer be changed), then `no_new_privs`. Changing every uid away from 0 clears the
//!    permitted, effective and ambient capabilities; [`creds::verify`] checks that none is
//!    left rather than trusting it.
//!
//! The seccomp filters come later, per thread (`crate::seccomp`): they forbid what setting up
//! the jail needs (mount, pivot_root, setresuid, ...).

mod creds;
mod mounts;

use sandcell_proto::vmm::JailSpec;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum JailError {
    #[error("invalid jail: {0}")]
    Invalid(String),
    #[error("jail: {what} failed on {path}: {source}")]
    Path {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("jail: {what} failed: {source}")]
    Sys {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("jail: capabilities left after dropping privileges: {0}")]
    CapabilitiesLeft(String),
}

impl JailError {
    fn sys(what: &'static str) -> JailError {
        JailError::Sys {
            what,
            source: std::io::Error::last_os_error(),
        }
    }

    /// A jail the runtime described wrongly (as opposed to a host that refused a step).
    pub fn is_bad_input(&self) -> bool {
        matches!(self, JailError::Invalid(_))
    }
}

/// Checks what can be checked before anything changes.
pub fn validate(spec: &JailSpec) -> Result<(), JailError> {
    if spec.uid == 0 || spec.gid == 0 {
        return Err(JailError::Invalid("uid and gid must not be 0".into()));
    }
    if !spec.root.is_absolute() {
        return Err(JailError::Invalid(format!(
            "root {} is not absolute",
            spec.root.display()
        )));
    }
    if spec.max_open_files < 16 || spec.max_threads < 2 {
        return Err(JailError::Invalid(
            "max_open_files must be at least 16 and max_threads at least 2".into(),
        ));
    }
    for bind in &spec.binds {
        mounts::check_host_path(&bind.path)?;
    }
    for dev in &spec.devices {
        mounts::check_host_path(dev)?;
    }
    Ok(())
}

/// Enters the jail: see the module documentation for the order and why. The process must
/// still be single-threaded (a new mount namespace and credentials apply to the caller, and
/// threads spawned before would keep the old ones).
pub fn enter(spec: &JailSpec) -> Result<(), JailError> {
    validate(spec)?;
    mounts::build_root(spec)?;
    mounts::pivot_into(&spec.root)?;
    creds::limit(spec)?;
    creds::drop_privileges(spec.uid, spec.gid)?;
    creds::verify()?;
    tracing::debug!(
        "jailed: uid {} gid {}, root {} with {} binds",
        spec.uid,
        spec.gid,
        spec.root.display(),
        spec.binds.len()
    );
    Ok(())
}
