//! What `/init` sets and every request reads: default env vars, default user and workdir, the
//! access token; and how a request's user and paths are resolved (envd's rules).

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use hyper::StatusCode;
use hyper::header::AUTHORIZATION;

use crate::connect::ApiError;
use crate::users::{User, UserDb, UserError};

/// envd's default user when `/init` names none. E2B's templates set "user" through `/init`.
pub const ENVD_DEFAULT_USER: &str = "root";

#[derive(Debug, Clone)]
pub struct Defaults {
    /// Set by the agent itself; `/init` cannot replace them (envd's "internal" vars).
    pub internal_env: BTreeMap<String, String>,
    /// Set by `/init`, replaced as a whole by the next one.
    pub user_env: BTreeMap<String, String>,
    /// Point TLS clients at the system store once `/init` installed a CA into it
    /// (trust_store.rs); the lowest in rank: the request's env vars win.
    pub trust_env: BTreeMap<String, String>,
    /// The CA `/init` last installed into the system store. Every create and restore sends
    /// the daemon's CA again; the same one is not rewritten (reading the store to compare
    /// costs ~4 ms under gVisor). Memory and disk agree on it: both come from the same
    /// snapshot when a sandbox is restored.
    pub trusted_ca: Option<String>,
    pub user: String,
    pub workdir: Option<String>,
    pub access_token: Option<String>,
    /// Unix nanoseconds of the newest `/init` timestamp applied; older ones are ignored.
    pub last_init: Option<i128>,
    /// The host's id of this sandbox from the last `/init` that named one.
    pub sandbox_id: Option<String>,
}

impl Defaults {
    pub fn new(user: &str) -> Self {
        let mut internal_env = BTreeMap::new();
        // envd sets E2B_SANDBOX=true inside a sandbox; programs test it.
        internal_env.insert("E2B_SANDBOX".to_owned(), "true".to_owned());
        Defaults {
            internal_env,
            user_env: BTreeMap::new(),
            trust_env: BTreeMap::new(),
            trusted_ca: None,
            user: user.to_owned(),
            workdir: None,
            access_token: None,
            last_init: None,
            sandbox_id: None,
        }
    }

    /// Every default env var: internal ones win over the request's, which win over the
    /// trust store's.
    pub fn env(&self) -> BTreeMap<String, String> {
        let mut all = self.trust_env.clone();
        all.extend(self.user_env.clone());
        all.extend(self.internal_env.clone());
        all
    }
}

#[derive(Debug)]
pub struct Shared {
    defaults: RwLock<Defaults>,
    pub users: UserDb,
}

impl Shared {
    pub fn new(defaults: Defaults, users: UserDb) -> Self {
        Shared {
            defaults: RwLock::new(defaults),
            users,
        }
    }

