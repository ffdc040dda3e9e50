//! COPY and ADD sources: `.dockerignore`, wildcards, the files a source names (read inside
//! the context or an earlier stage's tree, never through a symlink out of it), their cache
//! key (paths, modes, owners and content hashes) and the layer tar that puts them in place.

use super::fsops::RootDir;
use crate::digest::{Digest, Hasher};
use crate::{Error, Result};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// `.dockerignore`: patterns in order, later ones winning; `!` re-includes. A pattern
/// matching a directory excludes what is under it.
#[derive(Debug, Default, Clone)]
pub struct Ignore {
    patterns: Vec<(bool, Vec<String>)>,
}

impl Ignore {
    pub fn parse(text: &str) -> Ignore {
        let mut patterns = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (negate, pat) = match line.strip_prefix('!') {
                Some(p) => (true, p.trim()),
                None => (false, line),
            };
            let segments: Vec<String> = normalize(pat)
                .iter()
                .map(|c| c.to_string_lossy().into_owned())
                .collect();
            if !segments.is_empty() {
                patterns.push((negate, segments));
            }
        }
        Ignore { patterns }
    }

    /// Whether `rel` (relative to the context) is left out.
    pub fn excluded(&self, rel: &Path) -> bool {
        let parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let mut excluded = false;
        for (negate, pat) in &self.patterns {
            // The path itself or one of its parents.
            let hit = (1..=parts.len()).any(|n| match_segments(pat, &parts[..n]));
            if hit {
                excluded = !negate;
            }
        }
        excluded
    }
}

/// Segments of a pattern against segments of a path; `**` matches any number of them.
fn match_segments(pat: &[String], path: &[String]) -> bool {
    match pat.split_first() {
        None => path.is_empty(),
        Some((first, rest)) if first == "**" => {
            (0..=path.len()).any(|skip| match_segments(rest, &path[skip..]))
        }
        Some((first, rest)) => path
            .split_first()
            .is_some_and(|(p, prest)| glob(first, p) && match_segments(rest, prest)),
    }
}

/// One path segment against a pattern: `*`, `?`, `[a-z]`/`[^a]`, `\` escapes.
pub(crate) fn glob(pat: &str, s: &str) -> bool {
    let p: Vec<char> = pat.chars().collect();
    let s: Vec<char> = s.chars().collect();
    glob_at(&p, &s)
}

fn glob_at(p: &[char], s: &[char]) -> bool {
    match p.first() {
        None => s.is_empty(),
        Some('*') => (0..=s.len()).any(|i| glob_at(&p[1..], &s[i..])),
        Some('?') => !s.is_empty() && glob_at(&p[1..], &s[1..]),
        Some('[') => {
            let Some(close) = p.iter().skip(1).position(|c| *c == ']').map(|i| i + 1) else {
                return s.first() == Some(&'[') && glob_at(&p[1..], &s[1..]);
            };
            let Some(c) = s.first() else { return false };
            let mut class = &p[1..close];
            let negate = matches!(class.first(), Some('^' | '!'));
            if negate {
                class = &class[1..];
            }
            let mut hit = false;
            let mut i = 0;
            while i < class.len() {
                if i + 2 < class.len() && class[i + 1] == '-' {
                    hit |= (class[i]..=class[i + 2]).contains(c);
                    i += 3;
                } else {
                    hit |= class[i] == *c;
                    i += 1;
                }
            }
            hit != negate && glob_at(&p[close + 1..], &s[1..])
        }
        Some('\\') if p.len() > 1 => s.first() == Some(&p[1]) && glob_at(&p[2..], &s[1..]),
        Some(c) => s.first() == Some(c) && glob_at(&p[1..], &s[1..]),
    }
}

