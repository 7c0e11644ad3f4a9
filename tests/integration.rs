//! h5i's integration tests, one binary (STYLE.md: one integration binary per crate): each
//! module is one subject, asserted with the real `h5i` binaries in real boxes (each module's doc
//! says what it proves). One binary links once: on this project's 2-core hosts every release
//! test binary was a thin-LTO link of the whole crate, and 41 of them were most of CI's build.
//! Run one subject with `cargo test --release --test integration SUBJECT::`.
//!
//! `install` stays a binary of its own: it replaces `target/release/h5i*` and the host's hook
//! while it runs, so nothing may run beside it (cargo runs one test binary at a time).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "model/agent.rs"]
mod agent;
mod common;
#[path = "model/demo.rs"]
mod demo;
mod model;
#[path = "../broker/tests/support/mod.rs"]
mod support;

mod agent_claude;
mod agent_codex;
mod box_allow;
mod box_cache;
mod box_cli;
mod box_home;
mod box_inspect;
mod box_lifecycle;
mod box_load;
mod box_services;
mod box_shell;
mod box_stdio;
mod box_work_path;
mod browser;
mod cli_docs;
mod confine;
mod container_tier;
mod crash_safety;
mod credentials;
mod default_ceiling;
mod export_gate;
mod export_race;
mod export_tiers;
mod hostile_names;
mod hostile_output;
mod hostile_reads;
mod identity;
mod json_docs;
mod log;
mod microvm;
mod microvm_msb;
mod module_layers;
mod process_tier;
mod run_signals;
mod sandbox;
mod seccomp_base;
mod secrets;
mod skill;
mod supervised_sandbox;
mod supervised_tier;
mod ui;
