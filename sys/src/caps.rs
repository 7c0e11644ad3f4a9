//! Giving up privilege for good, on the calling thread: `no_new_privs` (no exec gains a
//! privilege), not dumpable (no ptrace attach or `/proc/<pid>/mem` by another process of the
//! same user), and every capability set emptied (joining a user namespace grants the full set
//! inside it); or only the dumpable flag ([`set_not_dumpable`]).
//!
//! Must never: report success when any of the three was refused (each call's error is
//! returned, and nothing after it runs). Tested below in a child, which reads its own
//! thread's status afterwards.

use std::io;

use rustix::process::DumpableBehavior;
use rustix::thread::{CapabilitySet, CapabilitySets};

/// Set `no_new_privs`, make the process not dumpable, and empty the effective, permitted and
/// inheritable capability sets of the calling thread.
pub fn drop_all() -> io::Result<()> {
    rustix::thread::set_no_new_privs(true)?;
    rustix::process::set_dumpable_behavior(DumpableBehavior::NotDumpable)?;
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: CapabilitySet::empty(),
            permitted: CapabilitySet::empty(),
            inheritable: CapabilitySet::empty(),
        },
    )?;
    Ok(())
}

/// Make this process not dumpable (alone: its capabilities and `no_new_privs` stay as they
/// are): a process of the same user without `CAP_SYS_PTRACE` can neither ptrace it nor read
/// its memory or descriptors through `/proc/<pid>`.
pub fn set_not_dumpable() -> io::Result<()> {
    Ok(rustix::process::set_dumpable_behavior(
        DumpableBehavior::NotDumpable,
    )?)
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    /// A child (this test binary, re-entered by an environment variable) drops everything and
    /// prints its status lines; the parent judges them.
    #[test]
    fn a_dropped_thread_holds_no_capability_and_no_new_privs() {
        if std::env::var_os("H5I_SYS_CAPS_CHILD").is_some() {
            super::drop_all().unwrap();
            // Capabilities and no_new_privs are per thread: libtest runs this one in a thread of
            // its own.
            let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
            for l in status.lines() {
                if l.starts_with("Cap") || l.starts_with("NoNewPrivs") {
                    println!("{l}");
                }
            }
            println!(
                "dumpable={}",
                rustix::process::dumpable_behavior().unwrap() as i32
            );
            return;
        }
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "caps::tests::a_dropped_thread_holds_no_capability_and_no_new_privs",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("H5I_SYS_CAPS_CHILD", "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        for want in [
            "CapInh:\t0000000000000000",
            "CapPrm:\t0000000000000000",
            "CapEff:\t0000000000000000",
            "NoNewPrivs:\t1",
            "dumpable=0",
        ] {
            assert!(text.contains(want), "missing {want:?} in {text}");
        }
    }
}
