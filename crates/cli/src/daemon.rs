//! Which daemon the client commands talk to, with which API key, and how their failures are
//! told to the user (each message says what to do next).
//!
//! The URL: `$SANDCELL_URL`, else `url` in the config file, else http://127.0.0.1:3000.
//! The key: `$SANDCELL_API_KEY`, else `api_key` in the config file, else, when the daemon is
//! on this host (a loopback URL), the admin key `<data-dir>/admin.key` if we can read it
//! (root). The config file is `$SANDCELL_CONFIG`, else
//! `$XDG_CONFIG_HOME/sandcell/config.toml`, else `~/.config/sandcell/config.toml`: TOML with
//! two top-level string keys,
//!
//! ```toml
//! url = "http://sandcell.internal:3000"
//! api_key = "e2b_..."
//! ```

use sandcell_client::{Client, ClientError};
use sandcell_runtime::Dirs;
use std::fmt;
use std::path::{Path, PathBuf};

pub const DEFAULT_URL: &str = "http://127.0.0.1:3000";
/// The largest config or key file read.
const MAX_FILE: u64 = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is larger than {MAX_FILE} bytes")]
    TooLarge { path: PathBuf },
    #[error("{path} line {line}: {problem}")]
    Syntax {
        path: PathBuf,
        line: usize,
        problem: String,
    },
    #[error("invalid daemon URL {url:?} (from {source_name}): {problem}")]
    Url {
        url: String,
        source_name: String,
        problem: String,
    },
}

/// Where a setting came from, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Env(&'static str),
    Config(PathBuf),
    AdminKey(PathBuf),
    Default,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Env(name) => write!(f, "${name}"),
            Source::Config(path) => write!(f, "{}", path.display()),
            Source::AdminKey(path) => write!(f, "the admin key {}", path.display()),
            Source::Default => write!(f, "the default"),
        }
    }
}

/// The daemon and key in use.
#[derive(Debug, Clone)]
pub struct Target {
    pub url: String,
    pub url_source: Source,
    pub key_source: Option<Source>,
    /// Why no key was found, when none was.
    pub no_key_hint: String,
    pub client: Client,
}

#[derive(Debug, Default, PartialEq, Eq)]
struct ConfigFile {
    url: Option<String>,
    api_key: Option<String>,
}

