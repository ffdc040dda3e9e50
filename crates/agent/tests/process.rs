//! `process.Process/*` against the real agent binary on a Unix socket.

mod common;

use std::time::Duration;

use common::{Agent, pseudo_random, request, run, sh};
use sandcell_envd_client::{OutputKind, decode_data};
use sandcell_proto::agent::Event;

#[tokio::test]
async fn exit_codes_are_reported() {
    let agent = Agent::spawn().await;
    for code in [0, 3, 255] {
        let out = run(&agent.client, &sh(&format!("exit {code}"))).await;
        assert!(out.end.exited, "exit {code}: {:?}", out.end);
        assert_eq!(out.end.exit_code, code);
        assert_eq!(out.end.status, format!("exit status {code}"));
        assert_eq!(out.end.shell_status(), code);
        assert!(out.pid.is_some(), "no start event");
    }
}

#[tokio::test]
async fn a_process_that_kills_itself_reports_the_signal() {
    let agent = Agent::spawn().await;
    let out = run(&agent.client, &sh("kill -TERM $$")).await;
    assert!(!out.end.exited);
    assert_eq!(out.end.status, "signal: terminated");
    assert_eq!(out.end.shell_status(), 143);
}

#[tokio::test]
async fn send_signal_kills_the_process_group() {
    let agent = Agent::spawn().await;
    // The shell waits on a child: SIGKILL must reach the group for the shell to end too.
    let mut stream = agent
        .client
        .start(&sh("sleep 1000; echo not reached"))
        .await
        .expect("Start");
    let pid = match stream.next().await {
        Some(Ok(ev)) => match ev.event {
            Event::Start(s) => s.pid,
            other => panic!("first event is not start: {other:?}"),
        },
        other => panic!("no start event: {other:?}"),
    };
    agent.client.send_signal(pid, 9).await.expect("SendSignal");
    let out = stream.collect(1 << 20).await.expect("stream");
    assert_eq!(out.end.status, "signal: killed");
    assert_eq!(out.end.shell_status(), 137);
    assert!(out.stdout.is_empty());
}

#[tokio::test]
async fn stdout_and_stderr_arrive_apart_and_in_order() {
    let agent = Agent::spawn().await;
    let script =
        "printf a1; sleep 0.3; printf b1 >&2; sleep 0.3; printf a2; sleep 0.3; printf b2 >&2";
    let mut stream = agent.client.start(&sh(script)).await.expect("Start");
    let mut seen: Vec<(OutputKind, Vec<u8>)> = Vec::new();
    while let Some(ev) = stream.next().await {
        if let Event::Data(d) = ev.expect("event").event {
            let (kind, bytes) = decode_data(&d).expect("data");
            match seen.last_mut() {
                Some((k, acc)) if *k == kind => acc.extend(bytes),
                _ => seen.push((kind, bytes)),
            }
        }
    }
    let expected = vec![
        (OutputKind::Stdout, b"a1".to_vec()),
        (OutputKind::Stderr, b"b1".to_vec()),
        (OutputKind::Stdout, b"a2".to_vec()),
        (OutputKind::Stderr, b"b2".to_vec()),
    ];
    assert_eq!(seen, expected);
}

#[tokio::test]
async fn ten_mib_of_output_arrives_intact() {
    let agent = Agent::spawn().await;
    let data = pseudo_random(10 * 1024 * 1024, 0x5eed);
    let file = agent.path("big.bin");
    std::fs::write(&file, &data).expect("writing the test file");
    let out = run(
        &agent.client,
        &request("cat", &[file.to_str().expect("utf-8 path")]),
    )
    .await;
    assert_eq!(out.end.exit_code, 0);
    assert_eq!(out.stdout.len(), data.len());
    assert!(out.stdout == data, "stdout differs from the file");
}

#[tokio::test]
async fn stdin_round_trip() {
    let agent = Agent::spawn().await;
    let mut req = request("cat", &[]);
    req.stdin = Some(true);
    let mut stream = agent.client.start(&req).await.expect("Start");
    let pid = match stream.next().await {
        Some(Ok(ev)) => match ev.event {
            Event::Start(s) => s.pid,
            other => panic!("first event is not start: {other:?}"),
        },
        other => panic!("no start event: {other:?}"),
    };
    agent
        .client
        .send_input(pid, b"hello ")
        .await
        .expect("SendInput");
    agent
        .client
        .send_input(pid, &[0, 255, b'\n'])
        .await
        .expect("SendInput");
    agent.client.close_stdin(pid).await.expect("CloseStdin");
    let out = stream.collect(1 << 20).await.expect("stream");
    assert_eq!(out.stdout, b"hello \x00\xff\n");
    assert_eq!(out.end.exit_code, 0);
}

