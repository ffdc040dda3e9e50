//! The HTTP side of a pull: the bearer-token exchange, manifests, the config and the
//! layers, all by our own reqwest client through the pull's guard proxy (guard.rs), each
//! body read with a bound.
//!
//! oci-client reads a manifest whole into memory (`Response::bytes`), the config blob into an
//! unbounded `Vec`, a token endpoint's answer and a registry's error answer whole, so a
//! hostile registry (or the token realm it names) could answer with gigabytes. Here
//! manifests and the config are refused past [`MAX_DOCUMENT_BYTES`] and a token answer past
//! [`MAX_TOKEN_BYTES`] (by `Content-Length` or while streaming), layers are streamed
//! (registry.rs bounds and hashes them), and a non-2xx answer is reported by its status and
//! a short printable excerpt of its first bytes, never the body (it lands in a build's
//! reason). The token exchange ([`Session::authorize`]) reads the registry's
//! `WWW-Authenticate` challenge (of `GET /v2/`, or of a request's 401): `Bearer` asks the
//! realm it names for a pull token (basic credentials, when given, go to the realm), `Basic`
//! sends the credentials themselves. Redirects are followed by reqwest, each hop, the realm's
//! included, through the guard. oci-client is left with reference parsing and the manifest
//! types.

use crate::digest::Digest;
use crate::registry::Auth;
use crate::{Error, Result};
use oci_client::Reference;
use oci_client::manifest::{
    IMAGE_MANIFEST_LIST_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE,
    OCI_IMAGE_MEDIA_TYPE, OciImageManifest, OciManifest,
};

/// Registries cap manifests at 4 MiB too (distribution's default); a real one is a few KiB.
pub const MAX_DOCUMENT_BYTES: u64 = 4 << 20;

/// A token endpoint's JSON answer, at most: real tokens (JWTs) are a few KiB.
pub const MAX_TOKEN_BYTES: u64 = 64 << 10;

/// What is shown of a registry's error body, at most.
const EXCERPT: usize = 200;

/// The registry endpoints of one pull and the `Authorization` its requests carry.
pub(crate) struct Session<'a> {
    pub http: reqwest::Client,
    pub image: &'a Reference,
    pub auth: &'a Auth,
    /// `<scheme>://<registry>/v2/`
    pub root: String,
    /// `<scheme>://<registry>/v2/<repository>/`
    pub base: String,
    pub authorization: std::sync::Mutex<Option<String>>,
}

