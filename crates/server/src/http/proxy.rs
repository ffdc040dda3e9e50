//! The envd proxy: requests meant for a sandbox arrive on the API port and are forwarded to
//! the sandbox's agent over its runtime's transport ([`Sandbox::connect`]), one HTTP/1.1
//! connection per request, bodies streamed both ways as they come (Connect server streams,
//! file uploads and downloads are never held whole).
//!
//! A request is for a sandbox when it carries `E2b-Sandbox-Id` and `E2b-Sandbox-Port` (what
//! the SDKs send when `E2B_SANDBOX_URL` points at the daemon), or when its Host is
//! `<port>-<sandboxID>.<domain>` for the daemon's `--domain`.
//!
//! Ports other than envd's go to whatever the sandbox serves there, over TCP through its
//! network ([`forward_port`]), HTTP and upgrades such as WebSocket, with the Host header
//! the sandbox's `maskRequestHost` asks for. The same routing serves the HTTPS port of
//! `--domain` (crate::tls).
//!
//! Access: for a `secure` sandbox the proxy itself requires `X-Access-Token` to equal the
//! sandbox's envd access token, or a signed file URL ([`crate::http::signed_url`]) (the agent checks it too once `/init` gave it the token, but
//! the proxy does not rely on the agent version). Routes envd keeps internal (`/init`) and
//! our agent's `/sandcell/...` routes answer 404 through the proxy, as E2B's proxy does.
//! Nothing that authenticates the caller to the daemon reaches the sandbox
//! ([`strip_credentials`]). Both guards are [`admit`]'s, which also decides whether a
//! request may wake a paused sandbox with auto-resume (http/wake.rs).

use crate::App;
use crate::http::error::ApiError;
use crate::util::constant_time_eq;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;
use sandcell_runtime::Sandbox;
use sandcell_runtime::net::SandboxNet;
use std::sync::Arc;
use std::time::Duration;

pub const SANDBOX_ID_HEADER: &str = "e2b-sandbox-id";
pub const SANDBOX_PORT_HEADER: &str = "e2b-sandbox-port";
pub const ACCESS_TOKEN_HEADER: &str = "x-access-token";
/// E2B's header for sandboxes created with `allowPublicTraffic: false`.
pub const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// How long the proxy waits for a sandbox port to accept a connection.
const PORT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a request for a sandbox goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub sandbox_id: String,
    pub port: u32,
}

/// The target of `headers`, if the request is for a sandbox. `Err` when it is, but
/// malformed.
pub fn target(headers: &HeaderMap, domain: Option<&str>) -> Option<Result<Target, ApiError>> {
    let get = |name: &str| headers.get(name).map(|v| v.to_str().unwrap_or("").trim());
    if let Some(id) = get(SANDBOX_ID_HEADER) {
        let port = match get(SANDBOX_PORT_HEADER) {
            None => {
                return Some(Err(ApiError::bad_request(format!(
                    "{SANDBOX_ID_HEADER} without {SANDBOX_PORT_HEADER}"
                ))));
            }
            Some(p) => p.parse::<u32>(),
        };
        return Some(match port {
            Ok(port) if port <= u32::from(u16::MAX) => Ok(Target {
                sandbox_id: id.to_string(),
                port,
            }),
            _ => Err(ApiError::bad_request(format!(
                "invalid {SANDBOX_PORT_HEADER} header"
            ))),
        });
    }
    let host = get(header::HOST.as_str())?;
    host_target(host, domain?).map(Ok)
}

/// `<port>-<sandboxID>.<domain>[:port]` to its target.
pub fn host_target(host: &str, domain: &str) -> Option<Target> {
    let host = match host.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    };
    let label = host
        .strip_suffix(domain)?
        .strip_suffix('.')
        .filter(|l| !l.contains('.'))?;
    let (port, id) = label.split_once('-')?;
    let port: u16 = port.parse().ok()?;
    (!id.is_empty()).then(|| Target {
        sandbox_id: id.to_string(),
        port: u32::from(port),
    })
}

