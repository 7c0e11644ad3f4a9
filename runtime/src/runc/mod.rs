//! `h5i-runc`: an OCI runtime CLI over youki's `libcontainer`, one small module per verb.
//!
//! Owns the runtime's state directory (default `/run/h5i-runc` for real root,
//! `$XDG_RUNTIME_DIR/h5i-runc` otherwise), container lookup with runc's "does not exist"
//! wording (Podman matches on it), the cgroup placement rule (never a `:youki:<id>` at the top of
//! a hierarchy: `cgroup.rs`), h5i's sidecar state (`sidecar.rs`), the supervised network's directory
//! for specs that name none (`net_dir.rs`) and the socket gate merged into them (`gate.rs`),
//! the sealed re-exec (`seal.rs`), and logging. Every container gets
//! `confine::executor::H5iExecutor`, which applies the `h5i.*` annotations and is plain OCI
//! without them.
//!
//! Must never: touch a container before running from the sealed copy (the binary does that
//! first), create a cgroup outside the caller's own cgroup unless the spec names one, or leave
//! a sidecar behind after `delete`. Guarded by the unit tests in each module and by
//! `tests/runc.rs` (every verb, as root, against busybox bundles) and `tests/podman.rs`.

pub mod cgroup;
pub mod create;
pub mod delete;
pub mod exec;
pub mod features;
pub mod foreground;
pub mod gate;
pub mod idmap;
pub mod kill;
pub mod logging;
pub mod net_dir;
pub mod pause;
pub mod ps;
pub mod resume;
pub mod run;
pub mod seal;
pub mod sidecar;
pub mod spec_copy;
pub mod stage;
pub mod start;
pub mod state;

use std::io;
use std::path::{Path, PathBuf};

use libcontainer::container::Container;
use libcontainer::error::LibcontainerError;

/// Name of the state subdirectory under `/run` or `$XDG_RUNTIME_DIR`.
pub const STATE_DIR_NAME: &str = "h5i-runc";

