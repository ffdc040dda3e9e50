//! The sandbox's default environment as a file (`--env-file`, `/run/sandcell/env.json` in
//! sandboxes): `/init` rewrites it, so that a process started before the last `/init` (the
//! start command of a template restored from its memory snapshot, such as the code
//! interpreter's server) can pick up the env vars of the create it now serves. It holds what
//! every process the agent starts gets anyway, so it is readable by every user of the guest.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Makes each temporary file's name unique within the agent.
static NEXT_TMP: AtomicU64 = AtomicU64::new(0);

/// Writes `env` to `path` as a JSON object, atomically (a reader sees the old file or the
/// new one, never a part). Failures are logged: the file is a convenience, not the contract.
/// Not synced: it describes this boot of the sandbox only (`/run`).
pub fn publish(path: &Path, env: &BTreeMap<String, String>) {
    if let Err(e) = write(path, env) {
        crate::log!("writing {}: {e}", path.display());
    }
}

fn write(path: &Path, env: &BTreeMap<String, String>) -> std::io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other("the env file has no directory"))?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    let bytes = serde_json::to_vec(env).map_err(std::io::Error::other)?;
    let n = NEXT_TMP.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".env.json.{}.{n}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&tmp)?;
    f.write_all(&bytes)?;
    drop(f);
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publishes_the_env_whole_and_replaces_it() {
        let dir = std::env::temp_dir().join(format!("sc-env-file-{}", std::process::id()));
        let path = dir.join("sub").join("env.json");
        let first = BTreeMap::from([("A".to_owned(), "1".to_owned())]);
        publish(&path, &first);
        let read = |p: &Path| -> BTreeMap<String, String> {
            serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
        };
        assert_eq!(read(&path), first);
        let second = BTreeMap::from([("B".to_owned(), "two words".to_owned())]);
        publish(&path, &second);
        assert_eq!(read(&path), second);
        // No temporary file is left beside it.
        assert_eq!(
            std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
            1
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
