//! Per-box HOME seeding: the host agent's config directory (`~/.claude` for Claude Code,
//! `~/.codex` for Codex) copied once into a box-private HOME, with credential-shaped entries
//! stripped at any depth.
//!
//! Owns [`seed`] and its two reviewed tables: [`CREDENTIAL_SHAPES`] (names that are credentials
//! wherever they appear) and [`SESSION_STATE`] (a runtime's records of other sessions, which
//! are other projects' prompts and transcripts). Must never: write to the source (the copy is
//! one-way and never written back), follow a symlink (the source root is resolved once, as the
//! user's own choice of directory; nothing below it is followed), copy into a destination that
//! already has content, or copy a device, FIFO or socket.
//!
//! Decisions, stated once:
//! - Stripped at any depth, by name, case-insensitively, whatever the entry's type (a directory
//!   named `.ssh` goes whole): every entry of [`CREDENTIAL_SHAPES`].
//! - The runtime's own token file is the one file the manual says is kept, and only at the top
//!   of its config directory: Claude Code's `.credentials.json`, Codex's `auth.json`
//!   ([`runtime_token_file`]). It is kept only with [`TokenPolicy::KeepRuntimeToken`], which is
//!   for a box whose credential proxy is off (`H5I_CREDENTIAL_PROXY=0`). With the proxy on (the
//!   default) the runtime works from the per-run dummy in its environment and needs no token
//!   file, so [`TokenPolicy::Strip`] strips it too and the real token stays on the host.
//! - Top-level [`SESSION_STATE`] entries are skipped, not copied: a box sees its own sessions,
//!   never the host's history of other projects.
//! - `skills/h5i` (h5i's own skill) is skipped: the box is shown the skill embedded in the h5i
//!   binary that runs it, read-only, never the host's copy.
//! - A symlink is recreated only when its target is relative and only descends (no `..`, not
//!   absolute), so every recreated link resolves inside the copy; any other is skipped and
//!   reported. A link to a stripped file dangles in the copy.
//!
//! Guarded by `tests/broker_home.rs` and the unit tests below.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use h5i_policy::AgentRuntime;

/// Most entries one seed copies before refusing.
pub const MAX_ENTRIES: u64 = 100_000;
/// Most bytes one seed copies before refusing.
pub const MAX_BYTES: u64 = 512 << 20;
/// Deepest directory nesting followed.
pub const MAX_DEPTH: usize = 64;

