//! `features`: what this runtime supports, in the OCI `features` JSON (runtime-spec
//! `features.md`), plus the reviewed h5i-v1 deny list (under the `h5i` key).
//!
//! `annotations` holds two kinds of entry: what each `h5i.*` spec annotation h5i-runc reads
//! means, and, in reverse-domain form as runc writes its own (`io.github.seccomp.libseccomp.
//! version`), what h5i-runc does to a spec on its own: `org.h5i.socket-gate` (the socket() gate
//! it merges into every `h5i.net=supervised` spec) and `org.h5i.net-dir` (the directory it
//! assigns such a spec). Those two are built from the constants the code acts on, so the text
//! cannot drift from the behaviour; the unit tests check each claim against `gate` and
//! `net_dir`.
//!
//! Must never: claim a feature the runtime does not act on, or leave out a change it makes to a
//! spec it was handed.

use libcontainer::oci_spec::runtime::{LinuxSeccompAction, LinuxSeccompOperator};
use serde_json::{json, Value};

use super::{gate, net_dir};
use crate::confine::allowlist::{BASE, LEFT_OUT};
use crate::confine::denylist::{Denial, Gate, Op, When};
use crate::confine::seccomp::{SeccompProfile, PROFILE_H5I_V1, PROFILE_H5I_V2};
use crate::confine::syscalls::{number, Arch};
use crate::confine::{
    ANNOTATION_LANDLOCK, ANNOTATION_NET_FAMILIES, ANNOTATION_NET_GATE, ANNOTATION_NET_UNIX,
    ANNOTATION_SECCOMP, NET_GATE_ON,
};
use crate::socket_gate::GATED_SYSCALLS;
use h5i_policy::families::{FamilySet, FamilyVerdict, ADDRESS_FAMILIES};

/// The seccomp actions libcontainer 0.7 translates for a spec (all of the OCI set).
const SECCOMP_ACTIONS: [LinuxSeccompAction; 9] = [
    LinuxSeccompAction::ScmpActAllow,
    LinuxSeccompAction::ScmpActErrno,
    LinuxSeccompAction::ScmpActKill,
    LinuxSeccompAction::ScmpActKillProcess,
    LinuxSeccompAction::ScmpActKillThread,
    LinuxSeccompAction::ScmpActLog,
    LinuxSeccompAction::ScmpActNotify,
    LinuxSeccompAction::ScmpActTrace,
    LinuxSeccompAction::ScmpActTrap,
];

/// The argument comparisons libcontainer 0.7 translates.
const SECCOMP_OPERATORS: [LinuxSeccompOperator; 7] = [
    LinuxSeccompOperator::ScmpCmpEq,
    LinuxSeccompOperator::ScmpCmpGe,
    LinuxSeccompOperator::ScmpCmpGt,
    LinuxSeccompOperator::ScmpCmpLe,
    LinuxSeccompOperator::ScmpCmpLt,
    LinuxSeccompOperator::ScmpCmpMaskedEq,
    LinuxSeccompOperator::ScmpCmpNe,
];

/// The notify action's name in a spec (what the gate's rule uses).
fn notify_action() -> String {
    name_of(&LinuxSeccompAction::ScmpActNotify)
}

/// The spec spelling of an `oci_spec` enum value.
fn name_of<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// `org.h5i.socket-gate`: the gate h5i-runc merges into a supervised spec, and who answers it.
fn socket_gate_text() -> String {
    let syscalls = GATED_SYSCALLS.join(" and ");
    format!(
        "h5i-runc itself adds a socket() gate to every spec annotated h5i.net=supervised (Podman: --annotation h5i.net=supervised), at create, before the spec is used, and writes the result back to the bundle's config.json: linux.seccomp gets {notify} for {syscalls} (the spec's own rules for those two are replaced; a spec without linux.seccomp gets a default-allow profile holding only that rule) and listenerPath <h5i.net.dir>/{sock}, and the annotations {gate_key}={gate_on} and, when absent, {seccomp_key}={profile} (whose io_uring denial keeps sockets from being made around the gate). Processes added with exec get the same rule and listener. The listener is h5i-hook's sentry, started by its net-up createRuntime hook (hooks/oci): socket(AF_INET or AF_INET6) of type SOCK_STREAM or SOCK_DGRAM with protocol 0, TCP or UDP continues, and socketpair(AF_UNIX) always; socket(AF_UNIX) only with {unix_key}=true; every other socket() or socketpair() fails with EPERM. With nothing listening there, create fails; should the listener go away, the kernel fails socket() with ENOSYS. Refused at create: a supervised spec whose seccomp profile already names another listenerPath, uses {notify} for other syscalls, or has defaultAction {notify}. Specs without h5i.net=supervised are not changed.",
        notify = notify_action(),
        sock = gate::GATE_SOCKET,
        gate_key = ANNOTATION_NET_GATE,
        gate_on = NET_GATE_ON,
        seccomp_key = ANNOTATION_SECCOMP,
        profile = PROFILE_H5I_V1,
        unix_key = ANNOTATION_NET_UNIX,
    )
}

