//! Fresh randomness from the host at `/init`: a sandbox restored from a snapshot resumes with
//! the kernel RNG state of the moment the snapshot was taken, so every sandbox made from one
//! template would draw the same "random" numbers. The host's bytes are added to the input
//! pool and credited (`RNDADDENTROPY`), then the CRNG is reseeded at once (`RNDRESEEDCRNG`)
//! instead of at its next scheduled reseed.
//!
//! Under gVisor /dev/urandom is the sentry's, fed from the host's getrandom on every read:
//! the ioctls fail there (logged) and nothing needs doing.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;

use sandcell_proto::agent::MAX_INIT_ENTROPY;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EntropyError {
    #[error("not an even-length hex string")]
    NotHex,
    #[error("{0} bytes is more than the {MAX_INIT_ENTROPY} accepted")]
    TooLong(usize),
}

pub fn decode(hex: &str) -> Result<Vec<u8>, EntropyError> {
    let hex = hex.as_bytes();
    if !hex.len().is_multiple_of(2) {
        return Err(EntropyError::NotHex);
    }
    if hex.len() / 2 > MAX_INIT_ENTROPY {
        return Err(EntropyError::TooLong(hex.len() / 2));
    }
    let nibble = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    hex.chunks(2)
        .map(|pair| match (nibble(pair[0]), nibble(pair[1])) {
            (Some(h), Some(l)) => Ok(h << 4 | l),
            _ => Err(EntropyError::NotHex),
        })
        .collect()
}

/// `struct rand_pool_info` with room for [`MAX_INIT_ENTROPY`] bytes.
#[repr(C)]
struct RandPoolInfo {
    entropy_count: libc::c_int,
    buf_size: libc::c_int,
    buf: [u8; MAX_INIT_ENTROPY],
}

/// `_IOW('R', 0x03, int[2])` and `_IO('R', 0x07)` from <linux/random.h>.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;

/// Mixes `bytes` into the kernel RNG, credits them and reseeds. Failures are logged: a
/// sandbox whose RNG could not be reseeded still works (and the log says so).
pub fn reseed(bytes: &[u8]) {
    let len = bytes.len().min(MAX_INIT_ENTROPY);
    let mut info = RandPoolInfo {
        entropy_count: (len * 8) as libc::c_int,
        buf_size: len as libc::c_int,
        buf: [0; MAX_INIT_ENTROPY],
    };
    info.buf[..len].copy_from_slice(&bytes[..len]);
    let dev = match OpenOptions::new().write(true).open("/dev/urandom") {
        Ok(f) => f,
        Err(e) => {
            crate::log!("/init entropy: opening /dev/urandom: {e}");
            return;
        }
    };
    // SAFETY: RNDADDENTROPY reads a rand_pool_info whose buf holds buf_size bytes; `info`
    // is such a struct, alive for the call, and `dev` an open /dev/urandom.
    if unsafe { libc::ioctl(dev.as_raw_fd(), RNDADDENTROPY as _, &info) } < 0 {
        crate::log!(
            "/init entropy: RNDADDENTROPY: {}",
            std::io::Error::last_os_error()
        );
        return;
    }
    // SAFETY: RNDRESEEDCRNG takes no argument; `dev` is an open /dev/urandom.
    if unsafe { libc::ioctl(dev.as_raw_fd(), RNDRESEEDCRNG as _) } < 0 {
        crate::log!(
            "/init entropy: RNDRESEEDCRNG: {}",
            std::io::Error::last_os_error()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_hex_and_refuses_the_rest() {
        assert_eq!(decode("00ff10Ab"), Ok(vec![0, 255, 16, 171]));
        assert_eq!(decode(""), Ok(vec![]));
        assert_eq!(decode("abc"), Err(EntropyError::NotHex));
        assert_eq!(decode("zz"), Err(EntropyError::NotHex));
        let long = "00".repeat(MAX_INIT_ENTROPY + 1);
        assert_eq!(
            decode(&long),
            Err(EntropyError::TooLong(MAX_INIT_ENTROPY + 1))
        );
    }
}
