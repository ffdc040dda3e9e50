//! The harnesses of the fuzz targets over public APIs (fuzz_targets/*.rs call them; the
//! virtio ones are sandcell-vmm's `fuzzing` module). Each feeds the fuzzer's bytes where
//! outside input arrives and asserts what must hold for any input, beyond "no panic".

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use sandcell_net::dns::wire;
use sandcell_net::hostcheck::{self, Sniffed};
use sandcell_proto::agent::envelope::{self, Decoder};

/// DNS packets from a sandbox, as the policy DNS server reads them: a query that parses
/// gets replies that parse back as answers to the same question.
pub fn dns_wire(data: &[u8]) {
    let _ = wire::parse_answer(data);
    let _ = wire::read_name(data, data.len().min(12));
    let Ok(query) = wire::parse_query(data) else {
        // Still answered with an error, or not at all when it has no header.
        if let Some(reply) = wire::error_reply(data, 2) {
            assert!(reply.len() >= 12 && reply.len() <= data.len());
        }
        return;
    };
    let reply = wire::a_reply(data, &[Ipv4Addr::new(203, 0, 113, 7)], 60).expect("a reply");
    let answer = wire::parse_answer(&reply).expect("our own reply parses");
    assert_eq!(answer.id, query.id);
    assert_eq!(answer.question.name, query.question.name);
    if query.question.qtype == 1 {
        assert_eq!(answer.addresses.len(), 1, "{answer:?}");
    }
    let refused = wire::error_reply(data, 5).expect("an error reply");
    assert_eq!(wire::parse_answer(&refused).expect("parses").rcode, 5);
}

/// The egress proxy's Host/SNI decision on a connection's first bytes, split over reads
/// where the first two bytes say: deciding on every prefix as the bytes arrive gives the
/// same decision as on the whole, and a name is always a valid lowercase DNS name.
pub fn egress_sniff(data: &[u8]) {
    let Some((&step, data)) = data.split_first() else {
        return;
    };
    let whole = hostcheck::sniff(data);
    let step = usize::from(step).max(1);
    let mut upto = 0;
    let incremental = loop {
        upto = (upto + step).min(data.len());
        match hostcheck::sniff(&data[..upto]) {
            Sniffed::NeedMore if upto < data.len() => continue,
            decided => break decided,
        }
    };
    assert_eq!(incremental, whole, "split every {step} bytes");
    if let Sniffed::Name(_, name) = &whole {
        assert!(!name.is_empty() && name.len() <= 253, "{name:?}");
        assert!(!name.ends_with('.'), "{name:?}");
        assert!(!name.bytes().any(|b| b.is_ascii_uppercase()), "{name:?}");
    }
}

/// Dockerfiles (a template build's input, any key's): parse, and split/expand every line
/// with variables set, as a build does.
pub fn dockerfile(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = sandcell_image::dockerfile::parse(text);
    let vars = |name: &str| (name.len() < 8).then(|| format!("v{name}"));
    for (n, line) in text.lines().take(64).enumerate() {
        for escape in ['\\', '`'] {
            let _ = sandcell_image::dockerfile::words::split(line, escape, Some(&vars), n);
            let _ = sandcell_image::dockerfile::words::expand_one(line, escape, &vars, n);
        }
    }
}

/// The agent's Connect envelopes as the host reads them, in chunks the first byte sizes:
/// the decoder never takes more than it was given, never returns an envelope over its
/// limit, and what it returns re-encodes to exactly the bytes it consumed.
pub fn agent_envelope(data: &[u8]) {
    const MAX: usize = 4096;
    let Some((&chunk, data)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk).max(1);
    let mut dec = Decoder::new(MAX);
    let mut consumed = Vec::new();
    for piece in data.chunks(chunk) {
        dec.push(piece);
        loop {
            match dec.next() {
                Ok(Some(env)) => {
                    assert!(env.message.len() <= MAX);
                    consumed.extend(envelope::encode(env.flags, &env.message));
                }
                Ok(None) => break,
                // A refused envelope ends the stream (the client stops reading).
                Err(_) => return,
            }
        }
    }
    assert_eq!(consumed.len() + dec.pending(), data.len());
    assert_eq!(&consumed[..], &data[..consumed.len()]);
}

