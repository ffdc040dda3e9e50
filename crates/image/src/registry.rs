//! Pulls an image from an OCI registry (the token exchange, manifests and blobs by
//! documents.rs): anonymous, basic or bearer auth, an index resolved to linux/amd64, plain
//! HTTP only for the hosts the caller lists. The
//! config and layers land in the [`BlobCache`] verified; cached layers are not fetched again.
//! Every connection goes through a guard proxy (guard.rs: no internal addresses, redirects
//! included); token answers, manifests and the config are read with a size cap
//! (documents.rs).

use crate::cache::BlobCache;
use crate::digest::{Digest, Hasher};
use crate::documents::{MAX_DOCUMENT_BYTES, Session};
use crate::guard::{Guard, Policy};
use crate::progress::{Event, Progress};
use crate::spec::{ImageConfigFile, ResolvedImage};
use crate::{Error, Limits, Result};
use futures_util::{StreamExt, TryStreamExt};
use oci_client::Reference;
use std::io::Write;

/// How to authenticate to the registry.
#[derive(Clone, Default)]
pub enum Auth {
    #[default]
    Anonymous,
    /// HTTP basic, or the credentials for a bearer-token realm (the registry's challenge
    /// decides).
    Basic { username: String, password: String },
    /// A ready bearer token.
    Bearer(String),
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::Anonymous => f.write_str("Anonymous"),
            Auth::Basic { username, .. } => write!(f, "Basic({username}, <redacted>)"),
            Auth::Bearer(_) => f.write_str("Bearer(<redacted>)"),
        }
    }
}

#[derive(Debug, Clone)]
pub struct PullOptions {
    pub auth: Auth,
    /// Registries (`host` or `host:port`, as in the reference) spoken to over plain HTTP.
    pub insecure_registries: Vec<String>,
    pub limits: Limits,
    /// Layers downloaded at once.
    pub concurrency: usize,
    /// Registries at internal addresses are pulled from (the CLI: its user is the host's
    /// operator); otherwise only those in `insecure_registries` are (the daemon, whose
    /// pulls a tenant asks for). The same holds for every hop of the pull (guard.rs).
    pub allow_internal: bool,
}

impl Default for PullOptions {
    fn default() -> Self {
        PullOptions {
            auth: Auth::Anonymous,
            insecure_registries: Vec::new(),
            limits: Limits::default(),
            concurrency: 3,
            allow_internal: false,
        }
    }
}

/// Parses `REF` as Docker does (`alpine` = `docker.io/library/alpine:latest`).
pub fn parse_reference(reference: &str) -> Result<Reference> {
    reference
        .parse::<Reference>()
        .map_err(|e| Error::Reference {
            reference: reference.into(),
            problem: e.to_string(),
        })
}

/// Refuses a registry whose host is, or resolves to, a loopback, link-local, private or
/// otherwise internal address, unless the caller lists it as an insecure registry (the
/// operator named it): a pull runs on the host, and a tenant's `fromImage` must not make it
/// reach the host's own services or the cloud metadata address. This says so early and
/// clearly; the pull's guard proxy (guard.rs) holds every connection, redirects included,
/// to the same rule.
async fn refuse_internal_registry(image: &Reference, options: &PullOptions) -> Result<()> {
    let host = image.resolve_registry();
    if options.allow_internal || options.insecure_registries.iter().any(|r| r == host) {
        return Ok(());
    }
    let refused = |problem: String| Error::Reference {
        reference: image.whole(),
        problem,
    };
    // `host`, `host:port`, `[v6]:port`.
    let (name, port) = match host.rsplit_once(':') {
        Some((n, p)) if !n.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => (
            n.trim_start_matches('[').trim_end_matches(']'),
            p.parse().unwrap_or(443),
        ),
        _ => (host, 443),
    };
    let addrs = tokio::net::lookup_host((name, port))
        .await
        .map_err(|e| refused(format!("resolving the registry {name}: {e}")))?;
    for addr in addrs {
        if internal_address(addr.ip()) {
            return Err(refused(format!(
                "the registry {host} is at {}, an internal address: refused (an operator \
                 allows it with sandcell serve --insecure-registry {host})",
                addr.ip()
            )));
        }
    }
    Ok(())
}

