//! A bundle's `config.json` as h5i-runc's `create` handles it before libcontainer runs anything:
//! the supervised network's default directory and socket-gate merge (on the JSON), then the
//! parsed spec's confinement plan from `h5i.*` annotations, id-map helper decision, staging
//! plan and cgroup placement.
//!
//! Properties: the gate merge is idempotent and leaves a spec whose seccomp routes socket calls
//! to the listener; staging only ever names paths under the staging directory, one entry each;
//! a relative `cgroupsPath` lands under the caller's cgroup; `h5i.seccomp` that plans yields
//! programs. Never a panic on any input.
#![no_main]

use std::collections::HashSet;
use std::path::Path;

use h5i_runtime::confine::{ConfinementPlan, ANNOTATION_SECCOMP};
use h5i_runtime::runc::{cgroup, gate, idmap, net_dir, sidecar, stage};
use h5i_runtime::socket_gate::{inject, routes_sockets_to_listener};
use libcontainer::oci_spec::runtime::Spec;
use serde_json::Value;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(mut config) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let _ = net_dir::wants_default(&config);
    if let Ok(Some(listener)) = gate::listener_for(&config) {
        assert!(listener.is_absolute() && listener.ends_with(gate::GATE_SOCKET));
        let before = config.clone();
        match inject(&mut config, &listener) {
            Err(_) => assert_eq!(config, before, "a refused merge changed the spec"),
            Ok(()) => {
                let once = config.clone();
                assert!(inject(&mut config, &listener).is_ok());
                assert_eq!(config, once, "the gate merge is not idempotent");
                if let Ok(spec) = serde_json::from_value::<Spec>(config.clone()) {
                    let seccomp = spec.linux().as_ref().and_then(|l| l.seccomp().clone());
                    assert!(
                        seccomp.is_some_and(|s| routes_sockets_to_listener(&s)),
                        "a merged spec does not route sockets to the gate"
                    );
                }
            }
        }
    }
    let Ok(mut spec) = serde_json::from_value::<Spec>(config) else {
        return;
    };
    let seccomp_asked = spec
        .annotations()
        .as_ref()
        .is_some_and(|a| a.contains_key(ANNOTATION_SECCOMP));
    if let Ok(plan) = ConfinementPlan::from_spec(&spec, None, || 6) {
        assert_eq!(plan.seccomp.is_some(), seccomp_asked);
        if let Some((_, programs)) = &plan.seccomp {
            assert!(!programs.is_empty() && programs.iter().all(|p| !p.is_empty()));
        }
    }
    let _ = idmap::needs_helpers(&spec, true, 0);
    if let Some(resources) = spec.linux().as_ref().and_then(|l| l.resources().as_ref()) {
        let _ = sidecar::limitless(resources);
    }
    if let Some(named) = spec.linux().as_ref().and_then(|l| l.cgroups_path().clone()) {
        let anchor = Path::new("caller/slice");
        let placed = cgroup::resolve_named(anchor, &named);
        if named.is_relative() {
            assert!(
                placed.starts_with("/caller/slice"),
                "relative cgroupsPath {named:?} placed at {placed:?}"
            );
        }
    }
    let _ = stage::needed(&spec, true);
    let entries = stage::plan(&mut spec, Path::new("/bundle"), |_| true);
    let mut staged = HashSet::new();
    for e in &entries {
        assert!(
            e.staged.starts_with(stage::STAGE_DIR) && e.staged != Path::new(stage::STAGE_DIR),
            "staged outside the staging directory: {e:?}"
        );
        assert!(staged.insert(e.staged.clone()), "staged twice: {e:?}");
    }
});
