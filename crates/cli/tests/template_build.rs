//! `sandcell template build` end to end: a two-stage Dockerfile FROM the installed `minimal`
//! image (RUN steps creating, changing and deleting files, so whiteouts and an opaque
//! directory are exercised; COPY with .dockerignore, --chown and --from; ENV, ARG with
//! --build-arg, WORKDIR, USER, CMD) built by the real binary with its RUN steps in gVisor
//! sandboxes, then a sandbox run from the result checks the files, and `template inspect`
//! the defaults. A second build of the same Dockerfile takes every layer from the cache; a
//! failing RUN gives its exit status and output. A build FROM a registry image (the image
//! tests' layered image on a local docker-registry). RUN steps reach the network (sandcell-net's
//! fake internet) unless `--network none`. Needs root, runsc, the installed images
//! (`make install`), docker-registry, skopeo, busybox-static, ip, nft, dnsmasq and python3;
//! fails loudly without them. FROM scratch, COPY --from images, ADD from a URL, skipped
//! stages and flattened deep stages: template_build/sources.rs.

#![allow(clippy::unwrap_used)]

#[path = "common/mod.rs"]
mod cli_common;
#[path = "../../image/tests/common/mod.rs"]
mod common;
#[path = "template_build/sources.rs"]
mod sources;

