//! `sandcell net ...`: private networks, a sandbox's egress rules and its denied log, and
//! the network flags of `sandcell create` (the daemon's network API, crates/server
//! networks/api.rs).

use crate::daemon::Target;
use crate::sandboxes::{EXIT_FAILED, EXIT_USAGE, fail};
use hyper::Method;
use sandcell_client::checked;
use serde_json::{Value, json};

#[derive(clap::Subcommand)]
pub enum NetCommand {
    /// Create a private network of the API key; its members reach each other by IP and by
    /// sandbox id
    Create {
        #[arg(value_name = "NAME")]
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// List the private networks of the API key and their members
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Delete private networks (their members stop reaching each other)
    Rm {
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
    },
    /// A running sandbox joins a private network
    Join {
        #[arg(value_name = "ID")]
        id: String,
        #[arg(value_name = "NAME")]
        name: String,
    },
    /// A sandbox leaves a private network
    Leave {
        #[arg(value_name = "ID")]
        id: String,
        #[arg(value_name = "NAME")]
        name: String,
    },
    /// Replace a running sandbox's egress rules (all of them: omitted rules are cleared)
    Rules {
        #[arg(value_name = "ID")]
        id: String,
        #[command(flatten)]
        rules: EgressArgs,
    },
    /// What a sandbox's egress rules refused: destinations and names
    Log {
        #[arg(value_name = "ID")]
        id: String,
        #[arg(long)]
        json: bool,
    },
}

/// E2B's egress rules as flags (`sandcell create` and `sandcell net rules`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct EgressArgs {
    /// Allow only these destinations (repeatable or comma-separated): IP, CIDR, domain or
    /// *.domain; everything else is then denied
    #[arg(long, value_delimiter = ',', value_name = "DEST")]
    pub allow_out: Vec<String>,
    /// Deny these destinations (repeatable or comma-separated): IP or CIDR
    #[arg(long, value_delimiter = ',', value_name = "CIDR")]
    pub deny_out: Vec<String>,
    /// No internet access at all (what --allow-out allows still passes)
    #[arg(long)]
    pub no_internet: bool,
}

impl EgressArgs {
    pub fn is_empty(&self) -> bool {
        self.allow_out.is_empty() && self.deny_out.is_empty() && !self.no_internet
    }

    /// Adds the rules to a create request, as the E2B SDKs send them.
    pub fn add_to_create(&self, body: &mut Value) {
        if self.no_internet {
            body["allow_internet_access"] = json!(false);
        }
        if !self.allow_out.is_empty() || !self.deny_out.is_empty() {
            body["network"] = json!({"allowOut": self.allow_out, "denyOut": self.deny_out});
        }
    }

    /// The body of `PUT /sandboxes/{id}/network`.
    fn update_body(&self) -> Value {
        json!({
            "allow_internet_access": !self.no_internet,
            "allowOut": self.allow_out,
            "denyOut": self.deny_out,
        })
    }
}

async fn call(
    target: &Target,
    method: Method,
    path: &str,
    body: Option<&Value>,
    sandbox: Option<&str>,
) -> Result<Value, i32> {
    let resp = match target
        .client
        .api(method, path, body)
        .await
        .and_then(checked)
    {
        Ok(r) => r,
        Err(e) => return Err(fail(&target.explain(&e, sandbox), EXIT_FAILED)),
    };
    if resp.body.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&resp.body)
        .map_err(|e| fail(&format!("the daemon's answer to {path}: {e}"), EXIT_FAILED))
}

fn print_json(v: &Value) -> i32 {
    match serde_json::to_string_pretty(v) {
        Ok(text) => {
            println!("{text}");
            0
        }
        Err(e) => fail(&format!("encoding JSON: {e}"), EXIT_FAILED),
    }
}

/// Paths carry names and ids as given: refuse what would change the path.
fn path_safe(what: &str, s: &str) -> Result<(), i32> {
    if s.is_empty() || s.contains(['/', '?', '#', '%', ' ']) {
        return Err(fail(&format!("invalid {what} {s:?}"), EXIT_USAGE));
    }
    Ok(())
}

pub async fn run(target: &Target, command: NetCommand) -> i32 {
    match dispatch(target, command).await {
        Ok(code) | Err(code) => code,
    }
}

