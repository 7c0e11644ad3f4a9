//! Running `git` for h5i, host-side, without letting a box's content steer it.
//!
//! Owns how every git process is started: which repository it reads (always a host-controlled
//! git directory: the parent's, or a box's `base.git`), which index and object directory it
//! writes (private scratch for snapshots, so nothing lands in the parent by accident), and the
//! configuration that must hold whatever a box wrote into its tree (`.gitattributes`, a nested
//! repository, a `.git/config` of its own): [`HARDENING`] lists, once, every setting that could
//! make git run a program (hooks, fsmonitor, pager, editors, external diff, merge and lfs
//! drivers, attribute files that select drivers) and [`OFFLINE`] every way it could reach a
//! transport (protocols, upload-pack, ssh, credential helpers, askpass). Also owns finding the
//! store from a directory ([`find_common_dir`]): by path only, so a directory inside a box
//! resolves to the parent that owns the box, never to a repository the box planted.
//!
//! Must never: run with `GIT_DIR` pointing at a repository the box can write (its config could
//! name a program for git to run, or `include` another), or inherit `GIT_*` variables (or
//! `SSH_ASKPASS`) from the caller's environment; read a config, manifest or attribute file
//! from a box-writable tree while discovering the store.
//!
//! Guarded by the unit tests below (a planted setting per knob, proven to run under plain git
//! and not under h5i's) and `tests/hostile_reads.rs` (discovery from inside a workspace).

use std::ffi::OsStr;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A git invocation failed.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    /// git could not be started at all.
    #[error("refusing: could not run git: {0}; to fix: install git (apt-get install -y git) and make sure it is on PATH")]
    Spawn(std::io::Error),
    /// What git was to read could not be written to it (reading the input failed).
    #[error("refusing: could not feed `git {args}` its input: {source}; to fix: check that the disk holding the box's scratch is readable and has space")]
    Input {
        /// The arguments, for the message.
        args: String,
        /// Why writing the input failed.
        source: std::io::Error,
    },
    /// git ran and failed.
    #[error("refusing: `git {args}` failed: {stderr}")]
    Failed {
        /// The arguments, for the message.
        args: String,
        /// git's own first line of complaint.
        stderr: String,
    },
}

/// Configuration forced on every host-side git process. A command-line `-c` wins over every
/// config file git reads, so a setting planted anywhere (a config `include`d from a box's tree,
/// a hostile upstream's attributes) cannot name a program here. Drivers with names of their
/// own (`filter.X`, `diff.X`, `merge.X`) are selected only by attributes, which come from the
/// pinned base (`GIT_ATTR_SOURCE`) and `$GIT_DIR/info/attributes` of a host git dir, never a
/// box's tree or a global attributes file.
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
    // The pager only runs on a terminal; `GIT_PAGER=cat` is set too.
    "-c",
    "core.pager=cat",
    // `:` is git's own "no editor": nothing is launched (VISUAL and EDITOR lose to it).
    "-c",
    "core.editor=:",
    "-c",
    "sequence.editor=:",
    // An empty command is never run; every diff h5i asks for also passes --no-ext-diff.
    "-c",
    "diff.external=",
    // The built-in 3-way merge for paths with no `merge` attribute (a `merge.default` driver
    // would otherwise run on every merged path).
    "-c",
    "merge.default=text",
    // git-lfs installs these in global config: it would run on box bytes.
    "-c",
    "filter.lfs.process=",
    "-c",
    "filter.lfs.clean=",
    "-c",
    "filter.lfs.smudge=",
    "-c",
    "filter.lfs.required=false",
    // A global attributes file could select a driver for a box's paths.
    "-c",
    "core.attributesFile=/dev/null",
];

/// Added to every git process except the one fetch `box create` makes from the remote a person
/// named: git touches no transport, so no upload-pack, ssh command, proxy, credential helper or
/// askpass program can run.
const OFFLINE: &[&str] = &[
    "-c",
    "protocol.allow=never",
    "-c",
    "credential.helper=",
    "-c",
    "core.askPass=",
    "-c",
    "core.sshCommand=false",
];

/// One git command, built up and then run.
pub struct Git {
    cmd: Command,
    args: Vec<String>,
}

impl Git {
    /// git against the host-controlled repository at `git_dir`.
    pub fn at(git_dir: &Path) -> Self {
        let mut g = Git::detached();
        g.cmd.env("GIT_DIR", git_dir);
        g
    }

