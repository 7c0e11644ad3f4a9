//! Whether the QEMU backend runs its guest on KVM or in software emulation (TCG), decided from
//! what the host's `/dev/kvm` is rather than from its presence.
//!
//! Owns the decision and the sentence `probe` and `status` print for it. KVM is used only when
//! `/dev/kvm` opens for this caller, the CPU offers hardware virtualization (`vmx`/`svm`), and
//! the KVM module is not PVM's (`kvm_pvm`, which runs only PVM-enabled guest kernels: a stock
//! Debian kernel hangs or dies under it). Everything else runs emulated, and says so.
//!
//! Must never: call an emulated guest hardware-accelerated.

/// The QEMU system emulator the backend runs.
pub const QEMU: &str = "qemu-system-x86_64";

/// How the guest's CPU runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualization through `/dev/kvm`.
    Kvm,
    /// QEMU's software emulation.
    Tcg,
}

impl Accel {
    /// The name `state.json` and `status` use.
    pub fn name(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }

    /// QEMU's `-accel` value.
    pub fn qemu_arg(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg,thread=multi",
        }
    }

    /// QEMU's `-cpu` value.
    pub fn cpu(self) -> &'static str {
        match self {
            Accel::Kvm => "host",
            Accel::Tcg => "max",
        }
    }
}

/// The host facts the decision reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvmFacts {
    /// Whether `/dev/kvm` opened read-write for this caller (or why not).
    pub openable: Result<(), String>,
    /// Whether `/proc/cpuinfo` lists `vmx` or `svm`.
    pub hw_virt: bool,
    /// Whether the loaded KVM module is PVM's.
    pub pvm: bool,
}

/// Whether `/dev/kvm` opens read-write for this caller (or why not).
pub fn kvm_openable() -> Result<(), String> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Read the facts from this host.
pub fn kvm_facts() -> KvmFacts {
    let openable = kvm_openable();
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let hw_virt = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    KvmFacts {
        openable,
        hw_virt,
        pvm: std::path::Path::new("/sys/module/kvm_pvm").exists(),
    }
}

/// The accelerator for `f`, and the plain sentence saying which and why.
pub fn choose(f: &KvmFacts) -> (Accel, String) {
    let emulated = |why: String| {
        (
            Accel::Tcg,
            format!("software-emulated (TCG): {why}; a guest runs several times slower than on KVM, with the same hypervisor boundary"),
        )
    };
    match (&f.openable, f.hw_virt, f.pvm) {
        (Err(e), _, _) => emulated(format!("/dev/kvm cannot be opened ({e})")),
        (Ok(()), _, true) => emulated(
            "/dev/kvm is PVM's (kvm_pvm), which runs only PVM guest kernels, not a stock one"
                .into(),
        ),
        (Ok(()), false, false) => {
            emulated("the CPU offers no hardware virtualization (no vmx/svm flag)".into())
        }
        (Ok(()), true, false) => (Accel::Kvm, "KVM (hardware-accelerated)".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_stock_kvm_with_hardware_virtualization_is_called_accelerated() {
        let kvm = KvmFacts {
            openable: Ok(()),
            hw_virt: true,
            pvm: false,
        };
        assert_eq!(choose(&kvm).0, Accel::Kvm);
        for f in [
            KvmFacts {
                pvm: true,
                ..kvm.clone()
            },
            KvmFacts {
                hw_virt: false,
                ..kvm.clone()
            },
            KvmFacts {
                openable: Err("EACCES".into()),
                ..kvm.clone()
            },
        ] {
            let (a, said) = choose(&f);
            assert_eq!(a, Accel::Tcg);
            assert!(said.starts_with("software-emulated"), "{said}");
        }
    }
}
