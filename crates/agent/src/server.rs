//! The agent's HTTP/1.1 server: accept loop, access-token check, routing, and the small REST
//! routes (`/health`, `/init`, `/envs`, power-off). The Connect services live in
//! [`crate::process_api`], [`crate::fs_api`] and [`crate::watch`]; `/files` in [`crate::files`].

use std::convert::Infallible;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::header::{CACHE_CONTROL, CONNECTION, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use sandcell_proto::agent::filesystem as fsw;
use sandcell_proto::agent::net::NetParams;
use sandcell_proto::agent::process as pw;
use sandcell_proto::agent::{self as wire, InitRequest};
use tokio::sync::mpsc;

use crate::body::BoxBody;
use crate::connect::{self, ApiError, Reply, json_reply, status_only};
use crate::listen::{Listener, Stream};
use crate::process::Processes;
use crate::reaper::{ReapMode, Reaper};
use crate::state::{Defaults, ENVD_DEFAULT_USER, Shared, token_matches};
use crate::users::UserDb;
use crate::watch::Watchers;
use crate::{files, fs_api, process_api, watch};

/// Largest JSON request body (and request envelope) accepted. File uploads are streamed and
/// not limited by this.
pub const MAX_JSON_BODY: usize = 1024 * 1024;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Keepalive event interval on streams, unless the request's `Keepalive-Ping-Interval`
    /// header (seconds) says otherwise.
    pub keepalive: Duration,
    pub max_json_body: usize,
    pub reap_mode: ReapMode,
    /// Where `passwd` and `group` are read (`/etc`).
    pub etc_dir: PathBuf,
    /// The default user until `/init` names one (envd: root).
    pub default_user: String,
    /// The default working directory (for empty paths and cwds) until `/init` sets one.
    pub default_workdir: Option<String>,
    /// The agent configured the guest's network at boot (a microVM's PID 1 given
    /// `sandcell.net=`), so `/init`'s `sandcellNet` may readdress it. Otherwise (gVisor
    /// configures its own interface; an agent on a host must never touch the host's)
    /// `/init` refuses `sandcellNet`.
    pub owns_network: bool,
    /// Where `/init` publishes the default environment (env_file.rs); `None`: nowhere (an
    /// agent on a host).
    pub env_file: Option<PathBuf>,
    /// The root whose system trust store `/init`'s `sandcellCaBundle` goes into
    /// (trust_store.rs); `None`: none (an agent on a host must never touch the host's).
    pub trust_root: Option<PathBuf>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            // envd's default when the client sends no Keepalive-Ping-Interval.
            keepalive: Duration::from_secs(90),
            max_json_body: MAX_JSON_BODY,
            reap_mode: ReapMode::for_this_process(),
            etc_dir: PathBuf::from("/etc"),
            default_user: ENVD_DEFAULT_USER.to_owned(),
            default_workdir: None,
            owns_network: false,
            env_file: None,
            trust_root: None,
        }
    }
}

/// Why [`Server::serve`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServeOutcome {
    /// `POST /sandcell/poweroff` was answered; the caller powers off (or exits).
    PowerOffRequested,
    /// `POST /sandcell/checkpoint-hold` was answered and every connection closed; the caller
    /// drops the listener, waits (see [`crate::checkpoint`]) and serves again.
    CheckpointRequested,
}

pub struct State {
    pub config: ServerConfig,
    pub procs: Arc<Processes>,
    pub shared: Shared,
    pub watchers: Watchers,
}

pub struct Server {
    state: Arc<State>,
    reaper: Arc<Reaper>,
}

impl Server {
    /// Must be called inside a tokio runtime (it starts the child reaper).
    pub fn new(config: ServerConfig) -> io::Result<Self> {
        let reaper = Reaper::start(config.reap_mode)?;
        let procs = Arc::new(Processes::new(reaper.clone()));
        let mut defaults = Defaults::new(&config.default_user);
        defaults.workdir = config.default_workdir.clone();
        let shared = Shared::new(defaults, UserDb::new(&config.etc_dir));
        Ok(Server {
            reaper,
            state: Arc::new(State {
                config,
                procs,
                shared,
                watchers: Watchers::default(),
            }),
        })
    }

    /// The child reaper, for whatever else spawns children (the sudo service).
    pub fn reaper(&self) -> Arc<Reaper> {
        self.reaper.clone()
    }

