//! Directory watches over inotify, shaped after envd's fsnotify use: `WatchDir` (a server
//! stream) and `CreateWatcher`/`GetWatcherEvents`/`RemoveWatcher` (polled). Recursive watches
//! add a watch for every directory under the root, including directories created later.
//!
//! Event mapping (fsnotify's): IN_CREATE/IN_MOVED_TO -> CREATE, IN_MOVED_FROM/IN_MOVE_SELF ->
//! RENAME, IN_ATTRIB -> CHMOD, IN_MODIFY -> WRITE, IN_DELETE/IN_DELETE_SELF -> REMOVE; one
//! inotify event can yield several, in that order. Names are relative to the watched root.
//!
//! Bounds: the kernel queue (IN_Q_OVERFLOW ends the watch with an error, as fsnotify does), a
//! polled watcher keeps at most [`MAX_PENDING`] undelivered events (more end it with an
//! error), and a stream waits for its client (backpressure).

use sandcell_proto::sync::lock;
use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::Request;
use hyper::body::Incoming;
use sandcell_proto::agent::ConnectError;
use sandcell_proto::agent::filesystem::{
    CreateWatcherResponse, Empty, EventType, FilesystemEvent, GetWatcherEventsRequest,
    GetWatcherEventsResponse, RemoveWatcherRequest, WatchDirResponse, WatchRequest,
};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};

use crate::body::ChannelBody;
use crate::connect::{
    self, ApiError, Reply, empty_reply, end_of_stream, envelope_of, json_reply, stream_error,
    stream_reply,
};
use crate::fs_api::entry_info;
use crate::server::State;
use crate::users::Names;

/// Undelivered events a polled watcher keeps.
pub const MAX_PENDING: usize = 10_000;
/// Polled watchers alive at once.
const MAX_WATCHERS: usize = 1024;
/// Directories one recursive watch covers (inotify watches cost kernel memory).
const MAX_DIRS: usize = 65_536;

const MASK: u32 = libc::IN_CREATE
    | libc::IN_MOVED_TO
    | libc::IN_MOVED_FROM
    | libc::IN_MODIFY
    | libc::IN_DELETE
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_ATTRIB;

/// Filesystem magic numbers (linux/magic.h) of network and FUSE mounts, which envd refuses to
/// watch unless `allowNetworkMounts`.
const NETWORK_MAGICS: [i64; 5] = [0x6969, 0xFF53_4D42, 0x517B, 0xFE53_4D42, 0x6573_5546];

/// One inotify instance watching a tree.
#[derive(Debug)]
pub struct Inotify {
    fd: AsyncFd<OwnedFd>,
    root: PathBuf,
    recursive: bool,
    /// Watch descriptor to the directory's path relative to the root ("" for the root).
    dirs: HashMap<i32, PathBuf>,
    buf: Vec<u8>,
}

impl Inotify {
    pub fn new(root: &Path, recursive: bool) -> io::Result<Self> {
        // SAFETY: inotify_init1 takes flags only.
        let raw = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut this = Inotify {
            fd: crate::pty::async_fd(fd)?,
            root: root.to_owned(),
            recursive,
            dirs: HashMap::new(),
            buf: vec![0u8; 64 * 1024],
        };
        this.add(PathBuf::new())?;
        if recursive {
            this.add_tree(PathBuf::new());
        }
        Ok(this)
    }

    fn add(&mut self, rel: PathBuf) -> io::Result<()> {
        if self.dirs.len() >= MAX_DIRS {
            return Err(io::Error::other(format!(
                "more than {MAX_DIRS} directories to watch"
            )));
        }
        let full = self.root.join(&rel);
        let c = CString::new(full.as_os_str().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: a NUL-terminated path, on our inotify descriptor.
        let wd = unsafe { libc::inotify_add_watch(self.fd.as_raw_fd(), c.as_ptr(), MASK) };
        if wd < 0 {
            return Err(io::Error::last_os_error());
        }
        self.dirs.insert(wd, rel);
        Ok(())
    }

    /// Watches every directory under `rel` (best effort: a directory that vanishes or cannot
    /// be read is skipped).
    fn add_tree(&mut self, rel: PathBuf) {
        let Ok(read) = std::fs::read_dir(self.root.join(&rel)) else {
            return;
        };
        for entry in read.filter_map(Result::ok) {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                let child = rel.join(entry.file_name());
                if self.add(child.clone()).is_ok() {
                    self.add_tree(child);
                }
            }
        }
    }

