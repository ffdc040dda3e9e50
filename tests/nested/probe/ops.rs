//! nested-probe's one-shot operations, for the snapshot tests of tests/nested/l1/tests.sh
//! (busybox has no HTTP client that speaks over a Unix socket, nor Connect envelopes):
//!
//!   nested-probe wait-agent --uds SOCK [--timeout SECS] [--count N]
//!       polls `GET /health` until 2xx; prints `ready_ms=N` (from the call); then N-1 more
//!       requests, each on a new connection, must all answer 2xx (`last_host_port=P`)
//!   nested-probe exec --uds SOCK [--timeout SECS] SHELL_COMMAND
//!       `process.Process/Start` of `/bin/sh -c SHELL_COMMAND` as root; the process's stdout
//!       and stderr to ours; exits with its status (128 + signal when killed)
//!   nested-probe post --uds SOCK --path PATH [--body JSON]   (then the body on a line)
//!       `POST PATH` (e.g. /init, /sandcell/poweroff); `@NOW@` in JSON becomes the current
//!       time in RFC 3339 (nanoseconds); prints `status=N`, exit 0 on 2xx
//!   nested-probe control --socket SOCK --request JSON [--timeout SECS] [--tap NAME]
//!       one line to a sandcell-vmm control socket; prints the answer line and its time
//!       (`control_ms=N`, stderr); exit 0 when the answer is `"result":"ok"`. `--tap`: the
//!       TAP NAME attached here and sent with the line (tap.rs)
//!
//! `exec` and `post` take `--tcp ADDR:PORT` instead of `--uds` (HTTP to a daemon and its envd
//! proxy) and `--header 'Name: value'` (repeatable).
//!
//! Every byte from the agent or the VMM is read with a bound: they are peers like any other.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::{AGENT_PORT, MAX_LINE, read_line_bounded};

/// Largest Start-stream envelope we accept (the agent sends at most 4 MiB).
const MAX_ENVELOPE: usize = 4 << 20;
/// Largest total output of one `exec`.
const MAX_OUTPUT: usize = 16 << 20;

struct Flags {
    uds: String,
    /// `--tcp ADDR:PORT`: plain HTTP to a daemon (its envd proxy) instead of hybrid vsock.
    tcp: String,
    /// `--header 'Name: value'`, repeatable.
    headers: Vec<String>,
    socket: String,
    path: String,
    body: String,
    request: String,
    tap: String,
    timeout: Duration,
    count: u32,
    rest: Vec<String>,
}

fn parse(args: &[String]) -> Result<Flags, String> {
    let mut f = Flags {
        uds: String::new(),
        tcp: String::new(),
        headers: Vec::new(),
        socket: String::new(),
        path: String::new(),
        body: String::new(),
        request: String::new(),
        tap: String::new(),
        timeout: Duration::from_secs(60),
        count: 1,
        rest: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if !a.starts_with("--") {
            f.rest.push(a.clone());
            f.rest.extend(it.by_ref().cloned());
            break;
        }
        let v = it
            .next()
            .ok_or_else(|| format!("{a} needs a value"))?
            .clone();
        match a.as_str() {
            "--uds" => f.uds = v,
            "--tcp" => f.tcp = v,
            "--header" => f.headers.push(v),
            "--socket" => f.socket = v,
            "--path" => f.path = v,
            "--body" => f.body = v,
            "--request" => f.request = v,
            "--tap" => f.tap = v,
            "--count" => f.count = v.parse().map_err(|e| format!("--count {v}: {e}"))?,
            "--timeout" => {
                f.timeout =
                    Duration::from_secs(v.parse().map_err(|e| format!("--timeout {v}: {e}"))?)
            }
            _ => return Err(format!("unknown flag {a}")),
        }
    }
    Ok(f)
}

/// Runs operation `op` with `args`; None when `op` is not one of ours.
pub fn run(op: &str, args: &[String]) -> Option<ExitCode> {
    let result = parse(args).and_then(|f| match op {
        "wait-agent" => wait_agent(&f).map(|()| 0),
        "exec" => exec(&f),
        "post" => post(&f),
        "control" => control(&f),
        _ => Err(String::new()),
    });
    match result {
        Ok(code) => Some(ExitCode::from(code)),
        Err(e) if e.is_empty() => None,
        Err(e) => {
            eprintln!("nested-probe {op}: {e}");
            Some(ExitCode::FAILURE)
        }
    }
}

