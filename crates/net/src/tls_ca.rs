//! The egress proxy's per-daemon certificate authority for intercepting TLS to
//! `network.rules` domains (issue 17). Loaded by `serve` unless `--no-egress-intercept-tls`
//! ([`crate::intercept`]); without it, TLS to a rule's domain passes through the SNI check
//! untouched.
//!
//! What it is for: the proxy terminates a sandbox's TLS to a rule's domain with a leaf
//! certificate for that name signed here, rewrites the requests (inject.rs), and opens its
//! own TLS to the real host. A sandbox trusts the leaf only because the CA certificate is
//! installed into its system store, so the CA key is what an operator must protect: whoever
//! holds it can impersonate any host to every sandbox of this daemon.
//!
//! Files, in the daemon's data dir: `egress-ca.key` (the key, PEM, 0600, created with
//! `O_EXCL`; a link there is refused) and `egress-ca.pem` (the certificate, public). Leaf
//! certificates are made in memory, one per domain, and kept for the daemon's life.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use sandcell_proto::sync::lock;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub const KEY_FILE: &str = "egress-ca.key";
pub const CERT_FILE: &str = "egress-ca.pem";
/// Bound on what is read back from either file.
const MAX_FILE: u64 = 64 * 1024;
/// Bound on the leaf certificates kept (one per rule domain in use).
const MAX_LEAVES: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {why}")]
    Bad { path: PathBuf, why: String },
    #[error("making a certificate: {0}")]
    Cert(#[from] rcgen::Error),
}

/// A leaf certificate (with the CA's after it) and its key, for a rustls server config.
pub type Leaf = (Vec<CertificateDer<'static>>, Arc<PrivateKeyDer<'static>>);

pub struct EgressCa {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
    leaves: Mutex<HashMap<String, Leaf>>,
}

/// The CA's name and constraints: the same every time, so that an issuer rebuilt from the
/// stored key signs as the stored certificate says.
fn ca_params() -> CertificateParams {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "Sandcell egress proxy CA");
    dn.push(DnType::OrganizationName, "Sandcell");
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    p
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> CaError + 'a {
    move |source| CaError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Reads a file of ours: never through a link, bounded.
fn read_own(path: &Path) -> Result<Option<String>, CaError> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path);
    let mut f = match f {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("opening", path)(e)),
    };
    let mut text = String::new();
    (&mut f)
        .take(MAX_FILE + 1)
        .read_to_string(&mut text)
        .map_err(io("reading", path))?;
    if text.len() as u64 > MAX_FILE {
        return Err(CaError::Bad {
            path: path.to_path_buf(),
            why: "larger than a CA file can be".into(),
        });
    }
    Ok(Some(text))
}

/// Writes a new file (never over one, never through a link) with `mode`.
fn write_new(path: &Path, text: &str, mode: u32) -> Result<(), CaError> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(io("creating", path))?;
    f.write_all(text.as_bytes()).map_err(io("writing", path))?;
    f.sync_all().map_err(io("syncing", path))
}

/// `pem` trimmed, if it is one PEM certificate block and nothing else.
fn only_one_certificate(pem: &str) -> Option<String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let t = pem.trim();
    (t.starts_with(BEGIN) && t.ends_with(END) && t.matches("-----BEGIN").count() == 1)
        .then(|| format!("{t}\n"))
}

