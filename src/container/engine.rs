//! Who runs Podman for the container tier: rootless, always.
//!
//! Owns choosing the engine user and starting `podman` as that user with a clean environment.
//! An unprivileged caller runs its own rootless Podman. Run as root, h5i runs rootless Podman as
//! a configured unprivileged user — `H5I_CONTAINER_USER`, else `user = "NAME"` in
//! [`CONFIG_FILE`] (root-owned, not writable by anyone else; `make setup` names `h5i-test`) — or
//! refuses with that mend. The user must exist, not be root, and hold `/etc/subuid` and
//! `/etc/subgid` ranges; its `XDG_RUNTIME_DIR` (`/run/user/<uid>`) is made when missing, since
//! no login manager makes it on a host without one.
//!
//! Must never: run rootful Podman, hand Podman the caller's environment (it holds the caller's
//! secrets; each secret the box is granted is passed by name only), or accept a configured
//! user that is root or a config file someone else could have written.
//!
//! Guarded by the unit tests below and `tests/container_tier.rs`.

use h5i_log::Traced as _;
use h5i_sys::users::Account;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The root-owned file naming the engine user for root's container-tier runs.
pub const CONFIG_FILE: &str = "/etc/h5i/container.toml";
/// Overrides [`CONFIG_FILE`] for one invocation.
pub const USER_VAR: &str = "H5I_CONTAINER_USER";

/// Why no rootless engine is available.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// Root, and no user configured.
    #[error("refusing: h5i runs as root, and the container tier runs rootless Podman only, but no unprivileged user is configured to run it; to fix: write user = \"NAME\" to {CONFIG_FILE} (a user with /etc/subuid and /etc/subgid ranges; `make setup` configures h5i-test), or set {USER_VAR}=NAME")]
    NoUser,
    /// The configured user is not usable.
    #[error("refusing: the container tier's engine user `{user}` {what}; to fix: {mend}")]
    BadUser {
        /// The user named.
        user: String,
        /// What is wrong.
        what: String,
        /// How to mend it.
        mend: String,
    },
    /// The config file cannot be trusted or read.
    #[error("refusing: {CONFIG_FILE}: {what}; to fix: {mend}")]
    BadConfig {
        /// What is wrong.
        what: String,
        /// How to mend it.
        mend: String,
    },
    /// The caller's own runtime directory is missing.
    #[error("refusing: rootless Podman needs a runtime directory and XDG_RUNTIME_DIR names none that is yours ({detail}); to fix: export XDG_RUNTIME_DIR=/run/user/$(id -u) after making it (mode 0700, owned by you)")]
    NoRuntimeDir {
        /// What was found.
        detail: String,
    },
}

/// The user rootless Podman runs as, and where its per-user state lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Engine {
    /// Its login name.
    pub user: String,
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
    /// Its home directory (Podman's storage and configuration live under it).
    pub home: PathBuf,
    /// Its `XDG_RUNTIME_DIR`.
    pub runtime_dir: PathBuf,
    /// Whether h5i (root) switches to this user to run Podman.
    pub switches_user: bool,
}

impl Engine {
    /// The engine for this caller.
    pub fn for_caller() -> Result<Engine, EngineError> {
        let euid = h5i_sys::ids::euid();
        if euid != 0 {
            let acct = account_by_uid(euid).ok_or_else(|| EngineError::BadUser {
                user: euid.to_string(),
                what: "has no passwd entry".into(),
                mend: "run h5i as a user listed in /etc/passwd".into(),
            })?;
            let runtime_dir = own_runtime_dir(euid)?;
            return Ok(Engine {
                user: acct.name,
                uid: acct.uid,
                gid: acct.gid,
                home: acct.home,
                runtime_dir,
                switches_user: false,
            });
        }
        let name = configured_user(
            std::env::var(USER_VAR).ok().as_deref(),
            Path::new(CONFIG_FILE),
        )?;
        Engine::configured(&name)
    }

