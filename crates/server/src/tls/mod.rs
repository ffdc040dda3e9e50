//! HTTPS port URLs: with `--domain D` the daemon also listens for TLS (`--https-port`,
//! 443 by default) and answers `https://<port>-<sandboxID>.D` there through the same proxy
//! as the plain port (http/proxy.rs routes by Host; the accept loop is http/listener.rs).
//! The certificate is the operator's (`--tls-cert`, `--tls-key`: a wildcard for `*.D`), or
//! else a leaf for `*.D` and `D` from the daemon's own CA ([`ca`], made once under
//! `<data-dir>/tls/`).

pub mod ca;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where the daemon's CA lives in its data dir.
pub fn ca_dir(data: &Path) -> PathBuf {
    data.join("tls")
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(transparent)]
    Ca(#[from] ca::CaError),
    #[error("{}: {why}", path.display())]
    File { path: PathBuf, why: String },
    #[error("--tls-cert and --tls-key go together")]
    HalfPair,
    #[error("the TLS certificate and key: {0}")]
    Rustls(#[from] rustls::Error),
}

/// What the HTTPS listener serves with.
pub struct TlsSetup {
    pub config: Arc<ServerConfig>,
    /// The daemon's CA certificate, when the leaf is the daemon's own (to tell users what to
    /// trust).
    pub ca_cert: Option<PathBuf>,
}

/// The server configuration for `domain`: the operator's certificate and key when given,
/// else a leaf of the CA in `ca_dir`. HTTP/1.1 only (the proxy's protocol).
pub fn setup(
    domain: &str,
    cert: Option<&Path>,
    key: Option<&Path>,
    ca_dir: &Path,
) -> Result<TlsSetup, TlsError> {
    let (chain, key, ca_cert) = match (cert, key) {
        (Some(cert), Some(key)) => (read_chain(cert)?, read_key(key)?, None),
        (None, None) => {
            let ca = ca::DaemonCa::load_or_create(ca_dir)?;
            let (chain, key) = ca.issue_leaf(&[format!("*.{domain}"), domain.to_string()])?;
            (chain, key, Some(ca.cert_path().to_path_buf()))
        }
        _ => return Err(TlsError::HalfPair),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsSetup {
        config: Arc::new(config),
        ca_cert,
    })
}

fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |why: String| TlsError::File {
        path: path.to_path_buf(),
        why,
    };
    let chain = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if chain.is_empty() {
        return Err(bad("no PEM certificate in it".into()));
    }
    Ok(chain)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::File {
        path: path.to_path_buf(),
        why: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operators_pair_or_the_daemons_ca() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca_dir(dir.path());
        let own = setup("sandbox.test", None, None, &ca).unwrap();
        assert_eq!(
            own.ca_cert.as_deref(),
            Some(ca.join(ca::CA_CERT_FILE).as_path())
        );

        // an operator's pair (here one the CA issued, written out as PEM)
        let issuer = ca::DaemonCa::load_or_create(&ca).unwrap();
        let (chain, key) = issuer.issue_leaf(&["*.example.test".into()]).unwrap();
        let pem = |label: &str, der: &[u8]| {
            use base64::Engine;
            let b64 = base64::engine::general_purpose::STANDARD.encode(der);
            format!("-----BEGIN {label}-----\n{b64}\n-----END {label}-----\n")
        };
        let cert_file = dir.path().join("cert.pem");
        let key_file = dir.path().join("key.pem");
        std::fs::write(&cert_file, pem("CERTIFICATE", &chain[0])).unwrap();
        std::fs::write(&key_file, pem("PRIVATE KEY", key.secret_der())).unwrap();
        let given = setup("example.test", Some(&cert_file), Some(&key_file), &ca).unwrap();
        assert!(given.ca_cert.is_none());

        assert!(matches!(
            setup("example.test", Some(&cert_file), None, &ca),
            Err(TlsError::HalfPair)
        ));
        // a key that is not the certificate's
        let other = dir.path().join("other.pem");
        let (_, other_key) = issuer.issue_leaf(&["x.test".into()]).unwrap();
        std::fs::write(&other, pem("PRIVATE KEY", other_key.secret_der())).unwrap();
        assert!(setup("example.test", Some(&cert_file), Some(&other), &ca).is_err());
        // not PEM
        assert!(setup("example.test", Some(&key_file), Some(&key_file), &ca).is_err());
    }
}