fn has_wildcard(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// A path's normal components (`.` dropped, `..` popping, leading `/` ignored).
pub(crate) fn normalize(p: &str) -> PathBuf {
    let mut out = PathBuf::new();
    for c in Path::new(p).components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

#[derive(Debug, Clone)]
enum Kind {
    File {
        src: PathBuf,
        size: u64,
    },
    Dir,
    Symlink(PathBuf),
    /// ADD of a local tar archive: its entries go under `dest`.
    Archive {
        src: PathBuf,
    },
    /// ADD of a URL: the downloaded file (the build's own, on the host; it may arrive only
    /// when the layer is made, see [`CopyPlan::add_download`]) and the digest it has.
    Download {
        file: PathBuf,
        digest: Digest,
    },
}

#[derive(Debug, Clone)]
struct Entry {
    /// Relative to the image root.
    dest: PathBuf,
    kind: Kind,
    mode: u32,
    mtime: i64,
}

/// What one COPY/ADD puts into the image.
pub(crate) struct CopyPlan<'a> {
    root: &'a RootDir,
    entries: Vec<Entry>,
    owner: (u32, u32),
    chmod: Option<u32>,
}

pub(crate) struct CopyRequest<'a> {
    pub root: &'a RootDir,
    pub ignore: Option<&'a Ignore>,
    /// Expanded sources, relative to `root`.
    pub sources: &'a [String],
    /// Expanded destination, absolute inside the image.
    pub dest: &'a str,
    pub add: bool,
    pub owner: (u32, u32),
    pub chmod: Option<u32>,
}

