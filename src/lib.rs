//! h5i: the box lifecycle.
//!
//! Owns the box store under `.git/.h5i/`, creating boxes from their sources, running commands in
//! them through the tier backends, and the one way out: the export gate. Policy decisions live in
//! `h5i-policy`, process supervision and confinement in `h5i-runtime`, receipts and redaction in
//! `h5i-broker`; this crate wires them in the order the invariants need (policy stored before
//! any other state; receipts from the host's observation only).
//!
//! Must never: write outside `.git/.h5i/` and the paths a verb names (`--out`, the parent branch
//! for `apply`), run git against a repository a box can write, or print a secret value.

pub mod agent;
pub mod allow;
pub mod apply;
pub mod beneath;
pub mod bounded;
pub mod box_export;
pub mod box_home;
pub mod browser;
pub mod browser_box;
pub mod browser_idle;
pub mod cache;
pub mod capture;
pub mod compare;
pub mod container;
pub mod create;
pub mod credentials;
pub mod denied_egress;
pub mod diff;
pub mod doctor;
pub mod error;
pub mod escape;
pub mod events;
pub mod export;
pub mod file_lock;
pub mod freeze;
pub mod git;
pub mod host;
pub mod identity;
pub mod inspect;
pub mod json_doc;
pub mod landing;
pub mod lifecycle;
pub mod microvm;
pub mod pin;
pub mod probe;
pub mod process;
pub mod random;
pub mod rebase;
pub mod rename;
pub mod run;
pub mod sandbox;
pub mod secrets;
pub mod service;
pub mod service_state;
pub mod session;
pub mod shell;
pub mod skill;
pub mod snapshot;
pub mod status;
pub mod store;
pub mod supervised;
pub mod tier_host;
#[cfg(feature = "ui")]
pub mod ui;
