//! envd's `process.Process` service against the real agent binary, spoken on the wire the way
//! the E2B SDKs speak it: PTY with resize, Connect from a second client, List, StreamInput,
//! users, timeouts.

mod common;

use common::envd::{
    Collected, Envd, Item, USER_UID, b64, basic_auth, call, collect, read_until, require_root,
    sh_request, start_pid, stream,
};
use serde_json::{Value, json};

const START: &str = "/process.Process/Start";

#[tokio::test]
async fn a_pty_process_has_a_terminal_that_resizes() {
    let envd = Envd::spawn(&[]).await;
    let req = sh_request(
        "tty; stty size; read line; echo \"line=$line\"; stty size",
        json!({"pty": {"size": {"cols": 100, "rows": 30}}}),
    );
    let mut s = stream(envd.sock(), START, &[], req).await;
    let pid = start_pid(&mut s).await;
    let mut acc = Collected::default();
    read_until(&mut s, &mut acc, "30 100").await;
    let text = String::from_utf8_lossy(&acc.pty).into_owned();
    assert!(text.starts_with("/dev/pts/"), "tty said {text:?}");
    assert!(acc.stdout.is_empty() && acc.stderr.is_empty(), "{acc:?}");

    let (status, body) = call(
        envd.sock(),
        "/process.Process/Update",
        &[],
        json!({"process": {"pid": pid}, "pty": {"size": {"cols": 120, "rows": 40}}}),
    )
    .await;
    assert_eq!((status, &body), (200, &json!({})));
    // Input goes to the terminal, which echoes it (cooked mode) and hands the line to `read`.
    let (status, _) = call(
        envd.sock(),
        "/process.Process/SendInput",
        &[],
        json!({"process": {"pid": pid}, "input": {"pty": b64(b"hello\n")}}),
    )
    .await;
    assert_eq!(status, 200);
    // The terminal turns \n into \r\n.
    read_until(&mut s, &mut acc, "line=hello\r\n40 120").await;
    let done = collect(&mut s, acc).await;
    assert_eq!(done.end["exitCode"], json!(0), "{done:?}");

    // stdin input and CloseStdin are refused for a PTY process, pty input for a pipe one.
    let mut s = stream(
        envd.sock(),
        START,
        &[],
        sh_request("sleep 5", json!({"pty": {}})),
    )
    .await;
    let pid = start_pid(&mut s).await;
    let (status, body) = call(
        envd.sock(),
        "/process.Process/SendInput",
        &[],
        json!({"process": {"pid": pid}, "input": {"stdin": b64(b"x")}}),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("failed_precondition"))
    );
    let (status, _) = call(
        envd.sock(),
        "/process.Process/CloseStdin",
        &[],
        json!({"process": {"pid": pid}}),
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) = call(
        envd.sock(),
        "/process.Process/SendSignal",
        &[],
        json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}),
    )
    .await;
    assert_eq!(status, 200);
    let done = collect(&mut s, Collected::default()).await;
    assert_eq!(done.end["status"], json!("signal: killed"));
}

