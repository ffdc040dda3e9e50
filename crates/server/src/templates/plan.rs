//! An E2B template build request (`POST /v2/templates/{templateID}/builds/{buildID}`) as
//! Dockerfile text for crates/image's template builder (templates/builds.rs runs it).
//!
//! Step mapping (E2B's `TemplateStep.type` and `args`):
//! - `RUN [cmd, user?]`: `RUN ["/bin/sh","-c",cmd]` (exec form: no Dockerfile expansion, the
//!   shell sees the command as sent); with a user, between `USER user` and a `USER` back to
//!   the one before (the base's, or root when unknown).
//! - `COPY [src, dest, user?, mode?]` + `filesHash`: `COPY [--chown=user] [--chmod=mode]
//!   ["<hash>/<src>","<dest>"]`, the context being the caller's uploaded archives, each
//!   extracted under its hash (templates/api.rs).
//! - `ENV [k1, v1, k2, v2, ...]`: `ENV k1="v1" k2="v2"` (`$VAR` in values expands as in a
//!   Dockerfile), `WORKDIR [dir]`, `USER [user]`: as written.
//!
//! Steps run as E2B's default user, `user`, in /home/user (E2B: "unlike Docker's root and
//! /"), and the template's sandboxes default to the last USER and WORKDIR: after FROM come
//! `USER user` and `WORKDIR /home/user`, preceded by a RUN as root that makes the account
//! when the base is not known to have it (registry images). A base template with a user of
//! its own keeps it. `RUN [cmd, "root"]` and `.set_user("root")` run as root.
//!
//! E2B's default image (`e2bdev/base`) is the installed `base` template when there is one;
//! any other `fromImage` is pulled by the daemon (`fromImageRegistry` `registry` credentials as basic
//! auth; `sandcell serve --insecure-registry HOST` for plain HTTP).
//! `startCmd`/`readyCmd` are kept in `images/<name>/e2b.json`; the build runs them once and
//! snapshots the result (templates/memory_snapshot.rs).

use sandcell_image::dockerfile::{Command, CopySpec, Dockerfile, Instruction, Stage, Step};
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
    /// (templates/start.rs).
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

/// A build request as a Dockerfile: its steps, and the E2B step name of each (for logs and
/// `reason.step`; the FROM is the first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub dockerfile: Dockerfile,
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
    /// The base template's `/etc/passwd` has E2B's `user` (unknown for registry images).
    pub has_user_account: bool,
}

/// E2B's default user and working directory for build steps and for the template's
/// sandboxes (E2B's docs: "`user` with /home/user", unlike Docker's root and /).
pub const E2B_USER: &str = "user";
pub const E2B_HOME: &str = "/home/user";
/// Makes E2B's `user` (uid 1000, home /home/user, passwordless sudo where sudo is
/// installed) in a base that lacks it, as E2B does for any image: `useradd` (Debian, Fedora,
/// ...), busybox's `adduser`, or, with neither, entries written into /etc/passwd and
/// /etc/group.
const ENSURE_E2B_USER: &str = "if ! grep -q '^user:' /etc/passwd 2>/dev/null && \
     ! id -u user >/dev/null 2>&1; then \
     useradd -m -s /bin/bash user 2>/dev/null || useradd -m user 2>/dev/null || \
     adduser -D user 2>/dev/null || { echo 'user:x:1000:1000:user:/home/user:/bin/sh' \
     >> /etc/passwd && echo 'user:x:1000:' >> /etc/group && mkdir -p /home/user && \
     chown 1000:1000 /home/user; }; fi; \
     if [ -d /etc/sudoers.d ]; then echo 'user ALL=(ALL:ALL) NOPASSWD: ALL' > \
     /etc/sudoers.d/user && chmod 0440 /etc/sudoers.d/user; fi";

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
    let has_user_account = req
        .from_template
        .as_deref()
        .or_else(|| {
            req.from_image
                .as_deref()
                .filter(|i| E2B_BASE_IMAGES.contains(i))
                .map(|_| LOCAL_BASE)
        })
        .filter(|t| valid_name(t))
        .is_some_and(|t| passwd_has_user(&images.join(t).join("rootfs/etc/passwd")));
    BaseInfo {
        user,
        have_base: images.join(LOCAL_BASE).join("rootfs").is_dir(),
        has_user_account,
    }
}

