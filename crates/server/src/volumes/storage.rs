//! "Bring your own bucket": a volume whose content lives in the key's own S3-compatible
//! bucket (`POST /volumes {"name", "storage": {...}}`) instead of the operator's. What the
//! key gives is checked before anything is stored: the endpoint must be public (not the
//! host's loopback, private or link-local services, unless the operator allows it with
//! `serve --volume-storage-allow-private`), and the bucket must answer a list under the
//! prefix with these credentials. The credentials are sealed with the secrets key ring,
//! bound to the volume's id, and never returned or logged (`Debug` hides them).

use super::bucket::{Bucket, BucketError};
use super::config::{S3Config, S3Credentials, bucket_url};
use crate::secrets::crypto::{CryptoError, KeyRing, Sealed, SecretValue};
use base64::Engine;
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, SocketAddr};

/// `storage` of `POST /volumes`: the key's own bucket. Write-only: the credentials are
/// never returned.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StorageSpec {
    /// `http://` or `https://` endpoint, no path.
    pub endpoint: String,
    pub bucket: String,
    /// Default `us-east-1`.
    #[serde(default)]
    pub region: Option<String>,
    /// The folder the volume lives in: 3 to 63 of `a-z 0-9 -` (a JuiceFS name); default the
    /// volume's id.
    #[serde(default)]
    pub prefix: Option<String>,
    pub access_key_id: String,
    pub secret_access_key: String,
    /// `ENDPOINT/BUCKET` URLs instead of `BUCKET.ENDPOINT`.
    #[serde(default)]
    pub path_style: bool,
}

impl std::fmt::Debug for StorageSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StorageSpec({}/{})", self.endpoint, self.bucket)
    }
}

/// What `GET /volumes/{id}` shows of a volume's own bucket: never its credentials.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageInfo {
    pub endpoint: String,
    pub bucket: String,
    pub region: String,
    pub prefix: String,
    pub path_style: bool,
}

/// The recorded form (`volumes.storage`): the public part and the sealed credentials.
#[derive(Serialize, Deserialize)]
struct Stored {
    #[serde(flatten)]
    info: StorageInfo,
    /// `v1.<kid>.<nonce>.<ciphertext>` (base64) of `{"a": access key, "s": secret key}`.
    credentials: String,
}

#[derive(Serialize, Deserialize)]
struct Keys {
    a: String,
    s: String,
}

/// A volume's own bucket, ready to use.
#[derive(Debug, Clone)]
pub struct VolumeStorage {
    pub info: StorageInfo,
    pub credentials: S3Credentials,
}

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("storage: {0}")]
    Invalid(String),
    #[error(
        "storage: the endpoint's host {host} is {ip} ({why}): a volume's own bucket must be \
         on a public address (the operator may allow others with \
         --volume-storage-allow-private)"
    )]
    NotPublic {
        host: String,
        ip: IpAddr,
        why: &'static str,
    },
    #[error("storage: the endpoint's host {host} does not resolve: {detail}")]
    Unresolved { host: String, detail: String },
    #[error("storage: the bucket answered {status} {message}")]
    Refused { status: u16, message: String },
    #[error("storage: {0}")]
    Unreachable(String),
    /// Sealing or opening the credentials (never their content).
    #[error("volume storage credentials: {0}")]
    Crypto(#[from] CryptoError),
    #[error("volume {0}: its recorded storage is unreadable")]
    Unreadable(String),
}

impl StorageError {
    /// Whether the key's request is at fault (400), not the daemon (500).
    pub fn is_client(&self) -> bool {
        !matches!(self, StorageError::Crypto(_) | StorageError::Unreadable(_))
    }
}

const SEALED_V1: &str = "v1.";

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

fn valid_bucket(b: &str) -> bool {
    (3..=63).contains(&b.len())
        && b.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'.' || c == b'-')
}

/// A JuiceFS filesystem name (the folder the volume's objects are under).
pub fn valid_prefix(p: &str) -> bool {
    let b = p.as_bytes();
    (3..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.first() != Some(&b'-')
        && b.last() != Some(&b'-')
}

fn valid_key(k: &str) -> bool {
    (1..=256).contains(&k.len()) && k.bytes().all(|c| c.is_ascii_graphic())
}

/// `scheme` and `host[:port]` of an endpoint.
fn split_endpoint(endpoint: &str) -> Option<(&str, &str)> {
    let e = endpoint.trim_end_matches('/');
    e.split_once("://").filter(|(s, h)| {
        matches!(*s, "http" | "https")
            && !h.is_empty()
            && h.len() <= 253
            && h.bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b':' | b'[' | b']'))
    })
}