    /// The next batch of events as (relative name, type) pairs.
    pub async fn next(&mut self) -> io::Result<Vec<(String, EventType)>> {
        loop {
            let mut guard = self.fd.readable().await?;
            let buf = &mut self.buf;
            let read = guard.try_io(|fd| {
                // SAFETY: reading into the live buffer of `buf.len()` bytes.
                let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            let n = match read {
                Ok(r) => r?,
                Err(_would_block) => continue,
            };
            let events = self.parse(n)?;
            if !events.is_empty() {
                return Ok(events);
            }
        }
    }

    fn parse(&mut self, len: usize) -> io::Result<Vec<(String, EventType)>> {
        const HEADER: usize = std::mem::size_of::<libc::inotify_event>();
        let mut out = Vec::new();
        let mut off = 0;
        while off + HEADER <= len {
            // SAFETY: the kernel wrote whole events; read_unaligned copes with the byte buffer.
            let ev: libc::inotify_event =
                unsafe { std::ptr::read_unaligned(self.buf[off..].as_ptr().cast()) };
            let name_end = (off + HEADER + ev.len as usize).min(len);
            let raw_name = &self.buf[off + HEADER..name_end];
            let name_bytes = raw_name.split(|b| *b == 0).next().unwrap_or(&[]);
            off = name_end;
            if ev.mask & libc::IN_Q_OVERFLOW != 0 {
                return Err(io::Error::other("inotify event queue overflowed"));
            }
            if ev.mask & libc::IN_IGNORED != 0 {
                self.dirs.remove(&ev.wd);
                continue;
            }
            let Some(dir) = self.dirs.get(&ev.wd).cloned() else {
                continue;
            };
            let rel = if name_bytes.is_empty() {
                // A *_SELF event: only the root's are reported (a subdirectory's removal
                // was already reported by its parent).
                if !dir.as_os_str().is_empty() {
                    continue;
                }
                PathBuf::from(".")
            } else {
                dir.join(std::ffi::OsStr::from_bytes(name_bytes))
            };
            let is_dir = ev.mask & libc::IN_ISDIR != 0;
            if self.recursive
                && is_dir
                && ev.mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0
                && self.add(rel.clone()).is_ok()
            {
                self.add_tree(rel.clone());
            }
            let name = rel.to_string_lossy().into_owned();
            for (bits, kind) in [
                (libc::IN_CREATE | libc::IN_MOVED_TO, EventType::Create),
                (libc::IN_MOVED_FROM | libc::IN_MOVE_SELF, EventType::Rename),
                (libc::IN_ATTRIB, EventType::Chmod),
                (libc::IN_MODIFY, EventType::Write),
                (libc::IN_DELETE | libc::IN_DELETE_SELF, EventType::Remove),
            ] {
                if ev.mask & bits != 0 {
                    out.push((name.clone(), kind));
                }
            }
        }
        Ok(out)
    }
}

fn is_network_mount(path: &Path) -> io::Result<bool> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: statfs fills the zeroed struct we pass; the path is NUL-terminated.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between libcs
    let magic = st.f_type as i64;
    Ok(NETWORK_MAGICS.contains(&magic))
}

/// Validates a watch request and opens the watch (envd's checks and codes).
fn open_watch(
    state: &State,
    req_user: &crate::users::User,
    msg: &WatchRequest,
) -> Result<(Inotify, PathBuf), ApiError> {
    let root = state
        .shared
        .resolve(&msg.path, req_user)
        .map_err(ApiError::invalid)?;
    match std::fs::metadata(&root) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(ApiError::invalid(format!(
                "path {} not a directory",
                root.display()
            )));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(ApiError::new(
                "not_found",
                format!("path {} not found: {e}", root.display()),
            ));
        }
        Err(e) => {
            return Err(ApiError::new(
                "internal",
                format!("error statting path {}: {e}", root.display()),
            ));
        }
    }
    if !msg.allow_network_mounts {
        let network = is_network_mount(&root)
            .map_err(|e| ApiError::new("internal", format!("error checking mount status: {e}")))?;
        if network {
            return Err(ApiError::invalid(format!(
                "cannot watch path on network filesystem: {}",
                root.display()
            )));
        }
    }
    let inotify = Inotify::new(&root, msg.recursive).map_err(|e| {
        ApiError::new(
            "internal",
            format!("error adding path {} to watcher: {e}", root.display()),
        )
    })?;
    Ok((inotify, root))
}

