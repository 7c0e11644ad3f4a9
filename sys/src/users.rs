//! The password database (`getpwnam_r`/`getpwuid_r`, through the C library so NSS answers as
//! it does for every other program on the host): who a user name or a uid is.
//!
//! Owns the two lookups and the [`Account`] they return. Must never: take a lookup failure for
//! a missing user (an unreadable database is an error, a missing entry `Ok(None)`), or read a
//! pointer the C library handed back past the buffer it wrote into.

use std::ffi::{CStr, CString};
use std::io;
use std::path::PathBuf;

/// A user from the password database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// Login name.
    pub name: String,
    /// uid.
    pub uid: u32,
    /// Primary gid.
    pub gid: u32,
    /// Home directory.
    pub home: PathBuf,
}

/// The entry of the user `name`: `None` when there is none (a name with a NUL in it names no
/// user).
pub fn by_name(name: &str) -> io::Result<Option<Account>> {
    let Ok(c) = CString::new(name) else {
        return Ok(None);
    };
    lookup(&|pwd, buf, len, out| {
        // SAFETY: `c` is NUL-terminated, `pwd` and `out` point at live values of `lookup`'s
        // frame and `buf` at `len` writable bytes, all alive for the call.
        unsafe { libc::getpwnam_r(c.as_ptr(), pwd, buf, len, out) }
    })
}

/// The entry of the user with uid `uid`: `None` when there is none.
pub fn by_uid(uid: u32) -> io::Result<Option<Account>> {
    lookup(&|pwd, buf, len, out| {
        // SAFETY: as in `by_name`.
        unsafe { libc::getpwuid_r(uid, pwd, buf, len, out) }
    })
}

type PwCall<'a> = dyn Fn(*mut libc::passwd, *mut libc::c_char, libc::size_t, *mut *mut libc::passwd) -> libc::c_int
    + 'a;

fn lookup(call: &PwCall<'_>) -> io::Result<Option<Account>> {
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: passwd is plain data (integers and pointers); all-zero is a valid value for the
    // out-parameter the call overwrites.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    let rc = call(&mut pwd, buf.as_mut_ptr(), buf.len(), &mut out);
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    if out.is_null() {
        return Ok(None);
    }
    // SAFETY: on success pw_name and pw_dir point at NUL-terminated strings inside `buf`,
    // which outlives these reads.
    let (name, home) = unsafe {
        (
            CStr::from_ptr(pwd.pw_name).to_string_lossy().into_owned(),
            CStr::from_ptr(pwd.pw_dir).to_string_lossy().into_owned(),
        )
    };
    Ok(Some(Account {
        name,
        uid: pwd.pw_uid,
        gid: pwd.pw_gid,
        home: PathBuf::from(home),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_found_by_name_and_by_uid_and_a_made_up_name_is_none() {
        let root = by_name("root").unwrap().unwrap();
        assert_eq!((root.uid, root.gid, root.name.as_str()), (0, 0, "root"));
        assert_eq!(by_uid(0).unwrap(), Some(root));
        assert_eq!(by_name("h5i-no-such-user-x").unwrap(), None);
        assert_eq!(by_name("ro\0ot").unwrap(), None);
    }
}
