//! The caller's stdio reaches a box's command as it would reach it outside, at every tier.
//!
//! Each row wires fds 0/1/2 of a command one way (`>/dev/null`, `2>/dev/null`, `</dev/null`,
//! `2>&-`, `>/dev/full`, pipes, a regular file, a pty) and runs the static probe
//! (`probe stdio OUT`: type, device, access mode, tty, what a one-byte write and a read get)
//! twice with the same wiring (the pty row: the same terminal, made once for both runs):
//! directly on the host, and as `h5i box run B -- ./probe ...`.
//! The two reports must be identical. Issue 14: `>/dev/null` at the process and supervised
//! tiers gave the box a read-only `/dev/null` (libcontainer's init reopens it with
//! `File::open`), so every write failed with EBADF. At the container tier Podman's conmon
//! replaced every descriptor with a pipe of its own (so `>/dev/full` gave ENOSPC to Podman,
//! never to the box); there the box gets a pty of its own on a terminal, never the caller's,
//! so the pty row's device number is the only field allowed to differ. So it is at the process
//! and supervised tiers (issue 21): a run on a terminal goes through the box's sandbox on a pty
//! the run's child opens inside the box and leads, proxied to the caller's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use common::caller::{container_image, Caller};
use common::{probe, pty_pair, require_root, stderr, with_controlling_terminal, Repo, H5I};

/// How one row wires the standard descriptors (the rest are pipes, stdin at EOF).
#[derive(Debug, Clone, Copy)]
enum Wiring {
    /// Pipes on 0, 1 and 2.
    Pipes,
    /// `>/dev/null`
    NullOut,
    /// `2>/dev/null`
    NullErr,
    /// `</dev/null`
    NullIn,
    /// `2>&-`
    ClosedErr,
    /// `>/dev/full`
    FullOut,
    /// `>>FILE`
    FileOut,
    /// A pty on 0, 1 and 2, the controlling terminal of the caller's session.
    Pty,
}

const ROWS: [Wiring; 8] = [
    Wiring::Pipes,
    Wiring::NullOut,
    Wiring::NullErr,
    Wiring::NullIn,
    Wiring::ClosedErr,
    Wiring::FullOut,
    Wiring::FileOut,
    Wiring::Pty,
];

/// One row: its wiring and, for the pty row, the terminal both of its runs are wired to. One
/// terminal per row, never one per run: a second pty made for the box's run gets whatever index
/// is free at that moment (another test's terminal, or a forked child of another test thread
/// still holding a copy of the first one, moves it), so two reports of two ptys would differ
/// for reasons that have nothing to do with the box.
struct Row {
    wiring: Wiring,
    /// The pty pair (master, slave) of a `Pty` row; the master outlives both runs, so the
    /// terminal never hangs up under either.
    tty: Option<(OwnedFd, OwnedFd)>,
}

impl Row {
    fn new(wiring: Wiring) -> Row {
        Row {
            wiring,
            tty: matches!(wiring, Wiring::Pty).then(pty_pair),
        }
    }
}

/// The read end of a pipe whose write end is already closed: a stdin at EOF before the command
/// starts (no race with the command's first read).
fn eof_pipe() -> File {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two new descriptors into the array.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both were just made and nothing else owns them.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(w);
    File::from(r)
}

