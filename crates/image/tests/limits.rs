//! The unpacker's bounds and integrity checks on real files: decompression bombs, absurd
//! header sizes, entry counts, diff_id mismatches, whiteouts that must not reach outside.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use sandcell_image::digest::Digest;
use sandcell_image::unpack::Unpacker;
use sandcell_image::{Error, Limits};

const MIB: u64 = 1 << 20;

fn small_limits() -> Limits {
    Limits {
        max_layer_bytes: 16 * MIB,
        max_image_bytes: 24 * MIB,
        max_file_bytes: 8 * MIB,
        ..Limits::default()
    }
}

#[test]
fn a_decompression_bomb_stops_at_the_limit() {
    // 64 MiB of zeros in one file compress to ~64 KiB; the layer limit is 16 MiB.
    let zeros = vec![0u8; 64 << 20];
    let mut l = LayerBuilder::new();
    l.add(Entry::file("bomb", &zeros));
    let gz = gzip(&l.tar());
    assert!(gz.len() < (1 << 20));
    let tmp = tempfile::tempdir().unwrap();
    let limits = Limits {
        max_file_bytes: 128 * MIB,
        ..small_limits()
    };
    let mut unpacker = Unpacker::new(&tmp.path().join("root"), limits).unwrap();
    let e = unpacker.apply_layer(&gz[..], "bomb", None).unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
    // What was written before the limit stays below it.
    let written = std::fs::metadata(tmp.path().join("root/bomb")).map_or(0, |m| m.len());
    assert!(written <= 16 * MIB, "{written}");
}

#[test]
fn the_image_total_is_bounded_across_layers() {
    let chunk = vec![7u8; 10 << 20];
    let mut l = LayerBuilder::new();
    l.add(Entry::file("ten", &chunk[..7 << 20]));
    let layer = gzip(&l.tar());
    let tmp = tempfile::tempdir().unwrap();
    let limits = Limits {
        max_image_bytes: 20 * MIB,
        ..small_limits()
    };
    let mut unpacker = Unpacker::new(&tmp.path().join("root"), limits).unwrap();
    unpacker.apply_layer(&layer[..], "one", None).unwrap();
    unpacker.apply_layer(&layer[..], "two", None).unwrap();
    let e = unpacker.apply_layer(&layer[..], "three", None).unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
}

#[test]
fn an_absurd_header_size_is_refused_before_reading() {
    // A header claiming 1 TiB, and no data behind it.
    let mut h = tar::Header::new_gnu();
    h.set_path("huge").unwrap();
    h.set_size(1 << 40);
    h.set_mode(0o644);
    h.set_cksum();
    let mut tar = h.as_bytes().to_vec();
    tar.extend_from_slice(&[0u8; 1024]);
    let tmp = tempfile::tempdir().unwrap();
    let mut unpacker = Unpacker::new(&tmp.path().join("root"), small_limits()).unwrap();
    let e = unpacker.apply_layer(&tar[..], "huge", None).unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
    assert!(!tmp.path().join("root/huge").exists());
}

#[test]
fn too_many_entries_are_refused() {
    let mut l = LayerBuilder::new();
    for i in 0..50 {
        let name: &'static str = Box::leak(format!("f{i}").into_boxed_str());
        l.add(Entry::file(name, b""));
    }
    let tmp = tempfile::tempdir().unwrap();
    let limits = Limits {
        max_entries: 20,
        ..small_limits()
    };
    let mut unpacker = Unpacker::new(&tmp.path().join("root"), limits).unwrap();
    let e = unpacker
        .apply_layer(&l.tar()[..], "many", None)
        .unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
}

#[test]
fn a_diff_id_mismatch_is_refused() {
    let mut l = LayerBuilder::new();
    l.add(Entry::file("a", b"a"));
    let tar = l.tar();
    let right = Digest::of(&tar);
    let wrong = Digest::of(b"something else");
    let tmp = tempfile::tempdir().unwrap();
    let mut unpacker = Unpacker::new(&tmp.path().join("root"), Limits::default()).unwrap();
    unpacker
        .apply_layer(&gzip(&tar)[..], "ok", Some(&right))
        .unwrap();
    let e = unpacker
        .apply_layer(&gzip(&tar)[..], "bad", Some(&wrong))
        .unwrap_err();
    assert!(matches!(e, Error::DigestMismatch { .. }), "{e}");
}

#[test]
fn symlinks_inside_the_root_are_followed_there_and_whiteouts_stay_inside() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("precious"), b"keep me").unwrap();
    let mut l1 = LayerBuilder::new();
    // usr-merge style: /lib -> usr/lib, and an absolute one that must stay in the root.
    l1.add(Entry::dir("usr"))
        .add(Entry::dir("usr/lib"))
        .add(Entry::symlink("lib", "usr/lib"))
        .add(Entry::symlink("abs", "/usr"))
        .add(Entry::file("lib/through-relative", b"r"))
        .add(Entry::file("abs/through-absolute", b"a"));
    let mut l2 = LayerBuilder::new();
    // A whiteout through a symlink to the outside must not remove anything there.
    l2.add(Entry::symlink("out", "../outside"))
        .add(Entry::file("out/.wh.precious", b""));
    let mut unpacker = Unpacker::new(&tmp.path().join("root"), Limits::default()).unwrap();
    unpacker.apply_layer(&l1.tar()[..], "l1", None).unwrap();
    let root = tmp.path().join("root");
    assert_eq!(
        std::fs::read(root.join("usr/lib/through-relative")).unwrap(),
        b"r"
    );
    assert_eq!(
        std::fs::read(root.join("usr/through-absolute")).unwrap(),
        b"a"
    );
    let e = unpacker.apply_layer(&l2.tar()[..], "l2", None).unwrap_err();
    assert!(matches!(e, Error::UnsafePath { .. }), "{e}");
    assert_eq!(std::fs::read(outside.join("precious")).unwrap(), b"keep me");
}

#[test]
fn zstd_layers_of_several_frames_unpack() {
    let mut l = LayerBuilder::new();
    l.add(Entry::dir("z"))
        .add(Entry::file("z/one", b"first"))
        .add(Entry::file("z/two", &[9u8; 100_000]));
    let tar = l.tar();
    // Two frames, split mid-stream, as parallel compressors write them.
    let (a, b) = tar.split_at(tar.len() / 2);
    let mut zst = ruzstd::encoding::compress_to_vec(a, ruzstd::encoding::CompressionLevel::Fastest);
    zst.extend(ruzstd::encoding::compress_to_vec(
        b,
        ruzstd::encoding::CompressionLevel::Fastest,
    ));
    let tmp = tempfile::tempdir().unwrap();
    let mut unpacker = Unpacker::new(&tmp.path().join("root"), Limits::default()).unwrap();
    unpacker
        .apply_layer(&zst[..], "zstd", Some(&Digest::of(&tar)))
        .unwrap();
    assert_eq!(
        std::fs::read(tmp.path().join("root/z/one")).unwrap(),
        b"first"
    );
    assert_eq!(
        std::fs::read(tmp.path().join("root/z/two")).unwrap(),
        vec![9u8; 100_000]
    );
}
