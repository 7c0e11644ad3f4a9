//! The box store: `.git/.h5i/env/<agent>/<slug>/` under the repository's common git directory.
//!
//! Owns where a box's files live, its manifest, finding a box by name, and the per-box lock that
//! serializes lifecycle verbs. Must never: create anything outside `.git/.h5i/`, accept a name
//! that is not a plain slug (no `/`, no `..`), or treat a half-created box as a box.
//!
//! A box directory holds:
//! - `manifest.json`        what the box is (shape, pinned base, state)
//! - `policy.resolved.toml` and `policy.digest`, written first, verified on every use
//! - `receipts.jsonl` and `payloads/`: the sealed receipt log (host writes only)
//! - `spool/`: the box's only write window under its own directory
//! - `skill/`: h5i's skill as an agent box sees it in its HOME (read-only, written by the host)
//! - `events.jsonl`: the box's event log (`h5i box log`)
//! - `base.git/`: for detached boxes, the host-only store holding the pinned base's objects
//! - `workspace/`: the box's tree, with a `.git` of its own that borrows the store's objects
//! - `scratch/`: host-private temporary space (snapshots for diff and export)
//! - `rebase/`: a `box rebase` past its commit point (`journal.json`, with the index and
//!   objects it computed); while it is there the box is between two bases, and every verb but
//!   `rebase` (which finishes it), `rm` and `status` refuses

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::BoxError;
use crate::file_lock::{FileLock, LockKind};

/// Version of the manifest schema.
pub const MANIFEST_VERSION: u32 = 1;

/// Where the code of a box came from, which decides its shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum BoxSource {
    /// This repository at a revision: `apply` and `rebase` can land it back.
    Worktree {
        /// The revision as the user named it.
        from: String,
        /// The parent branch `apply`/`rebase` target, when `from` named one (or HEAD was on one).
        parent_branch: Option<String>,
    },
    /// `--pr N`: the pull request's head, fetched into the box's own store.
    PullRequest {
        /// The pull request number.
        number: u64,
        /// The remote it was fetched from (a URL or path).
        remote: String,
    },
    /// `--clone URL`: an external repository copied in.
    Clone {
        /// Where it came from.
        url: String,
    },
    /// `--new`: an empty repository with one empty commit.
    New,
}

impl BoxSource {
    /// Whether the box has a repository of its own (no `apply`/`rebase`).
    pub fn is_detached(&self) -> bool {
        !matches!(self, BoxSource::Worktree { .. })
    }

    /// A short label for listings.
    pub fn label(&self) -> String {
        match self {
            BoxSource::Worktree { from, .. } => format!("worktree@{from}"),
            BoxSource::PullRequest { number, .. } => format!("pr#{number}"),
            BoxSource::Clone { url } => format!("clone {url}"),
            BoxSource::New => "new".to_string(),
        }
    }
}

/// Where a box is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BoxState {
    /// Usable.
    Active,
    /// Landed on its parent branch by `box apply`.
    Applied,
    /// Stopped by `box abort`; kept for forensics.
    Aborted,
}

impl BoxState {
    /// The state's name as printed.
    pub fn as_str(self) -> &'static str {
        match self {
            BoxState::Active => "active",
            BoxState::Applied => "applied",
            BoxState::Aborted => "aborted",
        }
    }
}

/// `manifest.json`: what a box is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    /// Schema version.
    pub v: u32,
    /// The box's name (also its slug).
    pub name: String,
    /// The agent directory it lives under (`claude`, `codex`, `none`).
    pub agent: String,
    /// Creation time, ms since the epoch.
    pub created_ms: u64,
    /// Where the code came from.
    pub source: BoxSource,
    /// The pinned base commit.
    pub base: String,
    /// The ref in the store that pins the base (the box cannot move it).
    pub base_ref: String,
    /// The host-controlled git dir that holds the base's objects.
    pub store: PathBuf,
    /// The box's own branch, inside its workspace repository.
    pub branch: String,
    /// Lifecycle state.
    pub state: BoxState,
    /// The tier the policy resolved to.
    pub tier: String,
    /// The policy digest stored at creation.
    pub policy_digest: String,
}

/// The paths of one box.
#[derive(Debug, Clone)]
pub struct BoxPaths {
    /// The box directory.
    pub dir: PathBuf,
}

