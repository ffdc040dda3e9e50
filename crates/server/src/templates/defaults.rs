//! Defaults a template made from an OCI image carries (`images/<name>/config.json`, written
//! by `sandcell image pull|import`): its `Env` under the create request's `envVars`, its
//! `User` and `WorkingDir` as the agent's default user and working directory.

use sandcell_proto::image::{IMAGE_CONFIG_FILE, ImageDefaults};
use sandcell_runtime::Dirs;
use std::collections::BTreeMap;

/// Largest `config.json` read (it is written by us, but lives on disk).
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The template's defaults, if it has a readable `config.json` (built-in images have none).
pub fn load(dirs: &Dirs, template: &str) -> Option<ImageDefaults> {
    use std::io::Read;
    let path = dirs.images().join(template).join(IMAGE_CONFIG_FILE);
    let mut bytes = Vec::new();
    std::fs::File::open(&path)
        .ok()?
        .take(MAX_CONFIG_BYTES)
        .read_to_end(&mut bytes)
        .ok()?;
    match serde_json::from_slice(&bytes) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("sandcell serve: ignoring {}: {e}", path.display());
            None
        }
    }
}

/// The image's env vars with the request's over them.
pub fn merge_env(
    defaults: Option<&ImageDefaults>,
    request: BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = defaults
        .map(|d| {
            d.env_pairs()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .unwrap_or_default();
    env.extend(request);
    env
}

/// Sets `defaultUser` / `defaultWorkdir` of an `/init` body from the image: an OCI image
/// without `User` runs as root, as under Docker (E2B's `user` stays for built-in images).
pub fn apply_to_init(body: &mut serde_json::Value, defaults: Option<&ImageDefaults>) {
    let Some(d) = defaults else { return };
    body["defaultUser"] = serde_json::Value::String(d.user_name().unwrap_or("root").to_string());
    if let Some(dir) = d.working_dir.as_deref().filter(|w| w.starts_with('/')) {
        body["defaultWorkdir"] = serde_json::Value::String(dir.to_string());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn request_env_wins_and_user_workdir_apply() {
        let d = ImageDefaults {
            env: vec!["PATH=/usr/bin".into(), "A=image".into()],
            user: Some("nginx:nginx".into()),
            working_dir: Some("/srv".into()),
            ..ImageDefaults::default()
        };
        let env = merge_env(
            Some(&d),
            BTreeMap::from([("A".to_string(), "request".to_string())]),
        );
        assert_eq!(env["A"], "request");
        assert_eq!(env["PATH"], "/usr/bin");
        let mut body = serde_json::json!({"defaultUser": "user"});
        apply_to_init(&mut body, Some(&d));
        assert_eq!(body["defaultUser"], "nginx");
        assert_eq!(body["defaultWorkdir"], "/srv");
        let mut body = serde_json::json!({"defaultUser": "user"});
        apply_to_init(&mut body, None);
        assert_eq!(body, serde_json::json!({"defaultUser": "user"}));
    }
}
