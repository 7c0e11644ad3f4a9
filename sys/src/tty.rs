//! The controlling terminal's foreground process group, on standard input: who has it, and
//! handing it to a child's group and back (what a shell does for the program it runs).
//!
//! Must never: stop the caller (a background caller is sent `SIGTTOU` by `tcsetpgrp`; it is
//! ignored around the call and its disposition restored), or act on a descriptor other than 0.

/// The foreground group of the terminal on standard input when it is this process's own group
/// (so handing it away is this process's to do); `None` when stdin is not a terminal or the
/// terminal's foreground is someone else's.
pub fn foreground_is_ours() -> Option<i32> {
    let stdin = rustix::stdio::stdin();
    if !rustix::termios::isatty(stdin) {
        return None;
    }
    let fg = rustix::termios::tcgetpgrp(stdin).ok()?;
    (fg == rustix::process::getpgrp()).then(|| fg.as_raw_nonzero().get())
}

/// Make `pgid` the foreground group of the terminal on standard input, best effort (a
/// terminal that is gone, or a group that is, changes nothing).
pub fn set_foreground(pgid: i32) {
    // SAFETY: SIGTTOU is ignored around tcsetpgrp so a background caller is not stopped by it,
    // and its previous disposition restored; only fd 0 and that disposition are touched.
    unsafe {
        let old = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
        libc::tcsetpgrp(0, pgid);
        libc::signal(libc::SIGTTOU, old);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// A child whose stdin is no terminal has no foreground to hand, and setting one there is a
    /// no-op that does not stop it.
    #[test]
    fn without_a_terminal_there_is_no_foreground_and_setting_one_changes_nothing() {
        if std::env::var_os("H5I_SYS_TTY_CHILD").is_some() {
            assert_eq!(foreground_is_ours(), None);
            set_foreground(rustix::process::getpgrp().as_raw_nonzero().get());
            println!("unchanged");
            return;
        }
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "tty::tests::without_a_terminal_there_is_no_foreground_and_setting_one_changes_nothing",
                "--nocapture",
            ])
            .env("H5I_SYS_TTY_CHILD", "1")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success());
        assert!(String::from_utf8_lossy(&out.stdout).contains("unchanged"));
    }
}
