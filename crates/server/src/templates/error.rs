//! What resolving, tagging and starting templates fail with. Services return it; only
//! http/error.rs turns it into an HTTP answer.

use crate::error::Error;
use crate::snapshots::error::HandleError;
use crate::templates::tags::MAX_TAGS;

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("template name {0:?}: lowercase letters, digits, '-', '_' and '.', at most 128")]
    InvalidName(String),
    #[error("tags: at least one tag is required")]
    NoTags,
    #[error("tags: at most {MAX_TAGS} at once")]
    TooManyTags,
    #[error("tag {0:?}: lowercase letters, digits, '-', '_' and '.', at most 128")]
    InvalidTag(String),
    /// A `name:tag` whose tag is malformed.
    #[error("{0:?}: the tag after ':' must be lowercase letters, digits, '-', '_' and '.'")]
    InvalidTargetTag(String),
    /// Unknown, or not the caller's where that matters (the tag routes).
    #[error("template '{0}' not found")]
    NotFound(String),
    /// A template the caller sees (public, or a system template) but does not own.
    #[error(
        "template '{0}' belongs to another key (or is a system template): only its owner or \
         an admin key may change it; build one of your own under another name"
    )]
    NotOwner(String),
    /// `POST /v3/templates` of a name another key holds (or a system template's).
    #[error("template name '{0}' is not available: choose another name")]
    NameTaken(String),
    #[error("template '{name}' has no tag '{tag}'")]
    NoSuchTag { name: String, tag: String },
    /// `target` (`name:tag`) names a build a later one replaced; only the latest is on disk.
    #[error(
        "template '{target}' names build {tagged}, which a later build ({current}) replaced: \
         this server keeps only a template's latest build; build it again or tag the \
         current one"
    )]
    TagOfReplacedBuild {
        target: String,
        tagged: String,
        current: String,
    },
    /// The new sandbox ended before its template's start command could run.
    #[error("sandbox {sandbox}: gone before its start command ran")]
    GoneBeforeStart { sandbox: String },
    /// The template's start or ready command failed (the sandbox was killed).
    #[error("sandbox {sandbox} of template {template}: {problem}")]
    StartFailed {
        sandbox: String,
        template: String,
        problem: String,
    },
    /// `DELETE /templates/{id}` of an image installed on the host rather than built here.
    #[error(
        "template '{0}' is an installed image, not a built template: remove it from the \
         server's data dir (or with `sandcell image rm`)"
    )]
    InstalledImage(String),
    #[error("template '{0}' is being built: wait for that build to end")]
    BeingBuilt(String),
    /// Sandboxes or snapshots need the template: `users` names the caller's, `others`
    /// counts those of other keys (their ids are not the caller's to know).
    #[error("template '{name}' is in use by {}", in_use_by(users, *others))]
    InUse {
        name: String,
        users: Vec<String>,
        others: usize,
    },
    /// The image store refused to remove the template: a sandbox holds it (the store's
    /// error names them; it is logged, not answered, as the ids may be other keys').
    #[error("template '{0}' is in use by running sandboxes: kill them first")]
    ImageInUse(String),
    #[error("removing template '{id}': {problem}")]
    RemovalFailed { id: String, problem: String },
    /// Finding the snapshots that need a template about to be deleted.
    #[error("listing snapshots: {0}")]
    ListingSnapshots(#[source] sqlx::Error),
    /// The template's memory snapshot cannot be restored from.
    #[error(transparent)]
    Snapshot(#[from] HandleError),
    /// The database or the host failed.
    #[error(transparent)]
    Host(#[from] Error),
}

/// "sandbox sc-1 (running), snapshot snap-2 and 3 sandboxes or snapshots of other keys".
fn in_use_by(users: &[String], others: usize) -> String {
    let mut text = users.join(", ");
    if others > 0 {
        if !text.is_empty() {
            text.push_str(" and ");
        }
        text.push_str(&format!("{others} sandboxes or snapshots of other keys"));
    }
    text
}
