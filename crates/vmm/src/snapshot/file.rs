//! The state file: a versioned, checksummed container for one serde value.
//!
//! ```text
//! offset 0   magic            8 bytes  b"SCSNAPST"
//!        8   format version   u32 LE   STATE_FORMAT_VERSION
//!       12   reserved         u32 LE   0
//!       16   body length      u64 LE   N
//!       24   body             N bytes  postcard encoding of the value
//!     24+N   checksum         u64 LE   CRC-64/XZ of bytes 0..24+N
//! ```
//!
//! Reading checks, in order, before anything is deserialised: the file size against
//! [`MAX_STATE_BYTES`] (from its metadata, then bounded again while reading), the magic,
//! the version (exact match: the body has no self-description, so an older or newer
//! layout is refused rather than misread), the body length against the file size, and the
//! checksum. Only then is the body decoded; the decoded value is re-validated by its
//! users (vCPU count, memory size, queue parameters) because a checksum proves integrity,
//! not sanity.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

pub const STATE_MAGIC: [u8; 8] = *b"SCSNAPST";
/// Bump on any change to the saved types (field added, removed, reordered or retyped).
/// 2: the vsock device's next host port.
/// 3: the net device (VirtioDeviceState::Net).
pub const STATE_FORMAT_VERSION: u32 = 3;
/// The largest state file read. Real ones are tens of KiB (a few KiB per vCPU).
pub const MAX_STATE_BYTES: u64 = 16 << 20;
const HEADER_LEN: usize = 24;
const CHECKSUM_LEN: usize = 8;
const CRC: crc::Crc<u64> = crc::Crc::<u64>::new(&crc::CRC_64_XZ);

#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    #[error("{what} state file {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("state file {path} is {size} bytes, more than the {MAX_STATE_BYTES}-byte limit")]
    TooLarge { path: PathBuf, size: u64 },
    #[error("state file {path} is truncated: {detail}")]
    Truncated { path: PathBuf, detail: String },
    #[error("{path} is not a Sandcell snapshot state file (bad magic)")]
    BadMagic { path: PathBuf },
    #[error(
        "state file {path} has format version {found}; this sandcell-vmm reads version \
         {STATE_FORMAT_VERSION} only"
    )]
    Version { path: PathBuf, found: u32 },
    #[error("state file {path} is corrupt: checksum mismatch")]
    Checksum { path: PathBuf },
    #[error("state file {path}: decoding the body failed: {source}")]
    Decode {
        path: PathBuf,
        source: postcard::Error,
    },
    #[error("encoding the VM state failed: {0}")]
    Encode(postcard::Error),
}

/// The whole file image for `value`.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, StateFileError> {
    let body = postcard::to_allocvec(value).map_err(StateFileError::Encode)?;
    let mut out = Vec::with_capacity(HEADER_LEN + body.len() + CHECKSUM_LEN);
    out.extend_from_slice(&STATE_MAGIC);
    out.extend_from_slice(&STATE_FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&body);
    let sum = CRC.checksum(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    Ok(out)
}

/// Checks and decodes a file image; `path` only names it in errors.
pub fn decode<T: DeserializeOwned>(bytes: &[u8], path: &Path) -> Result<T, StateFileError> {
    let path = || path.to_path_buf();
    if bytes.len() as u64 > MAX_STATE_BYTES {
        return Err(StateFileError::TooLarge {
            path: path(),
            size: bytes.len() as u64,
        });
    }
    if bytes.len() < HEADER_LEN + CHECKSUM_LEN {
        if bytes.len() >= 8 && bytes[..8] != STATE_MAGIC {
            return Err(StateFileError::BadMagic { path: path() });
        }
        return Err(StateFileError::Truncated {
            path: path(),
            detail: format!("{} bytes, shorter than the header", bytes.len()),
        });
    }
    if bytes[..8] != STATE_MAGIC {
        return Err(StateFileError::BadMagic { path: path() });
    }
    let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    if version != STATE_FORMAT_VERSION {
        return Err(StateFileError::Version {
            path: path(),
            found: version,
        });
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&bytes[16..24]);
    let body_len = u64::from_le_bytes(len);
    let expected = (HEADER_LEN + CHECKSUM_LEN) as u64;
    if body_len != bytes.len() as u64 - expected {
        return Err(StateFileError::Truncated {
            path: path(),
            detail: format!(
                "the header announces a {body_len}-byte body, the file holds {}",
                bytes.len() as u64 - expected
            ),
        });
    }
    let end = HEADER_LEN + body_len as usize;
    let mut sum = [0u8; 8];
    sum.copy_from_slice(&bytes[end..end + CHECKSUM_LEN]);
    if CRC.checksum(&bytes[..end]) != u64::from_le_bytes(sum) {
        return Err(StateFileError::Checksum { path: path() });
    }
    postcard::from_bytes(&bytes[HEADER_LEN..end]).map_err(|source| StateFileError::Decode {
        path: path(),
        source,
    })
}

