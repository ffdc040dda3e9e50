//! E2B template tags, so that the stock SDKs' `Template.assign_tags`, `remove_tags` and
//! `get_tags` and creates from `name:tag` work:
//!
//! - `POST /templates/tags {target: "name[:tag]", tags}` → 201 `{tags, buildID}`: the tags
//!   now name the build `target` names (`default` when it has no tag);
//! - `DELETE /templates/tags {name, tags}` → 204;
//! - `GET /templates/{templateID}/tags` → 200 `[{tag, buildID, createdAt}]`.
//!
//! A tag names one build of a template built through the template API (templates/api.rs).
//! A build asks for `default`, its name's tag and `POST /v3/templates`'s `tags`; it takes
//! them when it is recorded ready (triggers of migration 7, the same statement), from
//! whichever build had them. Tags are listed to every key that sees the template, changed
//! by its owner or an admin key (templates/access.rs); another key's private template is
//! 404, as its build statuses are (templates/api.rs).
//!
//! A create (`POST /sandboxes`) from `name:tag` ([`untag_request`]) is open to every key
//! that sees the template, as creates from `name` are. Limitation: only a template's latest build is kept on disk
//! (`images/<name>/`, a rebuild replaces it), so a create works from a tag that names the
//! current build; a tag left on a replaced build is 404, saying so. `name:default` of an
//! installed image (not API-built) is that image.
//!
//! Not implemented: E2B's `.../tags/count`, `/exists`, `/groups` and `/{tag}/assignments`
//! (no SDK function calls them).

use crate::App;
use crate::http::error::{ApiResult, Error, ErrorBody};
use crate::http::extract::{ApiJson, Caller};
use crate::sandboxes::models::NewSandbox;
use crate::sandboxes::service::SandboxService;
use crate::templates::access;
use crate::templates::error::TemplateError;
use crate::util::{now_ms, rfc3339};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use sandcell_image::valid_name;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

/// The tag every successful build takes, and the one a name without a tag means.
pub const DEFAULT_TAG: &str = "default";
/// Most tags one request may name.
pub(crate) const MAX_TAGS: usize = 64;

/// E2B's `AssignTemplateTagsRequest`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct AssignTags {
    /// `name:tag` (or `name`, meaning `name:default`): the build to tag.
    pub target: String,
    pub tags: Vec<String>,
}

/// E2B's `AssignedTemplateTags`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AssignedTags {
    pub tags: Vec<String>,
    #[serde(rename = "buildID")]
    pub build_id: String,
}

/// E2B's `DeleteTemplateTagsRequest`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct RemoveTags {
    /// The template's name (no tag).
    pub name: String,
    pub tags: Vec<String>,
}

/// E2B's `TemplateTag`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TemplateTag {
    pub tag: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    /// When the tag was assigned (RFC 3339).
    #[serde(rename = "createdAt")]
    pub created_at: String,
}

/// A tag: as a template name, lowercase letters, digits, '-', '_' and '.', at most 128.
pub fn valid_tag(tag: &str) -> bool {
    valid_name(tag)
}

fn check_name(name: &str) -> Result<(), TemplateError> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(TemplateError::InvalidName(name.to_string()))
    }
}

/// `tags` checked (400 if empty, too many or malformed) and without repeats, in order.
pub fn check_tags(tags: &[String]) -> Result<Vec<String>, TemplateError> {
    if tags.is_empty() {
        return Err(TemplateError::NoTags);
    }
    if tags.len() > MAX_TAGS {
        return Err(TemplateError::TooManyTags);
    }
    let mut out: Vec<String> = Vec::with_capacity(tags.len());
    for tag in tags {
        if !valid_tag(tag) {
            return Err(TemplateError::InvalidTag(tag.clone()));
        }
        if !out.contains(tag) {
            out.push(tag.clone());
        }
    }
    Ok(out)
}

/// `name[:tag]` as (name, tag), the tag `default` when there is none; 400 if malformed.
pub fn split_target(target: &str) -> Result<(&str, &str), TemplateError> {
    let (name, tag) = target.split_once(':').unwrap_or((target, DEFAULT_TAG));
    check_name(name)?;
    if !valid_tag(tag) {
        return Err(TemplateError::InvalidTargetTag(target.to_string()));
    }
    Ok((name, tag))
}

/// Records the tags build `build_id` asks for; it takes them when it is ready (migration 7).
pub async fn request(db: &crate::store::Db, build_id: &str, tags: &[String]) -> Result<(), Error> {
    db.request_build_tags(build_id, tags).await
}

/// Drops the tags of a deleted template (templates/delete.rs).
pub async fn forget(db: &crate::store::Db, template: &str) -> Result<(), Error> {
    db.forget_template_tags(template).await
}

/// The id of the build `images/<name>/` holds, if the template was built through the API.
fn current_build(lifecycle: &SandboxService, name: &str) -> Option<String> {
    crate::templates::start::record(lifecycle, name).map(|r| r.build_id)
}

/// `name`'s current build, when the template was built through the API and the caller
/// may see it (`change`: change it; templates/access.rs); 404 otherwise (unknown, an
/// installed image, or another key's private template), 403 for a change of a template the
/// caller sees but does not own.
async fn api_template(
    app: &App,
    caller: &Caller,
    name: &str,
    change: bool,
) -> Result<String, TemplateError> {
    check_name(name)?;
    let not_found = || TemplateError::NotFound(name.to_string());
    let build = current_build(&app.lifecycle, name).ok_or_else(not_found)?;
    if change {
        access::check_changeable(&app.db, &caller.0, name).await?;
    } else {
        access::check_visible(&app.db, &caller.0, name).await?;
    }
    Ok(build)
}