/// How a name is matched (against its lowercase form).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameMatch {
    /// The whole name.
    Exact(&'static str),
    /// The name starts with this.
    Prefix(&'static str),
    /// The name ends with this.
    Suffix(&'static str),
}

impl NameMatch {
    fn matches(self, lower: &str) -> bool {
        match self {
            NameMatch::Exact(s) => lower == s,
            NameMatch::Prefix(s) => lower.starts_with(s),
            NameMatch::Suffix(s) => lower.ends_with(s),
        }
    }
}

/// One credential shape.
#[derive(Debug, Clone, Copy)]
pub struct StripRule {
    /// How the name matches.
    pub name: NameMatch,
    /// Why it is on the list.
    pub why: &'static str,
}

/// Names that are credentials wherever they appear. Reviewed data: every entry has its reason.
pub const CREDENTIAL_SHAPES: &[StripRule] = &[
    StripRule {
        name: NameMatch::Prefix("credentials"),
        why: "credential stores (`credentials`, `credentials.json`)",
    },
    StripRule {
        name: NameMatch::Prefix(".credentials"),
        why: "Claude Code's OAuth token file and its kin",
    },
    StripRule {
        name: NameMatch::Exact("auth.json"),
        why: "Codex's token file and other tools' auth stores",
    },
    StripRule {
        name: NameMatch::Exact(".netrc"),
        why: "machine passwords for curl, git, ftp",
    },
    StripRule {
        name: NameMatch::Exact("_netrc"),
        why: "the Windows spelling of .netrc",
    },
    StripRule {
        name: NameMatch::Exact(".git-credentials"),
        why: "git's plain-text credential store",
    },
    StripRule {
        name: NameMatch::Exact(".pgpass"),
        why: "PostgreSQL passwords",
    },
    StripRule {
        name: NameMatch::Exact(".ssh"),
        why: "a whole SSH directory: keys, agent sockets, known hosts",
    },
    StripRule {
        name: NameMatch::Exact(".gnupg"),
        why: "GnuPG private keys",
    },
    StripRule {
        name: NameMatch::Prefix("id_"),
        why: "SSH keys (`id_rsa`, `id_ed25519`, and their .pub halves)",
    },
    StripRule {
        name: NameMatch::Suffix(".pem"),
        why: "PEM certificates and private keys",
    },
    StripRule {
        name: NameMatch::Suffix(".key"),
        why: "private keys",
    },
    StripRule {
        name: NameMatch::Suffix(".p12"),
        why: "PKCS#12 key bundles",
    },
    StripRule {
        name: NameMatch::Suffix(".pfx"),
        why: "PKCS#12 key bundles (Windows name)",
    },
    StripRule {
        name: NameMatch::Suffix(".ppk"),
        why: "PuTTY private keys",
    },
    StripRule {
        name: NameMatch::Suffix(".jks"),
        why: "Java keystores",
    },
    StripRule {
        name: NameMatch::Suffix(".keystore"),
        why: "Java and Android keystores",
    },
];

/// Top-level entries of a runtime's config directory that record other sessions (other
/// projects' prompts, transcripts, IDE connection tokens). Skipped, never copied.
pub const SESSION_STATE: &[(AgentRuntime, &str, &str)] = &[
    (
        AgentRuntime::Claude,
        "projects",
        "transcripts of every project's sessions",
    ),
    (
        AgentRuntime::Claude,
        "history.jsonl",
        "prompt history across projects",
    ),
    (AgentRuntime::Claude, "todos", "other sessions' task lists"),
    (
        AgentRuntime::Claude,
        "shell-snapshots",
        "snapshots of the host shell's environment",
    ),
    (
        AgentRuntime::Claude,
        "file-history",
        "other sessions' file edits",
    ),
    (
        AgentRuntime::Claude,
        "session-env",
        "other sessions' environments",
    ),
    (
        AgentRuntime::Claude,
        "ide",
        "IDE lock files carrying connection tokens",
    ),
    (
        AgentRuntime::Claude,
        "statsig",
        "feature-flag caches keyed to the account",
    ),
    (
        AgentRuntime::Codex,
        "sessions",
        "transcripts of every project's sessions",
    ),
    (
        AgentRuntime::Codex,
        "history.jsonl",
        "prompt history across projects",
    ),
    (AgentRuntime::Codex, "log", "logs of other sessions"),
];

/// The runtime's own token file, at the top of its config directory.
pub fn runtime_token_file(runtime: AgentRuntime) -> &'static str {
    match runtime {
        AgentRuntime::Claude => ".credentials.json",
        AgentRuntime::Codex => "auth.json",
    }
}

/// Whether the runtime's own token file is copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenPolicy {
    /// Strip it like every other credential (the credential proxy is on: the default).
    Strip,
    /// Keep it (the credential proxy is off, `H5I_CREDENTIAL_PROXY=0`).
    KeepRuntimeToken,
}

/// Why an entry was not copied although it is not credential-shaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// A runtime's record of other sessions ([`SESSION_STATE`]).
    SessionState,
    /// A symlink whose target is absolute or climbs (`..`).
    SymlinkOut,
    /// A device, FIFO or socket.
    Special,
    /// The host's copy of h5i's own skill (`skills/h5i`): the box gets the one embedded in the
    /// h5i binary that runs it, read-only, never the host's.
    H5iSkill,
}

/// What a seed did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeedReport {
    /// Whether the source directory existed at all (a missing one seeds an empty directory).
    pub source_found: bool,
    /// Regular files copied.
    pub files: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// Credential-shaped entries stripped, relative to the source (names only, never contents).
    pub stripped: Vec<PathBuf>,
    /// Entries skipped for another reason, relative to the source.
    pub skipped: Vec<(PathBuf, SkipReason)>,
    /// Whether the runtime's token file was kept.
    pub kept_token: bool,
}

