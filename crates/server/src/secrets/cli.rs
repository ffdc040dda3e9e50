//! `sandcell secrets rotate-key`: a new secrets key, every stored value resealed under it,
//! the old key dropped (the daemon must be stopped; see docs/secrets.md).

use crate::secrets::service::{SecretsError, rotate_key};
use sandcell_runtime::Dirs;

#[derive(Debug, Clone, clap::Subcommand)]
pub enum SecretsCommand {
    /// Replace the secrets key of <data-dir>/secrets.key and reseal every stored value
    /// (stop the daemon first)
    RotateKey,
}

pub async fn secrets(dirs: Dirs, cmd: SecretsCommand) -> i32 {
    match run(&dirs, cmd).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("sandcell secrets: {e}");
            1
        }
    }
}

async fn run(dirs: &Dirs, cmd: SecretsCommand) -> Result<(), SecretsError> {
    match cmd {
        SecretsCommand::RotateKey => {
            let db = crate::keys::open_db(&dirs.data).await?;
            let resealed = rotate_key(&db, &dirs.data).await;
            db.close().await;
            let n = resealed?;
            eprintln!("sandcell secrets: rotated the key; {n} version(s) resealed");
            Ok(())
        }
    }
}
