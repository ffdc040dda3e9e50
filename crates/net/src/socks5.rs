//! A SOCKS5 client, the little of it `egressProxy` needs: CONNECT (RFC 1928) with no
//! authentication or username/password (RFC 1929). What the proxy sends is read in fixed,
//! bounded pieces (its longest reply is 4 + 1 + 255 + 2 bytes), and the whole handshake
//! runs under one timeout, so a proxy that stalls or talks nonsense costs one task for at
//! most that long. Written here rather than taken from a crate: it is ~150 lines, and the
//! errors say which step failed (the sandbox's owner reads them in the daemon's log).

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const VERSION: u8 = 5;
const NO_AUTH: u8 = 0x00;
const USER_PASS: u8 = 0x02;
const NO_ACCEPTABLE: u8 = 0xff;
const CMD_CONNECT: u8 = 1;
const ATYP_V4: u8 = 1;
const ATYP_NAME: u8 = 3;
const ATYP_V6: u8 = 4;

/// RFC 1929's username and password (1-255 bytes each). Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Where the proxy is asked to connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A host name the proxy resolves (ATYP 3: "remote DNS").
    Name(String, u16),
    Addr(SocketAddr),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Name(n, p) => write!(f, "{n}:{p}"),
            Target::Addr(a) => write!(f, "{a}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Socks5Error {
    #[error("connecting to the SOCKS5 proxy {proxy}: {source}")]
    Connect {
        proxy: SocketAddr,
        source: std::io::Error,
    },
    #[error("the SOCKS5 proxy {0} did not finish the handshake in time")]
    Timeout(SocketAddr),
    #[error("talking to the SOCKS5 proxy: {0}")]
    Io(#[from] std::io::Error),
    #[error("the proxy does not speak SOCKS5 (version byte {0:#04x})")]
    NotSocks5(u8),
    #[error("the proxy accepts none of the offered authentication methods")]
    NoAcceptableMethod,
    #[error("the proxy chose authentication method {0:#04x}, which was not offered")]
    UnexpectedMethod(u8),
    #[error("the proxy refused the username/password")]
    AuthFailed,
    #[error("the proxy could not connect to {target}: {why}")]
    Refused { target: String, why: &'static str },
    #[error("the proxy's reply is malformed: {0}")]
    BadReply(&'static str),
    #[error("{0} is longer than SOCKS5 allows (255 bytes)")]
    TooLong(&'static str),
}

/// Connects to `target` through the SOCKS5 proxy at `proxy`; the stream returned carries
/// the target's bytes. The connect and the handshake together take at most `timeout`.
pub async fn connect(
    proxy: SocketAddr,
    creds: Option<&Credentials>,
    target: &Target,
    timeout: Duration,
) -> Result<TcpStream, Socks5Error> {
    let request = connect_request(target)?;
    let auth = creds.map(auth_request).transpose()?;
    let run = async {
        let mut s = TcpStream::connect(proxy)
            .await
            .map_err(|source| Socks5Error::Connect { proxy, source })?;
        handshake(&mut s, auth.as_deref(), &request, target).await?;
        Ok(s)
    };
    tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| Socks5Error::Timeout(proxy))?
}

async fn handshake(
    s: &mut TcpStream,
    auth: Option<&[u8]>,
    request: &[u8],
    target: &Target,
) -> Result<(), Socks5Error> {
    // Offer user/pass only when there are credentials; "no authentication" always, so that
    // a proxy that needs none still works with credentials given.
    let greeting: &[u8] = if auth.is_some() {
        &[VERSION, 2, NO_AUTH, USER_PASS]
    } else {
        &[VERSION, 1, NO_AUTH]
    };
    s.write_all(greeting).await?;
    let mut choice = [0u8; 2];
    s.read_exact(&mut choice).await?;
    if choice[0] != VERSION {
        return Err(Socks5Error::NotSocks5(choice[0]));
    }
    match (choice[1], auth) {
        (NO_AUTH, _) => {}
        (USER_PASS, Some(auth)) => {
            s.write_all(auth).await?;
            let mut status = [0u8; 2];
            s.read_exact(&mut status).await?;
            // RFC 1929: version 1, status 0 = success.
            if status != [1, 0] {
                return Err(Socks5Error::AuthFailed);
            }
        }
        (NO_ACCEPTABLE, _) => return Err(Socks5Error::NoAcceptableMethod),
        (m, _) => return Err(Socks5Error::UnexpectedMethod(m)),
    }
    s.write_all(request).await?;
    let mut head = [0u8; 4];
    s.read_exact(&mut head).await?;
    if head[0] != VERSION {
        return Err(Socks5Error::NotSocks5(head[0]));
    }
    if head[1] != 0 {
        return Err(Socks5Error::Refused {
            target: target.to_string(),
            why: reply_text(head[1]),
        });
    }
    // The bound address: read and dropped (bounded by its type).
    let skip = match head[3] {
        ATYP_V4 => 4 + 2,
        ATYP_V6 => 16 + 2,
        ATYP_NAME => usize::from(s.read_u8().await?) + 2,
        _ => return Err(Socks5Error::BadReply("unknown address type")),
    };
    let mut rest = [0u8; 255 + 2];
    s.read_exact(&mut rest[..skip]).await?;
    Ok(())
}

/// RFC 1929's sub-negotiation request.
fn auth_request(c: &Credentials) -> Result<Vec<u8>, Socks5Error> {
    let u = u8::try_from(c.username.len()).map_err(|_| Socks5Error::TooLong("the username"))?;
    let p = u8::try_from(c.password.len()).map_err(|_| Socks5Error::TooLong("the password"))?;
    let mut v = Vec::with_capacity(3 + c.username.len() + c.password.len());
    v.extend_from_slice(&[1, u]);
    v.extend_from_slice(c.username.as_bytes());
    v.push(p);
    v.extend_from_slice(c.password.as_bytes());
    Ok(v)
}

fn connect_request(target: &Target) -> Result<Vec<u8>, Socks5Error> {
    let mut v = vec![VERSION, CMD_CONNECT, 0];
    let port = match target {
        Target::Name(name, port) => {
            let len =
                u8::try_from(name.len()).map_err(|_| Socks5Error::TooLong("the host name"))?;
            v.extend_from_slice(&[ATYP_NAME, len]);
            v.extend_from_slice(name.as_bytes());
            *port
        }
        Target::Addr(a) => {
            match a.ip() {
                IpAddr::V4(ip) => {
                    v.push(ATYP_V4);
                    v.extend_from_slice(&ip.octets());
                }
                IpAddr::V6(ip) => {
                    v.push(ATYP_V6);
                    v.extend_from_slice(&ip.octets());
                }
            }
            a.port()
        }
    };
    v.extend_from_slice(&port.to_be_bytes());
    Ok(v)
}

fn reply_text(code: u8) -> &'static str {
    match code {
        1 => "general SOCKS server failure",
        2 => "connection not allowed by ruleset",
        3 => "network unreachable",
        4 => "host unreachable",
        5 => "connection refused",
        6 => "TTL expired",
        7 => "command not supported",
        8 => "address type not supported",
        _ => "unknown reply code",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_the_requests_of_the_rfcs() {
        let r = connect_request(&Target::Name("a.test".into(), 443)).unwrap();
        assert_eq!(r, b"\x05\x01\x00\x03\x06a.test\x01\xbb");
        let r = connect_request(&Target::Addr("1.2.3.4:80".parse().unwrap())).unwrap();
        assert_eq!(r, [5, 1, 0, 1, 1, 2, 3, 4, 0, 80]);
        let c = Credentials {
            username: "u".into(),
            password: "pw".into(),
        };
        assert_eq!(auth_request(&c).unwrap(), b"\x01\x01u\x02pw");
        let long = Credentials {
            username: "u".into(),
            password: "x".repeat(256),
        };
        assert!(matches!(auth_request(&long), Err(Socks5Error::TooLong(_))));
        assert!(!format!("{c:?}").contains("pw"));
    }
}
