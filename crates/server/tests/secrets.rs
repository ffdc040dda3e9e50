//! E2B's Secrets API end to end (a real daemon): the shapes the SDKs read, versions,
//! pagination, E2B's bounds, another key's 404s, and the value nowhere but sealed: not in
//! any answer, not in the database's bytes, the key ring in its own 0600 file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use hyper::{Method, StatusCode};
use sandcell_client::{Client, RawResponse};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;

const VALUE: &str = "sk-live-7f3a9c2e-do-not-leak";

async fn call(c: &Client, method: Method, path: &str, body: Option<Value>) -> RawResponse {
    c.api(method, path, body.as_ref()).await.unwrap()
}

fn json_of(r: &RawResponse) -> Value {
    serde_json::from_slice(&r.body).unwrap()
}

fn assert_no_value(r: &RawResponse) {
    let body = String::from_utf8_lossy(&r.body);
    assert!(!body.contains(VALUE), "an answer carried the value: {body}");
}

#[tokio::test]
async fn secrets_are_created_versioned_listed_and_deleted_per_key_and_never_shown() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let a = &daemon.client;
    let other = a.with_api_key(Some(env.key("other", None).await));

    let created = call(
        a,
        Method::POST,
        "/secrets",
        Some(json!({"name": "OpenAI-Key", "value": VALUE, "metadata": {"team": "ml"}})),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED, "{:?}", created.body);
    assert_no_value(&created);
    let info = json_of(&created);
    let id = info["secretID"].as_str().unwrap().to_string();
    assert!(id.starts_with("sec_"), "{id}");
    assert_eq!(info["name"], "openai-key");
    assert_eq!(info["currentVersion"], 1);
    assert_eq!(info["metadata"], json!({"team": "ml"}));
    assert!(info["createdAt"].as_str().unwrap().ends_with('Z'));
    assert!(info.get("value").is_none());

    // By id and by name in any case.
    for path in [format!("/secrets/{id}"), "/secrets/OPENAI-KEY".into()] {
        let got = call(a, Method::GET, &path, None).await;
        assert_eq!(got.status, StatusCode::OK, "{path}");
        assert_eq!(json_of(&got)["secretID"], id.as_str());
        assert_no_value(&got);
    }

    // The same name again: 409; bad names and metadata: 400 in E2B's shape.
    let again = call(
        a,
        Method::POST,
        "/secrets",
        Some(json!({"name": "openai-key", "value": "x"})),
    )
    .await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    let too_many: serde_json::Map<String, Value> =
        (0..33).map(|i| (format!("k{i}"), json!("v"))).collect();
    for body in [
        json!({"name": "has space", "value": "x"}),
        json!({"name": "sec_reserved", "value": "x"}),
        json!({"name": "a".repeat(129), "value": "x"}),
        json!({"name": "ok", "value": "x", "metadata": too_many}),
        json!({"name": "ok", "value": "x", "metadata": {"k": "v".repeat(1025)}}),
        json!({"name": "ok", "value": 12345}),
        json!({"name": "ok", "value": "a\r\nX-Injected: 1"}),
        json!({"name": "ok"}),
    ] {
        let r = call(a, Method::POST, "/secrets", Some(body.clone())).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}");
        let e = json_of(&r);
        assert_eq!(e["code"], 400);
        assert!(!e["message"].as_str().unwrap().contains("12345"), "{e}");
    }

    // An update appends a version; metadata kept unless given.
    let updated = call(
        a,
        Method::POST,
        "/secrets/openai-key",
        Some(json!({"value": format!("{VALUE}-v2")})),
    )
    .await;
    assert_eq!(updated.status, StatusCode::OK, "{:?}", updated.body);
    assert_no_value(&updated);
    let u = json_of(&updated);
    assert_eq!(u["currentVersion"], 2);
    assert_eq!(u["metadata"], json!({"team": "ml"}));
    let u = json_of(
        &call(
            a,
            Method::POST,
            &format!("/secrets/{id}"),
            Some(json!({"value": "third", "metadata": {}})),
        )
        .await,
    );
    assert_eq!(
        (u["currentVersion"].clone(), u["metadata"].clone()),
        (json!(3), json!({}))
    );

    // Another key: nothing to see, update or delete, and its own namespace.
    for (method, body) in [
        (Method::GET, None),
        (Method::POST, Some(json!({"value": "stolen"}))),
        (Method::DELETE, None),
    ] {
        for path in [format!("/secrets/{id}"), "/secrets/openai-key".into()] {
            let r = call(&other, method.clone(), &path, body.clone()).await;
            assert_eq!(r.status, StatusCode::NOT_FOUND, "{method} {path}");
        }
    }
    let theirs = call(&other, Method::GET, "/secrets", None).await;
    assert_eq!(json_of(&theirs), json!([]));
    let same_name = call(
        &other,
        Method::POST,
        "/secrets",
        Some(json!({"name": "openai-key", "value": "theirs"})),
    )
    .await;
    assert_eq!(same_name.status, StatusCode::CREATED);
    assert_ne!(json_of(&same_name)["secretID"], id.as_str());

    // Pages of 2 over 5 secrets, in creation order, with x-next-token.
    for i in 0..4 {
        let r = call(
            a,
            Method::POST,
            "/secrets",
            Some(json!({"name": format!("s{i}"), "value": VALUE})),
        )
        .await;
        assert_eq!(r.status, StatusCode::CREATED);
    }
    let mut names = Vec::new();
    let mut path = "/secrets?limit=2".to_string();
    loop {
        let page = call(a, Method::GET, &path, None).await;
        assert_eq!(page.status, StatusCode::OK);
        assert_no_value(&page);
        let items = json_of(&page);
        assert!(items.as_array().unwrap().len() <= 2);
        names.extend(
            items
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["name"].as_str().unwrap().to_string()),
        );
        match page.headers.get("x-next-token") {
            Some(t) => path = format!("/secrets?limit=2&nextToken={}", t.to_str().unwrap()),
            None => break,
        }
    }
    assert_eq!(names, ["openai-key", "s0", "s1", "s2", "s3"]);

    // The value is sealed: not in the database's bytes; the key ring is its own 0600 file.
    let data = env.data();
    for entry in std::fs::read_dir(&data).unwrap().flatten() {
        let p = entry.path();
        if p.is_file() {
            let bytes = std::fs::read(&p).unwrap();
            assert!(
                !bytes.windows(VALUE.len()).any(|w| w == VALUE.as_bytes()),
                "{} holds the value",
                p.display()
            );
        }
    }
    let key_file = data.join("secrets.key");
    assert_eq!(
        std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // Deleted: gone for its key, the other key's secret of the same name stays.
    let deleted = call(a, Method::DELETE, "/secrets/openai-key", None).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    let r = call(a, Method::GET, &format!("/secrets/{id}"), None).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = call(a, Method::DELETE, "/secrets/openai-key", None).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = call(&other, Method::GET, "/secrets/openai-key", None).await;
    assert_eq!(r.status, StatusCode::OK);
    daemon.stop();
}

