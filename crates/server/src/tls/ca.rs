//! The daemon's local certificate authority: made once in a directory of the data dir
//! (`ca.pem`, the certificate to trust; `ca.key`, its key, mode 0600) and loaded on every
//! later start; it signs leaf certificates for the names the daemon serves over TLS
//! (`--domain` without `--tls-cert`: `*.D` and `D`).
//!
//! Self-contained on purpose (rcgen, rustls' key types, std): nothing else of the daemon is
//! used, so another user of a local CA can share this one.
//!
//! The issuer is rebuilt from the key at each load (rcgen cannot read a certificate without
//! x509-parser): its subject is derived from the key alone ([`ca_params`]), so leaves
//! signed after a restart chain to the `ca.pem` a user trusted once.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SerialNumber,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The CA's certificate file (PEM), what users add to their trust store.
pub const CA_CERT_FILE: &str = "ca.pem";
/// The CA's private key (PKCS#8 PEM, 0600).
pub const CA_KEY_FILE: &str = "ca.key";

/// How long the CA is valid from its creation.
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 86_400);
/// How long a leaf is valid from its issue: under the 398 days browsers accept; leaves are
/// issued anew at every daemon start.
const LEAF_VALIDITY: Duration = Duration::from_secs(397 * 86_400);
/// Backdating, for hosts whose clocks are a little behind.
const BACKDATE: Duration = Duration::from_secs(86_400);
/// Larger files are not ours.
const MAX_FILE: u64 = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not a CA file of ours: {why}", path.display())]
    Invalid { path: PathBuf, why: String },
    #[error("making a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("getrandom for a certificate serial: {0}")]
    Random(std::io::Error),
}

/// A leaf: its chain (leaf first, then the CA) and its key, as rustls takes them.
pub type Leaf = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

/// The CA, loaded.
pub struct DaemonCa {
    cert_path: PathBuf,
    cert: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for DaemonCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DaemonCa")
            .field("cert_path", &self.cert_path)
            .finish_non_exhaustive()
    }
}

impl DaemonCa {
    /// Loads the CA of `dir`, creating `dir` (0700 for a new one) and the CA in it when it
    /// has none. A key without its certificate gets a new certificate (the same subject and
    /// key, so earlier leaves still chain to it).
    pub fn load_or_create(dir: &Path) -> Result<DaemonCa, CaError> {
        let io = |what, path: &Path| {
            let path = path.to_path_buf();
            move |source| CaError::Io { what, path, source }
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io("creating", dir))?;
        let key_path = dir.join(CA_KEY_FILE);
        let cert_path = dir.join(CA_CERT_FILE);
        let key = match read_bounded(&key_path) {
            Ok(pem) => KeyPair::from_pem(&pem).map_err(|e| CaError::Invalid {
                path: key_path.clone(),
                why: e.to_string(),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = KeyPair::generate()?;
                write_new(&key_path, key.serialize_pem().as_bytes(), 0o600)
                    .map_err(io("writing", &key_path))?;
                // A certificate of an older key is of no use now.
                let _ = std::fs::remove_file(&cert_path);
                key
            }
            Err(e) => return Err(io("reading", &key_path)(e)),
        };
        let params = ca_params(&key);
        let cert = match read_bounded(&cert_path) {
            Ok(pem) => parse_cert(&pem).ok_or_else(|| CaError::Invalid {
                path: cert_path.clone(),
                why: "no PEM certificate in it".into(),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut params = params.clone();
                params.serial_number = Some(random_serial()?);
                let (not_before, not_after) = validity(CA_VALIDITY);
                params.not_before = not_before;
                params.not_after = not_after;
                let cert = params.self_signed(&key)?;
                // Readable by all: it is what users copy into their trust stores.
                write_new(&cert_path, cert.pem().as_bytes(), 0o644)
                    .map_err(io("writing", &cert_path))?;
                cert.der().clone()
            }
            Err(e) => return Err(io("reading", &cert_path)(e)),
        };
        Ok(DaemonCa {
            cert_path,
            cert,
            issuer: Issuer::new(params, key),
        })
    }

    /// Where the CA certificate is (to trust it: `SSL_CERT_FILE`, the system store).
    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    /// The CA certificate (DER).
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert
    }

    /// A server certificate for `names` (DNS names, `*.example.test` wildcards allowed; the
    /// first is also its common name) with a fresh key.
    pub fn issue_leaf(&self, names: &[String]) -> Result<Leaf, CaError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names.to_vec())?;
        let mut dn = DistinguishedName::new();
        if let Some(first) = names.first() {
            dn.push(DnType::CommonName, first.as_str());
        }
        params.distinguished_name = dn;
        params.serial_number = Some(random_serial()?);
        let (not_before, not_after) = validity(LEAF_VALIDITY);
        params.not_before = not_before;
        params.not_after = not_after;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &self.issuer)?;
        let key = PrivatePkcs8KeyDer::from(key.serialize_der());
        Ok((vec![cert.der().clone(), self.cert.clone()], key.into()))
    }
}

