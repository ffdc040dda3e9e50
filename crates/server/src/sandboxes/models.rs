//! The JSON of the control API, field for field as E2B's OpenAPI spec (and the generated
//! clients of its SDKs) name them. Unknown request fields are accepted and ignored, as
//! E2B's server does (SDKs send fields for features we do not have yet).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// `POST /sandboxes` and `POST /v2/sandboxes`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    /// A template (image) name: `base`, `minimal`, ... (`GET /templates`).
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Seconds until the sandbox is killed (default 300, at most 86400).
    #[serde(default)]
    pub timeout: Option<u64>,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    /// Environment variables of every process started in the sandbox.
    #[serde(default)]
    pub env_vars: Option<BTreeMap<String, String>>,
    /// Accepted and ignored, as E2B does now: every sandbox requires its envd access token
    /// (`X-Access-Token`) on envd traffic.
    #[serde(default)]
    pub secure: Option<bool>,
    /// vCPUs (our extension; E2B takes it from the template). Default 2, at most the
    /// server's `--max-vcpus`.
    #[serde(default, rename = "cpuCount")]
    pub cpu_count: Option<u32>,
    /// Memory in MiB (our extension; E2B takes it from the template). Default 512, at
    /// least 128, at most the server's `--max-memory-mib`.
    #[serde(default, rename = "memoryMB")]
    pub memory_mb: Option<u32>,
    /// At the timeout, pause the sandbox (resume it with connect) instead of killing it.
    #[serde(default)]
    pub auto_pause: Option<bool>,
    /// `{"enabled": true}` (needs `autoPause: true`): while paused, a request for the
    /// sandbox through the proxy (its envd, its ports) resumes it and is then served.
    #[serde(default, deserialize_with = "auto_resume_field")]
    pub auto_resume: Option<AutoResumeConfig>,
    /// With `autoPause`: false saves only the files at the timeout (the resume boots a
    /// fresh sandbox on them: processes gone); default true (the memory too).
    #[serde(default)]
    pub auto_pause_memory: Option<bool>,
    /// false: nothing out (as `denyOut: ["0.0.0.0/0"]`). Default true.
    #[serde(default, rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    /// E2B's egress rules (`allowOut`, `denyOut`); see networks/api.rs.
    #[serde(default)]
    pub network: Option<crate::networks::api::NetworkConfig>,
    /// Private networks of the key to join (our extension; `POST /networks`).
    #[serde(default)]
    pub networks: Option<Vec<String>>,
    /// E2B's volumes to mount (`[{name, path}]`, volumes/; both runtimes).
    #[serde(default)]
    pub volume_mounts: Option<Vec<crate::volumes::service::VolumeMount>>,
}

/// E2B's `SandboxAutoResumeConfig`.
#[derive(Debug, Clone, Copy, Default, Deserialize, ToSchema)]
pub struct AutoResumeConfig {
    /// Default false.
    pub enabled: bool,
}

/// `autoResume`, with a message that says what to send when it is malformed.
fn auto_resume_field<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<AutoResumeConfig>, D::Error> {
    use serde::de::Error;
    match Option::<serde_json::Value>::deserialize(d)? {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v).map(Some).map_err(|_| {
            D::Error::custom(
                "autoResume must be an object: {\"enabled\": true} or {\"enabled\": false}",
            )
        }),
    }
}

/// A created or connected sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Sandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// Deprecated in E2B; always `sandcell`.
    #[serde(rename = "clientID")]
    pub client_id: String,
    #[serde(rename = "envdVersion")]
    pub envd_version: String,
    #[serde(rename = "envdAccessToken", skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    #[serde(rename = "trafficAccessToken")]
    pub traffic_access_token: Option<String>,
    /// The `--domain` of the daemon: sandbox hosts are `<port>-<sandboxID>.<domain>`.
    pub domain: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    Running,
    Paused,
}

/// An item of `GET /sandboxes` and `GET /v2/sandboxes`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ListedSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    /// RFC 3339
    #[serde(rename = "startedAt")]
    pub started_at: String,
    /// RFC 3339: when the sandbox will be killed.
    #[serde(rename = "endAt")]
    pub end_at: String,
    #[serde(rename = "cpuCount")]
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u32,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u32,
    pub state: SandboxState,
    #[serde(rename = "envdVersion")]
    pub envd_version: String,
    pub metadata: BTreeMap<String, String>,
    /// The owning key's id: only in an admin key's `?all=true` listing.
    #[serde(rename = "keyID", default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[schema(as = SandboxService)]