/// `org.h5i.net-dir`: the directory h5i-runc assigns a supervised spec that names none.
fn net_dir_text() -> String {
    format!(
        "a spec annotated h5i.net=supervised without h5i.net.dir gets one at create, written back to the bundle's config.json with {made_by}={made_by_value}: /run/{name}/<first 16 characters of the container id> for root, $XDG_RUNTIME_DIR/{name}/<first 16> otherwise, mode 0700 (its parent too). It holds the gate's and the sentry's sockets, the sentry's pid file and log, and the run's tally; it lasts as long as the run: h5i-hook net-down (poststop) keeps the tally and the log in the bundle (h5i-net-tally.json, h5i-net-sentry.log) and removes it, and h5i-runc removes it itself when create fails or delete finds no such container. No symlink in or at it is followed.",
        made_by = net_dir::ANNOTATION_MADE_BY,
        made_by_value = net_dir::MADE_BY_H5I_RUNC,
        name = net_dir::NET_DIR_NAME,
    )
}

/// The libseccomp h5i-runc is linked against, as runc reports it.
fn libseccomp_version() -> Option<String> {
    libseccomp::ScmpVersion::current()
        .ok()
        .map(|v| v.to_string())
}

const CAPABILITIES: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

fn describe_when(when: When) -> Value {
    match when {
        When::Always => json!("always"),
        When::AllOf(conds) => Value::Array(
            conds
                .iter()
                .map(|c| {
                    let op = match c.op {
                        Op::Eq(v) => format!("(u32)arg{} == {v:#x}", c.arg),
                        Op::Ne(v) => format!("(u32)arg{} != {v:#x}", c.arg),
                        Op::MaskedEq { mask, value } => {
                            format!("((u32)arg{} & {mask:#x}) == {value:#x}", c.arg)
                        }
                        Op::HasOTmpfile => format!(
                            "((u32)arg{a} & O_TMPFILE) == O_TMPFILE (x86_64 {x:#x}, aarch64 {y:#x})",
                            a = c.arg,
                            x = Arch::X86_64.o_tmpfile(),
                            y = Arch::Aarch64.o_tmpfile()
                        ),
                    };
                    Value::String(op)
                })
                .collect(),
        ),
    }
}

/// The features document.
pub fn features() -> Value {
    let gated = SeccompProfile {
        base: false,
        net_unix: false,
        socket_gate: true,
        families: FamilySet::allowed(false, &[]),
    };
    let plain = SeccompProfile {
        socket_gate: false,
        ..gated.clone()
    };
    let denylist: Vec<Value> = plain
        .entries()
    .map(|e| {
        let kept_under_gate = gated.entries().any(|g| std::ptr::eq(g, e));
        json!({
            "syscall": e.name,
            "when": describe_when(e.when),
            "errno": match e.denial { Denial::Eperm => "EPERM", Denial::Enosys => "ENOSYS" },
            "only_with": match e.gate { Gate::Base => Value::Null, Gate::NetUnixOff => json!("h5i.net.unix=false") },
            "except_with": if kept_under_gate { Value::Null } else { json!(format!("{ANNOTATION_NET_GATE}={NET_GATE_ON}: the socket gate answers the call (org.h5i.socket-gate)")) },
            "why": e.why,
        })
    })
    .collect();
    json!({
        "ociVersionMin": "1.0.0",
        "ociVersionMax": libcontainer::oci_spec::runtime::VERSION,
        "hooks": ["prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"],
        "mountOptions": libcontainer::syscall::linux::MountOption::known_options(),
        "linux": {
            "namespaces": ["cgroup", "ipc", "mount", "network", "pid", "time", "user", "uts"],
            "capabilities": CAPABILITIES,
            "cgroup": { "v1": true, "v2": true, "systemd": false, "systemdUser": false, "rdma": false },
            "seccomp": {
                "enabled": true,
                "actions": SECCOMP_ACTIONS.iter().map(name_of).collect::<Vec<_>>(),
                "operators": SECCOMP_OPERATORS.iter().map(name_of).collect::<Vec<_>>(),
            },
            "apparmor": { "enabled": false },
            "selinux": { "enabled": false },
        },
        "annotations": annotations(),
        "h5i": { "seccomp": { PROFILE_H5I_V1: denylist, PROFILE_H5I_V2: base_description() }, "address_families": address_families() },
    })
}

