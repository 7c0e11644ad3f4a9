//! `create`: set a container up from a bundle and leave it waiting for `start`.
//!
//! Steps, in order: validate the id, make the state directory, copy the spec as handed where
//! `h5i.evidence.spec` asks (`spec_copy`), give a supervised-network spec its private directory
//! when it names none (`net_dir::ensure`), merge the socket gate into it (`gate`: rewrites the
//! bundle's `config.json`), place the cgroup when the spec has none (`sidecar::prepare`), then
//! libcontainer's init builder with `H5iExecutor` (whose
//! `validate` refuses bad `h5i.*` annotations here, before `start`; the spec comes from the
//! shadow when there is one, the bundle reported to hooks and `state` stays the caller's),
//! then hold what libcontainer leaves undone: `disableOOMKiller` on cgroup v1 (`cgroup`; a
//! read-only cgroup mount is held by the vendored libcontainer's init). On failure the
//! container, the sidecar and a
//! network directory `net_dir` assigned are removed again. Also the first half of `run`.

use std::path::{Path, PathBuf};

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::Container;
use libcontainer::oci_spec::runtime::Spec;
use libcontainer::syscall::syscall::SyscallType;

use super::{
    cgroup, gate, idmap, net_dir, sidecar, spec_copy, stage, validate_id, Context, RuncError,
};
use crate::confine::executor::H5iExecutor;

/// What `create` (and `run`) take.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    /// Container id.
    pub id: String,
    /// Bundle directory (holds config.json).
    pub bundle: PathBuf,
    /// Write the init pid here.
    pub pid_file: Option<PathBuf>,
    /// Send the pty master here (OCI console-socket protocol).
    pub console_socket: Option<PathBuf>,
    /// Extra fds (after stdio) passed into the container.
    pub preserve_fds: i32,
    /// Use MS_MOVE + chroot instead of pivot_root.
    pub no_pivot: bool,
    /// Whether the caller stays attached (`run` without `-d`).
    pub detach: bool,
}

/// Create the container; it is left in state `created`.
pub fn create(ctx: &Context, opts: &CreateOptions) -> Result<Container, RuncError> {
    validate_id(&opts.id)?;
    ctx.ensure_root()?;
    if ctx.root.join(&opts.id).exists() {
        return Err(RuncError::Container {
            id: opts.id.clone(),
            source: libcontainer::error::LibcontainerError::Exist,
        });
    }
    let bundle = std::fs::canonicalize(&opts.bundle)
        .map_err(RuncError::io("cannot open bundle", &opts.bundle))?;
    spec_copy::copy_if_asked(&bundle)?;
    let net_dir = net_dir::ensure(&bundle, &opts.id)?;
    let built = gate::inject_into_bundle(&bundle)
        .map_err(RuncError::from)
        .and_then(|()| create_prepared(ctx, opts, &bundle));
    if let (Err(_), Some(dir)) = (&built, &net_dir) {
        // The run never reaches its poststop hooks (Podman runs none after a failed create).
        net_dir::remove_assigned(dir);
    }
    built
}

/// The steps after the bundle's spec is final: sidecar, libcontainer, read-only cgroup.
fn create_prepared(
    ctx: &Context,
    opts: &CreateOptions,
    bundle: &Path,
) -> Result<Container, RuncError> {
    let prepared = sidecar::prepare(&ctx.root, &opts.id, bundle)?;
    let config = prepared.bundle.join("config.json");
    let built = stage_sources(ctx, &opts.id, bundle, &config, prepared.shadowed)
        .and_then(|shadow| use_idmap_helpers(ctx, &opts.id, &prepared.bundle).map(|()| shadow))
        .and_then(|shadow| build(ctx, opts, bundle, shadow))
        .and_then(|mut container| match hold_spec(&config, &container) {
            Ok(()) => Ok(container),
            Err(e) => {
                let _ = container.delete(true);
                Err(e)
            }
        });
    if built.is_err() {
        sidecar::cleanup(&ctx.root, &opts.id);
    }
    built
}

