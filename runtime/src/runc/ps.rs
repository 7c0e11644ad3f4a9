//! `ps`: the pids in a container's cgroup, as JSON or a small table (`PID CMD`).

use libcgroups::common::{CgroupConfig, CgroupManager};

use super::{Context, RuncError};

/// Pids of every process in container `id`'s cgroup, sorted.
pub fn pids(ctx: &Context, id: &str) -> Result<Vec<i32>, RuncError> {
    let container = ctx.load(id)?;
    let config = container.spec().map_err(RuncError::container(id))?;
    let ps_err = |e: &dyn std::fmt::Display| RuncError::Ps {
        id: id.to_string(),
        reason: e.to_string(),
    };
    let manager = libcgroups::common::create_cgroup_manager(CgroupConfig {
        cgroup_path: config.cgroup_path,
        systemd_cgroup: false,
        container_name: id.to_string(),
    })
    .map_err(|e| ps_err(&e))?;
    let mut pids: Vec<i32> = manager
        .get_all_pids()
        .map_err(|e| ps_err(&e))?
        .iter()
        .map(|p| p.as_raw())
        .collect();
    pids.sort_unstable();
    Ok(pids)
}

/// Render `ps` output in `format` ("table" or "json").
pub fn render(pids: &[i32], format: &str) -> Result<String, RuncError> {
    match format {
        "json" => Ok(serde_json::to_string(pids).unwrap_or_else(|_| "[]".into())),
        "table" => {
            let mut out = String::from("PID\tCMD\n");
            for pid in pids {
                let cmd = std::fs::read(format!("/proc/{pid}/cmdline"))
                    .map(|b| {
                        b.split(|c| *c == 0)
                            .filter(|s| !s.is_empty())
                            .map(|s| String::from_utf8_lossy(s).into_owned())
                            .collect::<Vec<_>>()
                            .join(" ")
                    })
                    .unwrap_or_default();
                out.push_str(&format!("{pid}\t{cmd}\n"));
            }
            Ok(out)
        }
        other => Err(RuncError::Ps {
            id: String::new(),
            reason: format!("unknown format {other:?}; to fix: use table or json"),
        }),
    }
}
