//! The `h5i.landlock` annotation: its JSON request and the pure plan made from it.
//!
//! Owns the meaning of the annotation (which access each listed path gets, which TCP ports are
//! handled) and the fail-closed check against the kernel's Landlock ABI. The plan is plain data;
//! applying it (opening paths, `landlock_restrict_self`) is the `kernel` seam's job.
//!
//! Annotation format (`h5i.landlock`, JSON, unknown keys refused):
//! `{"read":["/usr",...],"write":["/work",...],"exec":["/usr/bin",...],"connect_tcp":[443],
//! "bind_tcp":[8080]}`. Paths are container paths (the rules are built after `pivot_root`) and
//! must be absolute.
//! - `read`: read files, list directories (and execute, unless `exec` is given);
//! - `write`: everything the kernel can handle (read, write, create, remove, rename, truncate,
//!   device ioctls ...), minus execute when `exec` is given;
//! - `exec`: optional; when present, executing is allowed only beneath these paths;
//! - `connect_tcp` / `bind_tcp`: optional; when present, TCP connect / bind is allowed only to
//!   these ports (an empty list denies all). Absent means TCP is not restricted by Landlock.
//!
//! Everything not granted is denied for every access right the running kernel can handle.
//!
//! Fail closed: Landlock must exist, be at least ABI 3 (so `truncate(2)` is covered), and ABI 4
//! when ports are listed; otherwise the plan is refused and the container never runs.
//! Must never: downgrade a request to best effort, or grant a relative path.

use std::collections::BTreeMap;
use std::path::PathBuf;

use landlock::{Access, AccessFs, AccessNet, BitFlags, ABI};
use serde::Deserialize;

/// Lowest ABI that can confine writes completely (ABI 3 added `LANDLOCK_ACCESS_FS_TRUNCATE`).
pub const MIN_ABI_FS: i32 = 3;
/// Lowest ABI with TCP bind/connect rules.
pub const MIN_ABI_NET: i32 = 4;

/// The annotation's JSON, as written.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LandlockRequest {
    /// Paths readable (and executable unless `exec` is given).
    #[serde(default)]
    pub read: Vec<String>,
    /// Paths writable.
    #[serde(default)]
    pub write: Vec<String>,
    /// If present, the only paths beneath which files may be executed.
    #[serde(default)]
    pub exec: Option<Vec<String>>,
    /// If present, the only TCP ports `connect(2)` may reach.
    #[serde(default)]
    pub connect_tcp: Option<Vec<u16>>,
    /// If present, the only TCP ports `bind(2)` may use.
    #[serde(default)]
    pub bind_tcp: Option<Vec<u16>>,
}

/// Why an `h5i.landlock` request cannot be enforced as asked.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LandlockPlanError {
    /// The annotation is not valid JSON of the expected shape.
    #[error("refusing: annotation h5i.landlock is not valid: {0}; to fix: see `h5i-runc features` for the format")]
    Parse(String),
    /// A path is not absolute.
    #[error("refusing: h5i.landlock path {0:?} is not absolute; to fix: use container paths starting with /")]
    RelativePath(String),
    /// The kernel has no usable Landlock.
    #[error("refusing: h5i.landlock asks for Landlock but the kernel reports none (probe returned {0}); to fix: boot with Landlock in lsm=, or check that the spec's seccomp profile allows landlock_create_ruleset")]
    Unavailable(i32),
    /// The kernel's Landlock is too old for what was asked.
    #[error("refusing: h5i.landlock needs Landlock ABI {need} ({what}) but the kernel has ABI {have}; to fix: run on a newer kernel or drop that part of the request")]
    AbiTooOld {
        /// ABI required.
        need: i32,
        /// ABI present.
        have: i32,
        /// The feature that needs it.
        what: &'static str,
    },
}

/// One path rule of the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathRule {
    /// Container path.
    pub path: PathBuf,
    /// Access granted beneath it (before narrowing to file rights for non-directories).
    pub access: BitFlags<AccessFs>,
}

/// One TCP port rule of the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortRule {
    /// TCP port.
    pub port: u16,
    /// Bind and/or connect.
    pub access: BitFlags<AccessNet>,
}

