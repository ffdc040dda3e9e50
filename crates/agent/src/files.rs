//! `GET /files?path=P` and `POST /files?path=P`: files streamed in both directions, never held
//! whole in memory. Uploads go to a temporary file next to the target, renamed into place when
//! complete, so a reader never sees half a file and an aborted upload leaves nothing behind.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use http_body_util::BodyExt;
use hyper::body::Incoming;
use sandcell_proto::agent::EntryInfo;
use tokio::fs::{File, OpenOptions};
use tokio::io::AsyncWriteExt;

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("the query has no path parameter")]
    MissingPath,
    #[error("the path parameter is not valid percent-encoded UTF-8")]
    BadPath,
    #[error("{0}: no such file")]
    NotFound(PathBuf),
    #[error("{0}: is a directory")]
    IsDir(PathBuf),
    #[error("{0}: has no file name")]
    NoFileName(PathBuf),
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("receiving the body for {path}: {source}")]
    Body { path: PathBuf, source: hyper::Error },
}

impl FileError {
    pub fn code(&self) -> &'static str {
        match self {
            FileError::MissingPath
            | FileError::BadPath
            | FileError::IsDir(_)
            | FileError::NoFileName(_) => "invalid_argument",
            FileError::NotFound(_) => "not_found",
            FileError::Io { source, .. } => match source.kind() {
                io::ErrorKind::NotFound => "not_found",
                io::ErrorKind::PermissionDenied => "permission_denied",
                _ => "internal",
            },
            FileError::Body { .. } => "internal",
        }
    }
}

/// The `path` query parameter, percent-decoded (`+` is a space, as in Go's `url.Query`), and
/// made absolute against `base`.
pub fn path_from_query(query: Option<&str>, base: &Path) -> Result<PathBuf, FileError> {
    let raw = query
        .unwrap_or("")
        .split('&')
        .find_map(|pair| pair.strip_prefix("path="))
        .ok_or(FileError::MissingPath)?;
    let decoded = percent_decode(raw).ok_or(FileError::BadPath)?;
    if decoded.is_empty() {
        return Err(FileError::MissingPath);
    }
    Ok(base.join(decoded))
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .filter(|h| h.iter().all(u8::is_ascii_hexdigit))?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> FileError + 'a {
    move |source| match source.kind() {
        io::ErrorKind::NotFound => FileError::NotFound(path.to_owned()),
        _ => FileError::Io {
            op,
            path: path.to_owned(),
            source,
        },
    }
}

/// Opens a regular file for streaming.
pub async fn open_for_read(path: &Path) -> Result<File, FileError> {
    let file = File::open(path).await.map_err(io_err("opening", path))?;
    let meta = file.metadata().await.map_err(io_err("stat", path))?;
    if meta.is_dir() {
        return Err(FileError::IsDir(path.to_owned()));
    }
    Ok(file)
}

static UPLOADS: AtomicU64 = AtomicU64::new(0);

/// Streams `body` into `path` (parents created), through a temporary file renamed into place.
pub async fn write(path: &Path, body: Incoming) -> Result<EntryInfo, FileError> {
    let name = path
        .file_name()
        .ok_or_else(|| FileError::NoFileName(path.to_owned()))?;
    let parent = path.parent().unwrap_or(Path::new("/"));
    if tokio::fs::metadata(path).await.is_ok_and(|m| m.is_dir()) {
        return Err(FileError::IsDir(path.to_owned()));
    }
    tokio::fs::create_dir_all(parent)
        .await
        .map_err(io_err("creating directory", parent))?;

    let n = UPLOADS.fetch_add(1, Ordering::Relaxed);
    let tmp = parent.join(format!(
        ".{}.sandcell-upload-{}-{n}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .await
        .map_err(io_err("creating", &tmp))?;
    let result = async {
        copy_body(file, body, &tmp, path).await?;
        tokio::fs::rename(&tmp, path)
            .await
            .map_err(io_err("renaming the upload to", path))
    }
    .await;
    if result.is_err() {
        // Best effort: the upload failed; a leftover temp file is only litter.
        let _ = tokio::fs::remove_file(&tmp).await;
    }
    result?;
    Ok(EntryInfo {
        name: name.to_string_lossy().into_owned(),
        kind: "file".to_owned(),
        path: path.to_string_lossy().into_owned(),
    })
}

async fn copy_body(
    mut file: File,
    mut body: Incoming,
    tmp: &Path,
    target: &Path,
) -> Result<(), FileError> {
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|source| FileError::Body {
            path: target.to_owned(),
            source,
        })?;
        if let Ok(data) = frame.into_data() {
            file.write_all(&data)
                .await
                .map_err(io_err("writing", tmp))?;
        }
    }
    // tokio's File finishes writes in the background: flush so errors surface here.
    file.flush().await.map_err(io_err("writing", tmp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_path_parameter() {
        let base = Path::new("/home/user");
        let got = path_from_query(Some("username=u&path=%2Ftmp%2Fa%20b+c.txt"), base).ok();
        assert_eq!(got, Some(PathBuf::from("/tmp/a b c.txt")));
        assert_eq!(
            path_from_query(Some("path=rel/x"), base).ok(),
            Some(PathBuf::from("/home/user/rel/x"))
        );
        assert!(matches!(
            path_from_query(Some("path=%zz"), base),
            Err(FileError::BadPath)
        ));
        assert!(matches!(
            path_from_query(Some("path=%2"), base),
            Err(FileError::BadPath)
        ));
        assert!(matches!(
            path_from_query(Some("path=%+1"), base),
            Err(FileError::BadPath)
        ));
        assert!(matches!(
            path_from_query(None, base),
            Err(FileError::MissingPath)
        ));
        assert!(matches!(
            path_from_query(Some("path="), base),
            Err(FileError::MissingPath)
        ));
    }
}
