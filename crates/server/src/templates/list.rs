//! `GET /templates`: the installed images and the templates built on this daemon that the
//! caller may see (its own, public ones and system templates: templates/access.rs).

use crate::App;
use crate::http::error::{ApiError, ApiResult, ErrorBody};
use crate::http::extract::Caller;
use crate::sandboxes::models::Template;
use crate::sandboxes::service::{disk_mib, valid_template_name};
use crate::templates::access::TemplateAccess;
use crate::util::rfc3339;
use axum::Json;
use axum::extract::State;
use std::sync::Arc;

/// The images installed under `<data-dir>/images/` (`make images install`) and the
/// templates built there (from a Dockerfile, or through the template API: their
/// `cpuCount`, `memoryMB` and `buildID` are those of their last build).
#[utoipa::path(get, path = "/templates", tag = "templates", security(("ApiKeyAuth" = [])),
    responses((status = 200, body = Vec<Template>), (status = 401, body = ErrorBody)))]
pub async fn list_templates(
    State(app): State<Arc<App>>,
    caller: Caller,
) -> ApiResult<Json<Vec<Template>>> {
    let accesses: std::collections::HashMap<String, TemplateAccess> =
        app.db.template_accesses().await?.into_iter().collect();
    let dir = app.lifecycle.dirs().images();
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Json(Vec::new())),
        Err(e) => {
            return Err(ApiError::internal(format!(
                "reading {}: {e}",
                dir.display()
            )));
        }
    };
    let mut templates = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !valid_template_name(&name) {
            continue;
        }
        let access = accesses.get(&name).unwrap_or(&TemplateAccess::SYSTEM);
        if !access.visible_to(&caller.0) {
            continue;
        }
        let Ok(image) = sandcell_runtime::Image::resolve(&dir, &name) else {
            continue;
        };
        let modified = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as i64);
        // A built template's own size, build id and time (templates/start.rs, template.json).
        let e2b = crate::templates::start::record(&app.lifecycle, &name);
        let built = sandcell_image::template::read_record(&entry.path()).map_or(modified, |r| {
            i64::try_from(r.created.saturating_mul(1000)).unwrap_or(0)
        });
        templates.push(Template {
            template_id: name.clone(),
            build_id: e2b.as_ref().map_or(name.clone(), |r| r.build_id.clone()),
            cpu_count: e2b
                .as_ref()
                .and_then(|r| r.cpu_count)
                .unwrap_or(u32::from(crate::sandboxes::service::DEFAULT_VCPUS)),
            memory_mb: e2b
                .as_ref()
                .and_then(|r| r.memory_mb)
                .unwrap_or(crate::sandboxes::service::DEFAULT_MEMORY_MIB),
            disk_size_mb: disk_mib(&image),
            public: access.public,
            aliases: vec![name.clone()],
            names: vec![name],
            created_at: rfc3339(built),
            updated_at: rfc3339(modified),
            created_by: None,
            last_spawned_at: None,
            spawn_count: 0,
            build_count: 1,
            envd_version: crate::sandboxes::service::FALLBACK_ENVD_VERSION.into(),
            build_status: "ready".into(),
        });
    }
    templates.sort_by(|a, b| a.template_id.cmp(&b.template_id));
    Ok(Json(templates))
}
