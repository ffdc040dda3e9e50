//! Layered disks through the Overlay API (no KVM): a VM writes, its top is frozen, two
//! children built on the frozen layer write independently, the base is never written,
//! and a flattened chain reads exactly like the chain.

use std::fs;
use std::path::{Path, PathBuf};

use super::overlay::{CHUNK_SIZE, Overlay, OverlayError, flatten};

const DISK: usize = 64 * 4096 + 1024; // a partial last chunk too

fn base(dir: &Path) -> (PathBuf, Vec<u8>) {
    let content: Vec<u8> = (0..DISK).map(|i| (i * 7 % 251) as u8).collect();
    let path = dir.join("base.img");
    fs::write(&path, &content).expect("base");
    (path, content)
}

fn chain(base: &Path, layers: &[PathBuf], top: Option<&Path>) -> Result<Overlay, OverlayError> {
    let f = fs::File::open(base).expect("open base");
    let size = f.metadata().expect("meta").len();
    Overlay::open_chain(f, size, layers, top)
}

fn view(o: &Overlay) -> Vec<u8> {
    let mut buf = vec![0u8; DISK];
    o.read_at(&mut buf, 0).expect("read");
    buf
}

#[test]
fn frozen_layers_are_shared_and_children_write_independently() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (base_path, content) = base(dir.path());
    let a_top = dir.path().join("a.scovl");
    let mut a = chain(&base_path, &[], Some(&a_top)).expect("vm A");
    a.write_at(&[0xaa; 4096], 2 * CHUNK_SIZE).expect("w");
    a.write_at(&[0xab; 100], 10 * CHUNK_SIZE + 50)
        .expect("partial w");
    let mut expect = content.clone();
    expect[2 * 4096..3 * 4096].fill(0xaa);
    expect[10 * 4096 + 50..10 * 4096 + 150].fill(0xab);
    assert_eq!(view(&a), expect);

    // Freeze A's top; A goes on writing into a new top.
    let a_next = dir.path().join("a2.scovl");
    let frozen = a.freeze_top(&a_next).expect("freeze");
    assert_eq!(frozen, a_top);
    assert_eq!(a.layer_paths(), vec![a_top.clone()]);
    a.write_at(&[0xac; 4096], 3 * CHUNK_SIZE)
        .expect("w after freeze");

    // Two children over the frozen layer.
    let mut c1 = chain(
        &base_path,
        std::slice::from_ref(&a_top),
        Some(&dir.path().join("c1")),
    )
    .expect("c1");
    let mut c2 = chain(
        &base_path,
        std::slice::from_ref(&a_top),
        Some(&dir.path().join("c2")),
    )
    .expect("c2");
    assert_eq!(view(&c1), expect, "children see A's data as of the freeze");
    c1.write_at(&[1; 512], 2 * CHUNK_SIZE + 512).expect("c1 w"); // partial: copy-up from A's layer
    c2.write_at(&[2; 4096], 2 * CHUNK_SIZE).expect("c2 w");
    let mut e1 = expect.clone();
    e1[2 * 4096 + 512..2 * 4096 + 1024].fill(1);
    let mut e2 = expect.clone();
    e2[2 * 4096..3 * 4096].fill(2);
    assert_eq!(view(&c1), e1);
    assert_eq!(view(&c2), e2);
    let mut ea = expect.clone();
    ea[3 * 4096..4 * 4096].fill(0xac);
    assert_eq!(view(&a), ea, "A sees neither child");
    assert_eq!(
        fs::read(&base_path).expect("base"),
        content,
        "the base is never written"
    );

    // A frozen layer cannot be a writable top again, and layers cannot be reordered.
    assert!(matches!(
        chain(&base_path, &[], Some(&a_top)),
        Err(OverlayError::Frozen { .. } | OverlayError::Locked { .. })
    ));
    drop(c1);
    let c1_path = dir.path().join("c1");
    assert!(matches!(
        chain(&base_path, &[c1_path.clone(), a_top.clone()], None),
        Err(OverlayError::ChainMismatch { .. })
    ));

    // flatten(base, [A, c1]) reads like the chain.
    let flat = dir.path().join("flat.scovl");
    flatten(&base_path, &[a_top.clone(), c1_path.clone()], &flat).expect("flatten");
    let merged = chain(&base_path, std::slice::from_ref(&flat), None).expect("flattened");
    assert_eq!(view(&merged), e1);
    let layered = chain(&base_path, &[a_top, c1_path], None).expect("chain");
    assert_eq!(view(&merged), view(&layered));
    // A child over the flattened layer works like one over the chain.
    let mut c3 = chain(&base_path, &[flat], Some(&dir.path().join("c3"))).expect("c3");
    c3.write_at(&[3; 4096], 0).expect("w");
    let mut e3 = e1;
    e3[..4096].fill(3);
    assert_eq!(view(&c3), e3);
    assert!(
        flatten(&base_path, &[], &dir.path().join("flat.scovl")).is_err(),
        "out exists"
    );
}

#[test]
fn freezing_is_constant_work_and_survives_reopening() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (base_path, content) = base(dir.path());
    let top = dir.path().join("t0");
    let mut o = chain(&base_path, &[], Some(&top)).expect("open");
    let mut layers = Vec::new();
    let mut expect = content;
    for i in 0..5u8 {
        o.write_at(&[i + 1; 4096], u64::from(i) * CHUNK_SIZE)
            .expect("w");
        expect[usize::from(i) * 4096..(usize::from(i) + 1) * 4096].fill(i + 1);
        let next = dir.path().join(format!("t{}", i + 1));
        layers.push(o.freeze_top(&next).expect("freeze"));
    }
    assert_eq!(o.layer_paths(), layers);
    assert_eq!(view(&o), expect);
    let top_path = o.top_path().expect("top").to_path_buf();
    drop(o);
    let again = chain(&base_path, &layers, Some(&top_path)).expect("reopen");
    assert_eq!(view(&again), expect);
}