/// Loopback, link-local, private (RFC 1918, ULA), CGNAT, unspecified, multicast,
/// broadcast, NAT64 or discard-only: never a public registry (the egress rules' own list,
/// sandcell_net::reserved).
pub fn internal_address(ip: std::net::IpAddr) -> bool {
    sandcell_net::reserved::not_public(ip).is_some()
}

/// Pulls `reference` (by tag or `@sha256:` digest) into `cache`.
pub async fn pull(
    reference: &str,
    cache: &BlobCache,
    options: &PullOptions,
    progress: &dyn Progress,
) -> Result<ResolvedImage> {
    // reqwest is built without a default TLS provider (no aws-lc C build): ring it is. A
    // second call finds one installed and changes nothing.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let image = parse_reference(reference)?;
    refuse_internal_registry(&image, options).await?;
    // Every connection of this pull, redirects and token realms included, goes through the
    // guard (guard.rs says why a proxy).
    let guard = Guard::start(Policy {
        allow_internal: options.allow_internal,
        insecure: options.insecure_registries.clone(),
    })
    .await
    .map_err(Error::io("starting the pull's guard proxy", "127.0.0.1"))?;
    let result = pull_through(&image, reference, cache, options, progress, &guard).await;
    // A refused connection shows up as a proxy or 403 error of whichever client made it:
    // the guard's reason says what happened.
    match (result, guard.refusal()) {
        (Err(_), Some(why)) => Err(Error::PullRefused {
            reference: reference.into(),
            why,
        }),
        (result, _) => result,
    }
}

async fn pull_through(
    image: &Reference,
    reference: &str,
    cache: &BlobCache,
    options: &PullOptions,
    progress: &dyn Progress,
    guard: &Guard,
) -> Result<ResolvedImage> {
    let connect_timeout = std::time::Duration::from_secs(30);
    let read_timeout = std::time::Duration::from_secs(120);
    let http = reqwest::Client::builder()
        .proxy(
            reqwest::Proxy::all(guard.url()).map_err(|source| Error::Http {
                what: "the pull's guard proxy".into(),
                source,
            })?,
        )
        .connect_timeout(connect_timeout)
        .read_timeout(read_timeout)
        .redirect(reqwest::redirect::Policy::limited(5))
        .build()
        .map_err(|source| Error::Http {
            what: "an HTTP client for the pull".into(),
            source,
        })?;
    let registry = image.resolve_registry();
    let scheme = if options.insecure_registries.iter().any(|r| r == registry) {
        "http"
    } else {
        "https"
    };
    let session = Session {
        http,
        image,
        auth: &options.auth,
        root: format!("{scheme}://{registry}/v2/"),
        base: format!("{scheme}://{registry}/v2/{}/", image.repository()),
        authorization: std::sync::Mutex::new(None),
    };
    // Ask for the token (or find out it is basic auth) up front, so that bad credentials
    // say so rather than show up as a 401 on the manifest.
    session.authorize().await?;
    let (manifest, manifest_digest, list_digest) = crate::documents::manifest(
        &session,
        MAX_DOCUMENT_BYTES.min(options.limits.max_document_bytes),
    )
    .await?;
    if let Some(wanted) = image.digest() {
        // By digest: the registry's answer must be that document (the index's, when it is
        // an index).
        let got = list_digest
            .clone()
            .unwrap_or_else(|| manifest_digest.clone());
        Digest::parse(wanted)?.verify(&got, format!("manifest of {reference}"))?;
    }
    let config_digest = Digest::parse(&manifest.config.digest)?;
    let config = crate::documents::fetch(
        &session,
        &format!("blobs/{config_digest}"),
        options.limits.max_document_bytes,
    )
    .await?;
    let config = String::from_utf8(config).map_err(|_| Error::Manifest {
        what: format!("config of {reference}"),
        problem: "not UTF-8".into(),
    })?;

    let limit = options.limits.max_document_bytes;
    let (got, _) = cache.insert_from_reader(
        config.as_bytes(),
        Some(&config_digest),
        limit,
        "image config",
    )?;
    let config =
        ImageConfigFile::parse(config.as_bytes(), &format!("config {got} of {reference}"))?;

    let mut listed = Vec::new();
    for layer in &manifest.layers {
        let digest = Digest::parse(&layer.digest)?;
        let size = u64::try_from(layer.size).unwrap_or(0);
        if size > options.limits.max_blob_bytes {
            return Err(Error::TooLarge {
                layer: digest.to_string(),
                what: "the compressed layer".into(),
                limit: options.limits.max_blob_bytes,
                unit: "bytes",
            });
        }
        listed.push((digest, size));
    }
    let layers = ResolvedImage::layers_from(&listed, &config, reference)?;
    progress.event(Event::Resolved {
        manifest_digest: manifest_digest.to_string(),
        layers: listed.iter().map(|(d, s)| (d.to_string(), *s)).collect(),
    });

    futures_util::stream::iter(&listed)
        .map(|(digest, size)| fetch_layer(&session, digest, *size, cache, options.limits, progress))
        .buffer_unordered(options.concurrency.max(1))
        .try_collect::<Vec<()>>()
        .await?;

    Ok(ResolvedImage {
        source: reference.to_string(),
        manifest_digest,
        config,
        layers,
    })
}

