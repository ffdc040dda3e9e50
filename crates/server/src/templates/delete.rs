//! `DELETE /templates/{templateID}`: a built template (or a named snapshot, which is a
//! template of its key), refused while something uses it.

use crate::App;
use crate::http::error::{ApiResult, ErrorBody};
use crate::http::extract::Caller;
use crate::snapshots::api::delete_snapshot_named;
use crate::store::State as DbState;
use crate::templates::error::TemplateError;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use std::sync::Arc;

/// Deletes a template: a named snapshot (what the SDKs' `delete_snapshot` calls), or a
/// template built from a Dockerfile or through the template API (its image directory has a
/// `template.json`). A built template is refused (409) while it is being built or while a
/// sandbox (running or paused) or a snapshot still needs it. Installed images (`base`,
/// `minimal`: no `template.json`) cannot be deleted through the API (400). The build's
/// uploaded COPY archives (`cache/e2b-files/`) and cached layers are kept: the next builds
/// reuse them.
#[utoipa::path(delete, path = "/templates/{templateID}", tag = "templates",
    security(("ApiKeyAuth" = [])), params(("templateID" = String, Path)),
    responses((status = 204, description = "Deleted"),
        (status = 400, description = "An installed image", body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "A sandbox, snapshot or build uses it", body = ErrorBody),
        (status = 500, body = ErrorBody)))]
pub async fn delete_template(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    if delete_snapshot_named(&app, &caller, &id).await? {
        return Ok(StatusCode::NO_CONTENT);
    }
    delete_built(&app, &caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Deletes built template `id` (`name` or `name:default`) with its memory snapshot and
/// tags, unless it is an installed image or something uses it.
async fn delete_built(app: &App, caller: &Caller, id: &str) -> Result<(), TemplateError> {
    let name = id.strip_suffix(":default").unwrap_or(id).to_string();
    let dir = app.lifecycle.dirs().images().join(&name);
    if !crate::sandboxes::service::valid_template_name(&name) || !dir.is_dir() {
        return Err(TemplateError::NotFound(id.to_string()));
    }
    // Another key's private template is not found; a public one not the caller's is 403.
    crate::templates::access::check_changeable(&app.db, &caller.0, &name)
        .await
        .map_err(|e| match e {
            TemplateError::NotFound(_) => TemplateError::NotFound(id.to_string()),
            e => e,
        })?;
    if sandcell_image::template::read_record(&dir).is_none() {
        return Err(TemplateError::InstalledImage(name));
    }
    if app.builds.active_for(&name).is_some() {
        return Err(TemplateError::BeingBuilt(name));
    }
    let users = template_users(app, &name).await?;
    if !users.is_empty() {
        // The caller's own users by id (an admin key sees all); others only counted.
        let (users, others): (Vec<_>, Vec<_>) = users
            .into_iter()
            .partition(|(key, _)| caller.0.is_admin || *key == caller.0.id);
        return Err(TemplateError::InUse {
            name,
            users: users.into_iter().map(|(_, u)| u).collect(),
            others: others.len(),
        });
    }
    let snapshot =
        crate::templates::start::record(&app.lifecycle, &name).and_then(|r| r.snapshot_id);
    let data = app.lifecycle.dirs().data.clone();
    let removal_failed = |problem: String| TemplateError::RemovalFailed {
        id: id.to_string(),
        problem,
    };
    let removed = tokio::task::spawn_blocking(move || sandcell_image::store::remove(&data, &name))
        .await
        .map_err(|e| removal_failed(e.to_string()))?;
    match removed {
        Ok(()) => {
            if let Some(snapshot) = snapshot {
                crate::templates::memory_snapshot::retire(&app.lifecycle, &snapshot).await;
            }
            let name = id.strip_suffix(":default").unwrap_or(id);
            crate::templates::tags::forget(&app.db, name).await?;
            // The name is free again (the next key to build it owns it).
            app.db.release_template(name, None).await?;
            Ok(())
        }
        Err(sandcell_image::Error::NotFound(_)) => Err(TemplateError::NotFound(id.to_string())),
        Err(e @ sandcell_image::Error::InUse { .. }) => {
            tracing::info!("deleting template {id} refused: {e}");
            Err(TemplateError::ImageInUse(id.to_string()))
        }
        Err(e) => Err(removal_failed(e.to_string())),
    }
}

/// The live sandboxes and the snapshots (of every key) that need the image `name`: those
/// created from it, and through the snapshots taken of them, those restored from those
/// snapshots (a restore needs the image its snapshot was taken over). Each with its key.
async fn template_users(app: &App, name: &str) -> Result<Vec<(String, String)>, TemplateError> {
    // A template's own snapshot is part of it, not a user (templates/memory_snapshot.rs).
    let snapshots = app
        .db
        .snapshot_sources()
        .await
        .map_err(TemplateError::ListingSnapshots)?;
    // The template ids that lead back to `name`: itself and its snapshots' ids and names.
    let mut ids = std::collections::BTreeSet::from([name.to_string()]);
    let mut users = Vec::new();
    loop {
        let before = ids.len();
        let reached: Vec<String> = snapshots
            .iter()
            .filter(|s| ids.contains(&s.2))
            .flat_map(|(snap, snap_name, _, _)| std::iter::once(snap).chain(snap_name))
            .cloned()
            .collect();
        ids.extend(reached);
        if ids.len() == before {
            break;
        }
    }
    for (snap, _, template, key) in &snapshots {
        if ids.contains(template) {
            users.push((key.clone(), format!("snapshot {snap}")));
        }
    }
    let live = app.db.sandboxes_in(None, &DbState::LIVE).await?;
    for row in live.iter().filter(|r| ids.contains(&r.template_id)) {
        users.push((
            row.key_id.clone(),
            format!("sandbox {} ({})", row.id, row.state.as_str()),
        ));
    }
    Ok(users)
}
