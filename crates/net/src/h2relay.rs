//! HTTP/2 through TLS interception (issue 17): what [`crate::inject::relay`] does for
//! HTTP/1.x, for a sandbox and an upstream that both chose `h2` (intercept.rs offers the
//! sandbox `h2` only when the upstream took it: nothing here translates between versions).
//!
//! hyper speaks HTTP/2 on both sides. Every stream the sandbox opens is one request, checked
//! and rewritten on its own: its `:authority` (or `Host`) must be the rule's domain, else that
//! stream is answered 403 and nothing of it is sent; the rule's headers are resolved for THIS
//! request and replace any the sandbox sent under their names (a rule or secret gone: 502,
//! never sent); `CONNECT` (tunnels, WebSockets over HTTP/2) is refused as upgrades are on
//! HTTP/1.1. Bodies and trailers stream through as they come, both ways (gRPC works).
//!
//! hyper runs each stream, and the client connection, as a task of the executor it is given;
//! [`Local`] runs them inside this relay's own task instead, so that they may borrow what the
//! relay borrows (the domain, the closure that fills the headers) and end with it.

use crate::inject::{InjectError, InjectedHeader};
use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::header::{HOST, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;

type Body = BoxBody<Bytes, hyper::Error>;

/// Streams one sandbox connection may have open at once.
const MAX_STREAMS: u32 = 100;
type Task<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// An executor whose tasks run in the relay's task (see the module's comment).
#[derive(Clone)]
struct Local<'a> {
    tasks: mpsc::UnboundedSender<Task<'a>>,
}

impl<'a, F> hyper::rt::Executor<F> for Local<'a>
where
    F: Future + Send + 'a,
{
    fn execute(&self, fut: F) {
        // The receiver lives as long as the relay; after it, nothing is left to run.
        let _ = self.tasks.send(Box::pin(async move {
            fut.await;
        }));
    }
}

fn io_error(what: &str, e: hyper::Error) -> InjectError {
    InjectError::Io(std::io::Error::other(format!("HTTP/2 {what}: {e}")))
}

/// Relays one HTTP/2 connection of the sandbox to one HTTP/2 connection of the upstream
/// until the sandbox's ends. Errors are the connections' (a refused stream is answered and
/// the connection goes on).
pub async fn relay<S, U, F, Fut>(
    sandbox: S,
    upstream: U,
    domain: &str,
    headers_for: &F,
) -> Result<(), InjectError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
    U: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn() -> Fut + Sync,
    Fut: Future<Output = Result<Vec<InjectedHeader>, String>> + Send,
{
    let (tx, mut rx) = mpsc::unbounded_channel::<Task<'_>>();
    let exec = Local { tasks: tx };
    let mut running: FuturesUnordered<Task<'_>> = FuturesUnordered::new();
    // The upstream connection first: its handshake is driven as one of the tasks.
    let handshake = hyper::client::conn::http2::Builder::new(exec.clone())
        .handshake::<_, Incoming>(TokioIo::new(upstream));
    let (sender, conn) = handshake
        .await
        .map_err(|e| io_error("handshake with the upstream", e))?;
    // Driven beside the sandbox's connection: when it ends (the upstream's GOAWAY, its idle
    // timeout), the sandbox's connection is ended gracefully too, so that its client opens a
    // new one instead of getting a 502 for every stream after.
    let upstream_conn = async move {
        if let Err(e) = conn.await {
            tracing::debug!("egress proxy: HTTP/2 upstream connection: {e}");
        }
    };
    tokio::pin!(upstream_conn);
    let mut upstream_open = true;
    let service = hyper::service::service_fn(|req: Request<Incoming>| {
        let sender = sender.clone();
        async move { Ok::<_, Infallible>(one_request(req, sender, domain, headers_for).await) }
    });
    // Bounded as the HTTP/1.1 relay is: a request's headers at most its head limit, and a
    // sandbox opens at most this many streams at once.
    let served = hyper::server::conn::http2::Builder::new(exec)
        .max_header_list_size(crate::inject::MAX_HEAD as u32)
        .max_concurrent_streams(MAX_STREAMS)
        .serve_connection(TokioIo::new(sandbox), service);
    tokio::pin!(served);
    loop {
        tokio::select! {
            r = &mut served => {
                return r.map_err(|e| io_error("connection of the sandbox", e));
            }
            () = &mut upstream_conn, if upstream_open => {
                upstream_open = false;
                tracing::debug!("egress proxy: the HTTP/2 upstream for {domain} closed: GOAWAY to the sandbox");
                served.as_mut().graceful_shutdown();
            }
            Some(task) = rx.recv() => running.push(task),
            Some(()) = running.next(), if !running.is_empty() => {}
        }
    }
}

