//! envd's `filesystem.Filesystem` service, `/files` (multipart, gzip, metadata, users), watches,
//! `/init` and the access token, against the real agent binary.

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;

use common::envd::{Envd, Item, USER_UID, basic_auth, call, read_all, require_root, send, stream};
use serde_json::{Value, json};

const FS: &str = "/filesystem.Filesystem";

fn fs(method: &str) -> String {
    format!("{FS}/{method}")
}

#[tokio::test]
async fn filesystem_calls_answer_like_envd() {
    require_root();
    let envd = Envd::spawn(&[]).await;
    let sock = envd.sock();
    let user = [basic_auth("user")];
    let home = envd.home.display().to_string();

    // MakeDir, relative to the user's home, owned by the user; twice is already_exists.
    let (status, made) = call(sock, &fs("MakeDir"), &user, json!({"path": "a/b"})).await;
    assert_eq!(status, 200, "{made}");
    let entry = &made["entry"];
    assert_eq!(entry["name"], json!("b"));
    assert_eq!(entry["path"], json!(format!("{home}/a/b")));
    assert_eq!(entry["type"], json!("FILE_TYPE_DIRECTORY"));
    assert_eq!(entry["owner"], json!("user"));
    assert_eq!(entry["group"], json!("user"));
    assert_eq!(entry["permissions"], json!("drwxr-xr-x"));
    assert_eq!(entry["mode"], json!(0o755));
    assert!(
        entry["modifiedTime"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{entry}"
    );
    assert_eq!(
        std::fs::metadata(envd.home.join("a")).expect("a").uid(),
        USER_UID
    );
    let (status, err) = call(sock, &fs("MakeDir"), &user, json!({"path": "a/b"})).await;
    assert_eq!(
        (status, err["code"].as_str()),
        (409, Some("already_exists"))
    );

    // Stat of a file and of a symlink (typed by its target, permissions of the link).
    std::fs::write(envd.home.join("a/f.txt"), b"12345").expect("write");
    std::os::unix::fs::symlink(envd.home.join("a/f.txt"), envd.home.join("a/link")).expect("ln");
    let (_, st) = call(sock, &fs("Stat"), &user, json!({"path": "~/a/f.txt"})).await;
    assert_eq!(st["entry"]["type"], json!("FILE_TYPE_FILE"));
    assert_eq!(st["entry"]["size"], json!("5"));
    assert_eq!(st["entry"]["owner"], json!("root"));
    let (_, st) = call(sock, &fs("Stat"), &user, json!({"path": "a/link"})).await;
    assert_eq!(st["entry"]["type"], json!("FILE_TYPE_FILE"));
    assert!(
        st["entry"]["permissions"]
            .as_str()
            .is_some_and(|p| p.starts_with('L'))
    );
    assert_eq!(
        st["entry"]["symlinkTarget"],
        json!(format!("{home}/a/f.txt"))
    );
    let (status, err) = call(sock, &fs("Stat"), &user, json!({"path": "nope"})).await;
    assert_eq!((status, err["code"].as_str()), (404, Some("not_found")));

    // ListDir: depth 1 by default, deeper on request, sorted, paths as requested.
    let (_, ls) = call(sock, &fs("ListDir"), &user, json!({"path": "a"})).await;
    let names: Vec<&str> = ls["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(names, ["b", "f.txt", "link"]);
    std::fs::write(envd.home.join("a/b/deep"), b"").expect("write");
    let (_, ls) = call(
        sock,
        &fs("ListDir"),
        &user,
        json!({"path": "a", "depth": 2}),
    )
    .await;
    let paths: Vec<&str> = ls["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["path"].as_str())
        .collect();
    assert_eq!(
        paths,
        [
            format!("{home}/a/b"),
            format!("{home}/a/b/deep"),
            format!("{home}/a/f.txt"),
            format!("{home}/a/link")
        ]
    );
    let (status, err) = call(sock, &fs("ListDir"), &user, json!({"path": "a/f.txt"})).await;
    assert_eq!(
        (status, err["code"].as_str()),
        (400, Some("invalid_argument"))
    );
    let (status, err) = call(sock, &fs("ListDir"), &user, json!({"path": "zzz"})).await;
    assert_eq!((status, err["code"].as_str()), (404, Some("not_found")));

    // Move creates the destination's parents; a missing source is not_found.
    let (status, mv) = call(
        sock,
        &fs("Move"),
        &user,
        json!({"source": "a/f.txt", "destination": "c/d/g.txt"}),
    )
    .await;
    assert_eq!(status, 200, "{mv}");
    assert_eq!(mv["entry"]["path"], json!(format!("{home}/c/d/g.txt")));
    assert_eq!(
        std::fs::read(envd.home.join("c/d/g.txt")).expect("moved"),
        b"12345"
    );
    let (status, err) = call(
        sock,
        &fs("Move"),
        &user,
        json!({"source": "a/f.txt", "destination": "x"}),
    )
    .await;
    assert_eq!((status, err["code"].as_str()), (404, Some("not_found")));

    // Remove is recursive and quiet about missing paths (os.RemoveAll).
    let (status, _) = call(sock, &fs("Remove"), &user, json!({"path": "a"})).await;
    assert_eq!(status, 200);
    assert!(!envd.home.join("a").exists());
    let (status, _) = call(sock, &fs("Remove"), &user, json!({"path": "a"})).await;
    assert_eq!(status, 200);
}

fn multipart(boundary: &str, files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut body = b"preamble\r\n".to_vec();
    for (name, data) in files {
        body.extend(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n\
                 Content-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(data);
        body.extend(b"\r\n");
    }
    body.extend(format!("--{boundary}--\r\n").as_bytes());
    body
}

#[tokio::test]
async fn files_upload_as_multipart_and_gzip_and_download_gzip() {
    require_root();
    let envd = Envd::spawn(&[]).await;
    let sock = envd.sock();
    let home = envd.home.display().to_string();

    // Two files in one multipart body, paths from their filenames, as `user`.
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let boundary = "XyZ-boundary";
    let body = multipart(boundary, &[("dir/one.bin", &big), ("two.txt", b"")]);
    let resp = send(
        sock,
        "POST",
        "/files?username=user",
        &[(
            "content-type".into(),
            format!("multipart/form-data; boundary={boundary}"),
        )],
        body,
    )
    .await;
    assert_eq!(resp.status().as_u16(), 200);
    let list: Value = serde_json::from_slice(&read_all(resp).await).expect("json");
    assert_eq!(
        list,
        json!([
            {"name": "one.bin", "type": "file", "path": format!("{home}/dir/one.bin")},
            {"name": "two.txt", "type": "file", "path": format!("{home}/two.txt")},
        ])
    );
    assert!(std::fs::read(envd.home.join("dir/one.bin")).expect("one") == big);
    assert_eq!(std::fs::read(envd.home.join("two.txt")).expect("two"), b"");
    for p in ["dir", "dir/one.bin", "two.txt"] {
        let meta = std::fs::metadata(envd.home.join(p)).expect("uploaded");
        assert_eq!((meta.uid(), meta.gid()), (USER_UID, USER_UID), "{p}");
    }

    // A gzip-encoded octet-stream upload with metadata, to an explicit path.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&big).expect("gzip");
    let compressed = gz.finish().expect("gzip");
    let resp = send(
        sock,
        "POST",
        "/files?path=z.bin",
        &[
            basic_auth("user"),
            ("content-type".into(), "application/octet-stream".into()),
            ("content-encoding".into(), "gzip".into()),
            ("x-metadata-Purpose".into(), "test run".into()),
        ],
        compressed,
    )
    .await;
    assert_eq!(resp.status().as_u16(), 200);
    let list: Value = serde_json::from_slice(&read_all(resp).await).expect("json");
    // The `username` parameter is absent: the default user (root) resolves the path.
    assert_eq!(list[0]["path"], json!("/root/z.bin"));
    assert_eq!(list[0]["metadata"], json!({"purpose": "test run"}));
    let stored = std::fs::read("/root/z.bin").expect("z.bin");
    let _ = std::fs::remove_file("/root/z.bin");
    assert!(stored == big);

    // Download with Accept-Encoding: gzip.
    let resp = send(
        sock,
        "GET",
        "/files?path=dir/one.bin&username=user",
        &[("accept-encoding".into(), "gzip, deflate".into())],
        Vec::new(),
    )
    .await;
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(
        resp.headers()
            .get("content-encoding")
            .and_then(|v| v.to_str().ok()),
        Some("gzip")
    );
    let packed = read_all(resp).await;
    let mut unpacked = Vec::new();
    flate2::read::GzDecoder::new(&packed[..])
        .read_to_end(&mut unpacked)
        .expect("gunzip");
    assert!(unpacked == big);

    // Errors in envd's REST shape: {"code": <status>, "message"}.
    for (uri, ct, want) in [
        (
            "/files?path=x&username=mallory",
            "application/octet-stream",
            401,
        ),
        ("/files?path=x", "text/plain", 400),
        ("/files", "application/octet-stream", 400),
    ] {
        let resp = send(
            sock,
            "POST",
            uri,
            &[("content-type".into(), ct.into())],
            b"x".to_vec(),
        )
        .await;
        assert_eq!(resp.status().as_u16(), want, "{uri} {ct}");
        let err: Value = serde_json::from_slice(&read_all(resp).await).expect("json");
        assert_eq!(err["code"], json!(want), "{err}");
    }
    let resp = send(
        sock,
        "GET",
        "/files?path=missing&username=user",
        &[],
        Vec::new(),
    )
    .await;
    assert_eq!(resp.status().as_u16(), 404);

    // Metadata shows up in Stat.
    std::fs::write(envd.home.join("m.txt"), b"").expect("write");
    let resp = send(
        sock,
        "POST",
        "/files?path=m.txt&username=user",
        &[
            ("content-type".into(), "application/octet-stream".into()),
            ("x-metadata-k".into(), "v".into()),
        ],
        b"data".to_vec(),
    )
    .await;
    assert_eq!(resp.status().as_u16(), 200);
    let (_, st) = call(
        sock,
        &fs("Stat"),
        &[basic_auth("user")],
        json!({"path": "m.txt"}),
    )
    .await;
    assert_eq!(st["entry"]["metadata"], json!({"k": "v"}));
}

/// Reads filesystem events until `want` (name, type) pairs were all seen.
async fn expect_events(s: &mut common::envd::EnvelopeStream, want: &[(&str, &str)]) {
    let mut seen: Vec<(String, String)> = Vec::new();
    while !want
        .iter()
        .all(|(n, t)| seen.iter().any(|(sn, st)| sn == n && st == t))
    {
        match s.next().await {
            Item::Message(m) => {
                if let Some(ev) = m.get("filesystem") {
                    seen.push((
                        ev["name"].as_str().unwrap_or("").to_owned(),
                        ev["type"].as_str().unwrap_or("").to_owned(),
                    ));
                }
            }
            Item::End(e) => panic!("watch ended: {e:?}; saw {seen:?}"),
        }
    }
}

#[tokio::test]
async fn watches_report_create_write_and_remove() {
    let envd = Envd::spawn(&[]).await;
    let sock = envd.sock();
    let dir = envd.agent.path("watched");
    std::fs::create_dir(&dir).expect("mkdir");
    let path = dir.display().to_string();

    let mut s = stream(
        sock,
        &fs("WatchDir"),
        &[],
        json!({"path": path, "recursive": true, "includeEntry": true}),
    )
    .await;
    assert_eq!(s.message().await, json!({"start": {}}));
    std::fs::write(dir.join("f"), b"x").expect("create");
    expect_events(
        &mut s,
        &[("f", "EVENT_TYPE_CREATE"), ("f", "EVENT_TYPE_WRITE")],
    )
    .await;
    std::fs::create_dir(dir.join("sub")).expect("mkdir sub");
    expect_events(&mut s, &[("sub", "EVENT_TYPE_CREATE")]).await;
    std::fs::write(dir.join("sub/g"), b"y").expect("create in sub");
    expect_events(&mut s, &[("sub/g", "EVENT_TYPE_CREATE")]).await;
    std::fs::remove_file(dir.join("f")).expect("rm");
    std::fs::rename(dir.join("sub/g"), dir.join("h")).expect("mv");
    expect_events(
        &mut s,
        &[
            ("f", "EVENT_TYPE_REMOVE"),
            ("sub/g", "EVENT_TYPE_RENAME"),
            ("h", "EVENT_TYPE_CREATE"),
        ],
    )
    .await;
    drop(s);

    // The polled variant.
    let (status, created) = call(sock, &fs("CreateWatcher"), &[], json!({"path": path})).await;
    assert_eq!(status, 200, "{created}");
    let id = created["watcherId"].as_str().expect("watcherId").to_owned();
    assert!(id.starts_with('w'));
    std::fs::write(dir.join("p"), b"1").expect("write");
    let mut events = Vec::new();
    for _ in 0..100 {
        let (status, got) =
            call(sock, &fs("GetWatcherEvents"), &[], json!({"watcherId": id})).await;
        assert_eq!(status, 200, "{got}");
        events.extend(got["events"].as_array().cloned().unwrap_or_default());
        if events
            .iter()
            .any(|e| e["name"] == json!("p") && e["type"] == json!("EVENT_TYPE_WRITE"))
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(
        events
            .iter()
            .any(|e| e["name"] == json!("p") && e["type"] == json!("EVENT_TYPE_CREATE")),
        "{events:?}"
    );
    let (status, _) = call(sock, &fs("RemoveWatcher"), &[], json!({"watcherId": id})).await;
    assert_eq!(status, 200);
    let (status, err) = call(sock, &fs("GetWatcherEvents"), &[], json!({"watcherId": id})).await;
    assert_eq!((status, err["code"].as_str()), (404, Some("not_found")));

    // Watching what is not there, or not a directory.
    let (status, err) = call(
        sock,
        &fs("CreateWatcher"),
        &[],
        json!({"path": format!("{path}/h")}),
    )
    .await;
    assert_eq!(
        (status, err["code"].as_str()),
        (400, Some("invalid_argument"))
    );
    let mut s = stream(
        sock,
        &fs("WatchDir"),
        &[],
        json!({"path": format!("{path}/none")}),
    )
    .await;
    match s.next().await {
        Item::End(Some(e)) => assert_eq!(e["code"], json!("not_found")),
        other => panic!("expected not_found, got {other:?}"),
    }
}

#[tokio::test]
async fn init_sets_env_vars_and_the_access_token() {
    let envd = Envd::spawn(&[]).await;
    let sock = envd.sock();
    let json_ct = ("content-type".to_owned(), "application/json".to_owned());
    // Timestamps near the host's own clock: the agent runs as root here and would set the
    // host clock from one that is off (envd's rule), so only "now" and an older, ignored one.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    let stamp = |secs: i64| sandcell_proto::time::format_nanos(secs, 0);
    let resp = send(
        sock,
        "POST",
        "/init",
        std::slice::from_ref(&json_ct),
        json!({"envVars": {"FOO": "bar"}, "accessToken": "secret-token", "timestamp": stamp(now)})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!(resp.status().as_u16(), 204);
    assert_eq!(
        resp.headers()
            .get("x-envd-version")
            .and_then(|v| v.to_str().ok()),
        Some(sandcell_proto::agent::ENVD_VERSION)
    );

    let token = ("x-access-token".to_owned(), "secret-token".to_owned());
    let wrong = ("x-access-token".to_owned(), "nope".to_owned());
    // Everything but /health (and /files, /init) needs the token.
    let resp = send(sock, "GET", "/health", &[], Vec::new()).await;
    assert_eq!(resp.status().as_u16(), 204);
    for headers in [vec![], vec![wrong.clone()]] {
        let resp = send(sock, "GET", "/envs", &headers, Vec::new()).await;
        assert_eq!(resp.status().as_u16(), 401);
        let err: Value = serde_json::from_slice(&read_all(resp).await).expect("json");
        assert_eq!(err["code"], json!(401));
        let (status, _) = call(sock, "/process.Process/List", &headers, json!({})).await;
        assert_eq!(status, 401);
        let resp = send(
            sock,
            "GET",
            "/files?path=/etc/hostname",
            &headers,
            Vec::new(),
        )
        .await;
        assert_eq!(resp.status().as_u16(), 401);
    }
    let resp = send(
        sock,
        "GET",
        "/envs",
        std::slice::from_ref(&token),
        Vec::new(),
    )
    .await;
    assert_eq!(resp.status().as_u16(), 200);
    let envs: Value = serde_json::from_slice(&read_all(resp).await).expect("json");
    assert_eq!(envs, json!({"FOO": "bar", "E2B_SANDBOX": "true"}));

    // Processes get the env vars.
    let mut s = stream(
        sock,
        "/process.Process/Start",
        std::slice::from_ref(&token),
        common::envd::sh_request("echo $FOO", json!({})),
    )
    .await;
    common::envd::start_pid(&mut s).await;
    let out = common::envd::collect(&mut s, Default::default()).await;
    assert_eq!(out.stdout, b"bar\n");

    // A later /init must present the same token; an older timestamp changes nothing.
    for body in [json!({"accessToken": "other"}), json!({"envVars": {}})] {
        let resp = send(
            sock,
            "POST",
            "/init",
            std::slice::from_ref(&json_ct),
            body.to_string().into_bytes(),
        )
        .await;
        assert_eq!(resp.status().as_u16(), 401, "{body}");
    }
    let resp = send(
        sock,
        "POST",
        "/init",
        std::slice::from_ref(&json_ct),
        json!({"accessToken": "secret-token", "envVars": {"FOO": "old"}, "timestamp": stamp(now - 3600)})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!(resp.status().as_u16(), 204);
    let resp = send(
        sock,
        "GET",
        "/envs",
        std::slice::from_ref(&token),
        Vec::new(),
    )
    .await;
    let envs: Value = serde_json::from_slice(&read_all(resp).await).expect("json");
    assert_eq!(envs["FOO"], json!("bar"));

    // The host's runtime stops a sandbox whose token it never saw: power-off is exempt.
    let resp = send(sock, "POST", "/sandcell/poweroff", &[], Vec::new()).await;
    assert_eq!(resp.status().as_u16(), 204);
}

/// The answer to a multipart upload comes only once the whole body was read: the final CRLF
/// (and any epilogue) after the closing boundary too. Answering at the closing boundary let
/// the agent close a connection the client was still writing to (a failed upload for the
/// client, seen with the npm SDK through the daemon).
#[tokio::test]
async fn a_multipart_upload_is_answered_after_its_last_byte() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    require_root();
    let envd = Envd::spawn(&[]).await;
    let boundary = "tail-boundary";
    let mut body = multipart(boundary, &[("tail.txt", b"content")]);
    let epilogue = b"an epilogue the parser must read and drop\r\n";
    body.extend_from_slice(epilogue);
    // Up to and including `--boundary--`; the CRLF after it and the epilogue come later.
    let (head, tail) = body.split_at(body.len() - epilogue.len() - 2);
    assert!(head.ends_with(format!("--{boundary}--").as_bytes()));
    let mut sock = tokio::net::UnixStream::connect(envd.sock())
        .await
        .expect("connect");
    let request = format!(
        "POST /files?username=user HTTP/1.1\r\nhost: x\r\ncontent-type: multipart/form-data; boundary={boundary}\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    sock.write_all(request.as_bytes()).await.expect("headers");
    sock.write_all(head).await.expect("head");
    let mut buf = vec![0u8; 4096];
    let early =
        tokio::time::timeout(std::time::Duration::from_millis(300), sock.read(&mut buf)).await;
    assert!(early.is_err(), "answered before the body ended: {early:?}");
    sock.write_all(tail).await.expect("tail");
    let n = tokio::time::timeout(std::time::Duration::from_secs(10), sock.read(&mut buf))
        .await
        .expect("no answer")
        .expect("read");
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(
        std::fs::read(envd.home.join("tail.txt")).expect("uploaded"),
        b"content"
    );
}