#[tokio::test]
async fn a_second_client_connects_by_tag_and_both_see_later_output() {
    let envd = Envd::spawn(&[]).await;
    let req = sh_request(
        "read a; echo got $a; read b; echo got $b",
        json!({"stdin": true, "tag": "worker"}),
    );
    let mut first = stream(envd.sock(), START, &[], req).await;
    let pid = start_pid(&mut first).await;

    let (status, list) = call(envd.sock(), "/process.Process/List", &[], json!({})).await;
    assert_eq!(status, 200);
    let procs = list["processes"].as_array().expect("processes");
    let me = procs
        .iter()
        .find(|p| p["pid"] == json!(pid))
        .unwrap_or_else(|| panic!("pid {pid} not listed: {list}"));
    assert_eq!(me["tag"], json!("worker"));
    assert_eq!(me["config"]["cmd"], json!("/bin/sh"));
    assert_eq!(
        me["config"]["args"][1],
        json!("read a; echo got $a; read b; echo got $b")
    );

    let mut second = stream(
        envd.sock(),
        "/process.Process/Connect",
        &[],
        json!({"process": {"tag": "worker"}}),
    )
    .await;
    assert_eq!(start_pid(&mut second).await, pid);

    let send = |line: &'static [u8]| {
        call(
            envd.sock(),
            "/process.Process/SendInput",
            &[],
            json!({"process": {"pid": pid}, "input": {"stdin": b64(line)}}),
        )
    };
    assert_eq!(send(b"one\n").await.0, 200);
    let (mut a, mut b) = (Collected::default(), Collected::default());
    read_until(&mut first, &mut a, "got one\n").await;
    read_until(&mut second, &mut b, "got one\n").await;

    // The first client leaves; the process and the second client carry on.
    drop(first);
    assert_eq!(send(b"two\n").await.0, 200);
    let b = collect(&mut second, b).await;
    assert_eq!(b.stdout, b"got one\ngot two\n");
    assert_eq!(b.end["exitCode"], json!(0));
    assert_eq!(b.end["exited"], json!(true));

    // After the exit, Connect still reports the end (envd retains it), and List forgets it.
    let mut late = stream(
        envd.sock(),
        "/process.Process/Connect",
        &[],
        json!({"process": {"pid": pid}}),
    )
    .await;
    assert_eq!(start_pid(&mut late).await, pid);
    let late = collect(&mut late, Collected::default()).await;
    assert_eq!(late.end["exitCode"], json!(0));
    let (_, list) = call(envd.sock(), "/process.Process/List", &[], json!({})).await;
    assert!(
        !list["processes"]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p["pid"] == json!(pid))),
        "{list}"
    );

    // Unknown selectors are not_found, in the end-of-stream of a Connect.
    let mut gone = stream(
        envd.sock(),
        "/process.Process/Connect",
        &[],
        json!({"process": {"tag": "nobody"}}),
    )
    .await;
    match gone.next().await {
        Item::End(Some(e)) => assert_eq!(e["code"], json!("not_found")),
        other => panic!("expected a not_found end, got {other:?}"),
    }
}

#[tokio::test]
async fn stream_input_feeds_stdin_in_order() {
    let envd = Envd::spawn(&[]).await;
    let mut s = stream(
        envd.sock(),
        START,
        &[],
        sh_request("cat", json!({"stdin": true})),
    )
    .await;
    let pid = start_pid(&mut s).await;

    let mut wire = Vec::new();
    for msg in [
        json!({"start": {"process": {"pid": pid}}}),
        json!({"data": {"input": {"stdin": b64(b"hello ")}}}),
        json!({"keepalive": {}}),
        json!({"data": {"input": {"stdin": b64(b"world")}}}),
    ] {
        wire.extend(sandcell_proto::agent::envelope::encode(
            0,
            msg.to_string().as_bytes(),
        ));
    }
    let headers = vec![(
        "content-type".to_owned(),
        "application/connect+json".to_owned(),
    )];
    let resp = common::envd::send(
        envd.sock(),
        "POST",
        "/process.Process/StreamInput",
        &headers,
        wire,
    )
    .await;
    assert_eq!(resp.status().as_u16(), 200);
    let body = common::envd::read_all(resp).await;
    let mut decoder = sandcell_proto::agent::envelope::Decoder::new(1024);
    decoder.push(&body);
    let reply = decoder.next().expect("envelope").expect("a reply message");
    assert!(!reply.is_end());
    assert_eq!(reply.message, b"{}");
    let end = decoder
        .next()
        .expect("envelope")
        .expect("the end of stream");
    assert!(end.is_end() && end.message == b"{}", "{end:?}");

    let (status, _) = call(
        envd.sock(),
        "/process.Process/CloseStdin",
        &[],
        json!({"process": {"pid": pid}}),
    )
    .await;
    assert_eq!(status, 200);
    let done = collect(&mut s, Collected::default()).await;
    assert_eq!(done.stdout, b"hello world");

    // Data for a process that does not exist: the error rides the end of the stream.
    let wire = sandcell_proto::agent::envelope::encode(
        0,
        json!({"start": {"process": {"pid": 999_999_999u32}}})
            .to_string()
            .as_bytes(),
    );
    let resp = common::envd::send(
        envd.sock(),
        "POST",
        "/process.Process/StreamInput",
        &headers,
        wire,
    )
    .await;
    let body = common::envd::read_all(resp).await;
    let mut decoder = sandcell_proto::agent::envelope::Decoder::new(1024);
    decoder.push(&body);
    let end = decoder
        .next()
        .expect("envelope")
        .expect("the end of stream");
    let err: Value = serde_json::from_slice(&end.message).expect("json");
    assert_eq!(err["error"]["code"], json!("not_found"), "{err}");
}

