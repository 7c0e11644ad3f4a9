//! h5i-runc against real containers, as root: every verb, state transitions, the console
//! socket, exec, the sealed re-exec, cgroup placement, and the `h5i.*` annotations (Landlock
//! and the h5i-v1 seccomp list), each confinement test checked against an unconfined control.
//! Assertions are made from inside the container (the `probe` helper prints errno names).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::process::Stdio;
use std::time::Duration;

use support::rootless::{cgroup_v1, RootlessRunc};
use support::*;

const WAIT: Duration = Duration::from_secs(20);

#[test]
fn create_start_state_transitions_created_running_stopped() {
    if !require_root("create_start_state_transitions_created_running_stopped") {
        return;
    }
    let rt = Runtime::new();
    let id = id("transitions");
    let b = Bundle::new(&["sleep", "600"], Some(test_cgroup(&id)));
    let pid_file = b.path().join("init.pid");
    rt.ok(&[
        "create",
        "--bundle",
        b.path().to_str().unwrap(),
        "--pid-file",
        pid_file.to_str().unwrap(),
        &id,
    ]);
    let st = rt.state(&id);
    assert_eq!(st["status"], "created");
    assert_eq!(st["id"].as_str().unwrap(), id);
    assert_eq!(
        st["bundle"].as_str().unwrap(),
        b.path().canonicalize().unwrap().to_str().unwrap()
    );
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        st["pid"].as_i64().unwrap() as i32,
        pid,
        "pid file and state agree"
    );

    rt.ok(&["start", &id]);
    assert_eq!(rt.status(&id), "running");
    // Starting twice is refused, and the refusal says it is an error.
    let again = rt.run(&["start", &id]);
    assert!(!again.status.success());
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(err.contains("error") && err.contains("status"), "{err}");

    rt.ok(&["kill", &id, "KILL"]);
    assert!(wait_exit(pid, WAIT), "init did not exit after SIGKILL");
    let st = rt.state(&id);
    assert_eq!(st["status"], "stopped");
    assert_eq!(st["pid"], 0, "runc reports pid 0 once stopped");
    rt.ok(&["delete", &id]);
    assert!(!rt.root.path().join(&id).exists());
}

#[test]
fn run_passes_the_exit_code_through() {
    if !require_root("run_passes_the_exit_code_through") {
        return;
    }
    let rt = Runtime::new();
    for (args, want) in [
        (vec!["sh", "-c", "exit 7"], 7),
        (vec!["true"], 0),
        (vec!["sh", "-c", "kill -9 $$"], 128 + 9),
    ] {
        let id = id(&format!("exit{want}"));
        let mut b = Bundle::new(&args, Some(test_cgroup(&id)));
        // A pid namespace's init cannot SIGKILL itself; without one, sh can.
        b.without_namespace("pid");
        let out = rt.run(&["run", "--bundle", b.path().to_str().unwrap(), &id]);
        assert_eq!(
            out.status.code(),
            Some(want),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // run deletes what it created.
        assert!(!rt.run(&["state", &id]).status.success());
    }
}

#[test]
fn run_stdout_reaches_the_caller() {
    if !require_root("run_stdout_reaches_the_caller") {
        return;
    }
    let rt = Runtime::new();
    let id = id("stdout");
    let b = Bundle::new(
        &["sh", "-c", "echo hello from h5i-runc; id -u"],
        Some(test_cgroup(&id)),
    );
    let out = rt.ok(&["run", "--bundle", b.path().to_str().unwrap(), &id]);
    assert_eq!(out, "hello from h5i-runc\n0\n");
}

#[test]
fn missing_container_says_does_not_exist() {
    if !require_root("missing_container_says_does_not_exist") {
        return;
    }
    let rt = Runtime::new();
    for verb in [
        vec!["state", "nope"],
        vec!["delete", "nope"],
        vec!["delete", "--force", "nope"],
        vec!["kill", "nope", "TERM"],
        vec!["start", "nope"],
        vec!["exec", "nope", "true"],
        vec!["ps", "nope"],
        vec!["pause", "nope"],
        vec!["resume", "nope"],
    ] {
        let out = rt.run(&verb);
        assert!(!out.status.success(), "{verb:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("container nope does not exist"),
            "{verb:?}: {err}"
        );
        // Tools that scan a runtime's stderr look for "error" (runc: `level=error`).
        assert!(err.contains("error"), "{verb:?}: {err}");
    }
}

#[test]
fn log_file_gets_runc_json_errors() {
    if !require_root("log_file_gets_runc_json_errors") {
        return;
    }
    let rt = Runtime::new();
    let log = rt.root.path().join("log.json");
    let out = rt
        .cmd()
        .args([
            "--log",
            log.to_str().unwrap(),
            "--log-format",
            "json",
            "state",
            "nope",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text = std::fs::read_to_string(&log).unwrap();
    let line: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(line["level"], "error");
    assert!(line["msg"].as_str().unwrap().contains("does not exist"));
    assert!(line["time"].is_string());
}

#[test]
fn kill_and_delete_of_a_stopped_container() {
    if !require_root("kill_and_delete_of_a_stopped_container") {
        return;
    }
    let rt = Runtime::new();
    let id = id("stopped");
    let b = Bundle::new(&["true"], Some(test_cgroup(&id)));
    rt.ok(&["create", "--bundle", b.path().to_str().unwrap(), &id]);
    let pid = rt.pid(&id);
    rt.ok(&["start", &id]);
    assert!(wait_exit(pid, WAIT));
    assert_eq!(rt.status(&id), "stopped");
    // A plain kill of a stopped container is refused (nothing to signal), a wrong-state answer
    // that says `error` like every other (tools scanning stderr rely on it) ...
    let out = rt.run(&["kill", &id, "TERM"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("error") && err.contains(&id), "{err}");
    // ... kill --all is allowed (it signals whatever is left in the cgroup: nothing).
    rt.ok(&["kill", "--all", &id, "KILL"]);
    rt.ok(&["delete", &id]);
    assert!(!rt.run(&["state", &id]).status.success());
}

#[test]
fn delete_of_running_needs_force_and_force_kills() {
    if !require_root("delete_of_running_needs_force_and_force_kills") {
        return;
    }
    let rt = Runtime::new();
    let id = id("force");
    let b = Bundle::new(&["sleep", "600"], Some(test_cgroup(&id)));
    rt.ok(&["create", "--bundle", b.path().to_str().unwrap(), &id]);
    let pid = rt.pid(&id);
    rt.ok(&["start", &id]);
    let out = rt.run(&["delete", &id]);
    assert!(
        !out.status.success(),
        "delete of a running container must be refused"
    );
    // Wrong-state answers say `error`, like runc's `level=error`.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("error") && err.contains(&id), "{err}");
    let out = rt.run(&["start", &id]);
    assert!(!out.status.success(), "start of a running container");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("error") && err.contains(&id), "{err}");
    assert_eq!(rt.status(&id), "running");
    rt.ok(&["delete", "--force", &id]);
    assert!(wait_exit(pid, WAIT), "delete --force did not kill init");
    assert!(!rt.run(&["state", &id]).status.success());
}

#[test]
fn kill_running_container_with_term_and_all() {
    if !require_root("kill_running_container_with_term_and_all") {
        return;
    }
    let rt = Runtime::new();
    // TERM: sh traps it and exits 42 (pid 1 ignores default-action signals).
    let id = id("term");
    let b = Bundle::new(
        &[
            "sh",
            "-c",
            "trap 'exit 42' TERM; while true; do sleep 1; done",
        ],
        Some(test_cgroup(&id)),
    );
    rt.ok(&["create", "--bundle", b.path().to_str().unwrap(), &id]);
    let pid = rt.pid(&id);
    rt.ok(&["start", &id]);
    rt.ok(&["kill", &id]); // default signal: SIGTERM
    assert!(wait_exit(pid, WAIT), "init did not handle SIGTERM");
    rt.ok(&["delete", &id]);

    let id = format!("{id}-all");
    let b = Bundle::new(
        &["sh", "-c", "sleep 600 & sleep 600 & wait"],
        Some(test_cgroup(&id)),
    );
    rt.ok(&["create", "--bundle", b.path().to_str().unwrap(), &id]);
    let pid = rt.pid(&id);
    rt.ok(&["start", &id]);
    rt.ok(&["kill", "--all", &id, "9"]);
    assert!(wait_exit(pid, WAIT));
    rt.ok(&["delete", &id]);
}

#[test]
fn delete_of_created_container_kills_init() {
    if !require_root("delete_of_created_container_kills_init") {
        return;
    }
    let rt = Runtime::new();
    let id = id("created");
    let b = Bundle::new(&["true"], Some(test_cgroup(&id)));
    rt.ok(&["create", "--bundle", b.path().to_str().unwrap(), &id]);
    let pid = rt.pid(&id);
    rt.ok(&["delete", &id]);
    assert!(wait_exit(pid, WAIT));
}

#[test]
fn exec_into_a_running_container() {
    if !require_root("exec_into_a_running_container") {
        return;
    }
    let rt = Runtime::new();
    let id = id("exec");
    let b = Bundle::new(&["sleep", "600"], Some(test_cgroup(&id)));
    rt.ok(&["create", "--bundle", b.path().to_str().unwrap(), &id]);
    rt.ok(&["start", &id]);

    // Plain `exec ID CMD...`: output and exit status pass through.
    let out = rt.ok(&[
        "exec",
        &id,
        "sh",
        "-c",
        "echo in-container; cat /proc/1/cmdline",
    ]);
    assert_eq!(out, "in-container\nsleep\u{0}600\u{0}");
    let out = rt.run(&["exec", &id, "sh", "-c", "exit 5"]);
    assert_eq!(out.status.code(), Some(5));

    // Podman's form: --process FILE --detach --pid-file P.
    let process = serde_json::json!({
        "terminal": false,
        "user": {"uid": 0, "gid": 0},
        "args": ["sh", "-c", "echo detached > /tmp/marker; sleep 600"],
        "env": ["PATH=/bin"],
        "cwd": "/"
    });
    let pfile = b.path().join("process.json");
    std::fs::write(&pfile, process.to_string()).unwrap();
    let pid_file = b.path().join("exec.pid");
    rt.ok(&[
        "exec",
        "--process",
        pfile.to_str().unwrap(),
        "--detach",
        "--pid-file",
        pid_file.to_str().unwrap(),
        &id,
    ]);
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(
        status.contains("State:"),
        "detached exec process {pid} is not alive"
    );
    // The detached process is in the container: its marker appears in the container's /tmp.
    let out = rt.ok(&[
        "exec",
        &id,
        "sh",
        "-c",
        "while [ ! -s /tmp/marker ]; do sleep 0.05; done; cat /tmp/marker",
    ]);
    assert_eq!(out, "detached\n");
    // ps lists init, the detached process (and not the finished ones).
    let pids: Vec<i32> = serde_json::from_str(&rt.ok(&["ps", "--format", "json", &id])).unwrap();
    assert!(
        pids.contains(&rt.pid(&id)) && pids.contains(&pid),
        "{pids:?}"
    );
    let table = rt.ok(&["ps", &id]);
    assert!(
        table.starts_with("PID\tCMD\n") && table.contains("sleep 600"),
        "{table}"
    );

    rt.ok(&["delete", "--force", &id]);
    assert!(
        wait_exit(pid, WAIT),
        "exec'd process survived delete --force"
    );
}

#[test]
fn pause_and_resume() {
    if !require_root("pause_and_resume") {
        return;
    }
    let rt = Runtime::new();
    let id = id("pause");
    let b = Bundle::new(&["sleep", "600"], Some(test_cgroup(&id)));
    rt.ok(&["create", "--bundle", b.path().to_str().unwrap(), &id]);
    rt.ok(&["start", &id]);
    rt.ok(&["pause", &id]);
    assert_eq!(rt.status(&id), "paused");
    assert!(
        is_frozen(&id),
        "freezer does not report the container frozen"
    );
    rt.ok(&["resume", &id]);
    assert_eq!(rt.status(&id), "running");
    assert!(!is_frozen(&id));
    rt.ok(&["delete", "--force", &id]);
}

fn is_frozen(id: &str) -> bool {
    let cg = test_cgroup(id);
    let v1 = format!("/sys/fs/cgroup/freezer{cg}/freezer.state");
    match std::fs::read_to_string(&v1) {
        Ok(s) => s.trim() == "FROZEN",
        Err(_) => {
            std::fs::read_to_string(format!("/sys/fs/cgroup{cg}/cgroup.freeze"))
                .unwrap()
                .trim()
                == "1"
        }
    }
}

/// Receive one fd over a unix stream (the OCI console-socket protocol: SCM_RIGHTS).
fn recv_fd(stream: &std::os::unix::net::UnixStream) -> OwnedFd {
    let mut data = [0u8; 256];
    let got =
        h5i_sys::fd_passing::recv_with_fds(stream, &mut data, 1, h5i_sys::fd_passing::Wait::Block)
            .unwrap();
    got.fds
        .into_iter()
        .next()
        .expect("no control message: no fd was sent")
}

#[test]
fn console_socket_receives_the_pty_master() {
    if !require_root("console_socket_receives_the_pty_master") {
        return;
    }
    let rt = Runtime::new();
    let id = id("console");
    let mut b = Bundle::new(&["sh", "-c", "echo hello-tty; tty"], Some(test_cgroup(&id)));
    b.terminal(true);
    let sock = b.path().join("console.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let receiver = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        recv_fd(&stream)
    });
    rt.ok(&[
        "create",
        "--bundle",
        b.path().to_str().unwrap(),
        "--console-socket",
        sock.to_str().unwrap(),
        &id,
    ]);
    let master = receiver.join().unwrap();
    let pid = rt.pid(&id);
    rt.ok(&["start", &id]);
    assert!(wait_exit(pid, WAIT));
    let mut out = Vec::new();
    let mut f = std::fs::File::from(master);
    let mut buf = [0u8; 1024];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.raw_os_error() == Some(libc::EIO) => break, // slave closed
            Err(e) => panic!("reading pty master: {e}"),
        }
    }
    let text = String::from_utf8_lossy(&out);
    assert!(text.contains("hello-tty"), "{text:?}");
    assert!(
        text.contains("/dev/pts/") || text.contains("/dev/console"),
        "not a tty: {text:?}"
    );
    rt.ok(&["delete", &id]);
}