/// Whether the passwd file at `path` (at most 1 MiB read) has an entry for [`E2B_USER`].
fn passwd_has_user(path: &Path) -> bool {
    use std::io::Read;
    let mut text = String::new();
    let read = std::fs::File::open(path).and_then(|f| f.take(1 << 20).read_to_string(&mut text));
    read.is_ok() && text.lines().any(|l| l.split(':').next() == Some(E2B_USER))
}

/// The Dockerfile of an E2B build request, made as a value (never text parsed back).
/// `base_info` gives what is known about the base (its user); `Err`: what is wrong with the
/// request (a 400).
pub fn plan(req: &BuildStart, base_info: &BaseInfo) -> Result<Plan, String> {
    if req.from_image_registry.is_some() {
        registry_auth(req)?;
    }
    let mut out = Lines::new(from_image(req, base_info)?);
    let mut user = e2b_defaults(&mut out, base_info)?;
    let mut no_cache = req.force == Some(true);
    for (index, step) in req.steps.iter().enumerate() {
        no_cache |= step.force == Some(true);
        for line in step_lines(index, step, &mut user)? {
            // E2B numbers the steps from 1 (the base is step 0).
            out.push(&(index + 1).to_string(), line);
        }
    }
    Ok(Plan {
        dockerfile: Dockerfile {
            escape: '\\',
            global_args: Vec::new(),
            stages: vec![Stage {
                index: 0,
                name: None,
                base: out.from,
                line: 1,
                steps: out.lines,
            }],
        },
        steps: out.steps,
        no_cache,
    })
}

impl Plan {
    /// The Dockerfile as text (what its lines say; for logs and tests).
    pub fn text(&self) -> String {
        let mut text = String::new();
        for stage in &self.dockerfile.stages {
            text.push_str(&format!("FROM {}\n", stage.base));
            for step in &stage.steps {
                text.push_str(&step.text);
                text.push('\n');
            }
        }
        text
    }
}

/// One Dockerfile instruction and its text as a Dockerfile line would say it (`KEYWORD
/// rest`, as the image crate's parser records a step: progress lines and cache keys).
struct Line {
    text: String,
    instruction: Instruction,
}

fn line(keyword: &str, rest: &str, instruction: Instruction) -> Line {
    Line {
        text: format!("{keyword} {}", rest.trim()).trim_end().to_string(),
        instruction,
    }
}

fn user_line(user: &str) -> Line {
    line("USER", user, Instruction::User(user.trim().to_string()))
}

/// `RUN` in exec form through `/bin/sh -c` (no Dockerfile expansion: the shell expands).
fn shell_run(cmd: &str) -> Result<Line, String> {
    let argv = vec!["/bin/sh".to_string(), "-c".to_string(), cmd.to_string()];
    let text = serde_json::to_string(&argv).map_err(|e| e.to_string())?;
    Ok(line("RUN", &text, Instruction::Run(Command::Exec(argv))))
}

/// The steps of the one stage and, for each, the E2B step it comes from ([`Plan::steps`]).
struct Lines {
    from: String,
    lines: Vec<Step>,
    steps: Vec<String>,
}

impl Lines {
    fn new(from: String) -> Lines {
        Lines {
            from,
            lines: Vec::new(),
            steps: vec![BASE_STEP.to_string()],
        }
    }

    fn push(&mut self, step: &str, line: Line) {
        self.lines.push(Step {
            // Line 1 is the FROM.
            line: self.lines.len() + 2,
            text: line.text,
            instruction: line.instruction,
        });
        self.steps.push(step.to_string());
    }
}

