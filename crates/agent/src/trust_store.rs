//! `/init`'s `sandcellCaBundle`: the daemon's egress CA (issue 17), installed into the guest's
//! system trust store so that TLS the host's egress proxy intercepts (a `network.rules`
//! domain with a secret to inject) verifies inside the sandbox, with no `-k` and no code
//! change. Only for an agent that owns the guest's root (`--trust-root`, `/` in sandboxes):
//! an agent on a host never touches the host's store.
//!
//! What is written, under the trust root:
//! - the anchor `usr/local/share/ca-certificates/sandcell-egress.crt` (Debian's
//!   `update-ca-certificates` keeps it in the bundles it regenerates), and the same file in
//!   `etc/pki/ca-trust/source/anchors/` where that directory exists (Fedora, RHEL);
//! - a marked block appended to every bundle file that exists among [`BUNDLES`] (what curl,
//!   OpenSSL, Python's `ssl`, Go and most runtimes read), replaced by the next `/init`'s
//!   (idempotent: restores of one snapshot do not pile up blocks); Debian's bundle is created
//!   holding only the CA when the image has none at all.
//!
//! Each file is replaced atomically (written beside it, then renamed), so a process reading
//! the bundle meanwhile sees the old one or the new one. [`TRUST_ENV`] points the runtimes
//! that ignore the system store by default (Python `requests`/`httpx` use certifi, Node its
//! own copy of Mozilla's list) at it; the request's own env vars win over them.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use sandcell_proto::agent::MAX_INIT_CA_BUNDLE;

/// The bundle files, relative to the trust root, first the one created when none exists.
pub const BUNDLES: &[&str] = &[
    "etc/ssl/certs/ca-certificates.crt", // Debian, Ubuntu, Alpine, Arch
    "etc/pki/tls/certs/ca-bundle.crt",   // Fedora, RHEL
    "etc/ssl/ca-bundle.pem",             // openSUSE
    "etc/ssl/cert.pem",                  // Alpine, macOS-like layouts (often a link to the first)
];

/// Where the CA is kept as a file of its own (for `NODE_EXTRA_CA_CERTS` and
/// `update-ca-certificates`).
pub const ANCHOR: &str = "usr/local/share/ca-certificates/sandcell-egress.crt";
const RHEL_ANCHORS: &str = "etc/pki/ca-trust/source/anchors";

const BEGIN: &str = "# BEGIN sandcell egress CA (replaced at each sandbox start)\n";
const END: &str = "# END sandcell egress CA\n";

/// A bundle larger than this is not rewritten (Mozilla's is about 220 KiB).
const MAX_BUNDLE: u64 = 8 << 20;

/// Env vars that make the runtimes that skip the system store use it; `(name, path)` with
/// the path relative to the trust root.
const TRUST_ENV: &[(&str, &str)] = &[
    ("SSL_CERT_FILE", BUNDLES[0]),
    ("REQUESTS_CA_BUNDLE", BUNDLES[0]),
    ("NODE_EXTRA_CA_CERTS", ANCHOR),
];

#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("sandcellCaBundle is {0} bytes, more than {MAX_INIT_CA_BUNDLE}")]
    TooLarge(usize),
    #[error("sandcellCaBundle holds no PEM certificate")]
    NotPem,
    #[error("sandcellCaBundle holds a line that is not PEM")]
    Stray,
}

/// Checks that `pem` is only PEM certificates (and blank lines), bounded: it goes into
/// files every TLS client of the guest parses.
pub fn validate(pem: &str) -> Result<(), TrustError> {
    if pem.len() > MAX_INIT_CA_BUNDLE {
        return Err(TrustError::TooLarge(pem.len()));
    }
    let mut certs = 0;
    let mut inside = false;
    for line in pem.lines().map(str::trim_end) {
        match line {
            "-----BEGIN CERTIFICATE-----" if !inside => inside = true,
            "-----END CERTIFICATE-----" if inside => {
                inside = false;
                certs += 1;
            }
            "" if !inside => {}
            l if inside
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/' || b == b'=') => {}
            _ => return Err(TrustError::Stray),
        }
    }
    if certs == 0 || inside {
        return Err(TrustError::NotPem);
    }
    Ok(())
}

/// Installs `pem` (already [`validate`]d) under `root`; returns the env vars to default to.
/// Failures are logged per file: a store that cannot be written costs only interception.
pub fn install(root: &Path, pem: &str) -> BTreeMap<String, String> {
    let block = format!("{BEGIN}{}\n{END}", pem.trim_end());
    let anchor_body = format!("{}\n", pem.trim_end());
    let mut written = Vec::new();
    let mut anchors = vec![root.join(ANCHOR)];
    if root.join(RHEL_ANCHORS).is_dir() {
        anchors.push(root.join(RHEL_ANCHORS).join("sandcell-egress.crt"));
    }
    for path in anchors {
        report(&path, write_atomic(&path, anchor_body.as_bytes(), true));
    }
    let mut any = false;
    for rel in BUNDLES {
        let path = root.join(rel);
        // A link (Alpine's cert.pem) is followed to its file, once: the same file through
        // two names gets one block. Inside the guest, whatever a link points at is the
        // guest's own.
        let Ok(real) = std::fs::canonicalize(&path) else {
            continue;
        };
        any = true;
        if written.contains(&real) {
            continue;
        }
        report(&real, rewrite_bundle(&real, &block));
        written.push(real);
    }
    if !any {
        let path = root.join(BUNDLES[0]);
        report(&path, write_atomic(&path, block.as_bytes(), true));
    }
    TRUST_ENV
        .iter()
        .map(|(name, rel)| (name.to_string(), display(&Path::new("/").join(rel))))
        .collect()
}