fn to_events(
    batch: Vec<(String, EventType)>,
    root: &Path,
    include_entry: bool,
    names: &Names,
) -> Vec<FilesystemEvent> {
    batch
        .into_iter()
        .map(|(name, kind)| {
            // Only events whose entry still exists at the path carry it (envd).
            let carries = matches!(
                kind,
                EventType::Create | EventType::Write | EventType::Chmod
            );
            let entry = (include_entry && carries)
                .then(|| entry_info(&root.join(&name), names).ok())
                .flatten();
            FilesystemEvent { name, kind, entry }
        })
        .collect()
}

fn names_of(state: &State) -> Names {
    state
        .shared
        .users
        .snapshot()
        .map(|s| s.names())
        .unwrap_or_default()
}

pub async fn watch_dir(state: &State, req: Request<Incoming>) -> Reply {
    let user = state.shared.rpc_user(&req);
    let keepalive = connect::keepalive_of(&req).unwrap_or(state.config.keepalive);
    let msg: WatchRequest =
        connect::stream_request(req, state.config.max_json_body, "WatchDirRequest").await?;
    let opened = user.and_then(|u| open_watch(state, &u, &msg));
    let (inotify, root) = match opened {
        Ok(w) => w,
        Err(e) => return stream_error(e),
    };
    let names = names_of(state);
    let (tx, rx) = mpsc::channel(8);
    tokio::spawn(stream_watch(
        inotify,
        root,
        msg.include_entry,
        names,
        tx,
        keepalive,
    ));
    stream_reply(ChannelBody::new(rx).boxed_unsync())
}

async fn stream_watch(
    mut inotify: Inotify,
    root: PathBuf,
    include_entry: bool,
    names: Names,
    tx: mpsc::Sender<bytes::Bytes>,
    keepalive: Duration,
) {
    let message = |m: WatchDirResponse| envelope_of(0, &m);
    if tx
        .send(message(WatchDirResponse::Start(Empty {})))
        .await
        .is_err()
    {
        return;
    }
    let mut ticker = tokio::time::interval_at(Instant::now() + keepalive, keepalive);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            batch = inotify.next() => match batch {
                Ok(batch) => {
                    for ev in to_events(batch, &root, include_entry, &names) {
                        if tx.send(message(WatchDirResponse::Filesystem(ev))).await.is_err() {
                            return;
                        }
                    }
                    ticker.reset();
                }
                Err(e) => {
                    let _ = tx.send(end_of_stream(Some(ConnectError {
                        code: "internal".to_owned(),
                        message: format!("watcher error: {e}"),
                    }))).await;
                    return;
                }
            },
            _ = ticker.tick() => {
                if tx.send(message(WatchDirResponse::Keepalive(Empty {}))).await.is_err() {
                    return;
                }
            }
            () = tx.closed() => return, // the client left
        }
    }
}