    /// git with no repository (for `init`).
    pub fn detached() -> Self {
        let mut g = Git::bare_env(OFFLINE);
        // Outside every work tree: run from inside a workspace, git would otherwise limit every
        // listing and diff to the caller's subdirectory of it.
        g.cmd.current_dir("/");
        g
    }

    /// git that may fetch from the remote a person named (`box create --clone/--pr`), at
    /// `git_dir` (or with no repository): [`HARDENING`] holds, [`OFFLINE`] does not, and it
    /// runs in the caller's directory (a remote may be a relative path).
    pub fn fetching(git_dir: Option<&Path>) -> Self {
        let mut g = Git::bare_env(&[]);
        if let Some(d) = git_dir {
            g.cmd.env("GIT_DIR", d);
        }
        g
    }

    fn bare_env(extra: &[&str]) -> Self {
        let mut cmd = Command::new("git");
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("GIT_") || k == "SSH_ASKPASS" {
                cmd.env_remove(k);
            }
        }
        cmd.env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_NO_LAZY_FETCH", "1")
            .env("GIT_PAGER", "cat")
            .env("GIT_OPTIONAL_LOCKS", "0")
            .env("LC_ALL", "C")
            .stdin(Stdio::null());
        cmd.args(HARDENING).args(extra);
        // A git h5i started dies with h5i: killed mid-verb, h5i must not leave git writing
        // into a box directory the next verb reclaims.
        let parent = std::process::id();
        // SAFETY: between fork and exec the closure makes only die_with_parent's two system
        // calls (async-signal-safe, no allocation) and touches no memory of the parent's.
        unsafe {
            cmd.pre_exec(move || h5i_sys::proc::die_with_parent(parent));
        }
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
        h5i_log::spawned(&self.cmd, None);
        let out = self.cmd.output().map_err(GitError::Spawn)?;
        check(&self.args, out, &[])
    }

    /// Run and return stdout as text, trailing newline trimmed.
    pub fn text(self) -> Result<String, GitError> {
        let out = self.output()?;
        Ok(String::from_utf8_lossy(&out).trim_end().to_string())
    }

    /// Run with `input` on stdin and return stdout.
    pub fn output_with_input(self, input: &[u8]) -> Result<Vec<u8>, GitError> {
        // git may stop reading once it has what it needs; what it left unread is not an error.
        self.output_with_writer(|w| match w.write_all(input) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            other => other,
        })
    }

    /// Run with what `write` writes on stdin (streamed: nothing is gathered in memory first) and
    /// return stdout. git's own failure is reported first; a failure of `write` that git did not
    /// notice is reported as [`GitError::Input`].
    pub fn output_with_writer<F>(self, write: F) -> Result<Vec<u8>, GitError>
    where
        F: FnOnce(&mut dyn std::io::Write) -> std::io::Result<()> + Send,
    {
        self.run_with_writer(write, &[])
    }

    /// Run with `input` on stdin and return stdout, for a command whose exit status is part of
    /// its answer: an exit with one of `also_fine` (as `check-ignore`'s 1, "nothing ignored")
    /// is not a failure.
    pub fn answer(self, input: &[u8], also_fine: &[i32]) -> Result<Vec<u8>, GitError> {
        self.run_with_writer(|w| w.write_all(input), also_fine)
    }

    fn run_with_writer<F>(mut self, write: F, also_fine: &[i32]) -> Result<Vec<u8>, GitError>
    where
        F: FnOnce(&mut dyn std::io::Write) -> std::io::Result<()> + Send,
    {
        self.cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = self.cmd.spawn().map_err(GitError::Spawn)?;
        h5i_log::spawned(&self.cmd, Some(child.id()));
        let stdin = child.stdin.take();
        // A writer thread keeps a large input from deadlocking against a full stdout pipe.
        let (out, wrote) = std::thread::scope(|scope| {
            let writer = scope.spawn(move || match stdin {
                Some(mut s) => write(&mut s),
                None => Ok(()),
            });
            let out = child.wait_with_output();
            (out, writer.join())
        });
        let out = check(&self.args, out.map_err(GitError::Spawn)?, also_fine)?;
        match wrote {
            Ok(Ok(())) => Ok(out),
            Ok(Err(source)) => Err(GitError::Input {
                args: self.args.join(" "),
                source,
            }),
            Err(_) => Err(GitError::Input {
                args: self.args.join(" "),
                source: std::io::Error::other("the thread writing git's input panicked"),
            }),
        }
    }

    /// Whether the command succeeds (stdout and stderr discarded).
    pub fn succeeds(mut self) -> Result<bool, GitError> {
        self.cmd.stdout(Stdio::null()).stderr(Stdio::null());
        h5i_log::spawned(&self.cmd, None);
        Ok(self.cmd.status().map_err(GitError::Spawn)?.success())
    }
}

