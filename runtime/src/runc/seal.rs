//! Running from a sealed copy of ourselves before touching any container (CVE-2019-5736 class).
//!
//! A process inside a container can reach the runtime's binary through `/proc/<pid>/exe` while
//! the runtime joins the container (`exec`) and overwrite it on the host. So before any verb
//! that touches a container, h5i-runc copies `/proc/self/exe` into a
//! `memfd_create(MFD_CLOEXEC | MFD_ALLOW_SEALING)`, seals it (`F_SEAL_SEAL | F_SEAL_SHRINK |
//! F_SEAL_GROW | F_SEAL_WRITE`) and `fexecve`s it with the same argv and environment. The copy
//! knows it is sealed by asking the kernel for the seals of `/proc/self/exe`; an environment
//! marker only guards against an exec loop if that check ever failed after the re-exec.
//!
//! Cost: one in-kernel copy (`copy_file_range`) and one exec. Only what the kernel's ELF loader
//! reads is copied: the bytes up to the end of the last program-header segment. Debug info and
//! section headers (most of a `debug = 1` build) are left out and the copy's header says it has
//! no sections. A binary that does not parse as ELF64 little-endian is copied whole.
//! Must never: run a container verb from an unsealed binary.

use std::ffi::{CString, OsString};
use std::fs::File;
use std::io;
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::FileExt;

/// Set in the re-exec'd copy's environment; removed again once the seal is verified.
pub const MARKER_ENV: &str = "_H5I_RUNC_SEALED";

/// The seals the copy must carry.
pub const REQUIRED_SEALS: libc::c_int =
    libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;

/// Why the sealed re-exec failed.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// A step of copying, sealing or exec'ing failed.
    #[error("refusing: cannot re-exec from a sealed copy of h5i-runc ({step}): {source}; to fix: the kernel needs memfd_create with sealing (Linux 3.17+) and /proc mounted")]
    Step {
        /// Which step.
        step: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// The re-exec'd copy does not see its own seals.
    #[error("refusing: re-exec'd h5i-runc is not running from a sealed memfd (seals {0:#x}); refusing to touch containers")]
    NotSealed(libc::c_int),
}

fn step(step: &'static str) -> impl FnOnce(io::Error) -> SealError {
    move |source| SealError::Step { step, source }
}

/// The seals on the file behind `/proc/self/exe` (0 for a file that cannot carry seals).
pub fn exe_seals() -> Result<libc::c_int, SealError> {
    let exe = File::open("/proc/self/exe").map_err(step("open /proc/self/exe"))?;
    Ok(seals_of(&exe))
}

fn seals_of(file: &File) -> libc::c_int {
    // EINVAL for a file that does not support sealing: no seals.
    rustix::fs::fcntl_get_seals(file).map_or(0, |s| s.bits() as libc::c_int)
}

/// Return if already running sealed; otherwise re-exec from a sealed copy (does not return on
/// success).
pub fn ensure_sealed() -> Result<(), SealError> {
    let seals = exe_seals()?;
    if seals & REQUIRED_SEALS == REQUIRED_SEALS {
        if std::env::var_os(MARKER_ENV).is_some() {
            // SAFETY (of the env mutation): called at the top of main, before any thread.
            std::env::remove_var(MARKER_ENV);
        }
        return Ok(());
    }
    if std::env::var_os(MARKER_ENV).is_some() {
        return Err(SealError::NotSealed(seals));
    }
    let memfd = sealed_copy()?;
    reexec(&memfd)
}

/// Copy `/proc/self/exe` into a new memfd and seal it.
pub fn sealed_copy() -> Result<File, SealError> {
    let exe = File::open("/proc/self/exe").map_err(step("open /proc/self/exe"))?;
    sealed_copy_of(&exe)
}