fn config_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SANDCELL_CONFIG") {
        return Some(PathBuf::from(p));
    }
    if let Some(x) = std::env::var_os("XDG_CONFIG_HOME").filter(|x| !x.is_empty()) {
        return Some(PathBuf::from(x).join("sandcell/config.toml"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config/sandcell/config.toml"))
}

fn read_small(path: &Path) -> Result<String, ConfigError> {
    use std::io::Read;
    let read = |source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read)?;
    let mut text = String::new();
    file.take(MAX_FILE + 1)
        .read_to_string(&mut text)
        .map_err(read)?;
    if text.len() as u64 > MAX_FILE {
        return Err(ConfigError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    Ok(text)
}

/// The subset of TOML the config uses: `key = "string"` lines, `#` comments, blank lines.
fn parse_config(path: &Path, text: &str) -> Result<ConfigFile, ConfigError> {
    let mut config = ConfigFile::default();
    for (n, raw) in text.lines().enumerate() {
        let syntax = |problem: String| ConfigError::Syntax {
            path: path.to_path_buf(),
            line: n + 1,
            problem,
        };
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, rest) = line
            .split_once('=')
            .ok_or_else(|| syntax("expected key = \"value\"".into()))?;
        let value = parse_string(rest.trim()).ok_or_else(|| {
            syntax(format!(
                "the value of {} must be a double-quoted string",
                key.trim()
            ))
        })?;
        match key.trim() {
            "url" => config.url = Some(value),
            "api_key" => config.api_key = Some(value),
            other => {
                return Err(syntax(format!(
                    "unknown key {other:?} (known: url, api_key)"
                )));
            }
        }
    }
    Ok(config)
}

/// A TOML basic string (`"..."` with `\"` and `\\`), optionally followed by a comment.
fn parse_string(s: &str) -> Option<String> {
    let mut chars = s.strip_prefix('"')?.chars();
    let mut out = String::new();
    loop {
        match chars.next()? {
            '"' => break,
            '\\' => match chars.next()? {
                '"' => out.push('"'),
                '\\' => out.push('\\'),
                _ => return None,
            },
            c => out.push(c),
        }
    }
    let rest = chars.as_str().trim();
    (rest.is_empty() || rest.starts_with('#')).then_some(out)
}

fn is_loopback(url: &str) -> bool {
    let host = url
        .strip_prefix("http://")
        .unwrap_or(url)
        .trim_end_matches('/');
    let host = match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    };
    matches!(host, "localhost" | "[::1]")
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Finds the daemon and key (see the module doc).
pub fn locate(dirs: &Dirs) -> Result<Target, ConfigError> {
    let config = match config_path() {
        Some(path) if path.exists() => {
            let parsed = parse_config(&path, &read_small(&path)?)?;
            Some((path, parsed))
        }
        _ => None,
    };
    let (url, url_source) = if let Some(url) = env_nonempty("SANDCELL_URL") {
        (url, Source::Env("SANDCELL_URL"))
    } else if let Some((path, ConfigFile { url: Some(url), .. })) = &config {
        (url.clone(), Source::Config(path.clone()))
    } else {
        (DEFAULT_URL.to_string(), Source::Default)
    };
    let url = url.trim().trim_end_matches('/').to_string();
    let admin_path = dirs.data.join("admin.key");
    let mut no_key_hint = String::new();
    let (key, key_source) = if let Some(key) = env_nonempty("SANDCELL_API_KEY") {
        (
            Some(key.trim().to_string()),
            Some(Source::Env("SANDCELL_API_KEY")),
        )
    } else if let Some((
        path,
        ConfigFile {
            api_key: Some(key), ..
        },
    )) = &config
    {
        (Some(key.clone()), Some(Source::Config(path.clone())))
    } else if is_loopback(&url) {
        match read_small(&admin_path) {
            Ok(key) if !key.trim().is_empty() => (
                Some(key.trim().to_string()),
                Some(Source::AdminKey(admin_path.clone())),
            ),
            Ok(_) => {
                no_key_hint = format!("{} is empty", admin_path.display());
                (None, None)
            }
            Err(e) => {
                no_key_hint = e.to_string();
                (None, None)
            }
        }
    } else {
        no_key_hint = format!(
            "the admin key ({}) is only used for a daemon on this host",
            admin_path.display()
        );
        (None, None)
    };
    let client = Client::new(&url, key).map_err(|e| ConfigError::Url {
        url: url.clone(),
        source_name: url_source.to_string(),
        problem: match e {
            ClientError::Url { problem, .. } => problem,
            other => other.to_string(),
        },
    })?;
    Ok(Target {
        url,
        url_source,
        key_source,
        no_key_hint,
        client,
    })
}

impl Target {
    /// What went wrong with a call to the daemon, and what to do about it. `sandbox` names
    /// the sandbox the call was about, for 404s.
    pub fn explain(&self, error: &ClientError, sandbox: Option<&str>) -> String {
        match error {
            ClientError::Connect { source, .. } => format!(
                "no daemon at {} ({source}): start it with `sandcell serve`{}",
                self.url,
                match self.url_source {
                    Source::Default => " or set SANDCELL_URL".to_string(),
                    ref s => format!(" or fix the URL (from {s})"),
                }
            ),
            ClientError::Api { status, message } if status.as_u16() == 401 => {
                match &self.key_source {
                    Some(source) => format!(
                        "the daemon at {} refused the API key from {source} ({message}): set \
                         SANDCELL_API_KEY to a valid key (`sandcell keys create` on the daemon's host)",
                        self.url
                    ),
                    None => format!(
                        "the daemon at {} wants an API key and none was found ({}): set \
                         SANDCELL_API_KEY, put api_key in {}, or run as root on the daemon's host",
                        self.url,
                        self.no_key_hint,
                        config_path().map_or_else(
                            || "~/.config/sandcell/config.toml".to_string(),
                            |p| p.display().to_string()
                        )
                    ),
                }
            }
            ClientError::Api { status, message } if status.as_u16() == 404 => match sandbox {
                Some(id) => format!(
                    "no sandbox {id} for this API key ({message}): `sandcell ls` lists yours"
                ),
                None => format!("{} answered 404: {message}", self.url),
            },
            ClientError::Api { status, message } if status.as_u16() == 429 => format!(
                "{message}: kill sandboxes you no longer need (`sandcell ls`, `sandcell kill ID`) \
                 or use a key with a higher --max-sandboxes"
            ),
            ClientError::Api { status, message } => {
                format!("the daemon at {} answered {status}: {message}", self.url)
            }
            ClientError::Envd {
                status, message, ..
            } if status.as_u16() == 502 => match sandbox {
                Some(id) => format!(
                    "sandbox {id} does not answer ({message}): is it still running? (`sandcell ls`)"
                ),
                None => error.to_string(),
            },
            ClientError::Envd { message, .. } => message.clone(),
            other => format!("{other} (daemon {})", self.url),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_takes_url_and_key() {
        let p = Path::new("/c.toml");
        let c = parse_config(
            p,
            "# mine\nurl = \"http://h:3000\"  # the lab\n\napi_key=\"e2b_ab\\\"c\"\n",
        )
        .unwrap();
        assert_eq!(c.url.as_deref(), Some("http://h:3000"));
        assert_eq!(c.api_key.as_deref(), Some("e2b_ab\"c"));
    }

    #[test]
    fn config_errors_name_the_line() {
        let p = Path::new("/c.toml");
        let e = parse_config(p, "url = \"x\"\napikey = \"k\"\n").unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        assert!(e.to_string().contains("apikey"), "{e}");
        assert!(parse_config(p, "url = http://x\n").is_err());
        assert!(parse_config(p, "url = \"x\" trailing\n").is_err());
        assert!(parse_config(p, "just words\n").is_err());
    }

    #[test]
    fn loopback_urls() {
        assert!(is_loopback("http://127.0.0.1:3000"));
        assert!(is_loopback("http://localhost:3000/"));
        assert!(is_loopback("http://[::1]:3000"));
        assert!(!is_loopback("http://10.0.0.1:3000"));
        assert!(!is_loopback("http://127.0.0.1.example.com:3000"));
    }
}
