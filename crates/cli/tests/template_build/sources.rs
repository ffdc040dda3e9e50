//! Where a build's files come from besides the context and the installed images: `FROM
//! scratch`, `COPY --from` a registry image (the local docker-registry) or an installed one,
//! `ADD` from an HTTP server on loopback (python3's http.server), and which stages run:
//! those the final stage does not need are skipped, and a stage deeper than one overlayfs
//! mount can stack is flattened.

use super::{Setup, common, text};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

fn build(s: &Setup, name: &str) -> std::process::Output {
    s.sandcell(&[
        "template",
        "build",
        "-t",
        name,
        s.path("ctx").to_str().unwrap(),
    ])
}

fn build_ok(s: &Setup, name: &str, extra: &[&str]) -> (serde_json::Value, String) {
    let ctx = s.path("ctx");
    let mut args = vec!["template", "build", "-t", name, "--json"];
    args.extend_from_slice(extra);
    args.push(ctx.to_str().unwrap());
    let (stdout, stderr) = s.ok(&args);
    (serde_json::from_str(&stdout).unwrap(), stderr)
}

fn failed(out: &std::process::Output) -> String {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    stderr
}

#[test]
fn from_scratch() {
    let s = Setup::new();
    s.write("ctx/hello.txt", "hello\n");
    std::fs::write(s.path("ctx/sh"), common::busybox()).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(s.path("ctx/sh"), std::fs::Permissions::from_mode(0o755)).unwrap();

    // No shell in the stage: the RUN fails before a sandbox starts, naming the step.
    s.write(
        "ctx/Dockerfile",
        "FROM scratch\nCOPY hello.txt /hello.txt\nRUN echo hi\n",
    );
    let stderr = failed(&build(&s, "noshell"));
    assert!(
        stderr.contains(
            "Dockerfile line 3: RUN echo hi: this stage starts FROM scratch and has no /bin/sh"
        ),
        "{stderr}"
    );

    // A scratch stage with files (and a static shell its RUN uses: the agent is under the
    // stage only while it runs), copied into a runnable stage.
    s.write(
        "ctx/Dockerfile",
        "FROM scratch AS files\n\
         COPY hello.txt /data/hello.txt\n\
         COPY sh /bin/sh\n\
         RUN echo made in scratch > /data/made\n\
         FROM minimal\n\
         COPY --from=files /data/ /from-scratch/\n\
         COPY --from=files / /whole/\n",
    );
    build_ok(&s, "fromscratch", &[]);
    let out = s.run_sh(
        "fromscratch",
        "cat /from-scratch/hello.txt /from-scratch/made; ls /whole /whole/data",
    );
    assert_eq!(
        out, "hello\nmade in scratch\n/whole:\nbin\ndata\n\n/whole/data:\nhello.txt\nmade\n",
        "the scratch stage holds its files only (no agent, no runtime leftovers)"
    );

    // A template that is FROM scratch: the agent and config are added at export.
    s.write(
        "ctx/Dockerfile",
        "FROM scratch\nCOPY sh /bin/sh\nCOPY hello.txt /hello.txt\nCMD [\"/bin/sh\"]\n",
    );
    build_ok(&s, "bare", &[]);
    // Shell builtins only: the image has nothing but busybox as /bin/sh.
    assert_eq!(
        s.run_sh("bare", "read line < /hello.txt; echo \"$line\""),
        "hello\n"
    );
}