#[tokio::test]
async fn without_stdin_the_process_reads_dev_null_and_send_input_is_refused() {
    let agent = Agent::spawn().await;
    let mut stream = agent
        .client
        .start(&sh("cat; echo eof; sleep 1000"))
        .await
        .expect("Start");
    let pid = match stream.next().await {
        Some(Ok(ev)) => match ev.event {
            Event::Start(s) => s.pid,
            other => panic!("first event is not start: {other:?}"),
        },
        other => panic!("no start event: {other:?}"),
    };
    // `cat` reads EOF from /dev/null at once; wait for the echo that follows it.
    let mut stdout = Vec::new();
    while stdout != b"eof\n" {
        match stream
            .next()
            .await
            .expect("stream ended early")
            .expect("event")
            .event
        {
            Event::Data(d) => stdout.extend(decode_data(&d).expect("data").1),
            Event::Keepalive(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    let err = agent
        .client
        .send_input(pid, b"x")
        .await
        .expect_err("SendInput without stdin");
    assert_eq!(err.code(), Some("failed_precondition"));
    agent.client.send_signal(pid, 15).await.expect("SendSignal");
    let out = stream.collect(1 << 20).await.expect("stream");
    assert!(out.stdout.is_empty());
    assert_eq!(out.end.shell_status(), 143);
}

#[tokio::test]
async fn env_and_cwd_are_applied() {
    let agent = Agent::spawn().await;
    let mut req = sh(r#"printf '%s|%s' "$FOO" "$(pwd)""#);
    req.process.envs.insert("FOO".into(), "bar baz".into());
    let cwd = agent.dir.path().canonicalize().expect("canonical temp dir");
    req.process.cwd = Some(cwd.to_str().expect("utf-8 path").to_owned());
    let out = run(&agent.client, &req).await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("bar baz|{}", cwd.display())
    );
}

#[tokio::test]
async fn a_missing_command_or_cwd_is_a_clear_error() {
    let agent = Agent::spawn().await;
    for cmd in ["/nonexistent/program", "no-such-command-sandcell"] {
        let mut stream = agent
            .client
            .start(&request(cmd, &[]))
            .await
            .expect("Start answers 200");
        let err = match stream.next().await {
            Some(Err(e)) => e,
            other => panic!("{cmd}: expected an error, got {other:?}"),
        };
        assert_eq!(err.code(), Some("not_found"), "{cmd}: {err}");
        assert!(err.to_string().contains(cmd), "{err}");
    }
    let mut req = sh("true");
    req.process.cwd = Some("/nonexistent/dir".into());
    let mut stream = agent.client.start(&req).await.expect("Start answers 200");
    match stream.next().await {
        Some(Err(e)) => assert_eq!(e.code(), Some("invalid_argument"), "{e}"),
        other => panic!("expected an error, got {other:?}"),
    }
}

#[tokio::test]
async fn unknown_pids_are_not_found() {
    let agent = Agent::spawn().await;
    let pid = 999_999_999;
    for err in [
        agent
            .client
            .send_signal(pid, 9)
            .await
            .expect_err("SendSignal"),
        agent
            .client
            .send_input(pid, b"x")
            .await
            .expect_err("SendInput"),
        agent.client.close_stdin(pid).await.expect_err("CloseStdin"),
    ] {
        assert_eq!(err.status(), Some(404), "{err}");
        assert_eq!(err.code(), Some("not_found"), "{err}");
    }
}

#[tokio::test]
async fn keepalives_are_sent_while_a_process_is_quiet() {
    let dir = tempfile::tempdir().expect("temp dir");
    let sock = dir.path().join("agent.sock");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sandcell-agent"))
        .args(["--keepalive-secs", "1", "--listen"])
        .arg(format!("unix:{}", sock.display()))
        .spawn()
        .expect("spawning the agent");
    let client = sandcell_envd_client::EnvdClient::unix(&sock);
    let mut ready = false;
    for _ in 0..400 {
        if client.health().await.is_ok() {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready, "agent not healthy");
    let mut stream = client.start(&sh("sleep 1000")).await.expect("Start");
    let mut pid = None;
    // Read until a keepalive arrives (the stream would otherwise be silent for 1000 s).
    loop {
        match stream
            .next()
            .await
            .expect("stream ended early")
            .expect("event")
            .event
        {
            Event::Start(s) => pid = Some(s.pid),
            Event::Keepalive(_) => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    client
        .send_signal(pid.expect("start before keepalive"), 9)
        .await
        .expect("SendSignal");
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test]
async fn a_client_that_leaves_mid_stream_leaves_the_process_running_unblocked() {
    let agent = Agent::spawn().await;
    let marker = agent.path("done");
    // 20 MB is far more than the pipe, the stream queue and the socket buffers hold: the
    // process only reaches `touch` if the agent keeps draining its output after we leave.
    let script = format!("head -c 20000000 /dev/zero; touch {}", marker.display());
    let mut stream = agent.client.start(&sh(&script)).await.expect("Start");
    let mut got_data = false;
    while !got_data {
        match stream
            .next()
            .await
            .expect("stream ended early")
            .expect("event")
            .event
        {
            Event::Data(_) => got_data = true,
            Event::Start(_) | Event::Keepalive(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    drop(stream);
    let mut done = false;
    for _ in 0..600 {
        if marker.exists() {
            done = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(done, "the process never finished after the client left");
    // The agent still serves.
    agent
        .client
        .health()
        .await
        .expect("health after a disconnect");
    let out = run(&agent.client, &sh("echo still here")).await;
    assert_eq!(out.stdout, b"still here\n");
}
