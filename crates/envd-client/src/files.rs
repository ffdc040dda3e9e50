//! Files: streamed out of the sandbox (`GET /files`), into it (`POST /files`), and the
//! `filesystem.Filesystem` calls `Stat`, `ListDir`, `MakeDir` and `Remove`.

use bytes::Bytes;
use futures_util::TryStreamExt;
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::Method;
use hyper::body::{Frame, Incoming};
use sandcell_proto::agent::filesystem::{
    self as fs, EntryResponse, ListDirRequest, ListDirResponse, PathRequest,
};
use sandcell_proto::agent::{self as wire, EntryInfo};
use tokio::io::AsyncRead;
use tokio_util::io::ReaderStream;

use crate::client::{EnvdClient, read_capped};
use crate::connect::Connector;
use crate::error::ClientError;

/// Chunk size of uploads.
const UPLOAD_CHUNK: usize = 64 * 1024;

impl<C: Connector> EnvdClient<C> {
    /// `/files?path=` (and the user's name, when calls are made as one).
    fn files_uri(&self, path: &str) -> String {
        let mut uri = format!("{}?path={}", wire::FILES_PATH, encode_query_value(path));
        if let Some(user) = self.user() {
            uri.push_str("&username=");
            uri.push_str(&encode_query_value(user));
        }
        uri
    }

    /// Streams the file at `path` out of the sandbox.
    pub async fn read_file(&self, path: &str) -> Result<FileStream, ClientError> {
        let req = self.request(
            Method::GET,
            &self.files_uri(path),
            None,
            Empty::<Bytes>::new(),
        )?;
        let resp = self.call("GET /files", req).await?;
        Ok(FileStream {
            body: resp.into_body(),
        })
    }

    /// Streams `contents` into the file at `path` (parents created, replaced atomically).
    /// A read error of `contents` breaks the upload: the agent never keeps a short file.
    pub async fn write_file<R>(
        &self,
        path: &str,
        contents: R,
    ) -> Result<Vec<EntryInfo>, ClientError>
    where
        R: AsyncRead + Unpin + Send + 'static,
    {
        let chunks = ReaderStream::with_capacity(contents, UPLOAD_CHUNK).map_ok(Frame::data);
        let req = self.request(
            Method::POST,
            &self.files_uri(path),
            Some("application/octet-stream"),
            StreamBody::new(chunks),
        )?;
        let resp = self.call("POST /files", req).await?;
        let reply = read_capped("POST /files", resp.into_body(), self.max_reply).await?;
        serde_json::from_slice(&reply).map_err(|e| ClientError::protocol("POST /files", e))
    }

    /// What is at `path`; `Ok(None)` when nothing is.
    pub async fn stat(&self, path: &str) -> Result<Option<fs::EntryInfo>, ClientError> {
        let message = PathRequest {
            path: path.to_owned(),
        };
        match self.unary("Stat", fs::STAT_PATH, &message).await {
            Ok(body) => serde_json::from_slice::<EntryResponse>(&body)
                .map(|r| Some(r.entry))
                .map_err(|e| ClientError::protocol("Stat", e)),
            Err(ClientError::Status { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The entries under the directory `path`, `depth` levels down (1: its children).
    pub async fn list_dir(
        &self,
        path: &str,
        depth: u32,
    ) -> Result<Vec<fs::EntryInfo>, ClientError> {
        let message = ListDirRequest {
            path: path.to_owned(),
            depth,
        };
        let body = self.unary("ListDir", fs::LIST_DIR_PATH, &message).await?;
        serde_json::from_slice::<ListDirResponse>(&body)
            .map(|r| r.entries)
            .map_err(|e| ClientError::protocol("ListDir", e))
    }

    /// Makes the directory `path` and its missing parents; an existing one is the agent's
    /// `already_exists` error ([`ClientError::Status`], 409).
    pub async fn make_dir(&self, path: &str) -> Result<fs::EntryInfo, ClientError> {
        let message = PathRequest {
            path: path.to_owned(),
        };
        let body = self.unary("MakeDir", fs::MAKE_DIR_PATH, &message).await?;
        serde_json::from_slice::<EntryResponse>(&body)
            .map(|r| r.entry)
            .map_err(|e| ClientError::protocol("MakeDir", e))
    }

    /// Removes the file or directory (with its contents) at `path`.
    pub async fn remove(&self, path: &str) -> Result<(), ClientError> {
        let message = PathRequest {
            path: path.to_owned(),
        };
        self.unary("Remove", fs::REMOVE_PATH, &message)
            .await
            .map(drop)
    }
}

/// A file's contents, as they come.
#[derive(Debug)]
pub struct FileStream {
    body: Incoming,
}

impl FileStream {
    /// The next chunk; `None` at the end.
    pub async fn next_chunk(&mut self) -> Option<Result<Bytes, ClientError>> {
        loop {
            match self.body.frame().await? {
                Err(source) => {
                    return Some(Err(ClientError::Body {
                        what: "GET /files".to_owned(),
                        source,
                    }));
                }
                Ok(frame) => {
                    if let Ok(data) = frame.into_data() {
                        return Some(Ok(data));
                    }
                }
            }
        }
    }

    /// The whole file, refusing more than `max` bytes.
    pub async fn to_vec(self, max: usize) -> Result<Vec<u8>, ClientError> {
        read_capped("GET /files", self.body, max)
            .await
            .map(|b| b.to_vec())
    }
}

/// Percent-encodes everything but unreserved characters and `/`.
fn encode_query_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_encoded() {
        assert_eq!(encode_query_value("/tmp/a b&c=d%"), "/tmp/a%20b%26c%3Dd%25");
        assert_eq!(encode_query_value("/ü"), "/%C3%BC");
    }

    #[test]
    fn files_name_the_user_when_calls_are_made_as_one() {
        let envd = EnvdClient::unix("/nonexistent.sock");
        assert_eq!(envd.files_uri("/a b"), "/files?path=/a%20b");
        let envd = envd.as_user(Some("us er".into()));
        assert_eq!(envd.files_uri("/x"), "/files?path=/x&username=us%20er");
    }
}
