//! `h5i host ...`: parse, call `h5i::host`, print one line per change.

use clap::{Args, Subcommand};

/// `h5i host setup`.
#[derive(Debug, Args)]
pub struct HostArgs {
    #[command(subcommand)]
    verb: HostVerb,
}

#[derive(Debug, Subcommand)]
enum HostVerb {
    /// Prepare this host for the kernel tiers (as root; idempotent; one line per change): device
    /// nodes, the h5i-box identity, Podman's config and the supervised tier's hooks.
    Setup {
        /// Also prepare this unprivileged user: subordinate ids, /run/user/<uid>, a delegated
        /// cgroup, rootless Podman config.
        #[arg(long, value_name = "NAME")]
        user: Option<String>,
    },
}

/// Run a `h5i host` command.
pub fn dispatch(args: HostArgs) -> anyhow::Result<i32> {
    match args.verb {
        HostVerb::Setup { user } => {
            let changes = h5i::host::setup(&h5i::host::SetupRequest { user })?;
            if changes.is_empty() {
                super::out::line("setup: nothing to change");
            }
            for c in changes {
                super::out::line(&format!("setup: {c}"));
            }
            Ok(0)
        }
    }
}