impl<'a> CopyPlan<'a> {
    pub(crate) fn new(req: CopyRequest<'a>) -> Result<CopyPlan<'a>> {
        let fail = |problem: String| Error::BadEntry {
            layer: "COPY".into(),
            path: req.dest.into(),
            problem,
        };
        let mut matched: Vec<PathBuf> = Vec::new();
        for source in req.sources {
            let rel = normalize(source);
            if has_wildcard(source) {
                let found = expand_wildcard(req.root, &rel, req.ignore)
                    .map_err(|e| fail(format!("listing sources for {source:?}: {e}")))?;
                if found.is_empty() {
                    return Err(fail(format!("no source file matches {source:?}")));
                }
                matched.extend(found);
            } else {
                if req.ignore.is_some_and(|i| i.excluded(&rel)) {
                    return Err(fail(format!(
                        "source {source:?} is excluded by .dockerignore"
                    )));
                }
                matched.push(rel);
            }
        }
        let dest_is_dir = req.dest.ends_with('/')
            || matched.len() > 1
            || req.sources.iter().any(|s| has_wildcard(s));
        let dest = normalize(req.dest);
        let mut plan = CopyPlan {
            root: req.root,
            entries: Vec::new(),
            owner: req.owner,
            chmod: req.chmod,
        };
        for src in matched {
            let meta = req.root.stat(&src).map_err(|e| {
                fail(format!(
                    "source {:?} in {}: {e}",
                    src.display(),
                    req.root.path.display()
                ))
            })?;
            if meta.is_dir() {
                plan.walk(&src, &dest, req.ignore)
                    .map_err(|e| fail(format!("copying {}: {e}", src.display())))?;
                continue;
            }
            let name = src.file_name().map(PathBuf::from).unwrap_or_default();
            let target = if dest_is_dir || dest.as_os_str().is_empty() {
                dest.join(&name)
            } else {
                dest.clone()
            };
            let is_archive = req.add
                && meta.is_file()
                && looks_like_tar(req.root, &src).map_err(|e| fail(e.to_string()))?;
            let kind = if is_archive {
                Kind::Archive { src: src.clone() }
            } else if meta.is_file() {
                Kind::File {
                    src: src.clone(),
                    size: meta.len(),
                }
            } else {
                return Err(fail(format!(
                    "{} is not a file or directory",
                    src.display()
                )));
            };
            plan.entries.push(Entry {
                dest: if is_archive { dest.clone() } else { target },
                kind,
                mode: meta.permissions().mode() & 0o7777,
                mtime: meta.mtime(),
            });
        }
        Ok(plan)
    }

    /// The contents of directory `src` under `dest`.
    fn walk(&mut self, src: &Path, dest: &Path, ignore: Option<&Ignore>) -> io::Result<()> {
        for name in self.root.list(src)? {
            let rel = src.join(&name);
            if ignore.is_some_and(|i| i.excluded(&rel)) {
                continue;
            }
            let meta = self.root.lstat(&rel)?;
            let target = dest.join(&name);
            let ft = meta.file_type();
            let kind = if ft.is_dir() {
                Kind::Dir
            } else if ft.is_symlink() {
                Kind::Symlink(self.root.read_link(&rel)?)
            } else if ft.is_file() {
                Kind::File {
                    src: rel.clone(),
                    size: meta.len(),
                }
            } else {
                continue; // sockets, fifos, devices: not copied
            };
            self.entries.push(Entry {
                dest: target.clone(),
                kind,
                mode: meta.permissions().mode() & 0o7777,
                mtime: meta.mtime(),
            });
            if ft.is_dir() {
                self.walk(&rel, &target, ignore)?;
            }
        }
        Ok(())
    }

    fn mode_of(&self, e: &Entry) -> u32 {
        match (&e.kind, self.chmod) {
            (Kind::Symlink(_), _) => 0o777,
            (_, Some(m)) => m,
            _ => e.mode,
        }
    }

    /// Paths, kinds, modes, owners and content hashes: the step's cache input.
    pub(crate) fn hash_into(&self, h: &mut Hasher) -> Result<()> {
        h.update(format!("owner {}:{}\n", self.owner.0, self.owner.1).as_bytes());
        for e in &self.entries {
            h.update(format!("{}\0{:o}\0", e.dest.display(), self.mode_of(e)).as_bytes());
            match &e.kind {
                Kind::Dir => h.update(b"dir\n"),
                Kind::Symlink(t) => h.update(format!("link {}\n", t.display()).as_bytes()),
                Kind::Download { digest, .. } => {
                    h.update(format!("download {digest}\n").as_bytes())
                }
                Kind::File { src, .. } | Kind::Archive { src } => {
                    h.update(b"file ");
                    let mut f = self
                        .root
                        .open_file(src, true)
                        .map_err(Error::io("reading", self.root.path.join(src)))?;
                    let mut buf = vec![0u8; 256 * 1024];
                    loop {
                        let n = f
                            .read(&mut buf)
                            .map_err(Error::io("reading", self.root.path.join(src)))?;
                        if n == 0 {
                            break;
                        }
                        h.update(&buf[..n]);
                    }
                    h.update(b"\n");
                }
            }
        }
        Ok(())
    }

    /// An ADD URL source: `file` (which must exist by [`CopyPlan::write_tar`]) with the
    /// content `digest`, at `dest` (absolute in the image), mode 0600 unless `--chmod`, its
    /// mtime the file's. The key has the digest, not the bytes: a checksum-pinned download
    /// is keyed before it is fetched.
    pub(crate) fn add_download(&mut self, dest: &str, file: PathBuf, digest: Digest) {
        self.entries.push(Entry {
            dest: normalize(dest),
            kind: Kind::Download { file, digest },
            mode: 0o600,
            mtime: 0,
        });
    }

    pub(crate) fn set_owner(&mut self, owner: (u32, u32)) {
        self.owner = owner;
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The layer: an uncompressed tar of the entries (ADD archives unpacked in it).
    pub(crate) fn write_tar(&self, out: impl io::Write) -> Result<()> {
        let mut tar = tar::Builder::new(out);
        tar.follow_symlinks(false);
        for e in &self.entries {
            let io_err = Error::io("writing the COPY layer entry", &e.dest);
            let mut h = tar::Header::new_gnu();
            h.set_uid(u64::from(self.owner.0));
            h.set_gid(u64::from(self.owner.1));
            h.set_mode(self.mode_of(e));
            h.set_mtime(e.mtime.max(0) as u64);
            match &e.kind {
                Kind::Dir => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_size(0);
                    tar.append_data(&mut h, &e.dest, io::empty())
                        .map_err(io_err)?;
                }
                Kind::Symlink(target) => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_size(0);
                    tar.append_link(&mut h, &e.dest, target).map_err(io_err)?;
                }
                Kind::File { src, size } => {
                    let f = self
                        .root
                        .open_file(src, true)
                        .map_err(Error::io("reading", self.root.path.join(src)))?;
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_size(*size);
                    // A file that changed size since it was listed fails here (short read)
                    // rather than writing a torn layer.
                    tar.append_data(&mut h, &e.dest, f.take(*size))
                        .map_err(io_err)?;
                }
                Kind::Archive { src } => self.unpack_archive(&mut tar, src, &e.dest)?,
                Kind::Download { file, .. } => {
                    let f = std::fs::File::open(file).map_err(Error::io("reading", file))?;
                    let meta = f.metadata().map_err(Error::io("looking at", file))?;
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_size(meta.len());
                    h.set_mtime(meta.mtime().max(0) as u64);
                    tar.append_data(&mut h, &e.dest, f.take(meta.len()))
                        .map_err(io_err)?;
                }
            }
        }
        tar.finish()
            .map_err(Error::io("finishing the COPY layer", &self.root.path))
    }

