//! `sandcell create`, `ls` and `kill`: the daemon's control API from the command line.

use crate::daemon::Target;
use sandcell_client::{ListFilter, ListedSandbox, NewSandbox};
use std::collections::BTreeMap;

/// The exit status of a failed client command (the daemon refused, or is not there).
pub const EXIT_FAILED: i32 = 1;
/// Bad arguments.
pub const EXIT_USAGE: i32 = 2;

#[derive(clap::Args)]
pub struct CreateArgs {
    /// The template (an image name under the daemon's <data-dir>/images)
    #[arg(long, short = 't', default_value = "base", value_name = "NAME")]
    pub template: String,
    /// Seconds until the daemon kills the sandbox [daemon default: 300]
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,
    /// Metadata to attach (repeatable); `sandcell ls --metadata` filters on it
    #[arg(long = "metadata", short = 'm', value_name = "KEY=VALUE")]
    pub metadata: Vec<String>,
    /// Environment variable of every process in the sandbox (repeatable)
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Print the daemon's answer as JSON instead of the id
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub egress: crate::net::EgressArgs,
    /// Join this private network of the key (repeatable; `sandcell net create`)
    #[arg(long = "network", value_name = "NAME")]
    pub networks: Vec<String>,
}

#[derive(clap::Args)]
pub struct LsArgs {
    /// Only sandboxes in these states (repeatable or comma-separated) [default: running]
    #[arg(long, value_delimiter = ',', value_name = "running|paused")]
    pub state: Vec<String>,
    /// Only sandboxes with this metadata (repeatable: all must match)
    #[arg(long = "metadata", short = 'm', value_name = "KEY=VALUE")]
    pub metadata: Vec<String>,
    /// The list as a JSON array (the daemon's objects)
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct KillArgs {
    /// The sandboxes to kill
    #[arg(required = true, value_name = "ID")]
    pub ids: Vec<String>,
}

/// `KEY=VALUE` pairs; `what` names the option in the message.
pub fn parse_pairs(what: &str, pairs: &[String]) -> Result<BTreeMap<String, String>, String> {
    pairs
        .iter()
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(format!("{what} {p:?}: expected KEY=VALUE")),
        })
        .collect()
}

pub fn fail(msg: &str, code: i32) -> i32 {
    eprintln!("sandcell: {msg}");
    code
}

fn print_json<T: serde::Serialize>(value: &T) -> i32 {
    match serde_json::to_string_pretty(value) {
        Ok(text) => {
            println!("{text}");
            0
        }
        Err(e) => fail(&format!("encoding JSON: {e}"), EXIT_FAILED),
    }
}

pub async fn create(target: &Target, args: CreateArgs) -> i32 {
    let (metadata, env) = match (
        parse_pairs("--metadata", &args.metadata),
        parse_pairs("--env", &args.env),
    ) {
        (Ok(m), Ok(e)) => (m, e),
        (Err(msg), _) | (_, Err(msg)) => return fail(&msg, EXIT_USAGE),
    };
    let request = NewSandbox {
        template_id: args.template.clone(),
        timeout: args.timeout,
        metadata: (!metadata.is_empty()).then_some(metadata),
        env_vars: (!env.is_empty()).then_some(env),
        secure: None,
    };
    let created = if args.egress.is_empty() && args.networks.is_empty() {
        target.client.create_sandbox(&request).await
    } else {
        create_with_network(target, &request, &args).await
    };
    match created {
        Ok(sandbox) if args.json => print_json(&sandbox),
        Ok(sandbox) => {
            println!("{}", sandbox.sandbox_id);
            0
        }
        Err(e) => fail(&target.explain(&e, None), EXIT_FAILED),
    }
}

