//! Small helpers: randomness, hashing, clocks and RFC 3339 times (the random bytes and the
//! times are sandcell_proto's, shared with the runtime and the agent).

use sha2::{Digest, Sha256};
use std::time::{SystemTime, UNIX_EPOCH};

pub use sandcell_proto::random::{hex as random_hex, to_hex as hex};

pub fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

/// Compares secrets in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// RFC 3339 in Unix milliseconds (E2B's API times): `2006-01-02T15:04:05.000Z`.
pub use sandcell_proto::time::{format_millis as rfc3339, parse_millis as parse_rfc3339};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