pub struct LifecycleInfo {
    /// Created with `autoResume: {"enabled": true}`: a request for it while paused resumes it.
    #[serde(rename = "autoResume")]
    pub auto_resume: bool,
    /// `kill`, or `pause` for a sandbox created with `autoPause`.
    #[serde(rename = "onTimeout")]
    pub on_timeout: String,
}

/// `GET /sandboxes/{sandboxID}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SandboxDetail {
    #[serde(flatten)]
    pub listed: ListedSandbox,
    #[serde(rename = "envdAccessToken", skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    pub domain: Option<String>,
    pub lifecycle: LifecycleInfo,
    /// For a paused sandbox: `full` (memory and files saved) or `filesystem` (files only: the
    /// resume boots afresh); absent while running.
    #[serde(rename = "pauseMode", skip_serializing_if = "Option::is_none")]
    pub pause_mode: Option<String>,
    /// Our extension: the sandbox this one was forked from.
    #[serde(rename = "parentID", skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    /// Our extension: the live sandboxes forked from this one, oldest first.
    #[serde(default)]
    pub children: Vec<String>,
    /// The volumes the sandbox mounts (E2B's `volumeMounts`).
    #[serde(rename = "volumeMounts", default)]
    pub volume_mounts: Vec<crate::volumes::service::VolumeMount>,
    /// E2B's `network`: the egress rules in force (`allowOut`, `denyOut`, `rules`), absent
    /// for a sandbox without a network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::networks::api::NetworkConfig>,
}

/// `POST /sandboxes/{sandboxID}/timeout`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct TimeoutRequest {
    /// Seconds from now (at most 86400); may shorten the sandbox's life.
    pub timeout: u64,
}

/// `POST /sandboxes/{sandboxID}/refreshes`.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct RefreshRequest {
    /// Seconds from now to keep the sandbox alive at least (at most 3600).
    #[serde(default)]
    pub duration: Option<u64>,
}

/// `POST /v2/sandboxes/{sandboxID}/connect` (and `/sandboxes/{sandboxID}/connect`).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct ConnectRequest {
    /// Seconds from now; the sandbox's end is moved later, never earlier.
    #[serde(default)]
    pub timeout: Option<u64>,
    /// Accepted: a paused sandbox resumes from what its pause saved (its memory, or with
    /// a filesystem-only pause its files: a fresh boot on them).
    #[serde(default)]
    pub memory: Option<bool>,
}

/// An item of `GET /templates`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Template {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    #[serde(rename = "cpuCount")]
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u32,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u32,
    pub public: bool,
    pub aliases: Vec<String>,
    pub names: Vec<String>,
    #[serde(rename = "createdAt")]
    pub created_at: String,
    #[serde(rename = "updatedAt")]
    pub updated_at: String,
    #[serde(rename = "createdBy")]
    pub created_by: Option<String>,
    #[serde(rename = "lastSpawnedAt")]
    pub last_spawned_at: Option<String>,
    #[serde(rename = "spawnCount")]
    pub spawn_count: u64,
    #[serde(rename = "buildCount")]
    pub build_count: u64,
    #[serde(rename = "envdVersion")]
    pub envd_version: String,
    /// `ready`
    #[serde(rename = "buildStatus")]
    pub build_status: String,
}

/// `GET /health`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    pub status: String,
    /// `gvisor` or `microvm`
    pub runtime: String,
    pub version: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_resume_takes_e2bs_object_and_says_what_to_send() {
        let parse = |body: &str| serde_json::from_str::<NewSandbox>(body);
        let on = parse(r#"{"templateID":"base","autoPause":true,"autoResume":{"enabled":true}}"#);
        assert!(on.unwrap().auto_resume.is_some_and(|a| a.enabled));
        let off = parse(r#"{"templateID":"base","autoResume":{"enabled":false}}"#);
        assert!(off.unwrap().auto_resume.is_some_and(|a| !a.enabled));
        for absent in [
            r#"{"templateID":"base"}"#,
            r#"{"templateID":"base","autoResume":null}"#,
        ] {
            assert!(parse(absent).unwrap().auto_resume.is_none(), "{absent}");
        }
        for bad in [r#"true"#, r#"{}"#, r#"{"enabled":"yes"}"#] {
            let body = format!(r#"{{"templateID":"base","autoResume":{bad}}}"#);
            let e = parse(&body).unwrap_err().to_string();
            assert!(e.contains(r#"{"enabled": true}"#), "{bad}: {e}");
        }
    }
}