/// The `FROM` of the build: `fromTemplate`, or `fromImage` (E2B's base images are the
/// local `base` when it is installed).
fn from_image(req: &BuildStart, base_info: &BaseInfo) -> Result<String, String> {
    match (&req.from_template, &req.from_image) {
        (Some(t), _) => {
            if !valid_name(t) {
                return Err(bad(format!("fromTemplate {t:?}: not a template name")));
            }
            Ok(t.clone())
        }
        (None, Some(i)) if base_info.have_base && E2B_BASE_IMAGES.contains(&i.as_str()) => {
            Ok(LOCAL_BASE.to_string())
        }
        (None, Some(i)) => {
            single_word("fromImage", i)?;
            Ok(i.clone())
        }
        (None, None) => Err(bad("fromImage or fromTemplate is required")),
    }
}

/// E2B's defaults (user `user`, created if the base lacks it, in its home), unless the
/// base template has a user of its own (then it is kept, as E2B keeps a base template's
/// last user and workdir). Returns the user the steps start as.
fn e2b_defaults(out: &mut Lines, base_info: &BaseInfo) -> Result<Option<String>, String> {
    if base_info.user.is_some() {
        return Ok(base_info.user.clone());
    }
    if !base_info.has_user_account {
        out.push(BASE_STEP, user_line("root"));
        out.push(BASE_STEP, shell_run(ENSURE_E2B_USER).map_err(bad)?);
    }
    out.push(BASE_STEP, user_line(E2B_USER));
    out.push(
        BASE_STEP,
        line(
            "WORKDIR",
            E2B_HOME,
            Instruction::Workdir(E2B_HOME.to_string()),
        ),
    );
    Ok(Some(E2B_USER.to_string()))
}

/// The Dockerfile steps of E2B step `index` (from 0); `USER` steps change `user`, the user
/// a `RUN` with a user of its own returns to.
fn step_lines(
    index: usize,
    step: &BuildStep,
    user: &mut Option<String>,
) -> Result<Vec<Line>, String> {
    let at = |problem: String| format!("step {} ({}): {problem}", index + 1, step.kind);
    match step.kind.as_str() {
        "RUN" => run_lines(step, user.as_deref()).map_err(at),
        "COPY" => copy_line(step).map(|l| vec![l]).map_err(at),
        "ENV" => env_line(step).map(|l| vec![l]).map_err(at),
        "WORKDIR" => workdir_line(step).map(|l| vec![l]).map_err(at),
        "USER" => {
            let [u] = step.args.as_slice() else {
                return Err(at("args: [user] expected".into()));
            };
            single_word("user", u).map_err(at)?;
            *user = Some(u.clone());
            Ok(vec![user_line(u)])
        }
        other => Err(bad(format!(
            "step {}: type {other:?} is not supported (RUN, COPY, ENV, WORKDIR, USER)",
            index + 1
        ))),
    }
}

/// `RUN [cmd, user?]`: exec form; with a user, between `USER user` and a `USER` back to
/// `user` (root when unknown).
fn run_lines(step: &BuildStep, user: Option<&str>) -> Result<Vec<Line>, String> {
    let (cmd, run_as) = match step.args.as_slice() {
        [cmd] => (cmd, None),
        [cmd, u] if u.is_empty() => (cmd, None),
        [cmd, u] => (cmd, Some(u)),
        _ => return Err("args: [command] or [command, user] expected".into()),
    };
    if cmd.contains('\0') {
        return Err("the command has a NUL".into());
    }
    let run = shell_run(cmd)?;
    match run_as {
        Some(u) => {
            single_word("user", u)?;
            Ok(vec![user_line(u), run, user_line(user.unwrap_or("root"))])
        }
        None => Ok(vec![run]),
    }
}

