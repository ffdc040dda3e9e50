//! E2B's `egressProxy`: the sandbox's outbound TCP leaves through the owner's SOCKS5 proxy.
//!
//! With a proxy set, nft.rs DNATs every TCP connection the allow/deny rules let out to the
//! Host/SNI proxy on the gateway (hostcheck.rs) instead of forwarding it; the proxy there
//! learns the original destination (`SO_ORIGINAL_DST`) and reaches it through the SOCKS5
//! proxy ([`crate::socks5`]): by address for what an IP rule or an open policy allows, by
//! name (the proxy resolves it, ATYP 3) for what only a domain rule opened, after the usual
//! SNI/Host check. Nothing is ever connected directly while a proxy is set: a proxy that is
//! down, refuses the credentials or cannot reach the target closes the sandbox's connection
//! (fail closed). IPv6 TCP is refused while a proxy is set (the proxy on the gateway is
//! IPv4); UDP is not tunnelled (SOCKS5's UDP ASSOCIATE is not used): DNS still goes to our
//! server, other UDP follows the rules as without a proxy, as E2B documents.
//!
//! The proxy's address is checked where the API takes it ([`EgressProxy::check`]): a
//! `host:port` whose host resolves (here, on the daemon's host) only to addresses that
//! egress rules could open ([`Destinations::refusal`]: never loopback, link-local, the
//! pool, the host's own; private ranges only as `--allow-private-egress` says). It is
//! resolved again for every connection, and a refused answer then is never dialled.

use crate::reserved::{self, Destinations};
use crate::socks5::{self, Credentials, Socks5Error, Target};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

/// E2B's limit on the username and the password (RFC 1929's too).
pub const MAX_CREDENTIAL: usize = 255;
/// The longest `address` accepted (a DNS name and a port).
const MAX_ADDRESS: usize = 253 + 1 + 5 + 2;
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);
/// Connecting to the proxy and its handshake, including its own connect to the target.
const DIAL_TIMEOUT: Duration = Duration::from_secs(15);

/// E2B's `SandboxEgressProxyConfig`: `{"address": "host:port", "username"?, "password"?}`.
/// The password is never serialized (what the API shows is this without it) and never
/// printed.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressProxy {
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing)]
    pub password: Option<String>,
}

impl fmt::Debug for EgressProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EgressProxy")
            .field("address", &self.address)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Why an `egressProxy` is refused (the API answers 400 with it). Never holds the password.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProxyError {
    #[error("egressProxy.address {0:?} is not host:port (e.g. \"proxy.example.com:1080\")")]
    BadAddress(String),
    #[error("egressProxy.{0} must be 1 to 255 bytes")]
    BadLength(&'static str),
    #[error("egressProxy.password is only valid together with egressProxy.username")]
    PasswordWithoutUsername,
    /// RFC 1929's login carries a password of 1 to 255 bytes: an empty one is not sent.
    #[error(
        "egressProxy.username needs egressProxy.password too (a SOCKS5 login, RFC 1929, \
         sends both, 1 to 255 bytes each); for a proxy without a login send neither"
    )]
    UsernameWithoutPassword,
    #[error("egressProxy.address {address:?} does not resolve: {why}")]
    Unresolved { address: String, why: String },
    #[error(
        "egressProxy.address {address:?} is refused: it resolves to {ip}, {why}, which \
         sandboxes never reach"
    )]
    Refused {
        address: String,
        ip: IpAddr,
        why: &'static str,
    },
}

/// Why one tunnelled connection could not be made (logged; the sandbox's connection is
/// closed).
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("resolving the egress proxy {address}: {why}")]
    Resolve { address: String, why: String },
    #[error("egress proxy {address}: {source}")]
    Socks {
        address: String,
        source: Socks5Error,
    },
}

impl EgressProxy {
    /// The same without the password: what the API shows.
    pub fn public(&self) -> EgressProxy {
        EgressProxy {
            password: None,
            ..self.clone()
        }
    }

    /// Checks the shape and where the address leads, and makes the [`Tunnel`].
    pub async fn check(&self, dest: &Destinations) -> Result<Tunnel, ProxyError> {
        let tunnel = self.parse()?;
        let addrs = tunnel
            .resolve()
            .await
            .map_err(|why| ProxyError::Unresolved {
                address: self.address.clone(),
                why,
            })?;
        let host_addrs = reserved::host_addresses();
        for a in &addrs {
            if let Some(why) = dest.refusal(a.ip(), &host_addrs) {
                return Err(ProxyError::Refused {
                    address: self.address.clone(),
                    ip: a.ip(),
                    why,
                });
            }
        }
        Ok(tunnel)
    }