/// Middleware in front of every route: sandbox traffic is proxied, the rest goes on.
pub async fn route(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    match target(req.headers(), app.config.domain.as_deref()) {
        None => next.run(req).await,
        Some(Err(e)) => e.into_response(),
        Some(Ok(target)) => match proxy(&app, target, req).await {
            Ok(resp) => resp,
            Err(e) => e.into_response(),
        },
    }
}

/// Whether header `name` carries exactly the sandbox's `token` (compared in constant time).
/// The token is the target sandbox's own, looked up by the id the request names: another
/// sandbox's token, a prefix of it, or the same header twice with it second never match.
fn token_given(headers: &HeaderMap, name: &str, token: &str) -> bool {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(given), None) => constant_time_eq(given.as_bytes(), token.as_bytes()),
        _ => false,
    }
}

pub(crate) fn not_found_in_sandbox(id: &str) -> ApiError {
    // The SDKs recognise "was not found" in a 502 as "the sandbox is gone".
    ApiError::bad_gateway(format!("The sandbox {id} was not found"))
}

/// What guards a sandbox's traffic ([`admit`]).
pub(crate) struct Guard {
    /// The envd access token (every sandbox a key creates has one).
    pub access_token: Option<String>,
    /// `allowPublicTraffic: false`: the token its ports want.
    pub traffic_token: Option<String>,
    /// Its ports are reached through its network ([`forward_port`]); without one, every
    /// port goes through the agent's transport and is guarded as envd is.
    pub network: bool,
}

/// How a request passed its sandbox's [`Guard`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admitted {
    /// To a port served through the sandbox's network.
    Port,
    /// To envd (or a port through the agent); `signed`: by a signed file URL instead of
    /// the access token.
    Envd { signed: bool },
}

/// Whether `req` to `port` passes `guard`. The same rules for a running sandbox and for a
/// paused one about to be woken (http/wake.rs): a request that would be refused is refused
/// before anything is done for it. The envd access token guards envd only, as in E2B;
/// routes envd keeps internal (`/init`) and our agent's `/sandcell/...` answer 404.
pub(crate) fn admit(req: &Parts, port: u32, guard: &Guard) -> Result<Admitted, ApiError> {
    if port != sandcell_runtime::AGENT_PORT && guard.network {
        if let Some(token) = &guard.traffic_token
            && !token_given(&req.headers, TRAFFIC_TOKEN_HEADER, token)
        {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!("missing or invalid {TRAFFIC_TOKEN_HEADER} for this sandbox's ports"),
            ));
        }
        return Ok(Admitted::Port);
    }
    let mut signed = false;
    if let Some(token) = &guard.access_token {
        signed = !req.headers.contains_key(ACCESS_TOKEN_HEADER)
            && crate::http::signed_url::check(
                req.method.as_str(),
                req.uri.path(),
                req.uri.query(),
                token,
                crate::util::now_ms() / 1000,
            )?;
        if !signed && !token_given(&req.headers, ACCESS_TOKEN_HEADER, token) {
            return Err(ApiError::unauthorized(
                "missing or invalid X-Access-Token for this sandbox (or a signed file URL)",
            ));
        }
    }
    let path = req.uri.path();
    if path == "/init" || path.starts_with("/sandcell/") {
        return Err(ApiError::not_found(format!("no route {path}")));
    }
    Ok(Admitted::Envd { signed })
}

