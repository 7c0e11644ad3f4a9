//! `h5i-hook HOOK`: an OCI hook. Reads the container state on stdin; exits non-zero (and the
//! runtime fails the container) when the hook cannot do its job.

use std::io::Read;

const USAGE: &str = "usage: h5i-hook loopback [--inside [--deny-counted [--send SOCKET]]]   (an OCI createRuntime hook, or with --inside a createContainer hook; the state comes on stdin; --deny-counted: the process tier's deny-all table, counting each refused dial, its counter socket sent to h5i at SOCKET)\n       h5i-hook listen --inside --port PORT --send SOCKET   (a createContainer hook: listen on the box's 127.0.0.1:PORT, send the fd to h5i at SOCKET)\n       h5i-hook net-up [--attach] | net-inside | net-down   (the supervised network: createRuntime, createContainer, poststop hooks; --attach does net-inside's work from the host, as root)\n       h5i-hook sentry   (started by net-up; not for direct use)\n       h5i-hook capture claude-code|codex   (inside a box: an agent's tool hook; stages its stdin in $H5I_ENV_CAPTURE_SPOOL, always exits 0)\n       h5i-hook claude-state -- COMMAND [ARGS]   (inside a Claude Code box: make ~/.claude.json ready for the run, then exec COMMAND)\n       bash ARGS   (h5i-hook bound over a Codex box's bash: the tee shim, which records each `-c` command)";

fn main() {
    // Bound over a Codex box's bash, h5i-hook is the tee shim (h5i_hook::tee_shim).
    let mut args = std::env::args_os();
    if let Some(argv0) = args
        .next()
        .filter(|a| h5i_hook::tee_shim::invoked_as_shell(a))
    {
        h5i_hook::tee_shim::main(argv0, args.collect());
    }
    // A runtime runs a hook with only the variables its spec names; at the container tier those
    // name the relay directory too, since the hook's stderr is conmon's there (h5i_log).
    let relay_dir = std::env::var_os(h5i_log::DIR_VAR).map(std::path::PathBuf::from);
    h5i_log::init_relayed("h5i-hook", relay_dir.as_deref());
    let arg = std::env::args().nth(1);
    if matches!(
        arg.as_deref(),
        Some("loopback" | "listen" | "net-up" | "net-inside" | "net-down")
    ) {
        // An OCI hook's own spawn event: the runtime that started it records none.
        let argv: Vec<String> = std::env::args().collect();
        h5i_log::spawned_argv(&argv, Some(std::process::id()), "the OCI runtime (a hook)");
    }
    let result = match arg.as_deref() {
        Some("loopback") => loopback(&std::env::args().skip(2).collect::<Vec<_>>()),
        Some("listen") => listen(&std::env::args().skip(2).collect::<Vec<_>>()),
        Some("net-up") => {
            h5i_hook::net_hooks::net_up(std::env::args().nth(2).as_deref() == Some("--attach"))
                .map_err(Into::into)
        }
        Some("net-inside") => h5i_hook::net_hooks::net_inside().map_err(Into::into),
        Some("net-down") => h5i_hook::net_hooks::net_down().map_err(Into::into),
        Some("sentry") => std::process::exit(h5i_hook::sentry::main()),
        Some("capture") => capture(std::env::args().nth(2).as_deref()),
        Some("claude-state") => claude_state(std::env::args_os().skip(2).collect()),
        _ => {
            eprintln!("h5i-hook: {USAGE}");
            std::process::exit(2);
        }
    };
    if let Err(e) = result {
        h5i_log::refused(e.as_ref());
        eprintln!("h5i-hook: {e}");
        std::process::exit(1);
    }
}