/// What to hand the kernel: handled rights and the rules that grant some of them back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LandlockPlan {
    /// The ABI the plan is written for (the kernel's, capped at what the crate knows).
    pub abi: ABI,
    /// Filesystem rights denied unless granted by a rule.
    pub handled_fs: BitFlags<AccessFs>,
    /// Path rules, sorted by path, duplicates merged.
    pub path_rules: Vec<PathRule>,
    /// Network rights denied unless granted (empty: TCP untouched).
    pub handled_net: BitFlags<AccessNet>,
    /// Port rules, sorted by port, duplicates merged.
    pub port_rules: Vec<PortRule>,
}

impl LandlockRequest {
    /// Parse the annotation value.
    pub fn parse(json: &str) -> Result<Self, LandlockPlanError> {
        serde_json::from_str(json).map_err(|e| LandlockPlanError::Parse(e.to_string()))
    }

    /// Turn the request into a plan for a kernel reporting Landlock ABI `kernel_abi`
    /// (the raw value of `landlock_create_ruleset(NULL, 0, VERSION)`; <= 0 means none).
    pub fn plan(&self, kernel_abi: i32) -> Result<LandlockPlan, LandlockPlanError> {
        for p in self
            .read
            .iter()
            .chain(&self.write)
            .chain(self.exec.iter().flatten())
        {
            if !p.starts_with('/') {
                return Err(LandlockPlanError::RelativePath(p.clone()));
            }
        }
        if kernel_abi < 1 {
            return Err(LandlockPlanError::Unavailable(kernel_abi));
        }
        if kernel_abi < MIN_ABI_FS {
            return Err(LandlockPlanError::AbiTooOld {
                need: MIN_ABI_FS,
                have: kernel_abi,
                what: "write confinement including truncate(2)",
            });
        }
        let wants_net = self.connect_tcp.is_some() || self.bind_tcp.is_some();
        if wants_net && kernel_abi < MIN_ABI_NET {
            return Err(LandlockPlanError::AbiTooOld {
                need: MIN_ABI_NET,
                have: kernel_abi,
                what: "TCP connect/bind rules",
            });
        }
        let abi = ABI::from(kernel_abi);
        let all = AccessFs::from_all(abi);
        let exec_listed = self.exec.is_some();
        let read_only = AccessFs::ReadFile | AccessFs::ReadDir;
        let read = if exec_listed {
            read_only
        } else {
            read_only | AccessFs::Execute
        };
        let write = if exec_listed {
            all & !AccessFs::Execute
        } else {
            all
        };
        let exec = read_only | AccessFs::Execute;

        let mut paths: BTreeMap<PathBuf, BitFlags<AccessFs>> = BTreeMap::new();
        let lists = [(&self.read, read), (&self.write, write)];
        for (list, access) in lists {
            for p in list {
                *paths.entry(PathBuf::from(p)).or_default() |= access;
            }
        }
        for p in self.exec.iter().flatten() {
            *paths.entry(PathBuf::from(p)).or_default() |= exec;
        }

        let mut handled_net = BitFlags::<AccessNet>::empty();
        let mut ports: BTreeMap<u16, BitFlags<AccessNet>> = BTreeMap::new();
        let net_lists = [
            (&self.connect_tcp, AccessNet::ConnectTcp),
            (&self.bind_tcp, AccessNet::BindTcp),
        ];
        for (list, right) in net_lists {
            if let Some(list) = list {
                handled_net |= right;
                for port in list {
                    *ports.entry(*port).or_default() |= right;
                }
            }
        }

        Ok(LandlockPlan {
            abi,
            handled_fs: all,
            path_rules: paths
                .into_iter()
                .map(|(path, access)| PathRule { path, access })
                .collect(),
            handled_net,
            port_rules: ports
                .into_iter()
                .map(|(port, access)| PortRule { port, access })
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(json: &str) -> LandlockRequest {
        LandlockRequest::parse(json).unwrap()
    }

    fn access_of(plan: &LandlockPlan, path: &str) -> BitFlags<AccessFs> {
        plan.path_rules
            .iter()
            .find(|r| r.path == std::path::Path::new(path))
            .unwrap()
            .access
    }

    #[test]
    fn unknown_keys_are_refused() {
        let e = LandlockRequest::parse(r#"{"reed":["/usr"]}"#).unwrap_err();
        assert!(matches!(e, LandlockPlanError::Parse(_)));
        assert!(matches!(
            LandlockRequest::parse("[1]"),
            Err(LandlockPlanError::Parse(_))
        ));
    }

    #[test]
    fn relative_paths_are_refused() {
        let e = req(r#"{"write":["work"]}"#).plan(7).unwrap_err();
        assert_eq!(e, LandlockPlanError::RelativePath("work".into()));
    }

    #[test]
    fn no_landlock_is_refused_not_skipped() {
        assert_eq!(
            req(r#"{"read":["/"]}"#).plan(0),
            Err(LandlockPlanError::Unavailable(0))
        );
        assert_eq!(
            req(r#"{"read":["/"]}"#).plan(-38),
            Err(LandlockPlanError::Unavailable(-38))
        );
    }

    #[test]
    fn abi_without_truncate_is_refused() {
        let e = req(r#"{"read":["/"]}"#).plan(2).unwrap_err();
        assert!(matches!(
            e,
            LandlockPlanError::AbiTooOld {
                need: 3,
                have: 2,
                ..
            }
        ));
    }

    #[test]
    fn ports_need_abi_4() {
        let e = req(r#"{"connect_tcp":[443]}"#).plan(3).unwrap_err();
        assert!(matches!(
            e,
            LandlockPlanError::AbiTooOld {
                need: 4,
                have: 3,
                ..
            }
        ));
        assert!(req(r#"{"connect_tcp":[443]}"#).plan(4).is_ok());
    }

    #[test]
    fn read_write_exec_semantics() {
        let plan = req(r#"{"read":["/usr","/etc"],"write":["/work","/tmp"]}"#)
            .plan(7)
            .unwrap();
        assert_eq!(plan.handled_fs, AccessFs::from_all(ABI::V7));
        let read = access_of(&plan, "/usr");
        assert!(read.contains(AccessFs::Execute | AccessFs::ReadFile | AccessFs::ReadDir));
        assert!(!read.contains(AccessFs::WriteFile));
        assert!(!read.contains(AccessFs::Truncate));
        assert_eq!(access_of(&plan, "/work"), AccessFs::from_all(ABI::V7));
        assert!(plan.handled_net.is_empty());
        assert!(plan.port_rules.is_empty());
    }

    #[test]
    fn exec_list_takes_execute_away_from_read_and_write() {
        let plan = req(r#"{"read":["/usr"],"write":["/work"],"exec":["/usr/bin"]}"#)
            .plan(7)
            .unwrap();
        assert!(!access_of(&plan, "/usr").contains(AccessFs::Execute));
        assert!(!access_of(&plan, "/work").contains(AccessFs::Execute));
        assert!(access_of(&plan, "/usr/bin").contains(AccessFs::Execute));
        assert!(plan.handled_fs.contains(AccessFs::Execute));
    }

    #[test]
    fn duplicate_paths_and_ports_merge() {
        let plan = req(r#"{"read":["/a"],"write":["/a"],"connect_tcp":[80,80],"bind_tcp":[80]}"#)
            .plan(7)
            .unwrap();
        assert_eq!(plan.path_rules.len(), 1);
        assert_eq!(access_of(&plan, "/a"), AccessFs::from_all(ABI::V7));
        assert_eq!(plan.port_rules.len(), 1);
        assert_eq!(
            plan.port_rules[0].access,
            AccessNet::ConnectTcp | AccessNet::BindTcp
        );
        assert_eq!(plan.handled_net, AccessNet::ConnectTcp | AccessNet::BindTcp);
    }

    #[test]
    fn empty_port_list_handles_and_grants_nothing() {
        let plan = req(r#"{"connect_tcp":[]}"#).plan(7).unwrap();
        assert_eq!(plan.handled_net, BitFlags::from(AccessNet::ConnectTcp));
        assert!(plan.port_rules.is_empty());
    }

    #[test]
    fn newer_kernels_get_the_crate_best() {
        let plan = req(r#"{"read":["/"]}"#).plan(42).unwrap();
        assert_eq!(plan.handled_fs, AccessFs::from_all(ABI::from(42)));
    }
}
