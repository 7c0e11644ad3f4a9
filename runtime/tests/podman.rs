//! h5i-runc under rootful Podman: `podman --runtime h5i-runc` with a locally imported busybox
//! image (no registry), isolated storage, `--network none`, and `--cgroup-parent` under the
//! test's own cgroup. Podman's containers.conf is the machine's working settings plus the
//! shipped `podman/h5i-runc.conf` snippet (runtime path pointed at the binary under test),
//! passed through `CONTAINERS_CONF`: nothing under /etc is touched.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::process::{Command, Output};

use support::*;

const IMAGE: &str = "localhost/h5i-test-busybox";

struct Podman {
    dir: tempfile::TempDir,
    cgroup_parent: String,
}

impl Podman {
    /// Isolated Podman state with the busybox image imported; None (after a loud skip line)
    /// when the host cannot run it.
    fn new(test: &str) -> Option<Podman> {
        if !require_root(test) {
            return None;
        }
        if !installed("podman") {
            h5i_testsupport::skipped!("{test}: podman is not installed");
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("h5i-podman")
            .tempdir_in("/var/tmp")
            .unwrap();
        let snippet = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("podman/h5i-runc.conf"),
        )
        .unwrap();
        assert!(snippet.contains("[engine.runtimes]") && snippet.contains("h5i-runc = ["));
        // Point the registered name at the binary under test.
        let start = snippet.find("h5i-runc = [").unwrap();
        let end = start + snippet[start..].find(']').unwrap() + 1;
        let snippet = format!(
            "{}h5i-runc = [\"{}\"]{}",
            &snippet[..start],
            bin(),
            &snippet[end..]
        );
        let conf = format!(
            "[containers]\ndefault_ulimits = [\"nofile=20000:20000\", \"nproc=32768:32768\"]\n\
             [engine]\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\ntmp_dir = \"{}\"\n\n{snippet}",
            dir.path().join("tmp").display()
        );
        std::fs::write(dir.path().join("containers.conf"), conf).unwrap();
        let cgroup_parent = format!(
            "{}/h5i-podman-test-{}",
            own_cgroup().trim_end_matches('/'),
            std::process::id()
        );
        let p = Podman { dir, cgroup_parent };
        p.import_image();
        Some(p)
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new("podman");
        c.env("CONTAINERS_CONF", self.dir.path().join("containers.conf"))
            .arg("--root")
            .arg(self.dir.path().join("storage"))
            .arg("--runroot")
            .arg(self.dir.path().join("run"))
            .args(["--storage-driver", "overlay", "--runtime", "h5i-runc"]);
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        run_to_files(self.cmd().args(args))
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "podman {args:?} failed ({:?}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `podman run` arguments every test uses.
    fn run_args<'a>(&'a self, extra: &[&'a str]) -> Vec<&'a str> {
        let mut v = vec![
            "run",
            "--network",
            "none",
            "--cgroup-parent",
            &self.cgroup_parent,
        ];
        v.extend_from_slice(extra);
        v
    }

    fn import_image(&self) {
        let rootfs = self.dir.path().join("image-rootfs");
        h5i_testsupport::rootfs::busybox(
            &rootfs,
            &["etc", "tmp", "mnt"],
            &["sh", "cat", "echo", "sleep", "true", "id", "unshare", "ps"],
        );
        std::fs::copy(probe(), rootfs.join("bin/probe")).unwrap();
        let tar = self.dir.path().join("image.tar");
        h5i_testsupport::rootfs::tar(&rootfs, &tar);
        let out = self
            .cmd()
            .args(["import", tar.to_str().unwrap(), IMAGE])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "podman import: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.run(&["rm", "--all", "--force", "--time", "0"]);
        let _ = self.run(&["rmi", "--all", "--force"]);
        // containers/storage keeps a private bind mount of its overlay dir: unmount everything
        // under our directory before the TempDir removes it.
        h5i_testsupport::podman::unmount_under(self.dir.path());
        // Podman/conmon leave `<parent>/conmon` and the parent itself: remove them if empty.
        h5i_testsupport::podman::remove_cgroup_parent(&self.cgroup_parent);
    }
}

#[test]
fn podman_run_rm_prints_output_and_passes_the_exit_code() {
    let Some(p) = Podman::new("podman_run_rm_prints_output_and_passes_the_exit_code") else {
        return;
    };
    let out = p.ok(&p.run_args(&["--rm", IMAGE, "sh", "-c", "echo hello from podman; id -u"]));
    assert_eq!(out, "hello from podman\n0\n");
    let out = p.ok(&p.run_args(&["--rm", "-t", IMAGE, "sh", "-c", "tty; echo run-tty"]));
    assert!(
        out.starts_with("/dev/pts/") && out.contains("run-tty"),
        "{out:?}"
    );
    let out = p.run(&p.run_args(&["--rm", IMAGE, "sh", "-c", "exit 7"]));
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Podman's /sys/fs/cgroup mount says ro: the container cannot rewrite its own limits
    // (libcontainer alone would leave the v1 hierarchies writable).
    let v1 = !Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let limit = if v1 {
        "/sys/fs/cgroup/memory/memory.limit_in_bytes"
    } else {
        "/sys/fs/cgroup/memory.max"
    };
    let out = p.ok(&p.run_args(&["--rm", "--memory", "64m", IMAGE, "probe", "write", limit]));
    assert_eq!(out, "write=EROFS\n");
    // --rm removed them.
    assert_eq!(p.ok(&["ps", "-a", "-q"]).trim(), "");
}

#[test]
fn podman_run_detached_exec_stop_rm_ps() {
    let Some(p) = Podman::new("podman_run_detached_exec_stop_rm_ps") else {
        return;
    };
    let cid = p
        .ok(&p.run_args(&["-d", IMAGE, "sleep", "600"]))
        .trim()
        .to_string();
    let inspect = p.ok(&[
        "inspect",
        "--format",
        "{{.OCIRuntime}} {{.State.Status}}",
        &cid,
    ]);
    assert_eq!(inspect.trim(), "h5i-runc running");
    let ps = p.ok(&["ps", "-q", "--no-trunc"]);
    assert!(ps.contains(&cid), "{ps}");

    let out = p.ok(&[
        "exec",
        &cid,
        "sh",
        "-c",
        "echo exec-ok; cat /proc/1/cmdline",
    ]);
    assert_eq!(out, "exec-ok\nsleep\u{0}600\u{0}");
    // -t: conmon hands h5i-runc a console socket; the pty master comes back over it.
    let out = p.ok(&["exec", "-t", &cid, "sh", "-c", "tty; echo exec-tty"]);
    assert!(
        out.starts_with("/dev/pts/") && out.contains("exec-tty"),
        "{out:?}"
    );
    let out = p.run(&["exec", &cid, "sh", "-c", "exit 3"]);
    assert_eq!(out.status.code(), Some(3));
    let top = p.ok(&["exec", &cid, "ps"]);
    assert!(top.contains("sleep 600"), "{top}");

    p.ok(&["pause", &cid]);
    assert_eq!(
        p.ok(&["inspect", "--format", "{{.State.Status}}", &cid])
            .trim(),
        "paused"
    );
    p.ok(&["unpause", &cid]);

    // sleep as pid 1 ignores SIGTERM: stop escalates to SIGKILL after the timeout.
    p.ok(&["stop", "--time", "1", &cid]);
    let st = p.ok(&[
        "inspect",
        "--format",
        "{{.State.Status}} {{.State.ExitCode}}",
        &cid,
    ]);
    assert_eq!(st.trim(), "exited 137");
    assert!(!p.ok(&["ps", "-q", "--no-trunc"]).contains(&cid));
    assert!(p.ok(&["ps", "-a", "-q", "--no-trunc"]).contains(&cid));
    p.ok(&["rm", &cid]);
    assert!(!p.ok(&["ps", "-a", "-q", "--no-trunc"]).contains(&cid));
}

#[test]
fn podman_annotation_landlock_confines_the_container() {
    let Some(p) = Podman::new("podman_annotation_landlock_confines_the_container") else {
        return;
    };
    let script = "probe write /etc/h5i-denied; probe write /tmp/h5i-allowed";
    let control = p.ok(&p.run_args(&["--rm", IMAGE, "sh", "-c", script]));
    assert_eq!(control, "write=OK\nwrite=OK\n");
    // Podman parses --annotation as CSV: JSON is CSV-quoted (see podman/h5i-runc.conf).
    let ann = r#""h5i.landlock={""read"":[""/""],""write"":[""/tmp"",""/dev""]}""#;
    let out = p.ok(&p.run_args(&["--rm", "--annotation", ann, IMAGE, "sh", "-c", script]));
    assert_eq!(out, "write=EACCES\nwrite=OK\n");
    // exec'd processes are confined the same way.
    let cid = p
        .ok(&p.run_args(&["-d", "--annotation", ann, IMAGE, "sleep", "600"]))
        .trim()
        .to_string();
    let out = p.ok(&["exec", &cid, "probe", "write", "/etc/h5i-exec"]);
    assert_eq!(out, "write=EACCES\n");
    p.ok(&["rm", "--force", "--time", "0", &cid]);
}

#[test]
fn podman_annotation_seccomp_denies_unshare_and_bad_annotations_fail_closed() {
    let Some(p) =
        Podman::new("podman_annotation_seccomp_denies_unshare_and_bad_annotations_fail_closed")
    else {
        return;
    };
    let out = p.run(&p.run_args(&[
        "--rm",
        "--annotation",
        "h5i.seccomp=h5i-v1",
        IMAGE,
        "unshare",
        "-r",
        "true",
    ]));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Operation not permitted"), "{err}");
    let out = p.ok(&p.run_args(&[
        "--rm",
        "--annotation",
        "h5i.seccomp=h5i-v1",
        "--annotation",
        "h5i.net.unix=false",
        IMAGE,
        "probe",
        "unix",
    ]));
    assert_eq!(out, "socket_unix=EPERM\nsocketpair_unix=OK\n");

    let out = p.run(&p.run_args(&[
        "--rm",
        "--annotation",
        "h5i.landlock=not-json",
        IMAGE,
        "true",
    ]));
    assert!(
        !out.status.success(),
        "a malformed h5i.landlock must not run"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("h5i.landlock"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Rootless: Podman runs h5i-runc as uid 0 inside its user namespace, with XDG_RUNTIME_DIR set,
// `resources {}` and no cgroupsPath. On cgroup v1 an unprivileged user can only make cgroups in
// a directory root delegated, so the test (as root) delegates `<own>/h5i-runc-rootless-<pid>`
// in every hierarchy to the test user and starts Podman inside it, as h5i's setup does.

struct Rootless {
    dir: tempfile::TempDir,
    user: String,
    cgroups: Delegated,
}

fn chown(path: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
}

impl Rootless {
    fn new(test: &str) -> Option<Rootless> {
        if !require_root(test) {
            return None;
        }
        if !installed("podman") {
            h5i_testsupport::skipped!("{test}: podman is not installed");
            return None;
        }
        let (user, uid, gid) = test_user(test)?;
        let subuid = std::fs::read_to_string("/etc/subuid").unwrap_or_default();
        if !subuid.lines().any(|l| l.starts_with(&format!("{user}:"))) {
            h5i_testsupport::skipped!("{test}: {user} has no /etc/subuid range");
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("h5i-rootless")
            .tempdir_in("/var/tmp")
            .unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        for d in ["xdg", "tmp", "storage", "run"] {
            std::fs::create_dir(dir.path().join(d)).unwrap();
            chown(&dir.path().join(d), uid, gid);
        }
        std::fs::set_permissions(
            dir.path().join("xdg"),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        // The build tree may sit where the test user cannot reach (CI clones under /root), so
        // the user's Podman gets its own copy of the runtime.
        let runtime = dir.path().join("h5i-runc");
        std::fs::copy(bin(), &runtime).unwrap();
        std::fs::set_permissions(
            &runtime,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let conf = format!(
            "[containers]\ndefault_ulimits = [\"nofile=20000:20000\", \"nproc=32768:32768\"]\n\
             [engine]\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\ntmp_dir = \"{}\"\n\
             [engine.runtimes]\nh5i-runc = [\"{}\"]\n",
            dir.path().join("tmp").display(),
            runtime.display()
        );
        std::fs::write(dir.path().join("containers.conf"), conf).unwrap();

        let cgroups = Delegated::new("h5i-runc-rootless", uid, gid);
        let r = Rootless { dir, user, cgroups };
        let rootfs = r.dir.path().join("image-rootfs");
        h5i_testsupport::rootfs::busybox(
            &rootfs,
            &["etc", "tmp"],
            &["sh", "cat", "echo", "sleep", "true", "id", "unshare"],
        );
        std::fs::copy(probe(), rootfs.join("bin/probe")).unwrap();
        let tar = r.dir.path().join("image.tar");
        h5i_testsupport::rootfs::tar(&rootfs, &tar);
        chown(&tar, uid, gid);
        r.ok(&["import", tar.to_str().unwrap(), IMAGE]);
        Some(r)
    }

    /// `podman ARGS` as the test user, inside the delegated cgroup.
    fn run(&self, args: &[&str]) -> Output {
        let p = self.dir.path();
        let mut cmd = self.cgroups.command_as(&self.user);
        cmd.arg(format!("XDG_RUNTIME_DIR={}", p.join("xdg").display()))
            .arg(format!(
                "CONTAINERS_CONF={}",
                p.join("containers.conf").display()
            ))
            .arg(format!("HOME={}", p.join("xdg").display()))
            .args(["podman", "--root"])
            .arg(p.join("storage"))
            .arg("--runroot")
            .arg(p.join("run"))
            .args(["--runtime", "h5i-runc"])
            .args(args);
        run_to_files(&mut cmd)
    }

    fn ok(&self, args: &[&str]) -> String {
        success_stdout("rootless podman", args, self.run(args))
    }
}

impl Drop for Rootless {
    fn drop(&mut self) {
        let _ = self.run(&["rm", "--all", "--force", "--time", "0"]);
        let _ = self.run(&["rmi", "--all", "--force"]);
        // Our own pause process (its own XDG_RUNTIME_DIR, so never another test's).
        let pause = self.dir.path().join("tmp/pause.pid");
        let pause = std::fs::read_to_string(&pause)
            .or_else(|_| std::fs::read_to_string(self.dir.path().join("xdg/libpod/tmp/pause.pid")));
        if let Ok(pid) = pause.map(|s| s.trim().parse::<i32>().unwrap_or(0)) {
            if pid > 0 {
                // SAFETY: kill(2) on the pid Podman recorded for the pause process it started
                // for this test's private runtime dir.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                wait_exit(pid, std::time::Duration::from_secs(5));
            }
        }
    }
}

#[test]
fn podman_rootless_run_exec_and_annotations() {
    let Some(r) = Rootless::new("podman_rootless_run_exec_and_annotations") else {
        return;
    };
    let out = r.ok(&[
        "run",
        "--rm",
        "--network",
        "none",
        IMAGE,
        "sh",
        "-c",
        "echo rootless; id -u",
    ]);
    assert_eq!(out, "rootless\n0\n");
    let out = r.run(&[
        "run",
        "--rm",
        "--network",
        "none",
        IMAGE,
        "sh",
        "-c",
        "exit 9",
    ]);
    assert_eq!(
        out.status.code(),
        Some(9),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The container's cgroup is under the delegated one, not at the top of a hierarchy.
    let out = r.ok(&[
        "run",
        "--rm",
        "--network",
        "none",
        IMAGE,
        "cat",
        "/proc/self/cgroup",
    ]);
    let mem = out
        .lines()
        .find(|l| l.contains(":memory:") || l.starts_with("0::"))
        .unwrap();
    assert!(
        mem.contains(&format!("{}/h5i-runc/", r.cgroups.rel)),
        "{out}"
    );

    let cid = r
        .ok(&["run", "-d", "--network", "none", IMAGE, "sleep", "600"])
        .trim()
        .to_string();
    assert_eq!(
        r.ok(&["exec", &cid, "sh", "-c", "echo exec-ok"]),
        "exec-ok\n"
    );
    r.ok(&["stop", "--time", "1", &cid]);
    r.ok(&["rm", &cid]);

    let ann = r#""h5i.landlock={""read"":[""/""],""write"":[""/tmp"",""/dev""]}""#;
    let out = r.ok(&[
        "run",
        "--rm",
        "--network",
        "none",
        "--annotation",
        ann,
        "--annotation",
        "h5i.seccomp=h5i-v1",
        IMAGE,
        "sh",
        "-c",
        "probe write /etc/x; probe write /tmp/y; probe syscalls | grep ^unshare=",
    ]);
    assert_eq!(out, "write=EACCES\nwrite=OK\nunshare=EPERM\n");
}
