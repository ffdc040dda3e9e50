//! The few S3 object calls the daemon makes itself (GET, HEAD, PUT, DELETE of small objects
//! under a volume's prefix: its lease, its published metadata), signed with AWS Signature
//! Version 4. JuiceFS moves the volume's data; this only moves what JuiceFS does not know
//! about. reqwest, hmac and sha2 are already in the workspace's graph (no new crates).

use super::config::S3Config;
use hmac::{KeyInit, Mac};
use sha2::{Digest, Sha256};
use std::time::Duration;

/// A small object call's bound (the metadata dump of a large volume gets longer, below).
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
const DUMP_TIMEOUT: Duration = Duration::from_secs(600);
/// Most of an error body kept.
const MAX_ERROR_BODY: usize = 512;
/// Most of an answer read: a small object (lease, record, a list) and a metadata dump. A
/// volume's bucket may be a tenant's server: what it answers is bounded.
const MAX_SMALL: usize = 1 << 20;
const MAX_DUMP: usize = 1 << 30;

/// What a call moves, which bounds its time and its answer: a small object (a lease, a
/// record, a HEAD, a DELETE: a lease renewal must never wait minutes) or a metadata dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Small,
    Dump,
}

impl Kind {
    fn timeout(self) -> Duration {
        match self {
            Kind::Small => CALL_TIMEOUT,
            Kind::Dump => DUMP_TIMEOUT,
        }
    }

