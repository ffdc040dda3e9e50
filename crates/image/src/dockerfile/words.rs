//! Dockerfile words: quotes, escapes and variable substitution as Docker's shell lexer does
//! them for the instructions it expands (FROM, COPY, ADD, ENV, ARG, LABEL, EXPOSE, USER,
//! WORKDIR). RUN, CMD and ENTRYPOINT are never expanded here: their shell does it.
//!
//! - `'...'`: literal. `"..."`: substitution and escapes (`\"`, `\\`, `\$`) inside.
//! - The escape character (`\`, or what `# escape=` chose) makes the next character literal.
//! - `$NAME`, `${NAME}`, `${NAME:-word}` (unset or empty: word), `${NAME-word}` (unset: word),
//!   `${NAME:+word}` (set and not empty: word), `${NAME+word}` (set: word). An unset
//!   variable is empty.

use super::ParseError;

/// A variable lookup: `None` when unset.
pub type Lookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Splits `s` into words (unquoted whitespace separates them), substituting variables when
/// `vars` is given (else `$...` stays as written: parse-time checks only).
pub fn split(
    s: &str,
    escape: char,
    vars: Option<Lookup<'_>>,
    line: usize,
) -> Result<Vec<String>, ParseError> {
    Lexer {
        chars: s.chars().collect(),
        pos: 0,
        escape,
        vars,
        line,
    }
    .words(true)
}

/// `s` as one word (whitespace kept), quotes removed and variables substituted.
pub fn expand_one(
    s: &str,
    escape: char,
    vars: Lookup<'_>,
    line: usize,
) -> Result<String, ParseError> {
    let words = Lexer {
        chars: s.chars().collect(),
        pos: 0,
        escape,
        vars: Some(vars),
        line,
    }
    .words(false)?;
    Ok(words.concat())
}

struct Lexer<'a> {
    chars: Vec<char>,
    pos: usize,
    escape: char,
    vars: Option<Lookup<'a>>,
    line: usize,
}

