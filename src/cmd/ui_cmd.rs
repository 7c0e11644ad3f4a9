//! `h5i ui`: start the box console and print its URL (token included) once on stdout. Built
//! only with the default-on cargo feature `ui`; `--no-default-features` leaves the command out.

use clap::Args;

/// `h5i ui [--port N] [--open]`.
#[derive(Debug, Args)]
pub struct UiArgs {
    /// The loopback port to listen on; 0 lets the kernel pick a free one.
    #[arg(long, value_name = "N", default_value_t = h5i::ui::DEFAULT_PORT)]
    port: u16,
    /// Also hand the URL to this desktop's browser (xdg-open, given a private file that
    /// leads to it: the token stays out of every command line).
    #[arg(long)]
    open: bool,
}

/// Serve until the process is ended (Ctrl-C).
pub fn dispatch(args: UiArgs) -> anyhow::Result<i32> {
    let store = super::box_cmd::store()?;
    h5i::ui::serve(store, args.port, args.open, super::out::line)?;
    Ok(0)
}
