//! `ADD <http(s) URL> <dest>`: the download, as Docker does it: the file as served (never
//! unpacked), its name taken from the URL's path when the destination is a directory, its
//! mtime from `Last-Modified` when the server sends one. The size is bounded by
//! [`Limits::max_file_bytes`] (a `Content-Length` above it is refused before reading, and the
//! body is counted as it arrives), and the sha256 of what arrived is returned: it goes into
//! the step's cache key, so a changed remote file makes a new layer.
//!
//! reqwest (the one oci-client already builds, rustls with the ring provider) on a
//! current-thread runtime of its own thread: the build runs on a blocking thread, which may
//! or may not belong to a tokio runtime.

use crate::digest::{Digest, Hasher};
use crate::{Error, Limits, Result};
use std::io::Write;
use std::path::Path;
use std::time::Duration;

/// What a download produced.
#[derive(Debug, Clone)]
pub(crate) struct Fetched {
    pub digest: Digest,
    pub size: u64,
}

impl Fetched {
    /// A progress line.
    pub fn describe(&self, url: &str) -> String {
        format!("downloaded {url}: {} bytes, {}", self.size, self.digest)
    }
}

/// Downloads `url` into the new file `to` (mode 0600), bounded by `limits`.
pub(crate) fn download(url: &str, to: &Path, limits: &Limits) -> Result<Fetched> {
    let max = limits.max_file_bytes;
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| fail(url, format!("starting a runtime for the download: {e}")))?;
                runtime.block_on(get(url, to, max))
            })
            .join()
            .map_err(|_| fail(url, "the download thread panicked".into()))?
    })
}

fn fail(url: &str, problem: String) -> Error {
    Error::Tool {
        tool: "ADD",
        problem: format!("downloading {url}: {problem}"),
    }
}

async fn get(url: &str, to: &Path, max: u64) -> Result<Fetched> {
    // reqwest is built without a default TLS provider (as for registry pulls): ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(30))
        .read_timeout(Duration::from_secs(120))
        .build()
        .map_err(|e| fail(url, e.to_string()))?;
    let mut response = client
        .get(url)
        .send()
        .await
        .map_err(|e| fail(url, e.to_string()))?;
    let status = response.status();
    if !status.is_success() {
        return Err(fail(url, format!("the server answered {status}")));
    }
    let too_large = || Error::TooLarge {
        layer: format!("ADD {url}"),
        what: "the download".into(),
        limit: max,
        unit: "bytes",
    };
    if response.content_length().is_some_and(|n| n > max) {
        return Err(too_large());
    }
    let mtime = response
        .headers()
        .get(reqwest::header::LAST_MODIFIED)
        .and_then(|v| v.to_str().ok())
        .and_then(http_date);
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(to)
            .map_err(Error::io("creating", to))?
    };
    let mut out = std::io::BufWriter::new(file);
    let mut hasher = Hasher::default();
    let mut size: u64 = 0;
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| fail(url, e.to_string()))?
    {
        size += chunk.len() as u64;
        if size > max {
            return Err(too_large());
        }
        hasher.update(&chunk);
        out.write_all(&chunk).map_err(Error::io("writing", to))?;
    }
    out.flush().map_err(Error::io("writing", to))?;
    drop(out);
    if let Some(secs) = mtime {
        crate::unpack::set_mtime_nofollow(to, secs)
            .map_err(Error::io("setting the mtime of", to))?;
    }
    Ok(Fetched {
        digest: hasher.finish(),
        size,
    })
}

/// The file name `ADD URL dir/` gives: the last segment of the URL's path, percent-decoded.
/// `None` when there is none that can be a file name (`http://host/`, `..`, a `/` inside).
pub(crate) fn file_name(url: &str) -> Option<String> {
    let parsed = reqwest::Url::parse(url).ok()?;
    let last = parsed.path_segments()?.next_back()?;
    let name = String::from_utf8(percent_decode(last)).ok()?;
    let usable = !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0']);
    usable.then_some(name)
}

fn percent_decode(s: &str) -> Vec<u8> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// An HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`, RFC 9110's preferred form) as Unix
/// seconds; `None` for anything else.
pub(crate) fn http_date(s: &str) -> Option<i64> {
    let parts: Vec<&str> = s.split_whitespace().collect();
    let [_, day, month, year, time, "GMT"] = parts.as_slice() else {
        return None;
    };
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = MONTHS.iter().position(|m| m == month)? as i64 + 1;
    let (day, year): (i64, i64) = (day.parse().ok()?, year.parse().ok()?);
    let hms: Vec<i64> = time
        .split(':')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    let [h, m, sec] = hms.as_slice() else {
        return None;
    };
    if !(1..=31).contains(&day) || *h > 23 || *m > 59 || *sec > 60 {
        return None;
    }
    let days = sandcell_proto::time::days_from_civil(year, month, day);
    Some(days * 86_400 + h * 3600 + m * 60 + sec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_urls() {
        assert_eq!(
            file_name("https://e.test/dl/tool-1.2.tar.gz?x=1#f").as_deref(),
            Some("tool-1.2.tar.gz")
        );
        assert_eq!(
            file_name("http://e.test/a%20b.txt").as_deref(),
            Some("a b.txt")
        );
        assert_eq!(file_name("http://e.test/"), None);
        assert_eq!(file_name("http://e.test"), None);
        assert_eq!(file_name("http://e.test/x/%2E%2E"), None);
        assert_eq!(file_name("http://e.test/x%2Fy"), None);
    }

    #[test]
    fn http_dates() {
        // `date -u -d 'Sun, 06 Nov 1994 08:49:37 GMT' +%s`
        assert_eq!(
            http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784_111_777)
        );
        assert_eq!(
            http_date("Tue, 29 Feb 2000 00:00:00 GMT"),
            Some(951_782_400)
        );
        assert_eq!(http_date("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(http_date("Sunday, 06-Nov-94 08:49:37 GMT"), None);
        assert_eq!(http_date("Sun, 06 Foo 1994 08:49:37 GMT"), None);
    }
}