    /// Serves connections until a power-off or checkpoint-hold request has been answered.
    /// Returning drops (closes) every connection still open.
    pub async fn serve(&self, listener: Listener) -> io::Result<ServeOutcome> {
        let (off_tx, mut off_rx) = mpsc::channel::<ServeOutcome>(1);
        let mut connections = tokio::task::JoinSet::new();
        loop {
            // Reap finished connections so that the set stays small.
            while connections.try_join_next().is_some() {}
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(conn) => {
                        connections.spawn(serve_connection(self.state.clone(), conn, off_tx.clone()));
                    }
                    Err(e) => {
                        crate::log!("accepting a connection: {e}");
                        // EMFILE and friends: do not spin on them.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(outcome) = off_rx.recv() => {
                    // Every connection is gone before the listener is (the caller drops it):
                    // a checkpoint must find no host socket left.
                    connections.shutdown().await;
                    return Ok(outcome);
                }
            }
        }
    }
}

async fn serve_connection(state: Arc<State>, conn: Stream, off_tx: mpsc::Sender<ServeOutcome>) {
    let poweroff = Arc::new(AtomicBool::new(false));
    let hold = Arc::new(AtomicBool::new(false));
    let (flag, hold_flag) = (poweroff.clone(), hold.clone());
    let service = service_fn(move |req| {
        let state = state.clone();
        let flag = flag.clone();
        let hold_flag = hold_flag.clone();
        async move { Ok::<_, Infallible>(route(&state, &flag, &hold_flag, req).await) }
    });
    // Errors here are the peer's (reset, malformed HTTP): nothing to do but drop it.
    let _ = http1::Builder::new()
        .serve_connection(TokioIo::new(conn), service)
        .await;
    // The power-off answer carried `Connection: close`, so the connection ending means the
    // client has its 204.
    if poweroff.load(Ordering::SeqCst) {
        let _ = off_tx.send(ServeOutcome::PowerOffRequested).await;
    } else if hold.load(Ordering::SeqCst) {
        let _ = off_tx.send(ServeOutcome::CheckpointRequested).await;
    }
}

/// Routes envd lets through without the access token: health, `/files` (which checks the
/// token itself, to allow signed URLs) and `/init` (which authenticates its own body). Our
/// own power-off is exempt too: only the host's runtime reaches it (the daemon's proxy never
/// forwards `/sandcell/*`), and it must be able to stop a sandbox whose token it never saw.
fn auth_exempt(method: &Method, path: &str) -> bool {
    matches!(
        (method, path),
        (&Method::GET, wire::HEALTH_PATH)
            | (&Method::GET, wire::FILES_PATH)
            | (&Method::POST, wire::FILES_PATH)
            | (&Method::POST, wire::INIT_PATH)
            | (&Method::POST, wire::POWEROFF_PATH)
            | (&Method::POST, wire::CHECKPOINT_HOLD_PATH)
    )
}

fn check_token(state: &State, req: &Request<Incoming>) -> Result<(), ApiError> {
    if auth_exempt(req.method(), req.uri().path()) {
        return Ok(());
    }
    let Some(token) = state.shared.defaults().access_token.clone() else {
        return Ok(());
    };
    let given = req
        .headers()
        .get(wire::ACCESS_TOKEN_HEADER)
        .and_then(|v| v.to_str().ok());
    if given.is_some_and(|g| token_matches(&token, g)) {
        return Ok(());
    }
    Err(ApiError::rest(
        StatusCode::UNAUTHORIZED,
        "unauthorized access, please provide a valid access token or method signing if supported",
    ))
}

/// envd's authn middleware: a Basic-auth user name that does not exist is refused on every
/// route but the health check.
fn check_basic_user(state: &State, req: &Request<Incoming>) -> Result<(), ApiError> {
    if req.uri().path() == wire::HEALTH_PATH {
        return Ok(());
    }
    match crate::state::basic_auth_user(req) {
        Some(name) if state.shared.users.lookup(&name).is_err() => Err(ApiError::new(
            "unauthenticated",
            format!("invalid username: '{name}'"),
        )),
        _ => Ok(()),
    }
}

async fn route(
    state: &State,
    poweroff: &AtomicBool,
    hold: &AtomicBool,
    req: Request<Incoming>,
) -> Response<BoxBody> {
    let result = match check_token(state, &req).and_then(|()| check_basic_user(state, &req)) {
        Ok(()) => dispatch(state, poweroff, hold, req).await,
        Err(e) => Err(e),
    };
    result.unwrap_or_else(ApiError::into_response)
}

