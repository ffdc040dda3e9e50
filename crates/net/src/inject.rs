//! Header injection for plain HTTP/1.x (issue 17): the Host-checking proxy
//! ([`crate::hostcheck`]) hands it the connections to a `network.rules` domain on port 80.
//! The sandbox holds only placeholders; the host rewrites each request on its way out.
//!
//! [`relay`] carries one client connection to one upstream. Every request the client sends
//! on it (keep-alive and pipelined ones included, not only the first) is parsed: its `Host`
//! must be the rule's domain, else the connection is answered 403 and closed before a byte
//! of that request leaves, so a value never goes to another host. The rule's headers then
//! replace any the client sent under the same names, with their values resolved for THIS
//! request (a secret deleted or a rule removed since the last one: the request is answered
//! 502 and never sent). The body is relayed by its framing (`Content-Length`, chunked) so
//! that the next request's head is found where it starts. Responses are copied back as
//! they come. A request that upgrades (`Upgrade`, `CONNECT`) is refused: after it nothing
//! on the connection is HTTP the host could check.
//!
//! Everything read from the client is bounded ([`MAX_HEAD`], [`MAX_LINE`]).

use std::fmt;
use std::future::Future;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

/// The most of one request head read before refusing it.
pub const MAX_HEAD: usize = 16 * 1024;
/// The longest chunk-size or trailer line accepted.
pub const MAX_LINE: usize = 4096;
const MAX_HEADERS: usize = 128;

/// A header the host sets on every request to the rule's domain; `value` is resolved
/// (placeholders replaced), so it is never printed.
#[derive(Clone)]
pub struct InjectedHeader {
    pub name: String,
    pub value: String,
    /// The secrets (name, version) the value was filled from: what the audit log names
    /// instead of the value.
    pub secrets: Vec<(String, i64)>,
}

impl fmt::Debug for InjectedHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InjectedHeader")
            .field("name", &self.name)
            .field("secrets", &self.secrets)
            .finish_non_exhaustive()
    }
}

