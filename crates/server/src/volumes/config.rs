//! The operator's bucket: `sandcell serve --s3-*` (or the `SANDCELL_S3_*` environment).
//! Without an endpoint and bucket, volumes are off and their routes say which flag turns
//! them on. The credentials are read from files (never flags: a command line is visible to
//! every host user) and never shown by the API.

use std::path::PathBuf;

/// `serve`'s S3 options.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct S3Args {
    /// S3-compatible endpoint for volumes (`http://127.0.0.1:8333`, `https://s3.eu-west-1.amazonaws.com`);
    /// without it volumes are disabled
    #[arg(long, env = "SANDCELL_S3_ENDPOINT", value_name = "URL")]
    pub s3_endpoint: Option<String>,
    /// The bucket volumes live in (each volume under its own prefix, its id)
    #[arg(long, env = "SANDCELL_S3_BUCKET", value_name = "NAME")]
    pub s3_bucket: Option<String>,
    /// The bucket's region
    #[arg(
        long,
        env = "SANDCELL_S3_REGION",
        default_value = "us-east-1",
        value_name = "REGION"
    )]
    pub s3_region: String,
    /// Path-style URLs (`ENDPOINT/BUCKET`, most self-hosted servers) instead of
    /// virtual-hosted ones (`BUCKET.ENDPOINT`)
    #[arg(long, env = "SANDCELL_S3_PATH_STYLE")]
    pub s3_path_style: bool,
    /// A file holding the access key id
    #[arg(long, env = "SANDCELL_S3_ACCESS_KEY_FILE", value_name = "PATH")]
    pub s3_access_key_file: Option<PathBuf>,
    /// A file holding the secret access key
    #[arg(long, env = "SANDCELL_S3_SECRET_KEY_FILE", value_name = "PATH")]
    pub s3_secret_key_file: Option<PathBuf>,
    /// The most one volume may hold, in GiB (JuiceFS's quota: writes past it fail with ENOSPC)
    #[arg(
        long,
        env = "SANDCELL_VOLUME_MAX_GIB",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..=1_048_576),
        value_name = "GIB"
    )]
    pub volume_max_gib: u64,
    /// The JuiceFS client volumes are mounted with (default: `juicefs` on PATH)
    #[arg(
        long,
        env = "SANDCELL_JUICEFS",
        default_value = "juicefs",
        value_name = "PATH"
    )]
    pub juicefs: PathBuf,
    /// Let a key's own volume storage (`POST /volumes` with `storage`) name an endpoint
    /// on a loopback, private or link-local address, or the host's own (refused by
    /// default: a tenant must not point the daemon at the host's services)
    #[arg(long, env = "SANDCELL_VOLUME_STORAGE_ALLOW_PRIVATE")]
    pub volume_storage_allow_private: bool,
}

/// Credentials; `Debug` never shows them.
#[derive(Clone)]
pub struct S3Credentials {
    pub access_key: String,
    pub secret_key: String,
}

impl std::fmt::Debug for S3Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("S3Credentials(..)")
    }
}

/// A usable bucket configuration.
#[derive(Debug, Clone)]
pub struct S3Config {
    /// The bucket's URL as JuiceFS takes it (path-style or virtual-hosted).
    pub bucket_url: String,
    pub region: String,
    pub credentials: Option<S3Credentials>,
    pub juicefs: PathBuf,
    /// Each volume's capacity in GiB.
    pub volume_max_gib: u64,
    /// `--volume-storage-allow-private`.
    pub storage_allow_private: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--s3-endpoint and --s3-bucket go together: {0} is missing")]
    Missing(&'static str),
    #[error("--s3-endpoint {0:?} must be an http:// or https:// URL without a path")]
    BadEndpoint(String),
    #[error("--s3-bucket {0:?} is not a bucket name (3-63 of a-z, 0-9, '.', '-')")]
    BadBucket(String),
    #[error("--s3-access-key-file and --s3-secret-key-file go together")]
    HalfCredentials,
    #[error("reading {0}: {1}")]
    Read(String, std::io::Error),
    #[error("{0} is empty")]
    Empty(String),
    /// The S3 client could not be made.
    #[error(transparent)]
    Client(#[from] super::bucket::BucketError),
}

/// Largest credential file read (a key is far shorter).
const MAX_KEY_FILE: u64 = 4096;

fn read_key(path: &std::path::Path) -> Result<String, ConfigError> {
    use std::io::Read;
    let shown = path.display().to_string();
    let mut s = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_KEY_FILE).read_to_string(&mut s))
        .map_err(|e| ConfigError::Read(shown.clone(), e))?;
    let s = s.trim().to_string();
    if s.is_empty() {
        return Err(ConfigError::Empty(shown));
    }
    Ok(s)
}

