//! Upload bodies for `POST /files`, streamed: optional gzip `Content-Encoding` undone on the
//! fly ([`Source`]) and `multipart/form-data` split into parts ([`Multipart`]). Memory stays
//! bounded: gzip output is produced from small input slices (deflate expands at most ~1000x),
//! and the multipart parser holds at most one body frame plus a boundary.

use std::io::Write;

use bytes::{Buf, Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Incoming;

/// Compressed input fed to the decoder per step: bounds one step's output to ~1 MiB.
const GZ_STEP: usize = 1024;
/// Decompressed bytes handed out at once.
const GZ_OUT: usize = 64 * 1024;
/// Largest header block of one multipart part.
const MAX_PART_HEADERS: usize = 16 * 1024;
/// Largest epilogue (bytes after the closing boundary) read and dropped.
const MAX_EPILOGUE: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("receiving the request body: {0}")]
    Body(#[from] hyper::Error),
    #[error("error decompressing request body: {0}")]
    Gzip(std::io::Error),
    #[error("error reading form: {0}")]
    Form(String),
}

/// The request body, gunzipped when it came with `Content-Encoding: gzip`.
pub struct Source {
    body: Incoming,
    gz: Option<flate2::write::GzDecoder<Vec<u8>>>,
    /// Compressed input not yet fed to the decoder.
    pending: Bytes,
    body_done: bool,
}

impl Source {
    pub fn new(body: Incoming, gzip: bool) -> Self {
        Source {
            body,
            gz: gzip.then(|| flate2::write::GzDecoder::new(Vec::new())),
            pending: Bytes::new(),
            body_done: false,
        }
    }

    async fn frame(&mut self) -> Result<Option<Bytes>, UploadError> {
        if self.body_done {
            return Ok(None);
        }
        while let Some(frame) = self.body.frame().await {
            if let Ok(data) = frame?.into_data()
                && !data.is_empty()
            {
                return Ok(Some(data));
            }
        }
        self.body_done = true;
        Ok(None)
    }

    /// The next chunk of (decompressed) content; `None` at the end.
    pub async fn next(&mut self) -> Result<Option<Bytes>, UploadError> {
        if self.gz.is_none() {
            return self.frame().await;
        }
        loop {
            let Some(gz) = self.gz.as_mut() else {
                return Ok(None);
            };
            if gz.get_ref().len() >= GZ_OUT {
                return Ok(Some(Bytes::from(std::mem::take(gz.get_mut()))));
            }
            if !self.pending.is_empty() {
                let step = self.pending.split_to(self.pending.len().min(GZ_STEP));
                gz.write_all(&step).map_err(UploadError::Gzip)?;
                continue;
            }
            match self.frame().await? {
                Some(data) => self.pending = data,
                None => {
                    let Some(mut gz) = self.gz.take() else {
                        return Ok(None);
                    };
                    gz.try_finish().map_err(UploadError::Gzip)?;
                    let rest = std::mem::take(gz.get_mut());
                    return Ok((!rest.is_empty()).then(|| Bytes::from(rest)));
                }
            }
        }
    }
}

/// One part's headers.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PartHeaders {
    /// `name` of the Content-Disposition.
    pub name: Option<String>,
    /// `filename` of the Content-Disposition, with its directories (envd keeps them).
    pub filename: Option<String>,
}

#[derive(Debug, PartialEq, Eq)]
enum State {
    /// Before the first boundary (a preamble may come first).
    Start,
    /// Inside a part's content.
    InPart,
    /// Right at a delimiter (`\r\n--boundary`), the part before it fully read.
    AtDelimiter,
    Done,
}

pub struct Multipart {
    src: Source,
    /// `\r\n--boundary`
    delimiter: Vec<u8>,
    buf: BytesMut,
    state: State,
    eof: bool,
}

/// The boundary parameter of a `multipart/...` Content-Type.
pub fn boundary_of(content_type: &str) -> Option<String> {
    params(content_type)
        .into_iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("boundary"))
        .map(|(_, v)| v)
        .filter(|b| !b.is_empty() && b.len() <= 200)
}

/// `type; a=b; c="d e"` parameters (quoted strings with backslash escapes).
pub fn params(header: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = match header.split_once(';') {
        Some((_, r)) => r,
        None => return out,
    };
    loop {
        rest = rest.trim_start_matches([' ', '\t', ';']);
        let Some(eq) = rest.find('=') else { break };
        let key = rest[..eq].trim().to_owned();
        rest = &rest[eq + 1..];
        let value;
        if let Some(quoted) = rest.strip_prefix('"') {
            let mut v = String::new();
            let mut chars = quoted.char_indices();
            let mut end = quoted.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            v.push(n);
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => v.push(c),
                }
            }
            value = v;
            rest = &quoted[end.min(quoted.len())..];
        } else {
            let end = rest.find(';').unwrap_or(rest.len());
            value = rest[..end].trim().to_owned();
            rest = &rest[end..];
        }
        out.push((key, value));
    }
    out
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