impl Session<'_> {
    /// Finds out how the registry wants to be spoken to (the challenge of `GET /v2/`) and
    /// sets the `Authorization` of the requests that follow.
    pub async fn authorize(&self) -> Result<()> {
        if let Auth::Bearer(token) = self.auth {
            return self.set(Some(format!("Bearer {token}")));
        }
        let response = self
            .http
            .get(&self.root)
            .send()
            .await
            .map_err(|source| Error::Http {
                what: format!("fetching {}", self.root),
                source,
            })?;
        // Only the headers matter: the body is dropped unread.
        let challenges = challenges_of(&response);
        drop(response);
        self.authorize_with(&challenges).await
    }

    /// Sets the `Authorization` for these challenges: a token from a `Bearer` challenge's
    /// realm, the credentials themselves for a `Basic` one (or none), none when anonymous.
    async fn authorize_with(&self, challenges: &[Challenge]) -> Result<()> {
        if let Auth::Bearer(token) = self.auth {
            return self.set(Some(format!("Bearer {token}")));
        }
        let bearer = challenges
            .iter()
            .find(|c| c.scheme == "bearer" && c.param("realm").is_some());
        let value = match (bearer, self.auth) {
            (Some(challenge), _) => Some(format!("Bearer {}", self.token(challenge).await?)),
            (None, Auth::Basic { username, password }) => Some(basic(username, password)),
            (None, _) => None,
        };
        self.set(value)
    }

    fn set(&self, value: Option<String>) -> Result<()> {
        if let Ok(mut slot) = self.authorization.lock() {
            *slot = value;
        }
        Ok(())
    }

    /// Asks the challenge's realm for a pull token of this repository: `GET
    /// <realm>?service=<service>&scope=repository:<repository>:pull`, with the basic
    /// credentials when there are some. The answer is JSON, read up to [`MAX_TOKEN_BYTES`].
    async fn token(&self, challenge: &Challenge) -> Result<String> {
        let registry = self.image.resolve_registry();
        let failed = |problem: String| Error::Token {
            registry: registry.to_string(),
            problem,
        };
        let realm = challenge.param("realm").unwrap_or_default();
        let mut url = reqwest::Url::parse(realm).map_err(|e| {
            failed(format!(
                "its challenge names the realm{} ({e})",
                excerpt(realm.as_bytes())
            ))
        })?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(failed(format!(
                "its challenge names the realm{}, not an HTTP(S) URL",
                excerpt(realm.as_bytes())
            )));
        }
        let at = origin(&url);
        {
            let mut query = url.query_pairs_mut();
            if let Some(service) = challenge.param("service") {
                query.append_pair("service", service);
            }
            query.append_pair(
                "scope",
                &format!("repository:{}:pull", self.image.repository()),
            );
        }
        let mut request = self.http.get(url);
        if let Auth::Basic { username, password } = self.auth {
            request = request.header(reqwest::header::AUTHORIZATION, basic(username, password));
        }
        let what = format!("asking {at} for a pull token of {registry}");
        let mut response = request.send().await.map_err(|source| Error::Http {
            what: what.clone(),
            source,
        })?;
        let status = response.status();
        if !status.is_success() {
            let head = head_of(&mut response).await;
            return Err(failed(format!(
                "the token realm {at} answered {status}{}",
                excerpt(&head)
            )));
        }
        let Some(body) = read_at_most(&mut response, MAX_TOKEN_BYTES, &what).await? else {
            return Err(Error::TokenTooLarge {
                registry: registry.to_string(),
                realm: at,
                limit: MAX_TOKEN_BYTES,
            });
        };
        #[derive(serde::Deserialize)]
        struct Answer {
            token: Option<String>,
            access_token: Option<String>,
        }
        let answer: Answer = serde_json::from_slice(&body).map_err(|e| {
            failed(format!(
                "the token realm {at} answered no JSON token{}",
                excerpt(e.to_string().as_bytes())
            ))
        })?;
        let token = answer
            .token
            .filter(|t| !t.is_empty())
            .or(answer.access_token)
            .unwrap_or_default();
        if token.is_empty() {
            return Err(failed(format!(
                "the token realm {at} answered no token (neither \"token\" nor \"access_token\")"
            )));
        }
        // It goes into a header: visible ASCII only (base64, JWTs).
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(failed(format!(
                "the token realm {at} answered a token with characters a header cannot carry"
            )));
        }
        Ok(token)
    }

    /// A 2xx answer to `GET <base><path>`; a 401 asks for a new token once (a token
    /// outlives few layer downloads), by the 401's own challenge.
    pub async fn get(&self, path: &str, accept: Option<&str>) -> Result<reqwest::Response> {
        let url = format!("{}{path}", self.base);
        let mut retried = false;
        loop {
            let mut request = self.http.get(&url);
            if let Some(a) = accept {
                request = request.header(reqwest::header::ACCEPT, a);
            }
            let authorization = self.authorization.lock().ok().and_then(|a| a.clone());
            if let Some(a) = authorization {
                request = request.header(reqwest::header::AUTHORIZATION, a);
            }
            let mut response = request.send().await.map_err(|source| Error::Http {
                what: format!("fetching {url}"),
                source,
            })?;
            let status = response.status();
            if status.is_success() {
                return Ok(response);
            }
            if status == reqwest::StatusCode::UNAUTHORIZED && !retried {
                retried = true;
                let challenges = challenges_of(&response);
                drop(response);
                if challenges.is_empty() {
                    self.authorize().await?;
                } else {
                    self.authorize_with(&challenges).await?;
                }
                continue;
            }
            let head = head_of(&mut response).await;
            return Err(Error::RegistryStatus {
                url,
                status,
                excerpt: excerpt(&head),
            });
        }
    }
}

/// The first bytes of an answer's body (for an excerpt), the rest left unread.
async fn head_of(response: &mut reqwest::Response) -> Vec<u8> {
    let mut head = Vec::new();
    while head.len() < EXCERPT {
        match response.chunk().await {
            Ok(Some(c)) => head.extend_from_slice(&c),
            _ => break,
        }
    }
    head
}

