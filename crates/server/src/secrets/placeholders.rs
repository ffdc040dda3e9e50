//! `${e2b.secrets.<name>}` placeholders (what E2B's `Secret.fill(name)` makes) in the
//! header values of a `network.rules` transform: finding the names a template refers to
//! (checked when rules are set) and filling a template with the current values (for each
//! request the egress proxy rewrites, through secrets/inject.rs).

use crate::secrets::crypto::SecretValue;
use crate::secrets::service::{Secrets, SecretsError, canonical_name};

pub const OPEN: &str = "${e2b.secrets.";
const CLOSE: char = '}';
/// E2B's bound on the secrets one domain's transform may name.
pub const MAX_NAMES_PER_DOMAIN: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum PlaceholderError {
    #[error("header {header:?}: a placeholder is not closed with '}}'")]
    Unclosed { header: String },
    #[error("header {header:?}: {source}")]
    Name {
        header: String,
        #[source]
        source: SecretsError,
    },
    #[error("a transform of domain {domain:?} names {n} secrets, at most {MAX_NAMES_PER_DOMAIN}")]
    TooMany { domain: String, n: usize },
    #[error("header {0:?}: not a valid header name, or a value with CR, LF or NUL")]
    BadHeader(String),
    /// At fill time: the key has no secret of that name (the request is refused rather
    /// than sent with the placeholder).
    #[error("secret {0:?} doesn't exist")]
    Missing(String),
    #[error(transparent)]
    Secrets(#[from] SecretsError),
}

/// The pieces of a template: literal text and secret names, in order.
#[derive(Debug, PartialEq, Eq)]
enum Piece<'a> {
    Text(&'a str),
    Secret(String),
}

fn pieces<'a>(header: &str, template: &'a str) -> Result<Vec<Piece<'a>>, PlaceholderError> {
    let mut out = Vec::new();
    let mut rest = template;
    while let Some(at) = rest.find(OPEN) {
        if at > 0 {
            out.push(Piece::Text(&rest[..at]));
        }
        let after = &rest[at + OPEN.len()..];
        let end = after
            .find(CLOSE)
            .ok_or_else(|| PlaceholderError::Unclosed {
                header: header.into(),
            })?;
        let name = canonical_name(&after[..end]).map_err(|source| PlaceholderError::Name {
            header: header.into(),
            source,
        })?;
        out.push(Piece::Secret(name));
        rest = &after[end + 1..];
    }
    if !rest.is_empty() {
        out.push(Piece::Text(rest));
    }
    Ok(out)
}

fn valid_header(name: &str, template: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        && !template.bytes().any(|b| matches!(b, b'\r' | b'\n' | 0))
}

/// The distinct secret names `headers` (one domain's transform) refer to, checked against
/// E2B's bounds.
pub fn names_of_transform(
    domain: &str,
    headers: &[(String, String)],
) -> Result<Vec<String>, PlaceholderError> {
    let mut names = Vec::new();
    for (header, template) in headers {
        if !valid_header(header, template) {
            return Err(PlaceholderError::BadHeader(header.clone()));
        }
        for p in pieces(header, template)? {
            if let Piece::Secret(n) = p
                && !names.contains(&n)
            {
                names.push(n);
            }
        }
    }
    if names.len() > MAX_NAMES_PER_DOMAIN {
        return Err(PlaceholderError::TooMany {
            domain: domain.into(),
            n: names.len(),
        });
    }
    Ok(names)
}

/// `template` with each placeholder replaced by the current value of key `key_id`'s
/// secret, and the `(name, version)`s used (for the audit log).
pub async fn fill(
    secrets: &Secrets,
    key_id: &str,
    header: &str,
    template: &str,
) -> Result<(SecretValue, Vec<(String, i64)>), PlaceholderError> {
    let mut value = zeroize::Zeroizing::new(String::with_capacity(template.len()));
    let mut used = Vec::new();
    for p in pieces(header, template)? {
        match p {
            Piece::Text(t) => value.push_str(t),
            Piece::Secret(name) => {
                let (version, v) = secrets
                    .resolve(key_id, &name)
                    .await?
                    .ok_or_else(|| PlaceholderError::Missing(name.clone()))?;
                value.push_str(v.expose());
                used.push((name, version));
            }
        }
    }
    Ok((SecretValue::new(std::mem::take(&mut *value)), used))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn h(name: &str, v: &str) -> (String, String) {
        (name.into(), v.into())
    }

    #[test]
    fn names_are_found_checked_and_bounded() {
        let names = names_of_transform(
            "api.example.com",
            &[
                h("Authorization", "Bearer ${e2b.secrets.OpenAI}"),
                h("X-Pair", "${e2b.secrets.a}:${e2b.secrets.openai}"),
                h("X-Plain", "no placeholder"),
            ],
        )
        .unwrap();
        assert_eq!(names, ["openai", "a"]);
        for bad in [
            h("Authorization", "Bearer ${e2b.secrets.open"),
            h("Authorization", "${e2b.secrets.has space}"),
            h("Authorization", "${e2b.secrets.}"),
            h("Bad Header", "x"),
            h("X-Split", "a\r\nX-Injected: 1"),
        ] {
            assert!(
                names_of_transform("d", std::slice::from_ref(&bad)).is_err(),
                "{bad:?}"
            );
        }
        let many: Vec<_> = (0..33)
            .map(|i| h(&format!("X-{i}"), &format!("${{e2b.secrets.s{i}}}")))
            .collect();
        assert!(matches!(
            names_of_transform("d", &many),
            Err(PlaceholderError::TooMany { n: 33, .. })
        ));
        assert_eq!(names_of_transform("d", &many[..32]).unwrap().len(), 32);
    }

    #[tokio::test]
    async fn fill_uses_the_current_values_of_the_key_and_refuses_a_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::store::Db::open(&dir.path().join("db.sqlite"))
            .await
            .unwrap();
        db.insert_test_key("key_a").await.unwrap();
        let ring = crate::secrets::crypto::KeyRing::load_or_create(dir.path()).unwrap();
        let s = Secrets::new(db, ring);
        let v = |x: &str| SecretValue::new(x.into());
        s.create("key_a", "tok", &v("t1"), Default::default())
            .await
            .unwrap();
        s.update("key_a", "tok", &v("t2"), None).await.unwrap();
        let (filled, used) = fill(&s, "key_a", "Authorization", "Bearer ${e2b.secrets.TOK}!")
            .await
            .unwrap();
        assert_eq!(filled.expose(), "Bearer t2!");
        assert_eq!(used, [("tok".to_string(), 2)]);
        assert!(matches!(
            fill(&s, "key_other", "A", "${e2b.secrets.tok}").await,
            Err(PlaceholderError::Missing(_))
        ));
    }
}
