//! The Dockerfile's structure: lines joined at the escape character, comments and parser
//! directives (`# syntax=` ignored, `# escape=` honoured) removed, instructions and their
//! flags recognized, stages split at FROM. Variables are substituted later, while building
//! (their values depend on the steps before).

use super::words;
use super::{
    ArgDecl, Command, CopySpec, Dockerfile, Instruction, ParseError, Stage, Step, is_url,
    valid_stage_name,
};

/// Parses a whole Dockerfile.
pub fn parse(text: &str) -> Result<Dockerfile, ParseError> {
    let (escape, body_start) = directives(text)?;
    let mut file = Dockerfile {
        escape,
        global_args: Vec::new(),
        stages: Vec::new(),
    };
    for (line, joined) in logical_lines(text, escape, body_start) {
        let trimmed = joined.trim();
        let (keyword, rest) = match trimmed.split_once(char::is_whitespace) {
            Some((k, r)) => (k, r.trim()),
            None => (trimmed, ""),
        };
        let keyword = keyword.to_ascii_uppercase();
        let err = |problem: String| ParseError { line, problem };
        if keyword == "FROM" {
            let stage = parse_from(rest, escape, line, file.stages.len())?;
            if let Some(name) = &stage.name
                && file.stages.iter().any(|s| s.name.as_ref() == Some(name))
            {
                return Err(err(format!("stage name {name:?} is used twice")));
            }
            file.stages.push(stage);
            continue;
        }
        let instruction = parse_instruction(&keyword, rest, escape, line)?;
        let Some(stage) = file.stages.last_mut() else {
            match instruction {
                Instruction::Arg(decls) => {
                    file.global_args.extend(decls);
                    continue;
                }
                _ => {
                    return Err(err(format!(
                        "{keyword} before the first FROM (only ARG may come before it)"
                    )));
                }
            }
        };
        stage.steps.push(Step {
            line,
            text: format!("{keyword} {rest}").trim_end().to_string(),
            instruction,
        });
    }
    if file.stages.is_empty() {
        return Err(ParseError {
            line: 0,
            problem: "no FROM instruction: a Dockerfile needs at least one stage".into(),
        });
    }
    // `COPY --from=NAME`: an earlier stage, or else an image. A number or the name of this
    // or a later stage is a mistake (Docker refuses them too); one with a variable is
    // resolved while building.
    for (index, stage) in file.stages.iter().enumerate() {
        for step in &stage.steps {
            if let Instruction::Copy(copy) = &step.instruction
                && let Some(from) = &copy.from
                && !from.contains('$')
                && file.earlier_stage(index, from).is_none()
            {
                let lower = from.to_ascii_lowercase();
                let later = file.stages[index..]
                    .iter()
                    .any(|s| s.name.as_deref() == Some(lower.as_str()));
                if later || from.parse::<usize>().is_ok() {
                    return Err(ParseError {
                        line: step.line,
                        problem: format!(
                            "--from={from}: names this or a later stage (only earlier ones \
                             can be copied from)"
                        ),
                    });
                }
            }
        }
    }
    Ok(file)
}

/// Parser directives: `# name=value` lines at the very top. Returns the escape character
/// and the index of the first line after them.
fn directives(text: &str) -> Result<(char, usize), ParseError> {
    let mut escape = '\\';
    for (index, line) in text.lines().enumerate() {
        let Some(comment) = line.trim().strip_prefix('#') else {
            return Ok((escape, index));
        };
        let Some((name, value)) = comment.split_once('=') else {
            return Ok((escape, index));
        };
        let name = name.trim().to_ascii_lowercase();
        if name.contains(char::is_whitespace) {
            return Ok((escape, index));
        }
        // `# syntax=` picks a BuildKit frontend: there is none here; the other directives
        // are BuildKit's too. Only `escape` changes how the file reads.
        if name == "escape" {
            escape = match value.trim() {
                "\\" => '\\',
                "`" => '`',
                other => {
                    return Err(ParseError {
                        line: index + 1,
                        problem: format!("escape directive {other:?}: must be \\ or `"),
                    });
                }
            };
        }
    }
    Ok((escape, text.lines().count()))
}

