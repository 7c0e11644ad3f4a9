//! `h5i-hook loopback --inside` asked of the kernel: it brings `lo` up in a network namespace of
//! the box's own and refuses the host's, as root and from a user namespace that cannot read pid
//! 1's namespace link (where the kernel would refuse the change with EPERM anyway).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::Write;
use std::process::{Command, Output, Stdio};

use support::*;

const STATE: &str =
    r#"{"ociVersion":"1.0.2","id":"lo-test","status":"creating","pid":1,"bundle":"/"}"#;

/// Run `h5i-hook loopback --inside` through `wrap` (the command that makes its namespaces),
/// then `ip -o link show lo` in the same namespaces; the OCI state goes on stdin.
fn hook_in(wrap: &[&str], hook: &std::path::Path) -> Output {
    let script = format!(
        "{} loopback --inside; rc=$?; ip -o link show lo; exit $rc",
        hook.display()
    );
    let mut child = Command::new(wrap[0])
        .args(&wrap[1..])
        .args(["sh", "-c", &script])
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(STATE.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn lo_comes_up_in_a_namespace_of_the_boxs_own() {
    if !require_root("lo_comes_up_in_a_namespace_of_the_boxs_own") {
        return;
    }
    let out = hook_in(&["unshare", "--net"], &hook_bin());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let link = text(&out.stdout);
    assert!(link.contains("<LOOPBACK,UP,LOWER_UP>"), "{link}");
}

#[test]
fn the_hosts_namespace_is_refused_by_name_as_root() {
    if !require_root("the_hosts_namespace_is_refused_by_name_as_root") {
        return;
    }
    let out = hook_in(&["env"], &hook_bin());
    assert_ne!(out.status.code(), Some(0));
    let err = text(&out.stderr);
    assert!(
        err.contains("host's network namespace") && err.contains("to fix"),
        "{err}"
    );
}

/// Rootless, the hook cannot read pid 1's namespace link; sharing the host's network namespace
/// from a user namespace of its own, it must still tell and refuse.
#[test]
fn the_hosts_namespace_is_refused_from_a_user_namespace() {
    let test = "the_hosts_namespace_is_refused_from_a_user_namespace";
    if !require_root(test) {
        return;
    }
    test_user_uid();
    // The build tree may sit where h5i-test cannot reach: the user runs its own copy.
    let tmp = tempfile::Builder::new()
        .prefix("h5i-lo")
        .tempdir_in("/tmp")
        .unwrap();
    let perms = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(tmp.path(), perms).unwrap();
    let hook = tmp.path().join("h5i-hook");
    std::fs::copy(hook_bin(), &hook).unwrap();
    let out = hook_in(
        &["runuser", "-u", "h5i-test", "--", "unshare", "-Ur"],
        &hook,
    );
    assert_ne!(out.status.code(), Some(0));
    let err = text(&out.stderr);
    assert!(
        err.contains("host's network namespace") && err.contains("to fix"),
        "{err}"
    );
    // And the namespace link it could not read is indeed unreadable there.
    let probe = Command::new("runuser")
        .args([
            "-u",
            "h5i-test",
            "--",
            "unshare",
            "-Ur",
            "readlink",
            "/proc/1/ns/net",
        ])
        .current_dir("/")
        .output()
        .unwrap();
    assert!(!probe.status.success(), "pid 1's link was readable");
}
