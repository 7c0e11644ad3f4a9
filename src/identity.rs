//! Who a box is on the host: the ids its users map to, and the owner of what it may write.
//!
//! An unprivileged caller's box is that caller (box uid 0 = the caller, one id mapped). A root
//! caller's box is never root: its users map to the subordinate range of the system user
//! [`BOX_USER`] (`/etc/subuid`, `/etc/subgid`), and everything the box may write (workspace,
//! HOME, spool) is owned on disk by the range's first id, so a file the box makes is owned on
//! the host by an id that owns nothing else: owner permission bits on host files (`/etc/shadow`
//! and every other root-only file) then refuse the box, and a set-id file it makes is set-id to
//! nobody.
//!
//! Owns: reading the range ([`BoxIdentity::lookup`]), the mapping a run uses
//! ([`Mapping::for_caller`]), making the user ([`ensure_user`]; `h5i host setup` calls it, then
//! gives the user its ranges through `host::subids`), and handing a tree to the range without
//! following anything planted in it ([`own_tree`]).
//!
//! Must never: map a root caller's box to uid 0, guess a range that `/etc/subuid` does not
//! hand to [`BOX_USER`], or follow a symlink while changing an owner.
//!
//! Guarded by the unit tests below and `tests/identity.rs`.

use h5i_log::Traced as _;
use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The system user whose subordinate range a root caller's boxes run as.
pub const BOX_USER: &str = "h5i-box";

/// Where the subordinate ranges are read from.
pub const SUBUID: &str = "/etc/subuid";
/// See [`SUBUID`].
pub const SUBGID: &str = "/etc/subgid";

/// The mend every missing-identity refusal names.
const SETUP_MEND: &str = "sudo h5i host setup";

/// Why the box identity is unusable.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The system user does not exist.
    #[error("refusing: h5i runs as root but the system user `{BOX_USER}` (whose subordinate ids a root caller's boxes run as, never root) does not exist; to fix: {SETUP_MEND}")]
    NoUser,
    /// The user has no (or an unusable) range in one of the files.
    #[error("refusing: `{BOX_USER}` has no usable subordinate range in {file} ({detail}); to fix: {SETUP_MEND}")]
    NoRange {
        /// `/etc/subuid` or `/etc/subgid`.
        file: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// A file could not be read or written.
    #[error("refusing: cannot {what} {path}: {source}; to fix: {SETUP_MEND}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// `useradd` failed.
    #[error("refusing: cannot create the system user `{BOX_USER}` ({detail}); to fix: create it by hand: useradd --system --no-create-home --shell /usr/sbin/nologin {BOX_USER}")]
    UserAdd {
        /// useradd's complaint.
        detail: String,
    },
    /// A box tree belongs to someone else.
    #[error("refusing: {path} is owned by uid {uid}, neither root (a box made before box identity, which h5i migrates) nor the box range's first id {want}; to fix: remove the box (`h5i box rm NAME`) and create it again")]
    Foreign {
        /// The tree.
        path: PathBuf,
        /// Its owner.
        uid: u32,
        /// The range's first uid.
        want: u32,
    },
    /// A tree could not be handed to the range.
    #[error("refusing: cannot give {path} to the box's ids {uid}:{gid} ({source}); to fix: check that the file system holding the box supports chown, and that nothing else holds the box")]
    Own {
        /// Where it failed.
        path: PathBuf,
        /// The owner asked for.
        uid: u32,
        /// The group asked for.
        gid: u32,
        /// The OS error.
        source: io::Error,
    },
}

/// The range [`BOX_USER`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoxIdentity {
    /// First subordinate uid: the box's uid 0.
    pub uid: u32,
    /// First subordinate gid: the box's gid 0.
    pub gid: u32,
    /// How many ids both ranges map (the smaller of the two).
    pub count: u32,
}

/// The user mapping of one run: box id 0 is host `uid`/`gid`, `count` ids in a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    /// Host uid of the box's uid 0.
    pub uid: u32,
    /// Host gid of the box's gid 0.
    pub gid: u32,
    /// How many ids are mapped.
    pub count: u32,
    /// Whether this is [`BOX_USER`]'s range (a root caller): what the box may write must then
    /// be handed to it.
    pub range: bool,
}

impl Mapping {
    /// The mapping for this caller: root gets [`BOX_USER`]'s range (refused when it is not set
    /// up), anyone else is their own box root, one id.
    pub fn for_caller() -> Result<Mapping, IdentityError> {
        if h5i_sys::ids::euid() == 0 {
            let id = BoxIdentity::lookup()?;
            return Ok(Mapping {
                uid: id.uid,
                gid: id.gid,
                count: id.count,
                range: true,
            });
        }
        let (uid, gid) = (h5i_sys::ids::uid(), h5i_sys::ids::gid());
        Ok(Mapping {
            uid,
            gid,
            count: 1,
            range: false,
        })
    }