/// The body, or `None` as soon as it is known to be past `limit` (by `Content-Length` or
/// while streaming): the rest is never read.
async fn read_at_most(
    response: &mut reqwest::Response,
    limit: u64,
    what: &str,
) -> Result<Option<Vec<u8>>> {
    if response.content_length().is_some_and(|n| n > limit) {
        return Ok(None);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|source| Error::Http {
        what: what.to_string(),
        source,
    })? {
        if (body.len() + chunk.len()) as u64 > limit {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}

/// `<scheme>://<host>[:<port>]` of a URL, at most 100 characters (the realm is the
/// registry's choice; its path and query are not shown).
fn origin(url: &reqwest::Url) -> String {
    let host = url.host_str().unwrap_or_default();
    let text = match url.port() {
        Some(port) => format!("{}://{host}:{port}", url.scheme()),
        None => format!("{}://{host}", url.scheme()),
    };
    text.chars().take(100).collect()
}

/// One challenge of a `WWW-Authenticate` header: its scheme (lowercase) and parameters
/// (names lowercase, quoted values unescaped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Challenge {
    pub scheme: String,
    pub params: Vec<(String, String)>,
}

impl Challenge {
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The challenges of every `WWW-Authenticate` header of an answer (the header values are
/// bounded by hyper's header limits); values that are not text are skipped.
fn challenges_of(response: &reqwest::Response) -> Vec<Challenge> {
    response
        .headers()
        .get_all(reqwest::header::WWW_AUTHENTICATE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(challenges)
        .collect()
}

/// Parses `Bearer realm="https://auth.example/token",service="registry.example"` and the
/// like (RFC 9110 11.6.1): several challenges separated by commas, each a scheme and
/// `name=value` parameters, values as tokens or quoted strings with `\` escapes. A
/// `token68` (`Basic abc=`) is skipped. What does not parse ends the list.
pub(crate) fn challenges(header: &str) -> Vec<Challenge> {
    let s = header.as_bytes();
    let mut out: Vec<Challenge> = Vec::new();
    let mut i = 0;
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    let skip = |i: &mut usize, set: &[u8]| {
        while *i < s.len() && set.contains(&s[*i]) {
            *i += 1;
        }
    };
    loop {
        skip(&mut i, b" \t,");
        if i >= s.len() {
            return out;
        }
        let start = i;
        while i < s.len() && tchar(s[i]) {
            i += 1;
        }
        if i == start {
            return out;
        }
        let name = header[start..i].to_ascii_lowercase();
        skip(&mut i, b" \t");
        if i < s.len() && s[i] == b'=' {
            // `name=value` of the current challenge, or the `=` padding of a token68.
            i += 1;
            skip(&mut i, b" \t");
            let value = if i < s.len() && s[i] == b'"' {
                i += 1;
                let mut value = Vec::new();
                while i < s.len() && s[i] != b'"' {
                    if s[i] == b'\\' && i + 1 < s.len() {
                        i += 1;
                    }
                    value.push(s[i]);
                    i += 1;
                }
                i += 1;
                String::from_utf8_lossy(&value).into_owned()
            } else {
                let start = i;
                while i < s.len() && !b", \t".contains(&s[i]) {
                    i += 1;
                }
                header[start..i].to_string()
            };
            if let Some(current) = out.last_mut() {
                current.params.push((name, value));
            }
        } else {
            out.push(Challenge {
                scheme: name,
                params: Vec::new(),
            });
            // A token68 right after the scheme (`abc==` then a comma or the end): not a
            // parameter list.
            let start = i;
            while i < s.len() && (tchar(s[i]) || s[i] == b'/') {
                i += 1;
            }
            let mut j = i;
            while j < s.len() && s[j] == b'=' {
                j += 1;
            }
            skip(&mut j, b" \t");
            i = if i > start && (j >= s.len() || s[j] == b',') {
                j
            } else {
                start
            };
        }
    }
}

/// An HTTP basic `Authorization` value.
fn basic(username: &str, password: &str) -> String {
    use base64::Engine as _;
    let pair = format!("{username}:{password}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

/// The image manifest (an index resolved to linux/amd64 first), its digest and the
/// index's, when the reference names an index. Both digests are computed from the bytes read.
pub(crate) async fn manifest(
    session: &Session<'_>,
    limit: u64,
) -> Result<(OciImageManifest, Digest, Option<Digest>)> {
    let image = session.image;
    let first_ref = image
        .digest()
        .unwrap_or_else(|| image.tag().unwrap_or("latest"));
    let body = fetch(session, &format!("manifests/{first_ref}"), limit).await?;
    let digest = Digest::of(&body);
    match parse(&body, &image.whole())? {
        OciManifest::Image(m) => Ok((m, digest, None)),
        OciManifest::ImageIndex(index) => {
            let wanted =
                oci_client::client::linux_amd64_resolver(&index.manifests).ok_or_else(|| {
                    Error::Manifest {
                        what: format!("index of {}", image.whole()),
                        problem: "no linux/amd64 image in it".into(),
                    }
                })?;
            let wanted = Digest::parse(&wanted)?;
            let body = fetch(session, &format!("manifests/{wanted}"), limit).await?;
            let got = Digest::of(&body);
            wanted.verify(&got, format!("linux/amd64 manifest of {}", image.whole()))?;
            match parse(&body, &image.whole())? {
                OciManifest::Image(m) => Ok((m, got, Some(digest))),
                OciManifest::ImageIndex(_) => Err(Error::Manifest {
                    what: format!("manifest {got} of {}", image.whole()),
                    problem: "an index inside an index".into(),
                }),
            }
        }
    }
}

fn parse(body: &[u8], what: &str) -> Result<OciManifest> {
    serde_json::from_slice(body).map_err(|e| Error::Manifest {
        what: format!("manifest of {what}"),
        problem: e.to_string(),
    })
}

/// A manifest (`manifests/<ref>`) or the config (`blobs/<digest>`), at most `limit` bytes.
pub(crate) async fn fetch(session: &Session<'_>, path: &str, limit: u64) -> Result<Vec<u8>> {
    let accept = [
        OCI_IMAGE_MEDIA_TYPE,
        IMAGE_MANIFEST_MEDIA_TYPE,
        OCI_IMAGE_INDEX_MEDIA_TYPE,
        IMAGE_MANIFEST_LIST_MEDIA_TYPE,
    ]
    .join(", ");
    let what = format!("{}{path}", session.base);
    let mut response = session.get(path, Some(&accept)).await?;
    read_at_most(&mut response, limit, &format!("fetching {what}"))
        .await?
        .ok_or_else(|| too_large(&what, limit))
}

fn too_large(what: &str, limit: u64) -> Error {
    Error::DocumentTooLarge {
        what: what.to_string(),
        limit,
    }
}

/// `: <excerpt>` of a registry's error body, printable ASCII only (it is the registry's
/// text, shown to whoever asked for the pull), or nothing.
pub(crate) fn excerpt(body: &[u8]) -> String {
    let text: String = body
        .iter()
        .take(EXCERPT)
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                char::from(b)
            } else {
                ' '
            }
        })
        .collect();
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if text.is_empty() {
        String::new()
    } else {
        format!(": {text}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(scheme: &str, params: &[(&str, &str)]) -> Challenge {
        Challenge {
            scheme: scheme.into(),
            params: params
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn challenges_parse() {
        assert_eq!(
            challenges(
                r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/alpine:pull""#
            ),
            [c(
                "bearer",
                &[
                    ("realm", "https://auth.docker.io/token"),
                    ("service", "registry.docker.io"),
                    ("scope", "repository:library/alpine:pull"),
                ]
            )]
        );
        // Spaces, case, escapes, a comma inside quotes, an unquoted value.
        assert_eq!(
            challenges(r#"BEARER  Realm = "https://a/t?x=1,y=\"2\"\\" , service=reg"#),
            [c(
                "bearer",
                &[("realm", r#"https://a/t?x=1,y="2"\"#), ("service", "reg")]
            )]
        );
        assert_eq!(
            challenges(r#"Basic realm="Registry Realm""#),
            [c("basic", &[("realm", "Registry Realm")])]
        );
        // Several challenges, a token68 among them.
        assert_eq!(
            challenges(
                r#"Negotiate abc==, Basic realm="x", Bearer realm="https://r/t",service="s""#
            ),
            [
                c("negotiate", &[]),
                c("basic", &[("realm", "x")]),
                c("bearer", &[("realm", "https://r/t"), ("service", "s")]),
            ]
        );
        assert_eq!(challenges("Bearer"), [c("bearer", &[])]);
        assert!(challenges("").is_empty());
        // Garbage ends the list; an unterminated quote takes the rest.
        assert_eq!(
            challenges(r#"Bearer realm="x"; evil"#),
            [c("bearer", &[("realm", "x")])]
        );
        assert_eq!(
            challenges(r#"Bearer realm="https://r/t"#),
            [c("bearer", &[("realm", "https://r/t")])]
        );
        assert!(challenges("\"Bearer\"").is_empty());
    }

    #[test]
    fn origins_are_short() {
        let url = reqwest::Url::parse("https://auth.example:8443/token?x=secret").unwrap();
        assert_eq!(origin(&url), "https://auth.example:8443");
        let long = reqwest::Url::parse(&format!("https://{}.example/", "a".repeat(300))).unwrap();
        assert_eq!(origin(&long).chars().count(), 100);
    }
}