    /// Checks the shape only (not where the address leads: [`Tunnel::dial`] checks that
    /// for every connection).
    pub fn parse(&self) -> Result<Tunnel, ProxyError> {
        let (host, port) = split_address(&self.address)?;
        for (field, v) in [("username", &self.username), ("password", &self.password)] {
            if v.as_ref()
                .is_some_and(|v| v.is_empty() || v.len() > MAX_CREDENTIAL)
            {
                return Err(ProxyError::BadLength(field));
            }
        }
        let creds = match (&self.username, &self.password) {
            (None, Some(_)) => return Err(ProxyError::PasswordWithoutUsername),
            (Some(_), None) => return Err(ProxyError::UsernameWithoutPassword),
            (None, None) => None,
            (Some(u), Some(p)) => Some(Credentials {
                username: u.clone(),
                password: p.clone(),
            }),
        };
        Ok(Tunnel {
            host,
            port,
            creds,
            shown: self.public(),
        })
    }
}

/// `host:port`, `[v6]:port`; the host an IP literal or a DNS name.
fn split_address(address: &str) -> Result<(String, u16), ProxyError> {
    let bad = || ProxyError::BadAddress(address.chars().take(MAX_ADDRESS).collect());
    if address.len() > MAX_ADDRESS {
        return Err(bad());
    }
    let (host, port) = address.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    if port == 0 {
        return Err(bad());
    }
    let host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => {
            let ip: std::net::Ipv6Addr = v6.parse().map_err(|_| bad())?;
            ip.to_string()
        }
        None if host.parse::<std::net::Ipv4Addr>().is_ok() => host.to_string(),
        None => {
            let name = host.trim_end_matches('.').to_ascii_lowercase();
            let ok = !name.is_empty()
                && name.split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                });
            if !ok {
                return Err(bad());
            }
            name
        }
    };
    Ok((host, port))
}

/// A checked proxy, as a sandbox's egress uses it.
#[derive(Clone, PartialEq, Eq)]
pub struct Tunnel {
    host: String,
    port: u16,
    creds: Option<Credentials>,
    /// The configuration without its password.
    shown: EgressProxy,
}

impl fmt::Debug for Tunnel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tunnel({})", self.shown.address)
    }
}

impl Tunnel {
    /// The configuration without its password.
    pub fn shown(&self) -> &EgressProxy {
        &self.shown
    }

    async fn resolve(&self) -> Result<Vec<SocketAddr>, String> {
        if let Ok(ip) = self.host.parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, self.port)]);
        }
        let lookup = tokio::net::lookup_host((self.host.as_str(), self.port));
        let addrs: Vec<SocketAddr> = tokio::time::timeout(RESOLVE_TIMEOUT, lookup)
            .await
            .map_err(|_| "timed out".to_string())?
            .map_err(|e| e.to_string())?
            .collect();
        if addrs.is_empty() {
            return Err("no addresses".into());
        }
        Ok(addrs)
    }

    /// Connects to `target` through the proxy. The proxy's name is resolved now and the
    /// first answer egress may reach is used for this connection; none: an error (never a
    /// direct connection).
    pub async fn dial(&self, dest: &Destinations, target: &Target) -> Result<TcpStream, DialError> {
        let address = self.shown.address.clone();
        let addrs = self.resolve().await.map_err(|why| DialError::Resolve {
            address: address.clone(),
            why,
        })?;
        let host_addrs = reserved::host_addresses();
        let Some(proxy) = addrs
            .into_iter()
            .find(|a| dest.refusal(a.ip(), &host_addrs).is_none())
        else {
            return Err(DialError::Resolve {
                address,
                why: "it now resolves only to addresses sandboxes never reach".into(),
            });
        };
        socks5::connect(proxy, self.creds.as_ref(), target, DIAL_TIMEOUT)
            .await
            .map_err(|source| DialError::Socks { address, source })
    }
}