/// Why [`relay`] stopped before the client closed.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error("a request named host {0:?}, not the rule's domain")]
    OtherHost(String),
    #[error("a request without a Host header")]
    NoHost,
    #[error("a request that upgrades the connection (Upgrade or CONNECT)")]
    Upgrade,
    #[error("a malformed request: {0}")]
    Malformed(&'static str),
    #[error("a request head or line past the limit")]
    TooLong,
    /// The headers could not be filled for this request (a secret gone, the rule removed).
    #[error("the rule's headers could not be filled: {0}")]
    Unresolved(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// How a request's body is framed.
#[derive(Debug, PartialEq, Eq)]
enum Body {
    None,
    Length(u64),
    Chunked,
}

/// A parsed request head: its rewritten bytes, its framing, and its `Host` (port dropped).
#[derive(Debug)]
struct Rewritten {
    head: Vec<u8>,
    body: Body,
    host: Option<String>,
}

/// Reads one request head (through the blank line); `None` at a clean end of stream.
async fn read_head<R: AsyncRead + Unpin>(
    r: &mut BufReader<R>,
) -> Result<Option<Vec<u8>>, InjectError> {
    let mut head = Vec::with_capacity(1024);
    loop {
        let before = head.len();
        let n = (&mut *r)
            .take((MAX_HEAD + 1 - head.len()) as u64)
            .read_until(b'\n', &mut head)
            .await?;
        if n == 0 {
            return if head.is_empty() {
                Ok(None)
            } else {
                Err(InjectError::Malformed("the connection ended inside a head"))
            };
        }
        if head.len() > MAX_HEAD {
            return Err(InjectError::TooLong);
        }
        // Blank lines before a request are allowed (RFC 9112 2.2).
        if before == 0 && (head == b"\r\n" || head == b"\n") {
            head.clear();
            continue;
        }
        if head.ends_with(b"\r\n\r\n") || head.ends_with(b"\n\n") {
            return Ok(Some(head));
        }
    }
}

/// The head with `inject`'s headers in place of any of the same names.
fn rewrite(head: &[u8], inject: &[InjectedHeader]) -> Result<Rewritten, InjectError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(InjectError::Malformed("incomplete head")),
        Err(_) => return Err(InjectError::Malformed("not an HTTP/1.x request head")),
    }
    let method = req.method.ok_or(InjectError::Malformed("no method"))?;
    let path = req.path.ok_or(InjectError::Malformed("no target"))?;
    let version = req.version.ok_or(InjectError::Malformed("no version"))?;
    if method.eq_ignore_ascii_case("CONNECT") {
        return Err(InjectError::Upgrade);
    }
    let mut body = Body::None;
    let mut host = None;
    let mut out = format!("{method} {path} HTTP/1.{version}\r\n").into_bytes();
    for h in req.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("upgrade") {
            return Err(InjectError::Upgrade);
        }
        if name.eq_ignore_ascii_case("host") {
            if host.is_some() {
                return Err(InjectError::Malformed("two Host headers"));
            }
            let v = std::str::from_utf8(h.value)
                .map_err(|_| InjectError::Malformed("a Host that is not text"))?;
            host = Some(host_name(v));
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            // Chunked last is the only framing a request may have besides a length; any
            // other coding leaves the end of the body unknown.
            let v = String::from_utf8_lossy(h.value).to_ascii_lowercase();
            if !v.trim_end().ends_with("chunked") {
                return Err(InjectError::Malformed(
                    "a transfer coding other than chunked",
                ));
            }
            // Both framings (in either order) are how requests are smuggled: refused.
            if matches!(body, Body::Length(_)) {
                return Err(InjectError::Malformed("both Content-Length and chunked"));
            }
            body = Body::Chunked;
        } else if name.eq_ignore_ascii_case("content-length") {
            let n = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or(InjectError::Malformed("a bad Content-Length"))?;
            match body {
                Body::Chunked => {
                    return Err(InjectError::Malformed("both Content-Length and chunked"));
                }
                Body::Length(m) if m != n => {
                    return Err(InjectError::Malformed("two Content-Lengths"));
                }
                _ => body = Body::Length(n),
            }
        }
        if inject.iter().any(|i| i.name.eq_ignore_ascii_case(name)) {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    for i in inject {
        out.extend_from_slice(i.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(i.value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok(Rewritten {
        head: out,
        body,
        host,
    })
}

/// `example.com:8080` -> `example.com`, lower-case, without a trailing dot.
fn host_name(v: &str) -> String {
    let v = v.trim();
    let name = match v.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => v,
    };
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// Copies `n` bytes of body.
async fn copy_exact<R, W>(r: &mut BufReader<R>, w: &mut W, n: u64) -> Result<(), InjectError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let copied = tokio::io::copy(&mut (&mut *r).take(n), w).await?;
    if copied != n {
        return Err(InjectError::Malformed("the connection ended inside a body"));
    }
    Ok(())
}

/// Reads one line (bounded) into `line`.
async fn read_line<R: AsyncRead + Unpin>(
    r: &mut BufReader<R>,
    line: &mut Vec<u8>,
) -> Result<(), InjectError> {
    line.clear();
    (&mut *r)
        .take(MAX_LINE as u64 + 1)
        .read_until(b'\n', line)
        .await?;
    if line.len() > MAX_LINE {
        return Err(InjectError::TooLong);
    }
    if !line.ends_with(b"\n") {
        return Err(InjectError::Malformed(
            "the connection ended inside a chunk",
        ));
    }
    Ok(())
}

/// Relays a chunked body: sizes, data, then the trailers through the blank line.
async fn copy_chunked<R, W>(r: &mut BufReader<R>, w: &mut W) -> Result<(), InjectError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut line = Vec::new();
    loop {
        read_line(r, &mut line).await?;
        w.write_all(&line).await?;
        let text =
            std::str::from_utf8(&line).map_err(|_| InjectError::Malformed("a chunk size"))?;
        let size = text.split(';').next().unwrap_or("").trim();
        let size = u64::from_str_radix(size, 16)
            .map_err(|_| InjectError::Malformed("a chunk size that is not hex"))?;
        if size == 0 {
            break;
        }
        // The data and its CRLF.
        copy_exact(r, w, size + 2).await?;
    }
    loop {
        read_line(r, &mut line).await?;
        w.write_all(&line).await?;
        if line == b"\r\n" || line == b"\n" {
            return Ok(());
        }
    }
}

/// Carries the client's requests (read from `client_r`, answered on `client_w`) to
/// `upstream` with the headers `headers_for` gives for each request (asked once a request,
/// just before it is sent), as long as each names `domain`; copies the answers back. A
/// refused request gets a 403 (another host, malformed) or a 502 (no headers: `Err` of
/// `headers_for`), and the connection ends there.
pub async fn relay<CR, CW, U, F, Fut>(
    client_r: CR,
    mut client_w: CW,
    upstream: U,
    domain: &str,
    mut headers_for: F,
) -> Result<(), InjectError>
where
    CR: AsyncRead + Unpin,
    CW: AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Vec<InjectedHeader>, String>>,
{
    let domain = host_name(domain);
    let (mut up_r, mut up_w) = tokio::io::split(upstream);
    let mut client_r = BufReader::new(client_r);
    let requests = async {
        loop {
            let Some(head) = read_head(&mut client_r).await? else {
                up_w.shutdown().await?;
                return Ok::<(), InjectError>(());
            };
            // The Host is checked before anything is resolved: another host's request
            // never costs a secret lookup, let alone gets a value.
            let req = rewrite(&head, &[])?;
            match &req.host {
                None => return Err(InjectError::NoHost),
                Some(h) if *h != domain => return Err(InjectError::OtherHost(h.clone())),
                Some(_) => {}
            }
            let inject = headers_for().await.map_err(InjectError::Unresolved)?;
            let req = rewrite(&head, &inject)?;
            up_w.write_all(&req.head).await?;
            match req.body {
                Body::None => {}
                Body::Length(n) => copy_exact(&mut client_r, &mut up_w, n).await?,
                Body::Chunked => copy_chunked(&mut client_r, &mut up_w).await?,
            }
            up_w.flush().await?;
        }
    };
    let refused = {
        let answers = tokio::io::copy(&mut up_r, &mut client_w);
        tokio::pin!(requests, answers);
        // Requests end first normally (the client half-closes after its last request, or
        // closes after its last answer): the answers still owed are copied to the end.
        let outcome = tokio::select! {
            r = &mut requests => r,
            r = &mut answers => return r.map(|_| ()).map_err(InjectError::from),
        };
        match outcome {
            Ok(()) => {
                answers.await?;
                return Ok(());
            }
            Err(e) => e,
        }
    };
    // The answers stop here (an answer in flight is cut): the connection ends with the
    // refusal.
    let (status, body) = match refused {
        InjectError::Unresolved(_) => (
            "502 Bad Gateway",
            "refused by the sandbox's egress rules: a secret of this domain's rule is missing\n",
        ),
        _ => ("403 Forbidden", "refused by the sandbox's egress rules\n"),
    };
    let answer = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = client_w.write_all(answer.as_bytes()).await;
    let _ = client_w.shutdown().await;
    Err(refused)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::io::duplex;

    fn header(value: &str) -> Vec<InjectedHeader> {
        vec![InjectedHeader {
            name: "Authorization".into(),
            value: value.into(),
            secrets: vec![("api-key".into(), 1)],
        }]
    }

    /// Runs `relay` between a scripted client and a recording upstream; what the upstream
    /// received, what the client received, and the relay's outcome.
    async fn run(client_sends: &[u8], upstream_answers: &[u8]) -> (Vec<u8>, Vec<u8>, bool, usize) {
        let (up, client, r, n) = run_failing_from(client_sends, upstream_answers, usize::MAX).await;
        (up, client, r.is_ok(), n)
    }

    /// [`run`] where the headers cannot be filled from request `fail_from` on (1-based).
    async fn run_failing_from(
        client_sends: &[u8],
        upstream_answers: &[u8],
        fail_from: usize,
    ) -> (Vec<u8>, Vec<u8>, Result<(), InjectError>, usize) {
        let (mut client, client_end) = duplex(1 << 16);
        let (upstream_end, mut upstream) = duplex(1 << 16);
        let inject = header("Bearer REAL-VALUE");
        let mut count = 0;
        let (client_r, client_w) = tokio::io::split(client_end);
        let relay = relay(client_r, client_w, upstream_end, "api.example.com", || {
            count += 1;
            let filled = if count < fail_from {
                Ok(inject.clone())
            } else {
                Err("secret \"api-key\" doesn't exist".to_string())
            };
            async move { filled }
        });
        let sends = client_sends.to_vec();
        let answers = upstream_answers.to_vec();
        let client_side = async move {
            client.write_all(&sends).await.unwrap();
            client.shutdown().await.unwrap();
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.unwrap();
            got
        };
        // As a server would: answers after the requests (the relay may be gone by then).
        let upstream_side = async move {
            let mut got = Vec::new();
            upstream.read_to_end(&mut got).await.unwrap();
            let _ = upstream.write_all(&answers).await;
            let _ = upstream.shutdown().await;
            got
        };
        let (r, got_client, got_upstream) = tokio::join!(relay, client_side, upstream_side);
        (got_upstream, got_client, r, count)
    }

    fn count(hay: &[u8], needle: &[u8]) -> usize {
        hay.windows(needle.len()).filter(|w| *w == needle).count()
    }

    #[tokio::test]
    async fn every_request_on_a_keep_alive_connection_gets_the_header() {
        let reqs = b"GET /a HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: ${e2b.secrets.api-key}\r\n\r\n\
POST /b HTTP/1.1\r\nHost: API.example.com:80\r\nContent-Length: 5\r\n\r\nhello\
PUT /c HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n\
GET /d HTTP/1.1\r\nhost: api.example.com\r\nauthorization: Bearer fake\r\n\r\n";
        let (up, _, ok, n) = run(reqs, b"").await;
        assert!(ok);
        assert_eq!(n, 4);
        assert_eq!(count(&up, b"Authorization: Bearer REAL-VALUE\r\n"), 4);
        assert_eq!(
            count(&up, b"${e2b.secrets"),
            0,
            "the placeholder is replaced"
        );
        assert_eq!(count(&up, b"Bearer fake"), 0, "the client's own is dropped");
        assert_eq!(
            count(&up, b"\r\n\r\nhello"),
            1,
            "a length body follows its head"
        );
        assert_eq!(
            count(&up, b"3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n"),
            1,
            "chunks and trailers"
        );
        assert!(up.ends_with(b"Authorization: Bearer REAL-VALUE\r\n\r\n"));
    }

    #[tokio::test]
    async fn a_request_to_another_host_on_the_connection_gets_nothing_and_a_403() {
        let reqs = b"GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n\
GET /steal HTTP/1.1\r\nHost: evil.example.net\r\n\r\n";
        let (up, client, ok, n) = run(reqs, b"").await;
        assert!(!ok);
        assert_eq!(n, 1);
        assert_eq!(count(&up, b"REAL-VALUE"), 1, "only the first request's");
        assert_eq!(count(&up, b"/steal"), 0, "the second never left");
        assert!(client.starts_with(b"HTTP/1.1 403"));
    }

    #[tokio::test]
    async fn a_body_that_looks_like_a_request_is_not_one() {
        // Smuggling: a body holding a second head is relayed as body, not rewritten.
        let inner = b"GET /x HTTP/1.1\r\nHost: evil.example.net\r\n\r\n";
        let mut reqs = format!(
            "POST / HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: {}\r\n\r\n",
            inner.len()
        )
        .into_bytes();
        reqs.extend_from_slice(inner);
        let (up, _, ok, n) = run(&reqs, b"").await;
        assert!(ok);
        assert_eq!(n, 1);
        assert_eq!(count(&up, b"REAL-VALUE"), 1);
        for bad in [
            &b"POST / HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: api.example.com\r\nHost: evil.example.net\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: api.example.com\r\nUpgrade: websocket\r\n\r\n",
            b"CONNECT evil.example.net:443 HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
            b"GET / HTTP/1.1\r\n\r\n",
        ] {
            let (up, client, ok, _) = run(bad, b"").await;
            assert!(!ok, "{}", String::from_utf8_lossy(bad));
            assert_eq!(count(&up, b"REAL-VALUE"), 0);
            assert!(client.starts_with(b"HTTP/1.1 403"));
        }
    }

    #[tokio::test]
    async fn answers_come_back_as_sent() {
        let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        let (_, client, ok, _) =
            run(b"GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n", answer).await;
        assert!(ok);
        assert_eq!(client, answer);
    }

    #[tokio::test]
    async fn a_request_whose_headers_cannot_be_filled_is_answered_502_and_never_sent() {
        // The first request is filled, the second finds the secret gone.
        let reqs = b"GET /1 HTTP/1.1\r\nHost: api.example.com\r\n\r\n\
GET /2 HTTP/1.1\r\nHost: api.example.com\r\n\r\n";
        let (up, client, r, n) = run_failing_from(reqs, b"", 2).await;
        assert!(matches!(r, Err(InjectError::Unresolved(_))), "{r:?}");
        assert_eq!(n, 2);
        assert!(client.starts_with(b"HTTP/1.1 502"));
        assert_eq!(count(&up, b"GET /1 "), 1);
        assert_eq!(count(&up, b"GET /2 "), 0, "the second never left");
    }

    #[test]
    fn debug_shows_no_value() {
        let h = header("Bearer REAL-VALUE");
        assert!(!format!("{h:?}").contains("REAL-VALUE"));
    }
}