#[test]
fn copy_from_registry_and_installed_images() {
    let s = Setup::new();
    let (registry, reference) = s.registry_with_layered_image();
    let host = registry.host();
    let insecure = ["--insecure-registry", host.as_str()];

    // Whiteouts and the opaque dir applied, a symlink followed inside the image.
    s.write(
        "ctx/Dockerfile",
        &format!(
            "FROM minimal\n\
             COPY --from={reference} /data/ /img/data/\n\
             COPY --from={reference} /opq /img/opq\n\
             COPY --from={reference} /swap/was-dir/keep /img/via-link\n\
             COPY --from=minimal /sbin/sandcell-agent /img/agent-copy\n"
        ),
    );
    let (first, _) = build_ok(&s, "copyimg", &insecure);
    assert_eq!(first["builtSteps"], 4, "{first:#}");
    let out = s.run_sh(
        "copyimg",
        "ls /img/data /img/opq; cat /img/opq/new /img/via-link; echo; \
         cmp /img/agent-copy /sbin/sandcell-agent && echo same-agent",
    );
    assert_eq!(
        out,
        "/img/data:\nkeep\n\n/img/opq:\nnew\nnewkept\nsame-agent\n"
    );
    // Pulled again (by tag), unpacked once: every step cached.
    let (second, stderr) = build_ok(&s, "copyimg", &insecure);
    assert_eq!(second["builtSteps"], 0, "{second:#}");
    assert!(!stderr.contains("unpacking"), "{stderr}");

    // `..` stays inside the image, as for a stage: a host file is not reached.
    s.write("secret", "host secret\n");
    let escape = format!("../../../../../..{}", s.path("secret").display());
    s.write(
        "ctx/Dockerfile",
        &format!("FROM minimal\nCOPY --from={reference} {escape} /x\n"),
    );
    let out = s.sandcell(&[
        "template",
        "build",
        "-t",
        "escape",
        "--insecure-registry",
        &host,
        s.path("ctx").to_str().unwrap(),
    ]);
    let stderr = failed(&out);
    assert!(
        stderr.contains("Dockerfile line 2") && stderr.contains("No such file"),
        "{stderr}"
    );
    assert!(!stderr.contains("host secret"), "{stderr}");
}

/// `python3 -m http.server` on 127.0.0.1 (a free port), serving a directory; killed on drop.
struct HttpServer {
    child: Child,
    port: u16,
}

impl HttpServer {
    fn start(dir: &std::path::Path) -> HttpServer {
        let mut child = Command::new("python3")
            .args(["-u", "-m", "http.server", "0", "--bind", "127.0.0.1"])
            .arg("--directory")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 is needed (apt install python3)");
        // "Serving HTTP on 127.0.0.1 port 41235 (http://127.0.0.1:41235/) ..."
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .split_whitespace()
            .skip_while(|w| *w != "port")
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("http.server said {line:?}"));
        HttpServer { child, port }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}/{path}", self.port)
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", common::sha256_hex(bytes))
}

