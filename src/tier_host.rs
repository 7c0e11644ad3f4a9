//! What the kernel and container tiers find on this host before they start anything: h5i's own
//! binaries (`h5i-runc`, `h5i-hook`, found beside `h5i` or on PATH), the caller's private
//! runtime directory, h5i-runc's state directory, the init a box's command runs under
//! (catatonit), and whether runs may use the box-lifetime sandbox (`H5I_SANDBOX`).
//!
//! A leaf: the tiers, the session, the credential proxies and the probes all ask it, and it
//! names none of them (`tests/module_layers.rs`).
//!
//! Must never: hand out a runtime directory that is not the caller's own, mode 0700.
//!
//! Guarded by the tier suites (`process_tier`, `supervised_tier`, `container_tier`) that run
//! through every one of these.

use std::path::{Path, PathBuf};

use crate::error::BoxError;

/// Where one of h5i's own binaries is: beside this `h5i` binary, else on PATH.
fn own_binary(name: &str) -> Option<PathBuf> {
    let sibling = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(name)))
        .filter(|p| p.is_file());
    sibling.or_else(|| {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
    })
}

/// Where `h5i-runc` is.
pub fn runc_binary() -> Option<PathBuf> {
    own_binary("h5i-runc")
}

/// Where `h5i-hook` is.
pub fn hook_binary() -> Option<PathBuf> {
    own_binary("h5i-hook")
}

/// h5i's private runtime directory for this caller (mode 0700): `/run/h5i` as root,
/// `$XDG_RUNTIME_DIR/h5i` otherwise, else `/tmp/h5i-<uid>`. Holds per-run bundles and secret
/// files, never anything that outlives a run.
pub fn runtime_dir() -> Result<PathBuf, BoxError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let uid = h5i_sys::ids::euid();
    let dir = if uid == 0 {
        PathBuf::from("/run/h5i")
    } else {
        match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(d) if Path::new(&d).is_dir() => Path::new(&d).join("h5i"),
            _ => std::env::temp_dir().join(format!("h5i-{uid}")),
        }
    };
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(BoxError::io(&dir, e)),
    }
    let meta = std::fs::symlink_metadata(&dir).map_err(|e| BoxError::io(&dir, e))?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(BoxError::BadRequest {
            what: format!("{} is not a private directory of yours", dir.display()),
            mend: format!(
                "remove it (h5i recreates it with mode 0700): rm -rf {}",
                dir.display()
            ),
        });
    }
    Ok(dir)
}

/// The state directory h5i-runc should use for this caller.
pub(crate) fn runc_root() -> Option<PathBuf> {
    if h5i_sys::ids::euid() == 0 {
        return None;
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if Path::new(&d).is_dir() => None,
        _ => Some(std::env::temp_dir().join(format!("h5i-runc-{}", h5i_sys::ids::euid()))),
    }
}

/// Where Podman's packages put catatonit, the init `--init` runs as a box's pid 1.
const INIT_PROGRAMS: [&str; 3] = [
    "/usr/libexec/podman/catatonit",
    "/usr/bin/catatonit",
    "/usr/local/bin/catatonit",
];

/// What is wrong when the box's init is missing, and the mend.
pub const NO_INIT: (&str, &str) = (
    "catatonit (the init a box's command runs under, so signals reach it: at the container tier, and at process and supervised outside the box-lifetime sandbox) is not installed",
    "install it (Debian and Ubuntu: apt-get install catatonit)",
);

/// The init program for `podman run --init --init-path`, if installed.
pub fn init_program() -> Option<PathBuf> {
    INIT_PROGRAMS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// Whether runs may use the box-lifetime sandbox (`crate::sandbox`): on unless
/// `H5I_SANDBOX=off` (the per-run container path).
pub fn enabled() -> bool {
    std::env::var_os("H5I_SANDBOX").is_none_or(|v| v != "off")
}
