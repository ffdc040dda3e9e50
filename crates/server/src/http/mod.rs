//! The HTTP side of the daemon: the router and its OpenAPI description, the extractors
//! ([`extract`]), the envd proxy ([`proxy`]), metrics ([`metrics`]) and the errors as E2B
//! answers them ([`error`]), a log span per request ([`trace`]), and MCP at `/mcp`
//! ([`mcp`]); auto-resume of paused sandboxes at the proxy ([`wake`]).

pub mod error;
pub mod extract;
pub mod listener;
pub mod mcp;
pub mod metrics;
pub mod proxy;
pub mod signed_url;
pub mod trace;
pub mod wake;

use crate::App;
use crate::http::error::ApiError;
use crate::sandboxes::models::Health;
use crate::{computer, networks, sandboxes, secrets, snapshots, templates, volumes};
use axum::extract::DefaultBodyLimit;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header;
use axum::routing::get;
use axum::{Json, Router};
use std::sync::Arc;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

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
        .routes(routes!(health))
        .routes(routes!(sandboxes::api::create_v1, sandboxes::api::list_v1))
        .routes(routes!(sandboxes::api::create_v2, sandboxes::api::list_v2))
        .routes(routes!(
            sandboxes::api::get_sandbox,
            sandboxes::api::kill_sandbox
        ))
        .routes(routes!(sandboxes::api::set_timeout))
        .routes(routes!(sandboxes::api::refresh))
        .routes(routes!(sandboxes::api::connect_v2))
        .routes(routes!(sandboxes::api::connect_v1))
        .routes(routes!(templates::list::list_templates))
        .routes(routes!(templates::api::request_build))
        .routes(routes!(
            templates::api::file_upload_link,
            templates::api::upload_files
        ))
        .routes(routes!(templates::api::start_build))
        .routes(routes!(templates::api::build_status))
        .routes(routes!(templates::api::build_logs))
        .routes(routes!(templates::api::alias))
        .routes(routes!(
            templates::tags::assign_tags,
            templates::tags::remove_tags
        ))
        .routes(routes!(templates::tags::list_tags))
        .routes(routes!(snapshots::api::pause_sandbox))
        .routes(routes!(snapshots::api::resume_sandbox))
        .routes(routes!(snapshots::api::fork_sandbox))
        .routes(routes!(snapshots::api::create_snapshot))
        .routes(routes!(snapshots::api::list_snapshots))
        .routes(routes!(snapshots::api::delete_snapshot))
        .routes(routes!(
            templates::delete::delete_template,
            templates::access::update_template
        ))
        .routes(routes!(templates::access::update_template_v2))
        .routes(routes!(sandboxes::metering::usage))
        .routes(routes!(sandboxes::metrics_api::sandbox_metrics))
        .routes(routes!(sandboxes::logs::sandbox_logs))
        .routes(routes!(sandboxes::metrics_api::sandboxes_metrics))
        .routes(routes!(networks::api::set_network))
        .routes(routes!(networks::api::network_log))
        .routes(routes!(
            networks::api::create_network,
            networks::api::list_networks
        ))
        .routes(routes!(networks::api::delete_network))
        .routes(routes!(networks::api::attach, networks::api::detach))
        .routes(routes!(
            secrets::api::list_secrets,
            secrets::api::create_secret
        ))
        .routes(routes!(
            secrets::api::get_secret,
            secrets::api::update_secret,
            secrets::api::delete_secret
        ))
        .routes(routes!(
            volumes::api::list_volumes,
            volumes::api::create_volume
        ))
        .routes(routes!(
            volumes::api::get_volume,
            volumes::api::delete_volume
        ))
        .routes(routes!(computer::api::screenshot))
        .routes(routes!(computer::api::screen))
        .routes(routes!(computer::api::cursor))
        .routes(routes!(computer::api::mouse_move))
        .routes(routes!(computer::api::mouse_click))
        .routes(routes!(computer::api::mouse_drag))
        .routes(routes!(computer::api::mouse_scroll))
        .routes(routes!(computer::api::keyboard_type))
        .routes(routes!(computer::api::keyboard_press))
        .routes(routes!(computer::api::windows))
        .routes(routes!(computer::api::focus_window))
        .routes(routes!(computer::api::close_window))
        .routes(routes!(computer::api::launch))
        .split_for_parts()
}

/// The whole service: API routes, `/openapi.json`, and the envd proxy in front of all.
pub fn router(app: Arc<App>) -> Router {
    let (routes, openapi) = routes();
    let spec = openapi.to_json().unwrap_or_else(|_| "{}".into());
    let routes = routes.merge(volumes::content_api::routes());
    let routes = match mcp::routes(&app) {
        Some(mcp) => routes.merge(mcp),
        None => routes,
    };
    let routes = routes
        .route(
            "/openapi.json",
            get(move || {
                let spec = spec.clone();
                async move { ([(header::CONTENT_TYPE, "application/json")], spec) }
            }),
        )
        .route("/metrics", get(metrics::metrics))
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(extract::MAX_JSON_BODY));
    with_proxy(routes, app)
}

/// The HTTPS port (crate::tls): sandbox traffic only, through the same proxy as the API
/// port's; the API itself stays on the plain port (anything else is 404 here).
pub fn port_router(app: Arc<App>) -> Router {
    with_proxy(Router::new().fallback(no_route), app)
}

/// `routes` behind the envd proxy and the layers every request goes through.
fn with_proxy(routes: Router<Arc<App>>, app: Arc<App>) -> Router {
    routes
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
        // Every answer gets the request's id; a 5xx is logged with it in full (error.rs).
        .layer(axum::middleware::from_fn(error::request_id))
        // Outermost (a layer added later wraps those before it): the request's id is made
        // here, and every log line of the request, metrics and proxy included, is in its span.
        .layer(axum::middleware::from_fn(trace::span))
        .with_state(app)
}

#[utoipa::path(get, path = "/health", tag = "health",
    responses((status = 200, description = "The daemon is up", body = Health)))]
pub async fn health(State(app): State<Arc<App>>) -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        runtime: app.lifecycle.runtime_name().into(),
        version: env!("CARGO_PKG_VERSION").into(),
    })
}

/// A known route with another method: 405 in E2B's error shape.
pub async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("method {method} is not allowed on {}", uri.path()),
    )
}

/// Unknown routes: E2B's 404 shape.
pub async fn no_route(uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!("no route {}", uri.path()))
}
