//! Random bytes from the kernel (getrandom(2)) for ids and tokens, in the daemon, the
//! runtimes and the guest agent alike.

use std::io;

/// Fills `buf` from the kernel's RNG (blocking until it is initialised, as getrandom does
/// without flags), retrying interrupted and short reads.
pub fn fill(buf: &mut [u8]) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: getrandom writes at most `rest.len()` bytes into memory we own.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += n as usize;
    }
    Ok(())
}

/// `2 * bytes` lowercase hex digits from the kernel's RNG.
pub fn hex(bytes: usize) -> io::Result<String> {
    let mut buf = vec![0u8; bytes];
    fill(&mut buf)?;
    Ok(to_hex(&buf))
}

/// Lowercase hex digits of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_fresh_and_sized() {
        let a = hex(20).unwrap();
        assert_eq!(a.len(), 40);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, hex(20).unwrap());
        assert_eq!(to_hex(&[0, 0xab]), "00ab");
    }
}