    /// ADD of a local archive: its entries re-rooted under `dest` (their own owners kept).
    fn unpack_archive<W: io::Write>(
        &self,
        tar: &mut tar::Builder<W>,
        src: &Path,
        dest: &Path,
    ) -> Result<()> {
        let path = self.root.path.join(src);
        let mut f = self
            .root
            .open_file(src, true)
            .map_err(Error::io("reading", &path))?;
        let mut magic = [0u8; 2];
        let n = f.read(&mut magic).map_err(Error::io("reading", &path))?;
        let f = self
            .root
            .open_file(src, true)
            .map_err(Error::io("reading", &path))?;
        let reader: Box<dyn Read> = if n == 2 && magic == [0x1f, 0x8b] {
            Box::new(flate2::read::MultiGzDecoder::new(f))
        } else {
            Box::new(f)
        };
        let mut archive = tar::Archive::new(reader);
        let bad = |e: io::Error| Error::BadEntry {
            layer: format!("ADD {}", src.display()),
            path: String::new(),
            problem: e.to_string(),
        };
        for entry in archive.entries().map_err(bad)? {
            let mut entry = entry.map_err(bad)?;
            let rel = normalize(&String::from_utf8_lossy(&entry.path_bytes()));
            if rel.as_os_str().is_empty() {
                continue;
            }
            let mut h = entry.header().clone();
            let target = dest.join(&rel);
            let kind = h.entry_type();
            if kind.is_symlink() || kind.is_hard_link() {
                let link = entry
                    .link_name_bytes()
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default();
                let link = if kind.is_hard_link() {
                    dest.join(normalize(&link))
                } else {
                    PathBuf::from(link)
                };
                tar.append_link(&mut h, &target, &link).map_err(bad)?;
            } else {
                tar.append_data(&mut h, &target, &mut entry).map_err(bad)?;
            }
        }
        Ok(())
    }
}

