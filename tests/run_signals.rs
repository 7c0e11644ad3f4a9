//! An interrupt sent to `h5i box run` (Ctrl-C, `kill`, a CI cancel) is the box command's: it
//! reaches every process of the run, `h5i` exits 128+N once the run has ended, and nothing the
//! run started outlives it — at the process tier on the box-lifetime sandbox and on a container
//! per run, and at the supervised tier, as root and as the test user. (The container tier's row
//! is `container_tier.rs`'s `sigterm_to_h5i_box_run_ends_a_container_run`.)
//!
//! Before this, the signal went to h5i-runc's process group or ended h5i alone: the box's
//! command ran on to its end (supervised) or outlived h5i in the sandbox (process).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use common::caller::Caller;

fn an_interrupt_ends_the_run(mut c: Caller, tier: &str, marker: &str) {
    c.create_at("sig", tier);
    // A foreground command and a background job; both must end with the run.
    let script = format!("sleep {marker} & echo up; sleep {marker}; echo never");
    let mut run = c
        .h5i_in(&c.repo(), &["box", "run", "sig", "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(run.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line, "up\n", "{}", c.who());
    let pid = common::caller::h5i_pid(run.id());
    // SAFETY: kill(2) of a process this test started; no memory involved.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = common::wait_bounded(run, Duration::from_secs(60), "h5i box run");
    assert_eq!(
        status.code(),
        Some(128 + libc::SIGTERM),
        "{} at {tier}: {status:?}",
        c.who()
    );
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(!rest.contains("never"), "the command ran on: {rest}");
    let left = common::pids_running(&["sleep", marker]);
    assert!(
        left.is_empty(),
        "{} at {tier}: the run's processes outlived h5i: {left:?}",
        c.who()
    );
    let log = c.ok(&["box", "log", "sig", "--kind", "run"]);
    assert!(log.contains("exit 143"), "{log}");
}

#[test]
fn sigterm_to_h5i_box_run_ends_a_process_run_in_the_box_sandbox() {
    an_interrupt_ends_the_run(Caller::root(), "process", "4301");
}

#[test]
fn sigterm_to_h5i_box_run_ends_a_process_run_in_the_box_sandbox_as_the_test_user() {
    an_interrupt_ends_the_run(Caller::user(), "process", "4302");
}

#[test]
fn sigterm_to_h5i_box_run_ends_a_process_run_in_a_container_of_its_own() {
    an_interrupt_ends_the_run(
        Caller::root().with_env("H5I_SANDBOX", "off"),
        "process",
        "4303",
    );
}

#[test]
fn sigterm_to_h5i_box_run_ends_a_process_run_in_a_container_of_its_own_as_the_test_user() {
    an_interrupt_ends_the_run(
        Caller::user().with_env("H5I_SANDBOX", "off"),
        "process",
        "4304",
    );
}

#[test]
fn sigterm_to_h5i_box_run_ends_a_supervised_run() {
    an_interrupt_ends_the_run(Caller::root(), "supervised", "4305");
}

#[test]
fn sigterm_to_h5i_box_run_ends_a_supervised_run_as_the_test_user() {
    an_interrupt_ends_the_run(Caller::user(), "supervised", "4306");
}