/// Errors of the runtime verbs. Messages name the object and, where there is one, the mend.
#[derive(Debug, thiserror::Error)]
pub enum RuncError {
    /// The state directory holds no such container. Podman matches on "does not exist".
    #[error("container {id} does not exist")]
    NotFound {
        /// The container id asked for.
        id: String,
    },
    /// The container id is not a safe file name.
    #[error("refusing: invalid container id {id:?}: {reason}; to fix: use letters, digits, '_', '+', '-', '.'")]
    InvalidId {
        /// The id given.
        id: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// `--systemd-cgroup` was given.
    #[error("refusing: --systemd-cgroup is not supported: h5i-runc drives cgroupfs directly{detail}; to fix: drop the flag (Podman: cgroup_manager = \"cgroupfs\")")]
    SystemdCgroup {
        /// Whether systemd is even running here.
        detail: &'static str,
    },
    /// Not real root and no `XDG_RUNTIME_DIR`.
    #[error("refusing: no state directory: not running as root and XDG_RUNTIME_DIR is unset; to fix: pass --root DIR or set XDG_RUNTIME_DIR")]
    NoStateDir,
    /// A file-system step failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The bundle's config.json could not be read or written.
    #[error("bundle {path}: {source}")]
    Spec {
        /// The config.json path.
        path: PathBuf,
        /// The parser's error.
        source: libcontainer::oci_spec::OciSpecError,
    },
    /// The signal name or number is not one libcontainer knows.
    #[error("refusing: invalid signal {0:?}; to fix: use a name (TERM, SIGKILL) or a number 1-31")]
    Signal(String),
    /// Rootless on cgroup v1 with resource limits in the spec.
    #[error("refusing: rootless on cgroup v1 cannot hold the spec's resource limits (libcontainer also writes device rules, which need real root); to fix: drop the limits, run as root, or use cgroup v2")]
    RootlessV1Limits,
    /// Staging mount sources for a container whose root is not host root failed.
    #[error(transparent)]
    Stage(#[from] stage::StageError),
    /// Cgroup placement or cleanup failed.
    #[error(transparent)]
    Cgroup(#[from] cgroup::CgroupError),
    /// The sealed re-exec failed.
    #[error(transparent)]
    Seal(#[from] seal::SealError),
    /// The id-map helpers could not be set up.
    #[error(transparent)]
    Idmap(#[from] idmap::IdmapError),
    /// The spec copy the bundle asked for could not be written.
    #[error(transparent)]
    SpecCopy(#[from] spec_copy::SpecCopyError),
    /// Logging could not be set up.
    #[error("cannot open log file {path}: {source}")]
    Log {
        /// The --log path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// libcontainer refused or failed.
    #[error("container {id}: {source}")]
    Container {
        /// The container id.
        id: String,
        /// libcontainer's error.
        #[source]
        source: LibcontainerError,
    },
    /// Waiting for a container process failed.
    #[error("waiting for container {id}: {source}")]
    Wait {
        /// The container id.
        id: String,
        /// The OS error.
        source: io::Error,
    },
    /// The supervised network's socket gate could not be put into the bundle.
    #[error(transparent)]
    Gate(#[from] gate::GateInjectError),
    /// `exec` into a container with the socket gate could not reach the gate.
    #[error("refusing: exec into container {id}: {reason}; to fix: check that the box's network sentry is running (its socket gate must serve the exec'd process)")]
    GateExec {
        /// The container id.
        id: String,
        /// What failed.
        reason: String,
    },
    /// Listing a container's processes failed.
    #[error("container {id}: cannot list processes: {reason}")]
    Ps {
        /// The container id.
        id: String,
        /// Why.
        reason: String,
    },
}

impl RuncError {
    pub(crate) fn container(id: &str) -> impl FnOnce(LibcontainerError) -> RuncError + '_ {
        move |source| RuncError::Container {
            id: id.to_string(),
            source,
        }
    }

    pub(crate) fn io(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> RuncError {
        let path = path.to_path_buf();
        move |source| RuncError::Io { what, path, source }
    }
}

/// Global options every verb shares (already validated).
#[derive(Debug, Clone)]
pub struct Context {
    /// The state directory.
    pub root: PathBuf,
}

impl Context {
    /// Resolve the state directory and refuse what this runtime cannot do.
    pub fn new(root: Option<PathBuf>, systemd_cgroup: bool) -> Result<Self, RuncError> {
        if systemd_cgroup {
            let detail = if Path::new("/run/systemd/system").exists() {
                ""
            } else {
                " and systemd is not running on this host"
            };
            return Err(RuncError::SystemdCgroup { detail });
        }
        let root = match root {
            Some(root) => root,
            None => default_root(
                is_real_root(),
                std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
            )?,
        };
        Ok(Self { root })
    }

    /// Create the state directory (mode 0700) if needed.
    pub fn ensure_root(&self) -> Result<(), RuncError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.root)
            .map_err(RuncError::io("cannot create state directory", &self.root))
    }

    /// Load a container's state, or say it does not exist.
    pub fn load(&self, id: &str) -> Result<Container, RuncError> {
        validate_id(id)?;
        let dir = self.root.join(id);
        if !dir.join("state.json").exists() {
            return Err(RuncError::NotFound { id: id.to_string() });
        }
        Container::load(dir).map_err(RuncError::container(id))
    }
}

/// An error and its causes in one line (`a: b: c`), skipping a cause whose text is already
/// there (libcontainer's messages often embed their source's).
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = String::new();
    let mut next = Some(err);
    while let Some(cause) = next {
        let text = cause.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
        next = cause.source();
    }
    out
}

/// The config.json a container was created from: h5i-runc's shadow when it adjusted the spec
/// (see `sidecar`), else the bundle's own. Its bundle stays the caller's either way.
pub fn spec_path(container: &Container) -> PathBuf {
    container
        .state
        .config
        .clone()
        .unwrap_or_else(|| container.bundle().join("config.json"))
}

/// The default state directory: `/run/h5i-runc` for root outside a user namespace, else
/// `$XDG_RUNTIME_DIR/h5i-runc` (rootless Podman runs us as uid 0 inside its user namespace).
pub fn default_root(
    real_root: bool,
    xdg_runtime_dir: Option<PathBuf>,
) -> Result<PathBuf, RuncError> {
    if real_root {
        return Ok(Path::new("/run").join(STATE_DIR_NAME));
    }
    match xdg_runtime_dir {
        Some(dir) if !dir.as_os_str().is_empty() => Ok(dir.join(STATE_DIR_NAME)),
        _ => Err(RuncError::NoStateDir),
    }
}

/// Effective uid 0 in the initial user namespace.
pub fn is_real_root() -> bool {
    let euid = h5i_sys::ids::euid();
    euid == 0 && !in_user_namespace()
}

/// True when `/proc/self/uid_map` is not the identity map of the initial user namespace.
pub fn in_user_namespace() -> bool {
    match std::fs::read_to_string("/proc/self/uid_map") {
        Ok(map) => !is_initial_uid_map(&map),
        Err(_) => false,
    }
}

fn is_initial_uid_map(map: &str) -> bool {
    let fields: Vec<&str> = map.split_whitespace().collect();
    fields == ["0", "0", "4294967295"]
}

/// Check a container id the way libcontainer will, before it becomes a path.
pub fn validate_id(id: &str) -> Result<(), RuncError> {
    let bad = |reason| {
        Err(RuncError::InvalidId {
            id: id.to_string(),
            reason,
        })
    };
    if id.is_empty() {
        return bad("empty");
    }
    if id == "." || id == ".." {
        return bad("not a file name");
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '+' | '-' | '.'))
    {
        return bad("contains a character other than letters, digits, '_', '+', '-', '.'");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_root_for_root_and_users() {
        assert_eq!(
            default_root(true, None).unwrap(),
            PathBuf::from("/run/h5i-runc")
        );
        assert_eq!(
            default_root(false, Some("/run/user/1000".into())).unwrap(),
            PathBuf::from("/run/user/1000/h5i-runc")
        );
        assert!(matches!(
            default_root(false, None),
            Err(RuncError::NoStateDir)
        ));
        assert!(matches!(
            default_root(false, Some("".into())),
            Err(RuncError::NoStateDir)
        ));
    }

    #[test]
    fn identity_uid_map_is_the_initial_namespace() {
        assert!(is_initial_uid_map("         0          0 4294967295\n"));
        assert!(!is_initial_uid_map("         0       1000          1\n"));
    }

    #[test]
    fn ids_that_could_escape_the_state_dir_are_refused() {
        for bad in ["", ".", "..", "a/b", "../x", "a b", "x\0"] {
            assert!(validate_id(bad).is_err(), "{bad:?}");
        }
        for good in ["abc", "A-1.2_3+4", "..."] {
            assert!(validate_id(good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn not_found_wording_is_what_podman_matches() {
        let e = RuncError::NotFound { id: "x".into() };
        assert!(e.to_string().contains("does not exist"));
    }

    #[test]
    fn systemd_cgroup_is_refused_with_a_mend() {
        let e = Context::new(Some("/tmp".into()), true).unwrap_err();
        assert!(e.to_string().contains("cgroupfs"));
    }
}
