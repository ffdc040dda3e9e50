//! Checkpoints of a running sandbox: named snapshots (`POST /sandboxes/{id}/snapshots`) and
//! fork (`POST /sandboxes/{id}/fork`: one checkpoint, `count` children restored from it by
//! restore.rs). See restore.rs's module docs for the semantics of both.

use super::restore::{RestoredNetwork, RestoredSpec};
use crate::sandboxes::error::SandboxError;
use crate::sandboxes::service::SandboxService;
use crate::snapshots::error::SnapshotError;
use crate::snapshots::pause::new_snapshot_id;
use crate::store::snapshots::{SnapshotPurpose, SnapshotRow};
use crate::store::{KeyRow, SandboxRow, State};
use crate::util::now_ms;
use sandcell_runtime::SnapshotHandle;
use std::sync::Arc;

/// Most children one fork makes (E2B: 1 to 100; its SDKs allow up to 20).
pub const MAX_FORK_COUNT: u32 = 100;
/// A fork's children's timeout when the request gives none (E2B's default).
pub const DEFAULT_FORK_TIMEOUT_SECS: u64 = 15;

/// Snapshot names: plain names of at most 128 characters that cannot be read as a snapshot
/// id ([`is_snapshot_id`]): `snap-nightly` is a name, `snap-` and 16 hex digits an id. So a
/// name and an id never share a spelling, and a lookup by either finds one snapshot.
pub fn valid_snapshot_name(name: &str) -> bool {
    crate::sandboxes::service::valid_template_name(name) && !is_snapshot_id(name)
}

/// Whether `s` has the form of the ids [`super::pause::new_snapshot_id`] makes.
pub fn is_snapshot_id(s: &str) -> bool {
    s.strip_prefix("snap-")
        .is_some_and(|hex| hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

impl SandboxService {
    /// Checkpoints running sandbox `row` into a new snapshot of `kind`; the sandbox keeps
    /// running (gvisor: restored in place). 404 when it is not running.
    pub(crate) async fn checkpoint(
        &self,
        row: &SandboxRow,
        kind: SnapshotPurpose,
        name: Option<String>,
    ) -> Result<(SnapshotRow, SnapshotHandle), SnapshotError> {
        let id = &row.id;
        let _op = self.ops.lock(id).await;
        let current = self.db.sandbox(id).await?;
        match current.map(|r| r.state) {
            Some(State::Running) => {}
            Some(State::Paused) => return Err(SnapshotError::Paused(id.clone())),
            _ => return Err(SnapshotError::SandboxNotFound(id.clone())),
        }
        let live = self
            .live(id)
            .ok_or_else(|| SnapshotError::SandboxNotFound(id.clone()))?;
        let snap_id = new_snapshot_id()?;
        let dir = self.snapshot_dir(&snap_id);
        let mut snap = SnapshotRow {
            id: snap_id.clone(),
            key_id: row.key_id.clone(),
            kind,
            name,
            source_id: id.clone(),
            template_id: row.template_id.clone(),
            dir: dir.to_string_lossy().into_owned(),
            handle: None,
            created_at: now_ms(),
            deleted_at: None,
        };
        // The parent is a user too: it runs on what was restored in place from it.
        self.db.insert_snapshot(&snap, &[id]).await?;
        let runtime_kind = match kind {
            SnapshotPurpose::Fork => sandcell_runtime::SnapshotKind::Fork,
            SnapshotPurpose::Named | SnapshotPurpose::Pause | SnapshotPurpose::Template => {
                sandcell_runtime::SnapshotKind::Full
            }
        };
        let taken = live.sandbox.snapshot(&dir, runtime_kind).await;
        // Restored in place: a new host process, a new handle for a restarted daemon.
        let sandbox_handle = live
            .sandbox
            .handle()
            .and_then(|h| serde_json::to_string(&h).ok());
        self.db.set_handle(id, sandbox_handle.as_deref()).await?;
        match taken {
            Ok(handle) => {
                let json = serde_json::to_string(&handle).map_err(SnapshotError::Encode)?;
                self.db.set_snapshot_handle(&snap_id, &json).await?;
                snap.handle = Some(json);
                Ok((snap, handle))
            }
            Err(e) => {
                self.db.discard_snapshot(&snap_id, now_ms()).await?;
                self.collect_snapshots().await;
                Err(e.into())
            }
        }
    }

    /// `POST /sandboxes/{id}/snapshots`.
    pub async fn snapshot_named(
        &self,
        row: &SandboxRow,
        name: Option<String>,
    ) -> Result<SnapshotRow, SnapshotError> {
        if let Some(name) = &name {
            if !valid_snapshot_name(name) {
                return Err(SnapshotError::InvalidName(name.clone()));
            }
            if self.dirs.images().join(name).exists() {
                return Err(SnapshotError::NameOfTemplate(name.clone()));
            }
        }
        let (snap, _) = self.checkpoint(row, SnapshotPurpose::Named, name).await?;
        // A snapshot of the same name before it is replaced: maybe unused now.
        self.collect_snapshots().await;
        Ok(snap)
    }

    /// `POST /sandboxes/{id}/fork`: one result per child, in order (each child succeeds or
    /// fails on its own).
    pub async fn fork(
        self: &Arc<Self>,
        key: &KeyRow,
        parent: &SandboxRow,
        count: u32,
        timeout: u64,
    ) -> Result<Vec<Result<SandboxRow, SandboxError>>, SnapshotError> {
        self.check_timeout(timeout)?;
        if !(1..=MAX_FORK_COUNT).contains(&count) {
            return Err(SnapshotError::ForkCount(count));
        }
        let (snap, handle) = self.checkpoint(parent, SnapshotPurpose::Fork, None).await?;
        let parent_life = self.db.sandbox_lifecycle(&parent.id).await?;
        // Children pause at their timeout as the parent does, and auto-resume if it does,
        // with a wake timeout from the fork's own timeout.
        let auto_resume = parent_life
            .auto_resume
            .map(|_| self.auto_resume_timeout(timeout));
        let mut results = Vec::with_capacity(count as usize);
        // One after the other: the gvisor runtime restores one at a time anyway.
        for _ in 0..count {
            let spec = RestoredSpec {
                template_id: parent.template_id.clone(),
                metadata: parent.metadata.clone(),
                env: handle.env.clone(),
                secure: parent.secure,
                timeout,
                auto_pause: parent_life.auto_pause,
                auto_resume,
                auto_pause_files_only: parent_life.auto_pause_files_only,
                parent_id: Some(parent.id.clone()),
                network: RestoredNetwork::Of(parent.id.clone()),
            };
            results.push(self.create_restored(key, spec, &snap, &handle).await);
        }
        Ok(results)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ids_never_share_a_spelling() {
        for name in [
            "snap-nightly",
            "nightly",
            "snap-",
            "snap-0123456789abcde",
            "a.b_c-d",
        ] {
            assert!(valid_snapshot_name(name), "{name} is a name E2B users pick");
        }
        let id = crate::snapshots::pause::new_snapshot_id().unwrap();
        assert!(is_snapshot_id(&id));
        assert!(!valid_snapshot_name(&id), "an id's form is not a name");
        for bad in [
            "",
            ".hidden",
            "a/b",
            "..",
            "snap-0123456789abcdef",
            &"x".repeat(129),
        ] {
            assert!(!valid_snapshot_name(bad), "{bad:?}");
        }
    }
}