/// The bucket's URL as JuiceFS and [`super::bucket::Bucket`] take it.
pub fn bucket_url(scheme: &str, host: &str, bucket: &str, path_style: bool) -> String {
    if path_style {
        format!("{scheme}://{host}/{bucket}")
    } else {
        format!("{scheme}://{bucket}.{host}")
    }
}

impl S3Args {
    /// The configuration, `None` when volumes are off (no endpoint and no bucket).
    pub fn load(&self) -> Result<Option<S3Config>, ConfigError> {
        let (endpoint, bucket) = match (&self.s3_endpoint, &self.s3_bucket) {
            (None, None) => return Ok(None),
            (Some(_), None) => return Err(ConfigError::Missing("--s3-bucket")),
            (None, Some(_)) => return Err(ConfigError::Missing("--s3-endpoint")),
            (Some(e), Some(b)) => (e.trim_end_matches('/'), b),
        };
        let (scheme, host) = endpoint
            .split_once("://")
            .filter(|(s, h)| matches!(*s, "http" | "https") && !h.is_empty() && !h.contains('/'))
            .ok_or_else(|| ConfigError::BadEndpoint(endpoint.to_string()))?;
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
        if !bucket_ok {
            return Err(ConfigError::BadBucket(bucket.clone()));
        }
        let bucket_url = bucket_url(scheme, host, bucket, self.s3_path_style);
        let credentials = match (&self.s3_access_key_file, &self.s3_secret_key_file) {
            (None, None) => None,
            (Some(a), Some(s)) => Some(S3Credentials {
                access_key: read_key(a)?,
                secret_key: read_key(s)?,
            }),
            _ => return Err(ConfigError::HalfCredentials),
        };
        Ok(Some(S3Config {
            bucket_url,
            region: self.s3_region.clone(),
            credentials,
            juicefs: self.juicefs.clone(),
            volume_max_gib: self.volume_max_gib,
            storage_allow_private: self.volume_storage_allow_private,
        }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn args(endpoint: &str, bucket: &str, path_style: bool) -> S3Args {
        S3Args {
            s3_endpoint: Some(endpoint.into()),
            s3_bucket: Some(bucket.into()),
            s3_region: "us-east-1".into(),
            s3_path_style: path_style,
            juicefs: "juicefs".into(),
            ..Default::default()
        }
    }

    #[test]
    fn bucket_urls_follow_the_addressing_style() {
        let c = args("http://127.0.0.1:8333/", "vols", true)
            .load()
            .unwrap()
            .unwrap();
        assert_eq!(c.bucket_url, "http://127.0.0.1:8333/vols");
        let c = args("https://s3.example.com", "vols", false)
            .load()
            .unwrap()
            .unwrap();
        assert_eq!(c.bucket_url, "https://vols.s3.example.com");
        assert!(S3Args::default().load().unwrap().is_none());
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(args("ftp://x", "vols", true).load().is_err());
        assert!(args("http://x/path", "vols", true).load().is_err());
        assert!(args("http://x", "Vols", true).load().is_err());
        assert!(args("http://x", "v", true).load().is_err());
        let mut half = args("http://x", "vols", true);
        half.s3_access_key_file = Some("/nonexistent".into());
        assert!(matches!(half.load(), Err(ConfigError::HalfCredentials)));
        let only = S3Args {
            s3_bucket: Some("vols".into()),
            ..Default::default()
        };
        assert!(matches!(
            only.load(),
            Err(ConfigError::Missing("--s3-endpoint"))
        ));
    }

    #[test]
    fn credentials_come_from_files_and_never_print() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("a"), "AKID\n").unwrap();
        std::fs::write(tmp.path().join("s"), "s3cr3t-value\n").unwrap();
        let mut a = args("http://x", "vols", true);
        a.s3_access_key_file = Some(tmp.path().join("a"));
        a.s3_secret_key_file = Some(tmp.path().join("s"));
        let c = a.load().unwrap().unwrap();
        let creds = c.credentials.clone().unwrap();
        assert_eq!(creds.access_key, "AKID");
        assert_eq!(creds.secret_key, "s3cr3t-value");
        assert!(!format!("{c:?}").contains("s3cr3t"));
    }
}