/// One entry of a fuzzed image layer: what a hostile registry or upload could put in a tar.
#[derive(Debug, arbitrary::Arbitrary)]
struct Entry {
    /// Raw name bytes: `..`, absolute paths, NULs, whiteouts (`.wh.`) included.
    name: Vec<u8>,
    kind: Kind,
    /// A link's target (raw bytes).
    link: Vec<u8>,
    mode: u16,
    data: Vec<u8>,
}

#[derive(Debug, arbitrary::Arbitrary)]
enum Kind {
    File,
    Dir,
    Symlink,
    Hardlink,
    CharDevice,
    Fifo,
}

/// Where the unpack target writes: `root` (the image tree) beside `outside`, which nothing
/// may ever reach; per process, emptied before each run.
fn unpack_dirs() -> &'static (PathBuf, PathBuf) {
    static DIRS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    DIRS.get_or_init(|| {
        let base =
            std::env::temp_dir().join(format!("sandcell-fuzz-unpack-{}", std::process::id()));
        (base.join("root"), base.join("outside"))
    })
}

fn reset(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("creating the fuzz unpack dirs");
}

/// An OCI layer (a tar of [`Entry`], gzipped when the first entry's mode says) unpacked into
/// a fresh root: whatever the entries' names and links, nothing appears outside the root.
pub fn oci_unpack(data: &[u8]) {
    let mut u = arbitrary::Unstructured::new(data);
    let Ok(entries) = u.arbitrary::<Vec<Entry>>() else {
        return;
    };
    let mut tar = tar::Builder::new(Vec::new());
    for e in entries.iter().take(32) {
        let mut h = tar::Header::new_gnu();
        let name = &e.name[..e.name.len().min(100)];
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        let link = &e.link[..e.link.len().min(100)];
        h.as_old_mut().linkname[..link.len()].copy_from_slice(link);
        h.set_mode(u32::from(e.mode));
        h.set_entry_type(match e.kind {
            Kind::File => tar::EntryType::Regular,
            Kind::Dir => tar::EntryType::Directory,
            Kind::Symlink => tar::EntryType::Symlink,
            Kind::Hardlink => tar::EntryType::Link,
            Kind::CharDevice => tar::EntryType::Char,
            Kind::Fifo => tar::EntryType::Fifo,
        });
        let body: &[u8] = if matches!(e.kind, Kind::File) {
            &e.data
        } else {
            &[]
        };
        h.set_size(body.len() as u64);
        h.set_cksum();
        if tar.append(&h, body).is_err() {
            return;
        }
    }
    let Ok(mut blob) = tar.into_inner() else {
        return;
    };
    if entries.first().is_some_and(|e| e.mode & 1 == 1) {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        if gz.write_all(&blob).is_err() {
            return;
        }
        let Ok(zipped) = gz.finish() else { return };
        blob = zipped;
    }

    let (root, outside) = unpack_dirs();
    reset(root);
    reset(outside);
    let limits = sandcell_image::Limits {
        max_blob_bytes: 1 << 20,
        max_layer_bytes: 1 << 20,
        max_image_bytes: 1 << 20,
        max_file_bytes: 64 << 10,
        max_entries: 64,
        max_document_bytes: 1 << 16,
    };
    if let Ok(mut unpacker) = sandcell_image::unpack::Unpacker::new(root, limits) {
        if unpacker.apply_layer(&blob[..], "fuzz", None).is_ok() {
            let _ = unpacker.finish();
        }
    }
    let escaped: Vec<_> = std::fs::read_dir(outside)
        .expect("the outside dir is still there")
        .collect();
    assert!(
        escaped.is_empty(),
        "the layer wrote outside the root: {escaped:?}"
    );
    let parent = root.parent().expect("a parent");
    let siblings = std::fs::read_dir(parent)
        .expect("listing the fuzz dir")
        .count();
    assert_eq!(siblings, 2, "the layer wrote beside the root");
}
