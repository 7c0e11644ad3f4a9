//! The generated command-line documents: completion scripts load in the shells that run them,
//! and the man pages render through groff without a warning.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::process::Command;

use common::H5I;

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

#[test]
fn the_bash_completion_script_loads_and_completes_box_verbs() {
    let script = format!(
        "source <('{H5I}' completion bash) && complete -p h5i && COMP_WORDS=(h5i box ca) COMP_CWORD=2 COMP_LINE='h5i box ca' COMP_POINT=10 && _h5i h5i ca box && printf '%s\\n' \"${{COMPREPLY[@]}}\""
    );
    let out = Command::new("bash").args(["-c", &script]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("-F _h5i h5i"), "{text}");
    assert!(
        text.lines().any(|l| l == "cache"),
        "`h5i box ca<TAB>` did not offer cache: {text}"
    );
}

#[test]
fn the_h5i_variables_appear_in_help_through_clap_env() {
    let out = Command::new(H5I)
        .args(["box", "create", "--help"])
        .env("H5I_AGENT", "codex")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for var in ["H5I_AGENT", "H5I_DEFAULT_ISOLATION", "H5I_CREDENTIAL_PROXY"] {
        assert!(
            text.contains(&format!("[env: {var}")),
            "{var} is not in --help:\n{text}"
        );
    }
    assert!(text.contains("[env: H5I_AGENT=codex]"), "{text}");
}

/// The non-test part of every Rust source of the workspace's own crates (vendored patches
/// left out): each file up to its `#[cfg(test)]`.
fn workspace_sources() -> Vec<(std::path::PathBuf, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    let mut stack: Vec<_> = [
        "src",
        "log/src",
        "policy/src",
        "runtime/src",
        "broker/src",
        "hooks",
    ]
    .iter()
    .map(|d| root.join(d))
    .collect();
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                let code = text.split("#[cfg(test)]").next().unwrap().to_string();
                out.push((p, code));
            }
        }
    }
    assert!(out.len() > 20, "found only {} sources", out.len());
    out
}