#[test]
fn preserve_fds_passes_extra_descriptors() {
    if !require_root("preserve_fds_passes_extra_descriptors") {
        return;
    }
    let rt = Runtime::new();
    let id = id("fds");
    let b = Bundle::new(
        &["sh", "-c", "echo through-fd3 >&3"],
        Some(test_cgroup(&id)),
    );
    let (mut r, w) = std::io::pipe().unwrap();
    let w: OwnedFd = w.into();
    let mut cmd = rt.cmd();
    cmd.args([
        "run",
        "--preserve-fds",
        "1",
        "--bundle",
        b.path().to_str().unwrap(),
        &id,
    ]);
    let raw = w.as_raw_fd();
    // SAFETY: dup2 in the child before exec; only async-signal-safe calls.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            if libc::dup2(raw, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let status = cmd.stdin(Stdio::null()).status().unwrap();
    drop(w);
    assert!(status.success());
    let mut s = String::new();
    r.read_to_string(&mut s).unwrap();
    assert_eq!(s, "through-fd3\n");
}

#[test]
fn cgroup_is_placed_under_own_cgroup_when_spec_has_none_and_removed_on_delete() {
    if !require_root("cgroup_is_placed_under_own_cgroup_when_spec_has_none_and_removed_on_delete") {
        return;
    }
    let rt = Runtime::new();
    let id = id("placed");
    let b = Bundle::new(&["sleep", "600"], None);
    rt.ok(&["create", "--bundle", b.path().to_str().unwrap(), &id]);
    let pid = rt.pid(&id);
    rt.ok(&["start", &id]);
    let own = own_cgroup();
    let want = format!("{}/h5i-runc/{id}", own.trim_end_matches('/'));
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let mem = cg
        .lines()
        .find(|l| l.contains(":memory:") || l.starts_with("0::"))
        .unwrap();
    assert!(mem.ends_with(&want), "init's cgroup {mem} is not {want}");
    assert!(!cg.contains(":youki:"), "{cg}");
    // The caller's bundle is untouched and reported by state.
    let st = rt.state(&id);
    assert_eq!(
        st["bundle"].as_str().unwrap(),
        b.path().canonicalize().unwrap().to_str().unwrap()
    );
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(b.path().join("config.json")).unwrap())
            .unwrap();
    assert!(cfg["linux"].get("cgroupsPath").is_none());
    // exec'd processes land in the same cgroup.
    let out = rt.ok(&["exec", &id, "cat", "/proc/self/cgroup"]);
    assert!(!out.contains("youki"), "{out}");

    rt.ok(&["delete", "--force", &id]);
    assert!(wait_exit(pid, WAIT));
    let leaf = if cg.contains(":memory:") {
        format!("/sys/fs/cgroup/memory{want}")
    } else {
        format!("/sys/fs/cgroup{want}")
    };
    assert!(!std::path::Path::new(&leaf).exists(), "{leaf} left behind");
    assert!(
        !rt.root.path().join(".h5i").join(&id).exists(),
        "sidecar left behind"
    );
}

#[test]
fn runtime_binary_is_a_sealed_memfd_while_running() {
    if !require_root("runtime_binary_is_a_sealed_memfd_while_running") {
        return;
    }
    let rt = Runtime::new();
    let id = id("sealed");
    let b = Bundle::new(&["sh", "-c", "read line"], Some(test_cgroup(&id)));
    let mut child = rt
        .cmd()
        .args(["run", "--bundle", b.path().to_str().unwrap(), &id])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    // The foreground `run` process stays alive while the container reads stdin.
    let runc_pid = child.id();
    // Its container appears once create finished (bounded wait on the runtime's own state).
    let mut started = false;
    for _ in 0..400 {
        if rt.run(&["state", &id]).status.success() {
            started = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    assert!(started, "container never appeared");
    let exe = std::fs::read_link(format!("/proc/{runc_pid}/exe")).unwrap();
    let exe = exe.to_string_lossy().into_owned();
    assert!(
        exe.starts_with("/memfd:h5i-runc"),
        "runtime runs from {exe}"
    );
    // A write through /proc/<pid>/exe (the CVE-2019-5736 move) is refused.
    let w = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/proc/{runc_pid}/exe"));
    match w {
        Err(e) => assert!(
            matches!(e.raw_os_error(), Some(libc::ETXTBSY | libc::EPERM)),
            "{e}"
        ),
        Ok(mut f) => {
            use std::io::Write;
            let e = f.write_all(b"x").unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EPERM));
        }
    }
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"done\n").unwrap();
    }
    assert!(child.wait().unwrap().success());
}

#[test]
fn features_and_version_print_without_state() {
    let out = std::process::Command::new(bin())
        .arg("features")
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["annotations"]["h5i.landlock"].is_string());
    let list = v["h5i"]["seccomp"]["h5i-v1"].as_array().unwrap();
    assert!(list.iter().any(|e| e["syscall"] == "unshare"));
    // The socket gate h5i-runc puts into supervised specs is declared, in OCI form.
    let actions = v["linux"]["seccomp"]["actions"].as_array().unwrap();
    assert!(
        actions.iter().any(|a| a == "SCMP_ACT_NOTIFY"),
        "{actions:?}"
    );
    let gate = v["annotations"]["org.h5i.socket-gate"].as_str().unwrap();
    assert!(
        gate.contains("h5i.net=supervised") && gate.contains("SCMP_ACT_NOTIFY"),
        "{gate}"
    );
    assert!(v["annotations"]["org.h5i.net-dir"].is_string());
    assert!(v["annotations"]["io.github.seccomp.libseccomp.version"].is_string());
    let out = std::process::Command::new(bin())
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("h5i-runc"));
}

