//! A stand-in `xdg-open` for `--open` tests: it records what h5i handed it (argv, environment,
//! the modes of the file and its directory, the file's text), so a test can assert the token
//! is in none of the argv or environment, and say when it has run through a FIFO.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Write the stand-in to `dir/xdg-open` (put `dir` first on PATH): it writes `$0 $@` to
/// `argv`, its environment to `env`, the modes of its argument and of that argument's
/// directory to `mode` and `dirmode`, and the file's text to `page`, all in `dir/record/`,
/// then writes the FIFO `record/done`, which [`opened`] waits on. Returns `dir/record`.
pub fn fake_opener(dir: &Path) -> PathBuf {
    let record = dir.join("record");
    std::fs::create_dir(&record).unwrap();
    assert!(Command::new("mkfifo")
        .arg(record.join("done"))
        .status()
        .unwrap()
        .success());
    let opener = dir.join("xdg-open");
    std::fs::write(
        &opener,
        format!(
            "#!/bin/sh\nr={}\nprintf '%s\\n' \"$0\" \"$@\" > $r/argv\nenv > $r/env\n\
             stat -c %a \"$1\" > $r/mode\nstat -c %a \"$(dirname \"$1\")\" > $r/dirmode\n\
             cat \"$1\" > $r/page\necho done > $r/done\n",
            record.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&opener, std::fs::Permissions::from_mode(0o755)).unwrap();
    record
}

/// Wait (bounded: 60 s, the read on a thread of its own) for the stand-in to have run.
pub fn opened(record: &Path) {
    let (tx, rx) = std::sync::mpsc::channel();
    let fifo = record.join("done");
    std::thread::spawn(move || tx.send(std::fs::read_to_string(fifo)));
    rx.recv_timeout(Duration::from_secs(60))
        .expect("xdg-open was not run within 60 s")
        .unwrap();
}

/// PATH with `dir` first.
pub fn path_with(dir: &Path) -> String {
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// What the stand-in recorded under `record` in `file` (`argv`, `env`, `mode`, ...).
pub fn recorded(record: &Path, file: &str) -> String {
    std::fs::read_to_string(record.join(file)).unwrap()
}
