//! Streamed request bodies: from an `AsyncRead` (uploads) and from a bounded channel (input
//! streams). Both produce data only as fast as the daemon takes it, so nothing is buffered
//! without bound.

use bytes::Bytes;
use hyper::body::{Body, Frame};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

/// A body read from an `AsyncRead` in chunks of at most `chunk` bytes; a read error ends the
/// request with that error (the daemon sees a broken upload, never a short file). The agent's
/// own client streams uploads the same way: one type serves both.
pub use sandcell_agent::body::ReaderBody;

/// A body fed by a bounded channel; it ends when the sender is dropped.
#[derive(Debug)]
pub struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl ChannelBody {
    pub fn new(rx: mpsc::Receiver<Bytes>) -> Self {
        ChannelBody { rx }
    }
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        self.rx
            .poll_recv(cx)
            .map(|chunk| chunk.map(|bytes| Ok(Frame::data(bytes))))
    }
}
