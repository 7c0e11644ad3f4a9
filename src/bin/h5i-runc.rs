//! `h5i-runc`: the OCI runtime CLI. Thin: parse, re-exec sealed, set up logging, call the
//! matching `h5i_runtime::runc` verb, print, exit. Exit codes: a verb's failure is 1; `run` and
//! `exec` pass the payload's status through (128 + signal when it was killed).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, Result};
use clap::{Args, Parser, Subcommand};
use h5i_runtime::runc::{self, create::CreateOptions, logging, seal, Context};

const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "\nspec: 1.1.0\nlibcontainer: 0.7\nh5i annotations: h5i.landlock, h5i.seccomp=h5i-v1, h5i.net.unix, h5i.evidence.spec"
);

#[derive(Parser, Debug)]
#[command(name = "h5i-runc", version, long_version = LONG_VERSION, about = "h5i's OCI runtime: libcontainer + Landlock + h5i seccomp")]
struct Cli {
    #[command(flatten)]
    global: liboci_cli::GlobalOpts,
    /// Accepted for runc compatibility; rootless mode is detected, not configured.
    #[arg(long, hide = true)]
    rootless: Option<String>,
    /// Accepted for runc compatibility; use --debug.
    #[arg(long, hide = true)]
    log_level: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

/// `kill ID [SIGNAL]` (SIGTERM by default, as runc).
#[derive(Args, Debug)]
struct KillArgs {
    /// Container id.
    container_id: String,
    /// Signal name or number.
    #[arg(default_value = "SIGTERM")]
    signal: String,
    /// Signal every process in the container's cgroup.
    #[arg(short, long)]
    all: bool,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Create a container from a bundle; it waits for `start`.
    Create(liboci_cli::Create),
    /// Start a created container.
    Start(liboci_cli::Start),
    /// Print a container's state as JSON.
    State(liboci_cli::State),
    /// Send a signal to a container.
    Kill(KillArgs),
    /// Delete a container.
    Delete(liboci_cli::Delete),
    /// Run a process inside a running container.
    Exec(liboci_cli::Exec),
    /// Create and start a container; wait for it unless --detach.
    Run(liboci_cli::Run),
    /// List a container's processes.
    Ps(liboci_cli::Ps),
    /// Freeze a container.
    Pause(liboci_cli::Pause),
    /// Thaw a container.
    Resume(liboci_cli::Resume),
    /// Print the runtime's features as JSON.
    Features(liboci_cli::Features),
}

/// Records which standard descriptors were closed at exec, before Rust's runtime puts
/// `/dev/null` on them, so a box's command gets them closed too (see h5i_runtime::stdio).
#[used]
#[link_section = ".init_array"]
static RECORD_CLOSED_STDIO: extern "C" fn() = h5i_runtime::stdio::record_closed_at_start;

fn main() -> ExitCode {
    // Called as `newuidmap`/`newgidmap` by libcontainer (see runc::idmap): write the map.
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(kind) = argv.first().and_then(|a| runc::idmap::helper_called(a)) {
        return match runc::idmap::run_helper(kind, &argv[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{}", logging::error_line(&e.to_string()));
                ExitCode::from(1)
            }
        };
    }
    // `h5i-runc box-init --idle-secs N`: the box sandbox's init (see h5i_runtime::sandbox),
    // started as a box's payload, already confined; it touches no container, so no seal.
    if argv.get(1).and_then(|a| a.to_str()) == Some(h5i_runtime::sandbox::INIT_VERB) {
        return box_init(&argv[2..]);
    }
    let cli = Cli::parse();
    if !matches!(cli.cmd, Cmd::Features(_)) {
        // Before any container is touched (see runc::seal).
        if let Err(e) = seal::ensure_sealed() {
            eprintln!("{}", logging::error_line(&e.to_string()));
            return ExitCode::from(1);
        }
    }
    let log_to_file = cli.global.log.is_some();
    match dispatch(cli) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            h5i_log::refused(e.as_ref());
            let msg = runc::error_chain(e.as_ref());
            if log_to_file {
                tracing::error!("{msg}");
            }
            // runc's stderr line (`level=error`: the word tools scanning a runtime's stderr
            // look for); the message keeps runc's "does not exist" wording.
            eprintln!("{}", logging::error_line(&msg));
            ExitCode::from(1)
        }
    }
}

