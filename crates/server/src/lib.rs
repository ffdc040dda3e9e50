//! `sandcell serve`: the Sandcell daemon.
//!
//! One HTTP/1.1 port (default 127.0.0.1:3000) serves
//! - the control API with E2B's routes and JSON (`api.rs`, described at `GET /openapi.json`),
//!   authenticated by API keys (`keys.rs`), state in SQLite (`db.rs`);
//! - the envd proxy (`proxy.rs`): requests with `E2b-Sandbox-Id`/`E2b-Sandbox-Port`, or a
//!   Host `<port>-<sandboxID>.<domain>`, go to the sandbox's agent.
//!
//! So the stock E2B SDKs work with `E2B_API_URL=http://HOST:3000`,
//! `E2B_SANDBOX_URL=http://HOST:3000` and `E2B_API_KEY=<key>` (the first start writes an
//! admin key to `<data-dir>/admin.key`).

pub mod api;
pub mod db;
pub mod error;
pub mod extract;
pub mod keys;
pub mod keys_cli;
pub mod lifecycle;
pub mod metering;
pub mod metrics;
pub mod models;
pub mod network_api;
pub mod networks;
pub mod pause;
pub mod proxy;
pub mod snapshot_api;
pub mod snapshot_store;
pub mod snapshots;
pub mod state;
pub mod template_api;
pub mod template_builds;
pub mod template_defaults;
pub mod template_plan;
pub mod template_runner;
pub mod template_snapshot;
pub mod template_start;
pub mod template_tags;
pub mod util;

pub use keys_cli::{KeysCommand, keys};

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::header;
use axum::routing::get;
use db::Db;
use error::Error;
use lifecycle::Lifecycle;
use sandcell_runtime::gvisor::GvisorRuntime;
use sandcell_runtime::microvm::MicrovmRuntime;
use sandcell_runtime::select::{self, RuntimeChoice};
use sandcell_runtime::{Dirs, Image, Runtime, RuntimeKind};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// How long in-flight requests get to finish once the daemon is told to stop (after its
/// sandboxes were killed, which ends their streams).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Options of `sandcell serve` (the data dir comes from the global `--data-dir`).
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address of the API and envd proxy
    #[arg(long, default_value = "127.0.0.1:3000", value_name = "ADDR:PORT")]
    pub listen: SocketAddr,
    /// auto: a microVM if this host passes the (cached) self-test, else gVisor
    #[arg(long, default_value = "auto", value_parser = parse_choice, value_name = "auto|microvm|gvisor")]
    pub runtime: RuntimeChoice,
    /// Public domain: sandbox hosts are `<port>-<sandboxID>.<domain>` (Host routing) and
    /// the SDKs get it as the sandbox `domain`
    #[arg(long, value_name = "DOMAIN")]
    pub domain: Option<String>,
    /// Largest vCPU count a sandbox may ask for (`cpuCount` on create)
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub max_vcpus: u32,
    /// Largest memory a sandbox may ask for (`memoryMB` on create)
    #[arg(long, default_value_t = 8192, value_name = "MIB")]
    pub max_memory_mib: u32,
    /// Kill every sandbox when the daemon stops (default: they keep running and the next
    /// `sandcell serve` adopts them)
    #[arg(long)]
    pub kill_on_exit: bool,
    /// Sandboxes get no network at all (loopback only); default: each its own, with
    /// E2B's egress rules
    #[arg(long)]
    pub no_network: bool,
    /// Address pool of the sandbox networks (a /30 each); always unreachable from them
    #[arg(long, default_value = "10.200.0.0/16", value_name = "CIDR")]
    pub net_pool: String,
    /// Resolvers the sandboxes' DNS server forwards allowed names to (default: the host's
    /// /etc/resolv.conf)
    #[arg(long, value_delimiter = ',', value_name = "IP[,IP...]")]
    pub net_dns: Vec<std::net::Ipv4Addr>,
    /// Sandbox networks kept prepared ahead of creates
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub net_warm: usize,
    /// A registry (`host` or `host:port`) that template builds pull `fromImage` images
    /// from over plain HTTP
    #[arg(long = "insecure-registry", value_name = "HOST")]
    pub insecure_registries: Vec<String>,
    /// microvm: boot every sandbox instead of restoring a snapshot of its template into a
    /// pre-started VMM (sandboxes without a network; the default is to restore)
    #[arg(long)]
    pub no_template_snapshots: bool,
    /// microvm: idle pre-started VMMs kept for template snapshot restores
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub vmm_pool: usize,
    /// Template build caches (layers no template uses, uploaded COPY archives) older than
    /// DAYS are pruned daily, as `sandcell template prune --older-than DAYS`; 0: never
    #[arg(long, default_value_t = 7, value_name = "DAYS")]
    pub template_cache_days: u32,
}

