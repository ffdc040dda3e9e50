//! E2B's `network.egressProxy` on the daemon's side: checked where the API takes it (create,
//! `PUT /sandboxes/{id}/network`), recorded with the sandbox's rules (the password sealed
//! with the secrets key ring: the proxy must be dialled again after a resume, a restore or
//! a restart), put back in force whenever the runtime gives the sandbox its network, shown
//! without its password. The proxying itself is sandcell-net's (tunnel.rs).

use crate::error::Error;
use crate::networks::service::NetworkError;
use crate::secrets::crypto::{CryptoError, KeyRing, Sealed, SecretValue};
use crate::store::Db;
use base64::Engine;
use sandcell_runtime::net::reserved::Destinations;
use sandcell_runtime::net::tunnel::EgressProxy;
use sandcell_runtime::net::{EgressSpec, SandboxNet};
use serde::{Deserialize, Serialize};

/// The prefix of a sealed password: `v1.<kid>.<nonce>.<ciphertext>` (base64), sealed by
/// [`KeyRing::seal_proxy_password`] for its sandbox.
const SEALED_V1: &str = "v1.";

/// The recorded form (the database only). Migration 17 wrote `password` in the clear;
/// [`reseal_all`] (at every start, and when the key rotates) turns such rows into
/// `sealed_password`.
#[derive(Serialize, Deserialize)]
struct Stored {
    address: String,
    #[serde(default)]
    username: Option<String>,
    /// Migration 17's plaintext: read, never written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    password: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sealed_password: Option<String>,
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

fn encode_sealed(s: &Sealed) -> String {
    format!(
        "{SEALED_V1}{}.{}.{}",
        s.kid,
        b64().encode(&s.nonce),
        b64().encode(&s.ciphertext)
    )
}

/// A stored password that is not as [`encode_sealed`] writes it (never its content).
fn unreadable(sandbox: &str) -> Error {
    Error::Io {
        what: format!(
            "the egress proxy password of sandbox {sandbox} is not in a format this daemon \
             reads (expected {SEALED_V1}...)"
        ),
        source: std::io::Error::from(std::io::ErrorKind::InvalidData),
    }
}

fn decode_sealed(sandbox: &str, text: &str) -> Result<Sealed, Error> {
    let rest = text
        .strip_prefix(SEALED_V1)
        .ok_or_else(|| unreadable(sandbox))?;
    let mut parts = rest.split('.');
    let (Some(kid), Some(nonce), Some(ct), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(unreadable(sandbox));
    };
    Ok(Sealed {
        kid: kid.to_string(),
        nonce: b64().decode(nonce).map_err(|_| unreadable(sandbox))?,
        ciphertext: b64().decode(ct).map_err(|_| unreadable(sandbox))?,
    })
}

fn parse(sandbox: &str, text: &str) -> Result<Stored, Error> {
    serde_json::from_str(text).map_err(|e| Error::Io {
        what: format!("reading the egress proxy of sandbox {sandbox}"),
        source: e.into(),
    })
}

fn encode(ring: Option<&KeyRing>, sandbox: &str, proxy: &EgressProxy) -> Result<String, Error> {
    let sealed_password = match &proxy.password {
        None => None,
        Some(p) => {
            let ring = ring.ok_or(CryptoError::Seal)?;
            let value = SecretValue::new(p.clone());
            Some(encode_sealed(&ring.seal_proxy_password(sandbox, &value)?))
        }
    };
    serde_json::to_string(&Stored {
        address: proxy.address.clone(),
        username: proxy.username.clone(),
        password: None,
        sealed_password,
    })
    .map_err(|e| Error::Io {
        what: "encoding an egress proxy".into(),
        source: e.into(),
    })
}

/// Checks a proxy given to the API (its shape, and that it leads nowhere sandboxes never
/// reach).
pub async fn check(dest: &Destinations, proxy: &EgressProxy) -> Result<(), NetworkError> {
    proxy.check(dest).await?;
    Ok(())
}

/// Records `proxy` (`None`: clears it) for `sandbox`, which has a network row, its password
/// sealed with `ring` (needed only when it has one).
pub async fn record(
    db: &Db,
    ring: Option<&KeyRing>,
    sandbox: &str,
    proxy: Option<&EgressProxy>,
) -> Result<(), Error> {
    let text = proxy.map(|p| encode(ring, sandbox, p)).transpose()?;
    db.set_sandbox_egress_proxy(sandbox, text.as_deref()).await
}

/// The proxy recorded for `sandbox`, with its password (opened with `ring`).
pub async fn recorded(
    db: &Db,
    ring: Option<&KeyRing>,
    sandbox: &str,
) -> Result<Option<EgressProxy>, Error> {
    let Some(text) = db.sandbox_egress_proxy(sandbox).await? else {
        return Ok(None);
    };
    let s = parse(sandbox, &text)?;
    let password = match (&s.sealed_password, s.password) {
        (Some(sealed), _) => {
            let sealed = decode_sealed(sandbox, sealed)?;
            let ring = ring.ok_or_else(|| CryptoError::UnknownKey(sealed.kid.clone()))?;
            Some(
                ring.open_proxy_password(sandbox, &sealed)?
                    .expose()
                    .to_string(),
            )
        }
        // Migration 17's plaintext, until [`reseal_all`] runs (it does at every start).
        (None, plain) => plain,
    };
    Ok(Some(EgressProxy {
        address: s.address,
        username: s.username,
        password,
    }))
}

/// Seals every recorded password in the clear (migration 17's rows) and reseals those of
/// another key under the ring's current one. Returns how many rows changed. A row that
/// does not read or open is logged (the sandbox named, never the value) and left as it is:
/// that sandbox's proxy then fails to come back, and it gets no egress (fail closed).
pub async fn reseal_all(db: &Db, ring: &KeyRing) -> Result<usize, Error> {
    let mut changed = 0;
    for (sandbox, text) in db.all_sandbox_egress_proxies().await? {
        let stale = parse(&sandbox, &text).and_then(|s| {
            Ok(match (&s.sealed_password, &s.password) {
                (Some(sealed), _) => decode_sealed(&sandbox, sealed)?.kid != ring.current_kid(),
                (None, plain) => plain.is_some(),
            })
        });
        let proxy = match stale {
            Ok(false) => continue,
            Ok(true) => recorded(db, Some(ring), &sandbox).await,
            Err(e) => Err(e),
        };
        match proxy {
            Ok(Some(proxy)) => {
                record(db, Some(ring), &sandbox, Some(&proxy)).await?;
                changed += 1;
            }
            Ok(None) => {}
            Err(e) => tracing::error!("sandbox {sandbox}: its egress proxy password: {e}"),
        }
    }
    if changed > 0 {
        tracing::info!("sealed the egress proxy password of {changed} sandbox(es) anew");
    }
    Ok(changed)
}

/// What GET shows: the recorded proxy without its password.
pub async fn shown(db: &Db, sandbox: &str) -> Result<Option<EgressProxy>, Error> {
    let Some(text) = db.sandbox_egress_proxy(sandbox).await? else {
        return Ok(None);
    };
    let s = parse(sandbox, &text)?;
    Ok(Some(EgressProxy {
        address: s.address,
        username: s.username,
        password: None,
    }))
}

/// A restore or fork child `to` of `from` goes out the way `from` did (the password sealed
/// anew for `to`).
pub async fn inherit(db: &Db, ring: Option<&KeyRing>, from: &str, to: &str) -> Result<(), Error> {
    let proxy = recorded(db, ring, from).await?;
    record(db, ring, to, proxy.as_ref()).await
}

/// The rules a network of `sandbox` starts with when the runtime makes it or takes it over:
/// `egress`, or none at all (nothing out) when it has a proxy, which [`restore`] then puts
/// in force with `egress`. So a restored sandbox whose processes run before that never
/// connects directly.
pub async fn starting_egress(
    db: &Db,
    sandbox: &str,
    egress: EgressSpec,
) -> Result<EgressSpec, Error> {
    Ok(match db.sandbox_egress_proxy(sandbox).await? {
        Some(_) => closed(),
        None => egress,
    })
}

/// Nothing out.
pub fn closed() -> EgressSpec {
    EgressSpec {
        allow_internet_access: false,
        ..EgressSpec::default()
    }
}

/// Puts the recorded rules and proxy of `sandbox` in force on `net` (which the runtime just
/// made or took over, with [`starting_egress`]). If that fails, the sandbox gets no egress
/// at all rather than a direct one (fail closed), and the error is returned.
pub async fn restore(
    db: &Db,
    ring: Option<&KeyRing>,
    sandbox: &str,
    net: &SandboxNet,
) -> Result<(), Error> {
    let Err(e) = put_back(db, ring, sandbox, net).await else {
        return Ok(());
    };
    if let Err(e2) = net.set_policy(&closed()).await {
        tracing::error!("sandbox {sandbox}: closing its egress after its proxy failed: {e2}");
    }
    Err(e)
}

async fn put_back(
    db: &Db,
    ring: Option<&KeyRing>,
    sandbox: &str,
    net: &SandboxNet,
) -> Result<(), Error> {
    let Some(proxy) = recorded(db, ring, sandbox).await? else {
        return Ok(());
    };
    let egress = crate::networks::service::egress_of(db, sandbox)
        .await?
        .unwrap_or_else(closed);
    net.restore_egress(&egress, &proxy)
        .await
        .map_err(|e| Error::Io {
            what: format!("sandbox {sandbox}: putting its egress proxy in force"),
            source: std::io::Error::other(e),
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const PASSWORD: &str = "pw-5f1c9e0a";

    fn proxy() -> EgressProxy {
        EgressProxy {
            address: "proxy.example.com:1080".into(),
            username: Some("u".into()),
            password: Some(PASSWORD.into()),
        }
    }

    async fn db_with(sandboxes: &[&str]) -> (tempfile::TempDir, Db, KeyRing) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("db.sqlite")).await.unwrap();
        for (i, id) in sandboxes.iter().enumerate() {
            if i == 0 {
                db.insert_test_sandbox(id).await.unwrap();
            } else {
                sqlx::query(
                    "INSERT INTO sandboxes (id, key_id, template_id, runtime, state, secure, \
                     vcpus, memory_mib, disk_mib, created_at) \
                     VALUES ($1, 'key_1', 'base', 'gvisor', 'creating', 0, 1, 512, 0, 0)",
                )
                .bind(id)
                .execute(db.pool())
                .await
                .unwrap();
            }
            db.insert_sandbox_network(id, "{}", None, None)
                .await
                .unwrap();
        }
        let ring = KeyRing::load_or_create(dir.path()).unwrap();
        (dir, db, ring)
    }

    #[tokio::test]
    async fn the_password_is_sealed_and_bound_to_its_sandbox() {
        let (_dir, db, ring) = db_with(&["sb_a", "sb_b"]).await;
        record(&db, Some(&ring), "sb_a", Some(&proxy()))
            .await
            .unwrap();
        let text = db.sandbox_egress_proxy("sb_a").await.unwrap().unwrap();
        assert!(!text.contains(PASSWORD), "{text}");
        assert!(text.contains("\"sealed_password\":\"v1."), "{text}");
        assert_eq!(
            recorded(&db, Some(&ring), "sb_a").await.unwrap(),
            Some(proxy())
        );
        assert_eq!(shown(&db, "sb_a").await.unwrap(), Some(proxy().public()));
        // Inherited: sealed anew for the child.
        inherit(&db, Some(&ring), "sb_a", "sb_b").await.unwrap();
        let child = db.sandbox_egress_proxy("sb_b").await.unwrap().unwrap();
        assert_ne!(child, text);
        assert_eq!(
            recorded(&db, Some(&ring), "sb_b").await.unwrap(),
            Some(proxy())
        );
        // A sealed password copied to another sandbox's row does not open there.
        db.set_sandbox_egress_proxy("sb_b", Some(&text))
            .await
            .unwrap();
        let e = recorded(&db, Some(&ring), "sb_b").await.unwrap_err();
        assert!(!e.to_string().contains(PASSWORD), "{e}");
        // Nothing to do for rows already sealed under the current key; the bad one is
        // left as it is.
        assert_eq!(reseal_all(&db, &ring).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn plaintext_rows_of_migration_17_are_read_and_resealed() {
        let (_dir, db, ring) = db_with(&["sb_old"]).await;
        let old = format!(
            r#"{{"address":"proxy.example.com:1080","username":"u","password":"{PASSWORD}"}}"#
        );
        db.set_sandbox_egress_proxy("sb_old", Some(&old))
            .await
            .unwrap();
        assert_eq!(
            recorded(&db, Some(&ring), "sb_old").await.unwrap(),
            Some(proxy())
        );
        assert_eq!(reseal_all(&db, &ring).await.unwrap(), 1);
        let text = db.sandbox_egress_proxy("sb_old").await.unwrap().unwrap();
        assert!(!text.contains(PASSWORD), "{text}");
        assert_eq!(
            recorded(&db, Some(&ring), "sb_old").await.unwrap(),
            Some(proxy())
        );
        assert_eq!(reseal_all(&db, &ring).await.unwrap(), 0);
        // A format this daemon does not know is refused clearly, without the value.
        db.set_sandbox_egress_proxy(
            "sb_old",
            Some(r#"{"address":"p.example.com:1","username":"u","sealed_password":"v9.x"}"#),
        )
        .await
        .unwrap();
        let e = recorded(&db, Some(&ring), "sb_old")
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("not in a format"), "{e}");
    }
}
