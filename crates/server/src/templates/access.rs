//! Who may see and change a template (migration 8), as in E2B: a template belongs to the key
//! whose build request first claimed its name; only that key or an admin key rebuilds,
//! tags, deletes or publishes it; it is private unless made public
//! (`PATCH /templates/{templateID} {"public": bool}`).
//!
//! A name without an owner row is a *system* template: an installed image (`base`,
//! `minimal`) or one an operator built on the host (`sandcell build`). Those are public and
//! only admin keys change them. An admin may hide one (an ownerless private row).
//!
//! Every route answers a template the caller may not see as 404, the same as an unknown
//! name, so that a key learns nothing about another key's private templates; one it sees
//! but may not change (public, or a system template) is 403. The one exception is
//! `POST /v3/templates` with a taken name: names are one namespace per daemon, so the
//! answer (409, "not available") tells that the name is taken, and nothing else.

use crate::App;
use crate::error::Error;
use crate::http::error::{ApiResult, ErrorBody};
use crate::http::extract::{ApiJson, Caller};
use crate::store::Db;
use crate::store::keys::KeyRow;
use crate::templates::error::TemplateError;
use crate::util::now_ms;
use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

/// A template's owner row: its owning key (none: a system template) and `public` flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateAccess {
    pub owner: Option<String>,
    pub public: bool,
}

impl TemplateAccess {
    /// A name without an owner row: public, changed by admin keys only.
    pub const SYSTEM: TemplateAccess = TemplateAccess {
        owner: None,
        public: true,
    };

    pub fn visible_to(&self, key: &KeyRow) -> bool {
        self.public || key.is_admin || self.owned_by(key)
    }

    pub fn changeable_by(&self, key: &KeyRow) -> bool {
        key.is_admin || self.owned_by(key)
    }

    fn owned_by(&self, key: &KeyRow) -> bool {
        self.owner.as_deref() == Some(key.id.as_str())
    }
}

/// `name`'s access (its owner row, or [`TemplateAccess::SYSTEM`]).
pub async fn access(db: &Db, name: &str) -> Result<TemplateAccess, Error> {
    Ok(db
        .template_access(name)
        .await?
        .unwrap_or(TemplateAccess::SYSTEM))
}

/// `Ok` when `key` may see template `name`; 404 (as unknown) otherwise.
pub async fn check_visible(db: &Db, key: &KeyRow, name: &str) -> Result<(), TemplateError> {
    if access(db, name).await?.visible_to(key) {
        Ok(())
    } else {
        Err(TemplateError::NotFound(name.to_string()))
    }
}

/// `Ok` when `key` may change template `name`: 404 when it may not even see it, 403 when
/// it sees it but does not own it.
pub async fn check_changeable(db: &Db, key: &KeyRow, name: &str) -> Result<(), TemplateError> {
    let access = access(db, name).await?;
    if access.changeable_by(key) {
        Ok(())
    } else if access.visible_to(key) {
        Err(TemplateError::NotOwner(name.to_string()))
    } else {
        Err(TemplateError::NotFound(name.to_string()))
    }
}

/// E2B's `TemplateUpdateRequest`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct TemplateUpdate {
    /// Whether every key may see and create from the template.
    #[serde(default)]
    pub public: Option<bool>,
}

/// E2B's `TemplateUpdateResponse` (the v2 route's answer).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TemplateUpdated {
    pub names: Vec<String>,
}

/// Sets the `public` flag of template `id` (`name` or `name:default`) for its owner or an
/// admin key.
async fn update(app: &App, key: &KeyRow, id: &str, req: TemplateUpdate) -> ApiResult<String> {
    let name = id.strip_suffix(":default").unwrap_or(id);
    if !crate::sandboxes::service::valid_template_name(name)
        || !app.lifecycle.dirs().images().join(name).is_dir()
    {
        return Err(TemplateError::NotFound(id.to_string()).into());
    }
    check_changeable(&app.db, key, name).await?;
    if let Some(public) = req.public {
        app.db
            .set_template_public(name, public, now_ms())
            .await
            .map_err(TemplateError::from)?;
    }
    Ok(name.to_string())
}

/// Makes a template public or private (E2B's `PATCH /templates/{templateID}`).
#[utoipa::path(patch, path = "/templates/{templateID}", tag = "templates",
    security(("ApiKeyAuth" = [])), params(("templateID" = String, Path)),
    request_body = TemplateUpdate,
    responses((status = 200, description = "Updated"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, description = "Another key's public template, or a system template",
            body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 500, body = ErrorBody)))]
pub async fn update_template(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<TemplateUpdate>,
) -> ApiResult<()> {
    update(&app, &caller.0, &id, req).await?;
    Ok(())
}

/// The same, answering the template's names (E2B's `PATCH /v2/templates/{templateID}`).
#[utoipa::path(patch, path = "/v2/templates/{templateID}", tag = "templates",
    security(("ApiKeyAuth" = [])), params(("templateID" = String, Path)),
    request_body = TemplateUpdate,
    responses((status = 200, body = TemplateUpdated),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 500, body = ErrorBody)))]
pub async fn update_template_v2(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<TemplateUpdate>,
) -> ApiResult<Json<TemplateUpdated>> {
    let name = update(&app, &caller.0, &id, req).await?;
    Ok(Json(TemplateUpdated { names: vec![name] }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str, is_admin: bool) -> KeyRow {
        KeyRow {
            id: id.into(),
            name: id.into(),
            key_prefix: String::new(),
            is_admin,
            quotas: Default::default(),
            created_at: 0,
            revoked_at: None,
        }
    }

    #[test]
    fn owners_admins_and_others() {
        let (a, b, admin) = (key("a", false), key("b", false), key("root", true));
        let private = TemplateAccess {
            owner: Some("a".into()),
            public: false,
        };
        assert!(private.visible_to(&a) && private.changeable_by(&a));
        assert!(!private.visible_to(&b) && !private.changeable_by(&b));
        assert!(private.visible_to(&admin) && private.changeable_by(&admin));
        let public = TemplateAccess {
            public: true,
            ..private
        };
        assert!(public.visible_to(&b) && !public.changeable_by(&b));
        let system = TemplateAccess::SYSTEM;
        assert!(system.visible_to(&a) && !system.changeable_by(&a));
        assert!(system.changeable_by(&admin));
        let hidden = TemplateAccess {
            owner: None,
            public: false,
        };
        assert!(!hidden.visible_to(&a) && hidden.visible_to(&admin));
    }

    #[test]
    fn the_routes_are_in_the_openapi_description() {
        let (_, api) = crate::routes();
        assert!(api.paths.paths["/templates/{templateID}"].patch.is_some());
        assert!(
            api.paths.paths["/v2/templates/{templateID}"]
                .patch
                .is_some()
        );
    }
}
