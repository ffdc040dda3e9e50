//! `sandcell pause`, `resume`, `fork` and `snapshot`: the daemon's pause, resume, fork and
//! snapshot routes (crates/server snapshots/api.rs) from the command line.

use crate::daemon::Target;
use crate::sandboxes::{EXIT_FAILED, fail};
use hyper::{Method, StatusCode};
use sandcell_client::{ClientError, checked};
use serde_json::{Value, json};

#[derive(clap::Args)]
pub struct PauseArgs {
    /// The sandboxes to pause (their memory, processes and files are saved to disk)
    #[arg(required = true, value_name = "ID")]
    pub ids: Vec<String>,
    /// Print each paused sandbox's details as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct ResumeArgs {
    /// The paused sandbox to resume (a running one only has its timeout extended)
    #[arg(value_name = "ID")]
    pub id: String,
    /// Seconds from now until the daemon pauses or kills it again [daemon default: 300]
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,
    /// Print the daemon's answer as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct ForkArgs {
    /// The running sandbox to fork
    #[arg(value_name = "ID")]
    pub id: String,
    /// How many children
    #[arg(short = 'n', long = "count", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100), value_name = "N")]
    pub count: u32,
    /// Seconds until each child's timeout
    #[arg(long, default_value_t = 300, value_name = "SECS")]
    pub timeout: u64,
    /// Print the daemon's answer (one result per child) as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct SnapshotArgs {
    /// The running sandbox to snapshot (it keeps running)
    #[arg(value_name = "ID")]
    pub id: String,
    /// A name to create sandboxes from (`sandcell create -t NAME`); a second snapshot of
    /// the same name replaces the first
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Print the daemon's answer as JSON
    #[arg(long)]
    pub json: bool,
}

async fn call(
    target: &Target,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Result<(StatusCode, Value), ClientError> {
    let resp = checked(target.client.api(method, path, body.as_ref()).await?)?;
    let value = if resp.body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&resp.body).map_err(|e| ClientError::Decode {
            what: path.to_string(),
            problem: e.to_string(),
        })?
    };
    Ok((resp.status, value))
}

fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    );
}

/// Pauses each sandbox; prints the id of each one paused. Fails (after trying them all) if
/// any could not be paused.
pub async fn pause(target: &Target, args: PauseArgs) -> i32 {
    let mut status = 0;
    for id in &args.ids {
        let paused = call(
            target,
            Method::POST,
            &format!("/sandboxes/{id}/pause"),
            None,
        )
        .await;
        let shown = match paused {
            Ok(_) if args.json => call(target, Method::GET, &format!("/sandboxes/{id}"), None)
                .await
                .map(|(_, detail)| print_json(&detail)),
            Ok(_) => {
                println!("{id}");
                Ok(())
            }
            Err(e) => Err(e),
        };
        if let Err(e) = shown {
            status = fail(&target.explain(&e, Some(id)), EXIT_FAILED);
            if e.status().is_none() {
                break;
            }
        }
    }
    status
}

/// Resumes a paused sandbox (connect: 201 resumed, 200 it was running); prints its id.
pub async fn resume(target: &Target, args: ResumeArgs) -> i32 {
    let id = &args.id;
    let body = args.timeout.map(|t| json!({ "timeout": t }));
    match call(
        target,
        Method::POST,
        &format!("/v2/sandboxes/{id}/connect"),
        body,
    )
    .await
    {
        Ok((_, sandbox)) if args.json => {
            print_json(&sandbox);
            0
        }
        Ok((status, _)) => {
            if status != StatusCode::CREATED {
                eprintln!("sandcell: sandbox {id} was running (its timeout was extended)");
            }
            println!("{id}");
            0
        }
        Err(e) => fail(&target.explain(&e, Some(id)), EXIT_FAILED),
    }
}

/// Forks a sandbox; prints each child's id, one a line. Fails if any child failed (each
/// failure on stderr).
pub async fn fork(target: &Target, args: ForkArgs) -> i32 {
    let id = &args.id;
    let body = json!({ "count": args.count, "timeout": args.timeout });
    let results = match call(
        target,
        Method::POST,
        &format!("/sandboxes/{id}/fork"),
        Some(body),
    )
    .await
    {
        Ok((_, results)) => results,
        Err(e) => return fail(&target.explain(&e, Some(id)), EXIT_FAILED),
    };
    if args.json {
        print_json(&results);
    }
    let mut status = 0;
    for (i, result) in results.as_array().into_iter().flatten().enumerate() {
        if let Some(child) = result["sandbox"]["sandboxID"].as_str() {
            if !args.json {
                println!("{child}");
            }
        } else {
            status = fail(
                &format!(
                    "child {} of {id}: {} {}",
                    i + 1,
                    result["error"]["code"],
                    result["error"]["message"].as_str().unwrap_or("failed")
                ),
                EXIT_FAILED,
            );
        }
    }
    status
}

/// Snapshots a sandbox; prints the snapshot's id (its name when it has one).
pub async fn snapshot(target: &Target, args: SnapshotArgs) -> i32 {
    let id = &args.id;
    let body = args.name.as_ref().map(|n| json!({ "name": n }));
    match call(
        target,
        Method::POST,
        &format!("/sandboxes/{id}/snapshots"),
        body,
    )
    .await
    {
        Ok((_, info)) if args.json => {
            print_json(&info);
            0
        }
        Ok((_, info)) => {
            println!("{}", info["snapshotID"].as_str().unwrap_or_default());
            0
        }
        Err(e) => fail(&target.explain(&e, Some(id)), EXIT_FAILED),
    }
}