impl BoxPaths {
    /// `manifest.json`.
    pub fn manifest(&self) -> PathBuf {
        self.dir.join("manifest.json")
    }
    /// `policy.resolved.toml`.
    pub fn policy(&self) -> PathBuf {
        self.dir.join("policy.resolved.toml")
    }
    /// `policy.digest`.
    pub fn digest(&self) -> PathBuf {
        self.dir.join("policy.digest")
    }
    /// `receipts.jsonl`.
    pub fn receipts(&self) -> PathBuf {
        self.dir.join("receipts.jsonl")
    }
    /// `skill/`: the read-only copies of h5i's skill an agent box's HOME shows (host writes
    /// only; outside every grant).
    pub fn skill(&self) -> PathBuf {
        self.dir.join("skill")
    }

    /// `payloads/`.
    pub fn payloads(&self) -> PathBuf {
        self.dir.join("payloads")
    }
    /// `spool/`.
    pub fn spool(&self) -> PathBuf {
        self.dir.join("spool")
    }
    /// `events.jsonl`.
    pub fn events(&self) -> PathBuf {
        self.dir.join("events.jsonl")
    }
    /// `workspace/`.
    pub fn workspace(&self) -> PathBuf {
        self.dir.join("workspace")
    }
    /// `base.git/` (detached boxes).
    pub fn base_git(&self) -> PathBuf {
        self.dir.join("base.git")
    }
    /// `home/`: the box's own HOME (see `box_home`).
    pub fn home(&self) -> PathBuf {
        self.dir.join("home")
    }
    /// `alternates.box`: the `.git/objects/info/alternates` the box's git reads at the process
    /// and supervised tiers, naming the object store where the box sees it.
    pub fn box_alternates(&self) -> PathBuf {
        self.dir.join("alternates.box")
    }

    /// `scratch/`.
    pub fn scratch(&self) -> PathBuf {
        self.dir.join("scratch")
    }
    /// `rebase/`: an interrupted rebase's journal (see `rebase`).
    pub fn rebase_journal(&self) -> PathBuf {
        self.dir.join("rebase")
    }
    /// `lock`.
    pub fn lock(&self) -> PathBuf {
        self.dir.join("lock")
    }
    /// `net-table.json`: the egress table the last supervised run loaded (host-written).
    pub fn net_table(&self) -> PathBuf {
        self.dir.join("net-table.json")
    }
}

/// A box found in the store.
#[derive(Debug, Clone)]
pub struct StoredBox {
    /// Its paths.
    pub paths: BoxPaths,
    /// Its manifest.
    pub manifest: Manifest,
}

/// The store of one clone.
#[derive(Debug, Clone)]
pub struct BoxStore {
    /// The repository's top-level work tree (where `h5i box .` snapshots from).
    pub repo_root: PathBuf,
    /// The repository's common git dir.
    pub common_dir: PathBuf,
}

const PARTIAL_PREFIX: &str = ".creating-";

impl BoxStore {
    /// The store of the repository containing `cwd`. A `cwd` inside a box (or anywhere under
    /// `.git/.h5i/`) gives the store of the parent that owns it, found by path: nothing the box
    /// wrote is read (see [`crate::git::find_common_dir`]).
    pub fn discover(cwd: &Path) -> Result<Self, BoxError> {
        use crate::git::Discovery;
        let (repo_root, common_dir) = crate::git::find_common_dir(cwd).map_err(|d| match d {
            Discovery::NotARepo => BoxError::NotARepo {
                cwd: cwd.to_path_buf(),
            },
            Discovery::UntrustedOwner { owner } => BoxError::UntrustedStore {
                cwd: cwd.to_path_buf(),
                owner,
            },
        })?;
        Ok(BoxStore {
            repo_root,
            common_dir,
        })
    }

    /// `.git/.h5i/env`.
    pub fn env_root(&self) -> PathBuf {
        self.common_dir.join(".h5i").join("env")
    }

    /// Where a box of this agent and name lives once created.
    pub fn box_dir(&self, agent: &str, name: &str) -> PathBuf {
        self.env_root().join(agent).join(name)
    }

    /// Where a box is assembled before it is renamed into place.
    pub fn staging_dir(&self, agent: &str, name: &str) -> PathBuf {
        self.env_root()
            .join(agent)
            .join(format!("{PARTIAL_PREFIX}{name}"))
    }

