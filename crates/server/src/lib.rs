//! `sandcell serve`: the Sandcell daemon.
//!
//! One HTTP/1.1 port (default 127.0.0.1:3000) serves
//! - the control API with E2B's routes and JSON (router in `http/`, described at
//!   `GET /openapi.json`), authenticated by API keys (`keys/`), state in SQLite (`store/`);
//! - the envd proxy (`http/proxy.rs`): requests with `E2b-Sandbox-Id`/`E2b-Sandbox-Port`, or a
//!   Host `<port>-<sandboxID>.<domain>`, go to the sandbox's agent (a paused sandbox with
//!   auto-resume is resumed first, `http/wake.rs`).
//!
//! So the stock E2B SDKs work with `E2B_API_URL=http://HOST:3000`,
//! `E2B_SANDBOX_URL=http://HOST:3000` and `E2B_API_KEY=<key>` (the first start writes an
//! admin key to `<data-dir>/admin.key`).
//!
//! One folder per concept: `sandboxes/` (create, kill, timeouts, re-adoption, metering),
//! `snapshots/` (pause, resume, named snapshots, fork, restore), `templates/` (E2B template
//! builds, tags, memory snapshots, start commands), `networks/`, `keys/`, `computer/`
//! (screenshots, mouse, keyboard of a sandbox's desktop); each has its
//! routes in `api.rs`. `store/` holds the tables, `http/` the router, extractors, proxy,
//! metrics and errors. This file reads the options and wires the parts together ([`run`]).

pub mod computer;
pub mod error;
pub mod http;
pub mod keys;
pub mod logging;
pub mod networks;
pub mod sandboxes;
pub mod secrets;
pub mod snapshots;
pub mod store;
pub mod templates;
pub mod tls;
pub mod util;
pub mod volumes;

pub use http::{router, routes};
pub use keys::cli::{KeysCommand, keys};
pub use secrets::cli::{SecretsCommand, secrets};

