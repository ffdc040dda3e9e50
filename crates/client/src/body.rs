//! Streamed request bodies: from an `AsyncRead` (uploads) and from a bounded channel (input
//! streams). Both produce data only as fast as the daemon takes it, so nothing is buffered
//! without bound.

use bytes::{Bytes, BytesMut};
use hyper::body::{Body, Frame};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::mpsc;

/// A body read from an `AsyncRead` in chunks of at most `chunk` bytes; a read error ends the
/// request with that error (the daemon sees a broken upload, never a short file).
#[derive(Debug)]
pub struct ReaderBody<R> {
    reader: Option<R>,
    buf: BytesMut,
    chunk: usize,
}

impl<R> ReaderBody<R> {
    pub fn new(reader: R, chunk: usize) -> Self {
        ReaderBody {
            reader: Some(reader),
            buf: BytesMut::new(),
            chunk: chunk.max(1),
        }
    }
}

impl<R: AsyncRead + Unpin> Body for ReaderBody<R> {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = &mut *self;
        let Some(reader) = this.reader.as_mut() else {
            return Poll::Ready(None);
        };
        this.buf.resize(this.chunk, 0);
        let mut read_buf = ReadBuf::new(&mut this.buf);
        let polled = ready!(Pin::new(reader).poll_read(cx, &mut read_buf));
        let filled = read_buf.filled().len();
        match polled {
            Err(e) => {
                this.reader = None;
                Poll::Ready(Some(Err(e)))
            }
            Ok(()) if filled == 0 => {
                this.reader = None;
                Poll::Ready(None)
            }
            Ok(()) => Poll::Ready(Some(Ok(Frame::data(this.buf.split_to(filled).freeze())))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.reader.is_none()
    }
}

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
