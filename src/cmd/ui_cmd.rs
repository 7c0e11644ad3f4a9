//! `h5i ui`: start the box console and print its URL (token included) once on stdout. Built
//! only with the default-on cargo feature `ui`; `--no-default-features` leaves the command out.

use clap::Args;

/// `h5i ui [--port N] [--open]`.
#[derive(Debug, Args)]
pub struct UiArgs {
    /// The loopback port to listen on; 0 lets the kernel pick a free one.
    #[arg(long, value_name = "N", default_value_t = h5i::ui::DEFAULT_PORT)]
    port: u16,
    /// Also hand the URL to this desktop's browser (xdg-open).
    #[arg(long)]
    open: bool,
}

/// Serve until the process is ended (Ctrl-C).
pub fn dispatch(args: UiArgs) -> anyhow::Result<i32> {
    let store = super::box_cmd::store()?;
    h5i::ui::serve(store, args.port, |url| {
        super::out::line(url);
        if args.open {
            open_in_browser(url);
        }
    })?;
    Ok(0)
}

/// Hand `url` to the desktop's browser; a desktop without one is said, not fatal (the URL is
/// already printed). The opener is reaped on a thread of its own.
fn open_in_browser(url: &str) {
    match std::process::Command::new("xdg-open")
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
    {
        Ok(mut child) => {
            std::thread::spawn(move || child.wait());
        }
        Err(e) => {
            eprintln!("h5i: could not hand the URL to a browser (xdg-open: {e}); open it yourself")
        }
    }
}