/// One stream: checked, its headers filled, sent; or answered here.
async fn one_request<F, Fut>(
    mut req: Request<Incoming>,
    mut sender: hyper::client::conn::http2::SendRequest<Incoming>,
    domain: &str,
    headers_for: &F,
) -> Response<Body>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Vec<InjectedHeader>, String>>,
{
    if req.method() == Method::CONNECT {
        tracing::info!("egress proxy: refused an HTTP/2 CONNECT to {domain}");
        return answer(
            StatusCode::FORBIDDEN,
            "refused by the sandbox's egress rules: no tunnels through a rule's domain\n",
        );
    }
    match authority_host(&req) {
        Some(host) if host.eq_ignore_ascii_case(domain) => {}
        other => {
            // the sandbox chose it: at most 80 characters of it in the log
            let named: Option<String> = other.map(|h| h.chars().take(80).collect());
            tracing::info!(
                "egress proxy: refused an HTTP/2 request to {domain} naming host {named:?}"
            );
            return answer(
                StatusCode::FORBIDDEN,
                "refused by the sandbox's egress rules: the request names another host\n",
            );
        }
    }
    let headers = match headers_for().await {
        Ok(h) => h,
        Err(why) => {
            tracing::info!("egress proxy: an HTTP/2 request to {domain} not sent: {why}");
            return answer(
                StatusCode::BAD_GATEWAY,
                "refused by the sandbox's egress rules: the rule's headers could not be filled\n",
            );
        }
    };
    for h in &headers {
        let (Ok(name), Ok(mut value)) = (
            HeaderName::from_bytes(h.name.as_bytes()),
            HeaderValue::from_str(&h.value),
        ) else {
            tracing::warn!(
                "egress proxy: rule header {:?} of {domain} is not valid HTTP",
                h.name
            );
            return answer(
                StatusCode::BAD_GATEWAY,
                "refused by the sandbox's egress rules: a rule header is not valid HTTP\n",
            );
        };
        // never indexed by HPACK: the value stays out of the connection's header tables
        value.set_sensitive(true);
        // insert replaces every value the sandbox sent under the name
        req.headers_mut().insert(name, value);
    }
    // The upstream is the rule's domain, whatever the sandbox's URI said beyond its path.
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    match Uri::builder()
        .scheme("https")
        .authority(domain)
        .path_and_query(path)
        .build()
    {
        Ok(uri) => *req.uri_mut() = uri,
        Err(_) => return answer(StatusCode::BAD_REQUEST, "a malformed request path\n"),
    }
    req.headers_mut().remove(HOST);
    match sender.send_request(req).await {
        Ok(resp) => resp.map(BodyExt::boxed),
        Err(e) => {
            tracing::info!("egress proxy: an HTTP/2 request to {domain}: {e}");
            answer(
                StatusCode::BAD_GATEWAY,
                "the upstream did not answer the request\n",
            )
        }
    }
}

/// The host a request names: its `:authority`, else its `Host`, without a port; a port
/// other than 443 is another origin and names no host of the rule's.
fn authority_host(req: &Request<Incoming>) -> Option<String> {
    let authority = match req.uri().authority() {
        Some(a) => a.clone(),
        None => req.headers().get(HOST)?.to_str().ok()?.parse().ok()?,
    };
    match authority.port_u16() {
        // `api.example.com.` is `api.example.com`
        None | Some(443) => Some(authority.host().trim_end_matches('.').to_string()),
        Some(_) => None,
    }
}

fn answer(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut resp = Response::new(
        Full::new(Bytes::from_static(text.as_bytes()))
            .map_err(|never| match never {})
            .boxed(),
    );
    *resp.status_mut() = status;
    resp
}
