//! Connect streaming envelopes: 1 byte of flags, a 4-byte big-endian length, then the message.

/// Set on the last envelope of a stream, whose body is an [`super::EndOfStream`].
pub const FLAG_END_STREAM: u8 = 0x02;
/// Set when the message is compressed (never by us; refused on input).
pub const FLAG_COMPRESSED: u8 = 0x01;
pub const HEADER_LEN: usize = 5;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    TooLarge { len: usize, max: usize },
    Compressed,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::TooLarge { len, max } => {
                write!(
                    f,
                    "connect envelope of {len} bytes exceeds the {max}-byte limit"
                )
            }
            DecodeError::Compressed => write!(f, "compressed connect envelopes are not supported"),
        }
    }
}

impl std::error::Error for DecodeError {}

pub fn encode(flags: u8, message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + message.len());
    out.push(flags);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// One decoded envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub flags: u8,
    pub message: Vec<u8>,
}

impl Envelope {
    pub fn is_end(&self) -> bool {
        self.flags & FLAG_END_STREAM != 0
    }
}

/// Incremental decoder: feed bytes as they arrive, take whole envelopes out. Refuses any
/// envelope longer than `max_len` before buffering it, so a hostile peer cannot make us
/// allocate without bound.
#[derive(Debug)]
pub struct Decoder {
    buf: Vec<u8>,
    max_len: usize,
}

impl Decoder {
    pub fn new(max_len: usize) -> Self {
        Decoder {
            buf: Vec::new(),
            max_len,
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete envelope, `Ok(None)` if more bytes are needed.
    // Not `Iterator::next`: a decode error is not the end of the stream, and "no whole
    // envelope yet" (Ok(None)) is not either.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Envelope>, DecodeError> {
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let flags = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > self.max_len {
            return Err(DecodeError::TooLarge {
                len,
                max: self.max_len,
            });
        }
        if flags & FLAG_COMPRESSED != 0 {
            return Err(DecodeError::Compressed);
        }
        if self.buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let message = self.buf[HEADER_LEN..HEADER_LEN + len].to_vec();
        self.buf.drain(..HEADER_LEN + len);
        Ok(Some(Envelope { flags, message }))
    }

    /// Bytes received that do not yet form a whole envelope.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_byte_by_byte() {
        let mut wire = encode(0, b"{\"a\":1}");
        wire.extend(encode(FLAG_END_STREAM, b"{}"));
        let mut d = Decoder::new(1024);
        let mut got = Vec::new();
        for b in wire {
            d.push(&[b]);
            while let Some(e) = d.next().unwrap() {
                got.push(e);
            }
        }
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].message, b"{\"a\":1}");
        assert!(got[1].is_end());
        assert_eq!(d.pending(), 0);
    }

    #[test]
    fn refuses_oversized_before_buffering() {
        let mut d = Decoder::new(16);
        d.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(d.next(), Err(DecodeError::TooLarge { .. })));
    }
}
