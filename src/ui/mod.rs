//! `h5i ui`: the box console, one read-only screen over the whole fleet, served on loopback.
//!
//! Owns the console's server: a current-thread tokio runtime (the only one in h5i; nothing on
//! this path creates a container, so no fork happens under a multi-threaded runtime) running
//! axum on `127.0.0.1` and nothing else. [`auth`] decides who may ask, [`routes`] answers, and
//! [`fleet`] turns the store into what the page draws, through the same code the CLI prints
//! from. The page (`page/`) is compiled in.
//!
//! Must never: bind an address other than 127.0.0.1, write the session's secrets anywhere
//! (they live in this process's memory; the URL printed on stdout is the one place the token
//! appears; `--open` hands the browser a one-time code instead, which [`auth`] forgets on first
//! use or after two minutes), offer a route that changes anything (shell, run, export, apply
//! and rm stay in the CLI), or serve a file from disk. Built only with the default-on cargo
//! feature `ui`.
//!
//! Guarded by the unit tests in each module and `tests/ui.rs` (real HTTP on loopback, and a
//! headless Chromium loading the page).

pub mod auth;
pub mod fleet;
pub mod handoff;
pub mod routes;
pub mod stop;

use std::future::IntoFuture;
use std::net::Ipv4Addr;
use std::sync::Arc;

use crate::store::BoxStore;

/// The port `h5i ui` listens on unless `--port` says otherwise (the manual's).
pub const DEFAULT_PORT: u16 = 8765;

/// Blocking threads the console may use to read the store at once.
const STORE_READERS: usize = 4;

/// Why the console did not start (or stopped).
#[derive(Debug, thiserror::Error)]
pub enum UiError {
    /// The port could not be bound.
    #[error("refusing: cannot listen on 127.0.0.1:{port}: {source}; to fix: pick another port with --port N, or --port 0 for any free one")]
    Bind {
        /// The port asked for.
        port: u16,
        /// Why.
        source: std::io::Error,
    },
    /// The runtime, the secrets or the server failed.
    #[error("refusing: the console could not run: {0}; to fix: check /dev/urandom is readable and the process may open sockets")]
    Io(#[from] std::io::Error),
}

/// Serve the console of `store` on 127.0.0.1:`port` (0: the kernel picks) until Ctrl-C (or
/// SIGTERM, SIGHUP: [`stop`]). `ready` is handed the URL, token included, once the socket is
/// listening; with `open`, a URL carrying a one-time code (never the token) is then handed to
/// the desktop's browser through [`handoff`] (a failure is said on stderr: the URL is printed
/// already).
pub fn serve(
    store: BoxStore,
    port: u16,
    open: bool,
    ready: impl FnOnce(&str),
) -> Result<(), UiError> {
    let mut stop = stop::on_stop()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .max_blocking_threads(STORE_READERS)
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port))
            .await
            .map_err(|source| UiError::Bind { port, source })?;
        let gate = Arc::new(auth::Gate::mint(listener.local_addr()?.port())?);
        ready(&gate.url());
        if open {
            match handoff::Handoff::open(&store, &gate.one_time_url()?) {
                Ok(h) => {
                    let _ = gate.handoff.set(h);
                    let expiring = Arc::clone(&gate);
                    tokio::spawn(async move {
                        tokio::time::sleep(auth::CODE_TTL).await;
                        expiring.expire_code();
                    });
                }
                Err(e) => eprintln!("h5i: {e}"),
            }
        }
        let app = routes::router(store, Arc::clone(&gate));
        tokio::select! {
            served = axum::serve(listener, app).into_future() => served?,
            _ = stop.wait_for(|stopped| *stopped) => {}
        }
        if let Some(h) = gate.handoff.get() {
            h.used();
        }
        Ok(())
    })
}