/// A stream to the agent: hybrid vsock or TCP.
enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Conn {
    fn try_clone(&self) -> Result<Conn, String> {
        match self {
            Conn::Unix(s) => s.try_clone().map(Conn::Unix),
            Conn::Tcp(s) => s.try_clone().map(Conn::Tcp),
        }
        .map_err(|e| e.to_string())
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Unix(s) => s.read(buf),
            Conn::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Unix(s) => s.write(buf),
            Conn::Tcp(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// With `--tcp`, a TCP connection; else a hybrid-vsock stream to the agent after the
/// `CONNECT` handshake.
fn connect(f: &Flags, timeout: Duration) -> Result<(Conn, BufReader<Conn>), String> {
    if !f.tcp.is_empty() {
        let s = TcpStream::connect(&f.tcp).map_err(|e| format!("connect {}: {e}", f.tcp))?;
        s.set_read_timeout(Some(timeout))
            .map_err(|e| e.to_string())?;
        let conn = Conn::Tcp(s);
        let reader = BufReader::new(conn.try_clone()?);
        return Ok((conn, reader));
    }
    let uds = &f.uds;
    let stream = UnixStream::connect(uds).map_err(|e| format!("connect {uds}: {e}"))?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    (&stream)
        .write_all(format!("CONNECT {AGENT_PORT}\n").as_bytes())
        .map_err(|e| format!("write CONNECT: {e}"))?;
    let conn = Conn::Unix(stream);
    let mut reader = BufReader::new(conn.try_clone()?);
    let ok = read_line_bounded(&mut reader)?;
    if !ok.starts_with("OK ") {
        return Err(format!("CONNECT {AGENT_PORT} answered {ok:?}"));
    }
    // The host port the VMM gave this connection (a test holds one across a snapshot).
    eprintln!("nested-probe: host port {}", &ok[3..]);
    Ok((conn, reader))
}

/// Sends one request; returns the status code, whether the body is chunked, and its
/// Content-Length.
fn request(
    f: &Flags,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> Result<(u16, BufReader<Conn>, bool, Option<usize>), String> {
    let (mut stream, mut reader) = connect(f, f.timeout)?;
    let extra: String = f.headers.iter().map(|h| format!("{h}\r\n")).collect();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: agent\r\nContent-Type: {content_type}\r\n{extra}\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream
        .write_all(head.as_bytes())
        .map_err(|e| format!("write {path}: {e}"))?;
    stream
        .write_all(body)
        .map_err(|e| format!("write {path}: {e}"))?;
    let status_line = read_line_bounded(&mut reader)?;
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let (mut chunked, mut length) = (false, None);
    for _ in 0..100 {
        let line = read_line_bounded(&mut reader)?;
        if line.is_empty() {
            return Ok((status, reader, chunked, length));
        }
        let lower = line.to_ascii_lowercase();
        if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
            chunked = true;
        } else if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().ok();
        }
    }
    Err("more than 100 header lines".into())
}

/// The decoded body, de-chunked, at most `max` bytes.
fn read_body(
    r: &mut BufReader<Conn>,
    chunked: bool,
    length: Option<usize>,
    max: usize,
) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    if !chunked {
        let limit = length.unwrap_or(max).min(max) as u64;
        r.take(limit)
            .read_to_end(&mut out)
            .map_err(|e| format!("read body: {e}"))?;
        return Ok(out);
    }
    loop {
        let size_line = read_line_bounded(r)?;
        let hex = size_line.split(';').next().unwrap_or("").trim();
        let size =
            usize::from_str_radix(hex, 16).map_err(|_| format!("bad chunk size {size_line:?}"))?;
        if size == 0 {
            return Ok(out);
        }
        if out.len() + size > max {
            return Err(format!("body larger than {max} bytes"));
        }
        let start = out.len();
        out.resize(start + size, 0);
        r.read_exact(&mut out[start..])
            .map_err(|e| format!("read chunk: {e}"))?;
        let mut crlf = [0u8; 2];
        r.read_exact(&mut crlf)
            .map_err(|e| format!("read chunk end: {e}"))?;
    }
}

fn wait_agent(f: &Flags) -> Result<(), String> {
    let start = Instant::now();
    let mut last = String::from("never tried");
    while start.elapsed() < f.timeout {
        match crate::agent_request(&f.uds, "GET", "/health") {
            Ok(code) if (200..300).contains(&code) => {
                println!("ready_ms={}", start.elapsed().as_millis());
                return more_health(f);
            }
            Ok(code) => last = format!("/health answered {code}"),
            Err(e) => last = e,
        }
        // Each try takes a host port of the VMM: not too many (see snap_restore).
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!(
        "no 2xx from /health within {}s (last: {last})",
        f.timeout.as_secs()
    ))
}

/// `--count`: N-1 more health checks, each on a new connection (so a new host port).
fn more_health(f: &Flags) -> Result<(), String> {
    for i in 1..f.count {
        let (mut stream, mut reader) = connect(f, Duration::from_secs(10))
            .map_err(|e| format!("connection {} of {}: {e}", i + 1, f.count))?;
        stream
            .write_all(b"GET /health HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
            .map_err(|e| format!("write: {e}"))?;
        let line = read_line_bounded(&mut reader)?;
        if !line.contains(" 204 ") && !line.contains(" 200 ") {
            return Err(format!(
                "connection {} of {}: /health answered {line:?}",
                i + 1,
                f.count
            ));
        }
    }
    Ok(())
}

fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The string value of `"key":"..."` in `json` (no escapes expected: base64 or words).
fn field<'a>(json: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!("\"{key}\":\"");
    let start = json.find(&pat)? + pat.len();
    let end = json[start..].find('"')? + start;
    Some(&json[start..end])
}

fn int_field(json: &str, key: &str) -> Option<i64> {
    let pat = format!("\"{key}\":");
    let start = json.find(&pat)? + pat.len();
    let digits: String = json[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '-')
        .collect();
    digits.parse().ok()
}

fn base64_decode(s: &str) -> Result<Vec<u8>, String> {
    let value = |c: u8| -> Result<u32, String> {
        Ok(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return Err(format!("bad base64 byte {c:#x}")),
        } as u32)
    };
    let bytes: Vec<u8> = s.bytes().filter(|&c| c != b'=').collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for group in bytes.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in group.iter().enumerate() {
            acc |= value(c)? << (18 - 6 * i);
        }
        let n = group.len().saturating_sub(1);
        out.extend_from_slice(&acc.to_be_bytes()[1..1 + n]);
    }
    Ok(out)
}