/// A gzip stream or a tar header ("ustar" at offset 257).
fn looks_like_tar(root: &RootDir, src: &Path) -> io::Result<bool> {
    let mut f = root.open_file(src, true)?;
    let mut head = vec![0u8; 512];
    let mut got = 0;
    while got < head.len() {
        let n = f.read(&mut head[got..])?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(head.starts_with(&[0x1f, 0x8b]) || head.get(257..262) == Some(b"ustar"))
}

/// Paths under `root` matching a wildcard source, segment by segment (excluded ones left
/// out), sorted.
fn expand_wildcard(
    root: &RootDir,
    pat: &Path,
    ignore: Option<&Ignore>,
) -> io::Result<Vec<PathBuf>> {
    let segments: Vec<String> = pat
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let mut current = vec![PathBuf::new()];
    for seg in &segments {
        let mut next = Vec::new();
        for dir in &current {
            if !has_wildcard(seg) {
                let p = dir.join(seg);
                if root.lstat(&p).is_ok() {
                    next.push(p);
                }
                continue;
            }
            let Ok(names) = root.list(dir) else { continue };
            for name in names {
                if glob(seg, &name.to_string_lossy()) {
                    next.push(dir.join(name));
                }
            }
        }
        current = next;
    }
    current.retain(|p| !ignore.is_some_and(|i| i.excluded(p)));
    Ok(current)
}

/// `--chown=USER[:GROUP]`: numbers, or names from the image's /etc/passwd and /etc/group
/// (a user alone: its primary group).
pub(crate) fn resolve_owner(
    image: &RootDir,
    spec: &str,
) -> std::result::Result<(u32, u32), String> {
    let (user, group) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let read = |file: &str| -> String {
        image
            .open_file(Path::new(file), true)
            .ok()
            .and_then(|f| {
                let mut s = String::new();
                f.take(4 << 20).read_to_string(&mut s).ok().map(|_| s)
            })
            .unwrap_or_default()
    };
    let passwd = read("etc/passwd");
    let (uid, primary) = match user.parse::<u32>() {
        Ok(uid) => (
            uid,
            passwd
                .lines()
                .map(|l| l.split(':').collect::<Vec<_>>())
                .find(|f| f.get(2).and_then(|u| u.parse::<u32>().ok()) == Some(uid))
                .and_then(|f| f.get(3).and_then(|g| g.parse().ok()))
                .unwrap_or(uid),
        ),
        Err(_) => passwd
            .lines()
            .map(|l| l.split(':').collect::<Vec<_>>())
            .find(|f| f.first() == Some(&user))
            .and_then(|f| Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?)))
            .ok_or_else(|| {
                format!("--chown={spec}: no user {user:?} in the image's /etc/passwd")
            })?,
    };
    let gid = match group {
        None => primary,
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => read("etc/group")
                .lines()
                .map(|l| l.split(':').collect::<Vec<_>>())
                .find(|f| f.first() == Some(&g))
                .and_then(|f| f.get(2)?.parse().ok())
                .ok_or_else(|| {
                    format!("--chown={spec}: no group {g:?} in the image's /etc/group")
                })?,
        },
    };
    Ok((uid, gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob("*.txt", "a.txt"));
        assert!(!glob("*.txt", "a.txt.bak"));
        assert!(glob("a?c", "abc"));
        assert!(glob("[a-c]x", "bx"));
        assert!(!glob("[^a-c]x", "bx"));
        assert!(glob("\\*", "*"));
        assert!(!glob("\\*", "x"));
    }

    #[test]
    fn dockerignore() {
        let i = Ignore::parse("# comment\n*.log\nsecret/\n!keep.log\n**/tmp\n/build\n");
        let ex = |p: &str| i.excluded(Path::new(p));
        assert!(ex("a.log"));
        assert!(!ex("keep.log"));
        assert!(!ex("dir/a.log")); // `*.log` is for the top only
        assert!(ex("secret/x/y"));
        assert!(ex("a/b/tmp/z"));
        assert!(ex("tmp"));
        assert!(ex("build/out"));
        assert!(!ex("src/main.rs"));
    }

    #[test]
    fn copies_from_a_tree_without_leaving_it() {
        let tmp = tempfile::tempdir().unwrap();
        let ctx = tmp.path();
        std::fs::create_dir_all(ctx.join("dir/sub")).unwrap();
        std::fs::write(ctx.join("dir/a.txt"), "a").unwrap();
        std::fs::write(ctx.join("dir/sub/b.txt"), "bb").unwrap();
        std::fs::write(ctx.join("dir/x.log"), "log").unwrap();
        std::fs::write(ctx.join("one"), "1").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", ctx.join("escape")).unwrap();
        let root = RootDir::open(ctx).unwrap();
        let src_332: Vec<String> = vec!["dir/*.txt".to_string()];
        let src_832: Vec<String> = vec!["../../etc/passwd".to_string()];
        let src_350: Vec<String> = vec!["escape".to_string()];
        let src_518: Vec<String> = vec!["dir".to_string(), "one".to_string()];
        let ignore = Ignore::parse("dir/*.log");
        let plan = CopyPlan::new(CopyRequest {
            root: &root,
            ignore: Some(&ignore),
            sources: &src_518,
            dest: "/app",
            add: false,
            owner: (0, 0),
            chmod: None,
        })
        .unwrap();
        let dests: Vec<_> = plan
            .entries
            .iter()
            .map(|e| e.dest.display().to_string())
            .collect();
        assert_eq!(dests, ["app/a.txt", "app/sub", "app/sub/b.txt", "app/one"]);
        // The symlink's absolute target resolves inside the context, where there is none.
        let e = CopyPlan::new(CopyRequest {
            root: &root,
            ignore: None,
            sources: &src_350,
            dest: "/x",
            add: false,
            owner: (0, 0),
            chmod: None,
        });
        assert!(e.is_err());
        let e = CopyPlan::new(CopyRequest {
            root: &root,
            ignore: None,
            sources: &src_832,
            dest: "/x",
            add: false,
            owner: (0, 0),
            chmod: None,
        });
        assert!(
            e.is_err(),
            "normalized to etc/passwd inside the context: absent"
        );
        let wild = CopyPlan::new(CopyRequest {
            root: &root,
            ignore: None,
            sources: &src_332,
            dest: "/w",
            add: false,
            owner: (0, 0),
            chmod: Some(0o600),
        })
        .unwrap();
        assert_eq!(wild.len(), 1);
        assert_eq!(wild.entries[0].dest, Path::new("w/a.txt"));
        let mut h1 = Hasher::default();
        plan.hash_into(&mut h1).unwrap();
        std::fs::write(ctx.join("dir/a.txt"), "A").unwrap();
        let mut h2 = Hasher::default();
        plan.hash_into(&mut h2).unwrap();
        assert_ne!(h1.finish(), h2.finish());
    }

    #[test]
    fn add_unpacks_a_local_archive_under_the_destination() {
        let tmp = tempfile::tempdir().unwrap();
        let ctx = tmp.path();
        let mut inner = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(5);
        h.set_mode(0o640);
        h.set_uid(7);
        inner
            .append_data(&mut h, "pkg/file", &b"hello"[..])
            .unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mode(0o777);
        h.set_mtime(0);
        inner.append_link(&mut h, "pkg/link", "file").unwrap();
        let raw = inner.into_inner().unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &raw).unwrap();
        std::fs::write(ctx.join("a.tar.gz"), gz.finish().unwrap()).unwrap();
        let root = RootDir::open(ctx).unwrap();
        let sources = vec!["a.tar.gz".to_string()];
        let request = |add| CopyRequest {
            root: &root,
            ignore: None,
            sources: &sources,
            dest: "/opt/",
            add,
            owner: (0, 0),
            chmod: None,
        };
        let mut out = Vec::new();
        CopyPlan::new(request(true))
            .unwrap()
            .write_tar(&mut out)
            .unwrap();
        let mut archive = tar::Archive::new(&out[..]);
        let mut seen = Vec::new();
        for e in archive.entries().unwrap() {
            let mut e = e.unwrap();
            let path = e.path().unwrap().display().to_string();
            let mut body = String::new();
            std::io::Read::read_to_string(&mut e, &mut body).unwrap();
            seen.push((path, e.header().uid().unwrap(), body));
        }
        assert_eq!(
            seen,
            [
                ("opt/pkg/file".to_string(), 7, "hello".to_string()),
                ("opt/pkg/link".to_string(), 0, String::new())
            ]
        );
        // COPY copies the archive as it is.
        let mut out = Vec::new();
        CopyPlan::new(request(false))
            .unwrap()
            .write_tar(&mut out)
            .unwrap();
        let mut archive = tar::Archive::new(&out[..]);
        let names: Vec<String> = archive
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(names, ["opt/a.tar.gz"]);
    }
}
