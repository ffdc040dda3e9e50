//! E2B's `network.rules`: per domain, a list of rules, each with an optional `transform`
//! whose `headers` the egress proxy sets on every request to that domain (issue 17). The
//! header values may hold `${e2b.secrets.<name>}` placeholders: the sandbox only ever sees
//! those; the host fills them per request from the owner's secrets ([`Resolver`]).
//!
//! What is checked here (the structure): the domain is a plain name (no wildcard, no
//! address) that an `allowOut` domain entry allows, at most one transform per domain (E2B's
//! limit). The placeholders themselves (names, at most 32 per domain) are the server's to
//! check: it owns the secrets.
//!
//! Where it applies: plain HTTP on port 80 to the domain, through the Host-checking proxy
//! ([`crate::hostcheck`], [`crate::inject`]); HTTPS on port 443 when the daemon intercepts
//! TLS ([`crate::intercept`], on by default). Without interception, TLS to a rule's domain
//! is not intercepted: its requests leave with the placeholder, never with the value.

use crate::inject::InjectedHeader;
use crate::policy::{AllowEntry, DomainRule, Policy, PolicyError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

/// E2B's `SandboxNetworkTransform`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transform {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

/// E2B's `SandboxNetworkRule`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transform: Option<Transform>,
}

/// `rules` as the API gives it: domain -> rules.
pub type Rules = BTreeMap<String, Vec<Rule>>;

/// The checked transforms: lowercase domain -> (header, template) pairs.
pub type Transforms = BTreeMap<String, Vec<(String, String)>>;

/// The ports whose plain HTTP gets the headers (HTTP's own).
pub const INJECT_PORTS: &[u16] = &[80];

/// The ports whose TLS is intercepted for a rule's domain when interception is on
/// (unless `serve --no-egress-intercept-tls`, [`crate::intercept`]): HTTPS's own.
pub const INTERCEPT_PORTS: &[u16] = &[443];

fn bad(msg: String) -> PolicyError {
    PolicyError::BadRule(msg)
}

/// Checks `rules` against `policy` (its `allowOut` already parsed) and keeps the transforms.
pub fn transforms(rules: &Rules, policy: &Policy) -> Result<Transforms, PolicyError> {
    let mut out = Transforms::new();
    for (domain, list) in rules {
        let name = match domain.parse::<AllowEntry>() {
            Ok(AllowEntry::Domain(DomainRule::Exact(name))) => name,
            _ => {
                return Err(bad(format!(
                    "{domain:?}: a rule's key must be a domain name (not a wildcard or an address)"
                )));
            }
        };
        if !policy.domain_allowed(&name) {
            return Err(bad(format!(
                "{domain:?} has rules but is not allowed by allowOut: add it to allowOut"
            )));
        }
        let with_transform: Vec<&Transform> =
            list.iter().filter_map(|r| r.transform.as_ref()).collect();
        if with_transform.len() > 1 {
            return Err(bad(format!(
                "{domain:?}: only one transform per domain is supported, got {}",
                with_transform.len()
            )));
        }
        if out.contains_key(&name) {
            return Err(bad(format!("{domain:?} is given twice")));
        }
        let headers = with_transform
            .first()
            .map(|t| {
                t.headers
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default();
        out.insert(name, headers);
    }
    Ok(out)
}

/// Why the host could not fill a transform (the request is then refused, never sent).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ResolveError(pub String);

/// The filled headers of one request.
pub type Resolved = Result<Vec<InjectedHeader>, ResolveError>;

/// What fills a transform's templates with the current secret values of the owner of the
/// sandbox on network `net_id` (the server: it holds the secrets and knows the owners).
pub trait Resolver: Send + Sync {
    fn resolve<'a>(
        &'a self,
        net_id: &'a str,
        domain: &'a str,
        headers: &'a [(String, String)],
    ) -> Pin<Box<dyn Future<Output = Resolved> + Send + 'a>>;
}

/// Process-wide: one daemon, one secrets store. Set once at start ([`set_resolver`]);
/// without one, a rule's domain is refused rather than reached without its headers.
static RESOLVER: OnceLock<Arc<dyn Resolver>> = OnceLock::new();

/// Installs the resolver (the first call wins).
pub fn set_resolver(r: Arc<dyn Resolver>) {
    let _ = RESOLVER.set(r);
}

pub(crate) fn resolver() -> Option<Arc<dyn Resolver>> {
    RESOLVER.get().cloned()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::policy::EgressSpec;

    fn spec(allow: &[&str], rules: serde_json::Value) -> EgressSpec {
        EgressSpec {
            allow_out: allow.iter().map(|s| s.to_string()).collect(),
            rules: serde_json::from_value(rules).unwrap(),
            ..Default::default()
        }
    }

    #[test]
    fn rules_need_their_domain_in_allow_out_and_one_transform() {
        let one = serde_json::json!({"API.example.com": [{"transform": {"headers": {"Authorization": "Bearer ${e2b.secrets.k}"}}}]});
        let p = Policy::from_spec(&spec(&["api.example.com"], one.clone())).unwrap();
        assert_eq!(
            p.transforms["api.example.com"],
            [(
                "Authorization".to_string(),
                "Bearer ${e2b.secrets.k}".to_string()
            )]
        );
        // A wildcard entry allows it too.
        assert!(Policy::from_spec(&spec(&["*.example.com"], one.clone())).is_ok());
        for (allow, rules) in [
            (vec!["other.example.com"], one),
            (
                vec!["*.example.com"],
                serde_json::json!({"*.example.com": [{}]}),
            ),
            (vec!["1.2.3.4"], serde_json::json!({"1.2.3.4": [{}]})),
            (
                vec!["a.example.com"],
                serde_json::json!({"a.example.com": [{"transform": {}}, {"transform": {}}]}),
            ),
            (
                vec!["a.example.com"],
                serde_json::json!({"a.example.com": [], "A.example.com": []}),
            ),
        ] {
            let e = Policy::from_spec(&spec(&allow, rules.clone())).unwrap_err();
            assert!(matches!(e, PolicyError::BadRule(_)), "{rules}: {e}");
        }
    }

    #[test]
    fn stored_rules_read_back_and_old_rows_have_none() {
        let s = spec(
            &["a.example.com"],
            serde_json::json!({"a.example.com": [{"transform": {"headers": {"X": "y"}}}]}),
        );
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<EgressSpec>(&text).unwrap(), s);
        let old: EgressSpec = serde_json::from_str(r#"{"allowOut":["a.example.com"]}"#).unwrap();
        assert!(old.rules.is_empty());
        assert!(!serde_json::to_string(&old).unwrap().contains("rules"));
    }
}
