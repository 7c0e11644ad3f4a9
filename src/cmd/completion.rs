//! `h5i completion SHELL`: the shell completion script, generated from the same clap
//! definitions as `--help` (so a flag is defined once and completes everywhere).

use clap::CommandFactory;

/// Write the completion script for `shell` to stdout (rendered whole first: clap_complete
/// panics on a write error, and `h5i completion zsh | head` is a reader leaving, not a fault).
pub fn run(shell: clap_complete::Shell) -> anyhow::Result<i32> {
    let mut cmd = super::Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "h5i", &mut script);
    super::out::bytes(&script);
    Ok(0)
}