/// `sandcell serve`'s network options to settings (`None`: --no-network).
fn net_settings(dirs: &Dirs, args: &ServeArgs) -> Result<Option<networks::NetSettings>, Error> {
    if args.no_network {
        return Ok(None);
    }
    let bad = |what: String| Error::Io {
        what,
        source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
    };
    let pool = args
        .net_pool
        .parse()
        .map_err(|e| bad(format!("--net-pool {}: {e}", args.net_pool)))?;
    let mut config = if args.net_dns.is_empty() {
        sandcell_runtime::net::NetConfig::from_host().unwrap_or_else(|e| {
            eprintln!(
                "sandcell serve: warning: sandboxes will resolve no names ({e}); use --net-dns"
            );
            sandcell_runtime::net::NetConfig {
                pool,
                upstream_dns: Vec::new(),
            }
        })
    } else {
        sandcell_runtime::net::NetConfig {
            pool,
            upstream_dns: args
                .net_dns
                .iter()
                .map(|ip| SocketAddr::from((*ip, 53)))
                .collect(),
        }
    };
    config.pool = pool;
    Ok(Some(networks::NetSettings {
        config,
        prefix: networks::prefix_for(&dirs.data),
        warm: args.net_warm,
        data_dir: dirs.data.clone(),
    }))
}

fn parse_choice(s: &str) -> Result<RuntimeChoice, String> {
    s.parse()
}

/// What the handlers share.
pub struct App {
    pub db: Db,
    pub lifecycle: Arc<Lifecycle>,
    pub config: Config,
    pub metrics: Arc<metrics::Metrics>,
}

#[derive(Debug, Clone, Default)]
pub struct Config {
    pub domain: Option<String>,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Sandcell API",
        description = "E2B-compatible control API of the Sandcell daemon. Sandbox (envd) \
            traffic goes to the same port with the E2b-Sandbox-Id and E2b-Sandbox-Port headers, \
            or to the host <port>-<sandboxID>.<domain>."
    ),
    modifiers(&SecurityAddon),
    components(schemas(error::ErrorBody))
)]
struct ApiDoc;

struct SecurityAddon;

impl utoipa::Modify for SecurityAddon {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "ApiKeyAuth",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("X-API-Key"))),
        );
    }
}

/// The API routes and their OpenAPI description.
pub fn routes() -> (Router<Arc<App>>, utoipa::openapi::OpenApi) {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(api::health))
        .routes(routes!(api::create_v1, api::list_v1))
        .routes(routes!(api::create_v2, api::list_v2))
        .routes(routes!(api::get_sandbox, api::kill_sandbox))
        .routes(routes!(api::set_timeout))
        .routes(routes!(api::refresh))
        .routes(routes!(api::connect_v2))
        .routes(routes!(api::connect_v1))
        .routes(routes!(api::list_templates))
        .routes(routes!(template_api::request_build))
        .routes(routes!(
            template_api::file_upload_link,
            template_api::upload_files
        ))
        .routes(routes!(template_api::start_build))
        .routes(routes!(template_api::build_status))
        .routes(routes!(template_api::build_logs))
        .routes(routes!(template_api::alias))
        .routes(routes!(
            template_tags::assign_tags,
            template_tags::remove_tags
        ))
        .routes(routes!(template_tags::list_tags))
        .routes(routes!(snapshot_api::pause_sandbox))
        .routes(routes!(snapshot_api::resume_sandbox))
        .routes(routes!(snapshot_api::fork_sandbox))
        .routes(routes!(snapshot_api::create_snapshot))
        .routes(routes!(snapshot_api::list_snapshots))
        .routes(routes!(snapshot_api::delete_snapshot))
        .routes(routes!(snapshot_api::delete_template))
        .routes(routes!(metering::usage))
        .routes(routes!(network_api::set_network))
        .routes(routes!(network_api::network_log))
        .routes(routes!(
            network_api::create_network,
            network_api::list_networks
        ))
        .routes(routes!(network_api::delete_network))
        .routes(routes!(network_api::attach, network_api::detach))
        .split_for_parts()
}

/// The whole service: API routes, `/openapi.json`, and the envd proxy in front of all.
pub fn router(app: Arc<App>) -> Router {
    let (routes, openapi) = routes();
    let spec = openapi.to_json().unwrap_or_else(|_| "{}".into());
    routes
        .route(
            "/openapi.json",
            get(move || {
                let spec = spec.clone();
                async move { ([(header::CONTENT_TYPE, "application/json")], spec) }
            }),
        )
        .route("/metrics", get(metrics::metrics))
        .fallback(api::no_route)
        .method_not_allowed_fallback(api::method_not_allowed)
        .layer(DefaultBodyLimit::max(extract::MAX_JSON_BODY))
        // Last = outermost: sees every request (routes and fallback) first.
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            proxy::route,
        ))
        // Outside the proxy: counts sandbox traffic too.
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            metrics::track,
        ))
        // Outermost: every answer gets its request id (error.rs).
        .layer(axum::middleware::from_fn(error::request_id))
        .with_state(app)
}

