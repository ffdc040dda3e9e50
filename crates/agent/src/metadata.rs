//! User metadata on files (envd >= 0.6.2): `X-Metadata-<key>: <value>` upload headers stored
//! as `user.e2b.<key>` extended attributes, and read back into `EntryInfo.metadata`.

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

pub const XATTR_PREFIX: &str = "user.e2b.";
/// The VFS limit on xattr names (255) minus the prefix.
pub const MAX_KEY_LEN: usize = 255 - XATTR_PREFIX.len();
/// Keys (with the prefix) plus values, per file.
pub const MAX_TOTAL_LEN: usize = 4096;
/// Bound on the attribute-name list read from a file.
const MAX_LIST: usize = 64 * 1024;

/// Checks a metadata map the way envd does; the error text is the client's 400 message.
pub fn validate(metadata: &BTreeMap<String, String>) -> Result<(), String> {
    let mut total = 0;
    for (k, v) in metadata {
        if k.is_empty() {
            return Err("metadata key must not be empty".to_owned());
        }
        if k.len() > MAX_KEY_LEN {
            return Err(format!("metadata key {k:?} exceeds {MAX_KEY_LEN} bytes"));
        }
        for (label, s) in [("key".to_owned(), k), (format!("value for key {k:?}"), v)] {
            if let Some((i, c)) = s
                .bytes()
                .enumerate()
                .find(|(_, c)| !(0x20..=0x7e).contains(c))
            {
                return Err(format!(
                    "metadata {label} contains non-printable-ASCII byte 0x{c:02x} at offset {i}"
                ));
            }
        }
        total += XATTR_PREFIX.len() + k.len() + v.len();
    }
    if total > MAX_TOTAL_LEN {
        return Err(format!(
            "total metadata size {total} exceeds {MAX_TOTAL_LEN} bytes"
        ));
    }
    Ok(())
}

fn unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOTSUP))
}

fn cpath(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Splits a NUL-separated name list, keeping ours.
fn our_names(list: &[u8]) -> Vec<Vec<u8>> {
    list.split(|b| *b == 0)
        .filter(|n| n.starts_with(XATTR_PREFIX.as_bytes()))
        .map(<[u8]>::to_vec)
        .collect()
}

/// The metadata of `path` (not following a final symlink); empty where xattrs are unsupported.
pub fn read(path: &Path) -> io::Result<BTreeMap<String, String>> {
    let p = cpath(path)?;
    let mut list = vec![0u8; MAX_LIST];
    // SAFETY: llistxattr writes at most `list.len()` bytes into the live buffer.
    let n = unsafe { libc::llistxattr(p.as_ptr(), list.as_mut_ptr().cast(), list.len()) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if unsupported(&e) {
            Ok(BTreeMap::new())
        } else {
            Err(e)
        };
    }
    let mut out = BTreeMap::new();
    for name in our_names(&list[..n as usize]) {
        let Ok(cname) = CString::new(name.clone()) else {
            continue;
        };
        let mut value = vec![0u8; MAX_TOTAL_LEN];
        // SAFETY: lgetxattr writes at most `value.len()` bytes into the live buffer.
        let len = unsafe {
            libc::lgetxattr(
                p.as_ptr(),
                cname.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        if len < 0 {
            continue; // removed meanwhile, or larger than any value we write
        }
        value.truncate(len as usize);
        let key = String::from_utf8_lossy(&name[XATTR_PREFIX.len()..]).into_owned();
        if let Ok(v) = String::from_utf8(value) {
            out.insert(key, v);
        }
    }
    Ok(out)
}

/// Replaces the metadata of an open file with `metadata` (keys absent are removed). Returns
/// `Ok(false)` when the filesystem has no xattrs (the caller logs and carries on, as envd).
pub fn write(fd: RawFd, metadata: &BTreeMap<String, String>) -> io::Result<bool> {
    let mut list = vec![0u8; MAX_LIST];
    // SAFETY: flistxattr writes at most `list.len()` bytes into the live buffer.
    let n = unsafe { libc::flistxattr(fd, list.as_mut_ptr().cast(), list.len()) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if unsupported(&e) { Ok(false) } else { Err(e) };
    }
    for name in our_names(&list[..n as usize]) {
        let key = OsStr::from_bytes(&name[XATTR_PREFIX.len()..]);
        if key.to_str().is_some_and(|k| metadata.contains_key(k)) {
            continue;
        }
        let Ok(cname) = CString::new(name) else {
            continue;
        };
        // SAFETY: fremovexattr with a NUL-terminated name on a descriptor the caller owns.
        if unsafe { libc::fremovexattr(fd, cname.as_ptr()) } < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENODATA) {
                return Err(e);
            }
        }
    }
    for (k, v) in metadata {
        let cname = CString::new(format!("{XATTR_PREFIX}{k}"))
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: fsetxattr reads `v.len()` bytes from the live value and a NUL-terminated
        // name, on a descriptor the caller owns.
        if unsafe { libc::fsetxattr(fd, cname.as_ptr(), v.as_ptr().cast(), v.len(), 0) } < 0 {
            let e = io::Error::last_os_error();
            return if unsupported(&e) { Ok(false) } else { Err(e) };
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_like_envd() {
        let ok: BTreeMap<_, _> = [("a".to_owned(), "b c".to_owned())].into();
        assert!(validate(&ok).is_ok());
        let bad: BTreeMap<_, _> = [("a".to_owned(), "\u{1}".to_owned())].into();
        assert!(validate(&bad).is_err());
        let long: BTreeMap<_, _> = [("k".repeat(MAX_KEY_LEN + 1), String::new())].into();
        assert!(validate(&long).is_err());
        let big: BTreeMap<_, _> = [("k".to_owned(), "v".repeat(MAX_TOTAL_LEN))].into();
        assert!(validate(&big).is_err());
    }
}
