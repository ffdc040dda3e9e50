//! `sandcell template build --disk-mib`: what a build's RUN steps write on the host is
//! bounded (issue 12, "Builds"; crates/runtime build_disk.rs). Built by the real binary with
//! its RUN steps in real gVisor sandboxes on the installed `minimal` image:
//!
//! - a RUN writing past a 128 MiB limit gets ENOSPC inside, the build fails with a message
//!   naming the limit and the flag, and nothing is left on the host: no step disk, no mount,
//!   no loop device, and the data dir holds a few MiB at most (the step wrote ~128 MiB);
//! - RUN steps whose writes add up past the limit: the later step is refused before it
//!   runs, saying how much the earlier ones kept;
//! - a build under the limit works, and its files (a whiteout and an opaque directory too,
//!   through the copy out of the step's disk) are what a sandbox of the result sees.
//!
//! Needs root, runsc and the installed images (`make install`); fails loudly without them.

#![allow(clippy::unwrap_used)]

mod common;

use common::{LocalDirs, text};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Output};

const MIB: u64 = 1 << 20;

/// The test's own dirs ([`LocalDirs`]), with this file's helpers.
struct Setup(LocalDirs);

impl std::ops::Deref for Setup {
    type Target = LocalDirs;
    fn deref(&self) -> &LocalDirs {
        &self.0
    }
}

impl Setup {
    fn new() -> Setup {
        Setup(LocalDirs::new("sc-tpldisk"))
    }

    /// `template build -t NAME --network none --disk-mib MIB` of `dockerfile`.
    fn build(&self, name: &str, mib: &str, dockerfile: &str) -> Output {
        let ctx = self.path(&format!("ctx-{name}"));
        std::fs::create_dir_all(&ctx).unwrap();
        std::fs::write(ctx.join("Dockerfile"), dockerfile).unwrap();
        self.sandcell(&[
            "template",
            "build",
            "-t",
            name,
            "--network",
            "none",
            "--disk-mib",
            mib,
            ctx.to_str().unwrap(),
        ])
    }

    /// Nothing of a step's disk is left: no `disk`/`disk.ext4` under the layer cache, no
    /// mount and no loop device of ours.
    fn assert_no_step_disk_left(&self) {
        let mut stack = vec![self.path("data/cache/layers")];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let ty = e.file_type().unwrap();
                // Pending layers (`.tmp-*`) hold the disks; a committed layer holds none.
                assert!(
                    !name.starts_with(".tmp-") && name != "disk.ext4",
                    "left behind: {}",
                    e.path().display()
                );
                if ty.is_dir() && dir == self.path("data/cache/layers") {
                    stack.push(e.path());
                }
            }
        }
        let ours = self.tmp.path().to_string_lossy().into_owned();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(
            !mounts.contains(&ours),
            "a mount under {ours} is left: {mounts}"
        );
        let loops = text(&Command::new("losetup").arg("-a").output().unwrap().stdout);
        assert!(!loops.contains(&ours), "a loop device is left: {loops}");
    }

    /// Bytes the data dir's files take on the host (allocated blocks, links not followed).
    fn data_dir_blocks(&self) -> u64 {
        let mut total = 0;
        let mut stack = vec![self.path("data")];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap().flatten() {
                let meta = std::fs::symlink_metadata(e.path()).unwrap();
                total += meta.blocks() * 512;
                if meta.is_dir() {
                    stack.push(e.path());
                }
            }
        }
        total
    }
}

fn assert_failed_with(out: &Output, wants: &[&str]) -> String {
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success(),
        "the build should have failed: stdout {} stderr {stderr}",
        text(&out.stdout)
    );
    for want in wants {
        assert!(stderr.contains(want), "wanted {want:?} in: {stderr}");
    }
    stderr
}

#[test]
fn a_run_writing_past_the_limit_fails_and_leaves_nothing() {
    let s = Setup::new();
    let out = s.build(
        "toobig",
        "128",
        "FROM minimal\nRUN echo kept > /kept\nRUN dd if=/dev/zero of=/big bs=1M count=400\n",
    );
    assert_failed_with(
        &out,
        &[
            "No space left on device",
            "may write 128 MiB in all",
            "--disk-mib",
            "line 3",
        ],
    );
    s.assert_no_step_disk_left();
    // The step wrote ~128 MiB before ENOSPC; the host keeps none of it (the first RUN's
    // layer and the build's records remain).
    let kept = s.data_dir_blocks();
    assert!(kept < 8 * MIB, "the data dir still takes {kept} bytes");
    assert!(
        !s.path("data/images/toobig").exists(),
        "a failed build made an image"
    );
}

#[test]
fn steps_adding_up_past_the_limit_fail_before_the_next_runs() {
    let s = Setup::new();
    let out = s.build(
        "addsup",
        "128",
        "FROM minimal\nRUN dd if=/dev/zero of=/a bs=1M count=80\n\
         RUN echo never > /never\n",
    );
    assert_failed_with(
        &out,
        &[
            "already wrote 80 MiB of its limit of 128 MiB",
            "--disk-mib",
            "line 3",
        ],
    );
    s.assert_no_step_disk_left();
}

#[test]
fn a_build_under_the_limit_works() {
    let s = Setup::new();
    let out = s.build(
        "fits",
        "128",
        "FROM minimal\n\
         RUN dd if=/dev/zero of=/big bs=1M count=40 && mkdir -p /d/gone && echo x > /d/gone/old\n\
         RUN rm /etc/hostname; rm -rf /d/gone && mkdir /d/gone && echo new > /d/gone/only\n",
    );
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    s.assert_no_step_disk_left();
    let run = s.sandcell(&[
        "run",
        "--runtime",
        "gvisor",
        "--image",
        "fits",
        "--",
        "/bin/sh",
        "-c",
        "wc -c < /big; ls /d/gone; test -e /etc/hostname && echo hostname-still-there; true",
    ]);
    let stdout = text(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", text(&run.stderr));
    let lines: Vec<&str> = stdout.split_whitespace().collect();
    assert_eq!(lines, ["41943040", "only"], "{stdout}");
    let image = s.path("data/images/fits");
    assert!(Path::new(&image).join("rootfs/big").is_file());
}