use http::error::Error;
use http::metrics;
use sandboxes::service::SandboxService;
use sandcell_runtime::gvisor::GvisorRuntime;
use sandcell_runtime::microvm::MicrovmRuntime;
use sandcell_runtime::select::{self, RuntimeChoice};
use sandcell_runtime::{Dirs, Image, Runtime, RuntimeKind};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use store::Db;

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
    /// Public domain: sandbox hosts are `<port>-<sandboxID>.<domain>` (Host routing), also
    /// served over HTTPS on `--https-port`, and the SDKs get it as the sandbox `domain`
    #[arg(long, value_name = "DOMAIN")]
    pub domain: Option<String>,
    /// With `--domain`: the HTTPS port of `https://<port>-<sandboxID>.<domain>`, on the
    /// address of `--listen` (0: any free port)
    #[arg(long, default_value_t = 443, value_name = "PORT")]
    pub https_port: u16,
    /// The certificate chain (PEM) for `*.<domain>`; without it the daemon's own CA
    /// (`<data-dir>/tls/ca.pem`) issues one
    #[arg(long, requires = "tls_key", value_name = "FILE")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The key (PEM) of `--tls-cert`
    #[arg(long, requires = "tls_cert", value_name = "FILE")]
    pub tls_key: Option<std::path::PathBuf>,
    /// Largest vCPU count a sandbox may ask for (`cpuCount` on create)
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub max_vcpus: u32,
    /// Largest memory a sandbox may ask for (`memoryMB` on create)
    #[arg(long, default_value_t = 8192, value_name = "MIB")]
    pub max_memory_mib: u32,
    /// gvisor: every sandbox's disk (a sparse ext4 file under `<data-dir>/disks`, taking
    /// only what is written; the root's writes go there: ENOSPC when full, `df /` and the
    /// API's `diskSizeMB` tell the size); 0: none, the root's writes live in the sandbox's
    /// memory (creates ~50 ms faster; no filesystem-only pause)
    #[arg(long, default_value_t = 10240, value_name = "MIB")]
    pub disk_mib: u32,
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
    /// gvisor: booted idle sandboxes of `--warm-template` at the default size kept for
    /// creates to take (each in its own network, no egress until taken; not listed,
    /// metered or counted against any key); 0: every create boots. Ignored on microvm
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub warm: usize,
    /// The most memory the warm pool's idle sandboxes may be given together
    #[arg(long, default_value_t = 2048, value_name = "MIB")]
    pub warm_memory: u64,
    /// The template the warm pool boots
    #[arg(long, default_value = "base", value_name = "NAME")]
    pub warm_template: String,
    /// Most connections the API port serves at once; beyond, accepting pauses (clients wait
    /// in the backlog)
    #[arg(long, default_value_t = 1024, value_name = "N")]
    pub max_connections: usize,
    /// Seconds a client has to send a whole request head (also how long an idle
    /// keep-alive connection stays open)
    #[arg(long, default_value_t = 30, value_name = "SECS")]
    pub header_timeout_secs: u64,
    /// Private ranges (inside 10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7) that
    /// sandboxes' `allowOut` rules may open; by default none. Loopback, link-local (cloud
    /// metadata), the pool and the host's own addresses are never opened
    #[arg(long, default_value = "", value_name = "CIDR[,CIDR...]")]
    pub allow_private_egress: String,
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
    /// A template build that runs longer fails (its RUN sandbox is killed)
    #[arg(long, default_value_t = 1800, value_name = "SECS")]
    pub build_timeout: u64,
    /// A RUN step (or FROM pull) of a template build that runs longer fails the build
    #[arg(long, default_value_t = 900, value_name = "SECS")]
    pub build_step_timeout: u64,
    /// What a template build's RUN steps may write on the host, in all: each step's writes
    /// go to a disk of what is left (ENOSPC inside past it, and the build fails saying so);
    /// 0: no limit
    #[arg(long, default_value_t = 10240, value_name = "MIB")]
    pub build_disk_mib: u32,
    /// A requested template build not started within this time expires, freeing its name
    #[arg(long, default_value_t = 1800, value_name = "SECS")]
    pub build_start_timeout: u64,
    /// Live sandboxes of a key whose `--max-sandboxes` is `default` (admin keys: no limit)
    #[arg(long, default_value = "20", value_name = "N|unlimited")]
    pub default_max_sandboxes: keys::quota::DefaultLimit,
    /// Memory of a key's running sandboxes, for keys whose `--max-memory-mib` is `default`
    #[arg(long, default_value = "32768", value_name = "MIB|unlimited")]
    pub default_max_memory_mib: keys::quota::DefaultLimit,
    /// Disk of a key's live sandboxes, for keys whose `--max-disk-mib` is `default`
    #[arg(long, default_value = "204800", value_name = "MIB|unlimited")]
    pub default_max_disk_mib: keys::quota::DefaultLimit,
    /// Template builds of a key at once, for keys whose `--max-builds` is `default`
    #[arg(long, default_value = "2", value_name = "N|unlimited")]
    pub default_max_builds: keys::quota::DefaultLimit,
    /// Uploaded build archives of a key, for keys whose `--max-upload-mib` is `default`
    #[arg(long, default_value = "16384", value_name = "MIB|unlimited")]
    pub default_max_upload_mib: keys::quota::DefaultLimit,
    /// Creates, restores, forks and resumes are refused (503) when the memory of all
    /// running sandboxes would pass this many times the host's MemTotal
    #[arg(long, default_value_t = 1.5, value_name = "RATIO")]
    pub memory_overcommit: f64,
    /// Creates, restores, forks and resumes are refused (503) while the data dir's
    /// filesystem has less free than this
    #[arg(long, default_value_t = 2048, value_name = "MIB")]
    pub min_free_disk_mib: u64,
    /// `/metrics` gets one series per sandbox (label `sandbox_id`) for CPU, memory and disk,
    /// instead of their sums
    #[arg(long)]
    pub metrics_per_sandbox: bool,
    /// The longest a sandbox may run (`90m`, `24h`, `7d`; time paused does not count), and
    /// so the longest `timeout` a request may ask for; past it the sandbox is killed
    #[arg(long, default_value = "24h", value_parser = parse_lifetime, value_name = "DURATION")]
    pub max_lifetime: u64,
    /// Do not intercept HTTPS: requests to the `network.rules` domains with a transform get
    /// their headers filled over plain HTTP only (HTTPS leaves with the placeholders). By
    /// default HTTPS on 443 to those domains, and to no other, is intercepted with the
    /// daemon's egress CA (`<data-dir>/egress-ca.pem`), which every sandbox's trust store
    /// gets at start (docs/secrets.md)
    #[arg(long)]
    pub no_egress_intercept_tls: bool,
    /// Interception is on by default and, when it cannot be set up (no CA bundle on the
    /// host, an unreadable egress CA), logged and left off: with this flag the start fails
    /// instead
    #[arg(long, conflicts_with = "no_egress_intercept_tls")]
    pub egress_intercept_tls: bool,
    /// CA certificates (a PEM bundle) trusted for the intercepted upstreams besides the
    /// host's CA bundle (private upstreams)
    #[arg(long, conflicts_with = "no_egress_intercept_tls", value_name = "FILE")]
    pub egress_extra_ca: Option<std::path::PathBuf>,
    /// The bucket of persistent volumes (docs/volumes.md)
    #[command(flatten)]
    pub s3: volumes::config::S3Args,
}

