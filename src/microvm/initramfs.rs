//! The guest's initramfs: h5i's static guest agent as `/init` and the kernel modules it loads,
//! as an uncompressed `newc` cpio archive (the kernel unpacks it without a decompressor).
//!
//! Owns the archive's layout (`/init`, `/h5i/modules/*.ko`, `/h5i/modules.order`, and the
//! mount points the agent uses before its root exists). Must never: put anything of the box's
//! or the host's in it beyond those files (it is the guest's whole early userspace).

use std::path::{Path, PathBuf};

/// One `newc` archive being written.
struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.ino += 1;
        let fields = [
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len() as u32,
            0,
            0,
            0,
            0,
            name.len() as u32 + 1,
            0,
        ];
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        self.out
    }
}

const DIR: u32 = 0o040_755;
const FILE: u32 = 0o100_644;
const EXEC: u32 = 0o100_755;

/// The archive for `agent` (a static binary) and `modules` (in load order).
pub fn build(agent: &Path, modules: &[PathBuf]) -> Result<Vec<u8>, String> {
    let read = |p: &Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
    let mut a = Cpio {
        out: Vec::new(),
        ino: 0,
    };
    for d in ["dev", "proc", "sys", "h5i", "h5i/modules"] {
        a.entry(d, DIR, &[]);
    }
    a.entry("init", EXEC, &read(agent)?);
    let mut order = String::new();
    for m in modules {
        let name = m
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| format!("{}: not a module file name", m.display()))?;
        a.entry(&format!("h5i/modules/{name}"), FILE, &read(m)?);
        order.push_str(name);
        order.push('\n');
    }
    a.entry("h5i/modules.order", FILE, order.as_bytes());
    Ok(a.finish())
}

/// Whether the ELF file at `path` is statically linked (no `PT_INTERP` program header): the
/// guest has no loader or libraries for it.
pub fn is_static_elf(path: &Path) -> bool {
    let Ok(b) = std::fs::read(path) else {
        return false;
    };
    if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 || b[5] != 1 {
        return false;
    }
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as usize;
    let u64_at = |o: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[o..o + 8]);
        u64::from_le_bytes(a) as usize
    };
    let (phoff, phentsize, phnum) = (u64_at(32), u16_at(54), u16_at(56));
    const PT_INTERP: u32 = 3;
    (0..phnum).all(|i| {
        let o = phoff + i * phentsize;
        o + 4 <= b.len() && u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]) != PT_INTERP
    }) && phnum > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_archive_is_newc_with_the_agent_as_init_and_a_trailer() {
        let dir = tempfile::tempdir().unwrap();
        let agent = dir.path().join("agent");
        std::fs::write(&agent, b"AGENT").unwrap();
        let m = dir.path().join("virtio.ko");
        std::fs::write(&m, b"MOD").unwrap();
        let a = build(&agent, &[m]).unwrap();
        assert!(a.starts_with(b"070701"));
        assert_eq!(a.len() % 4, 0);
        let text = String::from_utf8_lossy(&a);
        assert!(text.contains("init\0") && text.contains("AGENT"));
        assert!(text.contains("h5i/modules.order") && text.contains("virtio.ko\n"));
        assert!(text.ends_with("TRAILER!!!\0\0\0\0") || text.contains("TRAILER!!!"));
    }

    #[test]
    fn a_dynamic_binary_is_not_taken_for_a_static_one() {
        assert!(
            !is_static_elf(Path::new("/bin/sh")),
            "Debian's sh is dynamic"
        );
        assert!(is_static_elf(Path::new("/bin/busybox")), "busybox-static");
    }
}
