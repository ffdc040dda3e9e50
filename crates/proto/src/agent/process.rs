//! envd's `process.Process` service in protobuf's JSON mapping (`spec/process/process.proto`):
//! the complete request shapes (PTY, tag, selectors by pid or tag, `StreamInput`, `Update`,
//! `List`). The server parses these; the events it sends back are [`super::ProcessEvent`].
//!
//! Parsing follows protojson's leniency where the SDKs differ: field names in lowerCamelCase
//! or snake_case, integers as JSON numbers or strings, enums by name or number.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ProcessConfig;

pub const LIST_PATH: &str = "/process.Process/List";
pub const CONNECT_PATH: &str = "/process.Process/Connect";
pub const UPDATE_PATH: &str = "/process.Process/Update";
pub const STREAM_INPUT_PATH: &str = "/process.Process/StreamInput";

/// `PTY{size{cols,rows}}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pty {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<PtySize>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySize {
    #[serde(default, deserialize_with = "lenient::u32")]
    pub cols: u32,
    #[serde(default, deserialize_with = "lenient::u32")]
    pub rows: u32,
}

/// `StartRequest` with every field envd knows. `stdin` absent means no stdin pipe here (the
/// process reads /dev/null); envd opens one. Every E2B SDK that knows the field sends it, and
/// our own CLI relies on the closed default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartRequest {
    pub process: ProcessConfig,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<Pty>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<bool>,
}

/// `ProcessSelector`: a oneof of `pid` and `tag`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessSelector {
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::opt_u32"
    )]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

impl ProcessSelector {
    pub fn pid(pid: u32) -> Self {
        ProcessSelector {
            pid: Some(pid),
            tag: None,
        }
    }

    pub fn tag(tag: &str) -> Self {
        ProcessSelector {
            pid: None,
            tag: Some(tag.to_owned()),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectRequest {
    #[serde(default)]
    pub process: ProcessSelector,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    pub config: ProcessConfig,
    pub pid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListResponse {
    #[serde(default)]
    pub processes: Vec<ProcessInfo>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdateRequest {
    #[serde(default)]
    pub process: ProcessSelector,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<Pty>,
}

/// `ProcessInput`: a oneof of `stdin` and `pty`, base64.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInput {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendInputRequest {
    #[serde(default)]
    pub process: ProcessSelector,
    #[serde(default)]
    pub input: ProcessInput,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloseStdinRequest {
    #[serde(default)]
    pub process: ProcessSelector,
}

/// `SendSignalRequest`; `signal` is envd's `Signal` enum, by name ("SIGNAL_SIGKILL") or by
/// number, kept raw so the server decides what it accepts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SendSignalRequest {
    #[serde(default)]
    pub process: ProcessSelector,
    #[serde(default)]
    pub signal: serde_json::Value,
}

/// One message of the `StreamInput` client stream: a oneof of `start`, `data`, `keepalive`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamInputRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<StreamInputStart>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<StreamInputData>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keepalive: Option<BTreeMap<String, serde_json::Value>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamInputStart {
    #[serde(default)]
    pub process: ProcessSelector,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamInputData {
    #[serde(default)]
    pub input: ProcessInput,
}

/// Deserializers that accept what protojson accepts for integers: numbers and strings.
pub mod lenient {
    use serde::{Deserialize, Deserializer, de::Error};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum NumOrStr {
        Num(u64),
        Str(String),
    }

    fn to_u32<E: Error>(v: NumOrStr) -> Result<u32, E> {
        let n = match v {
            NumOrStr::Num(n) => n,
            NumOrStr::Str(s) => s.trim().parse().map_err(E::custom)?,
        };
        u32::try_from(n).map_err(E::custom)
    }

    pub fn u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        match Option::<NumOrStr>::deserialize(d)? {
            Some(v) => to_u32(v),
            None => Ok(0),
        }
    }

    pub fn opt_u32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
        Option::<NumOrStr>::deserialize(d)?.map(to_u32).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_the_sdks_send() {
        let req: StartRequest = serde_json::from_str(
            r#"{"process":{"cmd":"/bin/bash","args":["-i","-l"],"envs":{"TERM":"xterm"}},
                "pty":{"size":{"cols":80,"rows":"24"}},"tag":"t"}"#,
        )
        .expect("StartRequest");
        assert_eq!(
            req.pty.and_then(|p| p.size),
            Some(PtySize { cols: 80, rows: 24 })
        );
        let sel: ConnectRequest =
            serde_json::from_str(r#"{"process":{"pid":"42"}}"#).expect("ConnectRequest");
        assert_eq!(sel.process, ProcessSelector::pid(42));
        let input: StreamInputRequest =
            serde_json::from_str(r#"{"data":{"input":{"pty":"aGk="}}}"#).expect("StreamInput");
        assert_eq!(
            input.data.and_then(|d| d.input.pty).as_deref(),
            Some("aGk=")
        );
        assert!(serde_json::from_str::<ConnectRequest>(r#"{"process":{"pid":-1}}"#).is_err());
    }
}