/// Run `cmd` wired as `row` says; returns its exit code and what reached a captured stdout.
fn run_wired(mut cmd: Command, row: &Row, scratch: &Path) -> (Option<i32>, Vec<u8>) {
    let wiring = row.wiring;
    let null = |write: bool| {
        OpenOptions::new()
            .read(!write)
            .write(write)
            .open("/dev/null")
            .unwrap()
    };
    cmd.stdin(eof_pipe())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match wiring {
        Wiring::Pipes => {}
        Wiring::NullOut => {
            cmd.stdout(null(true));
        }
        Wiring::NullErr => {
            cmd.stderr(null(true));
        }
        Wiring::NullIn => {
            cmd.stdin(null(false));
        }
        Wiring::ClosedErr => {
            // SAFETY: only close(2) between fork and exec.
            unsafe {
                cmd.pre_exec(|| {
                    libc::close(2);
                    Ok(())
                });
            }
        }
        Wiring::FullOut => {
            cmd.stdout(OpenOptions::new().write(true).open("/dev/full").unwrap());
        }
        Wiring::FileOut => {
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(scratch.join("out.txt"))
                .unwrap();
            cmd.stdout(f);
        }
        Wiring::Pty => {
            let (_, slave) = row.tty.as_ref().expect("a pty row has its terminal");
            cmd.stdin(File::from(slave.try_clone().unwrap()))
                .stdout(File::from(slave.try_clone().unwrap()))
                .stderr(File::from(slave.try_clone().unwrap()));
            with_controlling_terminal(&mut cmd);
        }
    }
    let mut child = cmd.spawn().unwrap();
    let mut out = Vec::new();
    if let Some(mut s) = child.stdout.take() {
        s.read_to_end(&mut out).unwrap();
    }
    let mut err = Vec::new();
    if let Some(mut s) = child.stderr.take() {
        s.read_to_end(&mut err).unwrap();
    }
    let status = child.wait().unwrap();
    if status.code() != Some(0) {
        eprintln!("{wiring:?}: stderr: {}", String::from_utf8_lossy(&err));
    }
    (status.code(), out)
}

/// The probe run directly on the host wired as `row` says: its report and stdout.
fn on_host(row: &Row) -> (String, Vec<u8>) {
    let wiring = row.wiring;
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(probe());
    cmd.args(["stdio", "stdio.out"]).current_dir(dir.path());
    let (code, out) = run_wired(cmd, row, dir.path());
    assert_eq!(code, Some(0), "{wiring:?}: the probe failed on the host");
    (
        std::fs::read_to_string(dir.path().join("stdio.out")).unwrap(),
        out,
    )
}

/// The arguments of `h5i` that run the probe in box `name`.
const PROBE_RUN: [&str; 7] = ["box", "run", "b", "--", "./probe", "stdio", "stdio.out"];

/// The probe run in box `name` wired as `row` says.
fn in_box(r: &Repo, name: &str, row: &Row) -> (String, Vec<u8>) {
    let mut cmd = Command::new(H5I);
    cmd.args(["box", "run", name, "--", "./probe", "stdio", "stdio.out"])
        .current_dir(r.path());
    for k in ["H5I_AGENT", "H5I_DEFAULT_ISOLATION", "H5I_CREDENTIAL_PROXY"] {
        cmd.env_remove(k);
    }
    wired_in_box(cmd, &r.workspace(name), row)
}

/// `cmd` (an `h5i box run` of the probe) wired as `row` says: the report the probe left in `ws`.
fn wired_in_box(cmd: Command, ws: &Path, row: &Row) -> (String, Vec<u8>) {
    let wiring = row.wiring;
    let report = ws.join("stdio.out");
    let _ = std::fs::remove_file(&report);
    let scratch = tempfile::tempdir().unwrap();
    let (code, out) = run_wired(cmd, row, scratch.path());
    assert_eq!(code, Some(0), "{wiring:?}: `h5i box run` failed");
    (
        std::fs::read_to_string(&report)
            .unwrap_or_else(|e| panic!("{wiring:?}: no report from the box: {e}")),
        out,
    )
}

