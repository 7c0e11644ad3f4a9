//! The browser in a box, its verbs: the box-lifetime sidecar ([`sidecar`]), its relay and
//! fence, the control lock, the viewers, and the drain of a run's browser traffic into its
//! receipt.
//!
//! What a browser box is and what its runs get (the variables, `/dev/shm`, the sidecar's group,
//! whether its browser lives as long as the box) is `crate::browser_box`'s, below the tiers:
//! a tier is handed it and never names this module (`tests/module_layers.rs`). Its items are
//! re-exported here for the verbs.
//!
//! Guarded by `tests/browser.rs`.

pub mod control;
pub mod drain;
pub mod fence;
pub mod relay;
pub mod sidecar;
#[cfg(feature = "ui")]
pub mod term;
#[cfg(feature = "ui")]
pub mod view;
pub mod view_sessions;
pub mod viewer;
#[cfg(feature = "ui")]
pub mod watch;

pub use crate::browser_box::{
    allowed_domains, box_env, grant, is_browser_box, shm_bytes, vars, BROWSER_SHM_BYTES,
    CHROME_ARGS, CHROMIUM, GATEWAY_VARS, STATE_GRANT,
};