impl EgressCa {
    /// The CA of the daemon whose data dir is `dir`: made on the first call (key 0600),
    /// read back after. A key file others may read is made 0600.
    pub fn load_or_create(dir: &Path) -> Result<EgressCa, CaError> {
        let key_path = dir.join(KEY_FILE);
        let cert_path = dir.join(CERT_FILE);
        let (key, cert_pem) = match (read_own(&key_path)?, read_own(&cert_path)?) {
            (Some(k), Some(c)) => {
                let key = KeyPair::from_pem(&k).map_err(|e| CaError::Bad {
                    path: key_path.clone(),
                    why: format!("not a private key: {e}"),
                })?;
                let mode = std::fs::symlink_metadata(&key_path)
                    .map_err(io("reading the mode of", &key_path))?
                    .permissions()
                    .mode();
                if mode & 0o077 != 0 {
                    tracing::warn!("{}: readable by others; made 0600", key_path.display());
                    std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600))
                        .map_err(io("restricting", &key_path))?;
                }
                (key, c)
            }
            (None, None) => {
                let key = KeyPair::generate()?;
                let cert = ca_params().self_signed(&key)?;
                // The key first: a crash between the two leaves a key without a
                // certificate, refused below rather than silently replaced.
                write_new(&key_path, &key.serialize_pem(), 0o600)?;
                write_new(&cert_path, &cert.pem(), 0o644)?;
                (key, cert.pem())
            }
            (Some(_), None) | (None, Some(_)) => {
                return Err(CaError::Bad {
                    path: dir.to_path_buf(),
                    why: format!("{KEY_FILE} and {CERT_FILE} go together: one is missing"),
                });
            }
        };
        // The file goes to every sandbox as it is: one certificate and nothing else (a
        // combined PEM with the key, or `openssl -text` output, must never reach a guest).
        let cert_pem = only_one_certificate(&cert_pem).ok_or_else(|| CaError::Bad {
            path: cert_path.clone(),
            why: "must hold exactly one PEM certificate and nothing else".into(),
        })?;
        let der = rustls::pki_types::pem::PemObject::from_pem_slice(cert_pem.as_bytes()).map_err(
            |e| CaError::Bad {
                path: cert_path.clone(),
                why: format!("not a PEM certificate: {e}"),
            },
        )?;
        Ok(EgressCa {
            cert_pem,
            cert_der: der,
            issuer: Issuer::new(ca_params(), key),
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate (PEM): what a sandbox's trust store gets.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A leaf certificate for `domain` (made once, then kept).
    pub fn leaf(&self, domain: &str) -> Result<Leaf, CaError> {
        let domain = domain.to_ascii_lowercase();
        if let Some(l) = lock(&self.leaves).get(&domain) {
            return Ok(l.clone());
        }
        let mut p = CertificateParams::new(vec![domain.clone()])?;
        p.distinguished_name = DistinguishedName::new();
        p.distinguished_name
            .push(DnType::CommonName, domain.as_str());
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate()?;
        let cert = p.signed_by(&key, &self.issuer)?;
        let leaf: Leaf = (
            vec![cert.der().clone(), self.cert_der.clone()],
            Arc::new(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
                key.serialize_der(),
            ))),
        );
        let mut leaves = lock(&self.leaves);
        if leaves.len() >= MAX_LEAVES {
            leaves.clear();
        }
        leaves.insert(domain, leaf.clone());
        Ok(leaf)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::{ServerName, UnixTime};

    fn verify(ca: &EgressCa, leaf: &Leaf, name: &str) -> bool {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.cert_der.clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let v =
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .unwrap();
        v.verify_server_cert(
            &leaf.0[0],
            &leaf.0[1..],
            &ServerName::try_from(name.to_string()).unwrap(),
            &[],
            UnixTime::now(),
        )
        .is_ok()
    }

    #[test]
    fn made_once_kept_private_and_its_leaves_verify_for_their_name_only() {
        let dir = tempfile_dir();
        let ca = EgressCa::load_or_create(&dir).unwrap();
        let mode = std::fs::metadata(dir.join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = EgressCa::load_or_create(&dir).unwrap();
        assert_eq!(again.cert_pem(), ca.cert_pem(), "read back, not made anew");
        // A leaf signed by the reloaded issuer verifies against the stored certificate.
        let leaf = again.leaf("API.example.com").unwrap();
        assert!(verify(&ca, &leaf, "api.example.com"));
        assert!(!verify(&ca, &leaf, "evil.example.net"));
        // Another daemon's CA does not vouch for it.
        let dir2 = tempfile_dir();
        let other = EgressCa::load_or_create(&dir2).unwrap();
        assert!(!verify(&other, &leaf, "api.example.com"));
        for d in [dir, dir2] {
            std::fs::remove_dir_all(d).unwrap();
        }
    }

    #[test]
    fn a_half_written_pair_or_a_link_is_refused() {
        let dir = tempfile_dir();
        EgressCa::load_or_create(&dir).unwrap();
        std::fs::remove_file(dir.join(CERT_FILE)).unwrap();
        assert!(EgressCa::load_or_create(&dir).is_err());
        let dir2 = tempfile_dir();
        std::os::unix::fs::symlink(dir.join(KEY_FILE), dir2.join(KEY_FILE)).unwrap();
        assert!(EgressCa::load_or_create(&dir2).is_err());
        for d in [dir, dir2] {
            std::fs::remove_dir_all(d).unwrap();
        }
    }

    #[test]
    fn a_certificate_file_with_anything_else_is_refused() {
        let dir = tempfile_dir();
        let ca = EgressCa::load_or_create(&dir).unwrap();
        let cert = ca.cert_pem().to_owned();
        let key = std::fs::read_to_string(dir.join(KEY_FILE)).unwrap();
        for bad in [
            format!("{cert}{key}"),
            format!("Bag Attributes\n{cert}"),
            format!("{cert}{cert}"),
        ] {
            std::fs::write(dir.join(CERT_FILE), &bad).unwrap();
            let err = EgressCa::load_or_create(&dir).err().expect("refused");
            assert!(err.to_string().contains("exactly one"), "{err}");
        }
        std::fs::write(dir.join(CERT_FILE), format!("\n{cert}\n\n")).unwrap();
        let again = EgressCa::load_or_create(&dir).unwrap();
        assert_eq!(again.cert_pem(), cert);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A fresh directory under the system temp dir (this crate has no tempfile).
    fn tempfile_dir() -> PathBuf {
        let hex = sandcell_proto::random::hex(8).unwrap();
        let d = std::env::temp_dir().join(format!("sc-ca-test-{hex}"));
        std::fs::create_dir(&d).unwrap();
        d
    }
}