#[tokio::test]
async fn processes_run_as_the_requested_user() {
    require_root();
    let envd = Envd::spawn(&[]).await;
    let script = "id -u; id -g; echo \"$HOME $USER $LOGNAME $PWD\"; pwd; echo \"E2B=$E2B_SANDBOX\"";
    // As `user` (Basic auth, as the SDKs send it): their ids, identity and home.
    let mut s = stream(
        envd.sock(),
        START,
        &[basic_auth("user")],
        sh_request(script, json!({})),
    )
    .await;
    start_pid(&mut s).await;
    let out = collect(&mut s, Collected::default()).await;
    let home = envd.home.display().to_string();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{USER_UID}\n{USER_UID}\n{home} user user {home}\n{home}\nE2B=true\n"),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Without a user: envd's default, root (whose home is /root).
    let mut s = stream(envd.sock(), START, &[], sh_request("id -u; pwd", json!({}))).await;
    start_pid(&mut s).await;
    let out = collect(&mut s, Collected::default()).await;
    assert_eq!(out.stdout, b"0\n/root\n");

    // A relative cwd is under the user's home; files they create are theirs.
    std::fs::create_dir(envd.home.join("sub")).expect("mkdir");
    std::os::unix::fs::chown(envd.home.join("sub"), Some(USER_UID), Some(USER_UID)).expect("chown");
    let req =
        json!({"process": {"cmd": "/bin/sh", "args": ["-c", "touch made; pwd"], "cwd": "sub"}});
    let mut s = stream(envd.sock(), START, &[basic_auth("user")], req).await;
    start_pid(&mut s).await;
    let out = collect(&mut s, Collected::default()).await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{home}/sub\n")
    );
    let meta = std::fs::metadata(envd.home.join("sub/made")).expect("made");
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), USER_UID);

    // An unknown user is refused before anything runs.
    let resp = common::envd::send(
        envd.sock(),
        "POST",
        START,
        &[
            basic_auth("mallory"),
            ("content-type".into(), "application/connect+json".into()),
        ],
        sandcell_proto::agent::envelope::encode(
            0,
            sh_request("true", json!({})).to_string().as_bytes(),
        ),
    )
    .await;
    assert_eq!(resp.status().as_u16(), 401);
    let err: Value = serde_json::from_slice(&common::envd::read_all(resp).await).expect("json");
    assert_eq!(err["code"], json!("unauthenticated"));

    // /init makes `user` the default (what E2B templates do).
    let resp = common::envd::send(
        envd.sock(),
        "POST",
        "/init",
        &[("content-type".into(), "application/json".into())],
        json!({"defaultUser": "user"}).to_string().into_bytes(),
    )
    .await;
    assert_eq!(resp.status().as_u16(), 204);
    // (`id -un` would ask the host's NSS, which knows uid 1000 by another name.)
    let mut s = stream(
        envd.sock(),
        START,
        &[],
        sh_request("id -u; echo $USER", json!({})),
    )
    .await;
    start_pid(&mut s).await;
    let out = collect(&mut s, Collected::default()).await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{USER_UID}\nuser\n")
    );
}

#[tokio::test]
async fn connect_timeout_ms_kills_the_process() {
    let envd = Envd::spawn(&[]).await;
    let mut s = stream(
        envd.sock(),
        START,
        &[("connect-timeout-ms".into(), "300".into())],
        sh_request("sleep 30", json!({})),
    )
    .await;
    start_pid(&mut s).await;
    let out = collect(&mut s, Collected::default()).await;
    assert_eq!(out.end["status"], json!("signal: killed"), "{out:?}");
    assert_eq!(out.end["exitCode"], json!(-1));
}

#[tokio::test]
async fn selectors_and_signals_are_checked() {
    let envd = Envd::spawn(&[]).await;
    for (path, msg) in [
        (
            "/process.Process/SendSignal",
            json!({"process": {"tag": "none"}, "signal": 15}),
        ),
        (
            "/process.Process/Update",
            json!({"process": {"pid": 999_999_999u32}}),
        ),
        (
            "/process.Process/CloseStdin",
            json!({"process": {"tag": "none"}}),
        ),
    ] {
        let (status, body) = call(envd.sock(), path, &[], msg).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (404, Some("not_found")),
            "{path}"
        );
    }
    let (status, body) = call(
        envd.sock(),
        "/process.Process/SendSignal",
        &[],
        json!({"process": {}, "signal": "SIGNAL_SIGTERM"}),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (501, Some("unimplemented"))
    );
}