async fn dispatch(
    state: &State,
    poweroff: &AtomicBool,
    hold: &AtomicBool,
    req: Request<Incoming>,
) -> Reply {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    if method == Method::GET {
        return match path.as_str() {
            wire::HEALTH_PATH => Ok(no_store(status_only(StatusCode::NO_CONTENT))),
            wire::FILES_PATH => files::download(state, req).await,
            wire::ENVS_PATH => envs(state),
            _ => Err(not_routed(&path)),
        };
    }
    if method != Method::POST {
        return Err(ApiError::with_status(
            StatusCode::METHOD_NOT_ALLOWED,
            "unimplemented",
            format!("method {method} not allowed on {path}"),
        ));
    }
    match path.as_str() {
        wire::START_PATH => process_api::start(state, req).await,
        pw::CONNECT_PATH => process_api::connect(state, req).await,
        pw::LIST_PATH => process_api::list(state, req).await,
        pw::UPDATE_PATH => process_api::update(state, req).await,
        wire::SEND_INPUT_PATH => process_api::send_input(state, req).await,
        pw::STREAM_INPUT_PATH => process_api::stream_input(state, req).await,
        wire::CLOSE_STDIN_PATH => process_api::close_stdin(state, req).await,
        wire::SEND_SIGNAL_PATH => process_api::send_signal(state, req).await,
        fsw::STAT_PATH => fs_api::stat(state, req).await,
        fsw::MAKE_DIR_PATH => fs_api::make_dir(state, req).await,
        fsw::MOVE_PATH => fs_api::rename(state, req).await,
        fsw::LIST_DIR_PATH => fs_api::list_dir(state, req).await,
        fsw::REMOVE_PATH => fs_api::remove(state, req).await,
        fsw::WATCH_DIR_PATH => watch::watch_dir(state, req).await,
        fsw::CREATE_WATCHER_PATH => watch::create_watcher(state, req).await,
        fsw::GET_WATCHER_EVENTS_PATH => watch::get_watcher_events(state, req).await,
        fsw::REMOVE_WATCHER_PATH => watch::remove_watcher(state, req).await,
        wire::FILES_PATH => files::upload(state, req).await,
        wire::INIT_PATH => init(state, req).await,
        wire::POWEROFF_PATH | wire::CHECKPOINT_HOLD_PATH => {
            let flag = if path == wire::POWEROFF_PATH {
                poweroff
            } else {
                hold
            };
            flag.store(true, Ordering::SeqCst);
            let mut resp = status_only(StatusCode::NO_CONTENT);
            resp.headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
            Ok(resp)
        }
        _ => Err(not_routed(&path)),
    }
}

fn not_routed(path: &str) -> ApiError {
    ApiError::with_status(
        StatusCode::NOT_FOUND,
        "unimplemented",
        format!("no route {path}"),
    )
}

