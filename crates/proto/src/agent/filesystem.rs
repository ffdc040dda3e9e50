//! envd's `filesystem.Filesystem` service in protobuf's JSON mapping
//! (`spec/filesystem/filesystem.proto`). Unary calls take and answer `application/json`;
//! `WatchDir` is a server stream of [`WatchDirResponse`] envelopes.
//!
//! Output follows protojson: enums by name, `int64` as a decimal string, timestamps as RFC
//! 3339 strings in UTC.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::process::lenient;

pub const STAT_PATH: &str = "/filesystem.Filesystem/Stat";
pub const MAKE_DIR_PATH: &str = "/filesystem.Filesystem/MakeDir";
pub const MOVE_PATH: &str = "/filesystem.Filesystem/Move";
pub const LIST_DIR_PATH: &str = "/filesystem.Filesystem/ListDir";
pub const REMOVE_PATH: &str = "/filesystem.Filesystem/Remove";
pub const WATCH_DIR_PATH: &str = "/filesystem.Filesystem/WatchDir";
pub const CREATE_WATCHER_PATH: &str = "/filesystem.Filesystem/CreateWatcher";
pub const GET_WATCHER_EVENTS_PATH: &str = "/filesystem.Filesystem/GetWatcherEvents";
pub const REMOVE_WATCHER_PATH: &str = "/filesystem.Filesystem/RemoveWatcher";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileType {
    #[serde(rename = "FILE_TYPE_UNSPECIFIED")]
    Unspecified,
    #[serde(rename = "FILE_TYPE_FILE")]
    File,
    #[serde(rename = "FILE_TYPE_DIRECTORY")]
    Directory,
    #[serde(rename = "FILE_TYPE_SYMLINK")]
    Symlink,
}

/// envd's `EntryInfo` (the RPC one; `POST /files` answers the short [`super::EntryInfo`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EntryInfo {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: FileType,
    pub path: String,
    /// protojson writes `int64` as a string.
    #[serde(with = "int64_string")]
    pub size: i64,
    /// Permission bits only (Go's `FileMode.Perm()`), of the target for a symlink.
    pub mode: u32,
    /// Go's `FileMode.String()` of the entry itself: "-rw-r--r--", "drwxr-xr-x", "Lrwxrwxrwx".
    pub permissions: String,
    pub owner: String,
    pub group: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modified_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathRequest {
    #[serde(default)]
    pub path: String,
}

/// `StatRequest`, `MakeDirRequest`, `RemoveRequest`: `{path}`.
pub type StatRequest = PathRequest;
pub type MakeDirRequest = PathRequest;
pub type RemoveRequest = PathRequest;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveRequest {
    #[serde(default)]
    pub source: String,
    #[serde(default)]
    pub destination: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListDirRequest {
    #[serde(default)]
    pub path: String,
    #[serde(default, deserialize_with = "lenient::u32")]
    pub depth: u32,
}

/// `{entry}`: the answer of Stat, MakeDir and Move.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryResponse {
    pub entry: EntryInfo,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListDirResponse {
    #[serde(default)]
    pub entries: Vec<EntryInfo>,
}

/// `WatchDirRequest` and `CreateWatcherRequest`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchRequest {
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub recursive: bool,
    #[serde(default, alias = "include_entry")]
    pub include_entry: bool,
    #[serde(default, alias = "allow_network_mounts")]
    pub allow_network_mounts: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    #[serde(rename = "EVENT_TYPE_UNSPECIFIED")]
    Unspecified,
    #[serde(rename = "EVENT_TYPE_CREATE")]
    Create,
    #[serde(rename = "EVENT_TYPE_WRITE")]
    Write,
    #[serde(rename = "EVENT_TYPE_REMOVE")]
    Remove,
    #[serde(rename = "EVENT_TYPE_RENAME")]
    Rename,
    #[serde(rename = "EVENT_TYPE_CHMOD")]
    Chmod,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilesystemEvent {
    /// Relative to the watched directory.
    pub name: String,
    #[serde(rename = "type")]
    pub kind: EventType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<EntryInfo>,
}

/// One message of the WatchDir stream: a oneof of `start`, `filesystem`, `keepalive`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(clippy::large_enum_variant)] // one short-lived message at a time
pub enum WatchDirResponse {
    Start(Empty),
    Filesystem(FilesystemEvent),
    Keepalive(Empty),
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Empty {}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatcherIdMessage {
    #[serde(default, alias = "watcher_id")]
    pub watcher_id: String,
}

/// `CreateWatcherResponse`, `GetWatcherEventsRequest`, `RemoveWatcherRequest`: `{watcherId}`.
pub type CreateWatcherResponse = WatcherIdMessage;
pub type GetWatcherEventsRequest = WatcherIdMessage;
pub type RemoveWatcherRequest = WatcherIdMessage;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetWatcherEventsResponse {
    #[serde(default)]
    pub events: Vec<FilesystemEvent>,
}

mod int64_string {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(v: &i64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum NumOrStr {
            Num(i64),
            Str(String),
        }
        match NumOrStr::deserialize(d)? {
            NumOrStr::Num(n) => Ok(n),
            NumOrStr::Str(s) => s.parse().map_err(D::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_info_uses_protojson_shapes() {
        let entry = EntryInfo {
            name: "a".into(),
            kind: FileType::File,
            path: "/a".into(),
            size: 12,
            mode: 0o644,
            permissions: "-rw-r--r--".into(),
            owner: "root".into(),
            group: "root".into(),
            modified_time: Some("2026-01-02T03:04:05Z".into()),
            symlink_target: None,
            metadata: BTreeMap::new(),
        };
        let json = serde_json::to_string(&entry).expect("serialize");
        assert!(json.contains(r#""type":"FILE_TYPE_FILE""#), "{json}");
        assert!(json.contains(r#""size":"12""#), "{json}");
        assert!(
            json.contains(r#""modifiedTime":"2026-01-02T03:04:05Z""#),
            "{json}"
        );
        let back: EntryInfo = serde_json::from_str(&json).expect("round trip");
        assert_eq!(back, entry);
        let ev = WatchDirResponse::Filesystem(FilesystemEvent {
            name: "x".into(),
            kind: EventType::Create,
            entry: None,
        });
        assert_eq!(
            serde_json::to_string(&ev).expect("serialize"),
            r#"{"filesystem":{"name":"x","type":"EVENT_TYPE_CREATE"}}"#
        );
    }
}
