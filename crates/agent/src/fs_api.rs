//! Handlers of envd's `filesystem.Filesystem` unary calls (Stat, MakeDir, Move, ListDir,
//! Remove) and the `EntryInfo` they answer with, built the way envd builds it from Go's
//! `os.Lstat`. Filesystem work runs on tokio's blocking pool.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use hyper::Request;
use hyper::body::Incoming;
use sandcell_proto::agent::filesystem::{
    EntryInfo, EntryResponse, FileType, ListDirRequest, ListDirResponse, MakeDirRequest,
    MoveRequest, RemoveRequest, StatRequest,
};

use crate::connect::{self, ApiError, Reply, empty_reply, json_reply};
use crate::metadata;
use crate::server::State;
use crate::users::{Names, User};

/// Most entries one ListDir answers; deeper or wider trees are refused, not truncated.
const MAX_LIST_ENTRIES: usize = 100_000;

/// Runs filesystem work off the (single-threaded) async runtime.
pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::new("internal", format!("filesystem task failed: {e}")))?
}

/// Go's `FileMode.String()` for a Unix `st_mode`: type letters (`d`, `L`, `D`, `p`, `S`, `u`,
/// `g`, `c`, `t`) or `-`, then `rwxrwxrwx`.
pub fn go_mode_string(st_mode: u32) -> String {
    let fmt = st_mode & libc::S_IFMT;
    let mut s = String::new();
    if fmt == libc::S_IFDIR {
        s.push('d');
    }
    if fmt == libc::S_IFLNK {
        s.push('L');
    }
    if fmt == libc::S_IFBLK || fmt == libc::S_IFCHR {
        s.push('D');
    }
    if fmt == libc::S_IFIFO {
        s.push('p');
    }
    if fmt == libc::S_IFSOCK {
        s.push('S');
    }
    if st_mode & libc::S_ISUID != 0 {
        s.push('u');
    }
    if st_mode & libc::S_ISGID != 0 {
        s.push('g');
    }
    if fmt == libc::S_IFCHR {
        s.push('c');
    }
    if st_mode & libc::S_ISVTX != 0 {
        s.push('t');
    }
    if s.is_empty() {
        s.push('-');
    }
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if st_mode & (1 << (8 - i)) != 0 {
            c
        } else {
            '-'
        });
    }
    s
}

fn file_type(meta: &std::fs::Metadata) -> FileType {
    let ft = meta.file_type();
    if ft.is_file() {
        FileType::File
    } else if ft.is_dir() {
        FileType::Directory
    } else if ft.is_symlink() {
        FileType::Symlink
    } else {
        FileType::Unspecified
    }
}

/// envd's EntryInfo of `path` (not following a final symlink, but typed by its target).
pub fn entry_info(path: &Path, names: &Names) -> io::Result<EntryInfo> {
    let meta = std::fs::symlink_metadata(path)?;
    let (kind, mode, symlink_target) = if meta.file_type().is_symlink() {
        // envd: EvalSymlinks, falling back to the path itself when it cannot be resolved.
        let target = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
        match std::fs::metadata(&target) {
            Ok(t) => (file_type(&t), t.mode() & 0o777, Some(target)),
            Err(_) => (FileType::Unspecified, 0, Some(target)),
        }
    } else {
        (file_type(&meta), meta.mode() & 0o777, None)
    };
    let name = path.file_name().map_or_else(
        || path.to_string_lossy().into_owned(),
        |n| n.to_string_lossy().into_owned(),
    );
    let nanos = u32::try_from(meta.mtime_nsec()).unwrap_or(0);
    Ok(EntryInfo {
        name,
        kind,
        path: path.to_string_lossy().into_owned(),
        size: meta.size() as i64,
        mode,
        permissions: go_mode_string(meta.mode()),
        owner: names.owner(meta.uid()),
        group: names.group(meta.gid()),
        modified_time: Some(sandcell_proto::time::format_nanos(meta.mtime(), nanos)),
        symlink_target: symlink_target.map(|t| t.to_string_lossy().into_owned()),
        metadata: metadata::read(path).unwrap_or_else(|_| BTreeMap::new()),
    })
}