fn no_store(mut resp: Response<BoxBody>) -> Response<BoxBody> {
    resp.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

fn envs(state: &State) -> Reply {
    let env = state.shared.defaults().env();
    json_reply(&env).map(no_store)
}

/// How far the guest clock may lag or lead `/init`'s timestamp before it is set (envd's).
const CLOCK_MAX_BEHIND: Duration = Duration::from_millis(50);
const CLOCK_MAX_AHEAD: Duration = Duration::from_secs(5);

/// `POST /init`: env vars, access token, default user and workdir, clock; our extensions
/// (see [`InitRequest`]). Without envd's metadata service the token rule is: the first
/// `/init` sets it; later ones must repeat it.
async fn init(state: &State, req: Request<Incoming>) -> Reply {
    let bytes = connect::bounded_body(req, state.config.max_json_body).await?;
    let body: InitRequest = if bytes.iter().all(u8::is_ascii_whitespace) {
        InitRequest::default()
    } else {
        serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::rest(
                StatusCode::BAD_REQUEST,
                format!("Failed to decode request: {e}"),
            )
        })?
    };
    let timestamp = match body.timestamp.as_deref() {
        Some(t) => Some(sandcell_proto::time::parse_nanos(t).ok_or_else(|| {
            ApiError::rest(StatusCode::BAD_REQUEST, format!("invalid timestamp {t:?}"))
        })?),
        None => None,
    };
    let entropy = match body.sandcell_entropy.as_deref() {
        Some(hex) => Some(crate::entropy::decode(hex).map_err(|e| {
            ApiError::rest(StatusCode::BAD_REQUEST, format!("sandcellEntropy: {e}"))
        })?),
        None => None,
    };
    let net = match body.sandcell_net.as_deref() {
        Some(value) => Some(readdress_params(state, value)?),
        None => None,
    };
    // Empty: take out a CA installed before (the daemon intercepts no longer).
    if let Some(pem) = body.sandcell_ca_bundle.as_deref().filter(|p| !p.is_empty()) {
        crate::trust_store::validate(pem).map_err(|e| {
            ApiError::rest(StatusCode::BAD_REQUEST, format!("sandcellCaBundle: {e}"))
        })?;
    }
    if let Some(bytes) = &entropy {
        crate::entropy::reseed(bytes);
    }
    // Host-only, like the sandbox id: applied before the token rule and whatever the
    // timestamp (there is one right network, the one the VMM now runs in).
    if let Some(p) = &net {
        readdress(p)?;
    }
    // The runtime's own /init after a restore (it cannot know the access token): it
    // readdresses and leaves envd's state, token rule included, to the daemon's /init.
    if net.is_some() && carries_no_envd_field(&body) {
        return Ok(init_answer());
    }
    {
        let mut d = state.shared.defaults_mut();
        // A new identity in an old memory image (restored from a snapshot): start over.
        if let Some(id) = body
            .sandcell_sandbox_id
            .as_deref()
            .filter(|id| !id.is_empty())
            && d.sandbox_id.as_deref() != Some(id)
        {
            d.sandbox_id = Some(id.to_owned());
            d.access_token = None;
            d.last_init = None;
            d.internal_env
                .insert("E2B_SANDBOX_ID".to_owned(), id.to_owned());
            rename_host(id);
        }
        if let Some(current) = &d.access_token {
            let same = body
                .access_token
                .as_deref()
                .is_some_and(|t| token_matches(current, t));
            if !same {
                let message = if body.access_token.is_some() {
                    "access token validation failed"
                } else {
                    "access token reset not authorized"
                };
                return Err(ApiError::rest(StatusCode::UNAUTHORIZED, message));
            }
        }
        // A replayed or reordered /init (older timestamp) changes nothing.
        let newer = match (timestamp, d.last_init) {
            (Some(t), Some(last)) => t > last,
            _ => true,
        };
        if newer {
            if let Some(t) = timestamp {
                d.last_init = Some(t);
                sync_clock(t);
            }
            if let Some(env) = body.env_vars {
                d.user_env = env;
            }
            d.access_token = body.access_token.filter(|t| !t.is_empty());
            // A default user the image does not have would make every later process fail:
            // keep the current one and say so (the host sends E2B's `user` to every image).
            if let Some(user) = body.default_user.filter(|u| !u.is_empty()) {
                match state.shared.users.lookup(&user) {
                    Ok(_) => d.user = user,
                    Err(e) => crate::log!("/init: keeping default user {:?}: {e}", d.user),
                }
            }
            if let Some(w) = body.default_workdir.filter(|w| !w.is_empty()) {
                d.workdir = Some(w);
            }
            match (&body.sandcell_ca_bundle, &state.config.trust_root) {
                (Some(pem), Some(root)) if pem.is_empty() => {
                    crate::trust_store::uninstall(root);
                    d.trust_env.clear();
                    d.trusted_ca = None;
                }
                (Some(pem), Some(_)) if d.trusted_ca.as_ref() == Some(pem) => {}
                (Some(pem), Some(root)) => {
                    d.trust_env = crate::trust_store::install(root, pem);
                    // Only a store that took it is remembered: a failed write is tried again.
                    d.trusted_ca = (!d.trust_env.is_empty()).then(|| pem.clone());
                }
                (Some(pem), None) if pem.is_empty() => {}
                (Some(_), None) => crate::log!(
                    "/init: sandcellCaBundle ignored: this agent does not own a trust store \
                     (no --trust-root)"
                ),
                (None, _) => {}
            }
        }
        // Processes started before this /init (a restored template's start command) read
        // it. Written under the lock: two /inits cannot leave the older one's env in place.
        if newer && let Some(path) = &state.config.env_file {
            crate::env_file::publish(path, &d.env());
        }
    }
    Ok(init_answer())
}

fn init_answer() -> Response<BoxBody> {
    let mut resp = no_store(status_only(StatusCode::NO_CONTENT));
    resp.headers_mut().insert(
        wire::ENVD_VERSION_HEADER,
        HeaderValue::from_static(wire::ENVD_VERSION),
    );
    resp
}