/// `COPY [src, dest, user?, mode?]` + `filesHash`: from the uploaded archive's directory.
fn copy_line(step: &BuildStep) -> Result<Line, String> {
    let (src, dest) = match step.args.as_slice() {
        [src, dest, ..] if step.args.len() <= 4 => (src, dest),
        _ => return Err("args: [src, dest, user?, mode?] expected".into()),
    };
    let hash = step
        .files_hash
        .as_deref()
        .ok_or_else(|| "filesHash is required".to_string())?;
    if !valid_files_hash(hash) {
        return Err(format!("filesHash {hash:?}: lowercase hex expected"));
    }
    let src = copy_source(src)?;
    one_line("COPY destination", dest)?;
    if dest.is_empty() {
        return Err("an empty destination".into());
    }
    let mut flags = String::new();
    let chown = step.args.get(2).filter(|u| !u.is_empty());
    if let Some(owner) = chown {
        single_word("user", owner)?;
        flags.push_str(&format!("--chown={owner} "));
    }
    let chmod = step.args.get(3).filter(|m| !m.is_empty());
    if let Some(mode) = chmod {
        // What a Dockerfile's `--chmod=` takes: octal, at most 0o7777.
        let octal = mode.len() <= 6 && mode.bytes().all(|b| (b'0'..=b'7').contains(&b));
        if !octal || u32::from_str_radix(mode, 8).map_or(true, |m| m > 0o7777) {
            return Err(format!("mode {mode:?}: octal expected"));
        }
        flags.push_str(&format!("--chmod={mode} "));
    }
    let source = format!("{hash}/{src}");
    let rest = format!("{flags}[{},{}]", json(&source), json(dest));
    let spec = CopySpec {
        add: false,
        from: None,
        checksum: None,
        chown: chown.cloned(),
        chmod: chmod.cloned(),
        args: vec![source, dest.clone()],
        json: true,
    };
    Ok(line("COPY", &rest, Instruction::Copy(spec)))
}

/// `ENV [key, value, ...]`: one `ENV k="v" ...` step.
fn env_line(step: &BuildStep) -> Result<Line, String> {
    if step.args.is_empty() || !step.args.len().is_multiple_of(2) {
        return Err("args: [key, value, ...] pairs expected".into());
    }
    let mut pairs = Vec::new();
    for pair in step.args.chunks(2) {
        let (k, v) = (&pair[0], &pair[1]);
        let good_key = k
            .bytes()
            .enumerate()
            .all(|(i, b)| b == b'_' || b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit()));
        if k.is_empty() || !good_key {
            return Err(format!("{k:?}: not an environment variable name"));
        }
        if v.contains(['\n', '\r', '\0']) {
            return Err(format!("{k}: no line breaks or NULs in values"));
        }
        pairs.push(format!("{k}={}", env_quoted(v)));
    }
    let rest = pairs.join(" ");
    Ok(line("ENV", &rest, Instruction::Env(rest.clone())))
}

/// `WORKDIR [dir]`.
fn workdir_line(step: &BuildStep) -> Result<Line, String> {
    let [dir] = step.args.as_slice() else {
        return Err("args: [directory] expected".into());
    };
    one_line("WORKDIR", dir)?;
    if dir.trim().is_empty() {
        return Err("an empty directory".into());
    }
    Ok(line(
        "WORKDIR",
        dir,
        Instruction::Workdir(dir.trim().to_string()),
    ))
}