/// A create with network fields, which the client's request type does not carry.
async fn create_with_network(
    target: &Target,
    request: &NewSandbox,
    args: &CreateArgs,
) -> Result<sandcell_client::Sandbox, sandcell_client::ClientError> {
    let bad = |e: serde_json::Error| sandcell_client::ClientError::Decode {
        what: "the create request".into(),
        problem: e.to_string(),
    };
    let mut body = serde_json::to_value(request).map_err(bad)?;
    args.egress.add_to_create(&mut body);
    if !args.networks.is_empty() {
        body["networks"] = serde_json::json!(args.networks);
    }
    let resp = target
        .client
        .api(hyper::Method::POST, "/v2/sandboxes", Some(&body))
        .await
        .and_then(sandcell_client::checked)?;
    serde_json::from_slice(&resp.body).map_err(|e| sandcell_client::ClientError::Decode {
        what: "/v2/sandboxes".into(),
        problem: e.to_string(),
    })
}

pub async fn ls(target: &Target, args: LsArgs) -> i32 {
    let metadata = match parse_pairs("--metadata", &args.metadata) {
        Ok(m) => m,
        Err(msg) => return fail(&msg, EXIT_USAGE),
    };
    let filter = ListFilter {
        metadata,
        states: args.state,
    };
    match target.client.list_sandboxes_where(&filter).await {
        Ok(list) if args.json => print_json(&list),
        Ok(list) => {
            print!("{}", table(&list));
            0
        }
        Err(e) => fail(&target.explain(&e, None), EXIT_FAILED),
    }
}

/// Aligned columns, a header first (even when empty, so scripts see the shape).
fn table(list: &[ListedSandbox]) -> String {
    let mut rows = vec![[
        "SANDBOX ID".to_string(),
        "TEMPLATE".to_string(),
        "STATE".to_string(),
        "STARTED".to_string(),
        "ENDS".to_string(),
        "METADATA".to_string(),
    ]];
    for s in list {
        let metadata: Vec<String> = s.metadata.iter().map(|(k, v)| format!("{k}={v}")).collect();
        rows.push([
            s.sandbox_id.clone(),
            s.template_id.clone(),
            s.state.clone(),
            s.started_at.clone(),
            s.end_at.clone(),
            metadata.join(","),
        ]);
    }
    let mut widths = [0usize; 6];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (i, (w, cell)) in widths.iter().zip(row).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  "));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Kills each sandbox; prints the id of each one killed. Fails (after trying them all) if
/// any could not be killed.
pub async fn kill(target: &Target, args: KillArgs) -> i32 {
    let mut status = 0;
    for id in &args.ids {
        match target.client.kill_sandbox(id).await {
            Ok(()) => println!("{id}"),
            Err(e) => {
                status = fail(&target.explain(&e, Some(id)), EXIT_FAILED);
                if e.status().is_none() {
                    // No daemon: the others would fail the same way.
                    break;
                }
            }
        }
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_need_a_key() {
        let ok = parse_pairs("--env", &["A=1".into(), "B=x=y".into(), "C=".into()]).unwrap();
        assert_eq!(ok.get("B").map(String::as_str), Some("x=y"));
        assert_eq!(ok.get("C").map(String::as_str), Some(""));
        assert!(parse_pairs("--env", &["=1".into()]).is_err());
        assert!(parse_pairs("--env", &["A".into()]).is_err());
    }

    #[test]
    fn table_has_a_header_and_aligned_rows() {
        let s = ListedSandbox {
            template_id: "base".into(),
            sandbox_id: "sc-1".into(),
            started_at: "2025-01-01T00:00:00Z".into(),
            end_at: "2025-01-01T00:05:00Z".into(),
            cpu_count: 1,
            memory_mb: 512,
            state: "running".into(),
            envd_version: "0.6.4".into(),
            metadata: [("a".to_string(), "1".to_string())].into(),
        };
        let t = table(&[s]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("SANDBOX ID  TEMPLATE"));
        assert!(lines[1].starts_with("sc-1        base"));
        assert!(lines[1].ends_with("a=1"));
        assert_eq!(table(&[]).lines().count(), 1);
    }
}
