//! HTTP bodies the agent streams: from a bounded channel and from an `AsyncRead`. Both
//! produce data only as fast as the peer takes it, so nothing is buffered without bound.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::{Body, Frame};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::mpsc;

/// Every response and streamed request body in this crate.
pub type BoxBody = UnsyncBoxBody<Bytes, io::Error>;

pub fn full(bytes: impl Into<Bytes>) -> BoxBody {
    http_body_util::Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

pub fn empty() -> BoxBody {
    http_body_util::Empty::new()
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A body fed by a bounded channel; ends when every sender is dropped. When the peer stops
/// reading, the channel fills and senders wait: that is the backpressure.
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

/// A body read from an `AsyncRead` in chunks of at most `chunk` bytes.
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
