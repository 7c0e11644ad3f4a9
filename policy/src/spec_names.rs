//! The names h5i, h5i-runc and h5i-hook agree on across a process boundary: the `h5i.*`
//! annotations of an OCI spec, their fixed values, and the files of a supervised run's network
//! directory. Owns the spellings only, once, so a writer and its reader cannot drift apart;
//! what each annotation means is documented where it is read. Must never hold anything that is
//! not part of that shared contract.

/// Annotation names (`annotations` in an OCI `config.json`).
pub mod annotation {
    /// h5i's run id on a container-tier spec (`h5i box run`'s own Podman containers).
    pub const RUN: &str = "h5i.run";
    /// Turns the supervised network on (value [`super::value::NET_SUPERVISED`]).
    pub const NET: &str = "h5i.net";
    /// The run's private network directory (sockets, tally, sentry pid).
    pub const NET_DIR: &str = "h5i.net.dir";
    /// Set beside [`NET_DIR`] when h5i-runc chose the directory itself
    /// (value [`super::value::MADE_BY_H5I_RUNC`]).
    pub const NET_DIR_MADE_BY: &str = "h5i.net.dir.made-by";
    /// The pinned egress allowlist (JSON) the supervised table is built from.
    pub const NET_EGRESS: &str = "h5i.net.egress";
    /// The policy's `net.unix` switch (`true`/`false`).
    pub const NET_UNIX: &str = "h5i.net.unix";
    /// Address families granted beyond the always-allowed ones (comma-separated names from
    /// `crate::families`; the policy's `net.families`).
    pub const NET_FAMILIES: &str = "h5i.net.families";
    /// Says the spec carries the socket gate (value [`super::value::NET_GATE_ON`]).
    pub const NET_GATE: &str = "h5i.net.gate";
    /// The Landlock request (JSON).
    pub const LANDLOCK: &str = "h5i.landlock";
    /// Selects h5i's seccomp profile.
    pub const SECCOMP: &str = "h5i.seccomp";
    /// Where h5i-runc copies the spec it was given, for the container tier's evidence.
    pub const EVIDENCE_SPEC: &str = "h5i.evidence.spec";
    /// Says the caller closed the container's stdio on purpose.
    pub const STDIO_CLOSED: &str = "h5i.stdio.closed";
    /// The h5i-log filter (`H5I_LOG`'s directives) for a runtime whose caller's environment
    /// does not reach it (Podman's conmon starts it with its own).
    pub const LOG: &str = "h5i.log";
    /// The directory the runtime writes its relayed events to (h5i-log's relay).
    pub const LOG_DIR: &str = "h5i.log.dir";
}

/// The fixed values some annotations take.
pub mod value {
    /// [`super::annotation::NET`] for the supervised tier.
    pub const NET_SUPERVISED: &str = "supervised";
    /// The only value [`super::annotation::NET_GATE`] takes.
    pub const NET_GATE_ON: &str = "on";
    /// [`super::annotation::NET_DIR_MADE_BY`] when h5i-runc made the directory.
    pub const MADE_BY_H5I_RUNC: &str = "h5i-runc";
}

/// The files of a supervised run's network directory.
pub mod net_dir {
    /// The sentry's control socket (the inside hook's fd handback, the poststop hook's `stop`).
    pub const NET_SOCK: &str = "net.sock";
    /// The socket gate's listener (`linux.seccomp.listenerPath`).
    pub const GATE_SOCK: &str = "gate.sock";
    /// The run's network tally (`crate::receipt::NetTally` JSON).
    pub const TALLY: &str = "tally.json";
    /// The sentry's pid.
    pub const SENTRY_PID: &str = "sentry.pid";
    /// The sentry's log (its stderr, and pasta's output).
    pub const SENTRY_LOG: &str = "sentry.log";
}
