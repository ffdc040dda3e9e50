//! Prometheus metrics at `GET /metrics` (text exposition format 0.0.4, written by hand: three
//! families do not need a metrics framework):
//!
//! - `sandcell_sandboxes{state}`: sandboxes in each state (gauge, read from the database
//!   at scrape time, so it is right across restarts);
//! - `sandcell_sandbox_create_seconds`: time from `POST /sandboxes` accepted to the sandbox
//!   running, successful creates (histogram);
//! - `sandcell_api_requests_total{route,method,status}`: every request, by its route
//!   pattern (`/sandboxes/{sandboxID}`), `envd-proxy` for sandbox traffic, `unmatched`
//!   for unknown paths (counter);
//! - `sandcell_template_creates_total{path}`: successful creates from a template with a
//!   memory snapshot (API-built, templates/memory_snapshot.rs, or installed with a start
//!   command, templates/installed_snapshot.rs) by how they were made: `restored` (its memory
//!   snapshot), `fallback` (the restore failed: booted), `booted` (no usable snapshot yet, or
//!   another size) (counter).
//! - `sandcell_installed_template_snapshots_total{outcome}`: memory snapshots of installed
//!   templates the daemon took (`taken`) or could not take (`failed`) (counter).
//! - `sandcell_auto_resumes_total{outcome}`: resumes of paused sandboxes started by a request
//!   for them (http/wake.rs), one per resume however many requests waited for it:
//!   `resumed` or `failed` (counter).
//!
//! - `sandcell_sandbox_cpu_used_cores`, `sandcell_sandbox_mem_used_bytes`,
//!   `sandcell_sandbox_mem_total_bytes`, `sandcell_sandbox_disk_used_bytes`,
//!   `sandcell_sandbox_disk_total_bytes`: the latest samples of sandboxes/metrics.rs, summed
//!   over the running sandboxes (gauges); with `serve --metrics-per-sandbox`, one series per
//!   sandbox instead, labelled `sandbox_id` (off by default: one series per sandbox is the
//!   cardinality scrapers choke on).
//!
//! `/metrics` needs no API key (scrapers rarely send one); it shows counts, and ids only with
//! `--metrics-per-sandbox`.

use crate::App;
use crate::sandboxes::metrics::Sample;
use crate::store::State as SbState;
use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Upper bounds of the create-latency buckets, in seconds (a cold gVisor start is ~0.3 s,
/// a microVM boot ~1 s).
const CREATE_BUCKETS: [f64; 11] = [0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0];

#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, String, u16), u64>>,
    create: Mutex<Histogram>,
    template_creates: Mutex<BTreeMap<&'static str, u64>>,
    /// Auto-resumes: [resumed, failed].
    auto_resumes: Mutex<[u64; 2]>,
    /// Installed templates' snapshots: [taken, failed].
    installed_snapshots: Mutex<[u64; 2]>,
}

/// How a create from an API-built template was made (`sandcell_template_creates_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateCreate {
    Restored,
    Fallback,
    Booted,
}

impl TemplateCreate {
    fn label(self) -> &'static str {
        match self {
            TemplateCreate::Restored => "restored",
            TemplateCreate::Fallback => "fallback",
            TemplateCreate::Booted => "booted",
        }
    }
}

#[derive(Default)]
struct Histogram {
    /// Per bucket of [`CREATE_BUCKETS`] (not cumulative; summed when rendered).
    counts: [u64; CREATE_BUCKETS.len()],
    count: u64,
    sum: f64,
}

use sandcell_proto::sync::lock;

impl Metrics {
    pub fn observe_create(&self, took: Duration) {
        let secs = took.as_secs_f64();
        let mut h = lock(&self.create);
        if let Some(i) = CREATE_BUCKETS.iter().position(|le| secs <= *le) {
            h.counts[i] += 1;
        }
        h.count += 1;
        h.sum += secs;
    }

    pub fn count_template_create(&self, path: TemplateCreate) {
        *lock(&self.template_creates)
            .entry(path.label())
            .or_default() += 1;
    }

    /// One auto-resume (http/wake.rs) that ended `resumed` or not.
    pub fn count_auto_resume(&self, resumed: bool) {
        lock(&self.auto_resumes)[usize::from(!resumed)] += 1;
    }

    /// One snapshot of an installed template (templates/installed_snapshot.rs), taken or not.
    pub fn count_installed_snapshot(&self, taken: bool) {
        lock(&self.installed_snapshots)[usize::from(!taken)] += 1;
    }

    pub fn count_request(&self, route: &str, method: &str, status: u16) {
        *lock(&self.requests)
            .entry((route.to_string(), method.to_string(), status))
            .or_default() += 1;
    }

