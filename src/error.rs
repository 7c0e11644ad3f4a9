//! The box lifecycle's refusals: every variant names the object and the mend, in one or two
//! lines (`refusing: ...; to fix: ...`). Lower crates' errors are wrapped, never flattened into
//! strings, so the binary edge can print them as they were written.

use std::path::{Path, PathBuf};

/// Why a box verb refused.
#[derive(Debug, thiserror::Error)]
pub enum BoxError {
    /// Not inside a git repository.
    #[error("refusing: {cwd} is not inside a git repository; to fix: run h5i from a clone (boxes live in its .git/.h5i)")]
    NotARepo {
        /// Where h5i was run.
        cwd: PathBuf,
    },
    /// The directory is inside a box store whose owner is not a repository's `.git`.
    #[error("refusing: {} is inside a box store, but {} is not a repository's .git directory h5i can trust, so nothing there is read; to fix: run h5i from the repository's own work tree (outside .git)", crate::escape::path(.cwd), crate::escape::path(.owner))]
    UntrustedStore {
        /// Where h5i was run.
        cwd: PathBuf,
        /// What would own the store.
        owner: PathBuf,
    },
    /// The workspace holds something a host verb will not hand to git.
    #[error("refusing: box `{name}`'s workspace holds {what}, which git would block on or read whole; nothing was read; to fix: remove it (`h5i box run {name} -- rm PATH`), or `h5i box rm --force {name}`")]
    HostileWorkspace {
        /// The box.
        name: String,
        /// The path and what it is (escaped).
        what: String,
    },
    /// The box holds changes nobody exported.
    #[error("refusing: box `{name}` holds changes nobody exported{detail}; to fix: `h5i box export {name} --out DIR` first, or `h5i box rm --force {name}` to discard them")]
    Unexported {
        /// The box.
        name: String,
        /// What was found and what was not read (escaped), or empty.
        detail: String,
    },
    /// No box has that name.
    #[error("refusing: no box named `{name}`; to fix: `h5i box ls` lists the boxes of this clone")]
    NoSuchBox {
        /// The name asked for.
        name: String,
    },
    /// The name is taken.
    #[error("refusing: a box named `{name}` already exists; to fix: pick another name, or `h5i box rm {name}` first")]
    BoxExists {
        /// The name asked for.
        name: String,
    },
    /// The name is not a plain slug.
    #[error("refusing: `{name}` is not a box name; to fix: use 1-63 characters of a-z, 0-9, '-', '_', '.', starting with a letter or digit")]
    BadName {
        /// The name given.
        name: String,
    },
    /// The box is in a state that does not allow the verb.
    #[error("refusing: box `{name}` is {state}, and `{verb}` needs an active box; to fix: {mend}")]
    WrongState {
        /// The box.
        name: String,
        /// Its state.
        state: &'static str,
        /// The verb refused.
        verb: &'static str,
        /// What to do instead.
        mend: String,
    },
    /// A verb that only a worktree box supports.
    #[error("refusing: box `{name}` is detached (its code came from {origin}), so `{verb}` has nowhere to land it; to fix: `h5i box export {name} --out DIR` and `git apply --3way DIR/patch.diff` where you want it")]
    Detached {
        /// The box.
        name: String,
        /// Where its code came from.
        origin: String,
        /// The verb refused.
        verb: &'static str,
    },
    /// Another verb holds the box's lock.
    #[error("refusing: box `{name}` is busy (a run or another h5i command holds its lock); to fix: wait for it to finish")]
    Busy {
        /// The box.
        name: String,
    },
    /// A rebase of the box was killed part-way: its tree is between two bases.
    #[error("refusing: box `{name}`'s last rebase was interrupted, so its workspace is between two bases; to fix: `h5i box rebase {name}` finishes it (or `h5i box rm --force {name}`)")]
    RebaseInterrupted {
        /// The box.
        name: String,
    },
    /// The creation flags contradict each other or name nothing.
    #[error("refusing: {what}; to fix: {mend}")]
    BadRequest {
        /// What was wrong.
        what: String,
        /// What to do.
        mend: String,
    },
    /// The stored policy no longer matches its digest.
    #[error("refusing: the stored policy of box `{name}` does not match its digest ({detail}); it is never repaired; to fix: `h5i box rm {name}` and create the box again")]
    PolicyTampered {
        /// The box.
        name: String,
        /// What did not match.
        detail: String,
    },
    /// A box file is unreadable or malformed.
    #[error("refusing: {path} is damaged ({what}); to fix: `h5i box doctor` it, or `h5i box rm --force` the box")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// A filesystem operation failed.
    #[error("refusing: {path}: {source}; to fix: check permissions and free space there")]
    Io {
        /// Where.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The parent repository is not in a state `apply` can land on.
    #[error("refusing: {what}; to fix: {mend}")]
    ParentNotReady {
        /// What is wrong with the parent.
        what: String,
        /// What to do.
        mend: String,
    },
    /// Policy resolution failed.
    #[error(transparent)]
    Policy(#[from] h5i_policy::PolicyError),
    /// A git command failed.
    #[error(transparent)]
    Git(#[from] crate::git::GitError),
    /// Who the box is on the host (`identity`).
    #[error(transparent)]
    Identity(#[from] crate::identity::IdentityError),
    /// Supervising the command failed.
    #[error(transparent)]
    Supervise(#[from] h5i_runtime::supervise::SuperviseError),
    /// A process-tier run could not start.
    #[error(transparent)]
    ProcessTier(#[from] h5i_runtime::process_tier::ProcessTierError),
    /// The box's own terminal (`box shell`) could not be made.
    #[error(transparent)]
    Terminal(#[from] h5i_runtime::pty::PtyError),
    /// The box sandbox could not serve a run.
    #[error(transparent)]
    Sandbox(#[from] h5i_runtime::sandbox::SandboxError),
    /// A declared secret could not be resolved.
    #[error(transparent)]
    Secret(#[from] h5i_broker::secrets::SecretError),
    /// The receipt log failed.
    #[error(transparent)]
    Receipts(#[from] h5i_broker::receipt_log::ReceiptLogError),
    /// The export gate refused (`box export`, `apply`, `rebase`).
    #[error(transparent)]
    Export(#[from] crate::export::ExportError),
    /// Taking a snapshot of the workspace failed.
    #[error(transparent)]
    Snapshot(#[from] crate::snapshot::SnapshotError),
    /// A service of the box could not be held still while its tree was read (`freeze`).
    #[error("refusing: cannot hold service `{service}` of box `{name}` still while h5i reads the workspace ({why}); to fix: stop it (`h5i box service stop {name} {service}`) and retry")]
    ServiceNotHeld {
        /// The box.
        name: String,
        /// The service.
        service: String,
        /// What went wrong.
        why: String,
    },
    /// A granted secret cannot be resolved in this shell, so nothing could be checked for it.
    #[error("refusing: {verb} cannot check the patch for secret `{name}`: its source {source_desc} is not set in this shell; to fix: export {var}=... (the value the box was given) and {verb} again, or pass --skip-secret-check to go ahead without scanning for it (report.md says so in its first lines)")]
    SecretUnchecked {
        /// The verb.
        verb: &'static str,
        /// The grant.
        name: String,
        /// `env:VAR`.
        source_desc: String,
        /// The variable to set.
        var: String,
    },
}

impl BoxError {
    /// An I/O error at `path`.
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        BoxError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