#[tokio::test]
async fn openapi_describes_the_secrets_routes_and_they_need_a_key() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let spec = json_of(&call(&daemon.client, Method::GET, "/openapi.json", None).await);
    for (path, method) in [
        ("/secrets", "get"),
        ("/secrets", "post"),
        ("/secrets/{secretID}", "get"),
        ("/secrets/{secretID}", "post"),
        ("/secrets/{secretID}", "delete"),
    ] {
        assert!(
            spec["paths"][path][method].is_object(),
            "{method} {path} is missing"
        );
    }
    assert!(spec["components"]["schemas"]["SecretInfo"].is_object());
    let anonymous = daemon.client.with_api_key(None);
    for (method, path) in [
        (Method::GET, "/secrets"),
        (Method::POST, "/secrets"),
        (Method::GET, "/secrets/x"),
        (Method::DELETE, "/secrets/x"),
    ] {
        let r = call(
            &anonymous,
            method.clone(),
            path,
            Some(json!({"name": "x", "value": "y"})),
        )
        .await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{method} {path}");
    }
    daemon.stop();
}

#[tokio::test]
async fn secrets_survive_a_restart_under_the_same_key_file() {
    let env = common::Env::new();
    let daemon = env.start(&[]);
    let r = call(
        &daemon.client,
        Method::POST,
        "/secrets",
        Some(json!({"name": "kept", "value": VALUE})),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED);
    let key_before = std::fs::read(env.data().join("secrets.key")).unwrap();
    daemon.stop();

    let daemon = env.start(&[]);
    assert_eq!(
        std::fs::read(env.data().join("secrets.key")).unwrap(),
        key_before,
        "a restart keeps the key ring"
    );
    let r = call(
        &daemon.client,
        Method::POST,
        "/secrets/kept",
        Some(json!({"value": "next"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(json_of(&r)["currentVersion"], 2);
    daemon.stop();
}

/// HTTPS interception is on by default, so what it needs must not stop a daemon that could
/// otherwise run: on a host with no CA bundle (`SSL_CERT_FILE` naming nothing) the daemon
/// starts without it, saying so; asked for by `--egress-intercept-tls`, it refuses to start
/// and says why. An egress CA file holding more than its certificate is refused.
#[tokio::test]
async fn interception_off_by_a_missing_ca_bundle_warns_unless_it_was_asked_for() {
    use std::io::{BufRead, BufReader, Read};
    use std::process::{Command, Stdio};
    let env = common::Env::new();
    let serve = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_sandcell-serve"))
            .env("SANDCELL_RUN_DIR", env.run_dir())
            .env("SSL_CERT_FILE", env.data().join("no-such-bundle.pem"))
            .env_remove("SSL_CERT_DIR")
            .arg("--data-dir")
            .arg(env.data())
            .args([
                "--listen",
                "127.0.0.1:0",
                "--runtime",
                "gvisor",
                "--kill-on-exit",
            ])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut strict = serve(&["--egress-intercept-tls"]);
    let status = strict.wait().unwrap();
    let mut err = String::new();
    strict
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!status.success(), "{err}");
    assert!(err.contains("trust store is empty"), "{err}");

    let mut lenient = serve(&[]);
    let mut line = String::new();
    BufReader::new(lenient.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(
        line.starts_with("sandcell serve: listening on "),
        "{line:?}"
    );
    // SAFETY: kill has no memory effects; the pid is our own child's.
    unsafe { libc::kill(lenient.id() as i32, libc::SIGTERM) };
    lenient.wait().unwrap();
    let mut err = String::new();
    lenient
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(
        err.contains("is not intercepted") && err.contains("--no-egress-intercept-tls"),
        "{err}"
    );

    // The CA file with its key appended is refused (every guest would get the file as it
    // is): the strict start fails; by default the daemon would run without interception.
    let cert = env.data().join(sandcell_runtime::net::tls_ca::CERT_FILE);
    let key =
        std::fs::read_to_string(env.data().join(sandcell_runtime::net::tls_ca::KEY_FILE)).unwrap();
    let pem = std::fs::read_to_string(&cert).unwrap();
    std::fs::write(&cert, format!("{pem}{key}")).unwrap();
    let mut strict = Command::new(env!("CARGO_BIN_EXE_sandcell-serve"))
        .env("SANDCELL_RUN_DIR", env.run_dir())
        .arg("--data-dir")
        .arg(env.data())
        .args(["--listen", "127.0.0.1:0", "--runtime", "gvisor"])
        .arg("--egress-intercept-tls")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = strict.wait().unwrap();
    let mut err = String::new();
    strict
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!status.success() && err.contains("exactly one"), "{err}");
}