async fn proxy(app: &Arc<App>, target: Target, req: Request) -> Result<Response, ApiError> {
    // The head apart from the body while a wake is awaited (the body is not `Sync`).
    let (parts, body) = req.into_parts();
    let live = match app.lifecycle.live(&target.sandbox_id) {
        Some(live) => live,
        // Not running: woken first if it is paused with auto-resume and the request passes
        // its guard (http/wake.rs); else "not found", as E2B answers.
        None => crate::http::wake::wake_for(app, &target, &parts).await?,
    };
    let net = live.sandbox.network();
    let guard = Guard {
        access_token: live.access_token.clone(),
        traffic_token: app.lifecycle.networks.traffic_token(&target.sandbox_id),
        network: net.is_some(),
    };
    let admitted = admit(&parts, target.port, &guard)?;
    let mut req = Request::from_parts(parts, body);
    // Ports other than envd's: to whatever the sandbox serves there, through its network.
    if let (Admitted::Port, Some(net)) = (admitted, &net) {
        strip_credentials(req.headers_mut(), false);
        // `maskRequestHost`: the app sees this Host instead of the caller's.
        if let Some(host) = app
            .lifecycle
            .networks
            .masked_host(&target.sandbox_id, target.port)
            .and_then(|h| HeaderValue::from_str(&h).ok())
        {
            req.headers_mut().insert(header::HOST, host);
        }
        return Ok(forward_port(net, &target.sandbox_id, target.port, req).await);
    }
    if admitted == (Admitted::Envd { signed: true })
        && let Some(token) = &live.access_token
    {
        // The agent checks the header too: a valid signature stands for the token.
        let value = HeaderValue::from_str(token)
            .map_err(|_| ApiError::internal("the sandbox's access token is not a header value"))?;
        req.headers_mut().insert(ACCESS_TOKEN_HEADER, value);
    }
    // envd checks the access token itself: that one stays.
    strip_credentials(req.headers_mut(), true);
    forward(&live.sandbox, target.port, req)
        .await
        .map(IntoResponse::into_response)
}

/// Removes what authenticates the caller to this daemon before a request goes into the
/// sandbox, whose code may be hostile: `X-API-KEY` (the owner's key), an `Authorization`
/// carrying one of our API keys (`Bearer e2b_...`), the traffic token our proxy checked,
/// and, unless it goes to envd (`keep_access_token`, envd checks it), the envd access
/// token. Any other `Authorization` (Basic, an app's own bearer token) goes through: apps
/// served on a sandbox port may use their own, and envd takes its user from `Basic`.
pub fn strip_credentials(headers: &mut HeaderMap, keep_access_token: bool) {
    headers.remove("x-api-key");
    headers.remove(TRAFFIC_TOKEN_HEADER);
    if !keep_access_token {
        headers.remove(ACCESS_TOKEN_HEADER);
    }
    let carries_our_key = |v: &HeaderValue| {
        v.to_str().ok().is_some_and(|v| {
            let mut words = v.split_whitespace();
            let (scheme, cred) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
            scheme.eq_ignore_ascii_case("bearer") && crate::keys::looks_like_key(cred)
                || crate::keys::looks_like_key(v.trim())
        })
    };
    if headers
        .get_all(header::AUTHORIZATION)
        .iter()
        .any(carries_our_key)
    {
        headers.remove(header::AUTHORIZATION);
    }
}

/// Hop-by-hop headers (RFC 9110 §7.6.1): they describe one connection, not the message.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    // hyper frames the body itself (chunked or by Content-Length).
    headers.remove(header::TRANSFER_ENCODING);
}

/// Sends `req` to `port` of `sandbox` over a fresh connection and returns the answer with
/// its body still streaming from the sandbox.
pub async fn forward(
    sandbox: &Arc<dyn Sandbox>,
    port: u32,
    req: Request,
) -> Result<Response<Body>, ApiError> {
    let id = sandbox.id().to_string();
    let stream = sandbox.connect(port).await.map_err(|e| match e {
        sandcell_runtime::Error::WrongState { .. } => not_found_in_sandbox(&id),
        other => ApiError::bad_gateway(format!(
            "The sandbox {id} is running but port is not open: {other}"
        )),
    })?;
    send(stream, &id, port, req).await
}