async fn open_runtime(
    dirs: &Dirs,
    args: &ServeArgs,
    nets: sandcell_runtime::net::NetRegistry,
) -> Result<Arc<dyn Runtime>, Error> {
    let choice = args.runtime;
    // The self-test boots the image sandboxes use most.
    let image = Image::resolve(&dirs.images(), "base")
        .or_else(|_| Image::resolve(&dirs.images(), "minimal"))
        .ok();
    let selection = select::choose(choice, dirs, None, image.as_ref()).await;
    eprintln!(
        "sandcell serve: {} runtime: {}",
        selection.runtime, selection.reason
    );
    Ok(match selection.runtime {
        RuntimeKind::Gvisor => Arc::new(GvisorRuntime::new(dirs.clone(), nets).await?),
        RuntimeKind::Microvm => {
            let pool = if args.no_template_snapshots {
                0
            } else {
                args.vmm_pool
            };
            Arc::new(MicrovmRuntime::new(dirs.clone(), nets)?.with_template_snapshots(pool))
        }
    })
}

/// Runs the daemon until SIGINT or SIGTERM.
pub async fn run(dirs: Dirs, args: ServeArgs) -> Result<(), Error> {
    let db = keys::open_db(&dirs.data).await?;
    if let Some(file) = keys::ensure_admin_key(&db, &dirs.data).await? {
        eprintln!(
            "sandcell serve: created the admin API key in {}",
            file.display()
        );
    }
    template_builds::set_insecure_registries(args.insecure_registries.clone());
    let interrupted = template_builds::mark_interrupted(&db).await?;
    if interrupted > 0 {
        eprintln!(
            "sandcell serve: {interrupted} template build(s) of the previous daemon were interrupted"
        );
    }
    if let Some(settings) = net_settings(&dirs, &args)? {
        networks::configure(settings);
    }
    let nets = sandcell_runtime::net::NetRegistry::new();
    networks::set_registry(nets.clone());
    let runtime = open_runtime(&dirs, &args, nets).await?;
    let metrics = Arc::new(metrics::Metrics::default());
    let lifecycle = Arc::new(Lifecycle::new(
        db.clone(),
        runtime,
        dirs.clone(),
        lifecycle::LifecycleConfig {
            max_vcpus: args.max_vcpus,
            max_memory_mib: args.max_memory_mib,
            kill_on_exit: args.kill_on_exit,
        },
        metrics.clone(),
    ));
    let (adopted, lost) = lifecycle.reconcile().await?;
    if !adopted.is_empty() {
        eprintln!(
            "sandcell serve: took over {} running sandbox(es) of the previous daemon: {}",
            adopted.len(),
            adopted.join(", ")
        );
    }
    if !lost.is_empty() {
        eprintln!(
            "sandcell serve: {} sandbox(es) did not survive the previous daemon and were marked error: {}",
            lost.len(),
            lost.join(", ")
        );
    }
    // After reconcile, which removes this daemon's unused networks, prepared ones too.
    networks::start_pool()?;
    let reaper = tokio::spawn(lifecycle.clone().reap_forever());
    if args.template_cache_days > 0 {
        tokio::spawn(template_builds::prune_caches_daily(
            dirs.data.clone(),
            args.template_cache_days,
        ));
    }
    let app = Arc::new(App {
        db: db.clone(),
        lifecycle: lifecycle.clone(),
        config: Config {
            domain: args.domain.clone(),
        },
        metrics,
    });
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(Error::io(format!("listening on {}", args.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(Error::io("reading the listening address"))?;
    // Tests and scripts read this line to find the port (`--listen 127.0.0.1:0`).
    println!("sandcell serve: listening on http://{addr}");

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        axum::serve(listener, router(app))
            .with_graceful_shutdown(async move {
                let _ = stop_rx.await;
            })
            .into_future(),
    );
    let signal = stop_signal().await;
    if args.kill_on_exit {
        eprintln!("sandcell serve: {signal}: killing the sandboxes and stopping");
    } else {
        eprintln!(
            "sandcell serve: {signal}: stopping; the sandboxes keep running for the next start"
        );
    }
    reaper.abort();
    // Idle pre-started VMMs are not sandboxes: they go with the daemon.
    lifecycle.runtime.stop_prestarted();
    lifecycle.shutdown().await;
    networks::shutdown().await;
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, server).await;
    db.close().await;
    Ok(())
}

async fn stop_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers the daemon runs until killed.
        std::future::pending::<()>().await;
        return "unreachable";
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

/// `sandcell serve`: runs the daemon; the exit status.
pub async fn serve(dirs: Dirs, args: ServeArgs) -> i32 {
    match run(dirs, args).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("sandcell serve: {e}");
            1
        }
    }
}
