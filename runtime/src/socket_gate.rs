//! The socket gate's part of the OCI spec: the `linux.seccomp` rule that routes every
//! `socket`/`socketpair` call to a listener (`h5i_broker::socket_gate` serves it).
//!
//! Owns the contract between a spec and the gate, in one place:
//! - [`notify_section`]: the `linux.seccomp` h5i writes into its own bundles (default allow,
//!   `SCMP_ACT_NOTIFY` for `socket` and `socketpair`, `listenerPath`);
//! - [`routes_sockets_to_listener`]: whether a parsed spec really carries that rule, so the
//!   executor can drop its own socket-family denials (an `ERRNO` filter outranks `USER_NOTIF`:
//!   kept, they would hide those calls from the gate and its tally);
//! - [`inject`]: merging the rule into a spec someone else wrote (Podman's seccomp profile:
//!   existing `socket`/`socketpair` entries removed, the notify rule added, `listenerPath` set),
//!   plus the `h5i.net.gate = on` annotation and, when absent, `h5i.seccomp = h5i-v1` (its
//!   io_uring denial keeps sockets from being made around the gate).
//!
//! - [`notify_program`]: the same rule as BPF, for exec'd processes (see `confine`).
//!
//! Pure: JSON and `oci_spec` values in, values out; writing files is the caller's. Must never:
//! report a spec as gated when any socket/socketpair call could reach the kernel without the
//! listener, or take over a listener or notify rule the spec already gives someone else.

use std::path::Path;

use libcontainer::oci_spec::runtime::{LinuxSeccomp, LinuxSeccompAction};
use serde_json::{json, Value};

use crate::confine::seccomp::PROFILE_H5I_V1;
use crate::confine::{ANNOTATION_NET_GATE, ANNOTATION_SECCOMP, NET_GATE_ON};

/// The syscalls the gate answers.
pub const GATED_SYSCALLS: [&str; 2] = ["socket", "socketpair"];

const NOTIFY: &str = "SCMP_ACT_NOTIFY";

/// Why a spec cannot take the gate.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GateSpecError {
    /// No `linux` object to hold `linux.seccomp`.
    #[error("refusing: the spec has no linux section to hold the socket gate; to fix: use a Linux OCI spec")]
    NoLinux,
    /// `linux.seccomp` (or its `syscalls`) is not the shape the OCI spec defines.
    #[error(
        "refusing: the spec's linux.seccomp is malformed ({0}); to fix: repair the seccomp profile"
    )]
    Malformed(&'static str),
    /// The spec already hands its notifications to another listener.
    #[error("refusing: the spec's seccomp profile already names listener {0:?}; to fix: drop listenerPath (h5i's socket gate needs the listener)")]
    OtherListener(String),
    /// The spec already sends other syscalls to a listener.
    #[error("refusing: the spec's seccomp profile already uses SCMP_ACT_NOTIFY for {0}; to fix: drop those rules (h5i's socket gate takes the only listener)")]
    OtherNotify(String),
    /// `linux.seccomp.defaultAction` is SCMP_ACT_NOTIFY.
    #[error("refusing: the spec's seccomp defaultAction is SCMP_ACT_NOTIFY; to fix: use another default action")]
    NotifyDefault,
}

/// The notify rule as a BPF program, for an exec'd process that gets no `linux.seccomp` from
/// libcontainer (the executor installs it with a new listener and hands that to the gate):
/// a native-architecture `socket` or `socketpair` -> `USER_NOTIF`; a foreign architecture ->
/// kill (as libseccomp's bad-arch default); everything else allowed (h5i-v1 filters follow).
pub fn notify_program() -> seccompiler::BpfProgram {
    use seccompiler::sock_filter;
    let load = |k: u32| sock_filter {
        code: BPF_LD_W_ABS,
        jt: 0,
        jf: 0,
        k,
    };
    let ret = |k: u32| sock_filter {
        code: BPF_RET_K,
        jt: 0,
        jf: 0,
        k,
    };
    let jeq = |k: u32, jt: u8, jf: u8| sock_filter {
        code: BPF_JMP_JEQ_K,
        jt,
        jf,
        k,
    };
    vec![
        load(SECCOMP_DATA_ARCH),                // 0
        jeq(AUDIT_ARCH_NATIVE, 1, 0),           // 1: native -> 3
        ret(libc::SECCOMP_RET_KILL_PROCESS),    // 2
        load(SECCOMP_DATA_NR),                  // 3
        jeq(libc::SYS_socket as u32, 2, 0),     // 4: -> 7
        jeq(libc::SYS_socketpair as u32, 1, 0), // 5: -> 7
        ret(libc::SECCOMP_RET_ALLOW),           // 6
        ret(libc::SECCOMP_RET_USER_NOTIF),      // 7
    ]
}