/// git's first non-empty line of complaint, or `otherwise`.
fn first_line(stderr: &[u8], otherwise: &str) -> String {
    let text = String::from_utf8_lossy(stderr);
    text.lines()
        .find(|l| !l.trim().is_empty())
        .map_or_else(|| otherwise.to_string(), |l| l.trim().to_string())
}

fn check(args: &[String], out: Output, also_fine: &[i32]) -> Result<Vec<u8>, GitError> {
    if out.status.success() || out.status.code().is_some_and(|c| also_fine.contains(&c)) {
        return Ok(out.stdout);
    }
    Err(GitError::Failed {
        args: args.join(" "),
        stderr: first_line(&out.stderr, "no message"),
    })
}

/// Why no store was found for a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discovery {
    /// No repository contains the directory.
    NotARepo,
    /// The directory lies under `<owner>/.h5i/env/`, but `owner` is not a git directory h5i can
    /// trust (or not a repository's `.git`, whose work tree is its parent).
    UntrustedOwner {
        /// The directory that would own the store.
        owner: PathBuf,
    },
}

/// Where a repository's work tree and shared git directory are, found without spawning git.
///
/// A directory inside a box store (`<git dir>/.h5i/env/<agent>/<box>/...`: a workspace, a
/// spool, anything a box can write) resolves by its path alone to the git directory that owns
/// the store: the outermost such structure in the canonical path, which no box can forge (every
/// component above it is the host's). Nothing under it is read. Elsewhere, walk up from `start`
/// to the first `.git` (directory, or a gitfile naming one) and follow `commondir`; a result
/// that lands inside a box store resolves to that store's owner the same way.
pub fn find_common_dir(start: &Path) -> Result<(PathBuf, PathBuf), Discovery> {
    let start = std::fs::canonicalize(start).map_err(|_| Discovery::NotARepo)?;
    if let Some(owner) = store_owner(&start) {
        return owned_store(owner);
    }
    let mut dir = Some(start.as_path());
    while let Some(d) = dir {
        let dotgit = d.join(".git");
        if let Ok(meta) = std::fs::symlink_metadata(&dotgit) {
            let git_dir = if meta.is_dir() {
                dotgit
            } else if meta.is_file() {
                let text = std::fs::read_to_string(&dotgit).map_err(|_| Discovery::NotARepo)?;
                let rel = text
                    .strip_prefix("gitdir:")
                    .ok_or(Discovery::NotARepo)?
                    .trim();
                d.join(rel)
            } else {
                return Err(Discovery::NotARepo);
            };
            let common = match std::fs::read_to_string(git_dir.join("commondir")) {
                Ok(c) => git_dir.join(c.trim()),
                Err(_) => git_dir.clone(),
            };
            let common = std::fs::canonicalize(&common).map_err(|_| Discovery::NotARepo)?;
            if let Some(owner) = store_owner(&common) {
                return owned_store(owner);
            }
            return Ok((d.to_path_buf(), common));
        }
        dir = d.parent();
    }
    Err(Discovery::NotARepo)
}

/// The directory that owns the outermost `.h5i/env` in `path`, if there is one: found from the
/// path's components alone.
pub fn store_owner(path: &Path) -> Option<PathBuf> {
    let parts: Vec<std::path::Component<'_>> = path.components().collect();
    parts
        .windows(2)
        .position(|w| {
            w[0].as_os_str() == OsStr::new(".h5i") && w[1].as_os_str() == OsStr::new("env")
        })
        .map(|i| parts[..i].iter().collect())
}

/// `owner` as a store, if it is a repository's own `.git` directory: a real directory (not a
/// symlink) holding `HEAD`, `objects/` and `refs/`, named `.git` so its work tree is its parent.
fn owned_store(owner: PathBuf) -> Result<(PathBuf, PathBuf), Discovery> {
    let is_dir = |p: &Path| {
        std::fs::symlink_metadata(p)
            .map(|m| m.file_type().is_dir())
            .unwrap_or(false)
    };
    let real = owner.file_name() == Some(OsStr::new(".git"))
        && is_dir(&owner)
        && is_dir(&owner.join("objects"))
        && is_dir(&owner.join("refs"))
        && std::fs::symlink_metadata(owner.join("HEAD")).is_ok();
    match owner.parent() {
        Some(root) if real => Ok((root.to_path_buf(), owner.clone())),
        _ => Err(Discovery::UntrustedOwner { owner }),
    }
}