impl Multipart {
    pub fn new(src: Source, boundary: &str) -> Self {
        let mut buf = BytesMut::new();
        // The first boundary has no CRLF before it: pretend it does.
        buf.extend_from_slice(b"\r\n");
        Multipart {
            src,
            delimiter: format!("\r\n--{boundary}").into_bytes(),
            buf,
            state: State::Start,
            eof: false,
        }
    }

    async fn fill(&mut self) -> Result<bool, UploadError> {
        if self.eof {
            return Ok(false);
        }
        match self.src.next().await? {
            Some(b) => {
                self.buf.extend_from_slice(&b);
                Ok(true)
            }
            None => {
                self.eof = true;
                Ok(false)
            }
        }
    }

    /// The next piece of the current part's content; `None` at its end.
    pub async fn read(&mut self) -> Result<Option<Bytes>, UploadError> {
        if self.state != State::InPart {
            return Ok(None);
        }
        loop {
            if let Some(i) = find(&self.buf, &self.delimiter) {
                self.state = State::AtDelimiter;
                if i == 0 {
                    return Ok(None);
                }
                return Ok(Some(self.buf.split_to(i).freeze()));
            }
            // Everything but a possible delimiter prefix at the end is content.
            let keep = self.delimiter.len() - 1;
            if self.buf.len() > keep {
                let n = self.buf.len() - keep;
                return Ok(Some(self.buf.split_to(n).freeze()));
            }
            if !self.fill().await? {
                return Err(UploadError::Form("multipart: unexpected EOF".to_owned()));
            }
        }
    }

    /// Skips to the next part and returns its headers; `None` after the closing boundary.
    pub async fn next_part(&mut self) -> Result<Option<PartHeaders>, UploadError> {
        loop {
            match self.state {
                State::Done => return Ok(None),
                State::InPart => while self.read().await?.is_some() {},
                State::Start => {
                    // Drop the preamble up to the first delimiter.
                    loop {
                        if let Some(i) = find(&self.buf, &self.delimiter) {
                            self.buf.advance(i);
                            break;
                        }
                        let keep = self.delimiter.len() - 1;
                        if self.buf.len() > keep {
                            let n = self.buf.len() - keep;
                            self.buf.advance(n);
                        }
                        if !self.fill().await? {
                            return Err(UploadError::Form("multipart: NextPart: EOF".to_owned()));
                        }
                    }
                    self.state = State::AtDelimiter;
                }
                State::AtDelimiter => break,
            }
        }
        // At `\r\n--boundary`: then `--` (the end) or transport padding and CRLF.
        while self.buf.len() < self.delimiter.len() + 2 {
            if !self.fill().await? {
                return Err(UploadError::Form("multipart: unexpected EOF".to_owned()));
            }
        }
        self.buf.advance(self.delimiter.len());
        if self.buf.starts_with(b"--") {
            self.state = State::Done;
            return Ok(None);
        }
        let headers_end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i;
            }
            if self.buf.len() > MAX_PART_HEADERS {
                return Err(UploadError::Form(
                    "multipart: part headers too large".to_owned(),
                ));
            }
            if !self.fill().await? {
                return Err(UploadError::Form("multipart: unexpected EOF".to_owned()));
            }
        };
        let block = self.buf.split_to(headers_end + 4);
        let text = String::from_utf8_lossy(&block);
        let mut headers = PartHeaders::default();
        // The first line is what followed the boundary (padding); headers follow.
        for line in text.split("\r\n").skip(1) {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            if name.trim().eq_ignore_ascii_case("content-disposition") {
                for (k, v) in params(value) {
                    match k.to_ascii_lowercase().as_str() {
                        "name" => headers.name = Some(v),
                        "filename" => headers.filename = Some(v),
                        _ => {}
                    }
                }
            }
        }
        // The content starts right here; an empty one is followed at once by `\r\n--boundary`.
        self.state = State::InPart;
        Ok(Some(headers))
    }

    /// After the closing boundary: reads the rest of the body (the final CRLF, an epilogue)
    /// and drops it, so that the answer is sent only once the client has sent everything.
    /// Answering earlier makes the server close a connection the client is still writing
    /// to, and the client (or a proxy in between) sees a failed upload.
    pub async fn finish(&mut self) -> Result<(), UploadError> {
        let mut dropped = self.buf.len();
        self.buf.clear();
        while self.fill().await? {
            dropped += self.buf.len();
            self.buf.clear();
            if dropped > MAX_EPILOGUE {
                return Err(UploadError::Form(format!(
                    "multipart: more than {MAX_EPILOGUE} bytes after the closing boundary"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_header_parameters() {
        assert_eq!(
            boundary_of("multipart/form-data; boundary=abc123").as_deref(),
            Some("abc123")
        );
        assert_eq!(
            boundary_of("multipart/form-data; boundary=\"a b\"").as_deref(),
            Some("a b")
        );
        let p = params(r#"form-data; name="file"; filename="dir/a \"q\".txt""#);
        assert_eq!(
            p,
            vec![
                ("name".to_owned(), "file".to_owned()),
                ("filename".to_owned(), "dir/a \"q\".txt".to_owned())
            ]
        );
    }
}