#[test]
fn systemd_cgroup_flag_parses_and_is_refused_clearly() {
    let out = std::process::Command::new(bin())
        .args([
            "--systemd-cgroup",
            "--root",
            "/nonexistent-h5i",
            "state",
            "x",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--systemd-cgroup is not supported"));
}

// ---------------------------------------------------------------------------------------------
// h5i annotations

const LANDLOCK_RULES: &str = r#"{"read":["/"],"write":["/tmp","/dev"],"bind_tcp":[8080]}"#;

#[test]
fn landlock_annotation_write_outside_granted_paths_is_eacces() {
    if !require_root("landlock_annotation_write_outside_granted_paths_is_eacces") {
        return;
    }
    let rt = Runtime::new();
    let script =
        "probe write /etc/h5i-denied; probe write /tmp/h5i-allowed; probe read /etc/passwd; \
                  probe bind 8080; probe bind 8081";
    // Control: the same bundle without the annotation writes where it likes.
    let id_c = id("ll-control");
    let b = Bundle::new(&["sh", "-c", script], Some(test_cgroup(&id_c)));
    let control = probe_results(&rt.ok(&["run", "--bundle", b.path().to_str().unwrap(), &id_c]));
    assert_eq!(result_of(&control, "write"), "OK");
    assert!(b.rootfs().join("etc/h5i-denied").exists());
    std::fs::remove_file(b.rootfs().join("etc/h5i-denied")).unwrap();

    let id = id("ll");
    let mut b = Bundle::new(&["sh", "-c", script], Some(test_cgroup(&id)));
    b.annotate("h5i.landlock", LANDLOCK_RULES);
    let out = rt.ok(&["run", "--bundle", b.path().to_str().unwrap(), &id]);
    let r = probe_results(&out);
    let writes: Vec<&str> = r
        .iter()
        .filter(|(n, _)| n == "write")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(writes, ["EACCES", "OK"], "{out}");
    assert_eq!(result_of(&r, "read"), "OK");
    let binds: Vec<&str> = r
        .iter()
        .filter(|(n, _)| n == "bind")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(binds, ["OK", "EACCES"], "{out}");
    assert!(!b.rootfs().join("etc/h5i-denied").exists());
    assert!(b.rootfs().join("tmp/h5i-allowed").exists());
}

#[test]
fn landlock_annotation_confines_exec_processes_too() {
    if !require_root("landlock_annotation_confines_exec_processes_too") {
        return;
    }
    let rt = Runtime::new();
    let id = id("ll-exec");
    let mut b = Bundle::new(&["sleep", "600"], Some(test_cgroup(&id)));
    b.annotate("h5i.landlock", LANDLOCK_RULES);
    rt.ok(&["create", "--bundle", b.path().to_str().unwrap(), &id]);
    rt.ok(&["start", &id]);
    let out = rt.ok(&["exec", &id, "probe", "write", "/etc/h5i-exec"]);
    assert_eq!(out.trim(), "write=EACCES");
    rt.ok(&["delete", "--force", &id]);
}

#[test]
fn landlock_annotation_malformed_is_refused_at_create_and_leaves_nothing() {
    if !require_root("landlock_annotation_malformed_is_refused_at_create_and_leaves_nothing") {
        return;
    }
    let rt = Runtime::new();
    for (n, bad) in [r#"{"reed":["/"]}"#, r#"{"write":["tmp"]}"#, "not json"]
        .iter()
        .enumerate()
    {
        let id = id(&format!("ll-bad{n}"));
        let mut b = Bundle::new(&["true"], None);
        b.annotate("h5i.landlock", bad);
        let out = rt.run(&["create", "--bundle", b.path().to_str().unwrap(), &id]);
        assert!(!out.status.success(), "{bad} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("h5i.landlock"), "{bad}: {err}");
        assert!(
            !rt.run(&["state", &id]).status.success(),
            "{bad}: container left behind"
        );
        assert!(
            !rt.root.path().join(".h5i").join(&id).exists(),
            "{bad}: sidecar left behind"
        );
    }
}

#[test]
fn seccomp_h5i_v1_denies_listed_syscalls_despite_capabilities() {
    if !require_root("seccomp_h5i_v1_denies_listed_syscalls_despite_capabilities") {
        return;
    }
    let rt = Runtime::new();
    let caps = ["CAP_SYS_ADMIN", "CAP_NET_RAW", "CAP_SYS_PTRACE"];
    let id_c = id("sc-control");
    let mut b = Bundle::new(&["probe", "syscalls"], Some(test_cgroup(&id_c)));
    b.add_caps(&caps);
    let control = probe_results(&rt.ok(&["run", "--bundle", b.path().to_str().unwrap(), &id_c]));

    let id = id("sc");
    let mut b = Bundle::new(&["probe", "syscalls"], Some(test_cgroup(&id)));
    b.add_caps(&caps);
    b.annotate("h5i.seccomp", "h5i-v1");
    let out = rt.ok(&["run", "--bundle", b.path().to_str().unwrap(), &id]);
    let confined = probe_results(&out);

    let denied = [
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "unshare",
        "setns",
        "clone_newuser",
        "clone_newns",
        "clone_newnet",
        "clone_newpid_highbits",
        "mount",
        "umount2",
        "pivot_root",
        "open_tree",
        "fsopen",
        "fspick",
        "mount_setattr",
        "keyctl",
        "add_key",
        "request_key",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "io_uring_setup",
        "kexec_load",
        "init_module",
        "delete_module",
        "personality_addr_no_randomize",
        "ioctl_tiocsti",
        "ioctl_tiocsti_highbits",
        "ioctl_tioclinux",
        "socket_packet",
        "socket_inet_raw",
        "socket_inet6_raw_cloexec",
    ];
    for name in denied {
        assert_eq!(
            result_of(&confined, name),
            "EPERM",
            "{name} not denied:\n{out}"
        );
    }
    assert_eq!(result_of(&confined, "clone3"), "ENOSYS");
    for allowed in [
        "clone_plain",
        "personality_query",
        "personality_linux",
        "socket_inet_stream",
    ] {
        assert_eq!(
            result_of(&confined, allowed),
            "OK",
            "{allowed} broken:\n{out}"
        );
    }
    assert_eq!(
        result_of(&confined, "ioctl_fionread"),
        result_of(&control, "ioctl_fionread")
    );
    // The control proves the test can fail: without the annotation, most of these are not EPERM.
    let not_eperm_in_control = denied
        .iter()
        .filter(|n| result_of(&control, n) != "EPERM")
        .count();
    assert!(
        not_eperm_in_control >= 25,
        "control run looks filtered too: {control:?}"
    );
    assert_eq!(result_of(&control, "clone3"), "OK");
}

/// The default-deny base: a call h5i-v1 leaves alone answers ENOSYS under h5i-v2, while every
/// deny-list entry keeps its own errno (EPERM) through the layering.
#[test]
fn seccomp_h5i_v2_answers_enosys_outside_its_base_and_keeps_the_deny_lists_eperm() {
    if !require_root(
        "seccomp_h5i_v2_answers_enosys_outside_its_base_and_keeps_the_deny_lists_eperm",
    ) {
        return;
    }
    let rt = Runtime::new();
    let caps = [
        "CAP_SYS_ADMIN",
        "CAP_NET_RAW",
        "CAP_SYS_PTRACE",
        "CAP_SYSLOG",
    ];
    let mut answers = Vec::new();
    for profile in ["h5i-v1", "h5i-v2"] {
        let id = id(&format!("base-{profile}"));
        let mut b = Bundle::new(&["probe", "unlisted"], Some(test_cgroup(&id)));
        b.add_caps(&caps);
        b.annotate("h5i.seccomp", profile);
        answers.push(probe_results(&rt.ok(&[
            "run",
            "--bundle",
            b.path().to_str().unwrap(),
            &id,
        ])));
    }
    let (v1, v2) = (&answers[0], &answers[1]);
    // The control: without the base the kernel answers these itself.
    assert_eq!(result_of(v1, "kcmp"), "OK", "{v1:?}");
    assert_eq!(result_of(v1, "name_to_handle_at"), "EOVERFLOW", "{v1:?}");
    assert_eq!(result_of(v1, "syslog"), "OK", "{v1:?}");
    for call in ["kcmp", "name_to_handle_at", "syslog"] {
        assert_eq!(result_of(v2, call), "ENOSYS", "{call}: {v2:?}");
    }
    assert_eq!(result_of(v1, "unshare"), "EPERM");
    assert_eq!(
        result_of(v2, "unshare"),
        "EPERM",
        "deny list's errno under the base"
    );

    let id = id("base-syscalls");
    let mut b = Bundle::new(&["probe", "syscalls"], Some(test_cgroup(&id)));
    b.add_caps(&caps);
    b.annotate("h5i.seccomp", "h5i-v2");
    let out = rt.ok(&["run", "--bundle", b.path().to_str().unwrap(), &id]);
    let confined = probe_results(&out);
    for (name, want) in [
        ("ptrace", "EPERM"),
        ("mount", "EPERM"),
        ("bpf", "EPERM"),
        ("io_uring_setup", "EPERM"),
        ("clone_newuser", "EPERM"),
        ("ioctl_tiocsti", "EPERM"),
        ("clone3", "ENOSYS"),
        ("clone_plain", "OK"),
        ("socket_inet_stream", "OK"),
    ] {
        assert_eq!(result_of(&confined, name), want, "{name}:\n{out}");
    }
}

#[test]
fn seccomp_unshare_via_busybox_is_operation_not_permitted() {
    if !require_root("seccomp_unshare_via_busybox_is_operation_not_permitted") {
        return;
    }
    let rt = Runtime::new();
    let id = id("sc-unshare");
    let mut b = Bundle::new(&["unshare", "-r", "true"], Some(test_cgroup(&id)));
    b.annotate("h5i.seccomp", "h5i-v1");
    let out = rt.run(&["run", "--bundle", b.path().to_str().unwrap(), &id]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Operation not permitted"), "{err}");
}

#[test]
fn seccomp_net_unix_false_denies_unix_sockets_but_not_socketpair() {
    if !require_root("seccomp_net_unix_false_denies_unix_sockets_but_not_socketpair") {
        return;
    }
    let rt = Runtime::new();
    let id_on = id("unix-on");
    let mut b = Bundle::new(&["probe", "unix"], Some(test_cgroup(&id_on)));
    b.annotate("h5i.seccomp", "h5i-v1");
    let on = probe_results(&rt.ok(&["run", "--bundle", b.path().to_str().unwrap(), &id_on]));
    assert_eq!(result_of(&on, "socket_unix"), "OK");

    let id = id("unix-off");
    let mut b = Bundle::new(&["probe", "unix"], Some(test_cgroup(&id)));
    b.annotate("h5i.seccomp", "h5i-v1");
    b.annotate("h5i.net.unix", "false");
    let off = probe_results(&rt.ok(&["run", "--bundle", b.path().to_str().unwrap(), &id]));
    assert_eq!(result_of(&off, "socket_unix"), "EPERM");
    assert_eq!(result_of(&off, "socketpair_unix"), "OK");
}

#[test]
fn seccomp_applies_to_exec_processes_too() {
    if !require_root("seccomp_applies_to_exec_processes_too") {
        return;
    }
    let rt = Runtime::new();
    let id = id("sc-exec");
    let mut b = Bundle::new(&["sleep", "600"], Some(test_cgroup(&id)));
    b.add_caps(&["CAP_SYS_ADMIN"]);
    b.annotate("h5i.seccomp", "h5i-v1");
    rt.ok(&["create", "--bundle", b.path().to_str().unwrap(), &id]);
    rt.ok(&["start", &id]);
    let r = probe_results(&rt.ok(&["exec", &id, "probe", "syscalls"]));
    assert_eq!(result_of(&r, "unshare"), "EPERM");
    assert_eq!(result_of(&r, "mount"), "EPERM");
    rt.ok(&["delete", "--force", &id]);
}

#[test]
fn unknown_seccomp_profile_is_refused_at_create() {
    if !require_root("unknown_seccomp_profile_is_refused_at_create") {
        return;
    }
    let rt = Runtime::new();
    let id = id("sc-bad");
    let mut b = Bundle::new(&["true"], Some(test_cgroup(&id)));
    b.annotate("h5i.seccomp", "h5i-v0");
    let out = rt.run(&["create", "--bundle", b.path().to_str().unwrap(), &id]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("h5i-v0"));
    assert!(!rt.run(&["state", &id]).status.success());
}

#[test]
fn landlock_apply_failure_refuses_to_exec_the_payload() {
    if !require_root("landlock_apply_failure_refuses_to_exec_the_payload") {
        return;
    }
    // The payload runs as uid 1000 and is granted a path it cannot even stat: building the
    // ruleset fails inside the container, after `start`. The payload must not run at all.
    let rt = Runtime::new();
    let id = id("ll-apply-fail");
    let mut b = Bundle::new(&["sh", "-c", "echo ran > /tmp/ran"], Some(test_cgroup(&id)));
    std::fs::create_dir_all(b.rootfs().join("secret/inner")).unwrap();
    std::fs::set_permissions(
        b.rootfs().join("secret"),
        std::os::unix::fs::PermissionsExt::from_mode(0o000),
    )
    .unwrap();
    std::fs::set_permissions(
        b.rootfs().join("tmp"),
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .unwrap();
    b.config["process"]["user"] = serde_json::json!({"uid": 1000, "gid": 1000});
    b.save();
    b.annotate(
        "h5i.landlock",
        r#"{"read":["/","/secret/inner"],"write":["/tmp"]}"#,
    );
    let out = rt.run(&["run", "--bundle", b.path().to_str().unwrap(), &id]);
    assert!(
        !out.status.success(),
        "payload ran although Landlock could not be applied"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refusing to run"), "{err}");
    assert!(!b.rootfs().join("tmp/ran").exists(), "the payload ran");
}

#[test]
fn cgroup_mount_marked_ro_is_read_only_inside() {
    if !require_root("cgroup_mount_marked_ro_is_read_only_inside") {
        return;
    }
    let rt = Runtime::new();
    let v1 = !std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let target = if v1 {
        "/sys/fs/cgroup/memory/memory.limit_in_bytes"
    } else {
        "/sys/fs/cgroup/memory.max"
    };
    let script =
        format!("probe write {target}; grep -c ' /sys/fs/cgroup[^ ]* rw,' /proc/self/mountinfo");
    let mut results = Vec::new();
    for opt in ["rw", "ro"] {
        let id = id(&format!("cg-{opt}"));
        let mut b = Bundle::new(&["sh", "-c", &script], Some(test_cgroup(&id)));
        b.config["mounts"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({
                "destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
                "options": ["nosuid", "noexec", "nodev", "relatime", opt]
            }));
        b.save();
        let out = rt.run(&["run", "--bundle", b.path().to_str().unwrap(), &id]);
        results.push(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    // rw as asked (the control: the container could write its own limits) ...
    assert!(results[0].starts_with("write=OK\n"), "{}", results[0]);
    // ... and ro as asked: no cgroup mount is writable, the limit file refuses writers.
    assert_eq!(results[1], "write=EROFS\n0\n");
}

#[test]
fn run_forwards_signals_to_the_container() {
    if !require_root("run_forwards_signals_to_the_container") {
        return;
    }
    let rt = Runtime::new();
    let id = id("fwd");
    let b = Bundle::new(
        &[
            "sh",
            "-c",
            "trap 'exit 42' TERM; echo ready > /tmp/ready; while true; do sleep 1; done",
        ],
        Some(test_cgroup(&id)),
    );
    let mut child = rt
        .cmd()
        .args(["run", "--bundle", b.path().to_str().unwrap(), &id])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    // Wait for the payload to have installed its trap: it writes a file into its rootfs. The
    // payload is a process we cannot wait on, so this is a bounded retry (5 s at most).
    let ready = b.rootfs().join("tmp/ready");
    for _ in 0..200 {
        if ready.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    assert!(ready.exists(), "payload never became ready");
    // SAFETY: signalling the h5i-runc child this test spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(42),
        "SIGTERM was not forwarded to the payload"
    );
    assert!(
        !rt.run(&["state", &id]).status.success(),
        "run did not clean up"
    );
}

// ---------------------------------------------------------------------------------------------
// Conformance (issue 20): each found with a plain bundle against runc.

/// Mounts at or under `dir` in this process's mount table that are read-only.
fn readonly_mounts_under(mountinfo: &str, dir: &str) -> Vec<String> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (point, opts) = (*f.get(4)?, *f.get(5)?);
            let under = point == dir || point.starts_with(&format!("{dir}/"));
            (under && opts.split(',').any(|o| o == "ro")).then(|| point.to_string())
        })
        .collect()
}

/// `(mount point, mount options)` of every cgroup mount at `/sys/fs/cgroup` or beneath it.
fn cgroup_mount_flags(mountinfo: &str) -> Vec<(String, String)> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (point, opts) = (*f.get(4)?, *f.get(5)?);
            (point == "/sys/fs/cgroup" || point.starts_with("/sys/fs/cgroup/"))
                .then(|| (point.to_string(), opts.to_string()))
        })
        .collect()
}

#[test]
fn no_mount_namespace_leaves_the_hosts_cgroup_mounts_writable() {
    if !require_root("no_mount_namespace_leaves_the_hosts_cgroup_mounts_writable") {
        return;
    }
    let rt = Runtime::new();
    let id = id("nomntns");
    let mut b = Bundle::new(&["true"], Some(test_cgroup(&id)));
    b.without_namespace("mount");
    // Without a mount namespace libcontainer refuses masked and read-only paths (as runc).
    b.config["linux"]
        .as_object_mut()
        .unwrap()
        .retain(|k, _| k != "maskedPaths" && k != "readonlyPaths");
    b.config["mounts"] = serde_json::json!([
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
         "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]}
    ]);
    b.save();
    // The runtime shares its caller's mount namespace here: run it in a private one made for
    // this test, so a regression remounts that copy of /sys/fs/cgroup, not the machine's.
    let rootfs = b.rootfs().canonicalize().unwrap();
    let script = format!(
        "set -e; cat /proc/self/mountinfo; echo ---; \
         {bin} --root {root} create --bundle {bundle} {id}; \
         cat /proc/self/mountinfo; echo ---; \
         {bin} --root {root} start {id}; \
         {bin} --root {root} delete --force {id}; \
         cat /proc/self/mountinfo; echo ---; echo deleted",
        bin = bin(),
        root = rt.root.path().display(),
        bundle = b.path().display(),
    );
    let out = run_to_files(
        std::process::Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c"])
            .arg(&script),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let tables: Vec<&str> = stdout.split("---").collect();
    let (before, mountinfo, after) = (tables[0], tables[1], tables[2]);
    let host_ro = readonly_mounts_under(mountinfo, "/sys/fs/cgroup");
    assert!(
        host_ro.is_empty(),
        "the runtime's own cgroup mounts were remounted read-only: {host_ro:?}"
    );
    // Each of the host's cgroup mounts keeps its flags, while the container lives and after.
    let flags_before = cgroup_mount_flags(before);
    assert!(!flags_before.is_empty(), "no cgroup mounts seen: {before}");
    assert_eq!(flags_before, cgroup_mount_flags(mountinfo));
    assert_eq!(flags_before, cgroup_mount_flags(after));
    // The container's cgroup mount (under its rootfs, in the shared namespace) is read-only
    // as its spec asks.
    let inside = format!("{}/sys/fs/cgroup", rootfs.display());
    let ro = readonly_mounts_under(mountinfo, &inside);
    assert!(ro.contains(&inside), "{inside} is not read-only: {ro:?}");
    assert!(stdout.trim_end().ends_with("deleted"), "{stdout}\n{stderr}");
    assert!(!rt.root.path().join(&id).exists(), "state left behind");
}

#[test]
fn no_pid_namespace_on_cgroup_v1_mounts_the_containers_own_cgroup() {
    if !require_root("no_pid_namespace_on_cgroup_v1_mounts_the_containers_own_cgroup") {
        return;
    }
    if !cgroup_v1() {
        h5i_testsupport::skipped!("no_pid_namespace_on_cgroup_v1_mounts_the_containers_own_cgroup: needs cgroup v1 (the emulated cgroup mount)");
        return;
    }
    let rt = Runtime::new();
    let id = id("nopidns");
    // No cgroupsPath: placed under the caller's memory cgroup, which is not the hierarchy root.
    let mut b = Bundle::new(
        &[
            "sh",
            "-c",
            "echo pid=$$; cat /sys/fs/cgroup/memory/cgroup.procs",
        ],
        None,
    );
    b.without_namespace("pid");
    b.without_namespace("cgroup");
    b.config["mounts"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
            "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]
        }));
    b.save();
    let out = rt.run(&["run", "--bundle", b.path().to_str().unwrap(), &id]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The memory mount is the container's own cgroup: it lists the container's process.
    let pid = stdout.lines().find_map(|l| l.strip_prefix("pid=")).unwrap();
    assert!(
        stdout.lines().skip(1).any(|l| l == pid),
        "/sys/fs/cgroup/memory is not the container's cgroup: {stdout}"
    );
}

#[test]
fn relative_cgroups_path_stays_under_the_callers_memory_cgroup() {
    if !require_root("relative_cgroups_path_stays_under_the_callers_memory_cgroup") {
        return;
    }
    let rt = Runtime::new();
    let id = id("relcg");
    let rel = format!("h5i-rel-{}/{id}", std::process::id());
    let mut b = Bundle::new(&["cat", "/proc/self/cgroup"], Some(rel.clone()));
    // Without a cgroup namespace the container sees its cgroup as the host names it.
    b.without_namespace("cgroup");
    let out = rt.ok(&["run", "--bundle", b.path().to_str().unwrap(), &id]);
    let mem = out
        .lines()
        .find(|l| l.contains(":memory:") || l.starts_with("0::"))
        .unwrap();
    let want = format!("{}/{rel}", own_cgroup().trim_end_matches('/'));
    assert!(
        mem.ends_with(&format!(":{want}")),
        "memory cgroup {mem} is not under the caller's ({want}): it escapes the caller's limit"
    );
    // Everything made for it is gone again, under the caller and at the top.
    let top = format!("h5i-rel-{}", std::process::id());
    for h in cgroup_hierarchies() {
        for dir in [
            format!("{h}/{top}"),
            format!("{h}{}/{top}", own_cgroup().trim_end_matches('/')),
        ] {
            assert!(!std::path::Path::new(&dir).exists(), "{dir} left behind");
        }
    }
}

#[test]
fn overlapping_containers_leave_no_cgroup_directories_behind() {
    if !require_root("overlapping_containers_leave_no_cgroup_directories_behind") {
        return;
    }
    let rt = Runtime::new();
    // Both under one level that the first container's create makes in every hierarchy.
    let shared = format!("h5i-overlap-{}", std::process::id());
    let (a, b) = (id("overlap-a"), id("overlap-b"));
    let ba = Bundle::new(&["sleep", "600"], Some(format!("{shared}/{a}")));
    let bb = Bundle::new(&["sleep", "600"], Some(format!("{shared}/{b}")));
    rt.ok(&["create", "--bundle", ba.path().to_str().unwrap(), &a]);
    rt.ok(&["create", "--bundle", bb.path().to_str().unwrap(), &b]);
    // h5i-runc nests relative paths under the caller's memory cgroup in every hierarchy.
    let own = own_cgroup();
    let level: Vec<String> = cgroup_hierarchies()
        .iter()
        .map(|h| format!("{h}{}/{shared}", own.trim_end_matches('/')))
        .filter(|d| std::path::Path::new(d).exists())
        .collect();
    assert!(
        !level.is_empty(),
        "the shared level was not made under the caller's cgroup"
    );
    // The first one goes while the second still lives under the shared level ...
    rt.ok(&["delete", "--force", &a]);
    // ... and the second one's delete takes the shared level away with it.
    rt.ok(&["delete", "--force", &b]);
    let left: Vec<&String> = level
        .iter()
        .filter(|d| std::path::Path::new(d).exists())
        .collect();
    assert!(left.is_empty(), "cgroup directories left behind: {left:?}");
    for h in cgroup_hierarchies() {
        let top = format!("{h}/{shared}");
        assert!(
            !std::path::Path::new(&top).exists(),
            "{top} made at the top"
        );
    }
}

/// Every level of `<own>/h5i-runc/<id>` in every hierarchy, for the ids given.
fn default_cgroup_levels(ids: &[&str]) -> Vec<std::path::PathBuf> {
    let own = own_cgroup();
    let mut levels = Vec::new();
    for h in cgroup_hierarchies() {
        for id in ids {
            let mut dir = std::path::PathBuf::from(&h);
            for part in format!("{own}/h5i-runc/{id}")
                .split('/')
                .filter(|p| !p.is_empty())
            {
                dir.push(part);
                if !levels.contains(&dir) {
                    levels.push(dir.clone());
                }
            }
        }
    }
    levels
}

#[test]
fn no_cgroups_path_overlapping_containers_leave_no_cgroup_directories_behind() {
    if !require_root("no_cgroups_path_overlapping_containers_leave_no_cgroup_directories_behind") {
        return;
    }
    let rt = Runtime::new();
    let (a, b) = (id("nocgpath-a"), id("nocgpath-b"));
    let levels = default_cgroup_levels(&[&a, &b]);
    let existed: Vec<bool> = levels.iter().map(|d| d.exists()).collect();
    let ba = Bundle::new(&["sleep", "600"], None);
    let bb = Bundle::new(&["sleep", "600"], None);
    rt.ok(&["create", "--bundle", ba.path().to_str().unwrap(), &a]);
    rt.ok(&["create", "--bundle", bb.path().to_str().unwrap(), &b]);
    let memory_leaf = levels
        .iter()
        .find(|d| d.starts_with("/sys/fs/cgroup/memory") && d.ends_with(&a))
        .or_else(|| levels.iter().find(|d| d.ends_with(&a)))
        .unwrap();
    assert!(memory_leaf.is_dir(), "{} not made", memory_leaf.display());
    // The first goes while the second still lives under the shared levels, then the second.
    rt.ok(&["delete", "--force", &a]);
    rt.ok(&["delete", "--force", &b]);
    let left = empty_dirs_made(&levels, &existed);
    assert!(left.is_empty(), "cgroup directories left behind: {left:?}");
}

/// The directories of `levels` that did not exist before (`existed`) and are there now with no
/// cgroup beneath them: left behind. (A level with a child is another container's, in use.)
fn empty_dirs_made(levels: &[std::path::PathBuf], existed: &[bool]) -> Vec<String> {
    levels
        .iter()
        .zip(existed)
        .filter(|(d, was)| {
            !**was
                && std::fs::read_dir(d)
                    .is_ok_and(|mut entries| !entries.any(|e| e.is_ok_and(|e| e.path().is_dir())))
        })
        .map(|(d, _)| d.display().to_string())
        .collect()
}

/// A hook that writes its stdin (the OCI state) to `out`.
fn state_hook(sh: &str, out: &str) -> serde_json::Value {
    serde_json::json!({"path": sh, "args": ["sh", "-c", format!("cat > {out}")]})
}

#[test]
fn hooks_get_the_callers_bundle_and_the_status_the_spec_names() {
    if !require_root("hooks_get_the_callers_bundle_and_the_status_the_spec_names") {
        return;
    }
    let rt = Runtime::new();
    let id = id("hookstate");
    // No cgroupsPath: h5i-runc runs the container from its own adjusted copy of the spec.
    let mut b = Bundle::new(&["true"], None);
    let tmp = b.rootfs().canonicalize().unwrap().join("tmp");
    let host = |name: &str| state_hook("/bin/sh", tmp.join(name).to_str().unwrap());
    b.config["hooks"] = serde_json::json!({
        "prestart": [host("prestart")],
        "createRuntime": [host("createRuntime")],
        "createContainer": [host("createContainer")],
        // Runs in the container after pivot_root: its paths are the container's.
        "startContainer": [state_hook("/bin/sh", "/tmp/startContainer")],
        "poststart": [host("poststart")],
        "poststop": [host("poststop")],
    });
    b.annotate("org.h5i.test", "hook state");
    rt.ok(&["create", "--bundle", b.path().to_str().unwrap(), &id]);
    let pid = rt.pid(&id);
    rt.ok(&["start", &id]);
    assert!(wait_exit(pid, WAIT));
    rt.ok(&["delete", &id]);
    let bundle = b.path().canonicalize().unwrap();
    // runtime-spec: created after the create operation built the container (prestart,
    // createRuntime, createContainer, startContainer), running once the program runs
    // (poststart), stopped after delete (poststop); pid required while created or running,
    // as the container sees it for hooks run in its namespaces (pid 1 in its pid namespace).
    for (hook, status, want_pid) in [
        ("prestart", "created", Some(pid)),
        ("createRuntime", "created", Some(pid)),
        ("createContainer", "created", Some(1)),
        ("startContainer", "created", Some(1)),
        ("poststart", "running", Some(pid)),
        ("poststop", "stopped", None),
    ] {
        let text = std::fs::read_to_string(tmp.join(hook))
            .unwrap_or_else(|e| panic!("{hook} hook left no state: {e}"));
        let st: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(st["bundle"], bundle.to_str().unwrap(), "{hook}: {text}");
        assert_eq!(st["status"], status, "{hook}: {text}");
        assert_eq!(st["id"], id.as_str(), "{hook}: {text}");
        assert_eq!(
            st["annotations"]["org.h5i.test"], "hook state",
            "{hook}: {text}"
        );
        match want_pid {
            Some(p) => assert_eq!(st["pid"], p, "{hook}: {text}"),
            None => assert!(st.get("pid").is_none(), "{hook}: {text}"),
        }
    }
}

#[test]
fn failing_poststop_hook_is_a_warning_and_delete_finishes() {
    if !require_root("failing_poststop_hook_is_a_warning_and_delete_finishes") {
        return;
    }
    let rt = Runtime::new();
    let id = id("poststop");
    let mut b = Bundle::new(&["true"], Some(test_cgroup(&id)));
    let after = b.rootfs().canonicalize().unwrap().join("tmp/after-failure");
    b.config["hooks"] = serde_json::json!({
        "poststop": [
            {"path": "/bin/false"},
            state_hook("/bin/sh", after.to_str().unwrap()),
        ]
    });
    b.save();
    rt.ok(&["create", "--bundle", b.path().to_str().unwrap(), &id]);
    let pid = rt.pid(&id);
    rt.ok(&["start", &id]);
    assert!(wait_exit(pid, WAIT));
    let out = rt.run(&["delete", &id]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "delete failed: {err}");
    assert!(
        err.contains("warn") && err.contains("poststop hook failed"),
        "{err}"
    );
    assert!(!rt.root.path().join(&id).exists(), "state left behind");
    // The hook after the failing one still ran.
    let st: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&after).unwrap()).unwrap();
    assert_eq!(st["status"], "stopped");

    // A hook that lives in a bundle that is gone: `delete -f` still finishes.
    let id = format!("{id}-gone");
    let mut b = Bundle::new(&["sleep", "600"], Some(test_cgroup(&id)));
    let hook = b.path().canonicalize().unwrap().join("hook.sh");
    std::fs::write(&hook, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    b.config["hooks"] = serde_json::json!({"poststop": [{"path": hook}]});
    b.save();
    rt.ok(&["create", "--bundle", b.path().to_str().unwrap(), &id]);
    rt.ok(&["start", &id]);
    drop(b);
    let out = rt.run(&["delete", "--force", &id]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "delete -f failed: {err}");
    assert!(err.contains("poststop hook failed"), "{err}");
    assert!(!rt.run(&["state", &id]).status.success());
}

#[test]
fn disable_oom_killer_is_held_on_cgroup_v1() {
    if !require_root("disable_oom_killer_is_held_on_cgroup_v1") {
        return;
    }
    if !cgroup_v1() {
        h5i_testsupport::skipped!(
            "disable_oom_killer_is_held_on_cgroup_v1: memory.oom_control is cgroup v1 only"
        );
        return;
    }
    let rt = Runtime::new();
    let mut seen = Vec::new();
    for off in [false, true] {
        let id = id(&format!("oom-{off}"));
        let cg = test_cgroup(&id);
        let mut b = Bundle::new(&["sleep", "600"], Some(cg.clone()));
        b.config["linux"]["resources"]["memory"] =
            serde_json::json!({"limit": 64 * 1024 * 1024, "disableOOMKiller": off});
        b.save();
        rt.ok(&["create", "--bundle", b.path().to_str().unwrap(), &id]);
        let ctl = std::fs::read_to_string(format!("/sys/fs/cgroup/memory{cg}/memory.oom_control"))
            .unwrap();
        seen.push(ctl.lines().next().unwrap().to_string());
        rt.ok(&["delete", "--force", &id]);
    }
    assert_eq!(seen, ["oom_kill_disable 0", "oom_kill_disable 1"]);
}

#[test]
fn create_errors_name_their_cause() {
    if !require_root("create_errors_name_their_cause") {
        return;
    }
    let rt = Runtime::new();
    // capset: this machine's root lacks CAP_SYS_RESOURCE (HOST.md), so granting it fails in
    // the container's init.
    let id_caps = id("cause-caps");
    let mut b = Bundle::new(&["true"], Some(test_cgroup(&id_caps)));
    b.add_caps(&["CAP_SYS_RESOURCE"]);
    let caps_err = rt.run(&["create", "--bundle", b.path().to_str().unwrap(), &id_caps]);
    // proc mounted on a file.
    let id_proc = id("cause-proc");
    let b2 = Bundle::new(&["true"], Some(test_cgroup(&id_proc)));
    std::fs::remove_dir(b2.rootfs().join("proc")).unwrap();
    std::fs::write(b2.rootfs().join("proc"), "").unwrap();
    let proc_err = rt.run(&["create", "--bundle", b2.path().to_str().unwrap(), &id_proc]);

    let have_cap = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .map(|h| u64::from_str_radix(h.trim(), 16).unwrap() & (1 << 24) != 0)
        .unwrap();
    if have_cap {
        eprintln!("create_errors_name_their_cause: CAP_SYS_RESOURCE is held here; capset case not checked");
    } else {
        let err = String::from_utf8_lossy(&caps_err.stderr);
        assert!(!caps_err.status.success(), "{err}");
        assert!(
            err.contains("error")
                && err.contains("capset")
                && err.contains("Operation not permitted"),
            "{err}"
        );
    }
    let err = String::from_utf8_lossy(&proc_err.stderr);
    assert!(!proc_err.status.success(), "{err}");
    assert!(
        err.contains("error") && err.contains("proc must be mounted on ordinary directory"),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------------
// Rootless: h5i-runc run directly by the unprivileged test user (`support::rootless`).

#[test]
fn rootless_relative_cgroup_hook_state_poststop_failure_and_error_word() {
    let Some(r) =
        RootlessRunc::new("rootless_relative_cgroup_hook_state_poststop_failure_and_error_word")
    else {
        return;
    };
    let id = id("rootless");
    let rel = format!("rel-{}/{id}", std::process::id());
    let mut b = r.bundle(&["true"], Some(rel.clone()));
    let tmp = b.rootfs().canonicalize().unwrap().join("tmp");
    let host = |name: &str| state_hook("/bin/sh", tmp.join(name).to_str().unwrap());
    b.config["hooks"] = serde_json::json!({
        "prestart": [host("prestart")],
        "createContainer": [host("createContainer")],
        "startContainer": [state_hook("/bin/sh", "/tmp/startContainer")],
        "poststart": [host("poststart")],
        "poststop": [{"path": "/bin/false"}, host("poststop")],
    });
    b.save();
    r.ok(&["create", "--bundle", b.path().to_str().unwrap(), &id]);
    // The relative path is nested in the delegated memory cgroup (the caller's), not made at
    // the top where it would escape the caller's limit (and the user could not even write).
    let memory = r
        .cgroups
        .dirs
        .iter()
        .find(|d| d.starts_with("/sys/fs/cgroup/memory") || !cgroup_v1())
        .unwrap();
    let leaf = memory.join(&rel);
    assert!(leaf.is_dir(), "{} not made", leaf.display());
    let st: serde_json::Value = serde_json::from_str(&r.ok(&["state", &id])).unwrap();
    let pid = st["pid"].as_i64().unwrap() as i32;
    r.ok(&["start", &id]);
    assert!(wait_exit(pid, WAIT));
    // A wrong-state answer (start of a stopped container) says `error` too.
    let out = r.run(&["start", &id]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "start of a stopped container: {err}");
    assert!(err.contains("error") && err.contains(&id), "{err}");
    let out = r.run(&["delete", &id]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "delete failed: {err}");
    assert!(err.contains("poststop hook failed"), "{err}");

    let bundle = b.path().canonicalize().unwrap();
    for (hook, status) in [
        ("prestart", "created"),
        ("createContainer", "created"),
        ("startContainer", "created"),
        ("poststart", "running"),
        ("poststop", "stopped"),
    ] {
        let text = std::fs::read_to_string(tmp.join(hook))
            .unwrap_or_else(|e| panic!("{hook} hook left no state: {e}"));
        let st: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(st["bundle"], bundle.to_str().unwrap(), "{hook}: {text}");
        assert_eq!(st["status"], status, "{hook}: {text}");
    }
    for d in &r.cgroups.dirs {
        let made = d.join(format!("rel-{}", std::process::id()));
        assert!(!made.exists(), "{} left behind", made.display());
    }
    for h in cgroup_hierarchies() {
        let top = format!("{h}/rel-{}", std::process::id());
        assert!(
            !std::path::Path::new(&top).exists(),
            "{top} made at the top"
        );
    }
    let out = r.run(&["state", &id]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("error") && err.contains("does not exist"),
        "{err}"
    );
}

#[test]
fn rootless_no_mount_namespace_fails_like_runc_and_leaves_the_host_alone() {
    let Some(r) =
        RootlessRunc::new("rootless_no_mount_namespace_fails_like_runc_and_leaves_the_host_alone")
    else {
        return;
    };
    let id = id("rl-nomntns");
    let mut b = r.bundle(&["true"], None);
    b.without_namespace("mount");
    b.config["linux"]
        .as_object_mut()
        .unwrap()
        .retain(|k, _| k != "maskedPaths" && k != "readonlyPaths");
    b.config["mounts"] = serde_json::json!([
        {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
         "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]}
    ]);
    b.save();
    let script = format!(
        "cat /proc/self/mountinfo; echo ---; \
         $H5I_RUNC create --bundle {bundle} {id}; echo create=$?; echo ---; \
         cat /proc/self/mountinfo; echo ---; \
         $H5I_RUNC delete --force {id}; $H5I_RUNC state {id}; echo state=$?",
        bundle = b.path().display(),
    );
    let out = r.script_in_private_mounts(&script);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let parts: Vec<&str> = stdout.split("---").collect();
    assert_eq!(parts.len(), 4, "{stdout}\n{stderr}");
    // An unprivileged runtime without a mount namespace of the container's own cannot mount
    // anything (runc: "mount /, flags: 0x84000: operation not permitted"): create fails, and
    // says which mount and why.
    assert!(parts[1].contains("create=1"), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("level=error")
            && stderr.contains("mount \\\"/\\\"")
            && stderr.contains("Operation not permitted"),
        "{stderr}"
    );
    // The caller's cgroup mounts keep their flags.
    let before = cgroup_mount_flags(parts[0]);
    assert!(!before.is_empty(), "no cgroup mounts seen: {stdout}");
    assert_eq!(before, cgroup_mount_flags(parts[2]));
    assert!(readonly_mounts_under(parts[2], "/sys/fs/cgroup").is_empty());
    // Nothing of it is left: no container, no state, no cgroup.
    assert!(parts[3].contains("state=1"), "{stdout}\n{stderr}");
    r.assert_gone(&id);
}

#[test]
fn rootless_no_pid_namespace_on_cgroup_v1_mounts_the_containers_own_cgroup() {
    let Some(r) = RootlessRunc::new_on_v1(
        "rootless_no_pid_namespace_on_cgroup_v1_mounts_the_containers_own_cgroup",
        "needs cgroup v1 (the emulated cgroup mount)",
    ) else {
        return;
    };
    let id = id("rl-nopidns");
    let mut b = r.bundle(
        &[
            "sh",
            "-c",
            "echo pid=$$; cat /sys/fs/cgroup/memory/cgroup.procs; echo ---; cat /proc/self/mountinfo",
        ],
        None,
    );
    b.without_namespace("pid");
    b.without_namespace("cgroup");
    let mounts = b.config["mounts"].as_array_mut().unwrap();
    // Without a pid namespace of its own an unprivileged container cannot mount a fresh proc
    // (runc neither): it gets the caller's, bound.
    mounts[0] = serde_json::json!({"destination": "/proc", "type": "bind", "source": "/proc",
                                   "options": ["rbind"]});
    mounts.push(serde_json::json!({
        "destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
        "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]
    }));
    b.save();
    let stdout = r.ok(&["run", "--bundle", b.path().to_str().unwrap(), &id]);
    let (listing, mountinfo) = stdout.split_once("---").unwrap();
    // The memory mount is the container's own cgroup: it lists the container's process.
    let pid = listing
        .lines()
        .find_map(|l| l.strip_prefix("pid="))
        .unwrap();
    assert!(
        listing.lines().skip(1).any(|l| l == pid),
        "/sys/fs/cgroup/memory is not the container's cgroup: {stdout}"
    );
    // ... and read-only, as the spec asks, every hierarchy and the tmpfs above them.
    let cg = cgroup_mount_flags(mountinfo);
    assert!(cg.len() > 2, "{mountinfo}");
    for (point, opts) in &cg {
        assert!(opts.split(',').any(|o| o == "ro"), "{point} is {opts}");
    }
    r.assert_gone(&id);
}

#[test]
fn rootless_no_cgroups_path_overlapping_containers_leave_no_cgroup_directories_behind() {
    let Some(r) = RootlessRunc::new(
        "rootless_no_cgroups_path_overlapping_containers_leave_no_cgroup_directories_behind",
    ) else {
        return;
    };
    let (a, b) = (id("rl-overlap-a"), id("rl-overlap-b"));
    let ba = r.bundle(&["sleep", "600"], None);
    let bb = r.bundle(&["sleep", "600"], None);
    r.ok(&["create", "--bundle", ba.path().to_str().unwrap(), &a]);
    r.ok(&["create", "--bundle", bb.path().to_str().unwrap(), &b]);
    // Both under the caller's (the delegated) cgroup.
    for id in [&a, &b] {
        let leaf = r.memory_dir().join("h5i-runc").join(id);
        assert!(leaf.is_dir(), "{} not made", leaf.display());
    }
    let mut levels = Vec::new();
    for d in &r.cgroups.dirs {
        levels.extend([&a, &b].map(|id| d.join("h5i-runc").join(id)));
        levels.push(d.join("h5i-runc"));
    }
    r.ok(&["delete", "--force", &a]);
    r.ok(&["delete", "--force", &b]);
    let left: Vec<_> = levels.iter().filter(|d| d.exists()).collect();
    assert!(left.is_empty(), "cgroup directories left behind: {left:?}");
}

#[test]
fn rootless_delete_force_finishes_once_the_poststop_hooks_bundle_is_gone() {
    let Some(r) =
        RootlessRunc::new("rootless_delete_force_finishes_once_the_poststop_hooks_bundle_is_gone")
    else {
        return;
    };
    let id = id("rl-gone");
    let mut b = r.bundle(&["sleep", "600"], None);
    let hook = b.path().canonicalize().unwrap().join("hook.sh");
    std::fs::write(&hook, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    b.config["hooks"] = serde_json::json!({"poststop": [{"path": hook}]});
    b.save();
    r.ok(&["create", "--bundle", b.path().to_str().unwrap(), &id]);
    let st: serde_json::Value = serde_json::from_str(&r.ok(&["state", &id])).unwrap();
    let pid = st["pid"].as_i64().unwrap() as i32;
    r.ok(&["start", &id]);
    drop(b);
    let out = r.run(&["delete", "--force", &id]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "delete -f failed: {err}");
    assert!(
        err.contains("level=warning") && err.contains("poststop hook failed"),
        "{err}"
    );
    assert!(
        wait_exit(pid, WAIT),
        "the container's process outlived delete -f"
    );
    assert!(!r.run(&["state", &id]).status.success());
    r.assert_gone(&id);
}

#[test]
fn rootless_disable_oom_killer_is_held_on_cgroup_v1() {
    let Some(r) = RootlessRunc::new_on_v1(
        "rootless_disable_oom_killer_is_held_on_cgroup_v1",
        "memory.oom_control is cgroup v1 only",
    ) else {
        return;
    };
    let mut seen = Vec::new();
    for off in [false, true] {
        let id = id(&format!("rl-oom-{off}"));
        let mut b = r.bundle(&["sleep", "600"], None);
        b.config["linux"]["resources"] = serde_json::json!({
            "memory": {"limit": 64 * 1024 * 1024, "disableOOMKiller": off}
        });
        b.save();
        r.ok(&["create", "--bundle", b.path().to_str().unwrap(), &id]);
        let dir = r.memory_dir().join("h5i-runc").join(&id);
        let ctl = std::fs::read_to_string(dir.join("memory.oom_control")).unwrap();
        let limit = std::fs::read_to_string(dir.join("memory.limit_in_bytes")).unwrap();
        assert_eq!(limit.trim(), (64 * 1024 * 1024).to_string());
        seen.push(ctl.lines().next().unwrap().to_string());
        r.ok(&["delete", "--force", &id]);
    }
    assert_eq!(seen, ["oom_kill_disable 0", "oom_kill_disable 1"]);
}

#[test]
fn rootless_create_errors_name_their_cause() {
    let Some(r) = RootlessRunc::new("rootless_create_errors_name_their_cause") else {
        return;
    };
    // An unprivileged runtime maps one id: a process user outside the map cannot be set
    // (runc: "cannot set uid to unmapped user in user namespace"), and the answer says which
    // ids, not "failed syscall". (capset cannot fail here as it does for root: a user
    // namespace starts with every capability in its bounding set.)
    let id_user = id("rl-cause-user");
    let mut b = r.bundle(&["true"], None);
    b.config["process"]["user"] = serde_json::json!({"uid": 1000, "gid": 0});
    b.save();
    let out = r.run(&["create", "--bundle", b.path().to_str().unwrap(), &id_user]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("level=error")
            && err.contains("setresuid(1000)")
            && err.contains("Invalid argument")
            && !err.contains("failed syscall"),
        "{err}"
    );
    let id_proc = id("rl-cause-proc");
    let b2 = r.bundle(&["true"], None);
    std::fs::remove_dir(b2.rootfs().join("proc")).unwrap();
    std::fs::write(b2.rootfs().join("proc"), "").unwrap();
    let out = r.run(&["create", "--bundle", b2.path().to_str().unwrap(), &id_proc]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("level=error") && err.contains("proc must be mounted on ordinary directory"),
        "{err}"
    );
    // Neither failed create leaves a container behind.
    for id in [&id_user, &id_proc] {
        let out = r.run(&["state", id]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("level=error") && err.contains("does not exist"),
            "{err}"
        );
    }
    // A wrong-state answer says error too: starting a container twice.
    let id = id("rl-twice");
    let b3 = r.bundle(&["true"], None);
    r.ok(&["create", "--bundle", b3.path().to_str().unwrap(), &id]);
    r.ok(&["start", &id]);
    let again = r.run(&["start", &id]);
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(!again.status.success(), "{err}");
    assert!(
        err.contains("level=error") && err.contains("status"),
        "{err}"
    );
    r.ok(&["delete", "--force", &id]);
}

/// The README's join patch: an unprivileged runtime joins, by path, the user and network
/// namespaces of a container it made (h5i's browser sidecar joins its box's sandbox so). The
/// joined container is in the first one's namespaces, as its root; the same spec
/// naming a user namespace root made, or the caller's own, is refused and says why.
/// Without the patch the first join fails with "rootless container requires valid user
/// namespace definition".
#[test]
fn rootless_joins_the_user_and_network_namespaces_of_its_own_container_only() {
    let Some(r) = RootlessRunc::new(
        "rootless_joins_the_user_and_network_namespaces_of_its_own_container_only",
    ) else {
        return;
    };
    let holder = id("rl-join-holder");
    let hb = r.bundle(&["sleep", "120"], None);
    r.ok(&["create", "--bundle", hb.path().to_str().unwrap(), &holder]);
    // Started: before its exec the init's memory is still the runtime's (the initial user
    // namespace's), and its namespace files are closed to the unprivileged caller.
    r.ok(&["start", &holder]);
    let st: serde_json::Value = serde_json::from_str(&r.ok(&["state", &holder])).unwrap();
    let pid = st["pid"].as_i64().unwrap();
    let ns_of = |pid: i64, kind: &str| {
        std::fs::read_link(format!("/proc/{pid}/ns/{kind}"))
            .unwrap()
            .to_string_lossy()
            .into_owned()
    };
    let joiner = |user_ns: &str, net_ns: &str| {
        let mut b = r.bundle(
            &[
                "sh",
                "-c",
                "readlink /proc/self/ns/user; readlink /proc/self/ns/net; id -u",
            ],
            None,
        );
        let list = b.config["linux"]["namespaces"].as_array_mut().unwrap();
        list.retain(|n| n["type"] != "user" && n["type"] != "network");
        list.push(serde_json::json!({"type": "user", "path": user_ns}));
        list.push(serde_json::json!({"type": "network", "path": net_ns}));
        let linux = b.config["linux"].as_object_mut().unwrap();
        linux.remove("uidMappings");
        linux.remove("gidMappings");
        b.save();
        b
    };
    let b = joiner(
        &format!("/proc/{pid}/ns/user"),
        &format!("/proc/{pid}/ns/net"),
    );
    let joined = id("rl-join");
    let out = r.run(&["run", "--bundle", b.path().to_str().unwrap(), &joined]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        said,
        format!("{}\n{}\n0\n", ns_of(pid, "user"), ns_of(pid, "net")),
        "the joined container is not in the holder's namespaces"
    );
    r.ok(&["delete", "--force", &holder]);

    // Hostile: a user namespace root made (by its /proc path, which the kernel already keeps
    // the caller from opening, and bind-mounted where the caller can open it), and the caller's
    // own (the initial one).
    let mut roots = std::process::Command::new("unshare")
        .args(["--user", "--net", "sh", "-c", "echo in; exec sleep 120"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut word = [0u8; 3];
    roots.stdout.take().unwrap().read_exact(&mut word).unwrap();
    assert_eq!(&word, b"in\n");
    let root_pid = i64::from(roots.id());
    let own = std::fs::read_link("/proc/self/ns/user").unwrap();
    assert_ne!(ns_of(root_pid, "user"), own.to_string_lossy());
    let opened = Bound::new(r.dir.path(), root_pid);
    for (user_ns, net_ns, why) in [
        (
            format!("/proc/{root_pid}/ns/user"),
            format!("/proc/{root_pid}/ns/net"),
            "cannot open it: Permission denied",
        ),
        (
            opened.user.display().to_string(),
            opened.net.display().to_string(),
            "it is owned by uid 0, not the caller's",
        ),
        (
            "/proc/self/ns/user".to_string(),
            "/proc/self/ns/net".to_string(),
            "it has no parent the caller can see",
        ),
    ] {
        let b = joiner(&user_ns, &net_ns);
        let id = id("rl-join-foreign");
        let out = r.run(&["run", "--bundle", b.path().to_str().unwrap(), &id]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "joined {user_ns}: {err}");
        assert!(
            err.contains("level=error")
                && err.contains("only when the caller owns it")
                && err.contains(why),
            "{user_ns}: {err}"
        );
        assert!(String::from_utf8_lossy(&out.stdout).is_empty());
        r.assert_gone(&id);
    }
    drop(opened);
    roots.kill().unwrap();
    roots.wait().unwrap();
}

/// A process's user and network namespaces bind-mounted onto files in `dir` (readable by all),
/// unmounted on drop.
struct Bound {
    user: std::path::PathBuf,
    net: std::path::PathBuf,
}

impl Bound {
    fn new(dir: &std::path::Path, pid: i64) -> Bound {
        use std::os::unix::fs::PermissionsExt;
        let bound = Bound {
            user: dir.join("userns-of-root"),
            net: dir.join("netns-of-root"),
        };
        for (file, kind) in [(&bound.user, "user"), (&bound.net, "net")] {
            std::fs::write(file, "").unwrap();
            std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o644)).unwrap();
            let st = std::process::Command::new("mount")
                .arg("--bind")
                .arg(format!("/proc/{pid}/ns/{kind}"))
                .arg(file)
                .status()
                .unwrap();
            assert!(st.success(), "bind-mounting {kind} onto {}", file.display());
        }
        bound
    }
}

impl Drop for Bound {
    fn drop(&mut self) {
        for file in [&self.user, &self.net] {
            let _ = std::process::Command::new("umount").arg(file).status();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Crash safety (issue 20): h5i-runc killed with SIGKILL (no handler, no cleanup) at a random point
// of `create`, `start` and `delete --force`, as root and as the test user. After every kill the
// state directory is one Podman can clean up: `state` answers with a status or says the
// container does not exist (never a parse error), `delete --force` then succeeds or says "does
// not exist" (Podman's rule for a gone container), and afterwards nothing of the container is
// left (no state, no sidecar, no cgroup, no process, including an init a killed `create`
// orphaned before it saved a pid) and the id is free for a new container. Kill points are
// spread over each verb's own duration, measured first in the same run; the dice are seeded
// (`H5I_CRASH_SEED`, printed) so a failing trial can be replayed.

/// Trials per verb (`H5I_CRASH_TRIALS` overrides).
const CRASH_TRIALS: usize = 100;

/// A runtime the crash trials drive: root's, or the test user's.
trait Runc {
    /// `h5i-runc` with this runtime's state root; append the verb.
    fn command(&self) -> std::process::Command;
    /// As [`Runc::command`], with h5i-runc itself as the process spawned (no wrapper left
    /// waiting on it), so a kill lands on the runtime.
    fn killable(&self) -> std::process::Command {
        self.command()
    }
    /// The state root.
    fn state_root(&self) -> std::path::PathBuf;
    /// Where container `id`'s default cgroup goes, in every hierarchy.
    fn cgroup_leaves(&self, id: &str) -> Vec<std::path::PathBuf>;

    fn output(&self, args: &[&str]) -> std::process::Output {
        run_to_files(self.command().args(args))
    }

    fn must(&self, args: &[&str]) {
        success_stdout("h5i-runc", args, self.output(args));
    }

    /// Start `args`, SIGKILL it after `delay` (it may have finished by then), reap it.
    fn kill_after(&self, args: &[&str], delay: Duration) {
        let mut child = self
            .killable()
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Not a wait: where in the operation the kill lands.
        std::thread::sleep(delay);
        let _ = child.kill();
        child.wait().unwrap();
    }
}

impl Runc for Runtime {
    fn command(&self) -> std::process::Command {
        self.cmd()
    }

    fn state_root(&self) -> std::path::PathBuf {
        self.root.path().to_path_buf()
    }

    fn cgroup_leaves(&self, id: &str) -> Vec<std::path::PathBuf> {
        default_cgroup_levels(&[id])
            .into_iter()
            .filter(|d| d.ends_with(id))
            .collect()
    }
}

impl Runc for RootlessRunc {
    fn command(&self) -> std::process::Command {
        self.cmd()
    }

    fn killable(&self) -> std::process::Command {
        self.exec_cmd()
    }

    fn state_root(&self) -> std::path::PathBuf {
        self.dir.path().join("state")
    }

    fn cgroup_leaves(&self, id: &str) -> Vec<std::path::PathBuf> {
        self.cgroups
            .dirs
            .iter()
            .map(|d| d.join("h5i-runc").join(id))
            .collect()
    }
}

/// The bundle's init names the container id in its command line (`sh -c SCRIPT ID`, a shell
/// that stays), as does every h5i-runc process working on it (the init before its exec is one),
/// so a process a trial left behind is found by the id.
fn name_init_after(b: &mut Bundle, id: &str) {
    b.config["process"]["args"] = serde_json::json!(["sh", "-c", "sleep 600", id]);
    b.save();
}

/// Live processes whose command line has `id` as an argument.
fn processes_naming(id: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|arg| arg == id.as_bytes()))
        })
        .collect()
}

/// After a killed operation: `state` answers (a status, or "does not exist"), `delete --force`
/// ends whatever is there, and then nothing of `id` is left.
fn assert_recoverable(rt: &dyn Runc, id: &str, what: &str) {
    let out = rt.output(&["state", id]);
    if out.status.success() {
        let st: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{what}: state is not JSON ({e}): {out:?}"));
        let status = st["status"].as_str().unwrap_or_default();
        assert!(
            ["creating", "created", "running", "stopped", "paused"].contains(&status),
            "{what}: state says {st}"
        );
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("does not exist"),
            "{what}: state failed: {err}"
        );
    }
    let out = rt.output(&["delete", "--force", id]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() || err.contains("does not exist"),
        "{what}: delete --force failed: {err}\nprocesses naming it: {:?}",
        processes_naming(id)
            .iter()
            .map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default())
            .collect::<Vec<_>>()
    );
    let again = rt.output(&["state", id]);
    assert!(
        !again.status.success()
            && String::from_utf8_lossy(&again.stderr).contains("does not exist"),
        "{what}: the container is still there after delete --force"
    );
    for pid in processes_naming(id) {
        assert!(
            wait_exit(pid, WAIT),
            "{what}: process {pid} outlived delete --force: {:?}",
            std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default()
        );
    }
    let root = rt.state_root();
    for left in [root.join(id), root.join(".h5i").join(id)] {
        assert!(!left.exists(), "{what}: {} left", left.display());
    }
    let leaves: Vec<_> = rt
        .cgroup_leaves(id)
        .into_iter()
        .filter(|d| d.exists())
        .collect();
    assert!(leaves.is_empty(), "{what}: cgroups left: {leaves:?}");
}

/// Every verb killed at random points, `H5I_CRASH_TRIALS` (default [`CRASH_TRIALS`]) times each.
fn killed_verbs_recover(rt: &dyn Runc, b: &mut Bundle, test: &str) {
    let trials = std::env::var("H5I_CRASH_TRIALS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(CRASH_TRIALS);
    let bundle = b.path().to_str().unwrap().to_string();
    // How long each undisturbed verb takes here: kills land across that span.
    let probe = id("crash-probe");
    name_init_after(b, &probe);
    let timed = |args: &[&str]| {
        let t = std::time::Instant::now();
        rt.must(args);
        t.elapsed()
    };
    let spans = [
        timed(&["create", "--bundle", &bundle, &probe]),
        timed(&["start", &probe]),
        timed(&["delete", "--force", &probe]),
    ];
    let mut dice = support::dice::Dice::new(test);
    for trial in 0..trials {
        for (verb, span) in ["create", "start", "delete"].into_iter().zip(spans) {
            let id = id(&format!("crash-{verb}-{trial}"));
            name_init_after(b, &id);
            let delay = dice.within(span);
            let what = format!("{test}: {verb} trial {trial} killed after {delay:?} of {span:?}");
            match verb {
                "create" => rt.kill_after(&["create", "--bundle", &bundle, &id], delay),
                "start" => {
                    rt.must(&["create", "--bundle", &bundle, &id]);
                    rt.kill_after(&["start", &id], delay);
                }
                _ => {
                    rt.must(&["create", "--bundle", &bundle, &id]);
                    rt.must(&["start", &id]);
                    rt.kill_after(&["delete", "--force", &id], delay);
                }
            }
            assert_recoverable(rt, &id, &what);
            // The id is free again: a new container of that name is made and deleted.
            rt.must(&["create", "--bundle", &bundle, &id]);
            rt.must(&["delete", "--force", &id]);
        }
    }
}

#[test]
fn killed_create_start_and_delete_leave_a_state_directory_that_recovers() {
    let test = "killed_create_start_and_delete_leave_a_state_directory_that_recovers";
    if !require_root(test) {
        return;
    }
    let rt = Runtime::new();
    let mut b = Bundle::new(&["true"], None);
    killed_verbs_recover(&rt, &mut b, test);
}

#[test]
fn killed_create_start_and_delete_leave_a_state_directory_that_recovers_as_h5i_test() {
    let test = "killed_create_start_and_delete_leave_a_state_directory_that_recovers_as_h5i_test";
    let Some(r) = RootlessRunc::new(test) else {
        return;
    };
    let mut b = r.bundle(&["true"], None);
    killed_verbs_recover(&r, &mut b, test);
}
