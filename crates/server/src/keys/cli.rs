//! `sandcell keys create|update|ls|revoke`: key management on the daemon's database file
//! (see `keys/mod.rs` for why it works next to a running daemon).

use crate::keys as keystore;
use crate::store::KeyRow;
use crate::store::keys::{KeyQuotas, Limit};
use crate::util::{now_ms, rfc3339};
use sandcell_runtime::Dirs;

/// A key's quotas on the command line. Each takes a number, `unlimited`, or `default` (the
/// daemon's `--default-max-...`; no limit for an admin key).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct QuotaArgs {
    /// Live sandboxes (running or paused) at once (429 past it) [default: the daemon's, 20]
    #[arg(long, value_name = "N|unlimited|default")]
    pub max_sandboxes: Option<Limit>,
    /// Memory of the key's running sandboxes, MiB [default: the daemon's, 32768]
    #[arg(long, value_name = "MIB|unlimited|default")]
    pub max_memory_mib: Option<Limit>,
    /// Disk of the key's live sandboxes (paused ones' memory included), MiB [default: the
    /// daemon's, 204800]
    #[arg(long, value_name = "MIB|unlimited|default")]
    pub max_disk_mib: Option<Limit>,
    /// Template builds at once [default: the daemon's, 2]
    #[arg(long, value_name = "N|unlimited|default")]
    pub max_builds: Option<Limit>,
    /// Uploaded template build archives kept, MiB [default: the daemon's, 16384]
    #[arg(long, value_name = "MIB|unlimited|default")]
    pub max_upload_mib: Option<Limit>,
}

impl QuotaArgs {
    /// `base` with the quotas given on the command line.
    fn apply(&self, base: KeyQuotas) -> KeyQuotas {
        KeyQuotas {
            sandboxes: self.max_sandboxes.unwrap_or(base.sandboxes),
            memory_mib: self.max_memory_mib.unwrap_or(base.memory_mib),
            disk_mib: self.max_disk_mib.unwrap_or(base.disk_mib),
            builds: self.max_builds.unwrap_or(base.builds),
            upload_mib: self.max_upload_mib.unwrap_or(base.upload_mib),
        }
    }

    fn is_empty(&self) -> bool {
        self.max_sandboxes.is_none()
            && self.max_memory_mib.is_none()
            && self.max_disk_mib.is_none()
            && self.max_builds.is_none()
            && self.max_upload_mib.is_none()
    }
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum KeysCommand {
    /// Create an API key and print it (it is shown only this once)
    Create {
        /// A name to recognise the key by in `keys ls`, `keys update` and `keys revoke`
        #[arg(long, default_value = "default")]
        name: String,
        #[command(flatten)]
        quotas: QuotaArgs,
        #[arg(long)]
        json: bool,
    },
    /// Change the quotas of a key by id or name (the quotas not given stay as they are);
    /// sandboxes already running stay, new ones are checked against the new quotas
    Update {
        #[arg(value_name = "ID|NAME")]
        key: String,
        #[command(flatten)]
        quotas: QuotaArgs,
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

/// A quota in JSON: a number, `"unlimited"` or `"default"`.
fn limit_json(l: Limit) -> serde_json::Value {
    match l {
        Limit::Max(n) => n.into(),
        other => other.to_string().into(),
    }
}

fn key_json(k: &KeyRow) -> serde_json::Value {
    let q = &k.quotas;
    serde_json::json!({
        "id": k.id,
        "name": k.name,
        "prefix": k.key_prefix,
        "admin": k.is_admin,
        "maxSandboxes": limit_json(q.sandboxes),
        "maxMemoryMiB": limit_json(q.memory_mib),
        "maxDiskMiB": limit_json(q.disk_mib),
        "maxBuilds": limit_json(q.builds),
        "maxUploadMiB": limit_json(q.upload_mib),
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
        KeysCommand::Create { name, quotas, json } => {
            let key =
                keystore::create_key_with(&db, &name, quotas.apply(KeyQuotas::default()), false)
                    .await?;
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
        KeysCommand::Update { key, quotas } => update(&db, &key, &quotas).await?,
        KeysCommand::Ls { json } => {
            let list = db.list_keys().await?;
            if json {
                let items: Vec<_> = list.iter().map(key_json).collect();
                println!("{}", serde_json::Value::Array(items));
            } else {
                print_table(&list);
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

async fn update(
    db: &crate::store::Db,
    key: &str,
    quotas: &QuotaArgs,
) -> Result<i32, crate::error::Error> {
    if quotas.is_empty() {
        eprintln!(
            "sandcell keys update: nothing to change: give --max-sandboxes, --max-memory-mib, \
             --max-disk-mib, --max-builds or --max-upload-mib"
        );
        return Ok(2);
    }
    let matching: Vec<KeyRow> = db
        .list_keys()
        .await?
        .into_iter()
        .filter(|k| k.revoked_at.is_none() && (k.id == key || k.name == key))
        .collect();
    if matching.is_empty() {
        eprintln!("sandcell keys: no active key with id or name {key:?}");
        return Ok(1);
    }
    for k in matching {
        // By id: each key keeps the quotas not given.
        db.set_key_quotas(&k.id, &quotas.apply(k.quotas)).await?;
        if let Some(updated) = db.key_by_id(&k.id).await? {
            println!("{}", key_json(&updated));
        }
    }
    Ok(0)
}

fn print_table(list: &[KeyRow]) {
    println!(
        "{:<17} {:<16} {:<10} {:<6} {:<10} {:<10} {:<10} {:<24} STATE",
        "ID", "NAME", "PREFIX", "ADMIN", "SANDBOXES", "MEM MIB", "DISK MIB", "CREATED"
    );
    for k in list {
        println!(
            "{:<17} {:<16} {:<10} {:<6} {:<10} {:<10} {:<10} {:<24} {}",
            k.id,
            k.name,
            k.key_prefix,
            if k.is_admin { "yes" } else { "no" },
            k.quotas.sandboxes.to_string(),
            k.quotas.memory_mib.to_string(),
            k.quotas.disk_mib.to_string(),
            rfc3339(k.created_at),
            k.revoked_at
                .map_or("active".into(), |t| format!("revoked {}", rfc3339(t))),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn update_changes_only_the_quotas_given() {
        let args = QuotaArgs {
            max_memory_mib: Some(Limit::Max(1024)),
            max_disk_mib: Some(Limit::Default),
            ..QuotaArgs::default()
        };
        assert!(!args.is_empty());
        assert!(QuotaArgs::default().is_empty());
        let base = KeyQuotas {
            sandboxes: Limit::Max(3),
            disk_mib: Limit::Unlimited,
            ..KeyQuotas::default()
        };
        assert_eq!(
            args.apply(base),
            KeyQuotas {
                sandboxes: Limit::Max(3),
                memory_mib: Limit::Max(1024),
                disk_mib: Limit::Default,
                ..KeyQuotas::default()
            }
        );
    }

    #[test]
    fn quotas_show_as_numbers_or_words_in_json() {
        assert_eq!(limit_json(Limit::Max(5)), serde_json::json!(5));
        assert_eq!(limit_json(Limit::Unlimited), serde_json::json!("unlimited"));
        assert_eq!(limit_json(Limit::Default), serde_json::json!("default"));
    }
}