/// The h5i-v2 base, group by group, with the numbers for each architecture filters are built
/// for.
fn base_description() -> Value {
    let numbered = |names: &[&str]| -> Value {
        names
            .iter()
            .map(|n| {
                let mut row = json!({ "syscall": n });
                for arch in Arch::ALL {
                    row[arch.name()] = json!(number(n, arch));
                }
                row
            })
            .collect()
    };
    json!({
        "layers": format!("the allowlist below, then {PROFILE_H5I_V1} (whose errno a caller sees where both refuse)"),
        "otherwise": "ENOSYS: what a kernel without the call answers, so callers take their fallback",
        "foreign_arch": "killed",
        "allowed": BASE.iter().map(|g| json!({"why": g.why, "syscalls": numbered(g.names)})).collect::<Vec<_>>(),
        "left_out": LEFT_OUT.iter().map(|g| json!({"why": g.why, "syscalls": g.names})).collect::<Vec<_>>(),
    })
}

/// The address-family table `socket()` is held to (h5i_policy::families), row by row.
fn address_families() -> Value {
    ADDRESS_FAMILIES
        .iter()
        .map(|f| {
            let verdict = match f.verdict {
                FamilyVerdict::Allowed => "allowed",
                FamilyVerdict::NetUnix => "allowed with h5i.net.unix=true",
                FamilyVerdict::Refused => "EPERM unless named in h5i.net.families",
                FamilyVerdict::Never => "EPERM",
            };
            json!({"family": f.name, "number": f.number, "socket": verdict, "why": f.why})
        })
        .collect()
}