/// `--max-lifetime`: a whole number with a unit (`s`, `m`, `h`, `d`), in seconds; from one
/// second to a year.
fn parse_lifetime(s: &str) -> Result<u64, String> {
    let bad = || format!("{s:?} is not a duration: send e.g. 90m, 24h or 7d");
    let split = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| bad())?;
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    let secs = n.checked_mul(scale).ok_or_else(bad)?;
    if !(1..=365 * 86_400).contains(&secs) {
        return Err(format!("{s:?} is out of range: 1s to 365d"));
    }
    Ok(secs)
}

impl ServeArgs {
    /// Keys' default quotas and the host's limits, from the options.
    fn admission(&self) -> sandboxes::admission::AdmissionConfig {
        sandboxes::admission::AdmissionConfig {
            key_defaults: keys::quota::QuotaDefaults {
                sandboxes: self.default_max_sandboxes.0,
                memory_mib: self.default_max_memory_mib.0,
                disk_mib: self.default_max_disk_mib.0,
                builds: self.default_max_builds.0,
                upload_mib: self.default_max_upload_mib.0,
            },
            host: sandboxes::admission::HostLimits {
                memory_overcommit: self.memory_overcommit,
                min_free_disk_mib: self.min_free_disk_mib,
            },
        }
    }
}

/// `sandcell serve`'s network options to settings (`None`: --no-network).
fn net_settings(
    dirs: &Dirs,
    args: &ServeArgs,
) -> Result<Option<networks::service::NetSettings>, Error> {
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
            tracing::warn!("sandboxes will resolve no names ({e}); use --net-dns");
            sandcell_runtime::net::NetConfig {
                pool,
                upstream_dns: Vec::new(),
                allow_private: Default::default(),
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
            allow_private: Default::default(),
        }
    };
    config.pool = pool;
    config.allow_private = args.allow_private_egress.parse().map_err(|e| {
        bad(format!(
            "--allow-private-egress {}: {e}",
            args.allow_private_egress
        ))
    })?;
    Ok(Some(networks::service::NetSettings {
        config,
        prefix: networks::service::prefix_for(&dirs.data),
        warm: args.net_warm,
        data_dir: dirs.data.clone(),
    }))
}

/// Unless `--no-egress-intercept-tls`: the egress CA (made on the first start) and the
/// upstream trust store, installed for this process's egress proxies. Asked for by a flag
/// (`--egress-intercept-tls`, `--egress-extra-ca`), a failure stops the start; on by
/// default only, it is logged and the daemon runs without interception (HTTPS to rule
/// domains then leaves with the placeholders), e.g. on a host with no CA bundle.
fn egress_interception(dirs: &Dirs, args: &ServeArgs) -> Result<(), Error> {
    if args.no_egress_intercept_tls {
        return Ok(());
    }
    match start_interception(dirs, args) {
        Err(e) if !args.egress_intercept_tls && args.egress_extra_ca.is_none() => {
            tracing::warn!(
                "HTTPS to network.rules domains is not intercepted (their requests leave \
                 with the placeholders): {e}; fix it, or pass --no-egress-intercept-tls"
            );
            Ok(())
        }
        other => other,
    }
}

fn start_interception(dirs: &Dirs, args: &ServeArgs) -> Result<(), Error> {
    use sandcell_runtime::net::{intercept, tls_ca};
    let extra = match &args.egress_extra_ca {
        Some(path) => intercept::read_extra_ca(path)?,
        None => Vec::new(),
    };
    let ca = tls_ca::EgressCa::load_or_create(&dirs.data)?;
    intercept::set_interceptor(Arc::new(intercept::Interceptor::new(ca, extra)?));
    tracing::info!(
        "HTTPS to network.rules domains with a transform is intercepted: sandboxes trust {}",
        dirs.data.join(tls_ca::CERT_FILE).display()
    );
    Ok(())
}

