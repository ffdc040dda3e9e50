//! Secret values at rest: ChaCha20-Poly1305 (RFC 8439) under a key ring kept in
//! `<data-dir>/secrets.key`, a file of its own (0600) so that a copy of the database alone
//! reveals no value.
//!
//! The key file holds one key a line, `<kid> <32 bytes, base64>`, after `#` comments; the
//! first key seals new values, every key opens. Each sealed value names its key (`kid`) and
//! is bound to its secret and version by the associated data, so a ciphertext copied to
//! another row does not open. Rotation (docs/secrets.md) adds a key in front, reseals
//! every row under it, then drops the old key: a crash between the steps loses nothing.
//!
//! Values live in [`SecretValue`]: no `Display`, a `Debug` that prints no byte of it, and
//! wiped from memory on drop.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use std::fmt;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use zeroize::{Zeroize, Zeroizing};

/// The key file's name in the data dir.
pub const KEY_FILE: &str = "secrets.key";
const KEY_LEN: usize = 32;
const NONCE_LEN: usize = 12;
/// The key file is small; a bigger one is not ours.
const MAX_KEY_FILE: u64 = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum CryptoError {
    #[error("secrets key file {path}: {what}: {source}")]
    KeyFile {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The key file is not as this module writes it (the line, never its content).
    #[error("secrets key file {path}, line {line}: {what}")]
    KeyFileFormat {
        path: PathBuf,
        line: usize,
        what: &'static str,
    },
    #[error("secrets key file {0}: no key in it")]
    NoKey(PathBuf),
    #[error("reading random bytes for a secrets key or nonce: {0}")]
    Entropy(#[source] std::io::Error),
    #[error("sealing a secret value failed")]
    Seal,
    /// Wrong key, or a row that was changed or moved.
    #[error("a stored secret value (key {kid}) does not open: wrong key file or a changed row")]
    Open { kid: String },
    #[error("a stored secret value names key {0}, which the secrets key file does not hold")]
    UnknownKey(String),
    #[error("a stored secret value is not valid UTF-8")]
    NotUtf8,
}

/// A secret's value in memory: never printed, wiped on drop.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(Zeroizing<String>);

impl SecretValue {
    pub fn new(value: String) -> SecretValue {
        SecretValue(Zeroizing::new(value))
    }

    /// The value, for the one place that puts it on the wire (the egress proxy).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValue(<redacted>)")
    }
}

/// A value as stored: the key that sealed it, its nonce and ciphertext (with the tag).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    pub kid: String,
    pub nonce: Vec<u8>,
    pub ciphertext: Vec<u8>,
}

struct RingKey {
    kid: String,
    cipher: ChaCha20Poly1305,
}

/// The keys of `secrets.key`; the first seals.
pub struct KeyRing {
    keys: Vec<RingKey>,
}

impl fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kids: Vec<&str> = self.keys.iter().map(|k| k.kid.as_str()).collect();
        f.debug_struct("KeyRing").field("kids", &kids).finish()
    }
}

/// What a value is bound to: moving a ciphertext to another secret or version breaks it.
fn associated_data(secret_id: &str, version: i64) -> Vec<u8> {
    format!("sandcell-secret\0{secret_id}\0{version}").into_bytes()
}

/// What an egress proxy's password is bound to: its sandbox (a copy in another row does
/// not open).
fn proxy_associated_data(sandbox: &str) -> Vec<u8> {
    format!("sandcell-egress-proxy\0{sandbox}").into_bytes()
}

/// What a volume's own bucket credentials are bound to: their volume.
fn volume_storage_associated_data(volume: &str) -> Vec<u8> {
    format!("sandcell-volume-storage\0{volume}").into_bytes()
}

fn random<const N: usize>() -> Result<Zeroizing<[u8; N]>, CryptoError> {
    let mut buf = Zeroizing::new([0u8; N]);
    sandcell_proto::random::fill(buf.as_mut()).map_err(CryptoError::Entropy)?;
    Ok(buf)
}

/// A new key line: `k<8 hex> <base64>`.
fn new_key_line() -> Result<Zeroizing<String>, CryptoError> {
    use base64::Engine;
    let kid = sandcell_proto::random::hex(4).map_err(CryptoError::Entropy)?;
    let key = random::<KEY_LEN>()?;
    let b64 = Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(key.as_ref()));
    Ok(Zeroizing::new(format!("k{kid} {}\n", b64.as_str())))
}

