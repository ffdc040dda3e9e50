//! `sandcell keys create|ls|revoke`: key management on the daemon's database file (see
//! `keys/mod.rs` for why it works next to a running daemon).

use crate::keys as keystore;
use crate::store::KeyRow;
use crate::util::{now_ms, rfc3339};
use sandcell_runtime::Dirs;

#[derive(Debug, Clone, clap::Subcommand)]
pub enum KeysCommand {
    /// Create an API key and print it (it is shown only this once)
    Create {
        /// A name to recognise the key by in `keys ls` and `keys revoke`
        #[arg(long, default_value = "default")]
        name: String,
        /// Most sandboxes the key may have at once (429 past it) [default: no limit]
        #[arg(long, value_name = "N")]
        max_sandboxes: Option<u32>,
        #[arg(long)]
        json: bool,
    },
    /// List the keys (never their secret)
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Revoke a key by id or name; its sandboxes are killed
    #[command(visible_alias = "rm")]
    Revoke {
        #[arg(value_name = "ID|NAME")]
        key: String,
    },
}

fn key_json(k: &KeyRow) -> serde_json::Value {
    serde_json::json!({
        "id": k.id,
        "name": k.name,
        "prefix": k.key_prefix,
        "admin": k.is_admin,
        "maxSandboxes": k.max_sandboxes,
        "createdAt": rfc3339(k.created_at),
        "revokedAt": k.revoked_at.map(rfc3339),
    })
}

/// Runs one `sandcell keys` command; the exit status.
pub async fn keys(dirs: Dirs, cmd: KeysCommand) -> i32 {
    match run(&dirs, cmd).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sandcell keys: {e}");
            1
        }
    }
}

async fn run(dirs: &Dirs, cmd: KeysCommand) -> Result<i32, crate::error::Error> {
    let db = keystore::open_db(&dirs.data).await?;
    let code = match cmd {
        KeysCommand::Create {
            name,
            max_sandboxes,
            json,
        } => {
            let key = keystore::create_key(&db, &name, max_sandboxes, false).await?;
            if json {
                let mut v = key_json(&key.record);
                v["key"] = serde_json::Value::String(key.plaintext);
                println!("{v}");
            } else {
                println!("{}", key.plaintext);
                eprintln!(
                    "sandcell keys: created {} ({}); the key above is not shown again",
                    key.record.id, key.record.name
                );
            }
            0
        }
        KeysCommand::Ls { json } => {
            let list = db.list_keys().await?;
            if json {
                let items: Vec<_> = list.iter().map(key_json).collect();
                println!("{}", serde_json::Value::Array(items));
            } else {
                println!(
                    "{:<17} {:<16} {:<10} {:<6} {:<6} {:<24} STATE",
                    "ID", "NAME", "PREFIX", "ADMIN", "MAX", "CREATED"
                );
                for k in &list {
                    println!(
                        "{:<17} {:<16} {:<10} {:<6} {:<6} {:<24} {}",
                        k.id,
                        k.name,
                        k.key_prefix,
                        if k.is_admin { "yes" } else { "no" },
                        k.max_sandboxes.map_or("-".into(), |n| n.to_string()),
                        rfc3339(k.created_at),
                        k.revoked_at
                            .map_or("active".into(), |t| format!("revoked {}", rfc3339(t))),
                    );
                }
            }
            0
        }
        KeysCommand::Revoke { key } => {
            let revoked = db.revoke_key(&key, now_ms()).await?;
            if revoked.is_empty() {
                eprintln!("sandcell keys: no active key with id or name {key:?}");
                1
            } else {
                for id in revoked {
                    println!("revoked {id}");
                }
                0
            }
        }
    };
    db.close().await;
    Ok(code)
}
