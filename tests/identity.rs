//! Who a box is on the host, asked from inside real boxes: a root caller's box runs as the
//! unprivileged `h5i-box` range (never host root), so owner permission bits refuse it every
//! root-only host file, what it writes is owned on the host by the range, and the host's own
//! git treats its workspace as another user's repository. An unprivileged caller's box is still
//! that caller.
//!
//! Needs root (CI runs as root) and `make setup` (the `h5i-box` user and its ranges, the
//! `h5i-test` user); each test says `skipped:` loudly otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};

use common::{probe, stderr, stdout, Repo};

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `h5i-box`'s first subordinate uid and gid and the uid count, from the files h5i reads.
fn range() -> (u32, u32, u32) {
    let first = |file: &str| -> (u32, u32) {
        let text = std::fs::read_to_string(file).unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("h5i-box:"))
            .unwrap_or_else(|| panic!("no h5i-box range in {file}: run `make setup`"));
        let f: Vec<&str> = line.split(':').collect();
        (f[1].parse().unwrap(), f[2].parse().unwrap())
    };
    let (uid, count) = first("/etc/subuid");
    let (gid, _) = first("/etc/subgid");
    (uid, gid, count)
}

fn results(out: &Output) -> BTreeMap<String, String> {
    stdout(out)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn run(r: &Repo, name: &str, argv: &[&str]) -> Output {
    let mut args = vec!["box", "run", name, "--"];
    args.extend_from_slice(argv);
    r.h5i(&args)
}

/// `probe read PATH` in the box: the errno name, or `OK`.
fn read_in(r: &Repo, name: &str, path: &str) -> String {
    let out = run(r, name, &["./probe", "read", path]);
    results(&out).remove("read").unwrap_or_else(|| {
        panic!(
            "no probe answer for {path}: {}{}",
            stdout(&out),
            stderr(&out)
        )
    })
}

/// A directory outside the repository, granted read-only, holding a 0600 root-owned secret
/// and a world-readable file (which shows the grant itself is mounted).
struct Granted {
    dir: tempfile::TempDir,
}

impl Granted {
    fn new() -> Granted {
        let dir = tempfile::Builder::new()
            .prefix("h5i-identity-grant")
            .tempdir_in("/var/tmp")
            .unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(dir.path().join("secret"), "root only\n").unwrap();
        std::fs::set_permissions(
            dir.path().join("secret"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        std::fs::write(dir.path().join("public"), "anyone\n").unwrap();
        std::fs::set_permissions(
            dir.path().join("public"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        Granted { dir }
    }

    fn path(&self, file: &str) -> String {
        self.dir.path().join(file).display().to_string()
    }
}

/// A root-made box at `tier` named `name` that reads the default system paths and `grant`, and
/// holds the probe.
fn root_box(r: &Repo, name: &str, tier: &str, grant: &Granted) {
    r.write_policy(&format!(
        "[profile.id]\nisolation = \"{tier}\"\n[profile.id.fs]\nread = [\"/usr\", \"/etc\", \"/bin\", \"/sbin\", \"/lib\", \"/lib64\", \"/opt\", \"{}\"]\n",
        grant.dir.path().display()
    ));
    r.ok(&["box", "create", name, "--profile", "id"]);
    common::copy_program(probe(), &r.workspace(name).join("probe"));
}

/// The refusals owner permission bits make once the box is not host root, at `tier`.
fn root_only_files_are_refused_at(tier: &str) {
    let r = Repo::new();
    let grant = Granted::new();
    root_box(&r, "ro", tier, &grant);
    assert_eq!(
        read_in(&r, "ro", &grant.path("public")),
        "OK",
        "the grant is mounted"
    );
    assert_eq!(read_in(&r, "ro", &grant.path("secret")), "EACCES");
    assert_eq!(read_in(&r, "ro", "/etc/shadow"), "EACCES");
    assert_eq!(read_in(&r, "ro", "/etc/ssl/private"), "EACCES");
    // What the box reads is world-readable: /etc/passwd stays open to it.
    assert_eq!(read_in(&r, "ro", "/etc/passwd"), "OK");
    // No supplementary group of the caller (root's gid 0) rides along into the box.
    let out = run(&r, "ro", &["grep", "^Groups:", "/proc/self/status"]);
    assert_eq!(stdout(&out).trim(), "Groups:", "{}", stderr(&out));
}

#[test]
fn a_root_callers_process_box_cannot_read_root_only_host_files() {
    if !is_root() {
        h5i_testsupport::skipped!(
            "a_root_callers_process_box_cannot_read_root_only_host_files needs root"
        );
        return;
    }
    root_only_files_are_refused_at("process");
}

#[test]
fn a_root_callers_supervised_box_cannot_read_root_only_host_files() {
    if !is_root() {
        h5i_testsupport::skipped!(
            "a_root_callers_supervised_box_cannot_read_root_only_host_files needs root"
        );
        return;
    }
    root_only_files_are_refused_at("supervised");
}

/// What the box writes, and the map it runs under, at `tier`.
fn the_box_is_the_range_at(tier: &str) {
    let (uid, gid, count) = range();
    let r = Repo::new();
    let grant = Granted::new();
    root_box(&r, "own", tier, &grant);
    let out = run(
        &r,
        "own",
        &[
            "sh",
            "-c",
            "echo made > by-box && mkdir dir-by-box && cat /proc/self/uid_map /proc/self/gid_map",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let maps: Vec<Vec<String>> = stdout(&out)
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect();
    assert_eq!(
        maps,
        vec![
            vec!["0".to_string(), uid.to_string(), count.to_string()],
            vec!["0".to_string(), gid.to_string(), count.to_string()],
        ]
    );
    let ws = r.workspace("own");
    for made in ["by-box", "dir-by-box"] {
        let m = std::fs::symlink_metadata(ws.join(made)).unwrap();
        assert_eq!((m.uid(), m.gid()), (uid, gid), "{made}");
        assert_ne!(m.uid(), 0);
    }
    // The workspace, HOME and spool are the range's; the box directory is root's alone.
    let box_dir = r.box_dir("own");
    for dir in ["workspace", "home", "spool"] {
        let m = std::fs::metadata(box_dir.join(dir)).unwrap();
        assert_eq!((m.uid(), m.gid()), (uid, gid), "{dir}");
    }
    let m = std::fs::metadata(&box_dir).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o7777), (0, 0o700));
}

#[test]
fn a_root_callers_process_box_is_the_unprivileged_range_on_the_host() {
    if !is_root() {
        h5i_testsupport::skipped!(
            "a_root_callers_process_box_is_the_unprivileged_range_on_the_host needs root"
        );
        return;
    }
    the_box_is_the_range_at("process");
}

#[test]
fn a_root_callers_supervised_box_is_the_unprivileged_range_on_the_host() {
    if !is_root() {
        h5i_testsupport::skipped!(
            "a_root_callers_supervised_box_is_the_unprivileged_range_on_the_host needs root"
        );
        return;
    }
    the_box_is_the_range_at("supervised");
}

/// A box sets `core.fsmonitor` in its own repository; a person (root) runs `git status` in the
/// workspace on the host: git refuses the repository as another user's, so the program never
/// runs, while `h5i box diff` (which names the workspace itself) still works.
#[test]
fn a_box_set_fsmonitor_does_not_run_in_a_root_hosts_git_status() {
    if !is_root() {
        h5i_testsupport::skipped!(
            "a_box_set_fsmonitor_does_not_run_in_a_root_hosts_git_status needs root"
        );
        return;
    }
    let r = Repo::new();
    let grant = Granted::new();
    root_box(&r, "fsm", "process", &grant);
    let marker = tempfile::tempdir().unwrap();
    let fired = marker.path().join("fsmonitor-ran");
    let out = run(
        &r,
        "fsm",
        &[
            "sh",
            "-c",
            &format!(
                "git config core.fsmonitor 'touch {}' && echo changed >> README.md",
                fired.display()
            ),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let ws = r.workspace("fsm");
    let status = Command::new("git")
        .arg("status")
        .current_dir(&ws)
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .output()
        .unwrap();
    assert!(!status.status.success(), "{}", stdout(&status));
    assert!(
        stderr(&status).contains("dubious ownership"),
        "{}",
        stderr(&status)
    );
    assert!(!fired.exists(), "the box's fsmonitor ran on the host");
    let diff = r.ok(&["box", "diff", "fsm"]);
    assert!(diff.contains("+changed"), "{diff}");
    assert!(
        !fired.exists(),
        "the box's fsmonitor ran under h5i box diff"
    );
}

/// An unprivileged caller's box is still the caller: one id mapped, box uid 0 = the caller.
#[test]
fn an_unprivileged_callers_box_still_maps_only_the_caller() {
    if !is_root() {
        h5i_testsupport::skipped!("an_unprivileged_callers_box_still_maps_only_the_caller needs root to switch to h5i-test");
        return;
    }
    let (dir, uid) = common::unprivileged_tree(common::TEST_USER, &[]);
    let uid = uid.to_string();
    let repo = dir.path().join("repo");
    let bin = dir.path().join("bin");
    let script = format!(
        r#"set -e
        cd {repo}
        git init -q -b main .
        echo hi > f
        git add f
        git -c user.name=u -c user.email=u@x commit -qm i
        {h5i} box create u --isolation process >/dev/null
        {h5i} box run u -- sh -c 'cat /proc/self/uid_map; echo made > by-box'
        stat -c owner=%u .git/.h5i/env/none/u/workspace/by-box
        "#,
        repo = repo.display(),
        h5i = bin.join("h5i").display(),
    );
    let out = common::as_user(common::TEST_USER, Some("/tmp"))
        .args(["bash", "-c", &script])
        .output()
        .unwrap();
    let text = stdout(&out);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    let map: Vec<&str> = text.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(map, vec!["0", uid.as_str(), "1"]);
    assert!(text.contains(&format!("owner={uid}")), "{text}");
}

/// The container tier as root: rootless Podman runs as the engine user (`h5i-test`), whose
/// idmapped view of the workspace must store the box's writes as the `h5i-box` range (it
/// stored them as host root before), and must not show root's files as the box's own.
#[test]
fn a_root_callers_container_box_writes_as_the_range_and_cannot_read_roots_files() {
    if !is_root() {
        h5i_testsupport::skipped!("a_root_callers_container_box_writes_as_the_range_and_cannot_read_roots_files needs root");
        return;
    }
    let image = Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/make-test-image.sh"))
        .arg("--user")
        .env("H5I_TEST_USER", "h5i-test")
        .output()
        .unwrap();
    assert!(
        image.status.success(),
        "the test image cannot be made (run `make setup`): {}",
        stderr(&image)
    );
    let (uid, gid, _) = range();
    let r = Repo::new();
    r.write_policy(
        "[profile.c]\nisolation = \"container\"\n[profile.c.container]\nimage = \"localhost/h5i-busybox:latest\"\n",
    );
    let env = [
        ("H5I_CONTAINER_USER", "h5i-test"),
        ("H5I_NO_PROBE_CACHE", "1"),
    ];
    let out = r.h5i_env(&["box", "create", "c", "--profile", "c"], &env);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let ws = r.workspace("c");
    common::copy_program(probe(), &ws.join("probe"));
    // A root-only file the host put in the workspace: root's on disk, unmapped in the box.
    std::fs::write(ws.join("root-secret"), "root only\n").unwrap();
    std::fs::set_permissions(
        ws.join("root-secret"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let out = r.h5i_env(
        &[
            "box",
            "run",
            "c",
            "--",
            "sh",
            "-c",
            "./probe read root-secret; echo made > by-box",
        ],
        &env,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(results(&out)["read"], "EACCES", "{}", stdout(&out));
    let m = std::fs::symlink_metadata(ws.join("by-box")).unwrap();
    assert_eq!((m.uid(), m.gid()), (uid, gid));
    let m = std::fs::metadata(r.box_dir("c")).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o7777), (0, 0o700));
}

/// A box made before box identity (its trees root's, its directory 0755) is migrated at its
/// next run: the workspace, HOME and spool are handed to the range, the directory made 0700,
/// and the event log says so.
#[test]
fn a_box_made_before_box_identity_is_migrated_at_its_next_run() {
    if !is_root() {
        h5i_testsupport::skipped!(
            "a_box_made_before_box_identity_is_migrated_at_its_next_run needs root"
        );
        return;
    }
    let (uid, gid, _) = range();
    let r = Repo::new();
    r.ok(&["box", "create", "old", "--isolation", "process"]);
    let box_dir = r.box_dir("old");
    for dir in ["workspace", "home", "spool"] {
        let st = Command::new("chown")
            .args(["-R", "0:0"])
            .arg(box_dir.join(dir))
            .status()
            .unwrap();
        assert!(st.success());
    }
    std::fs::set_permissions(&box_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = run(&r, "old", &["sh", "-c", "echo again > README.md"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for p in [
        "workspace",
        "workspace/README.md",
        "workspace/.git/HEAD",
        "home",
        "spool",
    ] {
        let m = std::fs::symlink_metadata(box_dir.join(p)).unwrap();
        assert_eq!((m.uid(), m.gid()), (uid, gid), "{p}");
    }
    let m = std::fs::metadata(&box_dir).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o700);
    let events = std::fs::read_to_string(box_dir.join("events.jsonl")).unwrap();
    assert!(events.contains("made before box identity"), "{events}");
}

/// `h5i host setup --user` for a second unprivileged user, from a cgroup whose `h5i` directory
/// `make setup` delegated to h5i-test: refused before anything is changed for the second user,
/// and the directory stays h5i-test's (handing it over took h5i-test's box limits silently).
#[test]
fn host_setup_for_a_second_user_keeps_the_first_users_delegated_cgroup() {
    let test = "a second user's host setup";
    if !is_root() {
        h5i_testsupport::skipped!("{test}: needs root (host setup)");
        return;
    }
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let memory = own
        .lines()
        .find_map(|l| {
            let (_, rest) = l.split_once(':')?;
            let (ctrls, path) = rest.split_once(':')?;
            ctrls
                .split(',')
                .any(|c| c == "memory")
                .then(|| path.to_owned())
        })
        .or_else(|| {
            own.lines()
                .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
        })
        .unwrap();
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let base = if v2 {
        "/sys/fs/cgroup"
    } else {
        "/sys/fs/cgroup/memory"
    };
    let delegated = Path::new(base)
        .join(memory.trim_start_matches('/'))
        .join("h5i");
    let test_uid = common::caller::uid_of(common::caller::TEST_USER);
    let owner = std::fs::metadata(&delegated).map(|m| m.uid());
    assert_eq!(
        owner.as_ref().ok(),
        Some(&test_uid),
        "{test}: {} is not h5i-test's (run `make setup` from this cgroup first): {owner:?}",
        delegated.display()
    );
    let name = "h5i-second";
    let _ = Command::new("userdel").args(["-r", name]).output();
    let made = Command::new("useradd")
        .args([
            "-m",
            "-s",
            "/bin/sh",
            "-K",
            "SUB_UID_COUNT=0",
            "-K",
            "SUB_GID_COUNT=0",
            name,
        ])
        .output()
        .unwrap();
    assert!(made.status.success(), "useradd: {}", stderr(&made));
    let subuid_before = std::fs::read_to_string("/etc/subuid").unwrap();
    let out = Command::new(common::H5I)
        .args(["host", "setup", "--user", name])
        .output()
        .unwrap();
    let uid = std::fs::metadata(format!("/home/{name}")).unwrap().uid();
    let _ = Command::new("userdel").args(["-r", name]).output();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let err = stderr(&out);
    assert!(
        err.contains(&format!("is delegated to uid {test_uid} already")) && err.contains("to fix:"),
        "{err}"
    );
    assert_eq!(
        std::fs::metadata(&delegated).unwrap().uid(),
        test_uid,
        "the delegated cgroup changed hands"
    );
    assert_eq!(
        std::fs::read_to_string("/etc/subuid").unwrap(),
        subuid_before,
        "the refused setup wrote subordinate ids for {name}"
    );
    assert!(
        !Path::new(&format!("/run/user/{uid}")).exists(),
        "the refused setup made /run/user/{uid}"
    );
}