#[cfg(test)]
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
        let info = BaseInfo {
            has_user_account: true,
            ..BaseInfo::default()
        };
        let plan = plan(&req, &info).unwrap();
        let expected = [
            "FROM base",
            "USER user",
            "WORKDIR /home/user",
            r#"RUN ["/bin/sh","-c","echo \"$HOME\"\nls"]"#,
            "USER nobody",
            r#"RUN ["/bin/sh","-c","id"]"#,
            "USER user",
            r#"COPY --chown=user --chmod=0755 ["0123456789abcdef0123/dir/a.txt","/app/"]"#,
            r#"ENV A="x y" B="a\"b\\c$A""#,
            "WORKDIR /app dir",
            "USER user",
        ];
        assert_eq!(plan.text(), format!("{}\n", expected.join("\n")));
        assert_eq!(
            plan.steps,
            [
                "base", "base", "base", "1", "2", "2", "2", "3", "4", "5", "6"
            ]
        );
        assert!(!plan.no_cache);
        // And the image crate's parser reads its text as the very same value.
        assert_eq!(
            sandcell_image::dockerfile::parse(&plan.text()).unwrap(),
            plan.dockerfile
        );
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
        assert!(
            plan(&default_image, &have_base)
                .unwrap()
                .text()
                .starts_with("FROM base\n")
        );
        assert!(
            plan(&default_image, &info)
                .unwrap()
                .text()
                .starts_with("FROM e2bdev/base\n")
        );
        assert!(!valid_files_hash("../x"));
        assert!(valid_files_hash(&"a".repeat(64)));
    }

    /// E2B's defaults (`user`, /home/user) for steps and sandboxes: made when the base
    /// lacks the account, not when it has it, and not over a base template's own user.
    #[test]
    fn steps_run_as_e2b_user_unless_the_base_has_a_user() {
        let req = |from_template: Option<&str>, from_image: Option<&str>| BuildStart {
            from_template: from_template.map(Into::into),
            from_image: from_image.map(Into::into),
            steps: vec![step("RUN", &["whoami"]), step("RUN", &["id", "root"])],
            ..BuildStart::default()
        };
        let lines = |p: Plan| {
            assert_eq!(
                sandcell_image::dockerfile::parse(&p.text()).unwrap(),
                p.dockerfile
            );
            p.text().lines().map(String::from).collect::<Vec<_>>()
        };
        // A registry image: the account is made as root first.
        let image = lines(plan(&req(None, Some("python:3")), &BaseInfo::default()).unwrap());
        assert_eq!(image[0], "FROM python:3");
        assert_eq!(image[1], "USER root");
        assert!(
            image[2].starts_with("RUN [") && image[2].contains("useradd -m"),
            "{image:?}"
        );
        assert_eq!(&image[3..5], ["USER user", "WORKDIR /home/user"]);
        assert_eq!(image[6], "USER root");
        assert_eq!(image[8], "USER user", "a RUN as root goes back to user");
        // A base with the account: no RUN to make it.
        let with_account = BaseInfo {
            has_user_account: true,
            ..BaseInfo::default()
        };
        let base = lines(plan(&req(Some("base"), None), &with_account).unwrap());
        assert_eq!(&base[..3], ["FROM base", "USER user", "WORKDIR /home/user"]);
        // A base template with its own user keeps it.
        let own = BaseInfo {
            user: Some("app".into()),
            has_user_account: true,
            ..BaseInfo::default()
        };
        let kept = lines(plan(&req(Some("mine"), None), &own).unwrap());
        assert_eq!(kept[0], "FROM mine");
        assert!(kept[1].starts_with("RUN "), "{kept:?}");
        assert_eq!(kept[2], "USER root");
        assert_eq!(
            kept[4], "USER app",
            "a RUN as root goes back to the base's user"
        );
        for text in [&image, &base, &kept] {
            sandcell_image::dockerfile::parse(&(text.join("\n") + "\n")).unwrap();
        }
    }

    #[test]
    fn the_passwd_check_reads_account_names() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("passwd");
        std::fs::write(&path, "root:x:0:0::/root:/bin/sh\nuserx:x:1:1::/:/bin/sh\n").unwrap();
        assert!(!passwd_has_user(&path));
        std::fs::write(
            &path,
            "root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/bash\n",
        )
        .unwrap();
        assert!(passwd_has_user(&path));
        assert!(!passwd_has_user(&tmp.path().join("none")));
    }
}
