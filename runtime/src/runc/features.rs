//! `features`: what this runtime supports, in the OCI `features` JSON, plus the `h5i.*`
//! annotations it understands and the reviewed h5i-v1 deny list (under the `h5i` key).

use serde_json::{json, Value};

use crate::confine::denylist::{Denial, Gate, Op, When};
use crate::confine::seccomp::SeccompProfile;
use crate::confine::{ANNOTATION_LANDLOCK, ANNOTATION_NET_UNIX, ANNOTATION_SECCOMP};

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
                    };
                    Value::String(op)
                })
                .collect(),
        ),
    }
}

/// The features document.
pub fn features() -> Value {
    let denylist: Vec<Value> = SeccompProfile {
        net_unix: false,
        socket_gate: false,
    }
        .entries()
        .map(|e| {
            json!({
                "syscall": e.name,
                "when": describe_when(e.when),
                "errno": match e.denial { Denial::Eperm => "EPERM", Denial::Enosys => "ENOSYS" },
                "only_with": match e.gate { Gate::Base => Value::Null, Gate::NetUnixOff => json!("h5i.net.unix=false") },
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
            "seccomp": { "enabled": true },
            "apparmor": { "enabled": false },
            "selinux": { "enabled": false },
        },
        "annotations": {
            ANNOTATION_LANDLOCK: "JSON {\"read\":[paths],\"write\":[paths],\"exec\":[paths]?,\"connect_tcp\":[ports]?,\"bind_tcp\":[ports]?}; container paths; enforced fully (Landlock ABI >= 3, >= 4 with ports) or the container does not run",
            ANNOTATION_SECCOMP: "\"h5i-v1\": h5i's seccomp deny list (see h5i.seccomp.h5i-v1), installed after Landlock, just before exec",
            ANNOTATION_NET_UNIX: "\"true\" (default) or \"false\": false also denies socket(AF_UNIX); socketpair stays allowed; needs h5i.seccomp",
            super::spec_copy::ANNOTATION: "absolute path of a new file: at create, the spec as handed to the runtime is copied there (evidence for the caller)",
        },
        "h5i": { "seccomp": { "h5i-v1": denylist } },
    })
}
