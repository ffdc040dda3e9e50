//! `sandcell cp`: one file between here and a sandbox, streamed in both directions (never
//! held whole in memory).
//!
//! `sandcell cp LOCAL ID:PATH` uploads, `sandcell cp ID:PATH LOCAL` downloads; `-` as LOCAL
//! is stdin or stdout. A destination that is a directory (or, in the sandbox, ends with
//! `/`) gets the source's file name. A download goes to a temporary file next to the
//! destination, renamed over it only when complete.

use crate::daemon::Target;
use crate::exec::EXIT_SANDCELL;
use crate::sandboxes::{EXIT_FAILED, EXIT_USAGE, fail};
use sandcell_client::Envd;
use sandcell_proto::agent::filesystem::FileType;
use std::path::{Path, PathBuf};
use tokio::io::AsyncWriteExt;

#[derive(clap::Args)]
pub struct CpArgs {
    /// LOCAL or ID:PATH (`-`: stdin)
    #[arg(value_name = "SRC")]
    pub src: String,
    /// ID:PATH or LOCAL (`-`: stdout)
    #[arg(value_name = "DST")]
    pub dst: String,
    /// Read or write the sandbox's file as this user [default: the sandbox's default user]
    #[arg(long, short = 'u', value_name = "USER")]
    pub user: Option<String>,
}

/// `ID:PATH` when the part before the first `:` looks like a sandbox id (no `/`, not
/// empty); a local path with a `:` in its first component can be written `./a:b`.
fn remote(arg: &str) -> Option<(&str, &str)> {
    let (id, path) = arg.split_once(':')?;
    (!id.is_empty() && !id.contains('/') && id != "." && id != "..").then_some((id, path))
}

fn basename(path: &str) -> Option<&str> {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty() && *n != "." && *n != "..")
}

pub async fn cp(target: &Target, args: CpArgs) -> i32 {
    match (remote(&args.src), remote(&args.dst)) {
        (None, Some((id, path))) => upload(target, &args.src, id, path, args.user).await,
        (Some((id, path)), None) => download(target, id, path, &args.dst, args.user).await,
        (Some(_), Some(_)) => fail(
            "both sides are in sandboxes: copy through a local file",
            EXIT_USAGE,
        ),
        (None, None) => fail(
            "one side must be ID:PATH (a file in a sandbox); a local path with a ':' can be written ./NAME",
            EXIT_USAGE,
        ),
    }
}

async fn envd_of(target: &Target, id: &str, user: Option<String>) -> Result<Envd, i32> {
    target
        .client
        .connect_envd(id)
        .await
        .map(|e| e.as_user(user))
        .map_err(|e| fail(&target.explain(&e, Some(id)), EXIT_SANDCELL))
}

async fn upload(target: &Target, local: &str, id: &str, path: &str, user: Option<String>) -> i32 {
    if path.is_empty() {
        return fail(
            &format!("{id}: no path in the sandbox after ':'"),
            EXIT_USAGE,
        );
    }
    let envd = match envd_of(target, id, user).await {
        Ok(e) => e,
        Err(code) => return code,
    };
    let source_name = (local != "-").then(|| basename(local)).flatten();
    // Into a directory: under the source's name.
    let mut dest = path.to_string();
    let into_dir = path.ends_with('/')
        || matches!(envd.stat(path).await, Ok(Some(e)) if e.kind == FileType::Directory);
    if into_dir {
        let Some(name) = source_name else {
            return fail(
                &format!("{id}:{path} is a directory: name the file to write"),
                EXIT_USAGE,
            );
        };
        dest = format!("{}/{name}", path.trim_end_matches('/'));
    }
    let result = if local == "-" {
        envd.upload(&dest, tokio::io::stdin()).await
    } else {
        match tokio::fs::File::open(local).await {
            Ok(file) if file.metadata().await.is_ok_and(|m| m.is_dir()) => {
                return fail(
                    &format!("{local} is a directory: sandcell cp copies one file (tar it first)"),
                    EXIT_USAGE,
                );
            }
            Ok(file) => envd.upload(&dest, file).await,
            Err(e) => return fail(&format!("opening {local}: {e}"), EXIT_FAILED),
        }
    };
    match result {
        Ok(_) => 0,
        Err(e) => fail(
            &format!(
                "copying {local} to {id}:{dest}: {}",
                target.explain(&e, Some(id))
            ),
            EXIT_FAILED,
        ),
    }
}

