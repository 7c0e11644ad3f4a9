//! h5i-hook: what happens at a box's edges in time, as OCI hooks.
//!
//! Owns the hooks a box's bundle declares, so they run the same under `h5i-runc` and under
//! Podman: each reads the OCI state on stdin (validated against a closed set of fields), acts
//! on the container's namespaces by pid, and exits. Today: `loopback` (createRuntime) brings up
//! `lo` in the box's private network namespace, so a dev server in the box is reachable from the
//! box and from nothing else. After a run, `spool` ingests what the box staged in its spool as
//! box-claimed records, or quarantines it. `listen --inside` (createContainer) binds the
//! credential proxy's listener on the box's loopback and hands its fd to h5i. At the process tier,
//! `loopback --inside --deny-counted` also routes the box's namespace into a deny-all table
//! that refuses and counts every dial by destination, and can hand h5i the socket it reads
//! the counters with (`denied_net.rs`).
//!
//! The supervised tier's network: `net-up` (createRuntime) starts the per-run `sentry`
//! (`sentry.rs`), which pins the egress request (`egress.rs`), renders the nftables table
//! (`nft.rs`; its counters are read back over netlink, `nft_counters.rs`), serves the socket gate, and, once `net-inside` (createContainer) hands it the
//! box's namespaces, loads the table inside the box's network namespace (`netns.rs`) while it
//! starts the uplink (`uplink.rs`: a veth pair and the host's forwarding for a rootful sentry,
//! `veth.rs`; else pasta on the tap device `net-inside` made, `tap.rs`),
//! and lets the box run only once both are up; `net-down` (poststop) has it write the
//! tally, and ends a net directory h5i-runc made for the run (`net_end.rs`). The spec's
//! `h5i.net*` annotations and the net directory are `net_spec.rs`; the hook verbs `net_hooks.rs`; OCI hooks.d declaration `hooks/oci/h5i-supervised.json`.
//!
//! Must never: act on a pid the state did not name, trust a field outside the closed set, or
//! touch the host's own network namespace beyond the rootful uplink's `h5iu*` devices, its one
//! table and its reply devices' forwarding flags (`veth.rs`), all undone when the last box ends.
//!
//! Guarded by `tests/process_tier.rs` (`a_host_loopback_listener_is_unreachable_from_inside`,
//! `the_boxs_own_loopback_works`) and `hooks/tests/supervised_net.rs`.

pub mod capture;
pub mod claude_state;
pub mod denied_net;
pub mod egress;
pub mod listen;
pub mod loopback;
pub mod net_end;
pub mod net_hooks;
pub mod net_spec;
pub mod netns;
pub mod nft;
pub mod nft_counters;
pub mod sentry;
pub mod spool;
pub mod state;
pub mod tap;
pub mod tee_shim;
pub mod uplink;
pub mod veth;