fn loopback(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (inside, deny_counted, send) = match args.as_slice() {
        [] => (false, false, None),
        ["--inside"] => (true, false, None),
        ["--inside", "--deny-counted"] => (true, true, None),
        ["--inside", "--deny-counted", "--send", sock] => {
            (true, true, Some(std::path::Path::new(*sock)))
        }
        _ => return Err(format!("refusing: bad arguments; to fix: {USAGE}").into()),
    };
    let mut buf = Vec::new();
    std::io::stdin().take(1 << 20).read_to_end(&mut buf)?;
    let state = h5i_hook::state::OciState::parse(&buf)?;
    if inside {
        h5i_hook::loopback::bring_up_inside()?;
        if deny_counted {
            h5i_hook::denied_net::set_up_inside(send)?;
        }
    } else {
        h5i_hook::loopback::bring_up(state.runtime_pid()?)?;
    }
    Ok(())
}

fn listen(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let (port, send) = match args {
        [inside, p, port, s, send] if inside == "--inside" && p == "--port" && s == "--send" => {
            (port.parse::<u16>()?, std::path::PathBuf::from(send))
        }
        _ => return Err(format!("refusing: bad arguments; to fix: {USAGE}").into()),
    };
    let mut buf = Vec::new();
    std::io::stdin().take(1 << 20).read_to_end(&mut buf)?;
    h5i_hook::state::OciState::parse(&buf)?;
    h5i_hook::listen::listen_inside(port, &send)?;
    Ok(())
}

/// An agent's tool hook: stage stdin in the box's spool. Never fails the agent's tool call: a
/// record it cannot stage is reported on stderr, and its absence is the host's finding.
fn capture(source: Option<&str>) -> ! {
    let runtime = source.and_then(h5i_hook::capture::runtime_named);
    let staged = match (std::env::var_os("H5I_ENV_CAPTURE_SPOOL"), runtime) {
        (_, None) => Err(format!(
            "refusing: source {source:?} is not claude-code or codex; to fix: name the agent after `capture`"
        )),
        (Some(spool), Some(rt)) => h5i_hook::capture::stage(
            std::path::Path::new(&spool),
            h5i_hook::capture::source_of(rt),
            std::io::stdin().lock(),
        )
        .map(drop)
        .map_err(|e| e.to_string()),
        (None, _) => Err("H5I_ENV_CAPTURE_SPOOL is not set (not inside an h5i box)".into()),
    };
    if let Err(e) = staged {
        eprintln!("h5i-hook capture: not staged: {e}");
    }
    std::process::exit(0)
}

/// Inside a Claude Code box, as its user: make Claude Code's state ready for the run
/// (`h5i_hook::claude_state`), then become the command. Whatever happens to the state file is
/// said on stderr and never keeps the command from running.
fn claude_state(args: Vec<std::ffi::OsString>) -> ! {
    use h5i_hook::claude_state::{config_dir, seed, Seeded, CONFIG_FILE};
    use std::os::unix::process::CommandExt;
    let Some((program, rest)) = args
        .split_first()
        .filter(|(sep, _)| *sep == "--")
        .and_then(|(_, cmd)| cmd.split_first())
    else {
        eprintln!("h5i-hook: refusing: no command after `claude-state --`; to fix: {USAGE}");
        std::process::exit(2);
    };
    let var = |k: &str| std::env::var(k).ok();
    let (dir_var, home, key) = (
        var("CLAUDE_CONFIG_DIR"),
        var("HOME"),
        var("ANTHROPIC_API_KEY"),
    );
    if let Some(dir) = config_dir(dir_var.as_deref(), home.as_deref()) {
        let said = match seed(dir, key.as_deref()) {
            Ok(Seeded::Written | Seeded::Unchanged) => None,
            Ok(Seeded::LeftAlone(why)) => Some(why),
            Err(e) => Some(e.to_string()),
        };
        if let Some(why) = said {
            eprintln!(
                "h5i-hook: left {} as it is ({why}); Claude Code may ask its first-run questions",
                dir.join(CONFIG_FILE).display()
            );
        }
    }
    let err = std::process::Command::new(program).args(rest).exec();
    eprintln!(
        "h5i-hook: cannot run `{}`: {err}",
        program.to_string_lossy()
    );
    std::process::exit(if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    });
}