    /// Hand each of `trees` (what the box may write: workspace, HOME, spool) to this range.
    /// Nothing to do for a caller's own box.
    pub fn own(&self, trees: &[PathBuf]) -> Result<(), IdentityError> {
        if !self.range {
            return Ok(());
        }
        for t in trees {
            own_tree(t, self.uid, self.gid)?;
        }
        Ok(())
    }

    /// Before a run: check that the box's `trees` belong to this range and that `box_dir` is
    /// 0700. A box made before box identity (its trees root's) is migrated once, here: re-owned
    /// with [`own_tree`]; returns true when it was. Any other owner is refused.
    pub fn hold(&self, box_dir: &Path, trees: &[PathBuf]) -> Result<bool, IdentityError> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        if !self.range {
            return Ok(false);
        }
        let mut migrate = Vec::new();
        for t in trees {
            let meta = match std::fs::symlink_metadata(t) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(source) => {
                    return Err(IdentityError::Io {
                        what: "inspect",
                        path: t.clone(),
                        source,
                    })
                }
            };
            match meta.uid() {
                u if u == self.uid => {}
                0 => migrate.push(t.clone()),
                other => {
                    return Err(IdentityError::Foreign {
                        path: t.clone(),
                        uid: other,
                        want: self.uid,
                    })
                }
            }
        }
        let meta = std::fs::symlink_metadata(box_dir).map_err(|source| IdentityError::Io {
            what: "inspect",
            path: box_dir.to_path_buf(),
            source,
        })?;
        if meta.mode() & 0o777 != 0o700 {
            std::fs::set_permissions(box_dir, std::fs::Permissions::from_mode(0o700)).map_err(
                |source| IdentityError::Io {
                    what: "make private (0700)",
                    path: box_dir.to_path_buf(),
                    source,
                },
            )?;
        }
        self.own(&migrate)?;
        Ok(!migrate.is_empty())
    }
}

impl BoxIdentity {
    /// Read [`BOX_USER`]'s ranges from `/etc/passwd`, `/etc/subuid` and `/etc/subgid`.
    pub fn lookup() -> Result<BoxIdentity, IdentityError> {
        if !user_exists(BOX_USER)? {
            return Err(IdentityError::NoUser);
        }
        let read = |file: &'static str| {
            std::fs::read_to_string(file).map_err(|source| IdentityError::Io {
                what: "read",
                path: file.into(),
                source,
            })
        };
        let (uid, ucount) =
            range_in(&read(SUBUID)?, BOX_USER).map_err(|detail| IdentityError::NoRange {
                file: SUBUID,
                detail,
            })?;
        let (gid, gcount) =
            range_in(&read(SUBGID)?, BOX_USER).map_err(|detail| IdentityError::NoRange {
                file: SUBGID,
                detail,
            })?;
        Ok(BoxIdentity {
            uid,
            gid,
            count: ucount.min(gcount),
        })
    }
}

/// `name`'s first range in a subordinate-id file's `text`: `(start, count)`. Refuses a range
/// that would reach id 0 or wrap, and a name listed by number only.
pub fn range_in(text: &str, name: &str) -> Result<(u32, u32), String> {
    for line in text.lines() {
        let fields: Vec<&str> = line.trim().split(':').collect();
        if fields.len() != 3 || fields[0] != name {
            continue;
        }
        let (Ok(start), Ok(count)) = (fields[1].parse::<u32>(), fields[2].parse::<u32>()) else {
            return Err(format!("`{line}` is not name:start:count"));
        };
        if start == 0 || count == 0 || start.checked_add(count).is_none() {
            return Err(format!(
                "`{line}` starts at 0, is empty, or runs past the last id"
            ));
        }
        return Ok((start, count));
    }
    Err(format!("no line `{name}:START:COUNT`"))
}

fn user_exists(name: &str) -> Result<bool, IdentityError> {
    h5i_sys::users::by_name(name)
        .map(|u| u.is_some())
        .map_err(|source| IdentityError::Io {
            what: "look up the user in",
            path: "/etc/passwd".into(),
            source,
        })
}

/// Where a root caller's box hands a listener back to h5i (a createContainer hook that runs as
/// the box's root, which cannot reach h5i's root-only runtime directory): `/run/h5i-handoff`
/// (root's, 0711: traversable, not listable) / `<uid>` (the range's, 0700). Sockets in it are
/// the range's, mode 0600 ([`crate::credentials::HandoffPlace`]). Only the box range's
/// processes reach it, and those are boxes, which do not see `/run`.
pub fn handoff_dir(uid: u32, gid: u32) -> Result<PathBuf, IdentityError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let top = Path::new("/run/h5i-handoff");
    let dir = top.join(uid.to_string());
    for (d, mode, owner) in [(top, 0o711, (0, 0)), (dir.as_path(), 0o700, (uid, gid))] {
        let io_err = |what, source| IdentityError::Io {
            what,
            path: d.to_path_buf(),
            source,
        };
        match std::fs::DirBuilder::new().mode(mode).create(d) {
            Ok(()) => std::os::unix::fs::lchown(d, Some(owner.0), Some(owner.1))
                .map_err(|e| io_err("give to the box's ids", e))?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err("create", e)),
        }
        let meta = std::fs::symlink_metadata(d).map_err(|e| io_err("inspect", e))?;
        if !meta.is_dir() || meta.uid() != owner.0 || meta.mode() & 0o7777 != mode {
            return Err(io_err(
                "use",
                io::Error::other(format!(
                    "not a directory of uid {} with mode {mode:o}; remove it (h5i makes it again)",
                    owner.0
                )),
            ));
        }
    }
    Ok(dir)
}