    /// Most of a successful answer read.
    fn max_body(self) -> usize {
        match self {
            Kind::Small => MAX_SMALL,
            Kind::Dump => MAX_DUMP,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BucketError {
    /// The endpoint did not answer (down, refused, timed out): the storage is unavailable.
    #[error("the bucket at {endpoint} is unreachable: {detail}")]
    Unreachable { endpoint: String, detail: String },
    /// A conditional PUT lost (another writer changed the object first).
    #[error("{key} changed under us (precondition failed)")]
    Precondition { key: String },
    #[error("{method} {key}: the answer is larger than {max} bytes")]
    TooLarge {
        method: &'static str,
        key: String,
        max: usize,
    },
    /// The HTTP client could not be made (its TLS setup).
    #[error("the S3 client could not be made: {0}")]
    Client(String),
    #[error("{method} {key}: HTTP {status}: {message}")]
    Status {
        method: &'static str,
        key: String,
        status: u16,
        message: String,
    },
}

/// An object read back: its bytes, ETag and `x-amz-meta-*` headers asked for.
#[derive(Debug)]
pub struct Object {
    pub body: Vec<u8>,
    pub etag: Option<String>,
    pub generation: Option<u64>,
}

/// A PUT's condition: S3's conditional writes (honoured by AWS, MinIO and recent
/// SeaweedFS; a server that ignores them makes the write unconditional).
#[derive(Debug, Clone)]
pub enum Condition {
    None,
    /// Only if the key does not exist (`If-None-Match: *`).
    Absent,
    /// Only if the object is still this one (`If-Match: etag`).
    Matches(String),
}

#[derive(Clone)]
pub struct Bucket {
    http: reqwest::Client,
    /// `scheme://host`, and the path before the key (`/bucket` path-style, empty otherwise).
    origin: String,
    host: String,
    base_path: String,
    region: String,
    credentials: Option<super::config::S3Credentials>,
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bucket({}{})", self.origin, self.base_path)
    }
}

/// The header carrying the generation of a published metadata dump.
const GENERATION: &str = "x-amz-meta-sandcell-generation";

impl Bucket {
    pub fn new(s3: &S3Config) -> Result<Bucket, BucketError> {
        Bucket::pinned(s3, &[])
    }

    /// A bucket whose endpoint's name is reached at `pins` only (the addresses checked
    /// when a tenant named it: volumes/storage.rs); none: resolved as usual.
    pub fn pinned(s3: &S3Config, pins: &[std::net::SocketAddr]) -> Result<Bucket, BucketError> {
        // https endpoints: the same ring provider the rest of the daemon uses.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (scheme, rest) = s3.bucket_url.split_once("://").unwrap_or(("http", ""));
        let (host, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            // A redirect would leave the checked endpoint.
            .redirect(reqwest::redirect::Policy::none());
        if !pins.is_empty() {
            let name = host.rsplit_once(':').map_or(host, |(n, _)| n);
            builder = builder.resolve_to_addrs(name, pins);
        }
        let http = builder
            .build()
            .map_err(|e| BucketError::Client(e.to_string()))?;
        Ok(Bucket {
            http,
            origin: format!("{scheme}://{host}"),
            host: signed_host(scheme, host).to_string(),
            base_path: path.to_string(),
            region: s3.region.clone(),
            credentials: s3.credentials.clone(),
        })
    }

    pub fn endpoint(&self) -> &str {
        &self.origin
    }

    /// GET of a small object (lease, record).
    pub async fn get(&self, key: &str) -> Result<Option<Object>, BucketError> {
        self.call("GET", key, Vec::new(), None, &Condition::None, Kind::Small)
            .await
    }

    /// GET of a metadata dump.
    pub async fn get_dump(&self, key: &str) -> Result<Option<Object>, BucketError> {
        self.call("GET", key, Vec::new(), None, &Condition::None, Kind::Dump)
            .await
    }

    pub async fn head(&self, key: &str) -> Result<Option<Object>, BucketError> {
        self.call("HEAD", key, Vec::new(), None, &Condition::None, Kind::Small)
            .await
    }

    /// Puts `body` (an S3 PUT replaces an object atomically); `generation`, when given, is
    /// stored as the object's metadata. `kind`: a small object or a metadata dump.
    pub async fn put(
        &self,
        key: &str,
        body: Vec<u8>,
        generation: Option<u64>,
        cond: &Condition,
        kind: Kind,
    ) -> Result<(), BucketError> {
        self.call("PUT", key, body, generation, cond, kind)
            .await
            .map(drop)
    }

    pub async fn delete(&self, key: &str) -> Result<(), BucketError> {
        self.call(
            "DELETE",
            key,
            Vec::new(),
            None,
            &Condition::None,
            Kind::Small,
        )
        .await
        .map(drop)
    }

    /// Whether the bucket lets these credentials list under `prefix` (one `ListObjectsV2`
    /// of at most one key): what a volume's own bucket is checked with at creation.
    pub async fn check_access(&self, prefix: &str) -> Result<(), BucketError> {
        let query = format!(
            "list-type=2&max-keys=1&prefix={}",
            encode_query(&format!("{prefix}/"))
        );
        let resp = self
            .request("GET", "", &query, Vec::new(), None, CALL_TIMEOUT)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        let status = resp.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(());
        }
        let bytes = read_prefix(resp, MAX_ERROR_BODY).await;
        let text = String::from_utf8_lossy(&bytes);
        Err(BucketError::Status {
            method: "GET",
            key: format!("?list-type=2&prefix={prefix}/"),
            status,
            message: s3_message(&text),
        })
    }

    /// A signed request (its query string already canonical: sorted and encoded).
    fn request(
        &self,
        method: &'static str,
        key: &str,
        query: &str,
        body: Vec<u8>,
        generation: Option<u64>,
        timeout: Duration,
    ) -> reqwest::RequestBuilder {
        let path = format!("{}/{}", self.base_path, encode_key(key));
        let now = time::OffsetDateTime::now_utc();
        let amz_date = amz_date(now);
        let payload = hex(&Sha256::digest(&body));
        let mut headers = vec![
            ("host".to_string(), self.host.clone()),
            ("x-amz-content-sha256".to_string(), payload.clone()),
            ("x-amz-date".to_string(), amz_date.clone()),
        ];
        if let Some(g) = generation {
            headers.push((GENERATION.to_string(), g.to_string()));
        }
        headers.sort();
        let method_enc = reqwest::Method::from_bytes(method.as_bytes()).unwrap_or_default();
        let url = if query.is_empty() {
            format!("{}{path}", self.origin)
        } else {
            format!("{}{path}?{query}", self.origin)
        };
        let mut req = self.http.request(method_enc, url).timeout(timeout);
        for (k, v) in &headers {
            if k != "host" {
                req = req.header(k, v);
            }
        }
        if let Some(c) = &self.credentials {
            let auth = sign(
                method,
                &path,
                query,
                &headers,
                &payload,
                &amz_date,
                &self.region,
                &c.access_key,
                &c.secret_key,
            );
            req = req.header("authorization", auth);
        }
        if method == "PUT" {
            req = req.body(body);
        }
        req
    }

    /// One signed call; `None` for a 404.
    async fn call(
        &self,
        method: &'static str,
        key: &str,
        body: Vec<u8>,
        generation: Option<u64>,
        cond: &Condition,
        kind: Kind,
    ) -> Result<Option<Object>, BucketError> {
        let mut req = self.request(method, key, "", body, generation, kind.timeout());
        req = match cond {
            Condition::None => req,
            Condition::Absent => req.header("if-none-match", "*"),
            Condition::Matches(etag) => req.header("if-match", etag),
        };
        let resp = req.send().await.map_err(|e| self.unreachable(e))?;
        let status = resp.status().as_u16();
        if status == 404 {
            return Ok(None);
        }
        if status == 412 || status == 409 && !matches!(cond, Condition::None) {
            return Err(BucketError::Precondition {
                key: key.to_string(),
            });
        }
        let etag = header(&resp, "etag");
        let generation = header(&resp, GENERATION).and_then(|g| g.parse().ok());
        if !(200..300).contains(&status) {
            // An error document is small: read no more than is kept of it.
            let bytes = read_prefix(resp, MAX_ERROR_BODY).await;
            let text = String::from_utf8_lossy(&bytes);
            return Err(BucketError::Status {
                method,
                key: key.to_string(),
                status,
                message: s3_message(&text),
            });
        }
        let bytes = read_bounded(resp, kind.max_body(), method, key).await?;
        Ok(Some(Object {
            body: bytes,
            etag,
            generation,
        }))
    }

    fn unreachable(&self, e: reqwest::Error) -> BucketError {
        use std::error::Error as _;
        let mut detail = e.to_string();
        let mut src = e.source();
        while let Some(s) = src {
            detail = format!("{detail}: {s}");
            src = s.source();
        }
        BucketError::Unreachable {
            endpoint: self.origin.clone(),
            detail,
        }
    }
}

/// The `host` header as signed: the scheme's default port left out, as reqwest sends it
/// (an endpoint given as `https://s3.example:443` is otherwise answered 403).
fn signed_host<'a>(scheme: &str, host: &'a str) -> &'a str {
    let default = match scheme {
        "http" => ":80",
        "https" => ":443",
        _ => return host,
    };
    host.strip_suffix(default).unwrap_or(host)
}

