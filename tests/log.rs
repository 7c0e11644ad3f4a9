//! `H5I_LOG` (falling back to `RUST_LOG`): with a filter set, h5i prints a debug event for every
//! process it starts (a box run's command included) and for the refusal it ends with; unset,
//! it prints nothing it would not print anyway; a malformed filter is named once and ignored.
//! At the process, supervised and container tiers, as root and as h5i-test, and at the microvm
//! tier as root (its image is in the engine user's storage, as in tests/microvm.rs). At the
//! container tier h5i-runc's and the OCI hooks' own events (started by Podman's conmon, whose
//! stderr is not the caller's) reach the caller's stderr through h5i-log's relay.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::caller::Caller;
use common::{stderr, stdout, tier_case};

fn spawn_and_refusal_events(c: &mut Caller, tier: &str) {
    c.create_at("logged", tier);

    let out = c.h5i_with(
        &["box", "run", "logged", "--", "echo", "h5i-log-probe"],
        &[("H5I_LOG", "debug")],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "h5i-log-probe\n", "the events went to stdout");
    let err = stderr(&out);
    // From h5i itself (plain text, with the target), and for the box's command from whoever
    // started it: the warm sandbox (h5i's answer from the init) or h5i-runc (runc's format).
    assert!(
        err.lines().any(|l| l.contains("DEBUG h5i::spawn: spawned")),
        "no spawn event from h5i ({tier}, {}):\n{err}",
        c.who()
    );
    assert!(
        err.lines()
            .any(|l| l.contains("spawned") && l.contains("h5i-log-probe")),
        "no spawn event for the run's command ({tier}, {}):\n{err}",
        c.who()
    );
    if tier == "container" {
        // Podman's conmon started h5i-runc, and h5i-runc the hooks: their stderr is not the
        // caller's, and their events come back through the relay, each led by who wrote it.
        assert!(
            err.lines().any(|l| l.starts_with("h5i-runc.")
                && l.contains("DEBUG h5i::spawn: spawned")
                && l.contains("h5i-log-probe")
                && l.contains("by=\"h5i-runc\"")),
            "no spawn event from h5i-runc at the container tier ({}):\n{err}",
            c.who()
        );
        assert!(
            err.lines().any(|l| l.starts_with("h5i-hook.")
                && l.contains("DEBUG h5i::spawn: spawned")
                && l.contains("loopback")),
            "no event from the container tier's OCI hook ({}):\n{err}",
            c.who()
        );
    }

    // Only the named target: the same events, nothing else at debug.
    let out = c.h5i_with(
        &["box", "run", "logged", "--", "true"],
        &[("H5I_LOG", "h5i::spawn=debug")],
    );
    let err = stderr(&out);
    assert!(err.contains("h5i::spawn: spawned"), "{err}");
    assert!(
        err.lines().all(|l| l.contains("spawned")),
        "a target the filter did not name printed:\n{err}"
    );

    // RUST_LOG is the fallback.
    let out = c.h5i_with(
        &["box", "run", "logged", "--", "true"],
        &[("RUST_LOG", "debug")],
    );
    assert!(
        stderr(&out).contains("h5i::spawn: spawned"),
        "{}",
        stderr(&out)
    );

    // A refusal: its event carries the typed form.
    let out = c.h5i_with(
        &["box", "run", "nosuch", "--", "true"],
        &[("H5I_LOG", "debug")],
    );
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.lines()
            .any(|l| l.contains("DEBUG h5i::refusal: refused") && l.contains("NoSuchBox")),
        "no refusal event:\n{err}"
    );
    assert!(err.ends_with("h5i: refusing: no box named `nosuch`; to fix: `h5i box ls` lists the boxes of this clone\n"), "{err}");

    // Unset: nothing extra.
    let out = c.h5i(&["box", "run", "logged", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stderr(&out), "", "h5i printed something with no filter set");

    // Malformed: named once, ignored, the command still runs.
    let out = c.h5i_with(
        &["box", "run", "logged", "--", "true"],
        &[("H5I_LOG", "h5i=loud")],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("h5i: ignoring H5I_LOG=\"h5i=loud\": "),
        "{err}"
    );
    c.ok(&["box", "rm", "--force", "logged"]);
}

fn case(tier: &str, as_user: bool) {
    // The test's own environment must not carry a filter into the "unset" case.
    assert!(
        std::env::var_os("RUST_LOG").is_none() && std::env::var_os("H5I_LOG").is_none(),
        "run this test without RUST_LOG/H5I_LOG set"
    );
    if tier == "microvm" && !common::guest_agent_ready(&format!("h5i_log at {tier}")) {
        return;
    }
    tier_case(
        &format!("h5i_log at {tier}"),
        tier,
        as_user,
        spawn_and_refusal_events,
    );
}

#[test]
fn h5i_log_shows_spawn_and_refusal_events_at_the_process_tier_as_root() {
    case("process", false);
}

#[test]
fn h5i_log_shows_spawn_and_refusal_events_at_the_process_tier_as_h5i_test() {
    case("process", true);
}

#[test]
fn h5i_log_shows_spawn_and_refusal_events_at_the_supervised_tier_as_root() {
    case("supervised", false);
}

#[test]
fn h5i_log_shows_spawn_and_refusal_events_at_the_supervised_tier_as_h5i_test() {
    case("supervised", true);
}

#[test]
fn h5i_log_shows_spawn_and_refusal_events_at_the_container_tier_as_root() {
    case("container", false);
}

#[test]
fn h5i_log_shows_spawn_and_refusal_events_at_the_container_tier_as_h5i_test() {
    case("container", true);
}

#[test]
fn h5i_log_shows_spawn_and_refusal_events_at_the_microvm_tier_as_root() {
    case("microvm", false);
}