const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JEQ_K: u16 = 0x15;
const BPF_RET_K: u16 = 0x06;
const SECCOMP_DATA_NR: u32 = 0;
const SECCOMP_DATA_ARCH: u32 = 4;
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH_NATIVE: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH_NATIVE: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64

/// `linux.seccomp` for an h5i bundle whose gate listens at `listener`.
pub fn notify_section(listener: &Path) -> Value {
    json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "listenerPath": listener,
        "syscalls": [{"names": GATED_SYSCALLS, "action": NOTIFY}],
    })
}

/// True when every `socket` and `socketpair` call goes to a listener: an absolute
/// `listenerPath`, a default action other than notify, and for each gated syscall exactly one
/// rule naming it, unconditional (no `args`), with action `SCMP_ACT_NOTIFY`.
pub fn routes_sockets_to_listener(seccomp: &LinuxSeccomp) -> bool {
    let listener = seccomp
        .listener_path()
        .as_ref()
        .is_some_and(|p| p.is_absolute());
    if !listener || seccomp.default_action() == LinuxSeccompAction::ScmpActNotify {
        return false;
    }
    let rules = seccomp.syscalls().as_deref().unwrap_or_default();
    GATED_SYSCALLS.iter().all(|name| {
        let mut naming = rules.iter().filter(|r| r.names().iter().any(|n| n == name));
        match (naming.next(), naming.next()) {
            (Some(rule), None) => {
                rule.action() == LinuxSeccompAction::ScmpActNotify
                    && rule.args().as_ref().is_none_or(|a| a.is_empty())
            }
            _ => false,
        }
    })
}