const HEADER: &str = "# Sandcell secrets key ring: the first key seals new values, all open them.\n\
# Keep this file 0600 and back it up apart from the database (docs/secrets.md).\n";

impl KeyRing {
    /// The ring in `<data_dir>/secrets.key`, made with one new key on the first start.
    pub fn load_or_create(data_dir: &Path) -> Result<KeyRing, CryptoError> {
        let path = data_dir.join(KEY_FILE);
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
        {
            Ok(mut file) => {
                let line = new_key_line()?;
                let io = |what| {
                    let path = path.clone();
                    move |source| CryptoError::KeyFile { path, what, source }
                };
                file.write_all(HEADER.as_bytes())
                    .and_then(|()| file.write_all(line.as_bytes()))
                    .and_then(|()| file.sync_all())
                    .map_err(io("writing the new key"))?;
                tracing::info!("created the secrets key in {}", path.display());
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(source) => {
                return Err(CryptoError::KeyFile {
                    path,
                    what: "creating",
                    source,
                });
            }
        }
        KeyRing::load(&path)
    }

    /// Reads a key file, refusing a link and tightening a file others may read.
    pub fn load(path: &Path) -> Result<KeyRing, CryptoError> {
        use std::io::Read;
        let io = |what| {
            let path = path.to_path_buf();
            move |source| CryptoError::KeyFile { path, what, source }
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(io("opening (a symlink is refused)"))?;
        let meta = file.metadata().map_err(io("reading its mode"))?;
        if !meta.is_file() {
            return Err(CryptoError::KeyFileFormat {
                path: path.into(),
                line: 0,
                what: "not a regular file",
            });
        }
        if meta.permissions().mode() & 0o077 != 0 {
            file.set_permissions(std::fs::Permissions::from_mode(0o600))
                .map_err(io("making it private (0600)"))?;
            tracing::warn!("{}: was readable by others; made 0600", path.display());
        }
        let mut text = Zeroizing::new(String::new());
        file.take(MAX_KEY_FILE)
            .read_to_string(&mut text)
            .map_err(io("reading"))?;
        KeyRing::parse(path, &text)
    }

    fn parse(path: &Path, text: &str) -> Result<KeyRing, CryptoError> {
        use base64::Engine;
        let bad = |line, what| CryptoError::KeyFileFormat {
            path: path.into(),
            line,
            what,
        };
        let mut keys = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (kid, b64) = line
                .split_once(' ')
                .ok_or_else(|| bad(i + 1, "expected `<kid> <base64 key>`"))?;
            if kid.is_empty() || kid.len() > 32 || !kid.bytes().all(|b| b.is_ascii_alphanumeric()) {
                return Err(bad(i + 1, "the key id is not 1 to 32 letters and digits"));
            }
            let mut raw = Zeroizing::new(
                base64::engine::general_purpose::STANDARD
                    .decode(b64.trim())
                    .map_err(|_| bad(i + 1, "the key is not base64"))?,
            );
            if raw.len() != KEY_LEN {
                return Err(bad(i + 1, "the key is not 32 bytes"));
            }
            if keys.iter().any(|k: &RingKey| k.kid == kid) {
                return Err(bad(i + 1, "a key id appears twice"));
            }
            let key =
                Key::try_from(raw.as_slice()).map_err(|_| bad(i + 1, "the key is not 32 bytes"))?;
            raw.zeroize();
            keys.push(RingKey {
                kid: kid.to_string(),
                cipher: ChaCha20Poly1305::new(&key),
            });
        }
        if keys.is_empty() {
            return Err(CryptoError::NoKey(path.into()));
        }
        Ok(KeyRing { keys })
    }

    /// The id of the key that seals.
    pub fn current_kid(&self) -> &str {
        // `parse` refuses a ring without keys.
        self.keys.first().map_or("", |k| k.kid.as_str())
    }

    /// Seals `value` as version `version` of secret `secret_id`, under the first key.
    pub fn seal(
        &self,
        secret_id: &str,
        version: i64,
        value: &SecretValue,
    ) -> Result<Sealed, CryptoError> {
        self.seal_bound(&associated_data(secret_id, version), value)
    }

    /// Seals the egress proxy password of `sandbox` (networks/egress_proxy.rs).
    pub fn seal_proxy_password(
        &self,
        sandbox: &str,
        value: &SecretValue,
    ) -> Result<Sealed, CryptoError> {
        self.seal_bound(&proxy_associated_data(sandbox), value)
    }

    /// Opens what [`KeyRing::seal_proxy_password`] made for the same sandbox.
    pub fn open_proxy_password(
        &self,
        sandbox: &str,
        sealed: &Sealed,
    ) -> Result<SecretValue, CryptoError> {
        self.open_bound(&proxy_associated_data(sandbox), sealed)
    }

    /// Seals the bucket credentials of volume `volume` (volumes/storage.rs).
    pub fn seal_volume_storage(
        &self,
        volume: &str,
        value: &SecretValue,
    ) -> Result<Sealed, CryptoError> {
        self.seal_bound(&volume_storage_associated_data(volume), value)
    }

    /// Opens what [`KeyRing::seal_volume_storage`] made for the same volume.
    pub fn open_volume_storage(
        &self,
        volume: &str,
        sealed: &Sealed,
    ) -> Result<SecretValue, CryptoError> {
        self.open_bound(&volume_storage_associated_data(volume), sealed)
    }

    fn seal_bound(&self, aad: &[u8], value: &SecretValue) -> Result<Sealed, CryptoError> {
        let key = self.keys.first().ok_or(CryptoError::Seal)?;
        // Random 96-bit nonces: far below the birthday bound for the values one daemon
        // stores under one key.
        let nonce = random::<NONCE_LEN>()?;
        let ciphertext = key
            .cipher
            .encrypt(
                &Nonce::from(*nonce),
                Payload {
                    msg: value.expose().as_bytes(),
                    aad,
                },
            )
            .map_err(|_| CryptoError::Seal)?;
        Ok(Sealed {
            kid: key.kid.clone(),
            nonce: nonce.to_vec(),
            ciphertext,
        })
    }

    /// Opens what [`KeyRing::seal`] made for the same secret and version.
    pub fn open(
        &self,
        secret_id: &str,
        version: i64,
        sealed: &Sealed,
    ) -> Result<SecretValue, CryptoError> {
        self.open_bound(&associated_data(secret_id, version), sealed)
    }

    fn open_bound(&self, aad: &[u8], sealed: &Sealed) -> Result<SecretValue, CryptoError> {
        let key = self
            .keys
            .iter()
            .find(|k| k.kid == sealed.kid)
            .ok_or_else(|| CryptoError::UnknownKey(sealed.kid.clone()))?;
        let failed = || CryptoError::Open {
            kid: sealed.kid.clone(),
        };
        let nonce = Nonce::try_from(sealed.nonce.as_slice()).map_err(|_| failed())?;
        let plain = key
            .cipher
            .decrypt(
                &nonce,
                Payload {
                    msg: &sealed.ciphertext,
                    aad,
                },
            )
            .map_err(|_| failed())?;
        match String::from_utf8(plain) {
            Ok(s) => Ok(SecretValue::new(s)),
            Err(e) => {
                e.into_bytes().zeroize();
                Err(CryptoError::NotUtf8)
            }
        }
    }
}

/// Rotation's file steps (the command in docs/secrets.md does them around resealing):
/// writes `lines` (key lines as [`KeyRing::load`] reads them) to `path` atomically, 0600.
pub fn write_key_file(path: &Path, lines: &[Zeroizing<String>]) -> Result<(), CryptoError> {
    let tmp = path.with_extension("key.tmp");
    let io = |what| {
        let path = tmp.clone();
        move |source| CryptoError::KeyFile { path, what, source }
    };
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(io("creating"))?;
    file.write_all(HEADER.as_bytes()).map_err(io("writing"))?;
    for line in lines {
        file.write_all(line.as_bytes()).map_err(io("writing"))?;
    }
    file.sync_all().map_err(io("syncing"))?;
    // The rename is the commit: the old file or the new one, never half of one.
    std::fs::rename(&tmp, path).map_err(io("renaming into place"))?;
    Ok(())
}

/// The key lines of the file at `path` (comments dropped), for rotation.
pub fn key_lines(path: &Path) -> Result<Vec<Zeroizing<String>>, CryptoError> {
    // Parsing first checks every line.
    KeyRing::load(path)?;
    let text =
        Zeroizing::new(
            std::fs::read_to_string(path).map_err(|source| CryptoError::KeyFile {
                path: path.into(),
                what: "reading",
                source,
            })?,
        );
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| Zeroizing::new(format!("{l}\n")))
        .collect())
}

