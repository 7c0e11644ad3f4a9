//! Running `git` for h5i, host-side, without letting a box's content steer it.
//!
//! Owns how every git process is started: which repository it reads (always a host-controlled
//! git directory: the parent's, or a box's `base.git`), which index and object directory it
//! writes (private scratch for snapshots, so nothing lands in the parent by accident), and the
//! configuration that must hold whatever a box wrote into its tree (`.gitattributes`, a nested
//! repository): no hooks, no fsmonitor, no prompts, no pager.
//!
//! Must never: run with `GIT_DIR` pointing at a repository the box can write (its config could
//! name a program for git to run), or inherit `GIT_*` variables from the caller's environment.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A git invocation failed.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    /// git could not be started at all.
    #[error("refusing: could not run git: {0}; to fix: install git (apt-get install -y git) and make sure it is on PATH")]
    Spawn(std::io::Error),
    /// git ran and failed.
    #[error("refusing: `git {args}` failed: {stderr}")]
    Failed {
        /// The arguments, for the message.
        args: String,
        /// git's own first line of complaint.
        stderr: String,
    },
}

/// Configuration forced on every host-side git process that looks at a box's files.
const HARDENING: &[&str] = &[
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.untrackedCache=false",
    "-c",
    "protocol.ext.allow=never",
    "-c",
    "gc.auto=0",
];

/// One git command, built up and then run.
pub struct Git {
    cmd: Command,
    args: Vec<String>,
}

impl Git {
    /// git against the host-controlled repository at `git_dir`.
    pub fn at(git_dir: &Path) -> Self {
        let mut g = Git::bare_env();
        g.cmd.env("GIT_DIR", git_dir);
        g
    }

    /// git with no repository (for `init`, `clone`).
    pub fn detached() -> Self {
        Git::bare_env()
    }

    fn bare_env() -> Self {
        let mut cmd = Command::new("git");
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("GIT_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_PAGER", "cat")
            .env("GIT_OPTIONAL_LOCKS", "0")
            .env("LC_ALL", "C")
            .stdin(Stdio::null());
        cmd.args(HARDENING);
        Git {
            cmd,
            args: Vec::new(),
        }
    }

    /// Look at the files under `tree` as the work tree. A root caller's workspace is owned by
    /// the box range (`identity`), so git's ownership check (`safe.directory`) is told about
    /// this one tree by name (command-line scope, which git honours for it), never `*`.
    pub fn work_tree(mut self, tree: &Path) -> Self {
        self.cmd
            .env("GIT_WORK_TREE", tree)
            .env("GIT_CONFIG_COUNT", "1")
            .env("GIT_CONFIG_KEY_0", "safe.directory")
            .env("GIT_CONFIG_VALUE_0", tree);
        self
    }

    /// Read and write this index file instead of the repository's.
    pub fn index(mut self, index: &Path) -> Self {
        self.cmd.env("GIT_INDEX_FILE", index);
        self
    }

    /// Write new objects here; the repository's own objects stay readable as an alternate.
    pub fn objects_into(mut self, objects: &Path, alternate: &Path) -> Self {
        self.cmd
            .env("GIT_OBJECT_DIRECTORY", objects)
            .env("GIT_ALTERNATE_OBJECT_DIRECTORIES", alternate);
        self
    }

    /// Run in `dir`.
    pub fn current_dir(mut self, dir: &Path) -> Self {
        self.cmd.current_dir(dir);
        self
    }

    /// Set one environment variable for this git.
    pub fn env(mut self, k: &str, v: impl AsRef<OsStr>) -> Self {
        self.cmd.env(k, v);
        self
    }

    /// Append arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        for a in args {
            self.args.push(a.as_ref().to_string_lossy().into_owned());
            self.cmd.arg(a);
        }
        self
    }

    /// Run and return stdout; a non-zero exit is an error carrying git's stderr.
    pub fn output(mut self) -> Result<Vec<u8>, GitError> {
        self.cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let out = self.cmd.output().map_err(GitError::Spawn)?;
        check(&self.args, out)
    }

    /// Run and return stdout as text, trailing newline trimmed.
    pub fn text(self) -> Result<String, GitError> {
        let out = self.output()?;
        Ok(String::from_utf8_lossy(&out).trim_end().to_string())
    }

    /// Run with `input` on stdin and return stdout.
    pub fn output_with_input(mut self, input: &[u8]) -> Result<Vec<u8>, GitError> {
        use std::io::Write;
        self.cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = self.cmd.spawn().map_err(GitError::Spawn)?;
        let mut stdin = child.stdin.take();
        let input = input.to_vec();
        // A writer thread keeps a large input from deadlocking against a full stdout pipe.
        let writer = std::thread::spawn(move || {
            if let Some(s) = stdin.as_mut() {
                let _ = s.write_all(&input);
            }
        });
        let out = child.wait_with_output().map_err(GitError::Spawn)?;
        let _ = writer.join();
        check(&self.args, out)
    }

    /// Whether the command succeeds (stdout and stderr discarded).
    pub fn succeeds(mut self) -> Result<bool, GitError> {
        self.cmd.stdout(Stdio::null()).stderr(Stdio::null());
        Ok(self.cmd.status().map_err(GitError::Spawn)?.success())
    }
}

fn check(args: &[String], out: Output) -> Result<Vec<u8>, GitError> {
    if out.status.success() {
        return Ok(out.stdout);
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let first = stderr
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no message")
        .trim()
        .to_string();
    Err(GitError::Failed {
        args: args.join(" "),
        stderr: first,
    })
}

/// Where a repository's shared git directory is, found without spawning git: walk up from
/// `start` to the first `.git` (directory, or a gitfile naming one), then follow `commondir`.
pub fn find_common_dir(start: &Path) -> Option<(PathBuf, PathBuf)> {
    let mut dir = Some(start);
    while let Some(d) = dir {
        let dotgit = d.join(".git");
        if let Ok(meta) = std::fs::symlink_metadata(&dotgit) {
            let git_dir = if meta.is_dir() {
                dotgit
            } else if meta.is_file() {
                let text = std::fs::read_to_string(&dotgit).ok()?;
                let rel = text.strip_prefix("gitdir:")?.trim();
                d.join(rel)
            } else {
                return None;
            };
            let common = match std::fs::read_to_string(git_dir.join("commondir")) {
                Ok(c) => git_dir.join(c.trim()),
                Err(_) => git_dir.clone(),
            };
            let common = std::fs::canonicalize(&common).ok()?;
            return Some((d.to_path_buf(), common));
        }
        dir = d.parent();
    }
    None
}

/// Reject a ref or revision argument that git could read as an option.
pub fn plain_rev(rev: &str) -> bool {
    !rev.is_empty() && !rev.starts_with('-') && !rev.chars().any(|c| c.is_control() || c == ' ')
}