/// A polled watcher: its events (or its error) wait for `GetWatcherEvents`.
#[derive(Debug, Default)]
struct Pending {
    events: Vec<FilesystemEvent>,
    error: Option<String>,
}

#[derive(Debug)]
struct PolledWatcher {
    pending: Arc<Mutex<Pending>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Debug, Default)]
pub struct Watchers {
    map: Mutex<HashMap<String, PolledWatcher>>,
    /// Ids made while the kernel had no entropy to give (see [`Watchers::new_id`]).
    fallback_ids: std::sync::atomic::AtomicU64,
}

impl Watchers {
    /// A fresh watcher id: random, or, while getrandom fails, a counter (no entropy yet is
    /// no reason to fail: ids only need to be unique in this agent).
    fn new_id(&self) -> String {
        let mut bytes = [0u8; 10];
        if sandcell_proto::random::fill(&mut bytes).is_err() {
            let c = self
                .fallback_ids
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            bytes[..8].copy_from_slice(&c.to_le_bytes());
        }
        sandcell_proto::random::to_hex(&bytes)
    }
}

pub async fn create_watcher(state: &State, req: Request<Incoming>) -> Reply {
    let user = state.shared.rpc_user(&req)?;
    let msg: WatchRequest =
        connect::unary(req, state.config.max_json_body, "CreateWatcherRequest").await?;
    let (mut inotify, root) = open_watch(state, &user, &msg)?;
    if lock(&state.watchers.map).len() >= MAX_WATCHERS {
        return Err(ApiError::new(
            "resource_exhausted",
            format!("more than {MAX_WATCHERS} watchers"),
        ));
    }
    let names = names_of(state);
    let pending = Arc::new(Mutex::new(Pending::default()));
    let sink = pending.clone();
    let include_entry = msg.include_entry;
    let task = tokio::spawn(async move {
        loop {
            match inotify.next().await {
                Ok(batch) => {
                    let events = to_events(batch, &root, include_entry, &names);
                    let mut p = lock(&sink);
                    if p.events.len() + events.len() > MAX_PENDING {
                        p.error = Some(format!(
                            "watcher error: more than {MAX_PENDING} events not collected"
                        ));
                        return;
                    }
                    p.events.extend(events);
                }
                Err(e) => {
                    lock(&sink).error = Some(format!("watcher error: {e}"));
                    return;
                }
            }
        }
    });
    let id = format!("w{}", state.watchers.new_id());
    lock(&state.watchers.map).insert(id.clone(), PolledWatcher { pending, task });
    json_reply(&CreateWatcherResponse { watcher_id: id })
}

pub async fn get_watcher_events(state: &State, req: Request<Incoming>) -> Reply {
    let msg: GetWatcherEventsRequest =
        connect::unary(req, state.config.max_json_body, "GetWatcherEventsRequest").await?;
    let pending = lock(&state.watchers.map)
        .get(&msg.watcher_id)
        .map(|w| w.pending.clone())
        .ok_or_else(|| {
            ApiError::new(
                "not_found",
                format!("watcher with id {} not found", msg.watcher_id),
            )
        })?;
    let mut p = lock(&pending);
    if let Some(e) = &p.error {
        return Err(ApiError::new("internal", e.clone()));
    }
    let events = std::mem::take(&mut p.events);
    drop(p);
    json_reply(&GetWatcherEventsResponse { events })
}

pub async fn remove_watcher(state: &State, req: Request<Incoming>) -> Reply {
    let msg: RemoveWatcherRequest =
        connect::unary(req, state.config.max_json_body, "RemoveWatcherRequest").await?;
    let removed = lock(&state.watchers.map).remove(&msg.watcher_id);
    match removed {
        // Aborting the task drops the inotify descriptor.
        Some(w) => w.task.abort(),
        None => {
            return Err(ApiError::new(
                "not_found",
                format!("watcher with id {} not found", msg.watcher_id),
            ));
        }
    }
    empty_reply()
}
