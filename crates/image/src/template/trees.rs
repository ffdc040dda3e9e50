//! The trees a build stands on besides its step layers, each cached under
//! `cache/layers/<key>/tree` and made again when missing (`template prune` may take them,
//! nothing references them):
//!
//! - `scratch`: an empty tree, the base of `FROM scratch`;
//! - the agent alone (with the mount points and the root user it needs): the root RUN steps
//!   of a scratch stage boot on, under the stage's layers, so it is no part of the stage;
//! - registry images unpacked: with the agent for FROM (keyed by manifest and agent), without
//!   it for `COPY --from` (keyed by manifest);
//! - **flattened stacks**: overlayfs takes its layers as one mount option string, at most a
//!   page long (about 40 layers under `/var/lib/sandcell`), so once a stage's stack would
//!   come near that, its base and layers so far are flattened into one tree (keyed by the
//!   stage's key: it is what they hold) that stands for them in later mounts. The layers stay
//!   the stage's record; the cache keys do not change.

use super::fsops::{Mount, RootDir};
use super::{BuildEvent, Builder, MountDir, StageState, key_of, step_err};
use crate::build as image_build;
use crate::cache::unique;
use crate::digest::Digest;
use crate::unpack::Unpacker;
use crate::{Error, Result, valid_name};
use std::path::{Path, PathBuf};

/// Mount options kept under this many bytes: a page is 4096, and a RUN step's mount adds
/// the upper and work directories (and for a scratch stage the agent's tree) to the lowers.
const MOUNT_OPTIONS_BUDGET: usize = 3072;