/// Sends `req` over `stream`, a fresh connection to `port` of sandbox `id`, and returns the
/// answer with its body still streaming.
pub async fn send(
    stream: Box<dyn sandcell_runtime::AsyncStream>,
    id: &str,
    port: u32,
    req: Request,
) -> Result<Response<Body>, ApiError> {
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| {
            ApiError::bad_gateway(format!("sandbox {id}: connecting to port {port}: {e}"))
        })?;
    // The connection lives until the response body is finished (or dropped).
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let (mut parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .to_string();
    parts.uri = Uri::try_from(path).map_err(|e| ApiError::bad_request(format!("bad path: {e}")))?;
    strip_hop_by_hop(&mut parts.headers);
    let resp = sender
        .send_request(Request::from_parts(parts, body))
        .await
        .map_err(|e| {
            ApiError::bad_gateway(format!("sandbox {id}: port {port} did not answer: {e}"))
        })?;
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// POSTs a small JSON body to the agent and returns the status and headers of the answer
/// (its body is read and dropped, bounded).
pub async fn post_json(
    sandbox: &Arc<dyn Sandbox>,
    port: u32,
    path: &str,
    json: &serde_json::Value,
) -> Result<(StatusCode, HeaderMap), ApiError> {
    let body = serde_json::to_vec(json)
        .map_err(|e| ApiError::internal(format!("encoding {path} body: {e}")))?;
    let req = Request::builder()
        .method("POST")
        .uri(path)
        .header(header::HOST, "localhost")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONTENT_LENGTH, body.len())
        .body(Body::from(body))
        .map_err(|e| ApiError::internal(format!("building {path} request: {e}")))?;
    let resp = forward(sandbox, port, req).await?;
    let (parts, body) = resp.into_parts();
    let _ = axum::body::to_bytes(body, 64 * 1024).await;
    Ok((parts.status, parts.headers))
}

/// E2B's answer for a port nothing listens on.
fn port_closed(id: &str, port: u32) -> Response {
    let body = serde_json::json!({
        "code": 502,
        "message": "The sandbox is running but port is not open",
        "sandboxId": id,
        "port": port,
    });
    (StatusCode::BAD_GATEWAY, axum::Json(body)).into_response()
}

/// Sends `req` to TCP `port` served inside sandbox `id`, through its network `net`: the
/// daemon connects to the sandbox's address from the host (host-originated traffic is not
/// subject to the sandbox's egress rules, so this works with no egress at all).
pub async fn forward_port(net: &SandboxNet, id: &str, port: u32, req: Request) -> Response {
    let Ok(port16) = u16::try_from(port) else {
        return port_closed(id, port);
    };
    let addr = std::net::SocketAddr::from((net.network().guest, port16));
    let connect = tokio::net::TcpStream::connect(addr);
    let stream = match tokio::time::timeout(PORT_CONNECT_TIMEOUT, connect).await {
        Ok(Ok(s)) => s,
        Ok(Err(_)) | Err(_) => return port_closed(id, port),
    };
    let _ = stream.set_nodelay(true);
    let sent = if req.headers().contains_key(header::UPGRADE) {
        upgrade(stream, id, port, req).await
    } else {
        send(Box::new(stream), id, port, req).await
    };
    match sent {
        Ok(resp) => resp.into_response(),
        Err(e) => e.into_response(),
    }
}