#[test]
fn add_from_a_url() {
    let s = Setup::new();
    s.write("www/tool.txt", "v1\n");
    // Last-Modified (from the file's mtime) becomes the file's mtime.
    let stamp = Command::new("touch")
        .args(["-d", "@1000000000"])
        .arg(s.path("www/tool.txt"))
        .status()
        .unwrap();
    assert!(stamp.success());
    let server = HttpServer::start(&s.path("www"));
    let url = server.url("tool.txt");
    s.write(
        "ctx/Dockerfile",
        &format!(
            "FROM minimal\nADD {url} /opt/\nADD --chmod=755 {url} /opt/renamed\nRUN cat /opt/tool.txt\n"
        ),
    );
    let (first, stderr) = build_ok(&s, "addurl", &[]);
    assert_eq!(first["builtSteps"], 3, "{first:#}");
    assert!(
        stderr.contains(&format!("downloaded {url}: 3 bytes, {}", sha256(b"v1\n"))),
        "{stderr}"
    );
    let out = s.run_sh(
        "addurl",
        "stat -c '%n %a %s %Y' /opt/tool.txt /opt/renamed; cat /opt/renamed",
    );
    assert_eq!(
        out, "/opt/tool.txt 600 3 1000000000\n/opt/renamed 755 3 1000000000\nv1\n",
        "not unpacked, named from the URL, 0600 unless --chmod"
    );

    // Downloaded again on every build: the same content is a cache hit, a changed one is not.
    let (same, stderr) = build_ok(&s, "addurl", &[]);
    assert_eq!(same["builtSteps"], 0, "{same:#}");
    assert_eq!(stderr.matches("downloaded ").count(), 2, "{stderr}");
    s.write("www/tool.txt", "v2\n");
    let (changed, _) = build_ok(&s, "addurl", &[]);
    assert_eq!(changed["builtSteps"], 3, "{changed:#}");
    assert_eq!(
        std::fs::read_to_string(s.path("data/images/addurl/rootfs/opt/tool.txt")).unwrap(),
        "v2\n"
    );

    // --checksum: checked; once cached, no download at all.
    let good = sha256(b"v2\n");
    s.write(
        "ctx/Dockerfile",
        &format!("FROM minimal\nADD --checksum={good} {url} /pinned\n"),
    );
    let (pinned, stderr) = build_ok(&s, "pinned", &[]);
    assert_eq!(pinned["builtSteps"], 1, "{pinned:#}");
    assert!(stderr.contains("downloaded "), "{stderr}");
    let (again, stderr) = build_ok(&s, "pinned", &[]);
    assert_eq!(again["cachedSteps"], 1, "{again:#}");
    assert!(!stderr.contains("downloaded "), "{stderr}");

    let bad = sha256(b"something else");
    s.write(
        "ctx/Dockerfile",
        &format!("FROM minimal\nADD --checksum={bad} {url} /pinned\n"),
    );
    let stderr = failed(&build(&s, "badsum"));
    assert!(
        stderr.contains(&format!(
            "Dockerfile line 2: ADD --checksum={bad} {url} /pinned: ADD {url} (--checksum): \
             content has digest {good}, expected {bad}"
        )),
        "{stderr}"
    );
    assert!(!s.path("data/images/badsum").exists());

    // A missing file is the server's answer, with the step.
    s.write(
        "ctx/Dockerfile",
        &format!("FROM minimal\nADD {} /x\n", server.url("nope")),
    );
    let stderr = failed(&build(&s, "missing"));
    assert!(
        stderr.contains("Dockerfile line 2") && stderr.contains("404"),
        "{stderr}"
    );
}

#[test]
fn unused_stages_are_skipped() {
    let s = Setup::new();
    s.write(
        "ctx/Dockerfile",
        "FROM minimal AS broken\nRUN false\n\
         FROM broken AS also-unused\nRUN false\n\
         FROM minimal AS used\nRUN echo used > /used\n\
         FROM minimal\nCOPY --from=used /used /used\n",
    );
    let (record, stderr) = build_ok(&s, "skipped", &[]);
    assert!(
        stderr.contains("skipping stage 0 (broken, 2 steps): the final stage does not need it")
            && stderr.contains("skipping stage 1 (also-unused, 2 steps)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("Step 1/4: FROM minimal AS used"),
        "{stderr}"
    );
    assert_eq!(record["builtSteps"], 2, "{record:#}");
    assert_eq!(
        std::fs::read_to_string(s.path("data/images/skipped/rootfs/used")).unwrap(),
        "used\n"
    );
}

#[test]
fn deep_stages_are_flattened() {
    let s = Setup::new();
    // 60 layers: well past what one overlayfs mount's options can list with these paths.
    let mut dockerfile = String::from("FROM minimal\n");
    for n in 1..=60 {
        dockerfile.push_str(&format!("WORKDIR /w/{n}\n"));
    }
    dockerfile.push_str("RUN ls -d /w/1 /w/60 && pwd > /where\n");
    s.write("ctx/Dockerfile", &dockerfile);
    let (record, stderr) = build_ok(&s, "deep", &[]);
    assert!(stderr.contains("flattening "), "{stderr}");
    assert!(stderr.contains("/w/1\n/w/60\n"), "{stderr}");
    assert_eq!(record["layers"].as_array().unwrap().len(), 61, "{record:#}");
    assert_eq!(
        std::fs::read_to_string(s.path("data/images/deep/rootfs/where")).unwrap(),
        "/w/60\n"
    );
    // Cached: the flattened tree is found again, nothing is built.
    let (again, _) = build_ok(&s, "deep", &[]);
    assert_eq!(again["builtSteps"], 0, "{again:#}");
}
