//! Speaking envd's wire protocol to the agent the way the E2B SDKs do: Connect unary calls
//! (JSON), server streams (envelopes), client streams, REST routes; and an agent with its own
//! `passwd` holding `root` and `user` (uid 1000, home in the test directory).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use sandcell_proto::agent::envelope;
use serde_json::Value;

use super::Agent;

pub const USER_UID: u32 = 1000;

/// The tests that switch users need root; they fail loudly without it.
pub fn require_root() {
    // SAFETY: geteuid cannot fail and touches no memory.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test switches to uid 1000 and must run as root (it runs as {euid})"
    );
}

pub struct Envd {
    pub agent: Agent,
    /// `user`'s home (owned by 1000).
    pub home: PathBuf,
}

impl Envd {
    /// An agent whose `/etc` is a test directory with `root` and `user`.
    pub async fn spawn(extra: &[&str]) -> Envd {
        let dir = tempfile::tempdir().expect("creating a temp dir");
        // The test directory must be reachable by uid 1000.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod the test dir");
        let etc = dir.path().join("etc");
        let home = dir.path().join("home/user");
        std::fs::create_dir_all(&etc).expect("mkdir etc");
        std::fs::create_dir_all(&home).expect("mkdir home");
        std::fs::set_permissions(
            dir.path().join("home"),
            std::fs::Permissions::from_mode(0o755),
        )
        .expect("chmod home");
        std::os::unix::fs::chown(&home, Some(USER_UID), Some(USER_UID)).expect("chown home");
        std::fs::write(
            etc.join("passwd"),
            format!(
                "root:x:0:0:root:/root:/bin/sh\nuser:x:{USER_UID}:{USER_UID}::{}:/bin/sh\n",
                home.display()
            ),
        )
        .expect("write passwd");
        std::fs::write(
            etc.join("group"),
            format!("root:x:0:\nuser:x:{USER_UID}:\n"),
        )
        .expect("write group");
        let mut args = vec!["--etc-dir".to_owned(), etc.display().to_string()];
        args.extend(extra.iter().map(|s| s.to_string()));
        let agent = Agent::spawn_with(dir, &args).await;
        Envd { agent, home }
    }

    pub fn sock(&self) -> &Path {
        &self.agent.sock
    }
}

pub fn basic_auth(user: &str) -> (String, String) {
    use base64::Engine;
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:"));
    ("authorization".to_owned(), format!("Basic {token}"))
}

pub fn b64(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}

pub fn unb64(data: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(data)
        .expect("base64 from the agent")
}

/// One HTTP/1.1 request on a fresh connection; the response head and body.
pub async fn send(
    sock: &Path,
    method: &str,
    uri: &str,
    headers: &[(String, String)],
    body: Vec<u8>,
) -> hyper::Response<Incoming> {
    let io = tokio::net::UnixStream::connect(sock)
        .await
        .expect("connecting to the agent");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .header("host", "agent");
    for (k, v) in headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let req = req
        .body(Full::new(Bytes::from(body)))
        .expect("building a request");
    sender.send_request(req).await.expect("sending a request")
}

pub async fn read_all(resp: hyper::Response<Incoming>) -> Bytes {
    resp.into_body()
        .collect()
        .await
        .expect("reading a body")
        .to_bytes()
}

/// A Connect unary call: (HTTP status, JSON answer).
pub async fn call(
    sock: &Path,
    method_path: &str,
    headers: &[(String, String)],
    message: Value,
) -> (u16, Value) {
    let mut h = vec![("content-type".to_owned(), "application/json".to_owned())];
    h.extend_from_slice(headers);
    let resp = send(
        sock,
        "POST",
        method_path,
        &h,
        message.to_string().into_bytes(),
    )
    .await;
    let status = resp.status().as_u16();
    let body = read_all(resp).await;
    let json = serde_json::from_slice(&body).unwrap_or_else(|e| {
        panic!(
            "{method_path}: answer is not JSON ({e}): {}",
            String::from_utf8_lossy(&body)
        )
    });
    (status, json)
}

/// A server stream being read.
pub struct EnvelopeStream {
    body: Incoming,
    decoder: envelope::Decoder,
}

