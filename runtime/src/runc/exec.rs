//! `exec`: run another process inside a running container (Podman: `exec --pid-file P
//! --process F --detach ID`; by hand: `exec ID CMD...`). The process gets the same
//! `H5iExecutor`, so the container's `h5i.*` annotations confine it as they confine init.
//!
//! A container with the socket gate (`h5i.net.gate = on`): libcontainer gives an exec'd
//! process no `linux.seccomp`, so this verb connects to the spec's `listenerPath` here, on the
//! host side, and hands the executor that socket; the executor installs the notify rule in the
//! new process and sends its listener to the gate (see `confine`). No connection, no exec.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::Container;
use libcontainer::oci_spec::runtime::Spec;
use libcontainer::syscall::syscall::SyscallType;
use serde_json::json;

use super::{foreground, validate_id, Context, RuncError};
use crate::confine::executor::H5iExecutor;
use crate::confine::{GateHandoff, ANNOTATION_NET_GATE};

/// Exec into container `args.container_id`; returns the process's exit code (0 if detached).
pub fn exec(ctx: &Context, args: liboci_cli::Exec) -> Result<i32, RuncError> {
    let id = args.container_id.clone();
    validate_id(&id)?;
    // Same wording as the other verbs when the container is missing.
    let container = ctx.load(&id)?;
    // Held until the build returns: the exec'd process has its own copy by then.
    let gate = connect_gate(&container)?;
    let executor = H5iExecutor {
        gate_handoff: gate.as_ref().map(|(socket, message)| GateHandoff {
            socket: socket.as_raw_fd(),
            message: message.clone(),
        }),
        stdio: crate::stdio::StdioSnapshot::take(),
    };
    let user = args.user.map(|(u, _)| u);
    let group = args.user.and_then(|(_, g)| g);
    let pid = ContainerBuilder::new(id.clone(), SyscallType::default())
        .with_executor(executor)
        .with_root_path(&ctx.root)
        .map(|b| b.with_console_socket(args.console_socket.as_ref()))
        .and_then(|b| b.with_pid_file(args.pid_file.as_ref()))
        .map(|b| b.with_preserved_fds(args.preserve_fds))
        .and_then(|b| b.validate_id())
        .and_then(|b| {
            b.as_tenant()
                .with_detach(args.detach)
                .with_cwd(args.cwd.as_ref())
                .with_env(args.env.into_iter().collect())
                .with_process(args.process.as_ref())
                .with_no_new_privs(args.no_new_privs)
                .with_container_args(args.command)
                .with_additional_gids(args.additional_gids)
                .with_user(user)
                .with_group(group)
                .with_capabilities(args.cap)
                .with_ignore_paused(args.ignore_paused)
                .with_sub_cgroup(args.cgroup)
                .with_apparmor(args.apparmor)
                .build()
        })
        .map_err(RuncError::container(&id))?;
    drop(gate);
    if args.detach {
        return Ok(0);
    }
    foreground::block_signals()
        .and_then(|()| foreground::wait_forwarding(pid.as_raw()))
        .map_err(|source| RuncError::Wait { id, source })
}

/// For a gated container: a close-on-exec connection to the gate's listener and the
/// `ContainerProcessState` to send with the exec'd process's listener. `None` otherwise.
fn connect_gate(container: &Container) -> Result<Option<(OwnedFd, Vec<u8>)>, RuncError> {
    let config = super::spec_path(container);
    let spec = Spec::load(&config).map_err(|source| RuncError::Spec {
        path: config.clone(),
        source,
    })?;
    let gated = spec
        .annotations()
        .as_ref()
        .is_some_and(|a| a.contains_key(ANNOTATION_NET_GATE));
    if !gated {
        return Ok(None);
    }
    let listener = spec
        .linux()
        .as_ref()
        .and_then(|l| l.seccomp().as_ref())
        .filter(|s| crate::socket_gate::routes_sockets_to_listener(s))
        .and_then(|s| s.listener_path().clone())
        .ok_or(RuncError::GateExec {
            id: container.id().to_string(),
            reason: "the container's spec does not route socket calls to a listener".into(),
        })?;
    let socket = UnixStream::connect(&listener).map_err(|e| RuncError::GateExec {
        id: container.id().to_string(),
        reason: format!(
            "cannot reach the socket gate at {}: {e}",
            listener.display()
        ),
    })?;
    let message = json!({
        "ociVersion": "1.0.2",
        "fds": ["seccompFd"],
        "pid": container.pid().map_or(0, |p| p.as_raw()),
        "metadata": "",
        "state": {
            "ociVersion": "1.0.2",
            "id": container.id(),
            "status": "running",
            "pid": container.pid().map_or(0, |p| p.as_raw()),
            "bundle": container.bundle(),
            "annotations": spec.annotations().clone().unwrap_or_default(),
        },
    });
    Ok(Some((
        OwnedFd::from(socket),
        message.to_string().into_bytes(),
    )))
}
