//! Files, health, power-off and protocol errors against the real agent binary. (The server
//! on TCP, in-process, is a unit test of `server.rs`.)

mod common;

use common::{Agent, pseudo_random, raw};
use sandcell_proto::agent::{ConnectError, envelope};

fn connect_error(body: &[u8]) -> ConnectError {
    serde_json::from_slice(body).unwrap_or_else(|e| panic!("not a Connect error ({e}): {body:?}"))
}

#[tokio::test]
async fn files_round_trip_binary_content() {
    let agent = Agent::spawn().await;
    let data = pseudo_random(5 * 1024 * 1024 + 7, 42);
    let target = agent.path("sub/dir/blob.bin");
    let target_str = target.to_str().expect("utf-8 path");
    let entries = agent
        .client
        .write_file(target_str, std::io::Cursor::new(data.clone()))
        .await
        .expect("POST /files");
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].name, "blob.bin");
    assert_eq!(entries[0].kind, "file");
    assert_eq!(entries[0].path, target_str);
    assert!(std::fs::read(&target).expect("reading the written file") == data);

    let back = agent
        .client
        .read_file(target_str)
        .await
        .expect("GET /files");
    assert!(back.to_vec(8 << 20).await.expect("file body") == data);

    // Overwrite, with a name that needs escaping; no temporary files are left behind.
    let odd = agent.path("sub/dir/a b&c.txt");
    agent
        .client
        .write_file(
            odd.to_str().expect("utf-8"),
            std::io::Cursor::new(b"x".to_vec()),
        )
        .await
        .expect("write");
    agent
        .client
        .write_file(
            odd.to_str().expect("utf-8"),
            std::io::Cursor::new(b"yz".to_vec()),
        )
        .await
        .expect("write");
    assert_eq!(std::fs::read(&odd).expect("read"), b"yz");
    let mut names: Vec<String> = std::fs::read_dir(agent.path("sub/dir"))
        .expect("read_dir")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    assert_eq!(names, ["a b&c.txt", "blob.bin"]);
}

#[tokio::test]
async fn missing_files_and_directories_are_refused() {
    let agent = Agent::spawn().await;
    let missing = agent.path("nope.txt");
    let err = agent
        .client
        .read_file(missing.to_str().expect("utf-8"))
        .await
        .expect_err("missing file");
    assert_eq!(err.status(), Some(404));
    assert_eq!(err.code(), Some("not_found"));
    let err = agent
        .client
        .read_file(agent.dir.path().to_str().expect("utf-8"))
        .await
        .expect_err("a directory");
    assert_eq!(err.status(), Some(400));
    let (status, _) = raw(&agent.sock, "GET", "/files", None, Vec::new()).await;
    assert_eq!(status, 400, "no path parameter");
}

#[tokio::test]
async fn malformed_requests_get_400_with_a_connect_error() {
    let agent = Agent::spawn().await;
    let (status, body) = raw(
        &agent.sock,
        "POST",
        "/process.Process/SendSignal",
        Some("application/json"),
        b"{not json".to_vec(),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(connect_error(&body).code, "invalid_argument");

    let bad_start = envelope::encode(0, b"{\"process\": 7}");
    let (status, body) = raw(
        &agent.sock,
        "POST",
        "/process.Process/Start",
        Some("application/connect+json"),
        bad_start,
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(connect_error(&body).code, "invalid_argument");

    let (status, _) = raw(
        &agent.sock,
        "POST",
        "/process.Process/Start",
        Some("application/connect+json"),
        vec![0, 0],
    )
    .await;
    assert_eq!(status, 400, "truncated envelope");

    let (status, _) = raw(
        &agent.sock,
        "POST",
        "/process.Process/Start",
        Some("application/json"),
        b"{}".to_vec(),
    )
    .await;
    assert_eq!(
        status, 415,
        "Start without the Connect streaming content type"
    );

    let (status, body) = raw(&agent.sock, "GET", "/no/such/route", None, Vec::new()).await;
    assert_eq!(status, 404);
    assert_eq!(connect_error(&body).code, "unimplemented");
}

#[tokio::test]
async fn oversized_requests_are_refused() {
    let agent = Agent::spawn().await;
    // An envelope that announces 2 MiB: refused from its header.
    let mut wire = vec![0u8];
    wire.extend_from_slice(&(2u32 << 20).to_be_bytes());
    wire.extend_from_slice(b"{}");
    let (status, body) = raw(
        &agent.sock,
        "POST",
        "/process.Process/Start",
        Some("application/connect+json"),
        wire,
    )
    .await;
    assert_eq!(status, 413);
    assert_eq!(connect_error(&body).code, "resource_exhausted");

    // A unary body over 1 MiB.
    let big = format!(
        "{{\"process\":{{\"pid\":1}},\"signal\":\"{}\"}}",
        "x".repeat(2 << 20)
    );
    let head = format!(
        "POST /process.Process/SendSignal HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        big.len()
    );
    let (status, response) = common::raw_unread_body(&agent.sock, &head, big.as_bytes()).await;
    assert_eq!(status, 413, "{response}");
    assert!(response.contains("resource_exhausted"), "{response}");
}

#[tokio::test]
async fn poweroff_outside_pid_1_exits_the_agent() {
    let mut agent = Agent::spawn().await;
    agent.client.poweroff().await.expect("poweroff answered");
    let status = agent.wait_exit().await;
    assert!(status.success(), "agent exit status: {status}");
}