/// The lock a daemon holds on its key ring for as long as it runs, so that rotation
/// (which needs the daemon stopped: a running one would go on sealing with the old key)
/// can tell. `None`: another process holds it.
pub fn lock_key_ring(data_dir: &Path) -> Result<Option<std::fs::File>, CryptoError> {
    use std::os::fd::AsRawFd;
    let path = data_dir.join("secrets.key.lock");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(|source| CryptoError::KeyFile {
            path: path.clone(),
            what: "opening its lock",
            source,
        })?;
    // SAFETY: flock on a descriptor we own; no memory is passed.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(Some(file));
    }
    let e = std::io::Error::last_os_error();
    if e.kind() == std::io::ErrorKind::WouldBlock {
        return Ok(None);
    }
    Err(CryptoError::KeyFile {
        path,
        what: "locking",
        source: e,
    })
}

/// A new key line, for rotation.
pub fn generate_key_line() -> Result<Zeroizing<String>, CryptoError> {
    new_key_line()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_value_opens_only_as_the_secret_and_version_it_was_sealed_for() {
        let dir = tempfile::tempdir().unwrap();
        let ring = KeyRing::load_or_create(dir.path()).unwrap();
        let value = SecretValue::new("sk-live-123".into());
        let sealed = ring.seal("sec_a", 1, &value).unwrap();
        assert!(
            !sealed
                .ciphertext
                .windows(b"sk-live-123".len())
                .any(|w| w == b"sk-live-123")
        );
        assert_eq!(ring.open("sec_a", 1, &sealed).unwrap(), value);
        assert!(matches!(
            ring.open("sec_a", 2, &sealed),
            Err(CryptoError::Open { .. })
        ));
        assert!(matches!(
            ring.open("sec_b", 1, &sealed),
            Err(CryptoError::Open { .. })
        ));
        let mut flipped = sealed.clone();
        flipped.ciphertext[0] ^= 1;
        assert!(ring.open("sec_a", 1, &flipped).is_err());
        // Another daemon's key opens nothing.
        let other = tempfile::tempdir().unwrap();
        let other = KeyRing::load_or_create(other.path()).unwrap();
        assert!(other.open("sec_a", 1, &sealed).is_err());
    }

    #[test]
    fn the_key_file_is_made_once_private_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let first = KeyRing::load_or_create(dir.path()).unwrap();
        let path = dir.path().join(KEY_FILE);
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let sealed = first
            .seal("sec_x", 3, &SecretValue::new("v".into()))
            .unwrap();
        let again = KeyRing::load_or_create(dir.path()).unwrap();
        assert_eq!(again.current_kid(), first.current_kid());
        assert_eq!(again.open("sec_x", 3, &sealed).unwrap().expose(), "v");
        // Loosened by hand: tightened on load.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        KeyRing::load(&path).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    #[test]
    fn a_symlinked_or_malformed_key_file_is_refused_without_showing_it() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "x").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join(KEY_FILE)).unwrap();
        assert!(KeyRing::load_or_create(dir.path()).is_err());

        let path = dir.path().join("bad.key");
        std::fs::write(&path, "kabc notbase64!!\n").unwrap();
        let e = KeyRing::load(&path).unwrap_err().to_string();
        assert!(e.contains("line 1") && !e.contains("notbase64"), "{e}");
        std::fs::write(&path, "# only a comment\n").unwrap();
        assert!(matches!(KeyRing::load(&path), Err(CryptoError::NoKey(_))));
    }

    #[test]
    fn a_rotated_ring_opens_old_values_and_seals_with_the_new_key() {
        let dir = tempfile::tempdir().unwrap();
        let old = KeyRing::load_or_create(dir.path()).unwrap();
        let path = dir.path().join(KEY_FILE);
        let sealed = old
            .seal("sec_r", 1, &SecretValue::new("old".into()))
            .unwrap();
        let mut lines = vec![generate_key_line().unwrap()];
        lines.extend(key_lines(&path).unwrap());
        write_key_file(&path, &lines).unwrap();
        let ring = KeyRing::load(&path).unwrap();
        assert_ne!(ring.current_kid(), old.current_kid());
        assert_eq!(ring.open("sec_r", 1, &sealed).unwrap().expose(), "old");
        let new = ring
            .seal("sec_r", 2, &SecretValue::new("new".into()))
            .unwrap();
        assert_eq!(new.kid, ring.current_kid());
    }

    #[test]
    fn debug_shows_no_value() {
        let v = SecretValue::new("hunter2".into());
        assert!(!format!("{v:?}").contains("hunter2"));
        assert!(!format!("{:?}", Some(&v)).contains("hunter2"));
    }
}