/// `POST /init` with `body` (and the access token, if any): the status and the answer's text.
async fn post_init(sock: &std::path::Path, body: Value, token: Option<&str>) -> (u16, String) {
    let mut headers = vec![("content-type".to_string(), "application/json".to_string())];
    if let Some(t) = token {
        headers.push(("x-access-token".to_string(), t.to_string()));
    }
    let resp = common::envd::send(
        sock,
        "POST",
        "/init",
        &headers,
        body.to_string().into_bytes(),
    )
    .await;
    let status = resp.status().as_u16();
    let body = common::envd::read_all(resp).await;
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A sandbox restored from a snapshot is a new identity in an old memory image: `/init` with
/// another `sandcellSandboxId` may set a new access token (and must, for a `secure` one),
/// while the same id keeps envd's rule (the token cannot be reset). Bad entropy is refused.
#[tokio::test]
async fn a_new_sandbox_id_starts_a_new_identity() {
    let envd = Envd::spawn(&[]).await;
    let init = |body: Value, token: Option<&'static str>| {
        let sock = envd.sock().to_owned();
        async move { post_init(&sock, body, token).await.0 }
    };
    let entropy = "ab".repeat(32);
    let first = json!({"sandcellSandboxId": "sc-parent", "accessToken": "tok-a", "sandcellEntropy": entropy});
    assert_eq!(init(first, None).await, 204);
    // Same identity: a different token is refused.
    let same = json!({"sandcellSandboxId": "sc-parent", "accessToken": "tok-b"});
    assert_eq!(init(same, Some("tok-a")).await, 401);
    // A clone: new id, new token, accepted.
    let clone = json!({"sandcellSandboxId": "sc-child", "accessToken": "tok-c"});
    assert_eq!(init(clone, Some("tok-a")).await, 204);
    let mut s = stream(
        envd.sock(),
        START,
        &[("x-access-token".into(), "tok-c".into())],
        sh_request("echo $E2B_SANDBOX_ID", json!({})),
    )
    .await;
    start_pid(&mut s).await;
    let out = collect(&mut s, Collected::default()).await;
    assert_eq!(String::from_utf8_lossy(&out.stdout), "sc-child\n");
    // The old token no longer works.
    let resp = common::envd::send(
        envd.sock(),
        "POST",
        START,
        &[
            ("content-type".into(), "application/json".into()),
            ("x-access-token".into(), "tok-a".into()),
        ],
        sh_request("true", json!({})).to_string().into_bytes(),
    )
    .await;
    assert_eq!(resp.status().as_u16(), 401);
    let bad =
        json!({"sandcellSandboxId": "sc-child", "accessToken": "tok-c", "sandcellEntropy": "xyz"});
    assert_eq!(init(bad, Some("tok-c")).await, 400);
}

/// `sandcellNet` readdresses a microVM's interface (tests/nested `net_readdress`); an agent
/// that did not configure the network at boot (this one: not PID 1, no `sandcell.net=`)
/// refuses it (409) rather than ignoring it, whatever the token, and a malformed value is a
/// 400 naming the field. Neither changes anything: the token set before still rules.
#[tokio::test]
async fn sandcell_net_is_refused_where_the_agent_does_not_own_the_network() {
    let envd = Envd::spawn(&[]).await;
    let sock = envd.sock().to_owned();
    let init = |body: Value, token: Option<&'static str>| post_init(&sock, body, token);
    let (status, _) = init(json!({"accessToken": "tok-a"}), None).await;
    assert_eq!(status, 204);
    for (value, token) in [
        ("ip=10.1.0.2/24", Some("tok-a")),
        ("ip=10.1.0.2/24,gw=10.1.0.1,colour=blue", None),
        ("", None),
    ] {
        let (status, message) = init(json!({"sandcellNet": value}), token).await;
        assert_eq!(status, 400, "{value:?}: {message}");
        assert!(message.contains("sandcellNet"), "{value:?}: {message}");
    }
    let good = "ip=10.1.0.2/24,gw=10.1.0.1,dns=10.1.0.1";
    for token in [None, Some("tok-a")] {
        let (status, message) = init(json!({"sandcellNet": good}), token).await;
        assert_eq!(status, 409, "{message}");
        assert!(message.contains("sandcellNet"), "{message}");
    }
    // Still the first token's agent: a bare /init is refused, the token's is accepted.
    assert_eq!(init(json!({}), None).await.0, 401);
    assert_eq!(
        init(json!({"accessToken": "tok-a"}), Some("tok-a")).await.0,
        204
    );
}