/// Checks the request's fields (no network): the storage to record, its prefix defaulting
/// to `volume_id`.
pub fn validate(spec: &StorageSpec, volume_id: &str) -> Result<VolumeStorage, StorageError> {
    let bad = |s: &str| Err(StorageError::Invalid(s.to_string()));
    let Some((scheme, host)) = split_endpoint(&spec.endpoint) else {
        return bad("endpoint must be an http:// or https:// URL without a path");
    };
    if !valid_bucket(&spec.bucket) {
        return bad("bucket must be 3 to 63 of a-z, 0-9, '.', '-'");
    }
    let region = spec.region.clone().unwrap_or_else(|| "us-east-1".into());
    if region.is_empty()
        || region.len() > 64
        || !region
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-')
    {
        return bad("region must be 1 to 64 of A-Z, a-z, 0-9, '-'");
    }
    let prefix = spec.prefix.clone().unwrap_or_else(|| volume_id.to_string());
    if !valid_prefix(&prefix) {
        return bad(
            "prefix must be 3 to 63 of a-z, 0-9, '-' (one folder of the bucket), not \
             starting or ending with '-'",
        );
    }
    if !valid_key(&spec.access_key_id) || !valid_key(&spec.secret_access_key) {
        return bad("accessKeyId and secretAccessKey must be 1 to 256 printable characters");
    }
    Ok(VolumeStorage {
        info: StorageInfo {
            endpoint: format!("{scheme}://{host}"),
            bucket: spec.bucket.clone(),
            region,
            prefix,
            path_style: spec.path_style,
        },
        credentials: S3Credentials {
            access_key: spec.access_key_id.clone(),
            secret_key: spec.secret_access_key.clone(),
        },
    })
}

/// Why `ip` may not be a tenant's endpoint; `None`: it may.
fn refusal(ip: IpAddr, host_addrs: &[IpAddr]) -> Option<&'static str> {
    if host_addrs.contains(&ip) {
        return Some("an address of the host itself");
    }
    sandcell_runtime::net::reserved::not_public(ip)
}

impl VolumeStorage {
    /// The endpoint's host and port.
    fn host_port(&self) -> (String, u16) {
        let (scheme, host) = split_endpoint(&self.info.endpoint).unwrap_or(("http", ""));
        let default = if scheme == "https" { 443 } else { 80 };
        // `[v6]:port`, `[v6]`, `name:port`, `name`.
        if let Some(rest) = host.strip_prefix('[') {
            let (ip, tail) = rest.split_once(']').unwrap_or((rest, ""));
            let port = tail.strip_prefix(':').and_then(|p| p.parse().ok());
            return (ip.to_string(), port.unwrap_or(default));
        }
        match host.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.parse().unwrap_or(default)),
            None => (host.to_string(), default),
        }
    }

    /// Resolves the endpoint and refuses a non-public address (unless `allow_private`):
    /// the addresses the daemon's own calls are then pinned to.
    pub async fn resolve(&self, allow_private: bool) -> Result<Vec<SocketAddr>, StorageError> {
        let (host, port) = self.host_port();
        let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => tokio::net::lookup_host((host.as_str(), port))
                .await
                .map_err(|e| StorageError::Unresolved {
                    host: host.clone(),
                    detail: e.to_string(),
                })?
                .take(16)
                .collect(),
        };
        if addrs.is_empty() {
            return Err(StorageError::Unresolved {
                host,
                detail: "no address".into(),
            });
        }
        if !allow_private {
            let mine = sandcell_runtime::net::reserved::host_addresses();
            for a in &addrs {
                if let Some(why) = refusal(a.ip(), &mine) {
                    return Err(StorageError::NotPublic {
                        host,
                        ip: a.ip(),
                        why,
                    });
                }
            }
        }
        Ok(addrs)
    }

    /// The configuration JuiceFS and the bucket client take, the operator's client and
    /// capacity kept.
    pub fn s3_config(&self, base: &S3Config) -> S3Config {
        let (scheme, host) = split_endpoint(&self.info.endpoint).unwrap_or(("http", ""));
        S3Config {
            bucket_url: bucket_url(scheme, host, &self.info.bucket, self.info.path_style),
            region: self.info.region.clone(),
            credentials: Some(self.credentials.clone()),
            juicefs: base.juicefs.clone(),
            volume_max_gib: base.volume_max_gib,
            storage_allow_private: base.storage_allow_private,
        }
    }

    /// Checks that the bucket answers these credentials (one list of at most one key under
    /// the prefix), through `bucket` (pinned to the checked addresses).
    pub async fn check(&self, bucket: &Bucket) -> Result<(), StorageError> {
        match bucket.check_access(&self.info.prefix).await {
            Ok(()) => Ok(()),
            Err(BucketError::Status {
                status, message, ..
            }) => Err(StorageError::Refused { status, message }),
            Err(e) => Err(StorageError::Unreachable(e.to_string())),
        }
    }

    /// The recorded form, the credentials sealed for `volume_id`.
    pub fn seal(&self, ring: &KeyRing, volume_id: &str) -> Result<String, StorageError> {
        let keys = Keys {
            a: self.credentials.access_key.clone(),
            s: self.credentials.secret_key.clone(),
        };
        let plain = SecretValue::new(serde_json::to_string(&keys).unwrap_or_default());
        let s = ring.seal_volume_storage(volume_id, &plain)?;
        let stored = Stored {
            info: self.info.clone(),
            credentials: format!(
                "{SEALED_V1}{}.{}.{}",
                s.kid,
                b64().encode(&s.nonce),
                b64().encode(&s.ciphertext)
            ),
        };
        serde_json::to_string(&stored).map_err(|_| StorageError::Unreadable(volume_id.into()))
    }

    /// What [`VolumeStorage::seal`] recorded for `volume_id`, opened.
    pub fn open(ring: &KeyRing, volume_id: &str, text: &str) -> Result<Self, StorageError> {
        let unreadable = || StorageError::Unreadable(volume_id.to_string());
        let stored: Stored = serde_json::from_str(text).map_err(|_| unreadable())?;
        let rest = stored
            .credentials
            .strip_prefix(SEALED_V1)
            .ok_or_else(unreadable)?;
        let mut parts = rest.split('.');
        let (Some(kid), Some(nonce), Some(ct), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(unreadable());
        };
        let sealed = Sealed {
            kid: kid.to_string(),
            nonce: b64().decode(nonce).map_err(|_| unreadable())?,
            ciphertext: b64().decode(ct).map_err(|_| unreadable())?,
        };
        let plain = ring.open_volume_storage(volume_id, &sealed)?;
        let keys: Keys = serde_json::from_str(plain.expose()).map_err(|_| unreadable())?;
        Ok(VolumeStorage {
            info: stored.info,
            credentials: S3Credentials {
                access_key: keys.a,
                secret_key: keys.s,
            },
        })
    }

    /// The public part of a recorded storage (no key ring needed).
    pub fn info_of(text: &str) -> Option<StorageInfo> {
        serde_json::from_str::<Stored>(text).ok().map(|s| s.info)
    }
}

