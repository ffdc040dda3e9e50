//! Which stages a build runs: the last one, and the earlier stages it needs, directly or
//! through a chain: the stage its FROM names and those its `COPY --from` read. The others
//! are skipped (as BuildKit does), so a broken stage nobody uses does not fail the build.
//!
//! A FROM image and a `--from` are resolved with the global ARGs (those before the first
//! FROM, with `--build-arg`), the same way while building.

use crate::Result;
use crate::dockerfile::{Dockerfile, Instruction, words};
use std::collections::BTreeMap;

/// `text` (a FROM image or a `--from` value) with the global ARGs substituted.
pub(crate) fn expand_global(
    file: &Dockerfile,
    global: &BTreeMap<String, String>,
    text: &str,
    line: usize,
) -> Result<String> {
    let lookup = |n: &str| global.get(n).cloned();
    Ok(words::expand_one(text, file.escape, &lookup, line)?)
}

/// One flag per stage: whether the last stage needs it (the last one always does).
pub(crate) fn needed_stages(
    file: &Dockerfile,
    global: &BTreeMap<String, String>,
) -> Result<Vec<bool>> {
    let mut needed = vec![false; file.stages.len()];
    let mut todo: Vec<usize> = file.stages.len().checked_sub(1).into_iter().collect();
    while let Some(index) = todo.pop() {
        if std::mem::replace(&mut needed[index], true) {
            continue;
        }
        let stage = &file.stages[index];
        let copies = stage
            .steps
            .iter()
            .filter_map(|step| match &step.instruction {
                Instruction::Copy(copy) => copy.from.as_deref().map(|from| (from, step.line)),
                _ => None,
            });
        for (reference, line) in std::iter::once((stage.base.as_str(), stage.line)).chain(copies) {
            let expanded = expand_global(file, global, reference, line)?;
            todo.extend(file.earlier_stage(index, &expanded));
        }
    }
    Ok(needed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dockerfile::parse;

    fn needed(text: &str, args: &[(&str, &str)]) -> Vec<bool> {
        let global = args
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        needed_stages(&parse(text).unwrap(), &global).unwrap()
    }

    #[test]
    fn follows_from_and_copy_chains() {
        let text = "FROM minimal AS helper\nRUN true\n\
                    FROM helper AS unused\nRUN false\n\
                    FROM scratch AS files\nCOPY a /a\n\
                    FROM minimal AS tools\nRUN make\n\
                    FROM tools AS build\nCOPY --from=files /a /a\n\
                    FROM minimal\nCOPY --from=build /a /a\nCOPY --from=registry.test/x:1 /b /b\n";
        assert_eq!(
            needed(text, &[]),
            [false, false, true, true, true, true],
            "helper and unused skipped"
        );
        let text = "ARG SRC=one\nFROM minimal AS one\nFROM minimal AS two\n\
                    FROM minimal\nCOPY --from=$SRC /a /a\n";
        // The global values as the builder has them: defaults, then --build-arg.
        assert_eq!(needed(text, &[("SRC", "one")]), [true, false, true]);
        assert_eq!(needed(text, &[("SRC", "two")]), [false, true, true]);
        assert_eq!(
            needed("FROM minimal AS a\nFROM a\nFROM a\n", &[]),
            [true, false, true],
            "the middle stage, FROM a too, is not the last"
        );
    }
}