    /// The exposition text, with `by_state` as the sandbox gauge.
    pub fn render(&self, by_state: &[(SbState, i64)]) -> String {
        let mut out = String::new();
        out.push_str("# HELP sandcell_sandboxes Sandboxes in each lifecycle state.\n");
        out.push_str("# TYPE sandcell_sandboxes gauge\n");
        for state in SbState::ALL {
            let n = by_state
                .iter()
                .find(|(s, _)| *s == state)
                .map_or(0, |(_, n)| *n);
            let _ = writeln!(
                out,
                "sandcell_sandboxes{{state=\"{}\"}} {n}",
                state.as_str()
            );
        }
        out.push_str(
            "# HELP sandcell_sandbox_create_seconds Time to create a sandbox until it runs.\n",
        );
        out.push_str("# TYPE sandcell_sandbox_create_seconds histogram\n");
        {
            let h = lock(&self.create);
            let mut cumulative = 0;
            for (le, n) in CREATE_BUCKETS.iter().zip(h.counts) {
                cumulative += n;
                let _ = writeln!(
                    out,
                    "sandcell_sandbox_create_seconds_bucket{{le=\"{le}\"}} {cumulative}"
                );
            }
            let _ = writeln!(
                out,
                "sandcell_sandbox_create_seconds_bucket{{le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(out, "sandcell_sandbox_create_seconds_sum {}", h.sum);
            let _ = writeln!(out, "sandcell_sandbox_create_seconds_count {}", h.count);
        }
        out.push_str(
            "# HELP sandcell_api_requests_total HTTP requests by route, method and status.\n",
        );
        out.push_str("# TYPE sandcell_api_requests_total counter\n");
        for ((route, method, status), n) in lock(&self.requests).iter() {
            let _ = writeln!(
                out,
                "sandcell_api_requests_total{{route=\"{}\",method=\"{}\",status=\"{status}\"}} {n}",
                escape(route),
                escape(method)
            );
        }
        out.push_str(
            "# HELP sandcell_template_creates_total Creates from API-built templates, by how \
             they were made.\n",
        );
        out.push_str("# TYPE sandcell_template_creates_total counter\n");
        let creates = lock(&self.template_creates);
        for path in [
            TemplateCreate::Restored,
            TemplateCreate::Fallback,
            TemplateCreate::Booted,
        ] {
            let n = creates.get(path.label()).copied().unwrap_or(0);
            let _ = writeln!(
                out,
                "sandcell_template_creates_total{{path=\"{}\"}} {n}",
                path.label()
            );
        }
        drop(creates);
        out.push_str(
            "# HELP sandcell_auto_resumes_total Resumes of paused sandboxes that a request for \
             them started, by outcome.\n",
        );
        out.push_str("# TYPE sandcell_auto_resumes_total counter\n");
        let [resumed, failed] = *lock(&self.auto_resumes);
        let _ = writeln!(
            out,
            "sandcell_auto_resumes_total{{outcome=\"resumed\"}} {resumed}"
        );
        let _ = writeln!(
            out,
            "sandcell_auto_resumes_total{{outcome=\"failed\"}} {failed}"
        );
        out.push_str(
            "# HELP sandcell_installed_template_snapshots_total Memory snapshots of installed \
             templates, by outcome.\n",
        );
        out.push_str("# TYPE sandcell_installed_template_snapshots_total counter\n");
        let [taken, failed] = *lock(&self.installed_snapshots);
        for (outcome, n) in [("taken", taken), ("failed", failed)] {
            let _ = writeln!(
                out,
                "sandcell_installed_template_snapshots_total{{outcome=\"{outcome}\"}} {n}"
            );
        }
        out
    }
}

/// The sampled sandbox gauges (see the module doc), appended to `out`.
pub fn render_samples(out: &mut String, latest: &[(String, Sample)], per_sandbox: bool) {
    type Field = fn(&Sample) -> f64;
    let families: [(&str, &str, Field); 5] = [
        ("cpu_used_cores", "CPU in use, in whole vCPUs.", |s| {
            f64::from(s.cpu_used_pct) / 100.0 * f64::from(s.cpu_count)
        }),
        (
            "mem_used_bytes",
            "Memory in use, page cache excluded.",
            |s| s.mem_used as f64,
        ),
        ("mem_total_bytes", "Memory the sandboxes were given.", |s| {
            s.mem_total as f64
        }),
        ("disk_used_bytes", "Disk the sandboxes' writes take.", |s| {
            s.disk_used as f64
        }),
        ("disk_total_bytes", "Disk the sandboxes were given.", |s| {
            s.disk_total as f64
        }),
    ];
    for (name, help, field) in families {
        let _ = writeln!(out, "# HELP sandcell_sandbox_{name} {help}");
        let _ = writeln!(out, "# TYPE sandcell_sandbox_{name} gauge");
        if per_sandbox {
            for (id, s) in latest {
                let _ = writeln!(
                    out,
                    "sandcell_sandbox_{name}{{sandbox_id=\"{}\"}} {}",
                    escape(id),
                    field(s)
                );
            }
        } else {
            let sum: f64 = latest.iter().map(|(_, s)| field(s)).sum();
            let _ = writeln!(out, "sandcell_sandbox_{name} {sum}");
        }
    }
}

/// Label values escape `\`, `"` and newlines.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Middleware: counts every request by route pattern (never the raw path: ids would make
/// one series per sandbox).
pub async fn track(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let method = req.method().as_str().to_string();
    let route = match req.extensions().get::<MatchedPath>() {
        Some(p) => p.as_str().to_string(),
        None if crate::http::proxy::target(req.headers(), app.config.domain.as_deref())
            .is_some() =>
        {
            "envd-proxy".to_string()
        }
        None => "unmatched".to_string(),
    };
    let resp = next.run(req).await;
    app.metrics
        .count_request(&route, &method, resp.status().as_u16());
    resp
}

/// `GET /metrics`.
pub async fn metrics(State(app): State<Arc<App>>) -> Response {
    match app.db.count_by_state().await {
        Ok(by_state) => {
            let mut text = app.metrics.render(&by_state);
            let latest = app.lifecycle.samples.latest_all();
            render_samples(&mut text, &latest, app.config.metrics_per_sandbox);
            app.lifecycle.render_warm(&mut text);
            ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
        }
        Err(e) => crate::http::error::ApiError::from(e).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_every_family_and_cumulative_buckets() {
        let m = Metrics::default();
        m.observe_create(Duration::from_millis(300));
        m.observe_create(Duration::from_secs(2));
        m.count_request("/sandboxes", "POST", 201);
        m.count_request("/sandboxes", "POST", 201);
        m.count_template_create(TemplateCreate::Restored);
        m.count_template_create(TemplateCreate::Restored);
        m.count_template_create(TemplateCreate::Fallback);
        m.count_auto_resume(true);
        m.count_installed_snapshot(false);
        let text = m.render(&[(SbState::Running, 3)]);
        assert!(text.contains("sandcell_auto_resumes_total{outcome=\"resumed\"} 1\n"));
        assert!(text.contains("sandcell_auto_resumes_total{outcome=\"failed\"} 0\n"));
        assert!(
            text.contains("sandcell_installed_template_snapshots_total{outcome=\"taken\"} 0\n")
        );
        assert!(
            text.contains("sandcell_installed_template_snapshots_total{outcome=\"failed\"} 1\n")
        );
        assert!(text.contains("sandcell_template_creates_total{path=\"restored\"} 2\n"));
        assert!(text.contains("sandcell_template_creates_total{path=\"fallback\"} 1\n"));
        assert!(text.contains("sandcell_template_creates_total{path=\"booted\"} 0\n"));
        assert!(
            text.contains("sandcell_sandboxes{state=\"running\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("sandcell_sandboxes{state=\"paused\"} 0\n"));
        assert!(text.contains("sandcell_sandbox_create_seconds_bucket{le=\"0.5\"} 1\n"));
        assert!(text.contains("sandcell_sandbox_create_seconds_bucket{le=\"2.5\"} 2\n"));
        assert!(text.contains("sandcell_sandbox_create_seconds_bucket{le=\"+Inf\"} 2\n"));
        assert!(text.contains("sandcell_sandbox_create_seconds_count 2\n"));
        assert!(text.contains(
            "sandcell_api_requests_total{route=\"/sandboxes\",method=\"POST\",status=\"201\"} 2\n"
        ));
    }

    #[test]
    fn sampled_gauges_are_sums_unless_per_sandbox() {
        let sample = |cpu_pct, mem| Sample {
            at_ms: 0,
            cpu_count: 2,
            cpu_used_pct: cpu_pct,
            mem_used: mem,
            mem_total: 512 << 20,
            mem_cache: 0,
            disk_used: 10,
            disk_total: 100,
        };
        let latest = vec![
            ("sbx-a".to_string(), sample(50.0, 100)),
            ("sbx-b".to_string(), sample(25.0, 50)),
        ];
        let mut sums = String::new();
        render_samples(&mut sums, &latest, false);
        assert!(
            sums.contains("sandcell_sandbox_cpu_used_cores 1.5\n"),
            "{sums}"
        );
        assert!(sums.contains("sandcell_sandbox_mem_used_bytes 150\n"));
        assert!(sums.contains("sandcell_sandbox_disk_total_bytes 200\n"));
        assert!(!sums.contains("sbx-a"), "no ids unless asked for");
        let mut each = String::new();
        render_samples(&mut each, &latest, true);
        assert!(each.contains("sandcell_sandbox_mem_used_bytes{sandbox_id=\"sbx-b\"} 50\n"));
    }
}