async fn dispatch(target: &Target, command: NetCommand) -> Result<i32, i32> {
    match command {
        NetCommand::Create { name, json } => {
            let v = call(
                target,
                Method::POST,
                "/networks",
                Some(&json!({ "name": name })),
                None,
            )
            .await?;
            if json {
                return Ok(print_json(&v));
            }
            println!("{name}");
        }
        NetCommand::Ls { json } => {
            let v = call(target, Method::GET, "/networks", None, None).await?;
            if json {
                return Ok(print_json(&v));
            }
            print!("{}", networks_table(&v));
        }
        NetCommand::Rm { names } => {
            let mut status = 0;
            for name in &names {
                path_safe("network name", name)?;
                let path = format!("/networks/{name}");
                match call(target, Method::DELETE, &path, None, None).await {
                    Ok(_) => println!("{name}"),
                    Err(code) => status = code,
                }
            }
            return Ok(status);
        }
        NetCommand::Join { id, name } => {
            path_safe("sandbox id", &id)?;
            path_safe("network name", &name)?;
            let path = format!("/sandboxes/{id}/networks/{name}");
            call(target, Method::POST, &path, None, Some(&id)).await?;
        }
        NetCommand::Leave { id, name } => {
            path_safe("sandbox id", &id)?;
            path_safe("network name", &name)?;
            let path = format!("/sandboxes/{id}/networks/{name}");
            call(target, Method::DELETE, &path, None, Some(&id)).await?;
        }
        NetCommand::Rules { id, rules } => {
            path_safe("sandbox id", &id)?;
            let path = format!("/sandboxes/{id}/network");
            call(
                target,
                Method::PUT,
                &path,
                Some(&rules.update_body()),
                Some(&id),
            )
            .await?;
        }
        NetCommand::Log { id, json } => {
            path_safe("sandbox id", &id)?;
            let path = format!("/sandboxes/{id}/network/log");
            let v = call(target, Method::GET, &path, None, Some(&id)).await?;
            if json {
                return Ok(print_json(&v));
            }
            print!("{}", log_text(&v));
        }
    }
    Ok(0)
}

fn columns(rows: &[Vec<String>]) -> String {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0usize; n];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (w, cell) in widths.iter().zip(row) {
            line.push_str(&format!("{cell:<w$}  "));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn networks_table(v: &Value) -> String {
    let mut rows = vec![vec!["NAME".into(), "CREATED".into(), "MEMBERS".into()]];
    for n in v.as_array().into_iter().flatten() {
        let members: Vec<String> = n["members"]
            .as_array()
            .into_iter()
            .flatten()
            .map(text)
            .collect();
        rows.push(vec![
            text(&n["name"]),
            text(&n["createdAt"]),
            members.join(","),
        ]);
    }
    columns(&rows)
}

fn log_text(v: &Value) -> String {
    let mut rows = vec![vec!["DENIED".into(), "PROTO".into(), "PORT".into()]];
    for f in v["flows"].as_array().into_iter().flatten() {
        rows.push(vec![
            text(&f["dest"]),
            text(&f["protocol"]),
            text(&f["port"]),
        ]);
    }
    let mut out = columns(&rows);
    let names: Vec<String> = v["names"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| text(&n["name"]))
        .collect();
    out.push_str(&format!(
        "refused packets: {}\nrefused names: {}\n",
        text(&v["packets"]),
        if names.is_empty() {
            "-".to_string()
        } else {
            names.join(", ")
        }
    ));
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn create_body_is_what_the_sdks_send() {
        let mut body = json!({"templateID": "base"});
        let args = EgressArgs {
            allow_out: vec!["a.com".into()],
            deny_out: vec![],
            no_internet: true,
        };
        args.add_to_create(&mut body);
        assert_eq!(body["allow_internet_access"], false);
        assert_eq!(body["network"]["allowOut"][0], "a.com");
        let mut plain = json!({});
        EgressArgs::default().add_to_create(&mut plain);
        assert_eq!(plain, json!({}));
    }

    #[test]
    fn log_and_list_render() {
        let log = json!({"flows": [{"dest": "1.2.3.4", "protocol": "tcp", "port": 80}],
                         "packets": 3, "names": [{"name": "x.test"}]});
        let t = log_text(&log);
        assert!(t.contains("1.2.3.4  tcp    80"), "{t}");
        assert!(t.contains("refused names: x.test"), "{t}");
        let nets = json!([{"name": "team", "createdAt": "t", "members": ["a", "b"]}]);
        assert!(networks_table(&nets).contains("team  t        a,b"));
    }
}
