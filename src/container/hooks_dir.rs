//! The per-run `--hooks-dir` of a container-tier run: one OCI hook file (Podman's
//! `hooks.d` schema 1.0.0) per createContainer hook, each matching only this run's
//! `h5i.run` annotation.
//!
//! Owns the files' content and order: Podman runs the hooks of one stage in file-name order, so
//! `00-loopback` (bring up the box's own `lo`) comes before the listeners that bind on it. A
//! hook runs with only the variables its file names: with `H5I_LOG` set, those are the filter
//! and the run's relay directory (`H5I_LOG_DIR`, h5i-log's relay), so its events come back to
//! the caller's stderr.
//! Passing this directory replaces the system's hook directories for the run, so no hook h5i
//! did not write runs in the box. Must never: write a hook that matches other containers (the
//! annotation value is the run id, anchored), or run a hook outside the createContainer stage.
//!
//! Guarded by the unit tests below and `tests/container_tier.rs`.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::podman_args::RUN_ANNOTATION;

/// A hook's Podman file: `argv[0]` is the program's absolute path, `env` its whole environment
/// (`NAME=VALUE`; none when empty).
pub fn hook_file(run_id: &str, argv: &[String], env: &[String]) -> serde_json::Value {
    let escaped = regex_literal(run_id);
    let mut file = json!({
        "version": "1.0.0",
        "hook": {
            "path": argv.first().cloned().unwrap_or_default(),
            "args": argv.iter().enumerate().map(|(i, a)| {
                if i == 0 {
                    Path::new(a).file_name().map_or_else(|| a.clone(), |n| n.to_string_lossy().into_owned())
                } else {
                    a.clone()
                }
            }).collect::<Vec<_>>(),
            "timeout": 30,
        },
        "when": {
            "annotations": {
                format!("^{}$", regex_literal(RUN_ANNOTATION)): format!("^{escaped}$"),
            }
        },
        "stages": ["createContainer"],
    });
    if !env.is_empty() {
        file["hook"]["env"] = json!(env);
    }
    file
}

/// `s` with every regular-expression metacharacter escaped.
fn regex_literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Write `hooks` (in order, each with `env`) into `dir` as `NN-<name>.json`; returns the files
/// written.
pub fn write(
    dir: &Path,
    run_id: &str,
    hooks: &[Vec<String>],
    env: &[String],
) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    for (i, argv) in hooks.iter().enumerate() {
        let name = argv.get(1).map_or("hook", String::as_str);
        let path = dir.join(format!("{:02}-{name}.json", i * 10));
        std::fs::write(
            &path,
            serde_json::to_vec_pretty(&hook_file(run_id, argv, env))?,
        )?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hook_matches_only_its_own_run() {
        let v = hook_file(
            "b.1-2",
            &[
                "/opt/h5i/h5i-hook".into(),
                "loopback".into(),
                "--inside".into(),
            ],
            &[],
        );
        assert_eq!(v["hook"]["path"], "/opt/h5i/h5i-hook");
        assert!(v["hook"].get("env").is_none(), "{v}");
        assert_eq!(
            v["hook"]["args"],
            json!(["h5i-hook", "loopback", "--inside"])
        );
        assert_eq!(v["stages"], json!(["createContainer"]));
        assert_eq!(v["when"]["annotations"]["^h5i\\.run$"], "^b\\.1-2$");
    }

    #[test]
    fn a_hook_gets_exactly_the_environment_given() {
        let env = ["H5I_LOG=debug".to_string(), "H5I_LOG_DIR=/run/x/log".into()];
        let v = hook_file("r", &["/h".into(), "loopback".into()], &env);
        assert_eq!(
            v["hook"]["env"],
            json!(["H5I_LOG=debug", "H5I_LOG_DIR=/run/x/log"])
        );
    }

    #[test]
    fn hooks_run_in_the_order_given() {
        let dir = tempfile::tempdir().unwrap();
        let files = write(
            dir.path(),
            "r",
            &[
                vec!["/h".into(), "loopback".into()],
                vec!["/h".into(), "listen".into()],
                vec!["/h".into(), "listen".into()],
            ],
            &[],
        )
        .unwrap();
        let mut names: Vec<String> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            ["00-loopback.json", "10-listen.json", "20-listen.json"]
        );
        names.sort();
        assert_eq!(names[0], "00-loopback.json");
    }
}