fn dispatch(cli: Cli) -> Result<i32> {
    let format =
        logging::LogFormat::parse(cli.global.log_format.as_deref()).map_err(anyhow::Error::msg)?;
    // The spec's relay annotations: from the bundle for the verbs handed one, else from the
    // spec the container was created from.
    let saved = |id: &str| {
        Context::new(cli.global.root.clone(), cli.global.systemd_cgroup)
            .ok()
            .and_then(|ctx| logging::relay_of_saved(&ctx, id))
    };
    let relay = match &cli.cmd {
        Cmd::Create(a) => logging::relay_of(&a.bundle),
        Cmd::Run(a) => logging::relay_of(&a.bundle),
        Cmd::Start(a) => saved(&a.container_id),
        Cmd::Kill(a) => saved(&a.container_id),
        Cmd::Delete(a) => saved(&a.container_id),
        Cmd::State(a) => saved(&a.container_id),
        _ => None,
    };
    logging::init(cli.global.log.as_ref(), format, cli.global.debug, relay)?;
    if let Cmd::Features(_) = cli.cmd {
        println!("{:#}", runc::features::features());
        return Ok(0);
    }
    let ctx = Context::new(cli.global.root.clone(), cli.global.systemd_cgroup)?;
    match cli.cmd {
        Cmd::Create(a) => {
            let opts = create_options(
                a.container_id,
                a.bundle,
                a.pid_file,
                a.console_socket,
                a.preserve_fds,
                a.no_pivot,
                true,
            );
            runc::create::create(&ctx, &opts)?;
        }
        Cmd::Start(a) => {
            runc::start::start(&ctx, &a.container_id)?;
            done("start", &a.container_id);
        }
        Cmd::State(a) => {
            let report = runc::state::state(&ctx, &a.container_id)?;
            println!(
                "{}",
                serde_json::to_string_pretty(&report).context("encoding state")?
            );
        }
        Cmd::Kill(a) => {
            runc::kill::kill(&ctx, &a.container_id, &a.signal, a.all)?;
            done("kill", &a.container_id);
        }
        Cmd::Delete(a) => {
            runc::delete::delete(&ctx, &a.container_id, a.force)?;
            done("delete", &a.container_id);
        }
        Cmd::Exec(a) => return Ok(runc::exec::exec(&ctx, a)?),
        Cmd::Run(a) => {
            let opts = create_options(
                a.container_id,
                a.bundle,
                a.pid_file,
                a.console_socket,
                a.preserve_fds,
                a.no_pivot,
                a.detach,
            );
            return Ok(runc::run::run(&ctx, &opts, a.keep)?);
        }
        Cmd::Ps(a) => {
            let pids = runc::ps::pids(&ctx, &a.container_id)?;
            print!("{}", runc::ps::render(&pids, &a.format)?);
        }
        Cmd::Pause(a) => runc::pause::pause(&ctx, &a.container_id)?,
        Cmd::Resume(a) => runc::resume::resume(&ctx, &a.container_id)?,
        Cmd::Features(_) => {}
    }
    Ok(0)
}

/// The debug event for a verb that changed container `id` (target `h5i::runc`): with the
/// spawn and refusal events, what Podman asked of the runtime and in which order.
fn done(verb: &'static str, id: &str) {
    tracing::debug!(target: "h5i::runc", verb, id, "done");
}

fn create_options(
    id: String,
    bundle: PathBuf,
    pid_file: Option<PathBuf>,
    console_socket: Option<PathBuf>,
    preserve_fds: i32,
    no_pivot: bool,
    detach: bool,
) -> CreateOptions {
    CreateOptions {
        id,
        bundle,
        pid_file,
        console_socket,
        preserve_fds,
        no_pivot,
        detach,
    }
}

fn box_init(args: &[std::ffi::OsString]) -> ExitCode {
    let idle = match args {
        [flag, secs] if flag == "--idle-secs" => secs.to_str().and_then(|s| s.parse::<u64>().ok()),
        _ => None,
    };
    let Some(idle) = idle else {
        eprintln!(
            "{}",
            logging::error_line(
                "refusing: box-init takes --idle-secs N; to fix: start it only through h5i"
            )
        );
        return ExitCode::from(2);
    };
    match h5i_runtime::sandbox::init::serve(std::time::Duration::from_secs(idle)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}", logging::error_line(&e.to_string()));
            ExitCode::from(1)
        }
    }
}