    /// The engine for root, as the user `name`.
    fn configured(name: &str) -> Result<Engine, EngineError> {
        let bad = |what: String, mend: String| EngineError::BadUser {
            user: name.to_owned(),
            what,
            mend,
        };
        let acct = account_by_name(name).ok_or_else(|| {
            bad(
                "does not exist".into(),
                format!("create it (`useradd -m {name}` with subordinate ids; `make setup` makes h5i-test) or name another in {CONFIG_FILE}"),
            )
        })?;
        if acct.uid == 0 {
            return Err(bad(
                "is root, and the container tier never runs rootful Podman".into(),
                format!("name an unprivileged user in {CONFIG_FILE}"),
            ));
        }
        for file in ["/etc/subuid", "/etc/subgid"] {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            if !has_subordinate_range(&text, &acct.name, acct.uid) {
                return Err(bad(
                    format!(
                        "has no range in {file}, so rootless Podman cannot map the container's ids"
                    ),
                    format!("add one: echo {}:200000:65536 >> {file}", acct.name),
                ));
            }
        }
        let runtime_dir = PathBuf::from(format!("/run/user/{}", acct.uid));
        ensure_runtime_dir(&runtime_dir, acct.uid, acct.gid).map_err(|what| {
            bad(
                what,
                format!(
                    "make it: install -d -m 700 -o {0} -g {0} {1}",
                    acct.name,
                    runtime_dir.display()
                ),
            )
        })?;
        Ok(Engine {
            user: acct.name,
            uid: acct.uid,
            gid: acct.gid,
            home: acct.home,
            runtime_dir,
            switches_user: true,
        })
    }

    /// `podman` as the engine user: a cleared environment holding only what Podman needs,
    /// working directory `/`, and (run as root) the user's uid, gid and no supplementary
    /// groups.
    pub fn podman(&self) -> Command {
        let mut cmd = Command::new("podman");
        cmd.env_clear()
            .env("HOME", &self.home)
            .env("XDG_RUNTIME_DIR", &self.runtime_dir)
            .env("USER", &self.user)
            .env("LOGNAME", &self.user)
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .current_dir("/");
        for k in [
            "LANG",
            "LC_ALL",
            "TERM",
            "CONTAINERS_CONF",
            "CONTAINERS_STORAGE_CONF",
        ] {
            if let Some(v) = std::env::var_os(k) {
                cmd.env(k, v);
            }
        }
        if self.switches_user {
            // std drops supplementary groups (setgroups(0)) when root sets a uid.
            cmd.uid(self.uid).gid(self.gid);
        }
        cmd
    }

    /// [`Engine::podman`] with `args`, every standard descriptor `/dev/null`: whether it
    /// succeeded (for the verbs whose only answer is their exit status).
    pub fn podman_quiet(&self, args: &[&str]) -> bool {
        self.podman()
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .traced()
            .status()
            .is_ok_and(|s| s.success())
    }
}

/// The engine user's name for root: the variable, else the config file.
fn configured_user(var: Option<&str>, config: &Path) -> Result<String, EngineError> {
    if let Some(v) = var.map(str::trim).filter(|v| !v.is_empty()) {
        return Ok(v.to_owned());
    }
    let meta = match std::fs::symlink_metadata(config) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(EngineError::NoUser),
        Err(e) => {
            return Err(EngineError::BadConfig {
                what: e.to_string(),
                mend: "make it a readable file".into(),
            })
        }
    };
    if !meta.is_file() || meta.uid() != 0 || meta.mode() & 0o022 != 0 {
        return Err(EngineError::BadConfig {
            what: "is not a regular file owned by root and writable only by root".into(),
            mend: format!("chown root:root {0} && chmod 644 {0}", config.display()),
        });
    }
    let text = std::fs::read_to_string(config).map_err(|e| EngineError::BadConfig {
        what: e.to_string(),
        mend: "make it readable".into(),
    })?;
    parse_config(&text)
}

/// `user = "NAME"` (comments and blank lines allowed; nothing else).
fn parse_config(text: &str) -> Result<String, EngineError> {
    let mut user = None;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let value = line
            .strip_prefix("user")
            .map(str::trim_start)
            .and_then(|l| l.strip_prefix('='))
            .map(str::trim)
            .and_then(|v| v.strip_prefix('"'))
            .and_then(|v| v.strip_suffix('"'))
            .filter(|v| {
                !v.is_empty()
                    && v.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            });
        match value {
            Some(v) if user.is_none() => user = Some(v.to_owned()),
            _ => {
                return Err(EngineError::BadConfig {
                    what: format!("line {} is not `user = \"NAME\"` (or a second one)", i + 1),
                    mend: "keep exactly one line user = \"NAME\"".into(),
                })
            }
        }
    }
    user.ok_or(EngineError::NoUser)
}