/// Every row, in a new box at `tier`: the box's report equals the host's (at a kernel tier, the
/// pty row's device number aside: the box's pty is its own).
fn every_row_matches_the_host_at(tier: &str) {
    let r = Repo::new();
    let name = "b";
    let out = r.h5i(&["box", "create", name, &format!("--isolation={tier}")]);
    assert!(out.status.success(), "create at {tier}: {}", stderr(&out));
    common::copy_program(probe(), &r.workspace(name).join("probe"));
    let mut diffs = Vec::new();
    for wiring in ROWS {
        let row = Row::new(wiring);
        let (host, host_out) = on_host(&row);
        let (boxed, box_out) = in_box(&r, name, &row);
        let (host, boxed) = if tier == "workspace" {
            (host, boxed)
        } else {
            (without_tty_devices(&host), without_tty_devices(&boxed))
        };
        if host != boxed || host_out != box_out {
            diffs.push(format!(
                "{wiring:?}:\n  host: {host:?} stdout {host_out:?}\n  box:  {boxed:?} stdout {box_out:?}"
            ));
        }
    }
    assert!(diffs.is_empty(), "{tier} tier:\n{}", diffs.join("\n"));
}

#[test]
fn workspace_tier_stdio_is_the_callers() {
    every_row_matches_the_host_at("workspace");
}

#[test]
fn process_tier_dev_null_stdout_is_writable_and_every_wiring_is_the_callers() {
    every_row_matches_the_host_at("process");
}

#[test]
fn supervised_tier_dev_null_stdout_is_writable_and_every_wiring_is_the_callers() {
    if !require_root(
        "supervised_tier_dev_null_stdout_is_writable_and_every_wiring_is_the_callers",
        "CI runs the supervised tier as root; tests/supervised_tier.rs covers it unprivileged",
    ) {
        return;
    }
    every_row_matches_the_host_at("supervised");
}

/// `h5i box run B -- sh -c 'echo hi' >/dev/null`, literally as the issue reported it.
#[test]
fn echo_to_dev_null_succeeds_in_a_process_box() {
    let r = Repo::new();
    r.ok(&["box", "create", "e", "--isolation=process"]);
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{H5I} box run e -- sh -c 'echo hi; echo err >&2' >/dev/null 2>/dev/null"
        ))
        .current_dir(r.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// A report with each terminal's device number left out: a container box's pty is its own
/// (Podman's `-t`), so only its number differs from the caller's terminal.
fn without_tty_devices(report: &str) -> String {
    report
        .lines()
        .map(|l| {
            if !l.contains(" tty=1 ") {
                return l.to_string();
            }
            l.split(' ')
                .map(|f| if f.starts_with("dev=") { "dev=pty" } else { f })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every row in a container box (the test image, rootless Podman), run by `who`: the box's
/// report equals the host's, the pty row's device number aside.
fn every_row_matches_the_host_in_a_container_box(test: &str, as_user: bool) {
    if !require_root(
        test,
        "the container tier runs the test user's rootless Podman (root switches to it)",
    ) {
        return;
    }
    let mut c = Caller::either(as_user);
    c.create_container("b", container_image());
    common::copy_program(probe(), &c.workspace("b").join("probe"));
    let mut diffs = Vec::new();
    for wiring in ROWS {
        let row = Row::new(wiring);
        let (host, host_out) = on_host(&row);
        let cmd = c.h5i_in(&c.repo(), &PROBE_RUN);
        let (boxed, box_out) = wired_in_box(cmd, &c.workspace("b"), &row);
        if without_tty_devices(&host) != without_tty_devices(&boxed) || host_out != box_out {
            diffs.push(format!(
                "{wiring:?}:\n  host: {host:?} stdout {host_out:?}\n  box:  {boxed:?} stdout {box_out:?}"
            ));
        }
    }
    assert!(
        diffs.is_empty(),
        "container tier as {}:\n{}",
        c.who(),
        diffs.join("\n")
    );
}

#[test]
fn container_tier_dev_full_gives_enospc_inside_and_every_wiring_is_the_callers_as_root() {
    every_row_matches_the_host_in_a_container_box(
        "container_tier_dev_full_gives_enospc_inside_..._as_root",
        false,
    );
}

#[test]
fn container_tier_dev_full_gives_enospc_inside_and_every_wiring_is_the_callers_as_the_test_user() {
    every_row_matches_the_host_in_a_container_box(
        "container_tier_dev_full_gives_enospc_inside_..._as_the_test_user",
        true,
    );
}
