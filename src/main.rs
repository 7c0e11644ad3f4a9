//! The `h5i` binary: parse, dispatch to the library, print. Errors become one or two lines on
//! stderr and an exit code; nothing else lives here.
//!
//! Exit codes: `box run` passes the command's code through (124 when the wall clock killed it,
//! 128+N for a signal); 125 when h5i itself refused a run before it started; 1 for any other
//! refusal; 2 for a usage error. Every error passes through `h5i::escape` on its way out.

mod cmd;

use clap::Parser;

fn main() {
    let cli = cmd::Cli::parse();
    let code = match cmd::dispatch(cli) {
        Ok(code) => code,
        Err(err) => {
            // A refusal may carry a box-chosen path or git's complaint about one.
            eprintln!("h5i: {}", h5i::escape::escape_controls(&format!("{err:#}")));
            err.downcast_ref::<cmd::RunRefused>().map_or(1, |_| 125)
        }
    };
    std::process::exit(code);
}