/// Every variable the code reads by a literal name: each `"H5I_..."` literal (a read, a prefix
/// like `H5I_SECRET_`, or a variable h5i sets in a box, which the help names too) and each
/// `var("NAME")` / `var_os("NAME")` call.
fn variables_the_code_reads() -> std::collections::BTreeSet<String> {
    let mut vars = std::collections::BTreeSet::new();
    for (_, code) in workspace_sources() {
        for (i, _) in code.match_indices("\"H5I_") {
            let name: String = code[i + 1..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            vars.insert(name.trim_end_matches('_').to_string());
        }
        for call in ["var(\"", "var_os(\""] {
            for (i, _) in code.match_indices(call) {
                let name: String = code[i + call.len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    vars.insert(name);
                }
            }
        }
    }
    // The names read through tables rather than a literal call: the registry mirror's.
    vars.extend(
        [
            "PIP_INDEX_URL",
            "PIP_CONFIG_FILE",
            "GOPROXY",
            "GOENV",
            "UV_DEFAULT_INDEX",
            "UV_INDEX_URL",
            "UV_INDEX",
            "UV_EXTRA_INDEX_URL",
            "UV_INSECURE_HOST",
            "NPM_CONFIG_REGISTRY",
            "YARN_REGISTRY",
            "CARGO_REGISTRIES_",
        ]
        .map(String::from),
    );
    vars
}

#[test]
fn every_variable_the_code_reads_is_in_h5i_help_and_the_man_page() {
    let vars = variables_the_code_reads();
    for expected in [
        "H5I_LOG",
        "H5I_CONTAINER_USER",
        "H5I_SANDBOX",
        "H5I_SKILL_DIR",
        "H5I_NO_PROBE_CACHE",
        "HOME",
    ] {
        assert!(
            vars.contains(expected),
            "the scan missed {expected}: {vars:?}"
        );
    }
    let help = Command::new(H5I).arg("--help").output().unwrap();
    assert!(help.status.success());
    let help = String::from_utf8_lossy(&help.stdout);
    let man = Command::new(H5I).arg("man").output().unwrap();
    assert!(man.status.success());
    // roff escapes `-` and `_` stays; undo the dash escape before looking.
    let man = String::from_utf8_lossy(&man.stdout).replace("\\-", "-");
    for var in &vars {
        assert!(
            help.contains(var.as_str()),
            "{var} is read by h5i but `h5i --help` does not name it:\n{help}"
        );
        assert!(
            man.contains(var.as_str()),
            "{var} is read by h5i but h5i(1) does not name it"
        );
    }
}

/// zsh's own completion system, in a terminal: an interactive zsh (in a zsh/zpty pseudo-terminal)
/// that ran compinit and sourced the script is sent `h5i box ca<TAB>` and must offer `cache`
/// with its description. A script that loads but registers nothing never offers it, and the
/// outer `timeout` ends the wait.
#[test]
fn the_zsh_completion_script_loads_and_completes_box_verbs() {
    if !on_path("zsh") {
        h5i_testsupport::skipped!(
            "the_zsh_completion_script_loads_and_completes_box_verbs: zsh is not installed"
        );
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let dump = home.path().join(".zcompdump");
    std::fs::write(
        home.path().join(".zshrc"),
        format!(
            "autoload -U compinit && compinit -u -d '{}'\nsource <('{H5I}' completion zsh)\nPROMPT='> '\n",
            dump.display()
        ),
    )
    .unwrap();
    let driver = format!(
        "zmodload zsh/zpty\nzpty -b z 'ZDOTDIR={} zsh -i'\nzpty -w -n z $'h5i box ca\\t'\nzpty -r z out '*cache*--*Warm dependency caches*'\nzpty -d z\nprint -r -- \"$out\"\n",
        home.path().display()
    );
    let out = Command::new("timeout")
        .args(["60", "zsh", "-f", "-c", &driver])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "zsh never offered `cache` for `h5i box ca<TAB>` (exit {:?}): {shown}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        shown.contains("cache") && shown.contains("Warm dependency caches"),
        "{shown}"
    );
}

/// A reader that leaves early (`h5i completion zsh | head`) ends the output quietly: exit 0, no
/// panic and no complaint on stderr, for the generated documents as for every other verb.
#[test]
fn a_generated_document_piped_to_a_reader_that_left_ends_quietly() {
    for args in [
        &["completion", "zsh"][..],
        &["completion", "bash"],
        &["man"],
        &["man", "box"],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(H5I)
            .args(args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.stderr.is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn man_h5i_box_renders_without_a_groff_warning() {
    if !on_path("groff") {
        h5i_testsupport::skipped!(
            "man_h5i_box_renders_without_a_groff_warning: groff is not installed"
        );
        return;
    }
    for (args, name, mention) in [
        (vec!["man"], "h5i", "box"),
        (vec!["man", "box"], "h5i-box", "cache"),
        (vec!["man", "box", "cache"], "h5i-box-cache", "refresh"),
    ] {
        let roff = Command::new(H5I).args(&args).output().unwrap();
        assert!(roff.status.success(), "{args:?}");
        let dir = tempfile::tempdir().unwrap();
        let page = dir.path().join("page.1");
        std::fs::write(&page, &roff.stdout).unwrap();
        let out = Command::new("groff")
            .args(["-man", "-Tutf8", "-ww"])
            .arg(&page)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success());
        assert!(
            out.stderr.is_empty(),
            "groff warned: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains(name) && text.contains(mention), "{text}");
    }
    let out = Command::new(H5I)
        .args(["man", "box", "nosuch"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("refusing: `h5i-box` has no command `nosuch`"));

    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(H5I)
        .args(["man", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    for page in [
        "h5i.1",
        "h5i-box.1",
        "h5i-box-cache-refresh.1",
        "h5i-completion.1",
    ] {
        assert!(dir.path().join(page).is_file(), "{page} not written");
    }
    assert!(
        !dir.path().join("h5i-box-__service-supervise.1").exists(),
        "a hidden command got a page"
    );
}