    pub fn defaults(&self) -> RwLockReadGuard<'_, Defaults> {
        // Whole-value updates only: a poisoned lock still holds a consistent value.
        self.defaults
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn defaults_mut(&self) -> RwLockWriteGuard<'_, Defaults> {
        self.defaults
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The user of an RPC: the `Authorization: Basic base64(user:)` name if present (401
    /// when unknown, as envd's authn middleware answers), else the default user.
    pub fn rpc_user<B>(&self, req: &hyper::Request<B>) -> Result<User, ApiError> {
        match basic_auth_user(req) {
            Some(name) => self.users.lookup(&name).map_err(|e| match e {
                UserError::Unknown(_) => {
                    ApiError::new("unauthenticated", format!("invalid username: '{name}'"))
                }
                other => ApiError::new("internal", other.to_string()),
            }),
            None => {
                let name = self.defaults().user.clone();
                self.users.lookup(&name).map_err(|e| match e {
                    UserError::Unknown(_) => {
                        ApiError::new("unauthenticated", format!("invalid default user: '{name}'"))
                    }
                    other => ApiError::new("internal", other.to_string()),
                })
            }
        }
    }

    /// The user of a `/files` request: the `username` query parameter, else the default user;
    /// unknown users are a REST 401 (envd).
    pub fn files_user(&self, username: Option<&str>) -> Result<User, ApiError> {
        let name = match username {
            Some(n) => n.to_owned(),
            None => self.defaults().user.clone(),
        };
        self.users.lookup(&name).map_err(|e| match e {
            UserError::Unknown(_) => ApiError::rest(StatusCode::UNAUTHORIZED, e.to_string()),
            other => ApiError::rest(StatusCode::INTERNAL_SERVER_ERROR, other.to_string()),
        })
    }

    /// envd's `ExpandAndResolve`: an empty path is the default workdir (or home), `~` and
    /// `~/x` are under the user's home, relative paths are joined to the home and cleaned,
    /// absolute paths are taken as they are.
    pub fn resolve(&self, path: &str, user: &User) -> Result<PathBuf, String> {
        let workdir = self.defaults().workdir.clone();
        resolve_path(path, user, workdir.as_deref())
    }
}

pub fn resolve_path(path: &str, user: &User, workdir: Option<&str>) -> Result<PathBuf, String> {
    let path = match (path, workdir) {
        ("", Some(w)) => w,
        (p, _) => p,
    };
    let expanded: PathBuf = if let Some(rest) = path.strip_prefix('~') {
        if !rest.is_empty() && !rest.starts_with('/') {
            return Err(format!(
                "failed to expand path '{path}' for user '{}': cannot expand user-specific home dir",
                user.name
            ));
        }
        lexical_clean(&user.home.join(rest.trim_start_matches('/')))
    } else {
        PathBuf::from(path)
    };
    if expanded.is_absolute() {
        return Ok(expanded);
    }
    Ok(lexical_clean(&user.home.join(expanded)))
}

/// `..` and `.` removed without touching the filesystem (Go's `filepath.Clean`).
pub fn lexical_clean(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                if !out.pop() && !path.is_absolute() {
                    out.push("..");
                }
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    if out.as_os_str().is_empty() {
        out.push(if path.is_absolute() { "/" } else { "." });
    }
    out
}

/// The user name of an `Authorization: Basic` header, if there is a well-formed one.
pub fn basic_auth_user<B>(req: &hyper::Request<B>) -> Option<String> {
    let value = req.headers().get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, rest) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = BASE64.decode(rest.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, _password) = text.split_once(':')?;
    Some(user.to_owned())
}

/// Constant-time comparison, so the token cannot be guessed byte by byte from timings.
pub fn token_matches(expected: &str, got: &str) -> bool {
    let (a, b) = (expected.as_bytes(), got.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user() -> User {
        User {
            name: "user".into(),
            uid: 1000,
            gid: 1000,
            home: PathBuf::from("/home/user"),
            shell: PathBuf::from("/bin/bash"),
            groups: vec![1000],
        }
    }

    #[test]
    fn resolves_paths_like_envd() {
        let u = user();
        let r = |p: &str, w: Option<&str>| resolve_path(p, &u, w);
        assert_eq!(r("", None), Ok(PathBuf::from("/home/user")));
        assert_eq!(r("", Some("/work")), Ok(PathBuf::from("/work")));
        assert_eq!(r("a/../b.txt", None), Ok(PathBuf::from("/home/user/b.txt")));
        assert_eq!(r("~", None), Ok(PathBuf::from("/home/user")));
        assert_eq!(r("~/x", None), Ok(PathBuf::from("/home/user/x")));
        assert_eq!(r("../../etc", None), Ok(PathBuf::from("/etc")));
        assert_eq!(r("/abs/x", None), Ok(PathBuf::from("/abs/x")));
        assert!(r("~root/x", None).is_err());
    }

    #[test]
    fn reads_basic_auth() {
        let req = hyper::Request::builder()
            .header("authorization", format!("Basic {}", BASE64.encode("user:")))
            .body(())
            .expect("request");
        assert_eq!(basic_auth_user(&req).as_deref(), Some("user"));
        let req = hyper::Request::builder()
            .header("authorization", "Bearer x")
            .body(())
            .expect("request");
        assert_eq!(basic_auth_user(&req), None);
        assert!(token_matches("abc", "abc"));
        assert!(!token_matches("abc", "abd"));
        assert!(!token_matches("abc", "ab"));
    }
}
