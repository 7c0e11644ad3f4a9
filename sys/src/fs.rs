//! Changing who owns an entry of a directory held by descriptor, never through a symlink: the
//! one `fchownat` h5i makes when it hands a box's tree (or a file it wrote into one) to the box's
//! owner.
//!
//! On rustix, without unsafe. Must never: follow a symlink (one the box planted is re-owned
//! itself, its target untouched), or resolve a name with a `/` in it (an entry is one name in
//! the directory the caller holds).

use std::ffi::CStr;
use std::io;
use std::os::fd::AsFd;

use rustix::fs::{AtFlags, Gid, Uid};

/// Hand the entry `name` of the directory `dir` to `uid:gid` without following a symlink; an
/// empty `name` changes `dir` itself. A name with a `/` is refused (`EINVAL`).
pub fn chown_nofollow(dir: impl AsFd, name: &CStr, uid: u32, gid: u32) -> io::Result<()> {
    if name.to_bytes().contains(&b'/') {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let flags = if name.is_empty() {
        AtFlags::EMPTY_PATH
    } else {
        AtFlags::SYMLINK_NOFOLLOW
    };
    Ok(rustix::fs::chownat(
        dir,
        name,
        Some(Uid::from_raw(uid)),
        Some(Gid::from_raw(gid)),
        flags,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// Re-owning to the ids a file already has is allowed to anyone, so this runs unprivileged;
    /// as root it also moves a symlink (not its target) to another owner.
    #[test]
    fn a_symlink_is_re_owned_itself_and_its_target_never() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("target"), b"x").unwrap();
        std::os::unix::fs::symlink(d.path().join("target"), d.path().join("link")).unwrap();
        let dir = std::fs::File::open(d.path()).unwrap();
        let me = (crate::ids::euid(), crate::ids::egid());
        chown_nofollow(&dir, c"", me.0, me.1).unwrap();
        let other = if me.0 == 0 { (4242, 4343) } else { me };
        chown_nofollow(&dir, c"link", other.0, other.1).unwrap();
        let link = std::fs::symlink_metadata(d.path().join("link")).unwrap();
        let target = std::fs::metadata(d.path().join("target")).unwrap();
        assert_eq!((link.uid(), link.gid()), other);
        assert_eq!((target.uid(), target.gid()), me);
        assert_eq!(
            chown_nofollow(&dir, c"a/b", me.0, me.1)
                .unwrap_err()
                .raw_os_error(),
            Some(libc::EINVAL)
        );
    }
}