/// A seed could not be made.
#[derive(Debug, thiserror::Error)]
pub enum HomeError {
    /// Reading the source or writing the copy failed.
    #[error("refusing: seeding the box HOME at {path}: {source}; to fix: check the path is readable (source) or writable (destination) by you")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The destination already has content.
    #[error("refusing: the box HOME {0} already has content, and a seed is made once; to fix: seed into a new, empty directory")]
    NotEmpty(PathBuf),
    /// The source is not a directory.
    #[error("refusing: {0} is not a directory; to fix: point the seed at the agent's config directory (e.g. ~/.claude)")]
    NotADirectory(PathBuf),
    /// The destination lies inside the source (or the other way round).
    #[error("refusing: the box HOME {dst} and the source {src} overlap; to fix: seed into a directory outside the source")]
    Overlap {
        /// The source.
        src: PathBuf,
        /// The destination.
        dst: PathBuf,
    },
    /// Too big to be a config directory.
    #[error("refusing: {0} is larger than a config directory should be ({MAX_ENTRIES} entries, {MAX_BYTES} bytes, depth {MAX_DEPTH}); to fix: move caches and transcripts out of it")]
    TooLarge(PathBuf),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> HomeError + '_ {
    move |source| HomeError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Whether `name` (one path component) is credential-shaped.
pub fn is_credential_shaped(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    CREDENTIAL_SHAPES.iter().any(|r| r.name.matches(&lower))
}

/// Copy `src` (the host agent's config directory) into `dst` (a new or empty directory in the
/// box-private HOME), stripping credential shapes at any depth. See the module doc for exactly
/// what is kept. A missing `src` seeds an empty `dst`.
pub fn seed(
    src: &Path,
    dst: &Path,
    runtime: AgentRuntime,
    token: TokenPolicy,
) -> Result<SeedReport, HomeError> {
    let mut report = SeedReport::default();
    if dst.components().any(|c| c == Component::ParentDir) {
        return Err(io_err(dst)(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the destination has a `..` component",
        )));
    }
    let root = match fs::canonicalize(src) {
        Ok(r) => Some(r),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_err(src)(e)),
    };
    if let Some(root) = &root {
        if !root.is_dir() {
            return Err(HomeError::NotADirectory(src.to_owned()));
        }
        // Checked before anything is created, so a refused seed leaves nothing in the source.
        let dst_real = resolve_beyond(dst).map_err(io_err(dst))?;
        if dst_real.starts_with(root) || root.starts_with(&dst_real) {
            return Err(HomeError::Overlap {
                src: root.clone(),
                dst: dst_real,
            });
        }
    }
    match fs::read_dir(dst) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(HomeError::NotEmpty(dst.to_owned()));
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dst)
                .map_err(io_err(dst))?;
        }
        Err(e) => return Err(io_err(dst)(e)),
    }
    let Some(root) = root else {
        return Ok(report);
    };
    let dst_real = fs::canonicalize(dst).map_err(io_err(dst))?;
    report.source_found = true;
    let mut budget = Budget {
        entries: 0,
        bytes: 0,
    };
    copy_dir(
        &root,
        &dst_real,
        Path::new(""),
        0,
        runtime,
        token,
        &mut report,
        &mut budget,
    )?;
    Ok(report)
}

/// `path` with its longest existing prefix resolved and the rest appended as written.
fn resolve_beyond(path: &Path) -> io::Result<PathBuf> {
    let mut rest = Vec::new();
    let mut cur = path.to_path_buf();
    loop {
        match fs::canonicalize(&cur) {
            Ok(real) => {
                let mut out = real;
                for c in rest.iter().rev() {
                    out.push(c);
                }
                return Ok(out);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let Some(name) = cur.file_name().map(|n| n.to_owned()) else {
                    return Err(e);
                };
                rest.push(name);
                if !cur.pop() || cur.as_os_str().is_empty() {
                    cur = PathBuf::from(".");
                }
            }
            Err(e) => return Err(e),
        }
    }
}

struct Budget {
    entries: u64,
    bytes: u64,
}

