//! sudo's command line, as sudo 1.9 reads it: options up to the first operand or `--`
//! (short ones may be bundled, `-uNAME` and `-u NAME` both work), then `VAR=value`
//! operands, then the command.

use super::{Mode, Preserve};

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Run(Parsed),
    /// `-V`.
    Version,
    /// `-h`.
    Help,
    /// `-l`: what the caller may run.
    List,
    /// `-v`, `-k`, `-K` without a command: nothing to validate or forget (no password).
    Nothing,
}

/// A command to run, before the client adds its environment and directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub user: Option<String>,
    pub group: Option<String>,
    pub mode: Mode,
    pub preserve: Preserve,
    pub chdir: Option<String>,
    pub set_env: Vec<(String, String)>,
    pub command: Vec<String>,
}

pub const USAGE: &str = "usage: sudo -h | -K | -k | -V\n\
usage: sudo -v [-AknS] [-g group] [-u user]\n\
usage: sudo -l [-AknS] [-g group] [-U user] [-u user] [command]\n\
usage: sudo [-AbEHknPS] [-D directory] [-g group] [-u user] [VAR=value] [-i|-s] [command [arg ...]]";

/// Options that take a value, short and long.
fn takes_value(short: char) -> bool {
    matches!(
        short,
        'u' | 'g' | 'D' | 'C' | 'p' | 'U' | 'h' | 'r' | 't' | 'T' | 'R'
    )
}

fn long_to_short(long: &str) -> Option<char> {
    Some(match long {
        "user" => 'u',
        "group" => 'g',
        "chdir" => 'D',
        "close-from" => 'C',
        "prompt" => 'p',
        "other-user" => 'U',
        "login" => 'i',
        "shell" => 's',
        "preserve-env" => 'E',
        "set-home" => 'H',
        "non-interactive" => 'n',
        "stdin" => 'S',
        "askpass" => 'A',
        "background" => 'b',
        "preserve-groups" => 'P',
        "reset-timestamp" => 'k',
        "remove-timestamp" => 'K',
        "validate" => 'v',
        "version" => 'V',
        "list" => 'l',
        "help" => 'h',
        _ => return None,
    })
}

/// Parses the arguments after `sudo`.
pub fn parse(args: &[String]) -> Result<Action, String> {
    let mut p = Parsed {
        user: None,
        group: None,
        mode: Mode::Command,
        preserve: Preserve::Default,
        chdir: None,
        set_env: Vec::new(),
        command: Vec::new(),
    };
    let (mut version, mut help, mut list, mut nothing) = (false, false, false, false);
    let mut i = 0;
    // Each option as (letter, value if it takes one).
    let mut opts: Vec<(char, Option<String>)> = Vec::new();
    while i < args.len() {
        let arg = &args[i];
        if arg == "--" {
            i += 1;
            break;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_owned())),
                None => (long, None),
            };
            let short = long_to_short(name)
                .ok_or_else(|| format!("unrecognized option '--{name}'\n{USAGE}"))?;
            if name == "preserve-env" {
                // Only `--preserve-env=LIST` takes a value; plain `--preserve-env` is `-E`.
                opts.push(('E', inline));
            } else if name == "help" {
                opts.push(('h', None));
            } else if takes_value(short) {
                let value = match inline {
                    Some(v) => v,
                    None => {
                        i += 1;
                        args.get(i).cloned().ok_or_else(|| {
                            format!("option '--{name}' requires an argument\n{USAGE}")
                        })?
                    }
                };
                opts.push((short, Some(value)));
            } else {
                opts.push((short, None));
            }
            i += 1;
            continue;
        }
        let Some(shorts) = arg.strip_prefix('-').filter(|s| !s.is_empty()) else {
            break; // the first operand
        };
        for (at, c) in shorts.char_indices() {
            // -h alone is help; -h HOST (a remote host) is not for a sandbox.
            if takes_value(c) && c != 'h' {
                let rest = &shorts[at + c.len_utf8()..];
                let value = if rest.is_empty() {
                    i += 1;
                    args.get(i)
                        .cloned()
                        .ok_or_else(|| format!("option requires an argument -- '{c}'\n{USAGE}"))?
                } else {
                    rest.to_owned()
                };
                opts.push((c, Some(value)));
                break;
            }
            opts.push((c, None));
        }
        i += 1;
    }
    for (c, value) in opts {
        match (c, value) {
            ('u', v) => p.user = v,
            ('g', v) => p.group = v,
            ('D', v) => p.chdir = v,
            ('i', _) => p.mode = Mode::Login,
            ('s', _) => p.mode = Mode::Shell,
            ('E', None) => p.preserve = Preserve::All,
            ('E', Some(list)) => {
                let mut names = match std::mem::replace(&mut p.preserve, Preserve::Default) {
                    Preserve::Names(n) => n,
                    _ => Vec::new(),
                };
                names.extend(list.split(',').filter(|n| !n.is_empty()).map(str::to_owned));
                p.preserve = Preserve::Names(names);
            }
            ('V', _) => version = true,
            ('h', _) => help = true,
            ('l', _) => list = true,
            ('v' | 'k' | 'K', _) => nothing = true,
            // No password is ever asked (-n, -S, -A, -p), HOME is always the target's (-H),
            // descriptors are the caller's own three (-C); -P keeps nothing here either.
            ('n' | 'S' | 'A' | 'p' | 'H' | 'C' | 'P', _) => {}
            ('b', _) => return Err("option -b (background) is not supported here".to_owned()),
            ('U' | 'r' | 't' | 'T' | 'R', _) => {
                return Err(format!("option -{c} is not supported here\n{USAGE}"));
            }
            (other, _) => return Err(format!("invalid option -- '{other}'\n{USAGE}")),
        }
    }
    let mut rest = args[i.min(args.len())..].iter();
    for arg in rest.by_ref() {
        match arg.split_once('=') {
            Some((name, value)) if is_env_name(name) && p.command.is_empty() => {
                p.set_env.push((name.to_owned(), value.to_owned()));
            }
            _ => {
                p.command.push(arg.clone());
                break;
            }
        }
    }
    p.command.extend(rest.cloned());
    if help {
        return Ok(Action::Help);
    }
    if version {
        return Ok(Action::Version);
    }
    if list {
        return Ok(Action::List);
    }
    if p.command.is_empty() && p.mode == Mode::Command {
        if nothing {
            return Ok(Action::Nothing);
        }
        return Err(USAGE.to_owned());
    }
    Ok(Action::Run(p))
}

fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Parsed {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        match parse(&args) {
            Ok(Action::Run(p)) => p,
            other => panic!("{args:?}: {other:?}"),
        }
    }

    #[test]
    fn a_plain_command_keeps_its_own_options() {
        let p = run(&["ls", "-la", "/root"]);
        assert_eq!(p.command, ["ls", "-la", "/root"]);
        assert_eq!(
            (p.mode, p.user, p.preserve),
            (Mode::Command, None, Preserve::Default)
        );
    }

    #[test]
    fn users_groups_and_bundles() {
        let p = run(&["-u", "user", "id"]);
        assert_eq!(p.user.as_deref(), Some("user"));
        let p = run(&["-uuser", "-g#27", "id", "-u"]);
        assert_eq!(
            (p.user.as_deref(), p.group.as_deref()),
            (Some("user"), Some("#27"))
        );
        assert_eq!(p.command, ["id", "-u"]);
        let p = run(&["-nEiu", "user"]);
        assert_eq!((p.mode, p.preserve.clone()), (Mode::Login, Preserve::All));
        assert_eq!(p.user.as_deref(), Some("user"));
        assert!(p.command.is_empty());
        let p = run(&["--user=user", "--login", "--", "echo", "-n"]);
        assert_eq!(
            (p.mode, p.command),
            (Mode::Login, vec!["echo".to_owned(), "-n".to_owned()])
        );
    }

    #[test]
    fn env_operands_and_preserve_lists() {
        let p = run(&["FOO=bar", "X_1=", "sh", "-c", "A=b"]);
        assert_eq!(
            p.set_env,
            [("FOO".into(), "bar".into()), ("X_1".into(), String::new())]
        );
        assert_eq!(p.command, ["sh", "-c", "A=b"]);
        let p = run(&["--preserve-env=A,B", "--preserve-env=C", "env"]);
        assert_eq!(
            p.preserve,
            Preserve::Names(vec!["A".into(), "B".into(), "C".into()])
        );
        let p = run(&["-D", "/tmp", "pwd"]);
        assert_eq!(p.chdir.as_deref(), Some("/tmp"));
    }

    #[test]
    fn the_other_actions_and_errors() {
        let parse = |a: &[&str]| parse(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(parse(&["-V"]), Ok(Action::Version));
        assert_eq!(parse(&["-h"]), Ok(Action::Help));
        assert_eq!(parse(&["-l"]), Ok(Action::List));
        assert_eq!(parse(&["-v"]), Ok(Action::Nothing));
        assert_eq!(parse(&["-k"]), Ok(Action::Nothing));
        assert!(parse(&[]).is_err());
        assert!(parse(&["-u"]).is_err());
        assert!(parse(&["-Z", "id"]).is_err());
        assert!(parse(&["--bogus", "id"]).is_err());
        assert!(parse(&["-b", "id"]).is_err());
        // -k with a command runs it.
        assert!(matches!(parse(&["-k", "id"]), Ok(Action::Run(_))));
    }
}