/// Copy the ELF image of `exe` into a new memfd and seal it. A launcher (h5i) uses this to
/// start h5i-runc from a sealed copy directly (exec `/proc/self/fd/N`): the copy then finds
/// its seals in place and skips its own re-exec.
pub fn sealed_copy_of(exe: &File) -> Result<File, SealError> {
    let fd = rustix::fs::memfd_create(
        c"h5i-runc",
        rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
    )
    .map_err(|e| step("memfd_create")(e.into()))?;
    let mut memfd = File::from(fd);
    let len = exe.metadata().map_err(step("stat the binary"))?.len();
    let image = elf_image_len(exe, len).unwrap_or(len);
    let copied = io::copy(&mut exe.take(image), &mut memfd).map_err(step("copy binary"))?;
    if copied != image {
        return Err(step("copy binary")(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "short copy",
        )));
    }
    if image < len {
        // The section header table was not copied: say so in the ELF header (e_shoff,
        // e_shnum, e_shstrndx = 0) instead of pointing past the end of the file.
        memfd
            .write_all_at(&0u64.to_le_bytes(), ELF_SHOFF)
            .map_err(step("patch ELF header"))?;
        memfd
            .write_all_at(&[0u8; 4], ELF_SHNUM)
            .map_err(step("patch ELF header"))?;
    }
    retry_while_busy(SEAL_ATTEMPTS, || {
        // On a memfd created with MFD_ALLOW_SEALING.
        let seals = rustix::fs::SealFlags::from_bits_retain(REQUIRED_SEALS as u32);
        Ok(rustix::fs::fcntl_add_seals(&memfd, seals)?)
    })
    .map_err(step("F_ADD_SEALS"))?;
    Ok(memfd)
}

/// How many times F_ADD_SEALS is asked before EBUSY is final.
const SEAL_ATTEMPTS: u32 = 10;

/// Run `add` until it answers anything but EBUSY, at most `attempts` times. F_SEAL_WRITE
/// answers EBUSY when a page of the copy still has a reference the kernel did not expect (a
/// per-CPU LRU batch not yet drained, a page being migrated or collapsed) after waiting about
/// 75 ms for it to go: references that outlast that on a loaded machine are still transient,
/// and a refused F_ADD_SEALS applies no seal, so asking again is safe. Each ask is itself the
/// kernel's bounded wait, so this never spins.
fn retry_while_busy(attempts: u32, mut add: impl FnMut() -> io::Result<()>) -> io::Result<()> {
    let mut tried = 1;
    loop {
        match add() {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tried < attempts => tried += 1,
            done => return done,
        }
    }
}

const ELF_PHOFF: u64 = 0x20;
const ELF_SHOFF: u64 = 0x28;
const ELF_SHNUM: u64 = 0x3c;

/// Length of the prefix of an ELF64 little-endian file that the kernel's loader needs: the end
/// of the furthest program-header segment (and of the header tables themselves). `None` when
/// the file does not look like such an ELF, or a segment runs past `file_len`.
pub fn elf_image_len(file: &File, file_len: u64) -> Option<u64> {
    let mut ehdr = [0u8; 64];
    file.read_exact_at(&mut ehdr, 0).ok()?;
    if &ehdr[..4] != b"\x7fELF" || ehdr[4] != 2 || ehdr[5] != 1 {
        return None;
    }
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let u64_at = |b: &[u8], o: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[o..o + 8]);
        u64::from_le_bytes(a)
    };
    let phoff = u64_at(&ehdr, ELF_PHOFF as usize);
    let phentsize = u64::from(u16_at(&ehdr, 0x36));
    let phnum = u64::from(u16_at(&ehdr, 0x38));
    if phentsize < 56 || phnum == 0 {
        return None;
    }
    let table_len = phentsize.checked_mul(phnum)?;
    let mut phdrs = vec![0u8; usize::try_from(table_len).ok()?];
    file.read_exact_at(&mut phdrs, phoff).ok()?;
    let mut end = phoff.checked_add(table_len)?.max(64);
    for ph in phdrs.chunks_exact(usize::try_from(phentsize).ok()?) {
        let seg_end = u64_at(ph, 8).checked_add(u64_at(ph, 32))?; // p_offset + p_filesz
        end = end.max(seg_end);
    }
    (end <= file_len).then_some(end)
}