fn no_such_tag(name: &str, tag: &str) -> TemplateError {
    TemplateError::NoSuchTag {
        name: name.to_string(),
        tag: tag.to_string(),
    }
}

/// Tags the build `target` names with `tags` (moving them from other builds).
#[utoipa::path(post, path = "/templates/tags", tag = "templates", security(("ApiKeyAuth" = [])),
    request_body = AssignTags,
    responses((status = 201, body = AssignedTags),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, description = "No such template of the caller's, or no such tag",
            body = ErrorBody),
        (status = 500, body = ErrorBody)))]
pub async fn assign_tags(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiJson(req): ApiJson<AssignTags>,
) -> ApiResult<(StatusCode, Json<AssignedTags>)> {
    let (name, tag) = split_target(&req.target)?;
    let tags = check_tags(&req.tags)?;
    api_template(&app, &caller, name, true).await?;
    let build_id = app
        .db
        .tagged_build(name, tag)
        .await?
        .ok_or_else(|| no_such_tag(name, tag))?;
    app.db.assign_tags(name, &tags, &build_id, now_ms()).await?;
    Ok((StatusCode::CREATED, Json(AssignedTags { tags, build_id })))
}

/// Removes tags from a template; 404 (and nothing removed) if one of them is not there.
#[utoipa::path(delete, path = "/templates/tags", tag = "templates", security(("ApiKeyAuth" = [])),
    request_body = RemoveTags,
    responses((status = 204, description = "Removed"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, description = "No such template of the caller's, or no such tag",
            body = ErrorBody),
        (status = 500, body = ErrorBody)))]
pub async fn remove_tags(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiJson(req): ApiJson<RemoveTags>,
) -> ApiResult<StatusCode> {
    check_name(&req.name)?;
    let tags = check_tags(&req.tags)?;
    api_template(&app, &caller, &req.name, true).await?;
    if let Some(tag) = app.db.remove_tags(&req.name, &tags).await? {
        return Err(no_such_tag(&req.name, &tag).into());
    }
    Ok(StatusCode::NO_CONTENT)
}

/// A template's tags, each with the build it names (a replaced build's too).
#[utoipa::path(get, path = "/templates/{templateID}/tags", tag = "templates",
    security(("ApiKeyAuth" = [])), params(("templateID" = String, Path)),
    responses((status = 200, body = Vec<TemplateTag>),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 500, body = ErrorBody)))]
pub async fn list_tags(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(template_id): Path<String>,
) -> ApiResult<Json<Vec<TemplateTag>>> {
    api_template(&app, &caller, &template_id, false).await?;
    let rows = app.db.template_tags(&template_id).await?;
    Ok(Json(
        rows.into_iter()
            .map(|(tag, build_id, assigned_at)| TemplateTag {
                tag,
                build_id,
                created_at: rfc3339(assigned_at),
            })
            .collect(),
    ))
}

/// The template a create's `name:tag` names, as `name`: 404 when the tag is unknown or names
/// a build a later one replaced (only the latest is on disk). A `templateID` without ':' is
/// returned as it is.
pub async fn untag(lifecycle: &SandboxService, template_id: &str) -> Result<String, TemplateError> {
    if !template_id.contains(':') {
        return Ok(template_id.to_string());
    }
    let (name, tag) = split_target(template_id)?;
    let Some(current) = current_build(lifecycle, name) else {
        // Not API-built: an installed image has one version, its `default`.
        if tag == DEFAULT_TAG && lifecycle.dirs().images().join(name).is_dir() {
            return Ok(name.to_string());
        }
        return Err(TemplateError::NotFound(template_id.to_string()));
    };
    let tagged = lifecycle
        .db
        .tagged_build(name, tag)
        .await?
        .ok_or_else(|| no_such_tag(name, tag))?;
    if tagged != current {
        return Err(TemplateError::TagOfReplacedBuild {
            target: template_id.to_string(),
            tagged,
            current,
        });
    }
    Ok(name.to_string())
}

/// `req` with its `templateID` untagged ([`untag`]), for `SandboxService::create`.
pub async fn untag_request(
    lifecycle: &SandboxService,
    mut req: NewSandbox,
) -> Result<NewSandbox, TemplateError> {
    req.template_id = untag(lifecycle, &req.template_id).await?;
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_and_tags_are_checked() {
        assert_eq!(split_target("web").unwrap(), ("web", "default"));
        assert_eq!(split_target("web:v1.2").unwrap(), ("web", "v1.2"));
        for bad in [
            "web:",
            "Web:v1",
            ":v1",
            "web:V1",
            "web:a:b",
            "web:has space",
        ] {
            let e = crate::http::error::ApiError::from(split_target(bad).unwrap_err());
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
        }
        let tags = |t: &[&str]| t.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            check_tags(&tags(&["b", "a", "b"])).unwrap(),
            tags(&["b", "a"])
        );
        assert!(check_tags(&[]).is_err());
        assert!(check_tags(&tags(&["ok", "Not OK"])).is_err());
        assert!(check_tags(&vec!["t".to_string(); MAX_TAGS + 1]).is_err());
    }

    #[test]
    fn the_routes_are_in_the_openapi_description() {
        let (_, api) = crate::routes();
        let tags = &api.paths.paths["/templates/tags"];
        assert!(tags.post.is_some() && tags.delete.is_some());
        assert!(
            api.paths.paths["/templates/{templateID}/tags"]
                .get
                .is_some()
        );
    }
}
