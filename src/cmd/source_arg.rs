//! The positional SOURCE of `h5i box [SOURCE]`, parsed before anything runs.
//!
//! Owns the rule that a SOURCE is `.`, a URL (`scheme://...` or `user@host:path`) or an explicit
//! path (`./x`, `../x`, `/x`, `~/x`): a bare word is never a repository to clone, so `h5i box
//! lss` is a usage error naming the nearest verb (`ls`) instead of a clone of `./lss`.
//! Must never: accept a word that could be a mistyped verb as a source.
//! Guarded by the unit tests below and `tests/box_cli.rs`.

use clap::builder::TypedValueParser;
use clap::error::{ContextKind, ContextValue, ErrorKind};

/// Parses SOURCE; a bare word becomes clap's "unrecognized subcommand" with the nearest verbs.
#[derive(Debug, Clone, Copy)]
pub struct SourceParser;

impl TypedValueParser for SourceParser {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<String, clap::Error> {
        let text = value.to_string_lossy();
        if let Some(source) = explicit_source(&text, std::env::var_os("HOME").as_deref()) {
            return Ok(source);
        }
        let verbs: Vec<String> = cmd
            .get_subcommands()
            .flat_map(|c| std::iter::once(c.get_name()).chain(c.get_all_aliases()))
            .map(str::to_string)
            .collect();
        let mut err = clap::Error::new(ErrorKind::InvalidSubcommand).with_cmd(cmd);
        err.insert(
            ContextKind::InvalidSubcommand,
            ContextValue::String(text.into_owned()),
        );
        let near = nearest(&value.to_string_lossy(), verbs.iter().map(String::as_str));
        if !near.is_empty() {
            err.insert(
                ContextKind::SuggestedSubcommand,
                ContextValue::Strings(near),
            );
        }
        err.insert(
            ContextKind::Suggested,
            ContextValue::StyledStrs(vec![
                "a SOURCE is `.`, a URL, or a path written as one (`./DIR`, `/DIR`, `~/DIR`)"
                    .into(),
            ]),
        );
        Err(err)
    }
}

/// `text` as a SOURCE (a `~/` path expanded against `home`), or `None` for a bare word.
pub fn explicit_source(text: &str, home: Option<&std::ffi::OsStr>) -> Option<String> {
    if text == "." || text == ".." || text.starts_with("./") || text.starts_with("../") {
        return Some(text.to_string());
    }
    if text.starts_with('/') || is_url(text) {
        return Some(text.to_string());
    }
    if let Some(rest) = text.strip_prefix("~/") {
        let home = home.filter(|h| !h.is_empty())?;
        let mut p = std::path::PathBuf::from(home);
        p.push(rest);
        return Some(p.to_string_lossy().into_owned());
    }
    None
}

/// `scheme://...` or git's scp-like `user@host:path`.
fn is_url(text: &str) -> bool {
    if let Some((scheme, rest)) = text.split_once("://") {
        return !scheme.is_empty()
            && !rest.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    }
    match text.split_once(':') {
        Some((host, path)) => {
            !path.is_empty()
                && !host.contains('/')
                && host
                    .split_once('@')
                    .is_some_and(|(user, h)| !user.is_empty() && !h.is_empty())
        }
        None => false,
    }
}

/// The candidates closest to `word` (edit distance at most a third of its length, at least 1),
/// best first.
pub fn nearest<'a>(word: &str, candidates: impl Iterator<Item = &'a str>) -> Vec<String> {
    let limit = (word.chars().count() / 3).max(1);
    let mut scored: Vec<(usize, &str)> = candidates
        .map(|c| (edit_distance(word, c), c))
        .filter(|(d, c)| *d <= limit || c.starts_with(word) && word.len() >= 2)
        .collect();
    scored.sort();
    scored.dedup_by(|a, b| a.1 == b.1);
    scored.into_iter().map(|(_, c)| c.to_string()).collect()
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let up = row[j + 1];
            row[j + 1] = (diag + usize::from(ca != *cb)).min(up + 1).min(row[j] + 1);
            diag = up;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_words_are_never_sources() {
        for word in ["lss", "view", "x", "mybox", "repo.git", "a:b"] {
            assert_eq!(
                explicit_source(word, Some("/home/u".as_ref())),
                None,
                "{word}"
            );
        }
    }

    #[test]
    fn dot_urls_and_explicit_paths_are_sources() {
        let home = Some("/home/u".as_ref());
        for s in [
            ".",
            "..",
            "./x",
            "../x",
            "/srv/repo",
            "https://example.com/r.git",
            "file:///srv/r",
            "git@example.com:o/r.git",
        ] {
            assert_eq!(explicit_source(s, home).as_deref(), Some(s), "{s}");
        }
        assert_eq!(
            explicit_source("~/src/r", home).as_deref(),
            Some("/home/u/src/r")
        );
        assert_eq!(explicit_source("~/src/r", None), None);
    }

    #[test]
    fn the_nearest_verb_is_suggested() {
        let verbs = ["ls", "status", "run", "shell", "rm", "gc", "probe"];
        assert_eq!(nearest("lss", verbs.into_iter())[0], "ls");
        assert_eq!(nearest("stats", verbs.into_iter())[0], "status");
        assert!(nearest("zzzzzz", verbs.into_iter()).is_empty());
    }
}
