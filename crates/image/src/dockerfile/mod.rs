//! Dockerfiles, read without Docker: [`parse`] gives the stages and steps (with their line
//! numbers), [`words`] substitutes variables the way Docker does while the build runs
//! (`crate::template` executes the steps).
//!
//! Supported: FROM (`AS name`, `--platform=linux/amd64`, `scratch`), RUN (shell and exec
//! form), COPY and ADD (local sources, `--chown`, `--chmod`; COPY `--from=` an earlier stage
//! or an image; ADD also unpacks local tar archives and downloads `http(s)://` URLs, with
//! `--checksum=sha256:...`), ENV, ARG (global before the first FROM, per stage after it),
//! WORKDIR, USER, EXPOSE, ENTRYPOINT, CMD, LABEL. Continuation lines, comments and the
//! `# escape=` directive (`# syntax=` is ignored). Everything else is refused with its line.

pub mod parse;
pub mod words;

pub use parse::parse;

/// What is wrong, and where (1-based line; 0: the file as a whole).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Dockerfile line {line}: {problem}")]
pub struct ParseError {
    pub line: usize,
    pub problem: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dockerfile {
    /// The escape character (`\` unless `# escape=` chose `` ` ``).
    pub escape: char,
    /// ARGs before the first FROM: usable in FROM lines, and redeclared (`ARG NAME`) in a
    /// stage to be seen there.
    pub global_args: Vec<ArgDecl>,
    pub stages: Vec<Stage>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    /// Its position (0 is the first FROM); `COPY --from=N` may name it so.
    pub index: usize,
    pub name: Option<String>,
    /// The FROM image as written (variables not yet substituted): an earlier stage, a
    /// Sandcell image or template, or a registry reference.
    pub base: String,
    pub line: usize,
    pub steps: Vec<Step>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub line: usize,
    /// The instruction as written (continuations joined), for progress and cache keys.
    pub text: String,
    pub instruction: Instruction,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Instruction {
    Run(Command),
    Copy(CopySpec),
    /// The raw `KEY=VALUE ...` (or legacy `KEY VALUE`) text, expanded while building.
    Env(String),
    Arg(Vec<ArgDecl>),
    Workdir(String),
    User(String),
    Expose(String),
    Entrypoint(Command),
    Cmd(Command),
    Label(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Run with `/bin/sh -c`.
    Shell(String),
    /// The JSON array form: run as given.
    Exec(Vec<String>),
}

impl Command {
    /// The argv: shell form through `/bin/sh -c`.
    pub fn argv(&self) -> Vec<String> {
        match self {
            Command::Shell(s) => vec!["/bin/sh".into(), "-c".into(), s.clone()],
            Command::Exec(v) => v.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgDecl {
    pub name: String,
    /// As written (expanded when the ARG step runs).
    pub default: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopySpec {
    /// ADD (which also unpacks local tar archives into the destination).
    pub add: bool,
    /// `--from=`: an earlier stage's name or index, or else an image (a Sandcell image or
    /// template, or a registry reference); global ARGs are expanded in it while building.
    pub from: Option<String>,
    /// ADD `--checksum=sha256:<hex>`: the digest its one URL source must have.
    pub checksum: Option<String>,
    /// `--chown=USER[:GROUP]` (names looked up in the image's /etc/passwd and /etc/group).
    pub chown: Option<String>,
    /// `--chmod=` octal.
    pub chmod: Option<String>,
    /// The sources then the destination, as written (quotes kept unless `json`).
    pub args: Vec<String>,
    /// Written in the JSON array form (no expansion of quotes needed).
    pub json: bool,
}

impl Dockerfile {
    /// The stage that `reference` (a FROM image or a `COPY --from`, variables expanded)
    /// names among those before stage `before`: by name (case-insensitively) or by index.
    pub fn earlier_stage(&self, before: usize, reference: &str) -> Option<usize> {
        let lower = reference.to_ascii_lowercase();
        let earlier = self.stages.get(..before)?;
        earlier
            .iter()
            .position(|s| s.name.as_deref() == Some(lower.as_str()))
            .or_else(|| reference.parse::<usize>().ok().filter(|n| *n < before))
    }
}

/// An ADD source that is downloaded rather than read from the context.
pub fn is_url(source: &str) -> bool {
    let lower = source.get(..8).unwrap_or(source).to_ascii_lowercase();
    lower.starts_with("http://") || lower.starts_with("https://")
}

/// Stage names: what `AS` accepts (Docker's rule, lowercased).
pub fn valid_stage_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(text: &str) -> Vec<Step> {
        parse(text).unwrap().stages.remove(0).steps
    }

    #[test]
    fn every_instruction() {
        let file = parse(
            "# syntax=docker/dockerfile:1\n\
             ARG BASE=minimal\n\
             FROM $BASE AS build\n\
             RUN echo hi && \\\n    echo there\n\
             RUN [\"/bin/echo\", \"exec form\"]\n\
             COPY --chown=1000:1000 --chmod=755 a b /dst/\n\
             ADD [\"with space\", \"/x y/\"]\n\
             ENV A=1 B=\"two words\"\n\
             ENV LEGACY some value\n\
             ARG V=3 W\n\
             WORKDIR /app\n\
             USER nobody\n\
             EXPOSE 8080/tcp 9090\n\
             LABEL org.x=\"y\"\n\
             ENTRYPOINT [\"/bin/app\"]\n\
             CMD --help\n\
             from build as final\n\
             copy --from=build /app /app\n",
        )
        .unwrap();
        assert_eq!(file.escape, '\\');
        assert_eq!(
            file.global_args,
            [ArgDecl {
                name: "BASE".into(),
                default: Some("minimal".into())
            }]
        );
        assert_eq!(file.stages.len(), 2);
        let s = &file.stages[0];
        assert_eq!(
            (s.base.as_str(), s.name.as_deref(), s.line),
            ("$BASE", Some("build"), 3)
        );
        let kinds: Vec<_> = s.steps.iter().map(|st| st.line).collect();
        assert_eq!(kinds, [4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]);
        assert_eq!(
            s.steps[0].instruction,
            Instruction::Run(Command::Shell("echo hi &&     echo there".into()))
        );
        assert_eq!(
            s.steps[1].instruction,
            Instruction::Run(Command::Exec(vec!["/bin/echo".into(), "exec form".into()]))
        );
        let Instruction::Copy(copy) = &s.steps[2].instruction else {
            panic!("{:?}", s.steps[2]);
        };
        assert_eq!(copy.chown.as_deref(), Some("1000:1000"));
        assert_eq!(copy.chmod.as_deref(), Some("755"));
        assert_eq!(copy.args, ["a", "b", "/dst/"]);
        let Instruction::Copy(add) = &s.steps[3].instruction else {
            panic!()
        };
        assert!(add.add && add.json);
        assert_eq!(add.args, ["with space", "/x y/"]);
        assert_eq!(
            s.steps[6].instruction,
            Instruction::Arg(vec![
                ArgDecl {
                    name: "V".into(),
                    default: Some("3".into())
                },
                ArgDecl {
                    name: "W".into(),
                    default: None
                }
            ])
        );
        assert_eq!(
            s.steps[12].instruction,
            Instruction::Cmd(Command::Shell("--help".into()))
        );
        assert_eq!(s.steps[12].text, "CMD --help");
        let fin = &file.stages[1];
        assert_eq!(fin.name.as_deref(), Some("final"));
        let Instruction::Copy(c) = &fin.steps[0].instruction else {
            panic!()
        };
        assert_eq!(c.from.as_deref(), Some("build"));
    }

    #[test]
    fn comments_and_continuations() {
        let st = steps(
            "FROM x\n\
             # a comment\n\
             RUN a \\\n\
             # comment inside\n\
             \n\
               b \\\\\n\
             RUN c\n\
             RUN d \\",
        );
        assert_eq!(st.len(), 3);
        assert_eq!(
            st[0].instruction,
            Instruction::Run(Command::Shell("a b \\\\".into()))
        );
        assert_eq!(st[1].line, 7);
        assert_eq!(
            st[2].instruction,
            Instruction::Run(Command::Shell("d".into()))
        );
    }

    #[test]
    fn escape_directive() {
        let file = parse("# escape=`\nFROM x\nRUN dir `\n  c:\\\n").unwrap();
        assert_eq!(file.escape, '`');
        assert_eq!(
            file.stages[0].steps[0].instruction,
            Instruction::Run(Command::Shell("dir   c:\\".into()))
        );
        assert!(
            parse("# escape=x\nFROM x")
                .unwrap_err()
                .problem
                .contains("escape")
        );
        // Not at the top: a comment.
        assert_eq!(parse("FROM x\n# escape=`\nRUN a `\n").unwrap().escape, '\\');
    }

    #[test]
    fn errors_say_the_line() {
        let e = parse("FROM x\nRUN ok\nHEALTHCHECK CMD true\n").unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.problem.contains("HEALTHCHECK is not supported"), "{e}");
        assert_eq!(parse("FROM x\n\nFOO bar").unwrap_err().line, 3);
        assert_eq!(parse("RUN x\nFROM y").unwrap_err().line, 1);
        assert_eq!(parse("# only\n").unwrap_err().line, 0);
        assert_eq!(parse("FROM x\nCOPY onlyone").unwrap_err().line, 2);
        assert_eq!(parse("FROM x AS a\nFROM y AS a").unwrap_err().line, 2);
        assert_eq!(parse("FROM x AS 1bad").unwrap_err().line, 1);
        assert_eq!(parse("FROM x y").unwrap_err().line, 1);
        assert_eq!(parse("FROM --platform=linux/arm64 x").unwrap_err().line, 1);
        assert_eq!(
            parse("FROM x\nRUN --mount=type=cache x").unwrap_err().line,
            2
        );
        assert_eq!(parse("FROM x\nRUN <<EOF\nx\nEOF").unwrap_err().line, 2);
        assert_eq!(parse("FROM x\nCOPY --chmod=9 a b").unwrap_err().line, 2);
        assert_eq!(parse("FROM x\nADD --from=x a b").unwrap_err().line, 2);
        assert_eq!(parse("FROM x\nENV JUSTKEY").unwrap_err().line, 2);
        assert_eq!(parse("FROM x\nLABEL nokv").unwrap_err().line, 2);
        assert_eq!(parse("FROM x\nARG 9x").unwrap_err().line, 2);
        assert_eq!(parse("FROM x\nRUN").unwrap_err().line, 2);
        assert_eq!(parse("FROM x\nENV A='open").unwrap_err().line, 2);
        // COPY --from by index, of an earlier stage only.
        assert!(parse("FROM x\nFROM y\nCOPY --from=0 a b").is_ok());
        assert_eq!(parse("FROM x\nCOPY --from=0 a b").unwrap_err().line, 2);
    }

    fn copy_of(text: &str) -> CopySpec {
        match parse(text)
            .unwrap()
            .stages
            .pop()
            .unwrap()
            .steps
            .remove(0)
            .instruction
        {
            Instruction::Copy(c) => c,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn scratch_and_copy_from_images() {
        let file = parse("FROM scratch AS files\nCOPY a /a\n").unwrap();
        assert_eq!(file.stages[0].base, "scratch");
        // Not a stage: an image, as written (a tag may have capitals).
        let c = copy_of("FROM x\nCOPY --from=registry.local:5000/app:V1 /bin/app /app\n");
        assert_eq!(c.from.as_deref(), Some("registry.local:5000/app:V1"));
        let c = copy_of("FROM x\nCOPY --from=minimal /etc/os-release /x\n");
        assert_eq!(c.from.as_deref(), Some("minimal"));
        // Decided while building (global ARGs).
        assert!(parse("ARG IMG=x\nFROM x\nCOPY --from=$IMG a b").is_ok());
        // Stages: by name (any case) or number, earlier ones only.
        let file = parse("FROM x AS Build\nFROM y\nCOPY --from=BUILD a b\n").unwrap();
        assert_eq!(file.earlier_stage(1, "BUILD"), Some(0));
        assert_eq!(file.earlier_stage(1, "0"), Some(0));
        assert_eq!(file.earlier_stage(0, "build"), None);
        assert_eq!(file.earlier_stage(1, "minimal"), None);
        let e = parse("FROM x\nCOPY --from=later a b\nFROM y AS later\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.problem.contains("later stage"), "{e}");
        assert_eq!(
            parse("FROM x AS self\nCOPY --from=self a b")
                .unwrap_err()
                .line,
            2
        );
        assert_eq!(parse("FROM x\nCOPY --from=1 a b").unwrap_err().line, 2);
    }

    #[test]
    fn add_urls_and_checksums() {
        let sum = format!("sha256:{}", "ab".repeat(32));
        let c = copy_of(&format!(
            "FROM x\nADD --checksum={sum} --chmod=644 https://example.test/f.tgz /opt/\n"
        ));
        assert!(c.add);
        assert_eq!(c.checksum.as_deref(), Some(sum.as_str()));
        assert_eq!(c.chmod.as_deref(), Some("644"));
        assert_eq!(c.args, ["https://example.test/f.tgz", "/opt/"]);
        let c = copy_of("FROM x\nADD HTTP://e.test/a local.txt /d/\n");
        assert_eq!(c.checksum, None);
        assert!(is_url("HTTP://e.test/a") && !is_url("local.txt") && !is_url("ftp://e/x"));
        let line2 = |t: &str| {
            let e = parse(t).unwrap_err();
            assert_eq!(e.line, 2, "{e}");
            e.problem
        };
        assert!(line2("FROM x\nCOPY http://e/x /x").contains("for ADD"));
        assert!(line2("FROM x\nADD ftp://e/x /x").contains("http://"));
        assert!(line2("FROM x\nADD --checksum=md5:00 http://e/x /x").contains("sha256"));
        assert!(line2(&format!("FROM x\nADD --checksum={sum} a /x")).contains("URL"));
        assert!(
            line2(&format!(
                "FROM x\nADD --checksum={sum} http://e/a http://e/b /x/"
            ))
            .contains("exactly one")
        );
        assert!(line2(&format!("FROM x\nCOPY --checksum={sum} a /x")).contains("--from"));
    }

    #[test]
    fn copy_words_keep_quotes_for_expansion() {
        let st = steps("FROM x\nCOPY \"a b\" '$c' $D /dst\n");
        let Instruction::Copy(c) = &st[0].instruction else {
            panic!()
        };
        assert_eq!(c.args, ["\"a b\"", "'$c'", "$D", "/dst"]);
    }
}