/// Writes `value` to `path` through a temporary file in the same directory and a rename,
/// so that a reader never sees a half-written state file.
pub fn write<T: Serialize>(path: &Path, value: &T) -> Result<(), StateFileError> {
    let bytes = encode(value)?;
    let io = |source| StateFileError::Io {
        what: "writing the",
        path: path.to_path_buf(),
        source,
    };
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = PathBuf::from(tmp_name);
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(&bytes).map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(e)
    })
}

/// Reads and decodes the state file at `path` (size-capped before reading).
pub fn read<T: DeserializeOwned>(path: &Path) -> Result<T, StateFileError> {
    let io = |source| StateFileError::Io {
        what: "reading the",
        path: path.to_path_buf(),
        source,
    };
    let f = std::fs::File::open(path).map_err(io)?;
    let size = f.metadata().map_err(io)?.len();
    if size > MAX_STATE_BYTES {
        return Err(StateFileError::TooLarge {
            path: path.to_path_buf(),
            size,
        });
    }
    let mut bytes = Vec::with_capacity(size as usize);
    // Bounded again: the file may grow between metadata() and read().
    f.take(MAX_STATE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    decode(&bytes, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Sample {
        a: u64,
        name: String,
        regs: kvm_bindings::kvm_regs,
        list: Vec<u32>,
    }

    fn sample() -> Sample {
        Sample {
            a: 42,
            name: "vm".into(),
            regs: kvm_bindings::kvm_regs {
                rip: 0x1234,
                rax: 7,
                ..Default::default()
            },
            list: vec![1, 2, 3],
        }
    }

    fn p() -> &'static Path {
        Path::new("test.state")
    }

    #[test]
    fn round_trips() {
        let bytes = encode(&sample()).expect("encode");
        assert_eq!(&bytes[..8], &STATE_MAGIC);
        let back: Sample = decode(&bytes, p()).expect("decode");
        assert_eq!(back, sample());
    }

    #[test]
    fn every_flipped_byte_is_refused() {
        let bytes = encode(&sample()).expect("encode");
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(
                decode::<Sample>(&bad, p()).is_err(),
                "a flip at byte {i} went unnoticed"
            );
        }
    }

    #[test]
    fn truncation_at_any_length_is_refused() {
        let bytes = encode(&sample()).expect("encode");
        for n in 0..bytes.len() {
            let err = decode::<Sample>(&bytes[..n], p()).expect_err("truncated");
            assert!(
                matches!(err, StateFileError::Truncated { .. }),
                "length {n}: {err}"
            );
        }
    }

    #[test]
    fn other_versions_and_files_are_refused_by_name() {
        let mut bytes = encode(&sample()).expect("encode");
        bytes[8..12].copy_from_slice(&(STATE_FORMAT_VERSION + 1).to_le_bytes());
        let err = decode::<Sample>(&bytes, p()).expect_err("version");
        assert!(
            matches!(err, StateFileError::Version { found, .. } if found == STATE_FORMAT_VERSION + 1)
        );
        assert!(err.to_string().contains("format version"), "{err}");
        let err = decode::<Sample>(b"\x7fELF\x02\x01\x01\0 not a state file at all", p())
            .expect_err("magic");
        assert!(matches!(err, StateFileError::BadMagic { .. }), "{err}");
    }

    #[test]
    fn oversized_files_are_refused_before_reading() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("big.state");
        let f = std::fs::File::create(&path).expect("create");
        f.set_len(MAX_STATE_BYTES + 1).expect("sparse file");
        let err = read::<Sample>(&path).expect_err("too large");
        assert!(matches!(err, StateFileError::TooLarge { .. }), "{err}");
    }

    #[test]
    fn files_round_trip_through_the_filesystem() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("vm.state");
        write(&path, &sample()).expect("write");
        assert_eq!(read::<Sample>(&path).expect("read"), sample());
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("readdir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names.len(), 1, "no temporary file is left: {names:?}");
    }
}