async fn fetch_layer(
    session: &Session<'_>,
    digest: &Digest,
    size: u64,
    cache: &BlobCache,
    limits: Limits,
    progress: &dyn Progress,
) -> Result<()> {
    if cache.contains(digest) {
        progress.event(Event::LayerStart {
            digest: digest.to_string(),
            size,
            cached: true,
        });
        progress.event(Event::LayerDone {
            digest: digest.to_string(),
        });
        return Ok(());
    }
    progress.event(Event::LayerStart {
        digest: digest.to_string(),
        size,
        cached: false,
    });
    let mut response = session.get(&format!("blobs/{digest}"), None).await?;
    let (mut file, tmp) = cache.temp_file()?;
    let result: Result<Digest> = async {
        let mut hasher = Hasher::default();
        let mut bytes = 0u64;
        let limit = limits.max_blob_bytes;
        while let Some(chunk) = response.chunk().await.map_err(|source| Error::Http {
            what: format!("downloading layer {digest}"),
            source,
        })? {
            bytes += chunk.len() as u64;
            if bytes > limit || (size > 0 && bytes > size) {
                return Err(Error::TooLarge {
                    layer: digest.to_string(),
                    what: format!("the download (manifest says {size} bytes)"),
                    limit: if size > 0 { size.min(limit) } else { limit },
                    unit: "bytes",
                });
            }
            hasher.update(&chunk);
            // Small synchronous writes into the page cache: not worth a blocking thread.
            file.write_all(&chunk)
                .map_err(Error::io("writing layer", &tmp))?;
            progress.event(Event::LayerBytes {
                digest: digest.to_string(),
                bytes,
            });
        }
        file.flush().map_err(Error::io("writing layer", &tmp))?;
        Ok(hasher.finish())
    }
    .await;
    let actual = match result {
        Ok(d) => d,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    cache.commit(&tmp, digest, &actual, &format!("layer {digest}"))?;
    progress.event(Event::LayerDone {
        digest: digest.to_string(),
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses_are_known() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "64:ff9b::a9fe:a9fe",
        ] {
            assert!(internal_address(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["203.0.113.10", "8.8.8.8", "2606:4700::1111"] {
            assert!(!internal_address(ip.parse().unwrap()), "{ip}");
        }
    }

    #[tokio::test]
    async fn a_registry_on_loopback_is_refused_unless_listed() {
        let image = parse_reference("127.0.0.1:5000/app:v1").unwrap();
        let err = refuse_internal_registry(&image, &PullOptions::default())
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("internal address"), "{err}");
        let listed = PullOptions {
            insecure_registries: vec!["127.0.0.1:5000".into()],
            ..PullOptions::default()
        };
        assert!(refuse_internal_registry(&image, &listed).await.is_ok());
    }
}