/// Reject a ref or revision argument that git could read as an option.
pub fn plain_rev(rev: &str) -> bool {
    !rev.is_empty() && !rev.starts_with('-') && !rev.chars().any(|c| c.is_control() || c == ' ')
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    /// A repository with a planted config, a program the config names (it records each run in
    /// a marker file), two diverging branches and an edited work tree.
    struct Planted {
        dir: tempfile::TempDir,
    }

    impl Planted {
        fn new(settings: &[(&str, &str)], info_attributes: &str) -> Planted {
            let dir = tempfile::tempdir().unwrap();
            let p = Planted { dir };
            std::fs::write(
                p.script(),
                format!(
                    "#!/bin/sh\necho \"$0 $*\" >> {}\nexit 1\n",
                    p.marker().display()
                ),
            )
            .unwrap();
            std::fs::set_permissions(p.script(), std::fs::Permissions::from_mode(0o755)).unwrap();
            let hooks = p.dir.path().join("hooks");
            std::fs::create_dir(&hooks).unwrap();
            for hook in ["reference-transaction", "pre-commit", "post-checkout"] {
                std::os::unix::fs::symlink(p.script(), hooks.join(hook)).unwrap();
            }
            std::fs::write(p.dir.path().join("attrs"), "g filter=evil\n").unwrap();
            let repo = p.repo();
            std::fs::create_dir(&repo).unwrap();
            let git = |args: &[&str]| {
                let out = std::process::Command::new("git")
                    .args(args)
                    .current_dir(&repo)
                    .env("GIT_CONFIG_NOSYSTEM", "1")
                    .env("HOME", p.dir.path())
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{args:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            };
            git(&["init", "-q", "-b", "main"]);
            git(&["config", "user.name", "t"]);
            git(&["config", "user.email", "t@example.invalid"]);
            std::fs::write(repo.join("f"), "1\n2\n3\n").unwrap();
            git(&["add", "f"]);
            git(&["commit", "-qm", "one"]);
            git(&["branch", "o"]);
            std::fs::write(repo.join("f"), "1\nX\n3\n").unwrap();
            git(&["commit", "-qam", "main"]);
            git(&["checkout", "-q", "o"]);
            std::fs::write(repo.join("f"), "1\nY\n3\n").unwrap();
            git(&["commit", "-qam", "other"]);
            git(&["checkout", "-q", "main"]);
            std::fs::write(repo.join("f"), "edited\n").unwrap();
            std::fs::write(repo.join(".git/info/attributes"), info_attributes).unwrap();
            for (k, v) in settings {
                let v = v
                    .replace("SCRIPT", &p.script().display().to_string())
                    .replace("HOOKS", &hooks.display().to_string())
                    .replace("ATTRS", &p.dir.path().join("attrs").display().to_string())
                    .replace("REPO", &repo.display().to_string());
                git(&["config", k, &v]);
            }
            p
        }

        fn repo(&self) -> PathBuf {
            self.dir.path().join("repo")
        }

        fn script(&self) -> PathBuf {
            self.dir.path().join("run-me")
        }

        fn marker(&self) -> PathBuf {
            self.dir.path().join("MARKER")
        }

        fn args(&self, run: &[&str]) -> Vec<String> {
            run.iter()
                .map(|a| a.replace("SCRIPT", &self.script().display().to_string()))
                .collect()
        }
    }

    /// One row per program-running knob: the setting a box would plant, the attributes it
    /// would add, and a git command that runs the planted program. A row holds only if plain
    /// git runs the program (so the row can fail) and h5i's git does not.
    #[test]
    fn a_planted_program_knob_never_runs_under_h5is_git() {
        let fill: &[u8] = b"protocol=https\nhost=example.test\n\n";
        #[allow(clippy::type_complexity)]
        let rows: &[(&str, &[(&str, &str)], &str, &[&str], &[u8])] = &[
            (
                "core.hooksPath",
                &[("core.hooksPath", "HOOKS")],
                "",
                &["update-ref", "refs/heads/x", "HEAD"],
                b"",
            ),
            (
                "core.fsmonitor",
                &[("core.fsmonitor", "SCRIPT")],
                "",
                &["status", "--porcelain"],
                b"",
            ),
            (
                "core.editor",
                &[("core.editor", "SCRIPT")],
                "",
                &["commit", "--allow-empty"],
                b"",
            ),
            (
                "sequence.editor",
                &[("sequence.editor", "SCRIPT")],
                "",
                &["rebase", "-i", "--autostash", "HEAD~1"],
                b"",
            ),
            (
                "diff.external",
                &[("diff.external", "SCRIPT")],
                "",
                &["diff"],
                b"",
            ),
            (
                "merge.default",
                &[
                    ("merge.default", "evil"),
                    ("merge.evil.driver", "SCRIPT %O %A %B"),
                ],
                "",
                &["merge-tree", "--write-tree", "main", "o"],
                b"",
            ),
            (
                "filter.lfs",
                &[
                    ("filter.lfs.clean", "SCRIPT"),
                    ("filter.lfs.process", "SCRIPT"),
                    ("filter.lfs.required", "true"),
                ],
                "f filter=lfs\n",
                &["hash-object", "--path=f", "f"],
                b"",
            ),
            (
                "core.attributesFile",
                &[
                    ("filter.evil.clean", "SCRIPT"),
                    ("core.attributesFile", "ATTRS"),
                ],
                "",
                &["hash-object", "--path=g", "f"],
                b"",
            ),
            (
                "protocol.ext.allow",
                &[("protocol.ext.allow", "always")],
                "",
                &["ls-remote", "ext::SCRIPT"],
                b"",
            ),
            (
                "protocol.allow (upload-pack)",
                &[("remote.o.url", "REPO"), ("remote.o.uploadpack", "SCRIPT")],
                "",
                &["ls-remote", "o"],
                b"",
            ),
            (
                "core.sshCommand",
                &[("core.sshCommand", "SCRIPT")],
                "",
                &["ls-remote", "ssh://git.example.test/x"],
                b"",
            ),
            (
                "credential.helper",
                &[("credential.helper", "SCRIPT")],
                "",
                &["credential", "fill"],
                fill,
            ),
            (
                "core.askPass",
                &[("core.askPass", "SCRIPT")],
                "",
                &["credential", "fill"],
                fill,
            ),
        ];
        for (knob, settings, attrs, run, input) in rows {
            let plain = Planted::new(settings, attrs);
            let mut child = std::process::Command::new("git")
                .args(plain.args(run))
                .current_dir(plain.repo())
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .env("HOME", plain.dir.path())
                .env("GIT_TERMINAL_PROMPT", "0")
                .env("GIT_EDITOR", "")
                .env_remove("GIT_EDITOR")
                .env_remove("GIT_ASKPASS")
                .env_remove("SSH_ASKPASS")
                .env_remove("GIT_DIR")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            let _ = child.stdin.take().unwrap().write_all(input);
            let _ = child.wait();
            assert!(
                plain.marker().exists(),
                "{knob}: the row proves nothing: plain git did not run the planted program"
            );

            let hard = Planted::new(settings, attrs);
            let _ = Git::at(&hard.repo().join(".git"))
                .work_tree(&hard.repo())
                .current_dir(&hard.repo())
                .env("HOME", hard.dir.path())
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .args(hard.args(run))
                .output_with_input(input);
            assert!(
                !hard.marker().exists(),
                "{knob}: h5i's git ran the planted program: {}",
                std::fs::read_to_string(hard.marker()).unwrap_or_default()
            );
        }
    }

    #[test]
    fn a_directory_inside_a_box_store_resolves_to_its_owner_by_path() {
        let d = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(d.path()).unwrap();
        let git = root.join(".git");
        for sub in ["objects", "refs"] {
            std::fs::create_dir_all(git.join(sub)).unwrap();
        }
        std::fs::write(git.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        // A box's workspace with a forged store of its own, a gitfile and commondir pointing away.
        let ws = git.join(".h5i/env/none/b/workspace");
        let fake = ws.join(".git");
        for sub in ["objects", "refs", ".h5i/env/none/evil"] {
            std::fs::create_dir_all(fake.join(sub)).unwrap();
        }
        std::fs::write(fake.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::write(fake.join("commondir"), "/\n").unwrap();
        let deep = fake.join(".h5i/env/none/evil");
        for cwd in [ws.clone(), deep, root.join(".git/.h5i/env/none/b")] {
            assert_eq!(
                find_common_dir(&cwd),
                Ok((root.clone(), git.clone())),
                "{}",
                cwd.display()
            );
        }
        // The repository itself and its own .git still resolve normally.
        assert_eq!(find_common_dir(&root), Ok((root.clone(), git.clone())));
        // A store whose owner is not a real `.git` is refused, never searched further.
        let odd = root.join("plain/.h5i/env/none/b/workspace");
        std::fs::create_dir_all(odd.join(".git/objects")).unwrap();
        assert_eq!(
            find_common_dir(&odd),
            Err(Discovery::UntrustedOwner {
                owner: root.join("plain")
            })
        );
    }
}