/// Whether `/etc/subuid`-format `text` gives `name` (or its uid) a non-empty range.
/// The host gid a container gid `gid` below the engine user's own is under `--userns=keep-id`:
/// keep-id maps it to `gid + 1` in the rootless namespace, whose ids from 1 are the engine
/// user's first `/etc/subgid` range (`text`), so the range's start plus `gid`.
fn keep_id_host_gid_in(text: &str, name: &str, uid: u32, gid: u32) -> Option<u32> {
    let uid = uid.to_string();
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.trim().split(':').collect();
        if f.len() != 3 || (f[0] != name && f[0] != uid) {
            return None;
        }
        let start: u32 = f[1].parse().ok()?;
        let count: u32 = f[2].parse().ok()?;
        (gid < count).then(|| start.checked_add(gid)).flatten()
    })
}

impl Engine {
    /// keep-id's mapping for this engine user, spelled out (its first subordinate ranges'
    /// sizes read from `/etc/subuid` and `/etc/subgid`).
    pub fn keep_id_maps(&self) -> Result<super::podman_args::KeepIdMaps, String> {
        let count = |file: &str| -> Result<u32, String> {
            let text =
                std::fs::read_to_string(file).map_err(|e| format!("cannot read {file}: {e}"))?;
            let uid = self.uid.to_string();
            text.lines()
                .find_map(|l| {
                    let f: Vec<&str> = l.trim().split(':').collect();
                    (f.len() == 3 && (f[0] == self.user || f[0] == uid))
                        .then(|| f[2].parse::<u32>().ok())
                        .flatten()
                })
                .ok_or_else(|| format!("`{}` has no range in {file}", self.user))
        };
        Ok(super::podman_args::KeepIdMaps {
            uid: self.uid,
            gid: self.gid,
            subuids: count("/etc/subuid")?,
            subgids: count("/etc/subgid")?,
        })
    }

    /// The host gid of container gid `gid` under `--userns=keep-id` (see
    /// [`keep_id_host_gid_in`]); `gid` must be below the engine user's own gid.
    pub fn keep_id_host_gid(&self, gid: u32) -> Result<u32, String> {
        if gid >= self.gid {
            return Err(format!(
                "gid {gid} is not below the engine user's own gid {}",
                self.gid
            ));
        }
        let text = std::fs::read_to_string("/etc/subgid")
            .map_err(|e| format!("cannot read /etc/subgid: {e}"))?;
        keep_id_host_gid_in(&text, &self.user, self.uid, gid)
            .ok_or_else(|| format!("`{}` has no /etc/subgid range holding {gid}", self.user))
    }
}

fn has_subordinate_range(text: &str, name: &str, uid: u32) -> bool {
    let uid = uid.to_string();
    text.lines().any(|l| {
        let f: Vec<&str> = l.trim().split(':').collect();
        f.len() == 3
            && (f[0] == name || f[0] == uid)
            && f[1].parse::<u64>().is_ok()
            && f[2].parse::<u64>().is_ok_and(|n| n > 0)
    })
}

/// Make `/run/user/<uid>` (0700, owned by the user) when missing; refuse one that is not the
/// user's own private directory.
fn ensure_runtime_dir(dir: &Path, uid: u32, gid: u32) -> Result<(), String> {
    if let Some(parent) = dir.parent() {
        if !parent.exists() {
            std::fs::DirBuilder::new()
                .mode(0o755)
                .recursive(true)
                .create(parent)
                .map_err(|e| format!("cannot make {}: {e}", parent.display()))?;
        }
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => std::os::unix::fs::chown(dir, Some(uid), Some(gid))
            .map_err(|e| format!("cannot chown {}: {e}", dir.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot make {}: {e}", dir.display())),
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|e| e.to_string())?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(format!(
            "has a runtime directory {} that is not its own private directory",
            dir.display()
        ));
    }
    Ok(())
}

/// The caller's own runtime directory: `XDG_RUNTIME_DIR`, else `/run/user/<uid>`, when it is
/// the caller's private directory.
fn own_runtime_dir(uid: u32) -> Result<PathBuf, EngineError> {
    let candidate = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| PathBuf::from(format!("/run/user/{uid}")));
    match std::fs::symlink_metadata(&candidate) {
        Ok(m) if m.is_dir() && m.uid() == uid && m.mode() & 0o077 == 0 => Ok(candidate),
        Ok(_) => Err(EngineError::NoRuntimeDir {
            detail: format!(
                "{} is not a private directory of yours",
                candidate.display()
            ),
        }),
        Err(e) => Err(EngineError::NoRuntimeDir {
            detail: format!("{}: {e}", candidate.display()),
        }),
    }
}