/// The answer's body, at most `max` bytes (`TooLarge` beyond).
async fn read_bounded(
    mut resp: reqwest::Response,
    max: usize,
    method: &'static str,
    key: &str,
) -> Result<Vec<u8>, BucketError> {
    let mut out = Vec::new();
    loop {
        let chunk = resp.chunk().await.map_err(|e| BucketError::Unreachable {
            endpoint: resp.url().origin().ascii_serialization(),
            detail: e.to_string(),
        })?;
        let Some(chunk) = chunk else {
            return Ok(out);
        };
        if out.len() + chunk.len() > max {
            return Err(BucketError::TooLarge {
                method,
                key: key.to_string(),
                max,
            });
        }
        out.extend_from_slice(&chunk);
    }
}

/// The first `max` bytes of an (error) answer at most, the rest left unread; what did not
/// arrive is left out.
async fn read_prefix(mut resp: reqwest::Response, max: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < max {
        match resp.chunk().await {
            Ok(Some(chunk)) => out.extend_from_slice(&chunk[..chunk.len().min(max - out.len())]),
            _ => break,
        }
    }
    out
}

/// A query value percent-encoded as SigV4 wants (everything but unreserved characters).
fn encode_query(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn header(resp: &reqwest::Response, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// `<Code>` and `<Message>` of an S3 error document, or the text itself.
fn s3_message(text: &str) -> String {
    let tag = |t: &str| {
        let open = format!("<{t}>");
        let start = text.find(&open)? + open.len();
        let end = text[start..].find('<')? + start;
        Some(text[start..end].to_string())
    };
    match (tag("Code"), tag("Message")) {
        (Some(c), Some(m)) => format!("{c}: {m}"),
        (Some(c), None) => c,
        _ => text.trim().chars().take(200).collect(),
    }
}

/// A key's path segments, percent-encoded as SigV4's canonical URI wants (once, for S3).
fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn amz_date(t: time::OffsetDateTime) -> String {
    format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hmac(key: &[u8], data: &str) -> Vec<u8> {
    // HMAC takes keys of any length: new_from_slice never fails for it.
    let mut m = <hmac::Hmac<Sha256> as KeyInit>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
    m.update(data.as_bytes());
    m.finalize().into_bytes().to_vec()
}

/// SigV4's `Authorization` header. `query` is the canonical query string (sorted,
/// encoded; empty for none); `headers` are the signed ones, lower-case and sorted.
#[allow(clippy::too_many_arguments)]
fn sign(
    method: &str,
    path: &str,
    query: &str,
    headers: &[(String, String)],
    payload: &str,
    amz_date: &str,
    region: &str,
    access_key: &str,
    secret_key: &str,
) -> String {
    let canonical_headers: String = headers
        .iter()
        .map(|(k, v)| format!("{k}:{}\n", v.trim()))
        .collect();
    let signed: Vec<&str> = headers.iter().map(|(k, _)| k.as_str()).collect();
    let signed = signed.join(";");
    let canonical = format!("{method}\n{path}\n{query}\n{canonical_headers}\n{signed}\n{payload}");
    let date = &amz_date[..8];
    let scope = format!("{date}/{region}/s3/aws4_request");
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex(&Sha256::digest(canonical.as_bytes()))
    );
    let k = hmac(format!("AWS4{secret_key}").as_bytes(), date);
    let k = hmac(&k, region);
    let k = hmac(&k, "s3");
    let k = hmac(&k, "aws4_request");
    let signature = hex(&hmac(&k, &to_sign));
    format!(
        "AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={signed}, Signature={signature}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AWS's documented example (S3 SigV4, "GET Object" with a Range header left out:
    /// the signing key and string-to-sign steps are the same).
    #[test]
    fn signing_key_matches_aws_example() {
        // From AWS's "Deriving the signing key" example.
        let k = hmac(b"AWS4wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "20120215");
        let k = hmac(&k, "us-east-1");
        let k = hmac(&k, "iam");
        let k = hmac(&k, "aws4_request");
        assert_eq!(
            hex(&k),
            "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d"
        );
    }

    #[test]
    fn the_signed_host_has_no_default_port() {
        assert_eq!(signed_host("https", "s3.example.com:443"), "s3.example.com");
        assert_eq!(signed_host("http", "s3.example.com:80"), "s3.example.com");
        assert_eq!(signed_host("http", "127.0.0.1:8333"), "127.0.0.1:8333");
        assert_eq!(
            signed_host("https", "s3.example.com:80"),
            "s3.example.com:80"
        );
        assert_eq!(signed_host("http", "[::1]:80"), "[::1]");
        assert_eq!(signed_host("https", "s3.example.com"), "s3.example.com");
    }

    #[test]
    fn small_calls_are_bounded_short() {
        assert_eq!(Kind::Small.timeout(), CALL_TIMEOUT);
        assert_eq!(Kind::Small.max_body(), MAX_SMALL);
        assert_eq!(Kind::Dump.timeout(), DUMP_TIMEOUT);
        assert_eq!(Kind::Dump.max_body(), MAX_DUMP);
        // A lease renewal (every 20 s, a lease of 60 s) never waits past its lease.
        assert!(Kind::Small.timeout().as_millis() < super::super::shared::LEASE_MS as u128 / 2);
    }

    #[test]
    fn keys_dates_and_errors() {
        assert_eq!(
            encode_key("vol-1/sandcell-meta/a b"),
            "vol-1/sandcell-meta/a%20b"
        );
        let t = time::OffsetDateTime::from_unix_timestamp(1_369_353_600)
            .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
        assert_eq!(amz_date(t), "20130524T000000Z");
        assert_eq!(
            s3_message("<Error><Code>AccessDenied</Code><Message>no</Message></Error>"),
            "AccessDenied: no"
        );
    }
}
