//! Signed file URLs of secure sandboxes (E2B's `download_url()` / `upload_url()`): a
//! `GET` or `POST /files` without `X-Access-Token` is let through when its query carries
//! `signature=v1_<base64(sha256("path:operation:username:token[:expiration]"))>`, as envd
//! checks it: `operation` is `read` for GET and `write` for POST, `username` is the query's
//! (empty for the default user), and `signature_expiration` (Unix seconds), when present, is
//! part of what was signed and must not have passed.
//!
//! The proxy checks it (it holds the token) and forwards the request with the token in the
//! header, so the agent's own check passes whatever its version. A signature is bound to
//! one path, one operation and one user: reused for another of any of them it is refused.

use crate::http::error::ApiError;
use crate::util::constant_time_eq;
use base64::Engine;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use sha2::{Digest, Sha256};

/// The query parameters a signed URL carries, percent-decoded; the first of repeats wins.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SignedQuery {
    pub path: String,
    pub username: String,
    pub signature: Option<String>,
    pub expiration: Option<String>,
}

impl SignedQuery {
    pub fn parse(query: Option<&str>) -> SignedQuery {
        let mut q = SignedQuery::default();
        let (mut path, mut user) = (None, None);
        for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
            let slot = match &*k {
                "path" => &mut path,
                "username" => &mut user,
                "signature" => &mut q.signature,
                "signature_expiration" => &mut q.expiration,
                _ => continue,
            };
            if slot.is_none() {
                *slot = Some(v.into_owned());
            }
        }
        q.path = path.unwrap_or_default();
        q.username = user.unwrap_or_default();
        q
    }
}

/// envd's v1 signature of a file operation.
pub fn sign(path: &str, operation: &str, username: &str, token: &str, exp: Option<i64>) -> String {
    let raw = match exp {
        None => format!("{path}:{operation}:{username}:{token}"),
        Some(e) => format!("{path}:{operation}:{username}:{token}:{e}"),
    };
    format!(
        "v1_{}",
        STANDARD_NO_PAD.encode(Sha256::digest(raw.as_bytes()))
    )
}

/// Whether the request (`method`, `path` of the URL, its `query`) is a valid signed file
/// request for `token` at `now` (Unix seconds): `Ok(false)` when it carries no signature
/// (the caller then asks for the header), an error naming what is wrong when its signature
/// does not hold.
pub fn check(
    method: &str,
    url_path: &str,
    query: Option<&str>,
    token: &str,
    now: i64,
) -> Result<bool, ApiError> {
    let operation = match (method, url_path) {
        ("GET", "/files") => "read",
        ("POST", "/files") => "write",
        _ => return Ok(false),
    };
    let q = SignedQuery::parse(query);
    let Some(given) = q.signature.as_deref() else {
        return Ok(false);
    };
    let exp = match q.expiration.as_deref() {
        None => None,
        Some(e) => Some(e.parse::<i64>().map_err(|_| {
            ApiError::bad_request(format!(
                "signature_expiration {e:?} is not a Unix time in seconds"
            ))
        })?),
    };
    let expected = sign(&q.path, operation, &q.username, token, exp);
    if !constant_time_eq(given.as_bytes(), expected.as_bytes()) {
        return Err(ApiError::unauthorized("invalid signature"));
    }
    if exp.is_some_and(|e| e < now) {
        return Err(ApiError::unauthorized("signature is already expired"));
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "tok-123";

    fn query(path: &str, user: &str, sig: &str, exp: Option<i64>) -> String {
        let mut q = form_urlencoded::Serializer::new(String::new());
        q.append_pair("path", path);
        if !user.is_empty() {
            q.append_pair("username", user);
        }
        q.append_pair("signature", sig);
        if let Some(e) = exp {
            q.append_pair("signature_expiration", &e.to_string());
        }
        q.finish()
    }

    #[test]
    fn matches_the_sdks_signature() {
        // What the e2b Python SDK's get_signature(path, operation, user, "tok-123") makes.
        let sig = sign("/home/user/a b.txt", "read", "", TOKEN, None);
        assert_eq!(sig, "v1_iWKP4h+2B8CKBZjd5tQn/grLjOytF6xbAMqPrFOfecI");
        assert_eq!(
            sign("/a", "write", "user", TOKEN, None),
            "v1_N0jyOwV4bM5nbjkA0b5Jxuh4dknO4uWVl5Zw7nWtiRI"
        );
        let q = query("/home/user/a b.txt", "", &sig, None);
        assert_eq!(check("GET", "/files", Some(&q), TOKEN, 0).ok(), Some(true));
    }

    #[test]
    fn a_signature_holds_for_one_path_operation_user_and_time() {
        let sig = sign("/a", "read", "user", TOKEN, Some(100));
        let ok = query("/a", "user", &sig, Some(100));
        assert_eq!(
            check("GET", "/files", Some(&ok), TOKEN, 100).ok(),
            Some(true)
        );
        for (method, q, now) in [
            ("POST", ok.clone(), 100),                          // another operation
            ("GET", query("/b", "user", &sig, Some(100)), 100), // another path
            ("GET", query("/a", "root", &sig, Some(100)), 100), // another user
            ("GET", query("/a", "user", &sig, Some(200)), 100), // a later expiration
            ("GET", query("/a", "user", &sig, None), 100),      // expiration dropped
            ("GET", ok.clone(), 101),                           // expired
        ] {
            assert!(
                check(method, "/files", Some(&q), TOKEN, now).is_err(),
                "{method} {q} {now}"
            );
        }
        assert!(check("GET", "/files", Some(&ok), "other-token", 100).is_err());
    }

    #[test]
    fn no_signature_or_another_route_is_not_a_signed_request() {
        assert_eq!(
            check("GET", "/files", Some("path=/a"), TOKEN, 0).ok(),
            Some(false)
        );
        let sig = sign("/a", "read", "", TOKEN, None);
        let q = query("/a", "", &sig, None);
        assert_eq!(
            check("GET", "/process.Process/List", Some(&q), TOKEN, 0).ok(),
            Some(false)
        );
        assert_eq!(
            check("DELETE", "/files", Some(&q), TOKEN, 0).ok(),
            Some(false)
        );
        let bad_exp = format!("{q}&signature_expiration=soon");
        assert!(check("GET", "/files", Some(&bad_exp), TOKEN, 0).is_err());
    }
}
