//! One spool entry as a box writes it (the box owns `spool/`): ingested as the host does after
//! a run. It is recorded box-claimed or quarantined, never under a host-observed lane.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(dir) = tempfile::tempdir() else { return };
    if std::fs::write(dir.path().join("0001.json"), data).is_err() {
        return;
    }
    let Ok(entries) = h5i_hook::spool::ingest(dir.path()) else {
        return;
    };
    assert_eq!(entries.len(), 1);
    for e in &entries {
        assert!(
            !e.lane.is_host_observed(),
            "a box's spool entry under {:?}",
            e.lane
        );
    }
});