fn entry_error(path: &Path, e: io::Error) -> ApiError {
    if e.kind() == io::ErrorKind::NotFound {
        ApiError::new(
            "not_found",
            format!("file not found: {}: {e}", path.display()),
        )
    } else {
        ApiError::new(
            "internal",
            format!("error getting file info: {}: {e}", path.display()),
        )
    }
}

/// Creates the missing directories of `path` (mode 0755) owned by the user, like envd's
/// `EnsureDirs`. Fails when a component exists and is not a directory.
pub fn ensure_dirs(path: &Path, uid: u32, gid: u32) -> io::Result<()> {
    let mut partial = PathBuf::new();
    for component in path.components() {
        partial.push(component);
        match std::fs::metadata(&partial) {
            Ok(m) if m.is_dir() => continue,
            Ok(_) => {
                return Err(io::Error::other(format!(
                    "path is a file: {}",
                    partial.display()
                )));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                match std::fs::DirBuilder::new().mode(0o755).create(&partial) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(e),
                }
                std::os::unix::fs::chown(&partial, Some(uid), Some(gid))?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

struct Ctx {
    user: User,
    names: Names,
}

fn context(state: &State, req: &Request<Incoming>) -> Result<Ctx, ApiError> {
    let user = state.shared.rpc_user(req)?;
    let names = state
        .shared
        .users
        .snapshot()
        .map(|s| s.names())
        .unwrap_or_default();
    Ok(Ctx { user, names })
}

fn resolve(state: &State, path: &str, user: &User) -> Result<PathBuf, ApiError> {
    state.shared.resolve(path, user).map_err(ApiError::invalid)
}

pub async fn stat(state: &State, req: Request<Incoming>) -> Reply {
    let ctx = context(state, &req)?;
    let msg: StatRequest = connect::unary(req, state.config.max_json_body, "StatRequest").await?;
    let path = resolve(state, &msg.path, &ctx.user)?;
    let entry =
        blocking(move || entry_info(&path, &ctx.names).map_err(|e| entry_error(&path, e))).await?;
    json_reply(&EntryResponse { entry })
}

pub async fn make_dir(state: &State, req: Request<Incoming>) -> Reply {
    let ctx = context(state, &req)?;
    let msg: MakeDirRequest =
        connect::unary(req, state.config.max_json_body, "MakeDirRequest").await?;
    let path = resolve(state, &msg.path, &ctx.user)?;
    let entry = blocking(move || {
        match std::fs::metadata(&path) {
            Ok(m) if m.is_dir() => {
                return Err(ApiError::new(
                    "already_exists",
                    format!("directory already exists: {}", path.display()),
                ));
            }
            Ok(_) => {
                return Err(ApiError::invalid(format!(
                    "path already exists but it is not a directory: {}",
                    path.display()
                )));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(ApiError::new(
                    "internal",
                    format!("error getting file info: {e}"),
                ));
            }
        }
        ensure_dirs(&path, ctx.user.uid, ctx.user.gid)
            .map_err(|e| ApiError::new("internal", format!("{}: {e}", path.display())))?;
        entry_info(&path, &ctx.names).map_err(|e| entry_error(&path, e))
    })
    .await?;
    json_reply(&EntryResponse { entry })
}

pub async fn rename(state: &State, req: Request<Incoming>) -> Reply {
    let ctx = context(state, &req)?;
    let msg: MoveRequest = connect::unary(req, state.config.max_json_body, "MoveRequest").await?;
    let source = resolve(state, &msg.source, &ctx.user)?;
    let destination = resolve(state, &msg.destination, &ctx.user)?;
    let entry = blocking(move || {
        if let Some(parent) = destination.parent() {
            ensure_dirs(parent, ctx.user.uid, ctx.user.gid)
                .map_err(|e| ApiError::new("internal", format!("{}: {e}", parent.display())))?;
        }
        std::fs::rename(&source, &destination).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                ApiError::new(
                    "not_found",
                    format!("source file not found: {}: {e}", source.display()),
                )
            } else {
                ApiError::new("internal", format!("error renaming: {e}"))
            }
        })?;
        entry_info(&destination, &ctx.names).map_err(|e| entry_error(&destination, e))
    })
    .await?;
    json_reply(&EntryResponse { entry })
}