    /// Claim `name` in `agent`'s directory by making its staging directory (`.creating-NAME`,
    /// 0700): made under a temporary name, locked, then renamed into place without replacing
    /// anything, so a staging directory nobody holds locked belongs to a verb that was killed;
    /// such a one is reclaimed here, and once the claim is held the pin it may have left goes
    /// too when no box of the name exists. `None` while another verb holds the name.
    ///
    /// Create holds the claim for its life; rm and gc hold it while they drop a pin
    /// ([`crate::pin`]), so no two verbs write one name's pin at once.
    pub fn claim_name(&self, agent: &str, name: &str) -> Result<Option<NameClaim>, BoxError> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = self.env_root().join(agent);
        fs::create_dir_all(&dir).map_err(|e| BoxError::io(&dir, e))?;
        let staging = self.staging_dir(agent, name);
        let tmp = dir.join(format!("{PARTIAL_PREFIX}{name}.{}.tmp", std::process::id()));
        let mut reclaimed = false;
        for _ in 0..2 {
            let _ = fs::remove_dir_all(&tmp);
            fs::DirBuilder::new()
                .mode(0o700)
                .create(&tmp)
                .map_err(|e| BoxError::io(&tmp, e))?;
            let held = open_dir(&tmp)?;
            held.try_lock()
                .map_err(|e| BoxError::io(&tmp, std::io::Error::from(e)))?;
            match crate::rename::rename_noreplace(&tmp, &staging) {
                Ok(()) => {
                    if reclaimed {
                        self.drop_orphan_pin(name)?;
                    }
                    return Ok(Some(NameClaim {
                        _dir: held,
                        staging,
                    }));
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    let _ = fs::remove_dir_all(&tmp);
                    return Err(BoxError::io(&staging, e));
                }
            }
            let _ = fs::remove_dir_all(&tmp);
            let Ok(other) = open_dir(&staging) else {
                continue;
            };
            if other.try_lock().is_err() {
                return Ok(None);
            }
            fs::remove_dir_all(&staging).map_err(|e| BoxError::io(&staging, e))?;
            reclaimed = true;
        }
        Ok(None)
    }

    /// Whether `name` is taken in an agent directory other than `agent`, or as a box in it.
    pub fn name_taken_beside(&self, name: &str, agent: &str) -> bool {
        let Ok(agents) = fs::read_dir(self.env_root()) else {
            return false;
        };
        agents.flatten().any(|a| {
            a.path().join(name).exists()
                || (a.file_name() != agent
                    && a.path().join(format!("{PARTIAL_PREFIX}{name}")).exists())
        })
    }

    /// The name's claim when nothing else holds the name: no box of it and no other verb's claim
    /// in any agent's directory (create checks the same after claiming, so of two verbs racing
    /// for one name in different agents' directories at least one sees the other).
    pub fn claim_unowned_name(
        &self,
        agent: &str,
        name: &str,
    ) -> Result<Option<NameClaim>, BoxError> {
        let Some(claim) = self.claim_name(agent, name)? else {
            return Ok(None);
        };
        if self.name_taken_beside(name, agent) {
            claim.release()?;
            return Ok(None);
        }
        Ok(Some(claim))
    }

    /// Delete `refs/h5i/boxes/NAME/base` when no box of that name exists (a verb killed between
    /// the ref and the directory). The caller holds the name's claim.
    pub fn drop_orphan_pin(&self, name: &str) -> Result<(), BoxError> {
        if self.box_named(name) {
            return Ok(());
        }
        crate::pin::BoxPin::new(&self.common_dir, name).remove()
    }

    /// Every name `refs/h5i/boxes/` pins in this repository.
    pub fn pinned_names(&self) -> Result<Vec<String>, BoxError> {
        let refs = crate::git::Git::at(&self.common_dir)
            .args(["for-each-ref", "--format=%(refname)", "refs/h5i/boxes/"])
            .text()?;
        Ok(refs
            .lines()
            .filter_map(|r| r.strip_prefix("refs/h5i/boxes/")?.strip_suffix("/base"))
            .filter(|n| validate_name(n).is_ok())
            .map(str::to_owned)
            .collect())
    }

    fn box_named(&self, name: &str) -> bool {
        fs::read_dir(self.env_root()).is_ok_and(|agents| {
            agents
                .flatten()
                .any(|a| a.path().join(name).join("manifest.json").exists())
        })
    }

    /// Every complete box, sorted by name.
    pub fn list(&self) -> Result<Vec<StoredBox>, BoxError> {
        let mut out = Vec::new();
        let root = self.env_root();
        let agents = match fs::read_dir(&root) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(source) => return Err(BoxError::io(&root, source)),
        };
        for agent in agents {
            let agent = agent.map_err(|e| BoxError::io(&root, e))?;
            if !agent.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                continue;
            }
            let adir = agent.path();
            for entry in fs::read_dir(&adir).map_err(|e| BoxError::io(&adir, e))? {
                let entry = entry.map_err(|e| BoxError::io(&adir, e))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') {
                    continue;
                }
                let paths = BoxPaths { dir: entry.path() };
                let manifest = read_manifest(&paths)?;
                out.push(StoredBox { paths, manifest });
            }
        }
        out.sort_by(|a, b| a.manifest.name.cmp(&b.manifest.name));
        Ok(out)
    }

    /// The box called `name`.
    pub fn find(&self, name: &str) -> Result<StoredBox, BoxError> {
        validate_name(name)?;
        let root = self.env_root();
        if let Ok(agents) = fs::read_dir(&root) {
            for agent in agents.flatten() {
                let paths = BoxPaths {
                    dir: agent.path().join(name),
                };
                if paths.manifest().is_file() {
                    let manifest = read_manifest(&paths)?;
                    return Ok(StoredBox { paths, manifest });
                }
            }
        }
        Err(BoxError::NoSuchBox {
            name: name.to_string(),
        })
    }

    /// Whether any box (or a box being created) already has this name.
    pub fn name_taken(&self, name: &str) -> bool {
        let root = self.env_root();
        let Ok(agents) = fs::read_dir(&root) else {
            return false;
        };
        agents.flatten().any(|a| {
            a.path().join(name).exists()
                || a.path().join(format!("{PARTIAL_PREFIX}{name}")).exists()
        })
    }
}