/// Reseals under the ring's current key the credentials of every volume in its key's own
/// bucket sealed by another (`sandcell secrets rotate-key`, before the old key goes). A
/// row that does not open is logged and left (its volume was unusable already).
pub async fn reseal_all(
    db: &crate::store::Db,
    ring: &KeyRing,
) -> Result<usize, crate::error::Error> {
    let mut changed = 0;
    for (id, text) in db.all_volume_storages().await? {
        let current = serde_json::from_str::<Stored>(&text).ok().and_then(|s| {
            let rest = s.credentials.strip_prefix(SEALED_V1)?.to_string();
            rest.split('.').next().map(|k| k == ring.current_kid())
        });
        if current == Some(true) {
            continue;
        }
        match VolumeStorage::open(ring, &id, &text).and_then(|st| st.seal(ring, &id)) {
            Ok(sealed) => {
                db.set_volume_storage(&id, &sealed).await?;
                changed += 1;
            }
            Err(e) => tracing::error!("volume {id}: its storage credentials: {e}"),
        }
    }
    if changed > 0 {
        tracing::info!("sealed the storage credentials of {changed} volume(s) anew");
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn spec() -> StorageSpec {
        serde_json::from_value(serde_json::json!({
            "endpoint": "https://s3.example.com/",
            "bucket": "my-bucket",
            "accessKeyId": "AKID",
            "secretAccessKey": "s3cr3t-value",
        }))
        .unwrap()
    }

    #[test]
    fn requests_are_checked() {
        let s = validate(&spec(), "vol-0123456789abcdef").unwrap();
        assert_eq!(s.info.endpoint, "https://s3.example.com");
        assert_eq!(s.info.prefix, "vol-0123456789abcdef");
        assert_eq!(s.info.region, "us-east-1");
        assert_eq!(s.host_port(), ("s3.example.com".into(), 443));
        let cases: [(&str, serde_json::Value); 7] = [
            ("endpoint", "ftp://x".into()),
            ("endpoint", "http://x/path".into()),
            ("bucket", "Bad".into()),
            ("prefix", "a/b".into()),
            ("prefix", "-ab".into()),
            ("region", "us east".into()),
            ("secretAccessKey", "".into()),
        ];
        for (field, value) in cases {
            let mut v = serde_json::json!({
                "endpoint": "http://127.0.0.1:8333", "bucket": "b12",
                "accessKeyId": "a", "secretAccessKey": "s",
            });
            v[field] = value.clone();
            let spec: StorageSpec = serde_json::from_value(v).unwrap();
            assert!(
                matches!(validate(&spec, "vol-x"), Err(StorageError::Invalid(_))),
                "{field} {value}"
            );
        }
        // Unknown fields (a misspelt one) are refused, not ignored.
        let v = serde_json::json!({"endpoint": "http://x", "bucket": "b12",
            "accessKeyId": "a", "secretAccessKey": "s", "secretKey": "s"});
        assert!(serde_json::from_value::<StorageSpec>(v).is_err());
        assert!(!format!("{:?}", spec()).contains("s3cr3t"));
        assert!(!format!("{s:?}").contains("s3cr3t"));
    }

    #[tokio::test]
    async fn private_endpoints_are_refused_unless_allowed() {
        for e in [
            "http://127.0.0.1:8333",
            "http://[::1]:9000",
            "http://169.254.169.254",
            "http://10.0.0.1",
            "http://localhost:8333",
        ] {
            let mut sp = spec();
            sp.endpoint = e.into();
            let s = validate(&sp, "vol-x12").unwrap();
            let r = s.resolve(false).await;
            assert!(
                matches!(
                    r,
                    Err(StorageError::NotPublic { .. } | StorageError::Unresolved { .. })
                ),
                "{e}: {r:?}"
            );
            if !e.contains("localhost") {
                assert!(s.resolve(true).await.is_ok(), "{e}");
            }
        }
        let mut sp = spec();
        sp.endpoint = "http://[::1]:9000".into();
        let s = validate(&sp, "vol-x12").unwrap();
        assert_eq!(s.host_port(), ("::1".into(), 9000));
    }

    #[test]
    fn credentials_are_sealed_to_their_volume() {
        let tmp = tempfile::tempdir().unwrap();
        let ring = KeyRing::load_or_create(tmp.path()).unwrap();
        let s = validate(&spec(), "vol-a12").unwrap();
        let text = s.seal(&ring, "vol-a12").unwrap();
        assert!(!text.contains("s3cr3t") && !text.contains("AKID"), "{text}");
        let back = VolumeStorage::open(&ring, "vol-a12", &text).unwrap();
        assert_eq!(back.credentials.secret_key, "s3cr3t-value");
        assert_eq!(back.info, s.info);
        assert_eq!(VolumeStorage::info_of(&text), Some(s.info));
        // Moved to another volume's row, it does not open.
        assert!(VolumeStorage::open(&ring, "vol-b12", &text).is_err());
    }

    #[tokio::test]
    async fn rotating_the_key_reseals_the_credentials() {
        use crate::secrets::crypto::{KEY_FILE, generate_key_line, key_lines, write_key_file};
        let dir = tempfile::tempdir().unwrap();
        let db = crate::store::Db::open(&dir.path().join("db.sqlite"))
            .await
            .unwrap();
        db.insert_test_key("k1").await.unwrap();
        let old = KeyRing::load_or_create(dir.path()).unwrap();
        let st = validate(&spec(), "vol-a12").unwrap();
        let row = crate::store::volumes::VolumeRow {
            id: "vol-a12".into(),
            key_id: "k1".into(),
            name: "own".into(),
            token: "t".into(),
            created_at: 0,
            storage: Some(st.seal(&old, "vol-a12").unwrap()),
        };
        assert!(db.insert_volume(&row).await.unwrap());
        let path = dir.path().join(KEY_FILE);
        let mut lines = vec![generate_key_line().unwrap()];
        lines.extend(key_lines(&path).unwrap());
        write_key_file(&path, &lines).unwrap();
        let ring = KeyRing::load(&path).unwrap();
        assert_eq!(reseal_all(&db, &ring).await.unwrap(), 1);
        assert_eq!(reseal_all(&db, &ring).await.unwrap(), 0, "once");
        // The old key gone, the new one alone opens it.
        write_key_file(&path, &lines[..1]).unwrap();
        let new_only = KeyRing::load(&path).unwrap();
        let text = db.volume_by_id("vol-a12").await.unwrap().unwrap().storage;
        let back = VolumeStorage::open(&new_only, "vol-a12", &text.unwrap()).unwrap();
        assert_eq!(back.credentials.secret_key, "s3cr3t-value");
    }
}