/// One item of a stream: a message, or the end (with its error, if any).
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Message(Value),
    End(Option<Value>),
}

impl EnvelopeStream {
    pub async fn next(&mut self) -> Item {
        loop {
            if let Some(env) = self.decoder.next().expect("a well-formed envelope") {
                let json: Value = serde_json::from_slice(&env.message).expect("JSON envelope");
                if env.is_end() {
                    return Item::End(json.get("error").cloned());
                }
                return Item::Message(json);
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.decoder.push(&data);
                    }
                }
                Some(Err(e)) => panic!("stream broke: {e}"),
                None => panic!("stream ended without an end-of-stream envelope"),
            }
        }
    }

    /// The next message that is not a keepalive; panics at the end of the stream.
    pub async fn message(&mut self) -> Value {
        loop {
            match self.next().await {
                Item::Message(m) if is_keepalive(&m) => continue,
                Item::Message(m) => return m,
                Item::End(e) => panic!("stream ended early (error {e:?})"),
            }
        }
    }
}

fn is_keepalive(m: &Value) -> bool {
    m.get("keepalive").is_some() || m.pointer("/event/keepalive").is_some()
}

/// Opens a server-streaming call; asserts the 200 and the Connect content type.
pub async fn stream(
    sock: &Path,
    method_path: &str,
    headers: &[(String, String)],
    message: Value,
) -> EnvelopeStream {
    let mut h = vec![(
        "content-type".to_owned(),
        "application/connect+json".to_owned(),
    )];
    h.extend_from_slice(headers);
    let wire = envelope::encode(0, message.to_string().as_bytes());
    let resp = send(sock, "POST", method_path, &h, wire).await;
    assert_eq!(resp.status().as_u16(), 200, "{method_path}");
    assert_eq!(
        resp.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/connect+json")
    );
    EnvelopeStream {
        body: resp.into_body(),
        decoder: envelope::Decoder::new(16 << 20),
    }
}

/// Output and end of a process stream, from after the start event.
#[derive(Debug, Default)]
pub struct Collected {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub pty: Vec<u8>,
    pub end: Value,
}

/// Reads the start event and returns the pid.
pub async fn start_pid(s: &mut EnvelopeStream) -> u32 {
    let m = s.message().await;
    m.pointer("/event/start/pid")
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("expected a start event, got {m}")) as u32
}

/// Reads data events until the output (of any kind) contains `needle`.
pub async fn read_until(s: &mut EnvelopeStream, acc: &mut Collected, needle: &str) {
    while !String::from_utf8_lossy(&[&acc.stdout[..], &acc.pty[..]].concat()).contains(needle) {
        let m = s.message().await;
        absorb(&m, acc);
        assert!(
            m.pointer("/event/end").is_none(),
            "ended before {needle:?}: {acc:?}"
        );
    }
}

fn absorb(m: &Value, acc: &mut Collected) {
    if let Some(d) = m.pointer("/event/data") {
        for (field, buf) in [
            ("stdout", &mut acc.stdout),
            ("stderr", &mut acc.stderr),
            ("pty", &mut acc.pty),
        ] {
            if let Some(v) = d.get(field).and_then(Value::as_str) {
                buf.extend(unb64(v));
            }
        }
    }
    if let Some(e) = m.pointer("/event/end") {
        acc.end = e.clone();
    }
}

/// Reads to the end event and the end of the stream.
pub async fn collect(s: &mut EnvelopeStream, mut acc: Collected) -> Collected {
    loop {
        match s.next().await {
            Item::Message(m) => absorb(&m, &mut acc),
            Item::End(None) => return acc,
            Item::End(Some(e)) => panic!("stream error {e}"),
        }
    }
}

/// `{"process": {"cmd": "/bin/sh", "args": ["-c", script]}}` plus `extra` fields.
pub fn sh_request(script: &str, extra: Value) -> Value {
    let mut req = serde_json::json!({
        "process": {"cmd": "/bin/sh", "args": ["-c", script]},
    });
    if let (Some(obj), Some(more)) = (req.as_object_mut(), extra.as_object()) {
        for (k, v) in more {
            obj.insert(k.clone(), v.clone());
        }
    }
    req
}