/// A create's claim on a name ([`BoxStore::claim_name`]): its staging directory, held locked.
#[derive(Debug)]
pub struct NameClaim {
    _dir: fs::File,
    staging: PathBuf,
}

impl NameClaim {
    /// Give the name back, removing the staging directory a verb other than create held it by.
    pub fn release(self) -> Result<(), BoxError> {
        match fs::remove_dir(&self.staging) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(BoxError::io(&self.staging, e)),
        }
    }
}

/// A directory opened for its lock, never through a symlink.
fn open_dir(path: &Path) -> Result<fs::File, BoxError> {
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| BoxError::io(path, e))
}

/// Whether the staging directory at `path` was left by a create that was killed (nobody holds
/// its lock).
pub fn abandoned_staging(path: &Path) -> bool {
    open_dir(path).is_ok_and(|d| d.try_lock().is_ok())
}

/// A box name must be a plain slug: it becomes a directory and a branch name.
pub fn validate_name(name: &str) -> Result<(), BoxError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_' || b == b'.'
        })
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && !name.contains("..")
        && !name.ends_with(".lock")
        && !name.ends_with('.');
    if ok {
        Ok(())
    } else {
        Err(BoxError::BadName {
            name: name.to_string(),
        })
    }
}

/// Read and parse a box's manifest.
pub fn read_manifest(paths: &BoxPaths) -> Result<Manifest, BoxError> {
    let p = paths.manifest();
    let text = fs::read(&p).map_err(|e| BoxError::io(&p, e))?;
    serde_json::from_slice(&text).map_err(|e| BoxError::Corrupt {
        path: p,
        what: e.to_string(),
    })
}

/// Write a file whole: a temp sibling, fsync, rename. Readers see the old or the new bytes.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), BoxError> {
    let parent = path.parent().unwrap_or(Path::new("."));
    let tmp = parent.join(format!(
        ".{}.tmp-{}",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id()
    ));
    let res = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(e) = res {
        let _ = fs::remove_file(&tmp);
        return Err(BoxError::io(path, e));
    }
    Ok(())
}

/// Save a manifest.
pub fn write_manifest(paths: &BoxPaths, m: &Manifest) -> Result<(), BoxError> {
    let mut bytes = serde_json::to_vec_pretty(m).map_err(|e| BoxError::Corrupt {
        path: paths.manifest(),
        what: e.to_string(),
    })?;
    bytes.push(b'\n');
    write_atomic(&paths.manifest(), &bytes)
}

