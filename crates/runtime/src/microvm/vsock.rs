//! The host side of the VMM's hybrid vsock: connect to its Unix socket, send
//! `CONNECT <port>\n`, read `OK <host-port>\n`, then the stream is the guest's port.
//! The answer comes from the VMM (trusted) but is still read bounded and with a deadline:
//! a wedged VMM must not hang the caller.

use std::io;
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// "OK 4294967295\n" is 14 bytes; anything much longer is not an answer.
const MAX_REPLY: usize = 64;

/// A stream to `port` of the guest behind the hybrid vsock socket `uds`.
pub async fn connect(uds: &Path, port: u32) -> io::Result<UnixStream> {
    // Not through a link: a jailed VMM owns the socket's directory (jail/).
    let mut stream = crate::nofollow::connect_unix(uds).await?;
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(&mut stream, port)).await {
        Ok(result) => result.map(|()| stream),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "no answer to CONNECT {port} on {} within {HANDSHAKE_TIMEOUT:?}",
                uds.display()
            ),
        )),
    }
}

async fn handshake(stream: &mut UnixStream, port: u32) -> io::Result<()> {
    stream
        .write_all(format!("CONNECT {port}\n").as_bytes())
        .await?;
    // Byte by byte: whatever follows the newline already belongs to the guest's stream.
    let mut line = Vec::with_capacity(16);
    loop {
        let mut byte = [0u8; 1];
        if stream.read(&mut byte).await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!(
                    "the VMM closed the connection to port {port} (nothing listening there yet?)"
                ),
            ));
        }
        if byte[0] == b'\n' {
            break;
        }
        if line.len() >= MAX_REPLY {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "overlong answer to CONNECT",
            ));
        }
        line.push(byte[0]);
    }
    let reply = String::from_utf8_lossy(&line);
    match reply.strip_prefix("OK ") {
        Some(n) if n.trim().parse::<u32>().is_ok() => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            format!("CONNECT {port} refused: {reply:?}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::UnixListener;

    /// A peer that answers the handshake with `reply` then echoes one message.
    async fn peer(reply: &'static [u8]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.sock");
        let listener = UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 14];
            s.read_exact(&mut buf).await.unwrap();
            assert_eq!(&buf, b"CONNECT 49983\n");
            // The answer and the first guest bytes in one write: the handshake must not eat them.
            let mut out = reply.to_vec();
            out.extend_from_slice(b"hello");
            s.write_all(&out).await.unwrap();
            let mut echo = [0u8; 4];
            s.read_exact(&mut echo).await.unwrap();
            s.write_all(&echo).await.unwrap();
        });
        (dir, path)
    }

    #[tokio::test]
    async fn handshake_keeps_the_bytes_after_the_answer() {
        let (_dir, path) = peer(b"OK 1073741824\n").await;
        let mut s = connect(&path, 49983).await.unwrap();
        let mut hello = [0u8; 5];
        s.read_exact(&mut hello).await.unwrap();
        assert_eq!(&hello, b"hello");
        s.write_all(b"ping").await.unwrap();
        let mut echo = [0u8; 4];
        s.read_exact(&mut echo).await.unwrap();
        assert_eq!(&echo, b"ping");
    }

    #[tokio::test]
    async fn refusals_and_garbage_are_errors() {
        let (_dir, path) = peer(b"FAILURE\n").await;
        assert_eq!(
            connect(&path, 49983).await.unwrap_err().kind(),
            io::ErrorKind::ConnectionRefused
        );
        let (_dir, path) = peer(&[b'x'; 100]).await;
        assert_eq!(
            connect(&path, 49983).await.unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }
}