#[allow(clippy::too_many_arguments)]
fn copy_dir(
    src: &Path,
    dst: &Path,
    rel: &Path,
    depth: usize,
    runtime: AgentRuntime,
    token: TokenPolicy,
    report: &mut SeedReport,
    budget: &mut Budget,
) -> Result<(), HomeError> {
    if depth > MAX_DEPTH {
        return Err(HomeError::TooLarge(src.to_owned()));
    }
    let mut names: Vec<_> = fs::read_dir(src)
        .map_err(io_err(src))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(io_err(src))?;
    names.sort();
    for name in names {
        budget.entries += 1;
        if budget.entries > MAX_ENTRIES {
            return Err(HomeError::TooLarge(src.to_owned()));
        }
        let from = src.join(&name);
        let to = dst.join(&name);
        let rel_path = rel.join(&name);
        let text = name.to_string_lossy();
        let top = depth == 0;
        if top
            && SESSION_STATE
                .iter()
                .any(|(r, n, _)| *r == runtime && *n == text)
        {
            report.skipped.push((rel_path, SkipReason::SessionState));
            continue;
        }
        if rel_path == Path::new("skills/h5i") {
            report.skipped.push((rel_path, SkipReason::H5iSkill));
            continue;
        }
        let is_token_file = top && text == runtime_token_file(runtime);
        if is_credential_shaped(&text) && !(is_token_file && token == TokenPolicy::KeepRuntimeToken)
        {
            report.stripped.push(rel_path);
            continue;
        }
        let meta = fs::symlink_metadata(&from).map_err(io_err(&from))?;
        let ft = meta.file_type();
        if ft.is_symlink() {
            let target = fs::read_link(&from).map_err(io_err(&from))?;
            let descends = target.is_relative()
                && target
                    .components()
                    .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
            if descends {
                std::os::unix::fs::symlink(&target, &to).map_err(io_err(&to))?;
            } else {
                report.skipped.push((rel_path, SkipReason::SymlinkOut));
            }
        } else if ft.is_dir() {
            fs::DirBuilder::new()
                .mode(meta.permissions().mode() & 0o777 | 0o700)
                .create(&to)
                .map_err(io_err(&to))?;
            copy_dir(
                &from,
                &to,
                &rel_path,
                depth + 1,
                runtime,
                token,
                report,
                budget,
            )?;
        } else if ft.is_file() {
            let n = copy_file(&from, &to, meta.permissions().mode())?;
            budget.bytes += n;
            if budget.bytes > MAX_BYTES {
                return Err(HomeError::TooLarge(src.to_owned()));
            }
            report.files += 1;
            report.bytes += n;
            if is_token_file {
                report.kept_token = true;
            }
        } else {
            report.skipped.push((rel_path, SkipReason::Special));
        }
    }
    Ok(())
}

/// Copy one regular file without following a symlink at either end, mode kept (setuid, setgid
/// and sticky dropped; the owner can always read and write its copy).
fn copy_file(from: &Path, to: &Path, mode: u32) -> Result<u64, HomeError> {
    let mut input = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(from)
        .map_err(io_err(from))?;
    let meta = input.metadata().map_err(io_err(from))?;
    if !meta.is_file() {
        return Err(io_err(from)(io::Error::other(
            "changed type while being copied",
        )));
    }
    let mut output: File = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode & 0o777 | 0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(to)
        .map_err(io_err(to))?;
    io::copy(&mut input, &mut output).map_err(io_err(to))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_shapes_match_case_insensitively() {
        for yes in [
            "credentials",
            "Credentials.json",
            ".credentials.json",
            ".netrc",
            "id_rsa",
            "id_ed25519.pub",
            "server.PEM",
            "tls.key",
            "bundle.p12",
            "x.pfx",
            "auth.json",
            ".ssh",
            ".git-credentials",
        ] {
            assert!(is_credential_shaped(yes), "{yes}");
        }
        for no in [
            "settings.json",
            "CLAUDE.md",
            "keys.txt",
            "monkey",
            "idea",
            "auth.json.md",
            "agents",
        ] {
            assert!(!is_credential_shaped(no), "{no}");
        }
    }

    #[test]
    fn each_runtime_token_file_is_itself_credential_shaped() {
        for rt in [AgentRuntime::Claude, AgentRuntime::Codex] {
            assert!(is_credential_shaped(runtime_token_file(rt)));
        }
    }
}
