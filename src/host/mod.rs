//! `h5i host setup`: prepare this host for h5i's kernel tiers, once, as root.
//!
//! Owns every host-level change h5i needs, one module per concern, each step idempotent and
//! reporting one [`Change`] line per thing it changed (nothing when the host is already right):
//! - `files`: write a file only when its bytes or mode differ (atomic rename);
//! - `subids`: subordinate uid/gid ranges (`/etc/subuid`, `/etc/subgid`), non-overlapping;
//! - the `h5i-box` system user whose range a root caller's boxes map to
//!   ([`crate::identity::ensure_user`], then its ranges through `subids`);
//! - `devices`: `/dev/net/tun` and `/dev/fuse` usable by unprivileged users (no udev here);
//! - `cgroups`: a delegated cgroup for an unprivileged user where the host needs one, and the
//!   cgroup2 `favordynmods` option that makes joining a run's cgroup cheap;
//! - `podman`: the Podman configuration this host needs, a user's rootless config, and the
//!   supervised tier's hooks.d entries with the `h5i-hook` they run;
//! - `users`: `--user NAME`: subordinate ids, `/run/user/<uid>`, cgroup, rootless Podman;
//! - `/etc/claude-code`, empty: where a Claude Code box gets h5i's managed settings bound
//!   (`crate::capture`).
//!
//! Every path goes through a [`HostRoot`] so the steps run over a temporary root in unit tests.
//! Must never: run as anyone but root, touch a user's files as root without handing them to the
//! user, create a cgroup outside the calling process's own cgroup, or overwrite a subordinate
//! range another user holds. Guarded by each module's unit tests and `tests/install.rs`.

pub mod cgroups;
pub mod devices;
pub mod files;
pub mod podman;
pub mod subids;
pub mod users;

use std::path::{Path, PathBuf};

/// One change `host setup` made, printed as one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change(pub String);

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Why a setup step failed.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// Not root.
    #[error("refusing: `h5i host setup` changes system files and must run as root; to fix: sudo h5i host setup")]
    NotRoot,
    /// A file-system step failed.
    #[error("refusing: cannot {what} {path}: {source}; to fix: check that {path} is writable by root and the file system is not read-only")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The user named by `--user` does not exist.
    #[error("refusing: no user `{0}` on this host; to fix: create it first (useradd -m {0}) or pass an existing user to --user")]
    NoSuchUser(String),
    /// `--user root` (or another uid 0 account).
    #[error("refusing: `{0}` is root; --user prepares an unprivileged user; to fix: name an unprivileged account")]
    UserIsRoot(String),
    /// A subordinate id file holds a line that cannot be parsed.
    #[error("refusing: {path} line {line}: `{text}` is not NAME:START:COUNT; to fix: correct or remove that line")]
    BadSubidLine {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
    },
    /// No free subordinate range fits below the id space's end.
    #[error("refusing: no free {count}-id range left in {path}; to fix: remove unused ranges from {path}")]
    SubidsExhausted {
        /// The file.
        path: PathBuf,
        /// The size wanted.
        count: u64,
    },
    /// A helper program failed.
    #[error("refusing: `{program}` failed: {detail}; to fix: {mend}")]
    Program {
        /// What ran.
        program: String,
        /// Its stderr or exit status.
        detail: String,
        /// What to do.
        mend: &'static str,
    },
    /// The delegated cgroup is another unprivileged user's already.
    #[error("refusing: cgroup {path} is delegated to uid {owner} already, and one directory serves one user (handing it over would take box limits from uid {owner} silently); to fix: run unprivileged boxes as that user, or stop its boxes, `rmdir` the directory's tree and run this again")]
    CgroupDelegatedElsewhere {
        /// The delegated directory.
        path: PathBuf,
        /// Its owner now.
        owner: u32,
    },
    /// The box identity (`h5i-box` and its range) could not be made.
    #[error(transparent)]
    Identity(#[from] crate::identity::IdentityError),
    /// The `h5i-hook` to install is not beside this `h5i`.
    #[error("refusing: no h5i-hook beside {h5i}; to fix: install h5i with `cargo install --path .` (it installs h5i-hook and h5i-runc beside h5i)")]
    NoHookBinary {
        /// This h5i binary.
        h5i: PathBuf,
    },
}

impl HostError {
    pub(crate) fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> HostError {
        let path = path.to_path_buf();
        move |source| HostError::Io { what, path, source }
    }
}

/// Where the host's file system starts: `/` for real, a temporary directory in tests.
#[derive(Debug, Clone)]
pub struct HostRoot(PathBuf);

impl HostRoot {
    /// The real host.
    pub fn system() -> Self {
        Self(PathBuf::from("/"))
    }

    /// A root at `dir` (tests).
    pub fn at(dir: &Path) -> Self {
        Self(dir.to_path_buf())
    }

    /// `path` (absolute, as on the host) under this root.
    pub fn path(&self, path: impl AsRef<Path>) -> PathBuf {
        let p = path.as_ref();
        self.0.join(p.strip_prefix("/").unwrap_or(p))
    }

    /// Whether this is the real host.
    pub fn is_system(&self) -> bool {
        self.0 == Path::new("/")
    }
}

/// What `h5i host setup` was asked to do.
#[derive(Debug, Clone, Default)]
pub struct SetupRequest {
    /// `--user NAME`: also prepare this unprivileged user.
    pub user: Option<String>,
}

/// Run every step on the real host, in order; the changes made, one per line.
pub fn setup(req: &SetupRequest) -> Result<Vec<Change>, HostError> {
    if h5i_sys::ids::euid() != 0 {
        return Err(HostError::NotRoot);
    }
    let root = HostRoot::system();
    let mut changes = Vec::new();
    devices::open_to_users(&root, &mut changes)?;
    if crate::identity::ensure_user()? {
        changes.push(Change(format!(
            "created system user {}",
            crate::identity::BOX_USER
        )));
    }
    for file in [crate::identity::SUBUID, crate::identity::SUBGID] {
        subids::ensure_range(&root.path(file), &[crate::identity::BOX_USER], &mut changes)?;
    }
    cgroups::favor_dynmods(&mut changes);
    podman::host_config(&root, &mut changes)?;
    podman::install_hooks(&root, &hook_beside_this_h5i()?, &mut changes)?;
    // Where an agent box gets h5i's settings for its agent bound (the box reads the host's
    // /etc): Claude Code's managed settings, Codex's system config and hooks.
    for runtime in [
        h5i_policy::AgentRuntime::Claude,
        h5i_policy::AgentRuntime::Codex,
    ] {
        let at = root.path(runtime.system_dir());
        if files::ensure_dir(&at, 0o755, files::Owner::ROOT)? {
            changes.push(Change(format!(
                "created {} (empty: the mount point of a {runtime} box's settings from h5i)",
                at.display()
            )));
        }
    }
    if let Some(name) = &req.user {
        users::prepare(&root, &users::lookup(name)?, &mut changes)?;
    }
    Ok(changes)
}

/// The `h5i-hook` installed beside this `h5i` (what `cargo install --path .` puts there).
fn hook_beside_this_h5i() -> Result<PathBuf, HostError> {
    let h5i =
        std::env::current_exe().map_err(HostError::io("find", Path::new("/proc/self/exe")))?;
    let hook = h5i.with_file_name("h5i-hook");
    if hook.is_file() {
        Ok(hook)
    } else {
        Err(HostError::NoHookBinary { h5i })
    }
}