fn exec(f: &Flags) -> Result<u8, String> {
    let command = f.rest.join(" ");
    if command.is_empty() {
        return Err("no command".into());
    }
    let json = format!(
        "{{\"process\":{{\"cmd\":\"/bin/sh\",\"args\":[\"-c\",{}]}},\"stdin\":false}}",
        json_string(&command)
    );
    let mut envelope = vec![0u8];
    envelope.extend_from_slice(&(json.len() as u32).to_be_bytes());
    envelope.extend_from_slice(json.as_bytes());
    let (status, mut reader, chunked, length) = request(
        f,
        "/process.Process/Start",
        "application/connect+json",
        &envelope,
    )?;
    let body = read_body(&mut reader, chunked, length, MAX_OUTPUT)?;
    if status != 200 {
        return Err(format!(
            "Start answered {status}: {}",
            String::from_utf8_lossy(&body)
        ));
    }
    let mut rest = &body[..];
    let mut exit = None;
    while rest.len() >= 5 {
        let flags = rest[0];
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        if len > MAX_ENVELOPE || rest.len() < 5 + len {
            return Err(format!("truncated or oversized envelope ({len} bytes)"));
        }
        let msg = String::from_utf8_lossy(&rest[5..5 + len]).into_owned();
        rest = &rest[5 + len..];
        if flags & 2 != 0 {
            if msg.contains("\"error\"") {
                return Err(format!("Start stream ended with {msg}"));
            }
            break;
        }
        if let Some(b64) = field(&msg, "stdout") {
            std::io::stdout()
                .write_all(&base64_decode(b64)?)
                .map_err(|e| e.to_string())?;
        } else if let Some(b64) = field(&msg, "stderr") {
            std::io::stderr()
                .write_all(&base64_decode(b64)?)
                .map_err(|e| e.to_string())?;
        } else if msg.contains("\"end\"") {
            let code = int_field(&msg, "exitCode").unwrap_or(0);
            let status = field(&msg, "status").unwrap_or("");
            exit = Some(match status.strip_prefix("signal: ") {
                Some(_) if code < 0 => 128 + 9,
                _ => code.clamp(0, 255) as u8,
            });
        }
    }
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    exit.ok_or_else(|| "the Start stream ended without an end event".into())
}

/// RFC 3339 UTC with nanoseconds, for `/init`'s `timestamp`.
fn rfc3339_now() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        now.subsec_nanos()
    )
}

fn post(f: &Flags) -> Result<u8, String> {
    if !f.path.starts_with('/') {
        return Err("--path /PATH is required".into());
    }
    let body = f.body.replace("@NOW@", &rfc3339_now());
    let (status, mut reader, chunked, length) =
        request(f, &f.path, "application/json", body.as_bytes())?;
    println!("status={status}");
    let text = read_body(&mut reader, chunked, length, 64 * 1024).unwrap_or_default();
    if (200..300).contains(&status) {
        // The answer's body, on its own line (a daemon's JSON).
        println!("{}", String::from_utf8_lossy(&text));
        return Ok(0);
    }
    Err(format!(
        "{} answered {status}: {}",
        f.path,
        String::from_utf8_lossy(&text)
    ))
}

fn control(f: &Flags) -> Result<u8, String> {
    let start = Instant::now();
    let mut stream =
        UnixStream::connect(&f.socket).map_err(|e| format!("connect {}: {e}", f.socket))?;
    stream
        .set_read_timeout(Some(f.timeout))
        .map_err(|e| e.to_string())?;
    let line = format!("{}\n", f.request);
    if f.tap.is_empty() {
        stream
            .write_all(line.as_bytes())
            .map_err(|e| format!("write: {e}"))?;
    } else {
        let tap = crate::tap::attach(&f.tap)?;
        crate::tap::send_with_fd(&mut stream, line.as_bytes(), tap.as_raw_fd())?;
    }
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    (&mut reader)
        .take(MAX_LINE)
        .read_line(&mut line)
        .map_err(|e| format!("read the answer: {e}"))?;
    eprintln!("control_ms={}", start.elapsed().as_millis());
    println!("{}", line.trim_end());
    Ok(if line.contains("\"result\":\"ok\"") {
        0
    } else {
        1
    })
}