/// Merge the gate into `config` (a whole `config.json`), listening at `listener`. Idempotent;
/// on error `config` is unchanged.
pub fn inject(config: &mut Value, listener: &Path) -> Result<(), GateSpecError> {
    let linux = config
        .get("linux")
        .and_then(Value::as_object)
        .ok_or(GateSpecError::NoLinux)?;
    let mut seccomp = match linux.get("seccomp") {
        None | Some(Value::Null) => json!({"defaultAction": "SCMP_ACT_ALLOW"}),
        Some(Value::Object(s)) => Value::Object(s.clone()),
        Some(_) => return Err(GateSpecError::Malformed("not an object")),
    };
    if seccomp.get("defaultAction").and_then(Value::as_str) == Some(NOTIFY) {
        return Err(GateSpecError::NotifyDefault);
    }
    match seccomp.get("listenerPath") {
        None | Some(Value::Null) => {}
        Some(Value::String(p)) if p.is_empty() || Path::new(p) == listener => {}
        Some(Value::String(p)) => return Err(GateSpecError::OtherListener(p.clone())),
        Some(_) => return Err(GateSpecError::Malformed("listenerPath is not a string")),
    }
    let mut rules = match seccomp.get("syscalls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.clone(),
        Some(_) => return Err(GateSpecError::Malformed("syscalls is not an array")),
    };
    let mut kept = Vec::with_capacity(rules.len() + 1);
    for mut rule in rules.drain(..) {
        let names = rule
            .get("names")
            .and_then(Value::as_array)
            .ok_or(GateSpecError::Malformed(
                "a syscalls entry has no names array",
            ))?;
        let others: Vec<Value> = names
            .iter()
            .filter(|n| !n.as_str().is_some_and(|n| GATED_SYSCALLS.contains(&n)))
            .cloned()
            .collect();
        if others.is_empty() {
            continue;
        }
        if rule.get("action").and_then(Value::as_str) == Some(NOTIFY) {
            let listed: Vec<&str> = others.iter().filter_map(Value::as_str).collect();
            return Err(GateSpecError::OtherNotify(listed.join(", ")));
        }
        rule["names"] = Value::Array(others);
        kept.push(rule);
    }
    kept.push(json!({"names": GATED_SYSCALLS, "action": NOTIFY}));
    seccomp["syscalls"] = Value::Array(kept);
    seccomp["listenerPath"] = json!(listener);

    config["linux"]["seccomp"] = seccomp;
    if !config.get("annotations").is_some_and(Value::is_object) {
        config["annotations"] = json!({});
    }
    config["annotations"][ANNOTATION_NET_GATE] = json!(NET_GATE_ON);
    if config["annotations"].get(ANNOTATION_SECCOMP).is_none() {
        config["annotations"][ANNOTATION_SECCOMP] = json!(PROFILE_H5I_V1);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(section: &Value) -> LinuxSeccomp {
        serde_json::from_value(section.clone()).unwrap()
    }

    /// The shape of Podman's default profile where it touches sockets (containers/common).
    fn podman_like() -> Value {
        json!({
            "ociVersion": "1.0.2",
            "process": {"args": ["true"]},
            "linux": {
                "namespaces": [{"type": "pid"}],
                "seccomp": {
                    "defaultAction": "SCMP_ACT_ERRNO",
                    "defaultErrnoRet": 38,
                    "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
                    "syscalls": [
                        {"names": ["read", "socket", "write", "socketpair"], "action": "SCMP_ACT_ALLOW"},
                        {"names": ["socket"], "action": "SCMP_ACT_ERRNO", "errnoRet": 22,
                         "args": [{"index": 0, "value": 16, "op": "SCMP_CMP_EQ"},
                                  {"index": 2, "value": 9, "op": "SCMP_CMP_EQ"}]},
                        {"names": ["socket"], "action": "SCMP_ACT_ALLOW",
                         "args": [{"index": 2, "value": 9, "op": "SCMP_CMP_NE"}]},
                        {"names": ["bpf"], "action": "SCMP_ACT_ALLOW"}
                    ]
                }
            },
            "annotations": {"h5i.net": "supervised", "h5i.net.dir": "/run/h5i-net/abc"}
        })
    }

    #[test]
    fn the_bundle_section_routes_both_calls_to_the_listener() {
        let s = notify_section(Path::new("/run/h5i/n/gate.sock"));
        assert_eq!(s["defaultAction"], "SCMP_ACT_ALLOW");
        assert_eq!(s["listenerPath"], "/run/h5i/n/gate.sock");
        assert_eq!(
            s["syscalls"],
            json!([{"names": ["socket", "socketpair"], "action": "SCMP_ACT_NOTIFY"}])
        );
        assert!(routes_sockets_to_listener(&parse(&s)));
    }

    #[test]
    fn a_spec_without_listener_or_with_a_relative_one_is_not_gated() {
        let mut s = notify_section(Path::new("/run/g.sock"));
        s.as_object_mut().unwrap().remove("listenerPath");
        assert!(!routes_sockets_to_listener(&parse(&s)));
        s["listenerPath"] = json!("g.sock");
        assert!(!routes_sockets_to_listener(&parse(&s)));
    }

    #[test]
    fn a_spec_that_lets_any_socket_call_past_the_listener_is_not_gated() {
        let base = notify_section(Path::new("/run/g.sock"));
        // Only socket routed, socketpair not.
        let mut s = base.clone();
        s["syscalls"] = json!([{"names": ["socket"], "action": "SCMP_ACT_NOTIFY"}]);
        assert!(!routes_sockets_to_listener(&parse(&s)));
        // A conditional notify rule leaves the other calls to the default.
        let mut s = base.clone();
        s["syscalls"] = json!([{"names": ["socket", "socketpair"], "action": "SCMP_ACT_NOTIFY",
                                "args": [{"index": 0, "value": 2, "op": "SCMP_CMP_EQ"}]}]);
        assert!(!routes_sockets_to_listener(&parse(&s)));
        // A second rule naming socket (which one wins is libseccomp's business, not ours).
        let mut s = base.clone();
        s["syscalls"].as_array_mut().unwrap().push(json!(
            {"names": ["socket"], "action": "SCMP_ACT_ALLOW",
             "args": [{"index": 0, "value": 17, "op": "SCMP_CMP_EQ"}]}));
        assert!(!routes_sockets_to_listener(&parse(&s)));
        // The right names with another action.
        let mut s = base;
        s["syscalls"] = json!([{"names": ["socket", "socketpair"], "action": "SCMP_ACT_LOG"}]);
        assert!(!routes_sockets_to_listener(&parse(&s)));
    }

    #[test]
    fn injection_replaces_every_socket_rule_and_keeps_the_rest() {
        let mut c = podman_like();
        inject(&mut c, Path::new("/run/h5i-net/abc/gate.sock")).unwrap();
        let s = &c["linux"]["seccomp"];
        assert_eq!(s["defaultAction"], "SCMP_ACT_ERRNO");
        assert_eq!(s["defaultErrnoRet"], 38);
        assert_eq!(s["architectures"].as_array().unwrap().len(), 3);
        assert_eq!(s["listenerPath"], "/run/h5i-net/abc/gate.sock");
        assert_eq!(
            s["syscalls"],
            json!([
                {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"},
                {"names": ["bpf"], "action": "SCMP_ACT_ALLOW"},
                {"names": ["socket", "socketpair"], "action": "SCMP_ACT_NOTIFY"}
            ])
        );
        assert!(routes_sockets_to_listener(&parse(s)));
        assert_eq!(c["annotations"]["h5i.net.gate"], "on");
        assert_eq!(c["annotations"]["h5i.seccomp"], "h5i-v1");
        assert_eq!(
            c["annotations"]["h5i.net"], "supervised",
            "other annotations kept"
        );
        assert_eq!(
            c["process"]["args"],
            json!(["true"]),
            "the rest of the spec kept"
        );
    }

    #[test]
    fn injection_is_idempotent_and_keeps_a_chosen_seccomp_profile_annotation() {
        let mut c = podman_like();
        c["annotations"]["h5i.seccomp"] = json!("h5i-v1");
        inject(&mut c, Path::new("/run/g.sock")).unwrap();
        let once = c.clone();
        inject(&mut c, Path::new("/run/g.sock")).unwrap();
        assert_eq!(c, once);
    }

    #[test]
    fn injection_into_a_spec_without_seccomp_or_annotations() {
        let mut c = json!({"ociVersion": "1.0.2", "linux": {}});
        inject(&mut c, Path::new("/run/g.sock")).unwrap();
        assert_eq!(
            c["linux"]["seccomp"],
            notify_section(Path::new("/run/g.sock"))
        );
        assert_eq!(c["annotations"]["h5i.net.gate"], "on");
    }

    #[test]
    fn injection_refuses_to_take_over_someone_elses_listener_and_changes_nothing() {
        let mut c = podman_like();
        c["linux"]["seccomp"]["listenerPath"] = json!("/run/other.sock");
        let before = c.clone();
        assert_eq!(
            inject(&mut c, Path::new("/run/g.sock")),
            Err(GateSpecError::OtherListener("/run/other.sock".into()))
        );
        assert_eq!(c, before);

        let mut c = podman_like();
        c["linux"]["seccomp"]["syscalls"]
            .as_array_mut()
            .unwrap()
            .push(json!({"names": ["mknod", "socket"], "action": "SCMP_ACT_NOTIFY"}));
        let before = c.clone();
        assert_eq!(
            inject(&mut c, Path::new("/run/g.sock")),
            Err(GateSpecError::OtherNotify("mknod".into()))
        );
        assert_eq!(c, before);
    }

    #[test]
    fn injection_refuses_malformed_profiles() {
        for (seccomp, want) in [
            (json!("allow"), GateSpecError::Malformed("not an object")),
            (
                json!({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": {}}),
                GateSpecError::Malformed("syscalls is not an array"),
            ),
            (
                json!({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"action": "SCMP_ACT_ALLOW"}]}),
                GateSpecError::Malformed("a syscalls entry has no names array"),
            ),
            (
                json!({"defaultAction": "SCMP_ACT_NOTIFY"}),
                GateSpecError::NotifyDefault,
            ),
        ] {
            let mut c = json!({"linux": {"seccomp": seccomp}});
            assert_eq!(inject(&mut c, Path::new("/run/g.sock")), Err(want));
        }
        let mut c = json!({"ociVersion": "1.0.2"});
        assert_eq!(
            inject(&mut c, Path::new("/run/g.sock")),
            Err(GateSpecError::NoLinux)
        );
    }
    #[test]
    fn the_exec_program_notifies_exactly_socket_and_socketpair() {
        use crate::confine::seccomp::eval::{run, Call};
        let program = notify_program();
        let call = |nr: i64, arch: u32| Call {
            nr: nr as i32,
            arch,
            args: [libc::AF_INET as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0],
        };
        let native = AUDIT_ARCH_NATIVE;
        assert_eq!(
            run(&program, &call(libc::SYS_socket, native)),
            libc::SECCOMP_RET_USER_NOTIF
        );
        assert_eq!(
            run(&program, &call(libc::SYS_socketpair, native)),
            libc::SECCOMP_RET_USER_NOTIF
        );
        for nr in [
            libc::SYS_connect,
            libc::SYS_read,
            libc::SYS_sendmsg,
            libc::SYS_execve,
        ] {
            assert_eq!(
                run(&program, &call(nr, native)),
                libc::SECCOMP_RET_ALLOW,
                "{nr}"
            );
        }
        assert_eq!(
            run(&program, &call(libc::SYS_socket, 0x4000_0003)),
            libc::SECCOMP_RET_KILL_PROCESS,
            "i386"
        );
    }
}