async fn download(target: &Target, id: &str, path: &str, local: &str, user: Option<String>) -> i32 {
    if path.is_empty() {
        return fail(
            &format!("{id}: no path in the sandbox after ':'"),
            EXIT_USAGE,
        );
    }
    let envd = match envd_of(target, id, user).await {
        Ok(e) => e,
        Err(code) => return code,
    };
    let mut download = match envd.download(path).await {
        Ok(d) => d,
        Err(e) => {
            return fail(
                &format!("reading {id}:{path}: {}", target.explain(&e, Some(id))),
                EXIT_FAILED,
            );
        }
    };
    if local == "-" {
        let mut out = tokio::io::stdout();
        while let Some(chunk) = download.next_chunk().await {
            let written = match chunk {
                Ok(bytes) => out.write_all(&bytes).await,
                Err(e) => return fail(&format!("reading {id}:{path}: {e}"), EXIT_FAILED),
            };
            if let Err(e) = written {
                return fail(&format!("writing stdout: {e}"), EXIT_FAILED);
            }
        }
        return match out.flush().await {
            Ok(()) => 0,
            Err(e) => fail(&format!("writing stdout: {e}"), EXIT_FAILED),
        };
    }
    let mut dest = PathBuf::from(local);
    if dest.is_dir() {
        match basename(path) {
            Some(name) => dest.push(name),
            None => return fail(&format!("{id}:{path} names no file"), EXIT_USAGE),
        }
    }
    let partial = partial_name(&dest);
    let result = write_all(&mut download, &partial).await;
    let result = match result {
        Ok(()) => tokio::fs::rename(&partial, &dest)
            .await
            .map_err(|e| format!("renaming {} to {}: {e}", partial.display(), dest.display())),
        Err(msg) => Err(msg),
    };
    match result {
        Ok(()) => 0,
        Err(msg) => {
            let _ = tokio::fs::remove_file(&partial).await;
            fail(
                &format!("copying {id}:{path} to {local}: {msg}"),
                EXIT_FAILED,
            )
        }
    }
}

/// `DIR/.NAME.sandcell-PID`: beside the destination, so the rename stays on its file system.
fn partial_name(dest: &Path) -> PathBuf {
    let name = dest
        .file_name()
        .map_or_else(|| "download".into(), |n| n.to_string_lossy().into_owned());
    dest.with_file_name(format!(".{name}.sandcell-{}", std::process::id()))
}

async fn write_all(download: &mut sandcell_client::Download, path: &Path) -> Result<(), String> {
    let mut file = tokio::fs::File::create(path)
        .await
        .map_err(|e| format!("creating {}: {e}", path.display()))?;
    while let Some(chunk) = download.next_chunk().await {
        let bytes = chunk.map_err(|e| e.to_string())?;
        file.write_all(&bytes)
            .await
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    file.flush()
        .await
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    file.sync_all()
        .await
        .map_err(|e| format!("syncing {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_paths_are_id_colon_path() {
        assert_eq!(remote("sc-1:/tmp/x"), Some(("sc-1", "/tmp/x")));
        assert_eq!(remote("sc-1:rel"), Some(("sc-1", "rel")));
        assert_eq!(remote("./a:b"), None);
        assert_eq!(remote("/abs/a:b"), None);
        assert_eq!(remote(":x"), None);
        assert_eq!(remote("file.txt"), None);
    }

    #[test]
    fn basenames() {
        assert_eq!(basename("/tmp/a.bin"), Some("a.bin"));
        assert_eq!(basename("dir/"), Some("dir"));
        assert_eq!(basename("/"), None);
        assert_eq!(basename(".."), None);
    }
}