/// How the egress proxy on the gateway reaches an upstream: directly, or through the
/// sandbox's SOCKS5 proxy.
pub enum Route<'a> {
    Direct(SocketAddr),
    Tunnel {
        tunnel: &'a Tunnel,
        dest: &'a Destinations,
        target: Target,
        /// Where the name resolved here (for messages: the proxy resolves it itself).
        addr: SocketAddr,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("connecting to {0}: {1}")]
    Io(SocketAddr, #[source] std::io::Error),
    #[error("connecting to {0} did not finish in time")]
    Timeout(SocketAddr),
    #[error(transparent)]
    Tunnel(#[from] DialError),
}

impl Route<'_> {
    /// The upstream's address as seen here.
    pub fn addr(&self) -> SocketAddr {
        match self {
            Route::Direct(a) | Route::Tunnel { addr: a, .. } => *a,
        }
    }

    /// A TCP connection to the upstream; a direct one within `timeout` (the proxy's dial
    /// has its own).
    pub async fn tcp(&self, timeout: Duration) -> Result<TcpStream, RouteError> {
        match self {
            Route::Direct(addr) => {
                match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
                    Ok(Ok(s)) => Ok(s),
                    Ok(Err(e)) => Err(RouteError::Io(*addr, e)),
                    Err(_) => Err(RouteError::Timeout(*addr)),
                }
            }
            Route::Tunnel {
                tunnel,
                dest,
                target,
                ..
            } => Ok(tunnel.dial(dest, target).await?),
        }
    }
}

impl crate::SandboxNet {
    /// Replaces the rules and the egress proxy together (E2B's `PUT .../network` replaces
    /// both; `None`: no proxy). The proxy is checked first ([`EgressProxy::check`]);
    /// connections the new setting no longer allows are cut, as are the open connections of
    /// the sandbox when the proxy changes (they went out another way).
    pub async fn set_egress(
        &self,
        spec: &crate::EgressSpec,
        proxy: Option<&EgressProxy>,
    ) -> crate::Result<()> {
        let tunnel = match proxy {
            Some(p) => Some(Arc::new(p.check(&self.state.dest).await?)),
            None => None,
        };
        self.replace_policy(spec, crate::TunnelChange::Set(tunnel))
            .await
    }

    /// Puts `spec` and `proxy`, recorded when the API took them (and checked then), back in
    /// force: at a resume, a restore, a daemon restart. The proxy's address is not resolved
    /// here: every connection resolves and checks it ([`Tunnel::dial`]).
    pub async fn restore_egress(
        &self,
        spec: &crate::EgressSpec,
        proxy: &EgressProxy,
    ) -> crate::Result<()> {
        let tunnel = Arc::new(proxy.parse()?);
        self.replace_policy(spec, crate::TunnelChange::Set(Some(tunnel)))
            .await
    }

    /// The egress proxy in force, without its password.
    pub async fn egress_proxy(&self) -> Option<EgressProxy> {
        let inner = self.state.inner.lock().await;
        inner.policy.tunnel.as_ref().map(|t| t.shown().clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_addresses() {
        assert_eq!(
            split_address("Proxy.Example.com:1080").unwrap(),
            ("proxy.example.com".into(), 1080)
        );
        assert_eq!(
            split_address("203.0.113.5:9").unwrap(),
            ("203.0.113.5".into(), 9)
        );
        assert_eq!(
            split_address("[2001:db8::1]:1080").unwrap(),
            ("2001:db8::1".into(), 1080)
        );
        for bad in [
            "proxy.example.com",
            "proxy.example.com:0",
            "proxy.example.com:65536",
            ":1080",
            "a b:1080",
            "2001:db8::1:1080",
            "socks5://p.example.com:1080",
        ] {
            assert!(split_address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_login_needs_both_halves() {
        let p = |u: Option<&str>, pw: Option<&str>| EgressProxy {
            address: "p.example.com:1080".into(),
            username: u.map(Into::into),
            password: pw.map(Into::into),
        };
        assert_eq!(
            p(Some("u"), None).parse().err(),
            Some(ProxyError::UsernameWithoutPassword)
        );
        assert_eq!(
            p(None, Some("pw")).parse().err(),
            Some(ProxyError::PasswordWithoutUsername)
        );
        assert_eq!(
            p(Some("u"), Some("")).parse().err(),
            Some(ProxyError::BadLength("password"))
        );
        assert!(p(Some("u"), Some("pw")).parse().is_ok());
        assert!(p(None, None).parse().is_ok());
        let msg = ProxyError::UsernameWithoutPassword.to_string();
        assert!(msg.contains("egressProxy.password"), "{msg}");
    }

    #[test]
    fn the_password_is_never_shown() {
        let p = EgressProxy {
            address: "p.example.com:1080".into(),
            username: Some("u".into()),
            password: Some("hunter2".into()),
        };
        assert!(!format!("{p:?}").contains("hunter2"));
        let json = serde_json::to_string(&p).unwrap();
        assert!(
            !json.contains("hunter2") && !json.contains("password"),
            "{json}"
        );
        let back: EgressProxy =
            serde_json::from_str(r#"{"address":"a.test:1","username":"u","password":"pw"}"#)
                .unwrap();
        assert_eq!(back.password.as_deref(), Some("pw"));
    }
}