/// The `annotations` entry (see the module doc for its two kinds).
fn annotations() -> Value {
    let mut ann = json!({
            ANNOTATION_LANDLOCK: "JSON {\"read\":[paths],\"write\":[paths],\"exec\":[paths]?,\"connect_tcp\":[ports]?,\"bind_tcp\":[ports]?}; container paths; enforced fully (Landlock ABI >= 3, >= 4 with ports) or the container does not run",
            ANNOTATION_SECCOMP: "\"h5i-v2\": h5i's default-deny base (see h5i.seccomp.h5i-v2; any other syscall answers ENOSYS) with its deny list as the second layer; \"h5i-v1\": the deny list alone (see h5i.seccomp.h5i-v1). Installed after Landlock, just before exec",
            ANNOTATION_NET_FAMILIES: "comma-separated address-family names (see h5i.address_families) whose socket() h5i.seccomp then allows; a name no policy may grant (packet, unix, an allowed family) is refused at create",
            ANNOTATION_NET_UNIX: "\"true\" or \"false\": whether socket(AF_UNIX) is allowed (socketpair always is). Without h5i.net=supervised, h5i.seccomp's deny list holds it (default \"true\"; \"false\" needs h5i.seccomp); with it, the socket gate does (default \"false\": see org.h5i.socket-gate)",
            super::spec_copy::ANNOTATION: "absolute path of a new file: at create, the spec as handed to the runtime is copied there (evidence for the caller)",
            "h5i.net": "\"supervised\": the supervised network: h5i-runc assigns h5i.net.dir when absent (org.h5i.net-dir) and merges the socket gate (org.h5i.socket-gate); h5i-hook's hooks.d entries (hooks/oci) match on it and give the box its egress table and uplink",
            "h5i.net.dir": "with h5i.net=supervised: an absolute, private (0700) directory of the caller's for the run's sockets and tally, left to the caller; when absent h5i-runc assigns one (org.h5i.net-dir)",
            ANNOTATION_NET_GATE: format!("\"{NET_GATE_ON}\": set by h5i-runc when it merged the socket gate; create refuses it on a spec whose seccomp profile does not route socket and socketpair to a listener"),
            "org.h5i.runc.version": env!("CARGO_PKG_VERSION"),
            "org.h5i.socket-gate": socket_gate_text(),
            "org.h5i.net-dir": net_dir_text(),
    });
    if let Some(v) = libseccomp_version() {
        ann["io.github.seccomp.libseccomp.version"] = json!(v);
    }
    ann
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn annotation(key: &str) -> String {
        features()["annotations"][key]
            .as_str()
            .unwrap_or_else(|| panic!("no annotations.{key}"))
            .to_owned()
    }

    /// What `create` does to a supervised bundle (`gate::inject_into_bundle`), read back.
    fn injected(spec: &Value) -> Value {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), spec.to_string()).unwrap();
        gate::inject_into_bundle(dir.path()).unwrap();
        serde_json::from_slice(&std::fs::read(dir.path().join("config.json")).unwrap()).unwrap()
    }

    #[test]
    fn the_socket_gate_entry_names_every_change_create_makes_to_a_supervised_spec() {
        let text = annotation("org.h5i.socket-gate");
        let listed = features()["linux"]["seccomp"]["actions"].clone();
        for spec in [
            json!({"linux": {},
                   "annotations": {"h5i.net": "supervised", "h5i.net.dir": "/run/h5i-net/abc"}}),
            json!({"linux": {"seccomp": {"defaultAction": "SCMP_ACT_ERRNO",
                     "syscalls": [{"names": ["socket", "read"], "action": "SCMP_ACT_ALLOW"}]}},
                   "annotations": {"h5i.net": "supervised", "h5i.net.dir": "/run/h5i-net/abc"}}),
        ] {
            let after = injected(&spec);
            let seccomp = &after["linux"]["seccomp"];
            let gate_rule = seccomp["syscalls"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["action"] == notify_action())
                .unwrap();
            assert!(listed.as_array().unwrap().contains(&gate_rule["action"]));
            assert!(
                text.contains(gate_rule["action"].as_str().unwrap()),
                "{text}"
            );
            for name in gate_rule["names"].as_array().unwrap() {
                assert!(text.contains(name.as_str().unwrap()), "{name} in: {text}");
            }
            let listener = Path::new(seccomp["listenerPath"].as_str().unwrap());
            assert!(listener.starts_with("/run/h5i-net/abc"));
            let sock = listener.file_name().unwrap().to_str().unwrap();
            assert!(text.contains(&format!("<h5i.net.dir>/{sock}")), "{text}");
            // Every annotation create adds is named with its value, and documented.
            let added: Vec<(&String, &Value)> = after["annotations"]
                .as_object()
                .unwrap()
                .iter()
                .filter(|(k, _)| spec["annotations"].get(k.as_str()).is_none())
                .collect();
            assert!(!added.is_empty());
            for (k, v) in added {
                let kv = format!("{k}={}", v.as_str().unwrap());
                assert!(text.contains(&kv), "{kv} in: {text}");
                assert!(features()["annotations"][k].is_string(), "{k} undocumented");
            }
        }
        assert!(text.contains("h5i.net=supervised") && text.contains("EPERM"));
    }

    #[test]
    fn the_net_dir_entry_names_the_place_and_the_mark_create_writes() {
        let text = annotation("org.h5i.net-dir");
        let id = "0123456789abcdef-and-more";
        let root = net_dir::default_dir(id, true, None).unwrap();
        let shown = root.display().to_string().replace(&id[..16], "<first 16");
        assert!(text.contains(&shown), "{shown} in: {text}");
        let base = tempfile::tempdir().unwrap();
        let user = net_dir::default_dir(id, false, Some(base.path().to_path_buf())).unwrap();
        let rel = user.strip_prefix(base.path()).unwrap().parent().unwrap();
        assert!(
            text.contains(&format!("$XDG_RUNTIME_DIR/{}/", rel.display())),
            "{text}"
        );
        // The mark `write_back` sets (its own test checks it writes exactly these).
        let made = format!(
            "{}={}",
            net_dir::ANNOTATION_MADE_BY,
            net_dir::MADE_BY_H5I_RUNC
        );
        assert!(text.contains(&made), "{made} in: {text}");
        assert!(
            text.contains("net-down") && text.contains("create fails"),
            "{text}"
        );
    }

    #[test]
    fn deny_list_entries_the_gate_takes_over_say_so_and_no_others() {
        let gated = SeccompProfile::named(PROFILE_H5I_V1, false, true).unwrap();
        let f = features();
        let listed = f["h5i"]["seccomp"]["h5i-v1"].as_array().unwrap();
        let taken = listed
            .iter()
            .filter(|e| e["except_with"].is_string())
            .count();
        assert!(taken > 0);
        assert_eq!(listed.len() - taken, gated.entries().count());
        for e in listed.iter().filter(|e| e["except_with"].is_string()) {
            assert!(
                GATED_SYSCALLS.contains(&e["syscall"].as_str().unwrap()),
                "{e}"
            );
        }
    }

    #[test]
    fn the_implementation_annotations_are_runc_style_strings() {
        let f = features();
        let ann = f["annotations"].as_object().unwrap();
        for (k, v) in ann {
            assert!(v.as_str().is_some_and(|s| !s.is_empty()), "{k}");
        }
        let version = ann["io.github.seccomp.libseccomp.version"]
            .as_str()
            .unwrap();
        assert_eq!(version.split('.').count(), 3, "{version}");
        assert!(
            version.split('.').all(|n| n.parse::<u32>().is_ok()),
            "{version}"
        );
        assert_eq!(ann["org.h5i.runc.version"], env!("CARGO_PKG_VERSION"));
    }
}