fn cstrings(items: impl Iterator<Item = OsString>) -> Result<Vec<CString>, SealError> {
    items
        .map(|s| CString::new(s.into_vec()))
        .collect::<Result<_, _>>()
        .map_err(|e| step("argv/env contains NUL")(io::Error::new(io::ErrorKind::InvalidInput, e)))
}

fn reexec(memfd: &File) -> Result<(), SealError> {
    let argv = cstrings(std::env::args_os())?;
    let mut env: Vec<OsString> = std::env::vars_os()
        .filter(|(k, _)| k != MARKER_ENV)
        .map(|(k, v)| {
            let mut kv = k;
            kv.push("=");
            kv.push(v);
            kv
        })
        .collect();
    env.push(OsString::from(format!("{MARKER_ENV}=1")));
    let envp = cstrings(env.into_iter())?;
    let args = h5i_sys::fork_exec::ExecArgs::new(argv, envp);
    // The copy must see the standard descriptors our caller closed as closed (see
    // crate::stdio): Rust's runtime put /dev/null on them before main.
    crate::stdio::closed_at_start().close_all();
    // memfd is a sealed ELF copy; fexecve only returns on failure.
    Err(step("fexecve")(args.exec_fd(memfd.as_fd())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn sealed_copy_carries_all_seals_and_refuses_writes() {
        let mut copy = sealed_copy().unwrap();
        assert_eq!(seals_of(&copy) & REQUIRED_SEALS, REQUIRED_SEALS);
        let err = copy.write_all(b"overwrite").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EPERM));
        assert!(
            copy.set_len(1).is_err(),
            "shrinking a sealed copy must fail"
        );
    }

    #[test]
    fn a_busy_seal_is_asked_again_a_bounded_number_of_times_and_nothing_else_is() {
        let busy = || io::Error::from_raw_os_error(libc::EBUSY);
        let mut asked = 0;
        retry_while_busy(10, || {
            asked += 1;
            if asked < 3 {
                Err(busy())
            } else {
                Ok(())
            }
        })
        .unwrap();
        assert_eq!(asked, 3);
        let mut asked = 0;
        let err = retry_while_busy(10, || {
            asked += 1;
            Err(busy())
        })
        .unwrap_err();
        assert_eq!((asked, err.raw_os_error()), (10, Some(libc::EBUSY)));
        let mut asked = 0;
        let err = retry_while_busy(10, || {
            asked += 1;
            Err(io::Error::from_raw_os_error(libc::EPERM))
        })
        .unwrap_err();
        assert_eq!((asked, err.raw_os_error()), (1, Some(libc::EPERM)));
    }

    #[test]
    fn image_prefix_covers_every_segment_and_drops_section_headers() {
        let exe = File::open("/proc/self/exe").unwrap();
        let len = exe.metadata().unwrap().len();
        let image = elf_image_len(&exe, len).unwrap();
        assert!(image <= len);
        let copy = sealed_copy().unwrap();
        assert_eq!(copy.metadata().unwrap().len(), image);
        let mut ehdr = [0u8; 64];
        copy.read_exact_at(&mut ehdr, 0).unwrap();
        assert_eq!(&ehdr[..4], b"\x7fELF");
        if image < len {
            assert_eq!(&ehdr[0x28..0x30], &[0u8; 8], "e_shoff cleared");
            assert_eq!(&ehdr[0x3c..0x40], &[0u8; 4], "e_shnum/e_shstrndx cleared");
        }
    }

    #[test]
    fn non_elf_is_copied_whole() {
        let mut f = tempfile_in_tmp();
        f.write_all(b"#!/bin/sh\necho not elf\n").unwrap();
        assert_eq!(elf_image_len(&f, 24), None);
    }

    fn tempfile_in_tmp() -> File {
        let path = std::env::temp_dir().join(format!("h5i-seal-test-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f
    }

    #[test]
    fn a_plain_file_has_no_seals() {
        let f = File::open("/proc/self/exe").unwrap();
        assert_eq!(seals_of(&f), 0);
    }
}