impl Lexer<'_> {
    fn err(&self, problem: impl Into<String>) -> ParseError {
        ParseError {
            line: self.line,
            problem: problem.into(),
        }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn words(&mut self, split_on_space: bool) -> Result<Vec<String>, ParseError> {
        let mut words = Vec::new();
        let mut word = String::new();
        let mut in_word = false;
        while let Some(c) = self.peek() {
            self.pos += 1;
            if split_on_space && c.is_whitespace() {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
                continue;
            }
            in_word = true;
            if c == self.escape {
                match self.peek() {
                    Some(next) => {
                        word.push(next);
                        self.pos += 1;
                    }
                    None => word.push(c),
                }
            } else if c == '\'' {
                loop {
                    match self.peek() {
                        Some('\'') => {
                            self.pos += 1;
                            break;
                        }
                        Some(ch) => {
                            word.push(ch);
                            self.pos += 1;
                        }
                        None => return Err(self.err("unterminated single quote")),
                    }
                }
            } else if c == '"' {
                loop {
                    match self.peek() {
                        Some('"') => {
                            self.pos += 1;
                            break;
                        }
                        Some(ch) if ch == self.escape => {
                            self.pos += 1;
                            match self.peek() {
                                Some(n @ ('"' | '$')) => {
                                    word.push(n);
                                    self.pos += 1;
                                }
                                Some(n) if n == self.escape => {
                                    word.push(n);
                                    self.pos += 1;
                                }
                                _ => word.push(ch),
                            }
                        }
                        Some('$') => {
                            self.pos += 1;
                            let v = self.dollar()?;
                            word.push_str(&v);
                        }
                        Some(ch) => {
                            word.push(ch);
                            self.pos += 1;
                        }
                        None => return Err(self.err("unterminated double quote")),
                    }
                }
            } else if c == '$' {
                let v = self.dollar()?;
                word.push_str(&v);
            } else {
                word.push(c);
            }
        }
        if in_word {
            words.push(word);
        }
        Ok(words)
    }

    /// After a `$`: the substitution (or, without `vars`, the text as written).
    fn dollar(&mut self) -> Result<String, ParseError> {
        let start = self.pos - 1;
        let value = match self.peek() {
            Some('{') => {
                self.pos += 1;
                let name = self.name();
                if name.is_empty() {
                    return Err(self.err("bad substitution: ${ without a variable name"));
                }
                let mut colon = false;
                if self.peek() == Some(':') {
                    colon = true;
                    self.pos += 1;
                }
                let op = match self.peek() {
                    Some('}') if !colon => {
                        self.pos += 1;
                        return Ok(self.lookup_or_raw(&name, start).unwrap_or_default());
                    }
                    Some(op @ ('-' | '+')) => {
                        self.pos += 1;
                        op
                    }
                    other => {
                        return Err(self.err(format!(
                            "unsupported substitution modifier {:?} in ${{{name}...}} (supported: :- - :+ +)",
                            other.map_or(String::new(), |c| format!("{}{c}", if colon { ":" } else { "" }))
                        )));
                    }
                };
                let word = self.until_brace()?;
                let Some(vars) = self.vars else {
                    return Ok(self.raw(start));
                };
                let current = vars(&name);
                let set = current.is_some();
                let nonempty = current.as_deref().is_some_and(|v| !v.is_empty());
                let word = Lexer {
                    chars: word.chars().collect(),
                    pos: 0,
                    escape: self.escape,
                    vars: self.vars,
                    line: self.line,
                }
                .words(false)?
                .concat();
                match (op, colon) {
                    ('-', true) if !nonempty => word,
                    ('-', false) if !set => word,
                    ('+', true) if nonempty => word,
                    ('+', false) if set => word,
                    ('+', _) => String::new(),
                    _ => current.unwrap_or_default(),
                }
            }
            Some(c) if c.is_ascii_alphabetic() || c == '_' => {
                let name = self.name();
                self.lookup_or_raw(&name, start).unwrap_or_default()
            }
            // A lone `$` is literal.
            _ => "$".into(),
        };
        Ok(value)
    }

    fn lookup_or_raw(&self, name: &str, start: usize) -> Option<String> {
        match self.vars {
            Some(vars) => vars(name),
            None => Some(self.raw(start)),
        }
    }

    fn raw(&self, start: usize) -> String {
        self.chars[start..self.pos].iter().collect()
    }

    fn name(&mut self) -> String {
        let mut name = String::new();
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || c == '_' {
                name.push(c);
                self.pos += 1;
            } else {
                break;
            }
        }
        name
    }

    /// The word of `${NAME:-word}` up to its closing brace (nested braces counted).
    fn until_brace(&mut self) -> Result<String, ParseError> {
        let mut depth = 0;
        let mut out = String::new();
        while let Some(c) = self.peek() {
            self.pos += 1;
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => return Ok(out),
                '}' => depth -= 1,
                _ => {}
            }
            out.push(c);
        }
        Err(self.err("unterminated ${...}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(name: &str) -> Option<String> {
        match name {
            "A" => Some("alpha".into()),
            "E" => Some(String::new()),
            "SP" => Some("two words".into()),
            _ => None,
        }
    }

    fn s(input: &str) -> Vec<String> {
        split(input, '\\', Some(&vars), 1).unwrap()
    }

    #[test]
    fn splits_and_quotes() {
        assert_eq!(s("a  b\tc"), ["a", "b", "c"]);
        assert_eq!(s(r#"'x $A' "y $A" z\ w"#), ["x $A", "y alpha", "z w"]);
        assert_eq!(s(r#""a\"b" 'c\d'"#), [r#"a"b"#, r"c\d"]);
        assert_eq!(s(r"\$A $A"), ["$A", "alpha"]);
        assert_eq!(s(r#"k="v w" j=1"#), ["k=v w", "j=1"]);
        assert!(split("'open", '\\', None, 3).unwrap_err().line == 3);
        assert!(split("\"open", '\\', None, 1).is_err());
    }

    #[test]
    fn substitutes() {
        assert_eq!(s("$A/${A}x"), ["alpha/alphax"]);
        assert_eq!(
            s("${NO:-def} ${E:-d2} ${E-d3}x ${NO-d4}"),
            ["def", "d2", "x", "d4"]
        );
        assert_eq!(
            s("${A:+yes} ${NO:+yes}x ${E:+y}z ${E+set}"),
            ["yes", "x", "z", "set"]
        );
        assert_eq!(s("${NO:-${A}}"), ["alpha"]);
        assert_eq!(s("$NO-x $ $1"), ["-x", "$", "$1"]);
        // A substituted value is not split again.
        assert_eq!(s("$SP"), ["two words"]);
        assert!(split("${A?x}", '\\', Some(&vars), 1).is_err());
        assert!(split("${A", '\\', Some(&vars), 1).is_err());
    }

    #[test]
    fn without_vars_keeps_text_and_other_escape() {
        assert_eq!(
            split("$A ${B:-c} x", '\\', None, 1).unwrap(),
            ["$A", "${B:-c}", "x"]
        );
        assert_eq!(split("a` b", '`', None, 1).unwrap(), ["a b"]);
        assert_eq!(
            expand_one("  x  $A ", '\\', &vars, 1).unwrap(),
            "  x  alpha "
        );
    }
}