/// Instructions with their first line number: continuation lines joined, comment lines and
/// empty lines dropped (also inside a continuation, as Docker does).
fn logical_lines(text: &str, escape: char, skip: usize) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (index, raw) in text.lines().enumerate().skip(skip) {
        let line = raw.trim_end_matches('\r');
        let trimmed = line.trim_start();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_none()) {
            continue;
        }
        if trimmed.is_empty() {
            continue;
        }
        let body = line.trim_end();
        let (text, continues) = match body.strip_suffix(escape) {
            // An escaped escape character (`\\` at the end) does not continue the line.
            Some(stripped) if !stripped.ends_with(escape) => (stripped, true),
            _ => (body, false),
        };
        let entry = current.get_or_insert_with(|| (index + 1, String::new()));
        entry.1.push_str(text);
        if !continues {
            out.extend(current.take());
        }
    }
    out.extend(current);
    out
}

fn parse_from(rest: &str, escape: char, line: usize, index: usize) -> Result<Stage, ParseError> {
    let err = |problem: String| ParseError { line, problem };
    let mut words = words::split(rest, escape, None, line)?;
    // --platform: only what Sandcell runs.
    while let Some(flag) = words.first().filter(|w| w.starts_with("--")).cloned() {
        words.remove(0);
        match flag.split_once('=') {
            Some(("--platform", "linux/amd64" | "$BUILDPLATFORM" | "$TARGETPLATFORM")) => {}
            _ => {
                return Err(err(format!(
                    "FROM {flag}: unsupported flag (only --platform=linux/amd64)"
                )));
            }
        }
    }
    let (image, name) = match words.as_slice() {
        [image] => (image.clone(), None),
        [image, as_kw, name] if as_kw.eq_ignore_ascii_case("as") => {
            let name = name.to_ascii_lowercase();
            if !valid_stage_name(&name) {
                return Err(err(format!(
                    "stage name {name:?}: letters, digits, '-', '_' and '.', starting with a letter"
                )));
            }
            (image.clone(), Some(name))
        }
        _ => return Err(err("FROM takes IMAGE [AS NAME]".into())),
    };
    Ok(Stage {
        index,
        name,
        base: image,
        line,
        steps: Vec::new(),
    })
}

fn parse_instruction(
    keyword: &str,
    rest: &str,
    escape: char,
    line: usize,
) -> Result<Instruction, ParseError> {
    let err = |problem: String| ParseError { line, problem };
    let need_args = |what: &str| {
        if rest.is_empty() {
            Err(err(format!("{what} needs arguments")))
        } else {
            Ok(())
        }
    };
    Ok(match keyword {
        "RUN" => {
            if rest.starts_with("--") {
                return Err(err(format!(
                    "RUN {}: flags (--mount, --network, --security) are not supported",
                    rest.split_whitespace().next().unwrap_or("")
                )));
            }
            if rest.contains("<<") && !rest.starts_with('[') && heredoc_like(rest) {
                return Err(err(
                    "RUN with a here-document (<<EOF) is not supported".into()
                ));
            }
            need_args("RUN")?;
            Instruction::Run(command(rest))
        }
        "CMD" => {
            need_args("CMD")?;
            Instruction::Cmd(command(rest))
        }
        "ENTRYPOINT" => {
            need_args("ENTRYPOINT")?;
            Instruction::Entrypoint(command(rest))
        }
        "COPY" | "ADD" => Instruction::Copy(parse_copy(keyword, rest, escape, line)?),
        "ENV" | "LABEL" => {
            need_args(keyword)?;
            // Checked now (quotes), expanded while building.
            let words = words::split(rest, escape, None, line)?;
            if keyword == "LABEL" && words.iter().any(|w| !w.contains('=')) {
                return Err(err("LABEL takes KEY=VALUE pairs".into()));
            }
            if keyword == "ENV" && words.len() == 1 && !words[0].contains('=') {
                return Err(err("ENV takes KEY=VALUE pairs (or KEY VALUE)".into()));
            }
            if keyword == "ENV" {
                Instruction::Env(rest.to_string())
            } else {
                Instruction::Label(rest.to_string())
            }
        }
        "ARG" => {
            need_args("ARG")?;
            let mut decls = Vec::new();
            for word in words::split(rest, escape, None, line)? {
                let (name, default) = match word.split_once('=') {
                    Some((n, d)) => (n.to_string(), Some(d.to_string())),
                    None => (word.clone(), None),
                };
                if !valid_var_name(&name) {
                    return Err(err(format!("ARG {name:?}: not a valid variable name")));
                }
                decls.push(ArgDecl { name, default });
            }
            Instruction::Arg(decls)
        }
        "WORKDIR" => {
            need_args("WORKDIR")?;
            Instruction::Workdir(rest.to_string())
        }
        "USER" => {
            need_args("USER")?;
            Instruction::User(rest.to_string())
        }
        "EXPOSE" => {
            need_args("EXPOSE")?;
            Instruction::Expose(rest.to_string())
        }
        "MAINTAINER" | "ONBUILD" | "STOPSIGNAL" | "HEALTHCHECK" | "SHELL" | "VOLUME" => {
            return Err(err(format!(
                "{keyword} is not supported by sandcell template build (supported: FROM, RUN, \
                 COPY, ADD, ENV, ARG, WORKDIR, USER, EXPOSE, ENTRYPOINT, CMD, LABEL)"
            )));
        }
        other => return Err(err(format!("unknown instruction {other:?}"))),
    })
}