/// An exclusive lock on one box, held for the length of a lifecycle verb.
pub struct BoxLock {
    _held: FileLock,
}

impl BoxLock {
    /// Take the box's lock exclusively (export, apply, abort, diff), refusing (not waiting)
    /// while a run or another verb holds it, and refusing a box whose rebase was killed
    /// part-way (its tree is between two bases until `box rebase` finishes it).
    pub fn take(paths: &BoxPaths, name: &str) -> Result<BoxLock, BoxError> {
        let lock = Self::lock(paths, name, LockKind::Exclusive)?;
        refuse_mid_rebase(paths, name)?;
        Ok(lock)
    }

    /// Take the box's lock shared, for the length of a run: runs go side by side, and no verb
    /// that reads or moves the whole tree (export, apply, rebase) runs under a live one. A box
    /// mid-rebase is refused, as by [`BoxLock::take`].
    pub fn shared(paths: &BoxPaths, name: &str) -> Result<BoxLock, BoxError> {
        let lock = Self::lock(paths, name, LockKind::Shared)?;
        refuse_mid_rebase(paths, name)?;
        Ok(lock)
    }

    /// Take the box's lock exclusively whether or not a rebase of it was interrupted: for
    /// `rebase` (which finishes it), `rm` (which removes it whole) and `status`'s read-only scan.
    pub fn take_mid_rebase(paths: &BoxPaths, name: &str) -> Result<BoxLock, BoxError> {
        Self::lock(paths, name, LockKind::Exclusive)
    }

    fn lock(paths: &BoxPaths, name: &str, kind: LockKind) -> Result<BoxLock, BoxError> {
        let p = paths.lock();
        match FileLock::try_take(&p, kind) {
            Ok(Some(held)) => Ok(BoxLock { _held: held }),
            Ok(None) => Err(BoxError::Busy {
                name: name.to_string(),
            }),
            Err(e) => Err(BoxError::io(&p, e)),
        }
    }
}

/// Whether a rebase of the box was killed past its commit point (its journal is there).
pub fn rebase_interrupted(paths: &BoxPaths) -> bool {
    paths.rebase_journal().join("journal.json").exists()
}

fn refuse_mid_rebase(paths: &BoxPaths, name: &str) -> Result<(), BoxError> {
    if rebase_interrupted(paths) {
        return Err(BoxError::RebaseInterrupted {
            name: name.to_string(),
        });
    }
    Ok(())
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The box's stored policy, verified against the digest stored beside it. A mismatch is refused,
/// never repaired.
pub fn load_policy(sb: &StoredBox) -> Result<h5i_policy::ResolvedPolicy, BoxError> {
    let p = sb.paths.policy();
    let text = fs::read_to_string(&p).map_err(|e| BoxError::io(&p, e))?;
    let d = sb.paths.digest();
    let digest = fs::read_to_string(&d).map_err(|e| BoxError::io(&d, e))?;
    let digest = digest.trim();
    if digest != sb.manifest.policy_digest {
        return Err(BoxError::PolicyTampered {
            name: sb.manifest.name.clone(),
            detail: "policy.digest differs from the digest recorded at creation".into(),
        });
    }
    h5i_policy::ResolvedPolicy::load_verified(&text, digest).map_err(|e| BoxError::PolicyTampered {
        name: sb.manifest.name.clone(),
        detail: e.to_string(),
    })
}

/// Refuse a verb on a box that is not active.
pub fn require_active(sb: &StoredBox, verb: &'static str) -> Result<(), BoxError> {
    match sb.manifest.state {
        BoxState::Active => Ok(()),
        state => Err(BoxError::WrongState {
            name: sb.manifest.name.clone(),
            state: state.as_str(),
            verb,
            mend: format!(
                "its workspace is kept for forensics; create a new box, or `h5i box rm {}`",
                sb.manifest.name
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain_slugs() {
        for good in ["a", "fix-login", "pr-1234", "web_2.0"] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
        for bad in [
            "", "-x", "A", "a/b", "..", "a..b", "x.lock", "x.", ".hidden", "a b", "é",
        ] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
        assert!(validate_name(&"a".repeat(64)).is_err());
    }
}