/// When the container's root is not host root (a user namespace, run by real root), reach its
/// mount sources from here and name them by staged paths (see `stage`). Returns the spec file
/// libcontainer should read in place of `<bundle>/config.json`, if any: the staged spec, else
/// `config` when `prepare` shadowed it. Relative paths resolve against the caller's `bundle`.
fn stage_sources(
    ctx: &Context,
    id: &str,
    bundle: &Path,
    config: &Path,
    shadowed: bool,
) -> Result<Option<PathBuf>, RuncError> {
    let mut spec = Spec::load(config).map_err(|source| RuncError::Spec {
        path: config.to_path_buf(),
        source,
    })?;
    if !stage::needed(&spec, super::is_real_root()) {
        return Ok(shadowed.then(|| config.to_path_buf()));
    }
    let entries = stage::plan(&mut spec, bundle, |p| p.exists());
    let staged = sidecar::write_staged(&ctx.root, id, &spec)?;
    stage::enter(&entries, stage::id_map(&spec).as_ref())?;
    Ok(Some(staged))
}

/// Put h5i-runc's own id-map helpers first on `PATH` when the spec needs them (see `idmap`).
/// They live in the container's sidecar directory, removed with it.
fn use_idmap_helpers(ctx: &Context, id: &str, bundle: &Path) -> Result<(), RuncError> {
    let config = bundle.join("config.json");
    let spec = Spec::load(&config).map_err(|source| RuncError::Spec {
        path: config,
        source,
    })?;
    let euid = h5i_sys::ids::euid();
    if !idmap::needs_helpers(&spec, super::in_user_namespace(), euid) {
        return Ok(());
    }
    let path = idmap::install(&sidecar::dir(&ctx.root, id).join("idmap"))?;
    // h5i-runc is single-threaded here: nothing else reads the environment concurrently.
    std::env::set_var("PATH", path);
    Ok(())
}

/// What the spec asks that libcontainer 0.7 leaves undone: on cgroup v1, `disableOOMKiller`
/// (`cgroup::disable_oom_killer`).
fn hold_spec(config: &Path, container: &Container) -> Result<(), RuncError> {
    let spec = Spec::load(config).map_err(|source| RuncError::Spec {
        path: config.to_path_buf(),
        source,
    })?;
    let oom_killer_off = spec
        .linux()
        .as_ref()
        .and_then(|l| l.resources().as_ref())
        .and_then(|r| r.memory().as_ref())
        .and_then(|m| m.disable_oom_killer())
        .unwrap_or(false);
    if oom_killer_off {
        let cgroup_path = container
            .spec()
            .map_err(RuncError::container(container.id()))?;
        cgroup::disable_oom_killer(&cgroup_path.cgroup_path)?;
    }
    Ok(())
}

/// libcontainer's init builder for `bundle`, reading the spec from `shadow` when h5i-runc
/// adjusted it (the state, and so every hook, still names the caller's bundle).
fn build(
    ctx: &Context,
    opts: &CreateOptions,
    bundle: &Path,
    shadow: Option<PathBuf>,
) -> Result<Container, RuncError> {
    let err = RuncError::container(&opts.id);
    ContainerBuilder::new(opts.id.clone(), SyscallType::default())
        // The caller's stdio is recorded here, before libcontainer forks the init.
        .with_executor(H5iExecutor {
            stdio: crate::stdio::StdioSnapshot::take(),
            ..H5iExecutor::default()
        })
        .with_root_path(&ctx.root)
        .and_then(|b| b.with_pid_file(opts.pid_file.as_ref()))
        .map(|b| b.with_console_socket(opts.console_socket.as_ref()))
        .map(|b| b.with_preserved_fds(opts.preserve_fds))
        .and_then(|b| b.validate_id())
        .and_then(|b| {
            let init = b.as_init(bundle);
            let init = match shadow {
                Some(config) => init.with_config(config),
                None => init,
            };
            init.with_systemd(false)
                // libcontainer 0.7 accepts a console socket only when "detached", a flag it
                // uses for nothing else; an attached `run --console-socket` (runc allows it,
                // `box shell` uses it) is otherwise refused.
                .with_detach(opts.detach || opts.console_socket.is_some())
                .with_no_pivot(opts.no_pivot)
                .build()
        })
        .map_err(err)
}