pub async fn list_dir(state: &State, req: Request<Incoming>) -> Reply {
    let ctx = context(state, &req)?;
    let msg: ListDirRequest =
        connect::unary(req, state.config.max_json_body, "ListDirRequest").await?;
    let depth = if msg.depth == 0 {
        1
    } else {
        msg.depth as usize
    };
    let requested = resolve(state, &msg.path, &ctx.user)?;
    let entries = blocking(move || {
        let resolved = std::fs::canonicalize(&requested).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                ApiError::new("not_found", format!("path not found: {e}"))
            } else if e.raw_os_error() == Some(libc::ELOOP) {
                ApiError::new(
                    "failed_precondition",
                    format!("cyclic symlink or chain >255 links at {:?}", requested),
                )
            } else {
                ApiError::new("internal", format!("error resolving symlink: {e}"))
            }
        })?;
        if !resolved.is_dir() {
            return Err(ApiError::invalid(format!(
                "path is not a directory: {}",
                resolved.display()
            )));
        }
        let mut entries = Vec::new();
        walk(&requested, &resolved, depth, &ctx.names, &mut entries)?;
        Ok(entries)
    })
    .await?;
    json_reply(&ListDirResponse { entries })
}

/// Depth-first, names sorted, symlinks not followed (Go's `filepath.WalkDir`); entries carry
/// the requested path, not the symlink-resolved one.
fn walk(
    shown: &Path,
    real: &Path,
    depth: usize,
    names: &Names,
    out: &mut Vec<EntryInfo>,
) -> Result<(), ApiError> {
    let read_err = |e: io::Error| {
        ApiError::new(
            "internal",
            format!("error reading directory {}: {e}", real.display()),
        )
    };
    let mut children: Vec<_> = std::fs::read_dir(real)
        .map_err(read_err)?
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .collect();
    children.sort();
    for child in children {
        let real_child = real.join(&child);
        let mut entry = match entry_info(&real_child, names) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue, // gone meanwhile
            Err(e) => return Err(read_err(e)),
        };
        let shown_child = shown.join(&child);
        entry.path = shown_child.to_string_lossy().into_owned();
        if out.len() >= MAX_LIST_ENTRIES {
            return Err(ApiError::new(
                "resource_exhausted",
                format!(
                    "more than {MAX_LIST_ENTRIES} entries under {}",
                    shown.display()
                ),
            ));
        }
        out.push(entry);
        let is_dir = std::fs::symlink_metadata(&real_child).is_ok_and(|m| m.is_dir());
        if is_dir && depth > 1 {
            walk(&shown_child, &real_child, depth - 1, names, out)?;
        }
    }
    Ok(())
}

pub async fn remove(state: &State, req: Request<Incoming>) -> Reply {
    let ctx = context(state, &req)?;
    let msg: RemoveRequest =
        connect::unary(req, state.config.max_json_body, "RemoveRequest").await?;
    let path = resolve(state, &msg.path, &ctx.user)?;
    blocking(move || {
        // envd uses os.RemoveAll: a missing path is not an error.
        let result = match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&path),
            Ok(_) => std::fs::remove_file(&path),
            Err(e) => Err(e),
        };
        match result {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(ApiError::new(
                "internal",
                format!("error removing file or directory: {}: {e}", path.display()),
            )),
            _ => Ok(()),
        }
    })
    .await?;
    empty_reply()
}

#[cfg(test)]
mod tests {
    use super::go_mode_string;

    #[test]
    fn mode_strings_match_go() {
        assert_eq!(go_mode_string(libc::S_IFREG | 0o644), "-rw-r--r--");
        assert_eq!(go_mode_string(libc::S_IFDIR | 0o755), "drwxr-xr-x");
        assert_eq!(go_mode_string(libc::S_IFLNK | 0o777), "Lrwxrwxrwx");
        assert_eq!(
            go_mode_string(libc::S_IFDIR | libc::S_ISVTX | 0o777),
            "dtrwxrwxrwx"
        );
        assert_eq!(go_mode_string(libc::S_IFCHR | 0o666), "Dcrw-rw-rw-");
        assert_eq!(
            go_mode_string(libc::S_IFREG | libc::S_ISUID | 0o755),
            "urwxr-xr-x"
        );
    }
}
