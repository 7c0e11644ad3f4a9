//! `exec`: run another process inside a running container (Podman: `exec --pid-file P
//! --process F --detach ID`; by hand: `exec ID CMD...`). The process gets the same
//! `H5iExecutor`, so the container's `h5i.*` annotations confine it as they confine init.

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::syscall::syscall::SyscallType;
use nix::unistd::Pid;

use super::{foreground, validate_id, Context, RuncError};
use crate::confine::executor::H5iExecutor;

/// Exec into container `args.container_id`; returns the process's exit code (0 if detached).
pub fn exec(ctx: &Context, args: liboci_cli::Exec) -> Result<i32, RuncError> {
    let id = args.container_id.clone();
    validate_id(&id)?;
    // Same wording as the other verbs when the container is missing.
    ctx.load(&id)?;
    let user = args.user.map(|(u, _)| u);
    let group = args.user.and_then(|(_, g)| g);
    let pid: Pid = ContainerBuilder::new(id.clone(), SyscallType::default())
        .with_executor(H5iExecutor)
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
    if args.detach {
        return Ok(0);
    }
    foreground::block_signals()
        .and_then(|()| foreground::wait_forwarding(pid))
        .map_err(|source| RuncError::Wait { id, source })
}