/// `sandcellNet`, parsed (400 when malformed) and allowed here (409 when this agent does
/// not own the guest's network).
fn readdress_params(state: &State, value: &str) -> Result<NetParams, ApiError> {
    let p = NetParams::parse(value).map_err(|e| {
        ApiError::rest(
            StatusCode::BAD_REQUEST,
            format!("sandcellNet {value:?}: {e}"),
        )
    })?;
    if !state.config.owns_network {
        return Err(ApiError::rest(
            StatusCode::CONFLICT,
            "sandcellNet: this agent does not configure the network (it was not started as \
             a microVM's init with sandcell.net=)",
        ));
    }
    Ok(p)
}

/// Readdresses the guest's interface; 500 naming the failed step.
fn readdress(p: &NetParams) -> Result<(), ApiError> {
    match crate::netconfig::configure(p) {
        Ok(name) => {
            crate::log!(
                "/init: network {name} {}/{} via {}",
                p.addr,
                p.prefix,
                p.gateway
            );
            Ok(())
        }
        Err(e) => Err(ApiError::rest(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("sandcellNet: {e}"),
        )),
    }
}

/// None of envd's own fields nor a new identity: nothing for the token rule to guard.
fn carries_no_envd_field(body: &InitRequest) -> bool {
    body.env_vars.is_none()
        && body.access_token.is_none()
        && body.timestamp.is_none()
        && body.default_user.is_none()
        && body.default_workdir.is_none()
        && body.sandcell_sandbox_id.is_none()
}

/// Sets CLOCK_REALTIME to `host_nanos` when the guest is off by more than envd's margins.
/// Needs CAP_SYS_TIME (PID 1 of a VM has it); failure is logged, not fatal.
fn sync_clock(host_nanos: i128) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    let behind = now < host_nanos - CLOCK_MAX_BEHIND.as_nanos() as i128;
    let ahead = now > host_nanos + CLOCK_MAX_AHEAD.as_nanos() as i128;
    if !(behind || ahead) {
        return;
    }
    let ts = libc::timespec {
        tv_sec: host_nanos.div_euclid(1_000_000_000) as libc::time_t,
        tv_nsec: host_nanos.rem_euclid(1_000_000_000) as libc::c_long,
    };
    // SAFETY: clock_settime reads the timespec we pass, valid for the call.
    if unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) } < 0 {
        crate::log!(
            "setting the clock from /init: {}",
            io::Error::last_os_error()
        );
    }
}

/// A new identity takes the sandbox id as hostname, as a freshly started sandbox has (gVisor
/// sets it from the bundle, the microVM from the command line): otherwise every sandbox
/// restored from one template or fork would share the source's hostname. Only as PID 1: an
/// agent run on a host (tests, tools) must never rename the host.
fn rename_host(id: &str) {
    let valid = !id.is_empty()
        && id.len() <= 63
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if std::process::id() != 1 || !valid {
        return;
    }
    if let Err(e) = crate::init::set_hostname(id) {
        crate::log!("setting the hostname to {id}: {e}");
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use sandcell_envd_client::EnvdClient;
    use sandcell_proto::agent::{ProcessConfig, StartRequest};

    use super::*;
    use crate::listen::ListenAddr;

    #[tokio::test]
    async fn the_server_runs_in_process_on_tcp() {
        let config = ServerConfig {
            reap_mode: ReapMode::OwnChildren,
            ..ServerConfig::default()
        };
        let server = Server::new(config).expect("server");
        let listener = Listener::bind(&ListenAddr::Tcp(([127, 0, 0, 1], 0).into()))
            .await
            .expect("bind");
        let Listener::Tcp(tcp) = &listener else {
            unreachable!("bound a TCP listener")
        };
        let addr = tcp.local_addr().expect("local addr");
        tokio::spawn(async move { server.serve(listener).await });

        let client = EnvdClient::new(move || tokio::net::TcpStream::connect(addr));
        client.health().await.expect("health over TCP");
        let start = StartRequest {
            process: ProcessConfig {
                cmd: "/bin/sh".to_owned(),
                args: vec!["-c".to_owned(), "echo over tcp; exit 4".to_owned()],
                envs: BTreeMap::new(),
                cwd: None,
            },
            stdin: None,
            tag: None,
        };
        let out = client
            .start(&start)
            .await
            .expect("Start")
            .collect(1 << 20)
            .await
            .expect("stream");
        assert_eq!(out.stdout, b"over tcp\n");
        assert_eq!(out.end.exit_code, 4);
    }
}