/// Make [`BOX_USER`] (a system user with no login and no home) when it is missing; true when it
/// was made. Its ranges are `h5i host setup`'s (`host::subids`). Needs root.
pub fn ensure_user() -> Result<bool, IdentityError> {
    if user_exists(BOX_USER)? {
        return Ok(false);
    }
    let out = std::process::Command::new("useradd")
        .args([
            "--system",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            "-K",
            "SUB_UID_COUNT=0",
            "-K",
            "SUB_GID_COUNT=0",
            BOX_USER,
        ])
        .traced()
        .output()
        .map_err(|e| IdentityError::UserAdd {
            detail: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(IdentityError::UserAdd {
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(true)
}

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::other("NUL in a file name"))
}

fn open_dir_at(dir: impl AsFd, name: &CStr) -> io::Result<OwnedFd> {
    use rustix::fs::OFlags;
    // O_NOFOLLOW refuses a symlink as the last component.
    Ok(rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?)
}

/// Hand the tree at `root` (a directory) to `uid:gid`: every entry beneath it, walked by
/// directory descriptor (`openat(O_NOFOLLOW | O_DIRECTORY)`), changed with
/// `fchownat(AT_SYMLINK_NOFOLLOW)`. A symlink is re-owned itself and never followed, so a tree
/// the box already wrote cannot steer the walk outside it. `root` itself must not be a symlink.
/// Set-id bits of re-owned files are cleared by the kernel on the change of owner.
pub fn own_tree(root: &Path, uid: u32, gid: u32) -> Result<(), IdentityError> {
    let err = |path: &Path, source| IdentityError::Own {
        path: path.to_path_buf(),
        uid,
        gid,
        source,
    };
    let c = cstr(root.as_os_str()).map_err(|e| err(root, e))?;
    let top = open_dir_at(rustix::fs::CWD, &c).map_err(|e| err(root, e))?;
    h5i_sys::fs::chown_nofollow(&top, c"", uid, gid).map_err(|e| err(root, e))?;
    let mut stack = vec![(top, root.to_path_buf())];
    while let Some((dir, path)) = stack.pop() {
        let entries = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))
            .map_err(|e| err(&path, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| err(&path, e))?;
            let name = entry.file_name();
            let here = path.join(&name);
            let c = cstr(&name).map_err(|e| err(&here, e))?;
            h5i_sys::fs::chown_nofollow(&dir, &c, uid, gid).map_err(|e| err(&here, e))?;
            // file_type() comes from the directory entry: a symlink is never a directory here.
            if entry.file_type().map_err(|e| err(&here, e))?.is_dir() {
                stack.push((open_dir_at(&dir, &c).map_err(|e| err(&here, e))?, here));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_range_of_the_name_is_read() {
        let text = "h5i-test:200000:65536\nh5i-box:265536:65536\nh5i-box:9:9\n";
        assert_eq!(range_in(text, BOX_USER), Ok((265536, 65536)));
        assert!(range_in(text, "nobody").is_err());
    }

    #[test]
    fn a_range_reaching_root_or_wrapping_is_refused() {
        for bad in [
            "h5i-box:0:65536",
            "h5i-box:100000:0",
            "h5i-box:4294967295:2",
            "h5i-box:x:1",
            "h5i-box:-1:1",
        ] {
            assert!(range_in(bad, BOX_USER).is_err(), "{bad}");
        }
    }

    #[test]
    fn own_tree_never_follows_a_planted_symlink() {
        if h5i_sys::ids::euid() != 0 {
            h5i_testsupport::skipped!(
                "own_tree_never_follows_a_planted_symlink needs root to chown"
            );
            return;
        }
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("victim"), "x").unwrap();
        let tree = tempfile::tempdir().unwrap();
        std::fs::create_dir(tree.path().join("d")).unwrap();
        std::fs::write(tree.path().join("d/f"), "y").unwrap();
        std::os::unix::fs::symlink(outside.path(), tree.path().join("d/link")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("victim"), tree.path().join("l2")).unwrap();
        own_tree(tree.path(), 4242, 4343).unwrap();
        use std::os::unix::fs::MetadataExt;
        let m = |p: &Path| std::fs::symlink_metadata(p).unwrap();
        for p in ["d", "d/f", "d/link", "l2"] {
            assert_eq!(m(&tree.path().join(p)).uid(), 4242, "{p}");
            assert_eq!(m(&tree.path().join(p)).gid(), 4343, "{p}");
        }
        assert_eq!(m(tree.path()).uid(), 4242);
        assert_eq!(m(outside.path()).uid(), 0);
        assert_eq!(m(&outside.path().join("victim")).uid(), 0);
    }
}
