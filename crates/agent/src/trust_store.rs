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
//! the bundle meanwhile sees the old one or the new one, and only when its content changes.
//! Env vars point the runtimes that ignore the system store by default at what was written:
//! `SSL_CERT_FILE` and `REQUESTS_CA_BUNDLE` (Python `requests`/`httpx` use certifi) name the
//! image's own bundle with the block, never a bundle made here (that would hold the CA alone
//! and cut those clients off every other host); `NODE_EXTRA_CA_CERTS` (added to Node's own
//! list) names the anchor. The request's own env vars win over them.
//!
//! An empty `sandcellCaBundle` (a daemon that does not intercept) takes all of it out again
//! ([`uninstall`]): a sandbox restored from a memory image of an intercepting daemon stops
//! trusting its CA. A copy of the CA that a program in the guest made (`update-ca-certificates`
//! regenerating the bundle from the anchor) is outside the block: it goes when the bundle is
//! regenerated again without the anchor.

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

/// Env vars naming the bundle with the block (for runtimes that read one file instead of
/// the system store).
const BUNDLE_ENV: &[&str] = &["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"];
/// The env var naming the anchor (certificates added to the runtime's own list).
const ANCHOR_ENV: &str = "NODE_EXTRA_CA_CERTS";

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

/// Installs `pem` (already [`validate`]d) under `root`; returns the env vars to default to
/// (only for files that now hold the CA). Failures are logged per file: a store that cannot
/// be written costs only interception.
pub fn install(root: &Path, pem: &str) -> BTreeMap<String, String> {
    let block = format!("{BEGIN}{}\n{END}", pem.trim_end());
    let anchor_body = format!("{}\n", pem.trim_end());
    let mut env = BTreeMap::new();
    for (i, path) in anchors(root).iter().enumerate() {
        let ok = report(path, write_if_changed(path, anchor_body.as_bytes()));
        if i == 0 && ok {
            env.insert(ANCHOR_ENV.to_owned(), guest_path(ANCHOR));
        }
    }
    let mut written = Vec::new();
    let mut any = false;
    for rel in BUNDLES {
        // A link (Alpine's cert.pem) is followed to its file, once: the same file through
        // two names gets one block. Inside the guest, whatever a link points at is the
        // guest's own.
        let Ok(real) = std::fs::canonicalize(root.join(rel)) else {
            continue;
        };
        any = true;
        if written.contains(&real) {
            continue;
        }
        if report(&real, rewrite_bundle(&real, Some(&block))) && !env.contains_key(BUNDLE_ENV[0]) {
            for name in BUNDLE_ENV {
                env.insert((*name).to_owned(), guest_path(rel));
            }
        }
        written.push(real);
    }
    if !any {
        let path = root.join(BUNDLES[0]);
        report(&path, write_if_changed(&path, block.as_bytes()));
    }
    env
}

/// Takes out what [`install`] put in, if it did (its anchor is there): the anchors, the
/// blocks, and a bundle that held nothing else.
pub fn uninstall(root: &Path) {
    let anchors = anchors(root);
    if !anchors[0].exists() {
        return;
    }
    let mut done = Vec::new();
    for rel in BUNDLES {
        let Ok(real) = std::fs::canonicalize(root.join(rel)) else {
            continue;
        };
        if !done.contains(&real) {
            report(&real, rewrite_bundle(&real, None));
            done.push(real);
        }
    }
    for path in anchors {
        if let Err(e) = std::fs::remove_file(&path)
            && e.kind() != io::ErrorKind::NotFound
        {
            report(&path, Err(e));
        }
    }
}

/// The anchor files: Debian's first (its presence marks an install), RHEL's where that
/// layout exists.
fn anchors(root: &Path) -> Vec<PathBuf> {
    let mut anchors = vec![root.join(ANCHOR)];
    if root.join(RHEL_ANCHORS).is_dir() {
        anchors.push(root.join(RHEL_ANCHORS).join("sandcell-egress.crt"));
    }
    anchors
}

/// `rel` as the guest's processes name it.
fn guest_path(rel: &str) -> String {
    display(&Path::new("/").join(rel))
}

fn display(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Logs a failure; whether it went well.
fn report(path: &Path, r: io::Result<()>) -> bool {
    match r {
        Ok(()) => true,
        Err(e) => {
            crate::log!("/init: the egress CA in {}: {e}", path.display());
            false
        }
    }
}

/// Replaces the marked block of the bundle at `path` (or appends one) with `block`; with
/// `None` takes it out (and removes a bundle left empty: one made by [`install`]).
fn rewrite_bundle(path: &Path, block: Option<&str>) -> io::Result<()> {
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
    let Some(block) = block else {
        if new == old {
            return Ok(());
        }
        if new.trim().is_empty() {
            return std::fs::remove_file(path);
        }
        return write_atomic(path, new.as_bytes(), false);
    };
    if !new.is_empty() && !new.ends_with('\n') {
        new.push('\n');
    }
    new.push_str(block);
    if new == old {
        return Ok(());
    }
    write_atomic(path, new.as_bytes(), false)
}

/// Writes `path` (creating its directory) unless it already holds `bytes`.
fn write_if_changed(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut old = Vec::new();
    if let Ok(f) = std::fs::File::open(path) {
        f.take(MAX_BUNDLE).read_to_end(&mut old)?;
        if old == bytes {
            return Ok(());
        }
    }
    write_atomic(path, bytes, true)
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
    fn the_env_names_the_images_own_bundle_and_uninstall_restores_it() {
        let dir = root("rhel");
        let rhel = dir.join(BUNDLES[1]);
        std::fs::create_dir_all(rhel.parent().unwrap()).unwrap();
        std::fs::create_dir_all(dir.join(RHEL_ANCHORS)).unwrap();
        std::fs::write(&rhel, MOZILLA).unwrap();
        let env = install(&dir, CERT);
        assert_eq!(env["SSL_CERT_FILE"], format!("/{}", BUNDLES[1]));
        assert_eq!(env["REQUESTS_CA_BUNDLE"], format!("/{}", BUNDLES[1]));
        assert!(
            !dir.join(BUNDLES[0]).exists(),
            "no Debian bundle is made beside RHEL's"
        );
        let rhel_anchor = dir.join(RHEL_ANCHORS).join("sandcell-egress.crt");
        assert_eq!(std::fs::read_to_string(&rhel_anchor).unwrap(), CERT);
        assert!(std::fs::read_to_string(&rhel).unwrap().contains(CERT));
        uninstall(&dir);
        assert_eq!(std::fs::read_to_string(&rhel).unwrap(), MOZILLA);
        assert!(!rhel_anchor.exists() && !dir.join(ANCHOR).exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_image_without_a_store_gets_one_and_a_cut_block_goes() {
        let dir = root("none");
        let env = install(&dir, CERT);
        let made = std::fs::read_to_string(dir.join(BUNDLES[0])).unwrap();
        assert!(made.contains(CERT));
        // A bundle of the CA alone is named by no env var: Python's certifi stays in use
        // for every other host.
        assert_eq!(env.keys().collect::<Vec<_>>(), vec![ANCHOR_ENV]);
        uninstall(&dir);
        assert!(!dir.join(BUNDLES[0]).exists(), "the bundle made here goes");
        uninstall(&dir);
        let cut = format!("{MOZILLA}{BEGIN}-----BEGIN CERTIFICATE-----\n");
        assert_eq!(without_block(&cut), MOZILLA);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