impl Builder<'_> {
    /// `cache/layers/<key>/tree`, made by `make(tree)` if it is not there yet.
    fn cached_tree(
        &self,
        key: &str,
        what: &str,
        make: impl FnOnce(&Path) -> Result<()>,
    ) -> Result<PathBuf> {
        let tree = self.layers_dir.join(key).join("tree");
        if !tree.is_dir() {
            let pending = self.pending()?;
            let result = make(&pending.join("tree"));
            self.commit(&pending, key, result, what)?;
        }
        Ok(tree)
    }

    fn agent_digest(&self) -> Result<Digest> {
        let bytes =
            std::fs::read(&self.agent).map_err(Error::io("reading the agent", &self.agent))?;
        Ok(Digest::of(&bytes))
    }

    /// The empty base of `FROM scratch`, and its key.
    pub(super) fn scratch_tree(&self) -> Result<(PathBuf, String)> {
        let key = key_of(&["scratch"]);
        let tree = self.cached_tree(&key, "FROM scratch", |_| Ok(()))?;
        Ok((tree, key))
    }

    /// The agent, its mount points and a root-only `/etc/passwd` and `/etc/group` (the
    /// agent looks up the user it runs a command as; a stage's own files hide these): the
    /// bottom of a scratch stage's RUN root.
    pub(super) fn agent_tree(&self) -> Result<PathBuf> {
        let key = key_of(&["scratch-run-root", self.agent_digest()?.as_str()]);
        self.cached_tree(&key, "the agent", |tree| {
            let mut unpacker = Unpacker::new(tree, self.req.limits)?;
            image_build::add_sandcell_files(&mut unpacker, &self.agent)?;
            unpacker.finish()?;
            add_root_user(tree)
        })
    }

    /// A registry image pulled (the runner's pull options) and unpacked; with the agent for
    /// a FROM. Returns the tree, its key and the image.
    pub(super) fn pulled_tree(
        &self,
        reference: &str,
        with_agent: bool,
    ) -> Result<(PathBuf, String, crate::ResolvedImage)> {
        let image = self.runner.pull(reference)?;
        let key = if with_agent {
            key_of(&[
                "oci",
                image.manifest_digest.as_str(),
                self.agent_digest()?.as_str(),
            ])
        } else {
            key_of(&["oci-files", image.manifest_digest.as_str()])
        };
        let tree = self.cached_tree(&key, reference, |tree| {
            self.log.event(BuildEvent::Note(format!(
                "unpacking {reference} ({} layers)",
                image.layers.len()
            )));
            let cache = crate::cache::BlobCache::in_data_dir(&self.req.data_dir);
            let mut unpacker = Unpacker::new(tree, self.req.limits)?;
            for layer in &image.layers {
                let blob = cache.open(&layer.digest)?;
                unpacker.apply_layer(blob, layer.digest.short(), layer.diff_id.as_ref())?;
            }
            if with_agent {
                image_build::add_sandcell_files(&mut unpacker, &self.agent)?;
            }
            unpacker.finish()
        })?;
        Ok((tree, key, image))
    }

    /// The files of `COPY --from=<image>`: an installed image or template (its tree), or
    /// else a registry image (pulled and unpacked, without the agent).
    pub(super) fn image_tree(&self, reference: &str) -> Result<PathBuf> {
        let local = self.req.data_dir.join("images").join(reference);
        if valid_name(reference) && local.join("rootfs").is_dir() {
            return std::fs::canonicalize(local.join("rootfs"))
                .map_err(Error::io("resolving", local.join("rootfs")));
        }
        Ok(self.pulled_tree(reference, false)?.0)
    }

    /// A read-only view of the stage as built so far, unmounted when dropped.
    pub(super) fn view(&self, state: &StageState) -> Result<MountDir> {
        let target = self
            .layers_dir
            .join(format!(".view-{}-{}", std::process::id(), unique()));
        let mount = Mount::overlay(&state.lowers(), None, &target)?;
        Ok(MountDir(Some(mount), target))
    }

    /// In a stage that starts FROM scratch, a RUN's program must be in the stage (the agent
    /// alone is under it): `/bin/sh` for the shell form, `argv[0]` (on the PATH) for the exec
    /// form. Fails naming the step when it is not.
    pub(super) fn check_scratch_program(
        &self,
        state: &StageState,
        argv: &[String],
        text: &str,
        line: usize,
    ) -> Result<()> {
        let Some(program) = argv.first() else {
            return Err(step_err(line, format!("{text}: no command")));
        };
        let candidates: Vec<String> = if program.contains('/') {
            vec![super::absolute(state.workdir.as_deref(), program)]
        } else {
            let path = state.lookup("PATH").unwrap_or_default();
            path.split(':')
                .filter(|d| !d.is_empty())
                .map(|d| format!("{}/{program}", d.trim_end_matches('/')))
                .collect()
        };
        let view = self.view(state)?;
        let root = RootDir::open(&view.1)?;
        let found = candidates.iter().any(|c| {
            root.stat(&super::context::normalize(c))
                .is_ok_and(|m| m.is_file())
        });
        if found {
            return Ok(());
        }
        Err(step_err(
            line,
            format!(
                "{text}: this stage starts FROM scratch and has no {program} to run it (COPY a \
                 static shell or the program in first)"
            ),
        ))
    }

    /// Flattens the stage's stack into one tree when its mount options would come near a
    /// page (see the module doc).
    pub(super) fn flatten_if_deep(&self, state: &mut StageState) -> Result<()> {
        let lowers: usize = state.lowers().iter().map(|l| l.as_os_str().len() + 1).sum();
        // The upper and work dirs (`.tmp-PID-N/tree`, `/work`) and the agent's tree.
        let extra = 3 * (self.layers_dir.as_os_str().len() + 100) + 64;
        if lowers + extra <= MOUNT_OPTIONS_BUDGET {
            return Ok(());
        }
        let stack = state.stack();
        let key = key_of(&["flat", &state.key]);
        let tree = self.cached_tree(&key, "flattening the stage's layers", |tree| {
            self.log.event(BuildEvent::Note(format!(
                "flattening {} layers into one (overlayfs mount options are one page)",
                stack.len()
            )));
            let mut unpacker = Unpacker::new(tree, self.req.limits)?;
            super::apply_trees(&mut unpacker, &stack)?;
            unpacker.finish()
        })?;
        state.flat = Some((tree, state.layers.len()));
        Ok(())
    }
}

/// `/etc/passwd` and `/etc/group` with root alone, where `tree` has none: the agent looks up
/// the user of every command it starts, so a tree without them (a scratch one) could run
/// nothing.
pub(super) fn add_root_user(tree: &Path) -> Result<()> {
    for (name, content) in [
        ("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"),
        ("etc/group", "root:x:0:\n"),
    ] {
        let path = tree.join(name);
        if std::fs::symlink_metadata(&path).is_err() {
            std::fs::write(&path, content).map_err(Error::io("writing", &path))?;
        }
    }
    Ok(())
}