fn display(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn report(path: &Path, r: io::Result<()>) {
    if let Err(e) = r {
        crate::log!(
            "/init: installing the egress CA into {}: {e}",
            path.display()
        );
    }
}

/// Replaces the marked block of the bundle at `path` (or appends one) with `block`.
fn rewrite_bundle(path: &Path, block: &str) -> io::Result<()> {
    let mut old = String::new();
    std::fs::File::open(path)?
        .take(MAX_BUNDLE + 1)
        .read_to_string(&mut old)?;
    if old.len() as u64 > MAX_BUNDLE {
        return Err(io::Error::other(format!(
            "larger than {MAX_BUNDLE} bytes: left alone"
        )));
    }
    let mut new = without_block(&old);
    if !new.is_empty() && !new.ends_with('\n') {
        new.push('\n');
    }
    new.push_str(block);
    if new == old {
        return Ok(());
    }
    write_atomic(path, new.as_bytes(), false)
}

/// `bundle` with every marked block taken out.
fn without_block(bundle: &str) -> String {
    let mut out = String::with_capacity(bundle.len());
    let mut rest = bundle;
    while let Some(start) = rest.find(BEGIN) {
        out.push_str(&rest[..start]);
        match rest[start..].find(END) {
            Some(end) => rest = &rest[start + end + END.len()..],
            // A cut block (a crash mid-write cannot make one: writes are atomic; a user's
            // edit can): drop it to the end rather than trust half of it.
            None => rest = "",
        }
    }
    out.push_str(rest);
    out
}

/// Writes `path` through a temporary file beside it and a rename; `mkdirs` creates the
/// directory first.
fn write_atomic(path: &Path, bytes: &[u8], mkdirs: bool) -> io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::other("no directory"))?;
    if mkdirs {
        std::fs::create_dir_all(dir)?;
    }
    let tmp: PathBuf = dir.join(format!(".sandcell-ca.{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&tmp)?;
    // Not synced: every `/init` writes it again; a crash leaves the old file or the new one.
    let done = f.write_all(bytes);
    drop(f);
    if let Err(e) = done.and_then(|()| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CERT: &str = "-----BEGIN CERTIFICATE-----\nQUJD\nREVG==\n-----END CERTIFICATE-----\n";
    const MOZILLA: &str = "-----BEGIN CERTIFICATE-----\nTU9a\n-----END CERTIFICATE-----\n";

    fn root(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("sc-trust-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn validate_takes_certificates_only() {
        validate(CERT).unwrap();
        validate(&format!("{CERT}\n{MOZILLA}")).unwrap();
        assert!(matches!(validate(""), Err(TrustError::NotPem)));
        assert!(matches!(
            validate("-----BEGIN CERTIFICATE-----\nQUJD\n"),
            Err(TrustError::NotPem)
        ));
        let key = "-----BEGIN PRIVATE KEY-----\nQUJD\n-----END PRIVATE KEY-----\n";
        assert!(matches!(validate(key), Err(TrustError::Stray)));
        let injected = format!("{CERT}# BEGIN sandcell egress CA\n");
        assert!(matches!(validate(&injected), Err(TrustError::Stray)));
        let huge = CERT.repeat(MAX_INIT_CA_BUNDLE / CERT.len() + 1);
        assert!(matches!(validate(&huge), Err(TrustError::TooLarge(_))));
    }

    #[test]
    fn appends_once_and_replaces_on_the_next_install() {
        let dir = root("replace");
        let bundle = dir.join(BUNDLES[0]);
        std::fs::create_dir_all(bundle.parent().unwrap()).unwrap();
        std::fs::write(&bundle, MOZILLA.trim_end()).unwrap();
        // Alpine's second name for the same file gets no second block.
        std::os::unix::fs::symlink("certs/ca-certificates.crt", dir.join(BUNDLES[3])).unwrap();
        let env = install(&dir, CERT);
        let first = std::fs::read_to_string(&bundle).unwrap();
        assert!(first.starts_with(MOZILLA), "{first}");
        assert_eq!(first.matches(CERT).count(), 1, "{first}");
        assert_eq!(
            std::fs::read_to_string(dir.join(ANCHOR)).unwrap(),
            CERT,
            "the anchor holds the CA alone"
        );
        assert_eq!(env["NODE_EXTRA_CA_CERTS"], format!("/{ANCHOR}"));
        assert_eq!(env["SSL_CERT_FILE"], format!("/{}", BUNDLES[0]));

        install(&dir, CERT);
        assert_eq!(
            std::fs::read_to_string(&bundle).unwrap(),
            first,
            "idempotent"
        );
        let other = CERT.replace("QUJD", "WFla");
        install(&dir, &other);
        let second = std::fs::read_to_string(&bundle).unwrap();
        assert!(second.starts_with(MOZILLA));
        assert!(
            !second.contains("QUJD") && second.contains("WFla"),
            "{second}"
        );
        assert!(
            std::fs::symlink_metadata(dir.join(BUNDLES[3]))
                .unwrap()
                .is_symlink()
        );
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(bundle.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("ca-certificates.crt")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_image_without_a_store_gets_one_and_a_cut_block_goes() {
        let dir = root("none");
        install(&dir, CERT);
        let made = std::fs::read_to_string(dir.join(BUNDLES[0])).unwrap();
        assert!(made.contains(CERT));
        let cut = format!("{MOZILLA}{BEGIN}-----BEGIN CERTIFICATE-----\n");
        assert_eq!(without_block(&cut), MOZILLA);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