use cli_common::{LocalDirs, text};

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
        Setup(LocalDirs::new("sc-tpl"))
    }

    fn ok(&self, args: &[&str]) -> (String, String) {
        let out = self.sandcell(args);
        assert!(
            out.status.success(),
            "sandcell {args:?}: {}\nstdout: {}\nstderr: {}",
            out.status,
            text(&out.stdout),
            text(&out.stderr)
        );
        (text(&out.stdout), text(&out.stderr))
    }

    /// `sandcell run` of `/bin/sh -c SCRIPT` in a gVisor sandbox from `image`: its stdout.
    fn run_sh(&self, image: &str, script: &str) -> String {
        self.ok(&[
            "run",
            "--runtime",
            "gvisor",
            "--image",
            image,
            "--",
            "/bin/sh",
            "-c",
            script,
        ])
        .0
    }

    /// A fresh local registry holding the image tests' layered image as `test/layers:v1`,
    /// and that reference.
    fn registry_with_layered_image(&self) -> (common::Registry, String) {
        let registry = common::Registry::start(None);
        let mut layout = common::Layout::new(&self.path("layout"));
        let desc = layout.image(
            &common::layered_image_layers(),
            "amd64",
            common::layered_image_config(),
        );
        layout.tag(desc, "v1");
        let reference = format!("{}/test/layers:v1", registry.host());
        common::push(&layout.dir, "v1", &reference, None);
        (registry, reference)
    }

    fn write(&self, rel: &str, content: &str) {
        let p = self.path(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
}

const DOCKERFILE: &str = r#"# syntax=docker/dockerfile:1
ARG BASE=minimal
FROM $BASE AS builder
ARG GREETING=hello
RUN mkdir -p /out && echo "$GREETING from the builder" > /out/greeting

FROM ${BASE}
ENV APP_HOME=/app \
    MODE=test
WORKDIR $APP_HOME
COPY src/ ./src/
COPY --chown=nobody:nogroup owned.txt .
COPY --from=builder /out/greeting greeting
# Create, change and delete: a new file, an appended one, a whiteout, an opaque directory.
RUN echo created > /app/new.txt \
 && echo changed >> /etc/profile \
 && rm /etc/hostname \
 && rm -rf /app/src/gone && mkdir /app/src/gone && echo fresh > /app/src/gone/only \
 && echo kept > /tmp/kept
USER 65534
RUN echo "running as $(id -un) in $(pwd) with MODE=$MODE"
CMD ["/bin/sh", "-c", "cat /app/greeting"]
"#;

fn build_json(s: &Setup, extra: &[&str]) -> (serde_json::Value, String) {
    let ctx = s.path("ctx");
    let mut args = vec!["template", "build", "-t", "tpl", "--json"];
    args.extend_from_slice(extra);
    args.push(ctx.to_str().unwrap());
    let (stdout, stderr) = s.ok(&args);
    (serde_json::from_str(&stdout).unwrap(), stderr)
}

#[test]
fn multi_stage_build_runs_and_rebuilds_from_cache() {
    let s = Setup::new();
    s.write("ctx/Dockerfile", DOCKERFILE);
    s.write("ctx/.dockerignore", "src/*.key\n**/*.tmp\n");
    s.write("ctx/src/a.txt", "alpha\n");
    s.write("ctx/src/sub/b.txt", "beta\n");
    s.write("ctx/src/gone/x.txt", "replaced by a new directory\n");
    s.write("ctx/src/gone/y.txt", "replaced by a new directory\n");
    s.write("ctx/src/secret.key", "do not copy\n");
    s.write("ctx/src/sub/scratch.tmp", "do not copy\n");
    s.write("ctx/owned.txt", "mine\n");

    let (first, stderr) = build_json(&s, &["--build-arg", "GREETING=hi"]);
    assert!(
        stderr.contains("running as nobody in /app with MODE=test"),
        "RUN output streamed: {stderr}"
    );
    assert!(
        stderr.contains("Step 1/13: FROM $BASE AS builder"),
        "{stderr}"
    );
    let layer_steps = first["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|st| st["layer"].is_string())
        .count();
    // RUN, WORKDIR, 3 COPY, 2 RUN.
    assert_eq!(layer_steps, 7, "{first:#}");
    assert_eq!(first["builtSteps"], 7, "{first:#}");
    assert_eq!(first["cachedSteps"], 0);

    // The result, seen from a sandbox made from it.
    let script = "cat /app/src/a.txt /app/src/sub/b.txt /app/greeting /app/new.txt; \
                  ls /app/src /app/src/sub /app/src/gone; stat -c '%U:%G' /app/owned.txt; \
                  tail -n 1 /etc/profile; test -e /etc/hostname && echo hostname-present; \
                  echo end";
    let out = s.run_sh("tpl", script);
    let expected = "alpha\nbeta\nhi from the builder\ncreated\n\
                    /app/src:\na.txt\ngone\nsub\n\n/app/src/gone:\nonly\n\n\
                    /app/src/sub:\nb.txt\nnobody:nogroup\nchanged\nend\n";
    assert_eq!(out, expected);

    // /tmp is no tmpfs in a build step: its writes are part of the layer.
    assert_eq!(
        std::fs::read_to_string(s.path("data/images/tpl/rootfs/tmp/kept")).unwrap(),
        "kept\n"
    );
    let (inspect, _) = s.ok(&["template", "inspect", "tpl"]);
    let inspect: serde_json::Value = serde_json::from_str(&inspect).unwrap();
    let config = &inspect["config"];
    assert_eq!(config["workingDir"], "/app");
    assert_eq!(config["user"], "65534");
    assert_eq!(
        config["cmd"],
        serde_json::json!(["/bin/sh", "-c", "cat /app/greeting"])
    );
    let env: Vec<&str> = config["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert!(
        env.contains(&"MODE=test") && env.contains(&"APP_HOME=/app"),
        "{env:?}"
    );
    assert!(
        !env.iter().any(|e| e.starts_with("GREETING=")),
        "ARGs stay out: {env:?}"
    );
    assert_eq!(inspect["build"]["layers"].as_array().unwrap().len(), 6);

    // Unchanged: every layer from the cache.
    let (second, stderr) = build_json(&s, &["--build-arg", "GREETING=hi"]);
    assert_eq!(second["builtSteps"], 0, "{second:#}");
    assert_eq!(second["cachedSteps"], 7, "{second:#}");
    assert_eq!(
        second["exportSkipped"], true,
        "the image is kept: {second:#}"
    );
    assert_eq!(first["exportSkipped"], false);
    assert_eq!(stderr.matches("---> CACHED").count(), 7, "{stderr}");
    assert!(
        !stderr.contains("running as nobody in /app"),
        "no RUN ran: {stderr}"
    );

    // A changed context file rebuilds from its COPY on; an ignored one changes nothing.
    s.write("ctx/src/secret.key", "still not copied\n");
    let (third, _) = build_json(&s, &["--build-arg", "GREETING=hi"]);
    assert_eq!(third["builtSteps"], 0, "{third:#}");
    s.write("ctx/src/a.txt", "alpha 2\n");
    let (fourth, _) = build_json(&s, &["--build-arg", "GREETING=hi"]);
    // COPY src/, then the later COPYs and RUNs (their parent changed): 5 steps.
    assert_eq!(fourth["builtSteps"], 5, "{fourth:#}");
    assert_eq!(fourth["exportSkipped"], false);
    let out = s.run_sh("tpl", "cat /app/src/a.txt");
    assert_eq!(out, "alpha 2\n");

    let (ls, _) = s.ok(&["template", "ls", "--json"]);
    let ls: serde_json::Value = serde_json::from_str(&ls).unwrap();
    let row = ls
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "tpl")
        .unwrap()
        .clone();
    assert_eq!(row["kind"], "template");
    s.ok(&["template", "rm", "tpl"]);
    assert!(!s.path("data/images/tpl").exists());
}

#[test]
fn failing_run_shows_output_and_exit_status() {
    let s = Setup::new();
    s.write(
        "ctx/Dockerfile",
        "FROM minimal\nRUN echo before the failure\nRUN echo doomed step && exit 3\nRUN echo never\n",
    );
    let out = s.sandcell(&[
        "template",
        "build",
        "-t",
        "bad",
        s.path("ctx").to_str().unwrap(),
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("doomed step"), "{stderr}");
    assert!(
        stderr.contains("Dockerfile line 3: RUN echo doomed step && exit 3: exit status 3"),
        "{stderr}"
    );
    assert!(!stderr.contains("never"), "{stderr}");
    assert!(!s.path("data/images/bad").exists());
    // Nothing half-made is left in the layer cache.
    let leftovers: Vec<_> = std::fs::read_dir(s.path("data/cache/layers"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // A USER the image does not know fails the RUN that would run as it.
    s.write("ctx/Dockerfile", "FROM minimal\nUSER ghost\nRUN true\n");
    let out = s.sandcell(&[
        "template",
        "build",
        "-t",
        "bad",
        s.path("ctx").to_str().unwrap(),
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("Dockerfile line 3: RUN true: USER ghost: no such user"),
        "{stderr}"
    );

    // An unsupported instruction is refused before anything runs, with its line.
    s.write(
        "ctx/Dockerfile",
        "FROM minimal\nRUN true\nHEALTHCHECK CMD true\n",
    );
    let out = s.sandcell(&[
        "template",
        "build",
        "-t",
        "bad",
        s.path("ctx").to_str().unwrap(),
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("Dockerfile line 3: HEALTHCHECK is not supported"),
        "{stderr}"
    );
}

#[test]
fn from_a_registry_image() {
    let s = Setup::new();
    let (registry, reference) = s.registry_with_layered_image();
    // The base runs as `user`, in /data, with GREETING in its Env.
    s.write(
        "ctx/Dockerfile",
        &format!(
            "FROM {reference}\nUSER root\nRUN echo \"$GREETING, $(id -un)\" > /data/from-run && rm /data/keep\nUSER user\n"
        ),
    );
    let ctx = s.path("ctx");
    let host = registry.host();
    s.ok(&[
        "template",
        "build",
        "-t",
        "fromreg",
        "--insecure-registry",
        &host,
        ctx.to_str().unwrap(),
    ]);
    let out = s.run_sh(
        "fromreg",
        "cat /data/from-run; test -e /data/keep || echo keep-gone; cat /opq/new",
    );
    assert_eq!(out, "hello from the image, root\nkeep-gone\nnew");
    let (inspect, _) = s.ok(&["template", "inspect", "fromreg"]);
    let config = serde_json::from_str::<serde_json::Value>(&inspect).unwrap()["config"].clone();
    assert_eq!(config["workingDir"], "/data");
    assert_eq!(config["user"], "user");
    assert_eq!(config["entrypoint"], serde_json::json!(["/bin/sh", "-c"]));
    assert_eq!(config["cmd"], serde_json::json!(["echo hi"]));
    assert!(
        config["env"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("GREETING=hello from the image")),
        "{config}"
    );
}

/// A RUN fetching a page from the fake internet: busybox nc (the minimal image's static
/// wget crashes in its resolver code), the body's last line kept in /fetched.
const FETCH_DOCKERFILE: &str = r#"FROM minimal
RUN printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 198.51.100.10 80 | tail -n 1 > /fetched && grep -q hello-10 /fetched
"#;

#[test]
fn run_steps_have_the_network_unless_none() {
    use sandcell_runtime::net::testing::Internet;
    let _lock = Internet::lock();
    let _inet = Internet::start().unwrap();
    let s = Setup::new();
    s.write("ctx/Dockerfile", FETCH_DOCKERFILE);
    let ctx = s.path("ctx");
    let ctx = ctx.to_str().unwrap();

    s.ok(&["template", "build", "-t", "fetched", ctx]);
    let rootfs = s.path("data/images/fetched/rootfs");
    let fetched = std::fs::read_to_string(rootfs.join("fetched")).unwrap();
    assert_eq!(fetched.trim(), "hello-10");
    // The runtime's resolv.conf (our DNS server) is no part of the layer: minimal has none.
    assert!(
        !rootfs.join("etc/resolv.conf").exists(),
        "{:?}",
        std::fs::read_to_string(rootfs.join("etc/resolv.conf"))
    );

    // A resolv.conf a step writes is kept, also through later (networked) steps.
    s.write(
        "ctx/Dockerfile",
        "FROM minimal\nRUN echo 'nameserver 192.0.2.53' > /etc/resolv.conf\nRUN true\n",
    );
    s.ok(&["template", "build", "-t", "ownresolv", ctx]);
    assert_eq!(
        std::fs::read_to_string(s.path("data/images/ownresolv/rootfs/etc/resolv.conf")).unwrap(),
        "nameserver 192.0.2.53\n"
    );

    // Without a network the same RUN fails (--no-cache: the network is not in the cache key).
    s.write("ctx/Dockerfile", FETCH_DOCKERFILE);
    let out = s.sandcell(&[
        "template",
        "build",
        "-t",
        "offline",
        "--network",
        "none",
        "--no-cache",
        ctx,
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("Dockerfile line 2: RUN printf") && stderr.contains("exit status 1"),
        "{stderr}"
    );
    assert!(!s.path("data/images/offline").exists());
}