/// What `script` printed, run by `sh -c` with the access token `token`.
async fn stdout_with_token(envd: &Envd, token: &str, script: &str) -> String {
    let mut s = stream(
        envd.sock(),
        START,
        &[("x-access-token".into(), token.into())],
        sh_request(script, json!({})),
    )
    .await;
    start_pid(&mut s).await;
    let out = collect(&mut s, Collected::default()).await;
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const TEST_CA: &str = "-----BEGIN CERTIFICATE-----\nU0FORENFTEw=\n-----END CERTIFICATE-----\n";

/// `sandcellCaBundle` (the daemon's egress CA) goes into the trust store under
/// `--trust-root` and points Python and Node at it by default env vars that the request's
/// own win over; anything but certificates is a 400 naming the field, and changes nothing;
/// an empty one takes it all out.
#[tokio::test]
async fn a_ca_bundle_goes_into_the_trust_store_under_the_trust_root() {
    let root = tempfile::tempdir().expect("a temp dir");
    let bundle = root.path().join("etc/ssl/certs/ca-certificates.crt");
    std::fs::create_dir_all(bundle.parent().expect("a parent")).expect("mkdir");
    std::fs::write(&bundle, "# the image's own\n").expect("writing the bundle");
    let root_arg = root.path().to_str().expect("a UTF-8 path").to_owned();
    let envd = Envd::spawn(&["--trust-root", &root_arg]).await;
    let sock = envd.sock().to_owned();
    let env = json!({"SSL_CERT_FILE": "/mine.pem"});
    let body = json!({"accessToken": "tok", "envVars": env, "sandcellCaBundle": TEST_CA});
    assert_eq!(post_init(&sock, body, None).await.0, 204);
    let installed = std::fs::read_to_string(&bundle).expect("reading the bundle");
    assert!(installed.starts_with("# the image's own\n"), "{installed}");
    assert_eq!(installed.matches(TEST_CA).count(), 1, "{installed}");
    let anchor = root
        .path()
        .join("usr/local/share/ca-certificates/sandcell-egress.crt");
    assert_eq!(
        std::fs::read_to_string(anchor).expect("the anchor"),
        TEST_CA
    );

    assert_eq!(
        stdout_with_token(
            &envd,
            "tok",
            "echo $NODE_EXTRA_CA_CERTS $REQUESTS_CA_BUNDLE $SSL_CERT_FILE"
        )
        .await,
        "/usr/local/share/ca-certificates/sandcell-egress.crt \
         /etc/ssl/certs/ca-certificates.crt /mine.pem\n"
    );

    for bad in [
        "-----BEGIN PRIVATE KEY-----\nQUJD\n-----END PRIVATE KEY-----\n".to_owned(),
        format!("{TEST_CA}rm -rf /\n"),
        " ".to_owned(),
    ] {
        let body = json!({"accessToken": "tok", "sandcellCaBundle": bad});
        let (status, message) = post_init(&sock, body, Some("tok")).await;
        assert_eq!(status, 400, "{bad:?}: {message}");
        assert!(message.contains("sandcellCaBundle"), "{message}");
    }
    assert_eq!(
        std::fs::read_to_string(&bundle).expect("the bundle"),
        installed
    );
    // An empty one (a daemon that intercepts no longer) takes it all out again.
    let body = json!({"accessToken": "tok", "sandcellCaBundle": ""});
    assert_eq!(post_init(&sock, body, Some("tok")).await.0, 204);
    assert_eq!(
        std::fs::read_to_string(&bundle).expect("the bundle"),
        "# the image's own\n"
    );
    let anchor_env = "echo \"[$NODE_EXTRA_CA_CERTS]\"";
    assert_eq!(stdout_with_token(&envd, "tok", anchor_env).await, "[]\n");

    // Taken out, the same CA goes in again; sent once more (every create sends it), it
    // stays in once and the default env vars still point at it.
    for _ in 0..2 {
        let body = json!({"accessToken": "tok", "sandcellCaBundle": TEST_CA});
        assert_eq!(post_init(&sock, body, Some("tok")).await.0, 204);
        let now = std::fs::read_to_string(&bundle).expect("the bundle");
        assert_eq!(now.matches(TEST_CA).count(), 1, "{now}");
    }
    assert_eq!(
        stdout_with_token(&envd, "tok", anchor_env).await,
        "[/usr/local/share/ca-certificates/sandcell-egress.crt]\n"
    );
}
