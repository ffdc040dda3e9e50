//! The egress proxy's side of the secrets: fills a `network.rules` transform with the
//! current values of the secrets of the key that owns the sandbox (sandcell-net calls
//! [`SecretsResolver`] once per request, crates/net/src/rules.rs), and checks a transform's
//! placeholders when rules are set (create, `PUT /sandboxes/{id}/network`).

use crate::secrets::placeholders::{self, PlaceholderError};
use crate::secrets::service::Secrets;
use crate::store::Db;
use sandcell_runtime::net::inject::InjectedHeader;
use sandcell_runtime::net::policy::EgressSpec;
use sandcell_runtime::net::rules::{ResolveError, Resolved, Resolver};
use std::future::Future;
use std::pin::Pin;

/// Resolves for the owner of the running sandbox on a network: a network without one (its
/// sandbox ended, a pooled network not handed out) resolves nothing.
pub struct SecretsResolver {
    pub db: Db,
    pub secrets: Secrets,
}

impl SecretsResolver {
    async fn fill(&self, net_id: &str, domain: &str, headers: &[(String, String)]) -> Resolved {
        let key = self
            .db
            .key_of_running_net(net_id)
            .await
            .map_err(|e| ResolveError(format!("finding the sandbox's owner: {e}")))?
            .ok_or_else(|| ResolveError(format!("network {net_id} has no running sandbox")))?;
        let mut out = Vec::with_capacity(headers.len());
        for (name, template) in headers {
            let (value, used) = placeholders::fill(&self.secrets, &key, name, template)
                .await
                .map_err(|e| match e {
                    // The key's own secret names only (a name is not a secret).
                    PlaceholderError::Missing(_) => ResolveError(e.to_string()),
                    e => {
                        tracing::warn!("filling header {name} for {domain}: {e}");
                        ResolveError(format!("header {name}: the secrets could not be read"))
                    }
                })?;
            out.push(InjectedHeader {
                name: name.clone(),
                value: value.expose().to_string(),
                secrets: used,
            });
        }
        Ok(out)
    }
}

impl Resolver for SecretsResolver {
    fn resolve<'a>(
        &'a self,
        net_id: &'a str,
        domain: &'a str,
        headers: &'a [(String, String)],
    ) -> Pin<Box<dyn Future<Output = Resolved> + Send + 'a>> {
        Box::pin(self.fill(net_id, domain, headers))
    }
}

/// Checks the placeholders of every transform of `egress` (names, at most 32 per domain,
/// header names and values); the structure is sandcell-net's (`Policy::from_spec`).
pub fn check_transforms(egress: &EgressSpec) -> Result<(), PlaceholderError> {
    for (domain, rules) in &egress.rules {
        for t in rules.iter().filter_map(|r| r.transform.as_ref()) {
            let headers: Vec<(String, String)> = t
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            placeholders::names_of_transform(domain, &headers)?;
        }
    }
    Ok(())
}