/// The password entry of `name` (a failed lookup counts as none: the caller refuses either way).
fn account_by_name(name: &str) -> Option<Account> {
    h5i_sys::users::by_name(name).ok().flatten()
}

/// The password entry of `uid`.
fn account_by_uid(uid: u32) -> Option<Account> {
    h5i_sys::users::by_uid(uid).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_id_puts_a_low_container_gid_at_the_first_subgid_range_plus_that_gid() {
        // As measured: `podman run --userns=keep-id --user 1001:1` shows gid 1 -> 2 in the
        // rootless namespace, whose 1.. are h5i-test's 265536...
        let text = "h5i-box:200000:65536\nh5i-test:265536:65536\n1002:400000:10\n";
        assert_eq!(
            keep_id_host_gid_in(text, "h5i-test", 1001, 1),
            Some(265_537)
        );
        assert_eq!(keep_id_host_gid_in(text, "other", 1002, 1), Some(400_001));
        assert_eq!(keep_id_host_gid_in(text, "other", 1002, 10), None);
        assert_eq!(keep_id_host_gid_in(text, "nobody", 7, 1), None);
    }

    #[test]
    fn the_config_names_exactly_one_user() {
        assert_eq!(
            parse_config("# engine user\nuser = \"h5i-test\"\n").unwrap(),
            "h5i-test"
        );
        assert_eq!(parse_config("\n# nothing\n"), Err(EngineError::NoUser));
        for bad in [
            "user = h5i-test\n",
            "user = \"a b\"\n",
            "user = \"a\"\nuser = \"b\"\n",
            "group = \"x\"\n",
            "user = \"\"\n",
            "user = \"$(id)\"\n",
        ] {
            assert!(
                matches!(parse_config(bad), Err(EngineError::BadConfig { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_variable_wins_and_a_missing_file_means_no_user() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("container.toml");
        assert_eq!(
            configured_user(Some("h5i-test"), &missing).unwrap(),
            "h5i-test"
        );
        assert_eq!(configured_user(None, &missing), Err(EngineError::NoUser));
        assert_eq!(
            configured_user(Some("  "), &missing),
            Err(EngineError::NoUser)
        );
    }

    #[test]
    fn a_config_file_others_could_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("container.toml");
        std::fs::write(&f, "user = \"h5i-test\"\n").unwrap();
        std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
        assert!(matches!(
            configured_user(None, &f),
            Err(EngineError::BadConfig { .. })
        ));
    }

    #[test]
    fn subordinate_ranges_match_by_name_or_uid() {
        let text = "alice:100000:65536\n1001:300000:65536\nbob:400000:0\n";
        assert!(has_subordinate_range(text, "alice", 1000));
        assert!(has_subordinate_range(text, "carol", 1001));
        assert!(
            !has_subordinate_range(text, "bob", 1002),
            "an empty range maps nothing"
        );
        assert!(!has_subordinate_range(text, "dave", 1003));
    }

    #[test]
    fn the_engine_never_inherits_the_callers_environment() {
        let e = Engine {
            user: "u".into(),
            uid: 1001,
            gid: 1001,
            home: "/home/u".into(),
            runtime_dir: "/run/user/1001".into(),
            switches_user: true,
        };
        let cmd = e.podman();
        let envs: Vec<String> = cmd
            .get_envs()
            .filter_map(|(k, v)| v.map(|_| k.to_string_lossy().into_owned()))
            .collect();
        for k in &envs {
            assert!(
                [
                    "HOME",
                    "XDG_RUNTIME_DIR",
                    "USER",
                    "LOGNAME",
                    "PATH",
                    "LANG",
                    "LC_ALL",
                    "TERM",
                    "CONTAINERS_CONF",
                    "CONTAINERS_STORAGE_CONF"
                ]
                .contains(&k.as_str()),
                "{k} leaked into Podman's environment"
            );
        }
    }
}
