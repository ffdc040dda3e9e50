//! An E2B template build request (`POST /v2/templates/{templateID}/builds/{buildID}`) as
//! Dockerfile text for crates/image's template builder (template_builds.rs runs it).
//!
//! Step mapping (E2B's `TemplateStep.type` and `args`):
//! - `RUN [cmd, user?]`: `RUN ["/bin/sh","-c",cmd]` (exec form: no Dockerfile expansion, the
//!   shell sees the command as sent); with a user, between `USER user` and a `USER` back to
//!   the one before (the base's, or root when unknown).
//! - `COPY [src, dest, user?, mode?]` + `filesHash`: `COPY [--chown=user] [--chmod=mode]
//!   ["<hash>/<src>","<dest>"]`, the context being the caller's uploaded archives, each
//!   extracted under its hash (template_api.rs).
//! - `ENV [k1, v1, k2, v2, ...]`: `ENV k1="v1" k2="v2"` (`$VAR` in values expands as in a
//!   Dockerfile), `WORKDIR [dir]`, `USER [user]`: as written.
//!
//! E2B's default image (`e2bdev/base`) is the installed `base` template when there is one;
//! any other `fromImage` is pulled by the daemon (`fromImageRegistry` `registry` credentials as basic
//! auth; `sandcell serve --insecure-registry HOST` for plain HTTP).
//! `startCmd`/`readyCmd` are kept in `images/<name>/e2b.json`; sandboxes created from the
//! template run them (template_start.rs).

use sandcell_image::registry::Auth;
use sandcell_image::valid_name;
use serde::Deserialize;
use std::path::Path;

/// E2B's name of the FROM step in `reason.step`.
pub const BASE_STEP: &str = "base";

/// `POST /v2/templates/{templateID}/builds/{buildID}` (E2B's `TemplateBuildStartV2`).
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BuildStart {
    /// A registry reference (pulled by the daemon).
    #[serde(default)]
    pub from_image: Option<String>,
    /// A Sandcell template or image name.
    #[serde(default)]
    pub from_template: Option<String>,
    /// `{"type": "registry", "username", "password"}`: basic auth for `fromImage` (other
    /// types are refused with 400).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub from_image_registry: Option<serde_json::Value>,
    /// Rebuild every step (no layer cache).
    #[serde(default)]
    pub force: Option<bool>,
    #[serde(default)]
    pub steps: Vec<BuildStep>,
    /// Kept in the template's `e2b.json`; each sandbox created from it runs them
    /// (template_start.rs).
    #[serde(default)]
    pub start_cmd: Option<String>,
    #[serde(default)]
    pub ready_cmd: Option<String>,
}

/// One step (E2B's `TemplateStep`).
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BuildStep {
    /// RUN, COPY, ENV, WORKDIR or USER.
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub args: Vec<String>,
    /// COPY: the uploaded archive (`GET /templates/{templateID}/files/{hash}`).
    #[serde(default)]
    pub files_hash: Option<String>,
    #[serde(default)]
    pub force: Option<bool>,
    #[serde(default)]
    pub force_upload: Option<bool>,
}

/// A build request as a Dockerfile: its lines, and the E2B step name of each (for logs and
/// `reason.step`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub dockerfile: String,
    pub steps: Vec<String>,
    /// Any step (or the whole) asked for no cache.
    pub no_cache: bool,
}

/// What a request's base is: the USER a `RUN` with a user goes back to, and whether this
/// server has a `base` template to stand for E2B's default image.
#[derive(Debug, Clone, Default)]
pub struct BaseInfo {
    pub user: Option<String>,
    pub have_base: bool,
}

/// The SDKs' default image (`Template()` without a `from_*`, `from_base_image()`): E2B's
/// own base, which the installed `base` template stands for (it has the same user,
/// /home/user and tools) rather than a pull from Docker Hub.
pub const E2B_BASE_IMAGES: [&str; 3] =
    ["e2bdev/base", "e2bdev/base:latest", "docker.io/e2bdev/base"];
/// The template that stands for them.
pub const LOCAL_BASE: &str = "base";

fn bad(message: impl Into<String>) -> String {
    message.into()
}

