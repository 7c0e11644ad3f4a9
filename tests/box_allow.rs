//! `h5i box allow` end to end: the user allowlist under `~/.config/h5i/` (0600 in 0700), listed
//! and added on the host, bad entries refused with the file untouched, and from inside a real
//! box refused, and with the box's own marker removed still unable to reach the host's file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::os::unix::fs::PermissionsExt;

use common::{stderr, stdout, Repo};

fn mode(p: &std::path::Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn the_allowlist_is_kept_under_the_users_config_and_refuses_bad_entries() {
    let r = Repo::new();
    let home = tempfile::tempdir().unwrap();
    let h = home.path().to_str().unwrap();
    let file = home.path().join(".config/h5i/allow.txt");

    let empty = r.h5i_env(&["box", "allow"], &[("HOME", h)]);
    assert_eq!(empty.status.code(), Some(0), "{}", stderr(&empty));
    assert!(stdout(&empty).contains("no entries"), "{}", stdout(&empty));

    let add = r.h5i_env(&["box", "allow", "API.Example.test"], &[("HOME", h)]);
    assert_eq!(add.status.code(), Some(0), "{}", stderr(&add));
    assert!(
        stdout(&add).contains("api.example.test:443"),
        "{}",
        stdout(&add)
    );
    assert_eq!(mode(&file), 0o600);
    assert_eq!(mode(file.parent().unwrap()), 0o700);
    let again = r.h5i_env(&["box", "allow", "api.example.test:443"], &[("HOME", h)]);
    assert!(
        stdout(&again).contains("already allowed"),
        "{}",
        stdout(&again)
    );

    let before = std::fs::read(&file).unwrap();
    for bad in ["evil host", "a.test:0", "a.test:99999", "http://a.test/"] {
        let out = r.h5i_env(&["box", "allow", bad], &[("HOME", h)]);
        assert_ne!(out.status.code(), Some(0), "{bad:?} was accepted");
        let e = stderr(&out);
        assert!(
            e.contains("refusing") && e.contains("to fix"),
            "{bad:?}: {e}"
        );
    }
    assert_eq!(
        std::fs::read(&file).unwrap(),
        before,
        "a refused entry changed the file"
    );

    let list = r.h5i_env(&["box", "allow"], &[("HOME", h)]);
    assert_eq!(stdout(&list).trim(), "api.example.test:443");
}

#[test]
fn a_box_cannot_widen_its_own_egress() {
    let r = Repo::new();
    let home = tempfile::tempdir().unwrap();
    // The host's HOME must be reachable by path for the second attempt to mean anything.
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let h = home.path().to_str().unwrap();
    let file = home.path().join(".config/h5i/allow.txt");
    r.h5i_env(&["box", "allow", "kept.test"], &[("HOME", h)]);
    let before = std::fs::read(&file).unwrap();

    let made = r.h5i_env(
        &["box", "create", "wide", "--isolation", "process"],
        &[("HOME", h)],
    );
    assert_eq!(made.status.code(), Some(0), "{}", stderr(&made));
    // The box runs its own copy of h5i, from its workspace.
    std::fs::copy(common::H5I, r.workspace("wide").join("h5i")).unwrap();

    let inside = r.h5i_env(
        &[
            "box",
            "run",
            "wide",
            "--",
            "./h5i",
            "box",
            "allow",
            "evil.test",
        ],
        &[("HOME", h)],
    );
    assert_ne!(inside.status.code(), Some(0), "{}", stdout(&inside));
    let e = stderr(&inside);
    assert!(e.contains("inside box") && e.contains("to fix"), "{e}");

    // Without the marker, pointing HOME at the host's: the box still cannot reach that file.
    let home_var = format!("HOME={h}");
    let unmarked = r.h5i_env(
        &[
            "box",
            "run",
            "wide",
            "--",
            "env",
            "-u",
            "H5I_ENV_ID",
            &home_var,
            "./h5i",
            "box",
            "allow",
            "evil.test",
        ],
        &[("HOME", h)],
    );
    // Whatever it answers (it may well write a file of that name in the box's own /tmp), the
    // host's file is the same.
    assert_eq!(
        std::fs::read(&file).unwrap(),
        before,
        "a box changed the host's allowlist: {}",
        stderr(&unmarked)
    );
}
