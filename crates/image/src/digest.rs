//! `sha256:<hex>` digests, and a reader that hashes and bounds what passes through it.

use crate::{Error, Result};
use sha2::{Digest as _, Sha256};
use std::io::{self, Read};

/// A validated `sha256:<64 lowercase hex>` digest (the only algorithm images use in practice;
/// others are refused rather than trusted unverified).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    pub fn parse(s: &str) -> Result<Digest> {
        let hex = s
            .strip_prefix("sha256:")
            .ok_or_else(|| Error::BadDigest(s.into()))?;
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(Error::BadDigest(s.into()));
        }
        Ok(Digest(s.to_string()))
    }

    pub fn of(bytes: &[u8]) -> Digest {
        Digest::from_hasher(Sha256::new_with_prefix(bytes))
    }

    fn from_hasher(h: Sha256) -> Digest {
        let out = h.finalize();
        let mut s = String::with_capacity(71);
        s.push_str("sha256:");
        for b in out.iter() {
            s.push_str(&format!("{b:02x}"));
        }
        Digest(s)
    }

    /// The 64 hex digits.
    pub fn hex(&self) -> &str {
        &self.0[7..]
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `sha256:0123456789ab` for progress lines.
    pub fn short(&self) -> &str {
        &self.0[..19]
    }

    /// Fails with [`Error::DigestMismatch`] unless `actual` is this digest.
    pub fn verify(&self, actual: &Digest, what: impl Into<String>) -> Result<()> {
        if self == actual {
            Ok(())
        } else {
            Err(Error::DigestMismatch {
                what: what.into(),
                expected: self.0.clone(),
                actual: actual.0.clone(),
            })
        }
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Hashes what is read through it and fails (with `ErrorKind::FileTooLarge`) once more
/// than `limit` bytes have passed: the bound holds whatever a header or manifest claimed.
pub struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
    limit: u64,
}

impl<R: Read> HashingReader<R> {
    pub fn new(inner: R, limit: u64) -> Self {
        HashingReader {
            inner,
            hasher: Sha256::new(),
            count: 0,
            limit,
        }
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// Reads to the end (bounded), then returns the digest and the byte count.
    pub fn finish(mut self) -> io::Result<(Digest, u64)> {
        io::copy(&mut self, &mut io::sink())?;
        Ok((Digest::from_hasher(self.hasher), self.count))
    }
}

/// The error [`HashingReader`] fails with past its limit; [`is_over_limit`] recognises it.
fn over_limit(limit: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::FileTooLarge,
        format!("more than {limit} bytes"),
    )
}

pub fn is_over_limit(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::FileTooLarge
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count += n as u64;
        if self.count > self.limit {
            return Err(over_limit(self.limit));
        }
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Incremental hashing for async downloads.
#[derive(Default)]
pub struct Hasher(Sha256);

impl Hasher {
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    pub fn finish(self) -> Digest {
        Digest::from_hasher(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hashes_and_bounds() {
        let d = Digest::of(b"abc");
        assert_eq!(
            d.as_str(),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(Digest::parse(d.as_str()).unwrap(), d);
        assert!(Digest::parse("sha256:ABC").is_err());
        assert!(Digest::parse("md5:00").is_err());
        let (got, n) = HashingReader::new(&b"abc"[..], 3).finish().unwrap();
        assert_eq!((got, n), (d, 3));
        let e = HashingReader::new(&b"abcd"[..], 3).finish().unwrap_err();
        assert!(is_over_limit(&e));
    }
}