/// Whether a hash from the SDK can name a directory: lowercase hex, 16 to 128 digits.
pub fn valid_files_hash(hash: &str) -> bool {
    (16..=128).contains(&hash.len()) && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn one_line(what: &str, value: &str) -> Result<(), String> {
    if value.contains(['\n', '\r', '\0']) {
        return Err(bad(format!(
            "{what} {value:?}: no line breaks or NULs allowed"
        )));
    }
    // A trailing escape character would join the next Dockerfile line.
    if value.ends_with('\\') {
        return Err(bad(format!(
            "{what} {value:?}: may not end with a backslash"
        )));
    }
    Ok(())
}

fn single_word(what: &str, value: &str) -> Result<(), String> {
    if value.is_empty() || value.contains(|c: char| c.is_whitespace() || c == '\0' || c == '\\') {
        return Err(bad(format!("{what} {value:?}: one word expected")));
    }
    Ok(())
}

fn json(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// `ENV`'s double-quoted value: `\` and `"` escaped, `$` left to expand.
fn env_quoted(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        if matches!(c, '\\' | '"') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// A COPY source from the SDK: relative, inside the context.
fn copy_source(src: &str) -> Result<String, String> {
    one_line("COPY source", src)?;
    let trimmed = src.trim_start_matches("./");
    if trimmed.is_empty() || trimmed.starts_with('/') || trimmed.split('/').any(|c| c == "..") {
        return Err(bad(format!(
            "COPY source {src:?}: a relative path inside the context expected"
        )));
    }
    Ok(trimmed.to_string())
}

/// `fromImageRegistry` as pull credentials: only `{"type": "registry", "username",
/// "password"}` (AWS and GCP registries are not supported).
pub fn registry_auth(req: &BuildStart) -> Result<Auth, String> {
    let Some(reg) = &req.from_image_registry else {
        return Ok(Auth::Anonymous);
    };
    let field = |name: &str| {
        reg.get(name)
            .and_then(|v| v.as_str())
            .filter(|v| !v.is_empty())
    };
    match (field("type"), field("username"), field("password")) {
        (Some("registry"), Some(username), Some(password)) if req.from_image.is_some() => {
            Ok(Auth::Basic {
                username: username.to_string(),
                password: password.to_string(),
            })
        }
        (Some("registry"), _, _) => Err(bad(
            "fromImageRegistry: fromImage, username and password are required",
        )),
        (other, _, _) => Err(bad(format!(
            "fromImageRegistry type {other:?} is not supported (only \"registry\" with a \
             username and password)"
        ))),
    }
}

/// The user a base template's sandboxes run as (its `config.json`), if known.
pub fn base_info(images: &Path, req: &BuildStart) -> BaseInfo {
    let user = req
        .from_template
        .as_deref()
        .filter(|t| valid_name(t))
        .and_then(|t| sandcell_image::store::read_config(&images.join(t)))
        .and_then(|c| c.user);
    BaseInfo {
        user,
        have_base: images.join(LOCAL_BASE).join("rootfs").is_dir(),
    }
}

/// The Dockerfile of an E2B build request. `base_info` gives what is known about the base
/// (its user); `Err`: what is wrong with the request (a 400).
pub fn plan(req: &BuildStart, base_info: &BaseInfo) -> Result<Plan, String> {
    if req.from_image_registry.is_some() {
        registry_auth(req)?;
    }
    let from = match (&req.from_template, &req.from_image) {
        (Some(t), _) => {
            if !valid_name(t) {
                return Err(bad(format!("fromTemplate {t:?}: not a template name")));
            }
            t.clone()
        }
        (None, Some(i)) if base_info.have_base && E2B_BASE_IMAGES.contains(&i.as_str()) => {
            LOCAL_BASE.to_string()
        }
        (None, Some(i)) => {
            single_word("fromImage", i)?;
            i.clone()
        }
        (None, None) => return Err(bad("fromImage or fromTemplate is required")),
    };
    let mut lines = vec![format!("FROM {from}")];
    let mut steps = vec![BASE_STEP.to_string()];
    let mut no_cache = req.force == Some(true);
    let mut user = base_info.user.clone();
    for (index, step) in req.steps.iter().enumerate() {
        // E2B numbers the steps from 1 (the base is step 0).
        let name = (index + 1).to_string();
        let at = |problem: String| format!("step {} ({}): {problem}", index + 1, step.kind);
        no_cache |= step.force == Some(true);
        let mut push = |line: String| {
            lines.push(line);
            steps.push(name.clone());
        };
        match step.kind.as_str() {
            "RUN" => {
                let (cmd, run_as) = match step.args.as_slice() {
                    [cmd] => (cmd, None),
                    [cmd, u] if u.is_empty() => (cmd, None),
                    [cmd, u] => (cmd, Some(u)),
                    _ => return Err(at("args: [command] or [command, user] expected".into())),
                };
                if cmd.contains('\0') {
                    return Err(at("the command has a NUL".into()));
                }
                let argv = serde_json::to_string(&["/bin/sh", "-c", cmd.as_str()])
                    .map_err(|e| at(e.to_string()))?;
                match run_as {
                    Some(u) => {
                        single_word("user", u).map_err(at)?;
                        push(format!("USER {u}"));
                        push(format!("RUN {argv}"));
                        push(format!("USER {}", user.as_deref().unwrap_or("root")));
                    }
                    None => push(format!("RUN {argv}")),
                }
            }
            "COPY" => {
                let (src, dest) = match step.args.as_slice() {
                    [src, dest, ..] if step.args.len() <= 4 => (src, dest),
                    _ => return Err(at("args: [src, dest, user?, mode?] expected".into())),
                };
                let hash = step
                    .files_hash
                    .as_deref()
                    .ok_or_else(|| at("filesHash is required".into()))?;
                if !valid_files_hash(hash) {
                    return Err(at(format!("filesHash {hash:?}: lowercase hex expected")));
                }
                let src = copy_source(src).map_err(at)?;
                one_line("COPY destination", dest).map_err(at)?;
                if dest.is_empty() {
                    return Err(at("an empty destination".into()));
                }
                let mut flags = String::new();
                if let Some(owner) = step.args.get(2).filter(|u| !u.is_empty()) {
                    single_word("user", owner).map_err(at)?;
                    flags.push_str(&format!("--chown={owner} "));
                }
                if let Some(mode) = step.args.get(3).filter(|m| !m.is_empty()) {
                    if mode.len() > 6 || !mode.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
                        return Err(at(format!("mode {mode:?}: octal expected")));
                    }
                    flags.push_str(&format!("--chmod={mode} "));
                }
                push(format!(
                    "COPY {flags}[{},{}]",
                    json(&format!("{hash}/{src}")),
                    json(dest)
                ));
            }
            "ENV" => {
                if step.args.is_empty() || step.args.len() % 2 != 0 {
                    return Err(at("args: [key, value, ...] pairs expected".into()));
                }
                let mut line = String::from("ENV");
                for pair in step.args.chunks(2) {
                    let (k, v) = (&pair[0], &pair[1]);
                    let good_key = k.bytes().enumerate().all(|(i, b)| {
                        b == b'_' || b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit())
                    });
                    if k.is_empty() || !good_key {
                        return Err(at(format!("{k:?}: not an environment variable name")));
                    }
                    if v.contains(['\n', '\r', '\0']) {
                        return Err(at(format!("{k}: no line breaks or NULs in values")));
                    }
                    line.push_str(&format!(" {k}={}", env_quoted(v)));
                }
                push(line);
            }
            "WORKDIR" => {
                let [dir] = step.args.as_slice() else {
                    return Err(at("args: [directory] expected".into()));
                };
                one_line("WORKDIR", dir).map_err(at)?;
                if dir.trim().is_empty() {
                    return Err(at("an empty directory".into()));
                }
                push(format!("WORKDIR {dir}"));
            }
            "USER" => {
                let [u] = step.args.as_slice() else {
                    return Err(at("args: [user] expected".into()));
                };
                single_word("user", u).map_err(at)?;
                user = Some(u.clone());
                push(format!("USER {u}"));
            }
            other => {
                return Err(bad(format!(
                    "step {}: type {other:?} is not supported (RUN, COPY, ENV, WORKDIR, USER)",
                    index + 1
                )));
            }
        }
    }
    let mut dockerfile = lines.join("\n");
    dockerfile.push('\n');
    Ok(Plan {
        dockerfile,
        steps,
        no_cache,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn step(kind: &str, args: &[&str]) -> BuildStep {
        BuildStep {
            kind: kind.into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            ..BuildStep::default()
        }
    }

    #[test]
    fn every_step_type_maps_to_dockerfile_lines() {
        let hash = "0123456789abcdef0123";
        let mut copy = step("COPY", &["./dir/a.txt", "/app/", "user", "0755"]);
        copy.files_hash = Some(hash.into());
        let req = BuildStart {
            from_template: Some("base".into()),
            steps: vec![
                step("RUN", &["echo \"$HOME\"\nls"]),
                step("RUN", &["id", "nobody"]),
                copy,
                step("ENV", &["A", "x y", "B", "a\"b\\c$A"]),
                step("WORKDIR", &["/app dir"]),
                step("USER", &["user"]),
            ],
            ..BuildStart::default()
        };
        let plan = plan(&req, &BaseInfo::default()).unwrap();
        let expected = [
            "FROM base",
            r#"RUN ["/bin/sh","-c","echo \"$HOME\"\nls"]"#,
            "USER nobody",
            r#"RUN ["/bin/sh","-c","id"]"#,
            "USER root",
            r#"COPY --chown=user --chmod=0755 ["0123456789abcdef0123/dir/a.txt","/app/"]"#,
            r#"ENV A="x y" B="a\"b\\c$A""#,
            "WORKDIR /app dir",
            "USER user",
        ];
        assert_eq!(plan.dockerfile, format!("{}\n", expected.join("\n")));
        assert_eq!(plan.steps, ["base", "1", "2", "2", "2", "3", "4", "5", "6"]);
        assert!(!plan.no_cache);
        // And the image crate's parser takes it.
        sandcell_image::dockerfile::parse(&plan.dockerfile).unwrap();
    }

    #[test]
    fn malformed_requests_are_refused() {
        let base = |steps: Vec<BuildStep>| BuildStart {
            from_template: Some("base".into()),
            steps,
            ..BuildStart::default()
        };
        let info = BaseInfo::default();
        assert!(plan(&BuildStart::default(), &info).is_err(), "no base");
        let mut copy = step("COPY", &["../etc/passwd", "/x"]);
        copy.files_hash = Some("0123456789abcdef".into());
        for bad in [
            vec![step("MAGIC", &["x"])],
            vec![step("RUN", &[])],
            vec![step("COPY", &["a", "/b"])],
            vec![copy],
            vec![step("ENV", &["A"])],
            vec![step("ENV", &["1A", "x"])],
            vec![step("WORKDIR", &["/a\nRUN evil"])],
            vec![step("USER", &["a b"])],
        ] {
            assert!(plan(&base(bad.clone()), &info).is_err(), "{bad:?}");
        }
        let mut forced = base(vec![step("RUN", &["true"])]);
        forced.steps[0].force = Some(true);
        assert!(plan(&forced, &info).unwrap().no_cache);
        let mut creds = BuildStart {
            from_image: Some("127.0.0.1:5000/app:1".into()),
            from_image_registry: Some(serde_json::json!(
                {"type": "registry", "username": "u", "password": "p"})),
            ..BuildStart::default()
        };
        assert!(plan(&creds, &info).is_ok());
        assert!(matches!(registry_auth(&creds), Ok(Auth::Basic { .. })));
        creds.from_image_registry = Some(serde_json::json!({"type": "aws"}));
        assert!(plan(&creds, &info).is_err());
        let default_image = BuildStart {
            from_image: Some("e2bdev/base".into()),
            ..BuildStart::default()
        };
        let have_base = BaseInfo {
            have_base: true,
            ..BaseInfo::default()
        };
        assert_eq!(
            plan(&default_image, &have_base).unwrap().dockerfile,
            "FROM base\n"
        );
        assert_eq!(
            plan(&default_image, &info).unwrap().dockerfile,
            "FROM e2bdev/base\n"
        );
        assert!(!valid_files_hash("../x"));
        assert!(valid_files_hash(&"a".repeat(64)));
    }
}