/// What the CA's certificate says, from its key alone: the subject names the key's hash, so
/// two daemons' CAs on one host (other data dirs) never share a subject in a trust store.
fn ca_params(key: &KeyPair) -> CertificateParams {
    let id = Sha256::digest(key.public_key_raw());
    let short: String = id[..4].iter().map(|b| format!("{b:02x}")).collect();
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Sandcell");
    dn.push(DnType::CommonName, format!("Sandcell local CA {short}"));
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

fn validity(length: Duration) -> (time::OffsetDateTime, time::OffsetDateTime) {
    let now = time::OffsetDateTime::now_utc();
    (now - BACKDATE, now + length)
}

/// 16 random bytes, top bit clear (a positive integer in at most 20 bytes, RFC 5280).
fn random_serial() -> Result<SerialNumber, CaError> {
    let mut bytes = [0u8; 16];
    getrandom(&mut bytes).map_err(CaError::Random)?;
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    Ok(SerialNumber::from_slice(&bytes))
}

fn getrandom(buf: &mut [u8]) -> std::io::Result<()> {
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
}

/// The first certificate of a PEM text.
pub fn parse_cert(pem: &str) -> Option<CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem.as_bytes()).next()?.ok()
}

/// A file of ours, not a link, read whole up to [`MAX_FILE`].
fn read_bounded(path: &Path) -> std::io::Result<String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    let mut text = String::new();
    file.take(MAX_FILE).read_to_string(&mut text)?;
    Ok(text)
}

/// Writes a new file with `mode` through a temporary name, so a crash leaves either no file
/// or a whole one.
fn write_new(path: &Path, data: &[u8], mode: u32) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)?;
    file.write_all(data)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn verify(ca: &CertificateDer<'static>, leaf: &Leaf, name: &str) -> Result<(), String> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.clone()).map_err(|e| e.to_string())?;
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(roots.into(), provider)
                .build()
                .map_err(|e| e.to_string())?;
        use rustls::client::danger::ServerCertVerifier;
        let name =
            rustls::pki_types::ServerName::try_from(name.to_string()).map_err(|e| e.to_string())?;
        verifier
            .verify_server_cert(
                &leaf.0[0],
                &leaf.0[1..],
                &name,
                &[],
                rustls::pki_types::UnixTime::now(),
            )
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn made_once_loaded_after_and_leaves_chain_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let ca_dir = dir.path().join("tls");
        let ca = DaemonCa::load_or_create(&ca_dir).unwrap();
        let key_mode = std::fs::metadata(ca_dir.join(CA_KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(key_mode & 0o777, 0o600);
        let names = vec!["*.sandbox.test".to_string(), "sandbox.test".to_string()];
        let leaf = ca.issue_leaf(&names).unwrap();
        verify(ca.cert_der(), &leaf, "49983-sc-1.sandbox.test").unwrap();
        verify(ca.cert_der(), &leaf, "sandbox.test").unwrap();
        // names the leaf was not made for
        assert!(verify(ca.cert_der(), &leaf, "a.b.sandbox.test").is_err());
        assert!(verify(ca.cert_der(), &leaf, "example.com").is_err());

        // a restart: the same CA certificate, and new leaves chain to the first one
        let again = DaemonCa::load_or_create(&ca_dir).unwrap();
        assert_eq!(again.cert_der(), ca.cert_der());
        verify(
            ca.cert_der(),
            &again.issue_leaf(&names).unwrap(),
            "8000-x.sandbox.test",
        )
        .unwrap();

        // another CA does not vouch for this one's leaves
        let other = DaemonCa::load_or_create(&dir.path().join("other")).unwrap();
        assert!(verify(other.cert_der(), &leaf, "49983-sc-1.sandbox.test").is_err());

        // the certificate lost: remade from the key, and the old leaves chain to it
        std::fs::remove_file(ca_dir.join(CA_CERT_FILE)).unwrap();
        let remade = DaemonCa::load_or_create(&ca_dir).unwrap();
        assert_ne!(remade.cert_der(), ca.cert_der());
        verify(remade.cert_der(), &leaf, "49983-sc-1.sandbox.test").unwrap();
    }

    #[test]
    fn a_link_or_garbage_in_place_of_the_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("elsewhere"), "x").unwrap();
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), dir.path().join(CA_KEY_FILE))
            .unwrap();
        assert!(DaemonCa::load_or_create(dir.path()).is_err());
        std::fs::remove_file(dir.path().join(CA_KEY_FILE)).unwrap();
        std::fs::write(dir.path().join(CA_KEY_FILE), "not a key").unwrap();
        let e = DaemonCa::load_or_create(dir.path()).unwrap_err();
        assert!(matches!(e, CaError::Invalid { .. }), "{e}");
    }
}
