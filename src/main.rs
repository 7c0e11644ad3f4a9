//! The `h5i` binary: parse, dispatch to the library, print. Errors become one or two lines on
//! stderr and an exit code; nothing else lives here.
//!
//! Exit codes: `box run` passes the command's code through (124 when the wall clock killed it,
//! 128+N for a signal); 125 when h5i itself refused a run before it started; 1 for any other
//! refusal; 2 for a usage error. Every error passes through `h5i::escape` on its way out.

mod cmd;

use clap::Parser;

/// Records which standard descriptors were closed at exec, before Rust's runtime puts
/// `/dev/null` on them, so a box's command gets them closed too (see h5i_runtime::stdio).
#[used]
#[link_section = ".init_array"]
static RECORD_CLOSED_STDIO: extern "C" fn() = h5i_runtime::stdio::record_closed_at_start;

fn main() {
    h5i_log::init("h5i");
    let cli = cmd::Cli::parse();
    let code = match cmd::dispatch(cli) {
        Ok(code) => code,
        Err(err) => {
            h5i_log::refused(err.as_ref());
            // A refusal may carry a box-chosen path or git's complaint about one.
            eprintln!("h5i: {}", h5i::escape::escape_controls(&format!("{err:#}")));
            err.downcast_ref::<cmd::RunRefused>().map_or(1, |_| 125)
        }
    };
    std::process::exit(cmd::out::finish(code));
}
