//! `h5i box WORD`: a mistyped verb is a usage error naming the nearest verb, and a bare word is
//! never a repository to clone (issue 14: `h5i box lss` tried to clone `./lss`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{git, stderr, Repo};

/// No box was made and nothing was cloned: the store has no box directory.
fn no_box_made(r: &Repo) {
    let boxes = r.h5i(&["box", "ls"]);
    assert!(
        common::stdout(&boxes).contains("no boxes"),
        "{}",
        common::stdout(&boxes)
    );
}

/// A repository at `dir` with one empty commit.
fn repo_with_one_commit(dir: &std::path::Path) {
    git(dir, &["init", "-q", "-b", "main"]);
    git(
        dir,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.invalid",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "x",
        ],
    );
}

#[test]
fn a_mistyped_verb_is_a_usage_error_naming_the_nearest_verb() {
    let r = Repo::new();
    let out = r.h5i(&["box", "lss"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("unrecognized subcommand 'lss'"), "{err}");
    assert!(err.contains("'ls'"), "{err}");
    no_box_made(&r);
}

#[test]
fn an_unknown_verb_with_an_argument_names_the_verb_not_the_argument() {
    let r = Repo::new();
    let out = r.h5i(&["box", "peek", "x"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("unrecognized subcommand 'peek'"),
        "{}",
        stderr(&out)
    );
    no_box_made(&r);
}

#[test]
fn a_bare_word_naming_a_repository_beside_it_is_never_cloned() {
    let r = Repo::new();
    // A real repository at ./other: a bare `other` must still not be taken as its path.
    let other = r.path().join("other");
    std::fs::create_dir(&other).unwrap();
    repo_with_one_commit(&other);
    let out = r.h5i(&["box", "other"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("./DIR"), "{}", stderr(&out));
    no_box_made(&r);
    // Written as a path, the same repository is a source.
    let out = r.h5i(&["box", "./other", "--isolation=workspace"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn a_tilde_path_is_a_source_under_home() {
    let r = Repo::new();
    let home = tempfile::tempdir().unwrap();
    let src = home.path().join("src");
    std::fs::create_dir(&src).unwrap();
    repo_with_one_commit(&src);
    let out = r.h5i_env(
        &["box", "~/src", "--isolation=workspace"],
        &[("HOME", home.path().to_str().unwrap())],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn two_sources_are_refused() {
    let r = Repo::new();
    let out = r.h5i(&["box", ".", "./x"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("one SOURCE"), "{}", stderr(&out));
    no_box_made(&r);
}
