//! What an image imported from OCI (`sandcell image pull|import`) carries beside its root:
//! `<data-dir>/images/<name>/config.json`, the defaults the daemon applies to sandboxes made
//! from it (the OCI image config's `Env`, `WorkingDir`, `User`, `Entrypoint`, `Cmd`) and
//! where the image came from.

use serde::{Deserialize, Serialize};

/// The file name of [`ImageDefaults`] in an image directory.
pub const IMAGE_CONFIG_FILE: &str = "config.json";

/// `<data-dir>/images/<name>/config.json`. Every field is optional so that hand-made images
/// may carry only some.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageDefaults {
    /// `KEY=VALUE` strings, in the image config's order (later ones win on merge).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// As the image says it: `name`, `uid`, `name:group` or `uid:gid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entrypoint: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cmd: Vec<String>,
    /// Where the image came from: a registry reference or an imported path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The digest of the image manifest it was made from (`sha256:...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_digest: Option<String>,
}

impl ImageDefaults {
    /// `env` as pairs; entries without `=` or with an empty name are left out.
    pub fn env_pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.env
            .iter()
            .filter_map(|kv| kv.split_once('='))
            .filter(|(k, _)| !k.is_empty() && !k.contains('\0'))
    }

    /// The user's name part (`www-data` of `www-data:www-data`), for the agent's default
    /// user; `None` when there is none.
    pub fn user_name(&self) -> Option<&str> {
        let user = self.user.as_deref()?.split(':').next()?;
        (!user.is_empty()).then_some(user)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_splits() {
        let d: ImageDefaults = serde_json::from_str(
            r#"{"env":["PATH=/usr/bin","A=b=c","junk"],"user":"nginx:nginx","workingDir":"/srv"}"#,
        )
        .unwrap();
        let env: Vec<_> = d.env_pairs().collect();
        assert_eq!(env, [("PATH", "/usr/bin"), ("A", "b=c")]);
        assert_eq!(d.user_name(), Some("nginx"));
        assert_eq!(d.working_dir.as_deref(), Some("/srv"));
        assert_eq!(ImageDefaults::default().user_name(), None);
    }
}