/// `<<WORD` or `<<-WORD` as BuildKit's here-documents start.
fn heredoc_like(rest: &str) -> bool {
    rest.split_whitespace().any(|w| {
        w.strip_prefix("<<")
            .map(|t| t.trim_start_matches('-').trim_matches(['"', '\'']))
            .is_some_and(|t| {
                !t.is_empty() && t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            })
    })
}

/// Exec form (a JSON array of strings) or shell form (everything else, as written).
fn command(rest: &str) -> Command {
    if rest.starts_with('[')
        && let Ok(args) = serde_json::from_str::<Vec<String>>(rest)
    {
        return Command::Exec(args);
    }
    Command::Shell(rest.to_string())
}

fn parse_copy(
    keyword: &str,
    rest: &str,
    escape: char,
    line: usize,
) -> Result<CopySpec, ParseError> {
    let err = |problem: String| ParseError { line, problem };
    let mut words = words::split(rest, escape, None, line)?;
    let mut spec = CopySpec {
        add: keyword == "ADD",
        from: None,
        checksum: None,
        chown: None,
        chmod: None,
        args: Vec::new(),
        json: false,
    };
    while let Some(flag) = words.first().filter(|w| w.starts_with("--")).cloned() {
        words.remove(0);
        let (name, value) = flag.split_once('=').unwrap_or((&flag, ""));
        match (name, value.is_empty()) {
            // Kept as written: an image reference's tag may have capitals.
            ("--from", false) if !spec.add => spec.from = Some(value.to_string()),
            ("--checksum", false) if spec.add => {
                crate::digest::Digest::parse(value).map_err(|_| {
                    err(format!(
                        "--checksum={value}: expected sha256:<64 hex digits>"
                    ))
                })?;
                spec.checksum = Some(value.to_string());
            }
            ("--chown", false) => spec.chown = Some(value.to_string()),
            ("--chmod", false) => {
                u32::from_str_radix(value, 8)
                    .ok()
                    .filter(|m| *m <= 0o7777)
                    .ok_or_else(|| err(format!("--chmod={value}: an octal mode")))?;
                spec.chmod = Some(value.to_string());
            }
            _ => {
                return Err(err(format!(
                    "{keyword} {flag}: unsupported flag (supported: --chown, --chmod{})",
                    if spec.add { ", --checksum" } else { ", --from" }
                )));
            }
        }
    }
    // The sources and destination, as words (JSON form for paths with spaces).
    let remaining = rest
        .split_whitespace()
        .skip_while(|w| w.starts_with("--"))
        .collect::<Vec<_>>()
        .join(" ");
    if remaining.starts_with('[')
        && let Ok(args) = serde_json::from_str::<Vec<String>>(&remaining)
    {
        spec.json = true;
        spec.args = args;
    } else {
        // Kept raw: expanded while building.
        spec.args = raw_words(&remaining);
    }
    if spec.args.len() < 2 {
        return Err(err(format!("{keyword} takes SOURCE... DEST")));
    }
    let sources = &spec.args[..spec.args.len() - 1];
    if let Some(url) = sources.iter().find(|s| s.contains("://")) {
        if !spec.add {
            return Err(err(format!(
                "COPY {url}: a URL source is for ADD (COPY reads the context)"
            )));
        }
        if !is_url(url) {
            return Err(err(format!(
                "ADD {url}: only http:// and https:// URLs are supported"
            )));
        }
    }
    if spec.checksum.is_some() && !(sources.len() == 1 && is_url(&sources[0])) {
        return Err(err(
            "ADD --checksum needs exactly one source, an http(s) URL".into(),
        ));
    }
    Ok(spec)
}

/// Words split on unquoted whitespace, quotes kept (the build-time expansion removes them).
fn raw_words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quote: Option<char> = None;
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match quote {
            Some(q) if c == q => quote = None,
            None if c == '\'' || c == '"' => quote = Some(c),
            None if c.is_whitespace() => {
                if !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
                continue;
            }
            _ => {}
        }
        word.push(c);
        if c == '\\'
            && let Some(n) = chars.next()
        {
            word.push(n);
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

pub(crate) fn valid_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}