fn parse_choice(s: &str) -> Result<RuntimeChoice, String> {
    s.parse()
}

/// What the handlers share: everything one daemon keeps in memory (two daemons in one
/// process share nothing), built in [`run`].
pub struct App {
    pub db: Db,
    pub lifecycle: Arc<SandboxService>,
    pub config: Config,
    pub metrics: Arc<metrics::Metrics>,
    /// Template builds of this daemon's lifetime.
    pub builds: templates::builds::Builds,
    /// Upload URLs handed out for template builds' COPY archives.
    pub uploads: templates::api::UploadGrants,
    /// Auto-resumes in flight (http/wake.rs).
    pub wakes: http::wake::Wakes,
    /// The keys' secrets and the key ring that seals them.
    pub secrets: secrets::service::Secrets,
    /// The keys' volumes (off without `--s3-endpoint`).
    pub volumes: Arc<volumes::service::Volumes>,
    /// Screenshots, mouse and keyboard of sandboxes with a desktop.
    pub computer: computer::service::ComputerService,
}

#[derive(Debug, Clone, Default)]
pub struct Config {
    pub domain: Option<String>,
    /// `/metrics` has one series per sandbox (`--metrics-per-sandbox`).
    pub metrics_per_sandbox: bool,
    /// `/mcp` (none: no route).
    pub mcp: Option<http::mcp::McpConfig>,
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
    tracing::info!("{} runtime: {}", selection.runtime, selection.reason);
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

/// Raises the soft open-files limit to the hard one: the API port alone may hold
/// `--max-connections` sockets, and each sandbox holds files too (systemd's default soft
/// limit, 1024, would make accepts and opens fail with EMFILE first).
fn raise_open_files_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we own; setrlimit reads it. No other memory.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// Runs the daemon until SIGINT or SIGTERM.
pub async fn run(dirs: Dirs, args: ServeArgs) -> Result<(), Error> {
    raise_open_files_limit();
    // runsc's orphans come to us and are reaped at once, not whenever the host's init gets
    // to them (`runsc delete` waits for them: runtime/src/subreaper.rs).
    let subreaper = match sandcell_runtime::subreaper::become_subreaper() {
        Ok(()) => Some(sandcell_runtime::subreaper::spawn_reaper()),
        Err(e) => {
            tracing::warn!("cannot become a child subreaper ({e}): runsc's orphans go to init");
            None
        }
    };
    let db = keys::open_db(&dirs.data).await?;
    if let Some(file) = keys::ensure_admin_key(&db, &dirs.data).await? {
        tracing::info!("created the admin API key in {}", file.display());
    }
    // Image and layer trees keep their setuid files (crates/image unpack.rs): no host user
    // but root may reach them.
    for dir in [dirs.images(), dirs.data.join("cache")] {
        if let Err(e) = sandcell_image::unpack::restrict_dir(&dir) {
            tracing::warn!("{e}: other host users may reach the template trees under it");
        }
    }
    // Before anything is served: a key file that does not load stops the start.
    let secrets = secrets::service::Secrets::open(db.clone(), &dirs.data)?;
    // Egress proxy passwords a daemon before this one recorded in the clear get sealed.
    networks::egress_proxy::reseal_all(&db, &secrets.key_ring()).await?;
    let s3 = args.s3.load()?;
    if s3.is_none() {
        tracing::info!("volumes are off (no --s3-endpoint)");
    }
    let volumes = Arc::new(
        volumes::service::Volumes::new(
            db.clone(),
            s3.map(|c| volumes::juicefs::Juicefs::new(c, &dirs.data)),
        )?
        .with_key_ring(secrets.key_ring()),
    );
    // Leases renewed, idle volumes unmounted and their metadata published (volumes/shared.rs).
    let idle_volumes = tokio::spawn(volumes.clone().idle_loop());
    // The egress proxies fill `network.rules` transforms from these secrets (one resolver
    // per process: the first daemon's; see crates/net/src/rules.rs).
    sandcell_runtime::net::rules::set_resolver(Arc::new(secrets::inject::SecretsResolver {
        db: db.clone(),
        secrets: secrets.clone(),
    }));
    egress_interception(&dirs, &args)?;
    let interrupted = templates::builds::mark_interrupted(&db).await?;
    if interrupted > 0 {
        tracing::warn!("{interrupted} template build(s) of the previous daemon were interrupted");
    }
    // One registry for the daemon's networks: its runtimes make them there, [`Networks`]
    // finds them there.
    let nets = sandcell_runtime::net::NetRegistry::new();
    let networks = Arc::new(
        networks::service::Networks::new(net_settings(&dirs, &args)?, nets.clone())
            .with_key_ring(secrets.key_ring()),
    );
    let runtime = open_runtime(&dirs, &args, nets).await?;
    let metrics = Arc::new(metrics::Metrics::default());
    let lifecycle = Arc::new(
        SandboxService::new(
            db.clone(),
            runtime,
            dirs.clone(),
            sandboxes::service::SandboxServiceConfig {
                max_vcpus: args.max_vcpus,
                max_memory_mib: args.max_memory_mib,
                kill_on_exit: args.kill_on_exit,
                max_lifetime_secs: args.max_lifetime,
                admission: args.admission(),
                disk_mib: args.disk_mib,
                warm: sandboxes::warm::WarmConfig {
                    count: args.warm,
                    memory_mib: args.warm_memory,
                    template: args.warm_template.clone(),
                },
            },
            metrics.clone(),
            networks.clone(),
        )
        .with_volumes(volumes.clone()),
    );
    let (adopted, lost) = lifecycle.reconcile().await?;
    if !adopted.is_empty() {
        tracing::info!(
            "took over {} running sandbox(es) of the previous daemon: {}",
            adopted.len(),
            adopted.join(", ")
        );
    }
    if !lost.is_empty() {
        tracing::warn!(
            "{} sandbox(es) did not survive the previous daemon and were marked error: {}",
            lost.len(),
            lost.join(", ")
        );
    }
    // After reconcile, which removes this daemon's unused networks, prepared ones too.
    networks.start_pool()?;
    // After reconcile too: its sweep removed the previous daemon's idle pooled sandboxes.
    let warm_pool = lifecycle.start_warm_pool();
    let reaper = tokio::spawn(lifecycle.clone().reap_forever());
    let sampler = tokio::spawn(lifecycle.clone().sample_forever());
    if args.template_cache_days > 0 {
        tokio::spawn(templates::builds::prune_caches_daily(
            dirs.data.clone(),
            args.template_cache_days,
        ));
    }
    // Bound before the App is made: /mcp calls the API at the address actually bound
    // (`--listen 127.0.0.1:0` picks a port).
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(Error::io(format!("listening on {}", args.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(Error::io("reading the listening address"))?;
    let app = Arc::new(App {
        db: db.clone(),
        lifecycle: lifecycle.clone(),
        config: Config {
            domain: args.domain.clone(),
            metrics_per_sandbox: args.metrics_per_sandbox,
            mcp: Some(http::mcp::McpConfig::new(addr, args.domain.as_deref())),
        },
        metrics,
        builds: templates::builds::Builds::new(
            args.insecure_registries.clone(),
            templates::builds::BuildLimits {
                build_timeout: Duration::from_secs(args.build_timeout.max(1)),
                step_timeout: Duration::from_secs(args.build_step_timeout.max(1)),
                start_timeout: Duration::from_secs(args.build_start_timeout.max(1)),
                disk_mib: args.build_disk_mib,
                host_reserve_mib: args.min_free_disk_mib,
            },
            templates::builds::host_dirs(&dirs),
        ),
        uploads: Default::default(),
        wakes: Default::default(),
        secrets,
        volumes: volumes.clone(),
        computer: computer::service::ComputerService::new(lifecycle.clone()),
    });
    let https = match &args.domain {
        Some(domain) => Some(https_listener(&dirs, &args, domain, addr).await?),
        None => None,
    };
    // Tests and scripts read this line to find the port (`--listen 127.0.0.1:0`).
    println!("sandcell serve: listening on http://{addr}");

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let limits = http::listener::Limits {
        max_connections: args.max_connections,
        header_timeout: Duration::from_secs(args.header_timeout_secs.max(1)),
        ..Default::default()
    };
    let (https_stop_tx, https_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let https_server = https.map(|(listener, tls)| {
        tokio::spawn(http::listener::serve_tls(
            listener,
            http::port_router(app.clone()),
            limits,
            tls,
            async move {
                let _ = https_stop_rx.await;
            },
        ))
    });
    let server = tokio::spawn(http::listener::serve(
        listener,
        router(app),
        limits,
        async move {
            let _ = stop_rx.await;
        },
    ));
    let signal = stop_signal().await;
    if args.kill_on_exit {
        tracing::info!("{signal}: killing the sandboxes and stopping");
    } else {
        tracing::info!("{signal}: stopping; the sandboxes keep running for the next start");
    }
    reaper.abort();
    sampler.abort();
    if let Some(subreaper) = subreaper {
        subreaper.abort();
    }
    // Idle pre-started VMMs are not sandboxes: they go with the daemon.
    lifecycle.runtime.stop_prestarted();
    // The warm pool's refill task is stopped by the shutdown's drain, which waits for a boot
    // under way and destroys it with the idle ones; aborted before, that boot's sandbox
    // was dropped mid-start and left running (it outlives its owner by design).
    lifecycle.shutdown().await;
    if let Some(pool) = warm_pool {
        pool.abort();
    }
    networks.shutdown().await;
    let _ = stop_tx.send(());
    let _ = https_stop_tx.send(());
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, server).await;
    if let Some(https) = https_server {
        let _ = tokio::time::timeout(SHUTDOWN_GRACE, https).await;
    }
    // After the listeners: no content request holds a volume any more.
    idle_volumes.abort();
    volumes.unmount_unused().await;
    db.close().await;
    Ok(())
}

/// The HTTPS port of `--domain` (crate::tls), bound on `--listen`'s address, and what it
/// serves with. Says where it is and, with the daemon's own CA, which certificate to trust.
async fn https_listener(
    dirs: &Dirs,
    args: &ServeArgs,
    domain: &str,
    api: SocketAddr,
) -> Result<(tokio::net::TcpListener, Arc<rustls::ServerConfig>), Error> {
    let tls = tls::setup(
        domain,
        args.tls_cert.as_deref(),
        args.tls_key.as_deref(),
        &tls::ca_dir(&dirs.data),
    )?;
    let at = SocketAddr::new(api.ip(), args.https_port);
    let listener = tokio::net::TcpListener::bind(at)
        .await
        .map_err(Error::io(format!("listening on {at} (--https-port)")))?;
    let at = listener
        .local_addr()
        .map_err(Error::io("reading the HTTPS address"))?;
    // Log lines, not stdout: "listening on" stays the one line scripts read there (and
    // some close the pipe after it). Tests read this one for the port (`--https-port 0`).
    tracing::info!(
        "port URLs on https://<port>-<sandboxID>.{domain}:{}",
        at.port()
    );
    if let Some(ca) = &tls.ca_cert {
        tracing::info!(
            "their certificate is from the daemon's CA: trust {}",
            ca.display()
        );
    }
    Ok((listener, tls.config))
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    #[test]
    fn admission_options_parse_with_their_defaults() {
        let cli = Cli::try_parse_from(["serve"]).unwrap();
        let a = cli.serve.admission();
        assert_eq!(a.key_defaults, keys::quota::QuotaDefaults::default());
        assert_eq!(a.host, sandboxes::admission::HostLimits::default());
        let cli = Cli::try_parse_from([
            "serve",
            "--default-max-sandboxes",
            "unlimited",
            "--default-max-memory-mib",
            "1024",
            "--memory-overcommit",
            "0.8",
        ])
        .unwrap();
        let a = cli.serve.admission();
        assert_eq!(a.key_defaults.sandboxes, None);
        assert_eq!(a.key_defaults.memory_mib, Some(1024));
        assert_eq!(a.host.memory_overcommit, 0.8);
        assert!(Cli::try_parse_from(["serve", "--default-max-builds", "default"]).is_err());
    }

    #[test]
    fn lifetimes_take_a_unit_and_a_sane_range() {
        assert_eq!(parse_lifetime("24h"), Ok(86_400));
        assert_eq!(parse_lifetime("90m"), Ok(5_400));
        assert_eq!(parse_lifetime("7d"), Ok(604_800));
        assert_eq!(parse_lifetime("5s"), Ok(5));
        for bad in [
            "",
            "24",
            "h",
            "-1h",
            "1.5h",
            "24 h",
            "0s",
            "366d",
            "99999999999999999999d",
        ] {
            assert!(parse_lifetime(bad).is_err(), "{bad:?}");
        }
    }
}