/// A request asking to switch protocols (WebSocket): sent with its `Upgrade` and
/// `Connection` headers; on `101` both connections are joined byte for byte until either
/// side closes. Any other answer is passed back as it is.
async fn upgrade(
    stream: tokio::net::TcpStream,
    id: &str,
    port: u32,
    mut req: Request,
) -> Result<Response, ApiError> {
    let from_client = hyper::upgrade::on(&mut req);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| {
            ApiError::bad_gateway(format!("sandbox {id}: connecting to port {port}: {e}"))
        })?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let (mut parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .to_string();
    parts.uri = path
        .parse()
        .map_err(|e| ApiError::bad_request(format!("bad path: {e}")))?;
    let mut resp = sender
        .send_request(Request::from_parts(parts, body))
        .await
        .map_err(|e| {
            ApiError::bad_gateway(format!("sandbox {id}: port {port} did not answer: {e}"))
        })?;
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Ok(resp.map(Body::new));
    }
    let from_sandbox = hyper::upgrade::on(&mut resp);
    tokio::spawn(async move {
        if let (Ok(client), Ok(sandbox)) = tokio::join!(from_client, from_sandbox) {
            let (mut client, mut sandbox) = (TokioIo::new(client), TokioIo::new(sandbox));
            let _ = tokio::io::copy_bidirectional(&mut client, &mut sandbox).await;
        }
    });
    Ok(resp.map(|_| Body::empty()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with(name: &str, values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn only_the_sandboxes_own_token_opens_it() {
        let x = "0123456789abcdef0123456789abcdef01234567";
        let y = "fedcba9876543210fedcba9876543210fedcba98";
        assert!(token_given(
            &with(ACCESS_TOKEN_HEADER, &[x]),
            ACCESS_TOKEN_HEADER,
            x
        ));
        // X's token on Y, a forged one, a prefix, a longer one, none, an empty one.
        for given in [
            y,
            "0123456789abcdef0123456789abcdef01234568",
            &x[..39],
            &format!("{x}0"),
            "",
        ] {
            assert!(
                !token_given(&with(ACCESS_TOKEN_HEADER, &[given]), ACCESS_TOKEN_HEADER, x),
                "{given:?}"
            );
        }
        assert!(!token_given(&HeaderMap::new(), ACCESS_TOKEN_HEADER, x));
        // The right token under the other header does not count.
        assert!(!token_given(
            &with(TRAFFIC_TOKEN_HEADER, &[x]),
            ACCESS_TOKEN_HEADER,
            x
        ));
        // Sent twice (a wrong one first, or the right one twice): refused, not "any matches".
        assert!(!token_given(
            &with(ACCESS_TOKEN_HEADER, &[y, x]),
            ACCESS_TOKEN_HEADER,
            x
        ));
        assert!(!token_given(
            &with(ACCESS_TOKEN_HEADER, &[x, x]),
            ACCESS_TOKEN_HEADER,
            x
        ));
    }

    fn head(path: &str, headers: &[(&str, &str)]) -> Parts {
        let mut req = Request::get(path);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        req.body(Body::empty()).unwrap().into_parts().0
    }

    #[test]
    fn the_guard_refuses_before_anything_is_done() {
        let access = "a".repeat(40);
        let traffic = "t".repeat(40);
        let guard = Guard {
            access_token: Some(access.clone()),
            traffic_token: Some(traffic.clone()),
            network: true,
        };
        let envd = sandcell_runtime::AGENT_PORT;
        // envd: the access token, nothing else
        assert_eq!(
            admit(
                &head("/files", &[(ACCESS_TOKEN_HEADER, &access)]),
                envd,
                &guard
            ),
            Ok(Admitted::Envd { signed: false })
        );
        for headers in [
            &[][..],
            &[(ACCESS_TOKEN_HEADER, traffic.as_str())][..],
            &[(TRAFFIC_TOKEN_HEADER, access.as_str())][..],
        ] {
            let e = admit(&head("/files", headers), envd, &guard).unwrap_err();
            assert_eq!(e.status, StatusCode::UNAUTHORIZED, "{headers:?}");
        }
        // a signed URL stands for the token; a forged one does not
        let sig = crate::http::signed_url::sign("/tmp/x", "read", "", &access, None);
        let url = format!("/files?path=/tmp/x&signature={sig}");
        assert_eq!(
            admit(&head(&url, &[]), envd, &guard),
            Ok(Admitted::Envd { signed: true })
        );
        let forged = format!("/files?path=/tmp/y&signature={sig}");
        assert!(admit(&head(&forged, &[]), envd, &guard).is_err());
        // internal routes: 404 even with the token
        for path in ["/init", "/sandcell/snapshot"] {
            let e = admit(&head(path, &[(ACCESS_TOKEN_HEADER, &access)]), envd, &guard);
            assert_eq!(e.unwrap_err().status, StatusCode::NOT_FOUND, "{path}");
        }
        // ports through the network: the traffic token, the access token does not count
        assert_eq!(
            admit(
                &head("/", &[(TRAFFIC_TOKEN_HEADER, &traffic)]),
                8080,
                &guard
            ),
            Ok(Admitted::Port)
        );
        let e = admit(&head("/", &[(ACCESS_TOKEN_HEADER, &access)]), 8080, &guard).unwrap_err();
        assert_eq!(e.status, StatusCode::FORBIDDEN);
        // public ports: anyone
        let public = Guard {
            traffic_token: None,
            ..guard
        };
        assert_eq!(admit(&head("/", &[]), 8080, &public), Ok(Admitted::Port));
        // no network: every port goes through the agent, guarded as envd
        let no_net = Guard {
            network: false,
            ..public
        };
        let e = admit(&head("/", &[]), 8080, &no_net).unwrap_err();
        assert_eq!(e.status, StatusCode::UNAUTHORIZED);
        assert_eq!(
            admit(&head("/", &[(ACCESS_TOKEN_HEADER, &access)]), 8080, &no_net),
            Ok(Admitted::Envd { signed: false })
        );
    }

    #[test]
    fn host_routing_parses_port_and_id() {
        let t = host_target("49983-sc-00ff.sandbox.test:3000", "sandbox.test");
        assert_eq!(
            t,
            Some(Target {
                sandbox_id: "sc-00ff".into(),
                port: 49983
            })
        );
        assert_eq!(host_target("api.sandbox.test", "sandbox.test"), None);
        assert_eq!(
            host_target("x.49983-sc-1.sandbox.test", "sandbox.test"),
            None
        );
        assert_eq!(
            host_target("49983-sc-1.evil-sandbox.test", "sandbox.test"),
            None
        );
        assert_eq!(host_target("99999-sc-1.sandbox.test", "sandbox.test"), None);
    }

    #[test]
    fn credentials_do_not_reach_the_sandbox() {
        let key = format!("e2b_{}", "ab".repeat(20));
        let mut h = HeaderMap::new();
        h.insert("x-api-key", HeaderValue::from_str(&key).unwrap());
        h.insert(ACCESS_TOKEN_HEADER, HeaderValue::from_static("tok"));
        h.insert(TRAFFIC_TOKEN_HEADER, HeaderValue::from_static("traffic"));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {key}")).unwrap(),
        );
        h.insert("x-app", HeaderValue::from_static("kept"));
        let mut envd = h.clone();
        strip_credentials(&mut h, false);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("x-app"));
        strip_credentials(&mut envd, true);
        assert_eq!(envd.len(), 2, "{envd:?}");
        assert!(envd.contains_key(ACCESS_TOKEN_HEADER));
        // an app's own Authorization passes
        let mut app = HeaderMap::new();
        app.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer app-token"),
        );
        strip_credentials(&mut app, false);
        assert!(app.contains_key(header::AUTHORIZATION));
    }

    #[test]
    fn header_routing_wins_and_checks_the_port() {
        let mut h = HeaderMap::new();
        h.insert(SANDBOX_ID_HEADER, HeaderValue::from_static("sc-1"));
        assert!(matches!(target(&h, None), Some(Err(_))));
        h.insert(SANDBOX_PORT_HEADER, HeaderValue::from_static("49983"));
        assert_eq!(
            target(&h, None).and_then(Result::ok),
            Some(Target {
                sandbox_id: "sc-1".into(),
                port: 49983
            })
        );
        let mut plain = HeaderMap::new();
        plain.insert(header::HOST, HeaderValue::from_static("127.0.0.1:3000"));
        assert!(target(&plain, Some("sandbox.test")).is_none());
    }
}
