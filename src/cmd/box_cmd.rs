//! `h5i box ...`: parse, call the library, print.
//!
//! Every line printed here passes through `h5i::escape` (`say!`, `warn!`): names, paths,
//! manifest fields, argv, service output and git's words can all be a box's choice.

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};

use h5i::create::{CreateRequest, SourceRequest};
use h5i::store::BoxStore;
use h5i_policy::receipt::ReceiptLane;
use h5i_policy::ResolveRequest;

/// The longest log line shown as one line; longer lines continue on the next.
const LOG_LINE_MAX: usize = 16 << 10;

/// Print one line to stdout through the one escaper.
macro_rules! say {
    ($($t:tt)*) => {
        super::out::line(&h5i::escape::escape_controls(&format!($($t)*)))
    };
}

/// Print one line to stderr through the one escaper.
macro_rules! warn {
    ($($t:tt)*) => {
        eprintln!("{}", h5i::escape::escape_controls(&format!($($t)*)))
    };
}

/// A refusal of `box run` before the command started (exit 125, so it cannot be mistaken for the
/// command's own exit code).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct RunRefused(#[from] h5i::error::BoxError);

/// `h5i box [SOURCE]` is `h5i box create`; the subcommands do the rest.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BoxArgs {
    #[command(subcommand)]
    verb: Option<BoxVerb>,
    /// Where the code comes from: `.` (this repository at HEAD), a repository URL, or a path
    /// written as one (`./DIR`, `/DIR`, `~/DIR`) for a detached box. A bare word is a verb,
    /// never a source. Shorthand for `h5i box create`.
    // A list, so every word after `h5i box` meets the SOURCE rule (which names the nearest
    // verb for a mistyped one); more than one SOURCE is refused in `dispatch`.
    #[arg(value_parser = super::source_arg::SourceParser, value_name = "SOURCE", num_args = 0..)]
    source: Vec<String>,
    /// Name the new box (default: derived from the source).
    #[arg(long)]
    name: Option<String>,
    #[command(flatten)]
    create: CreateFlags,
}

/// Flags shared by `h5i box [SOURCE]` and `h5i box create`.
#[derive(Debug, Args, Default)]
struct CreateFlags {
    /// Base revision of this repository (default HEAD).
    #[arg(long, value_name = "REV")]
    from: Option<String>,
    /// A pull request: N, #N, or its URL; fetches refs/pull/N/head and pins it. Detached.
    #[arg(long, value_name = "N|URL", conflicts_with_all = ["from", "clone", "new"])]
    pr: Option<String>,
    /// Copy an external repository in. Detached.
    #[arg(long, value_name = "URL", conflicts_with_all = ["from", "new"])]
    clone: Option<String>,
    /// An empty box: a fresh repository with one empty commit. Detached.
    #[arg(long, conflicts_with_all = ["from"])]
    new: bool,
    /// The policy profile (built-in: default, agent, agent-claude, agent-codex, browser).
    #[arg(long, value_name = "P")]
    profile: Option<String>,
    /// Isolation tier: auto, workspace, process, supervised, container, microvm.
    #[arg(long, value_name = "TIER")]
    isolation: Option<String>,
    /// Base image for the container and microvm tiers (pre-pulled; runs never pull).
    #[arg(long, value_name = "IMG")]
    image: Option<String>,
    /// The agent runtime the built-in `agent` profile is scoped to: claude or codex.
    #[arg(long = "agent", value_name = "RUNTIME", env = "H5I_AGENT")]
    h5i_agent: Option<String>,
    /// The tier used when neither --isolation nor the profile names one.
    #[arg(long, value_name = "TIER", env = "H5I_DEFAULT_ISOLATION")]
    default_isolation: Option<String>,
    /// `0` turns the credential proxy off: a credential grant's real credential is then passed
    /// into the box under its `token_var` instead of a per-run dummy.
    #[arg(long, value_name = "0|1", env = "H5I_CREDENTIAL_PROXY")]
    credential_proxy: Option<String>,
}

#[derive(Debug, Subcommand)]
enum BoxVerb {
    /// Create a box.
    Create {
        /// The box's name.
        name: String,
        #[command(flatten)]
        create: CreateFlags,
    },
    /// Every box on this clone.
    Ls {
        /// Print the `h5i.box.ls/1` document (docs/json.md) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// The policy actually enforced, the evidence, and base drift.
    Status {
        /// The box.
        name: String,
        /// Print the `h5i.box.status/1` document (docs/json.md) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// What this box actually got (tier, enforcement, the egress table loaded), as JSON.
    Capabilities {
        /// The box.
        name: String,
        /// Print JSON, the `h5i.box.capabilities/1` document (docs/json.md); the only format.
        #[arg(long)]
        json: bool,
    },
    /// Run one command in the box; its exit code passes through (124: wall clock).
    Run {
        /// The box.
        name: String,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "CMD")]
        argv: Vec<OsString>,
    },
    /// An interactive session in the box on a terminal of its own (default: `bash -l`, else
    /// `sh`); the exit code passes through like `run`'s.
    Shell {
        /// The box.
        name: String,
        /// The command and its arguments, after `--` (default: the box's shell).
        #[arg(last = true, value_name = "CMD")]
        argv: Vec<OsString>,
    },
    /// What changed against the pinned base.
    Diff {
        /// The box.
        name: String,
        /// Only the summary of changed files.
        #[arg(long)]
        stat: bool,
    },
    /// The box's event log and receipts (`inspect --capture N` renders receipt #N).
    Log {
        /// The box.
        name: String,
        /// Only receipts of this lane: host-env-run, viewer, tee-shim, inbox-capture.
        #[arg(long, value_parser = parse_lane)]
        lane: Option<ReceiptLane>,
        /// Only what the host observed itself.
        #[arg(long, conflicts_with = "box_claimed")]
        host_observed: bool,
        /// Only what the box claimed (its shim and staged records).
        #[arg(long)]
        box_claimed: bool,
        /// Only receipts of this kind.
        #[arg(long, value_enum)]
        kind: Option<h5i::inspect::RecordKind>,
        /// Only runs that exited non-zero (a wall-clock kill, an OOM kill, a failure).
        #[arg(long)]
        failed: bool,
        /// Only receipts numbered N and later.
        #[arg(long, value_name = "N")]
        since: Option<u64>,
        /// At most the N newest events and the N newest matching receipts.
        #[arg(long, value_name = "N")]
        last: Option<usize>,
        /// Leave the lifecycle events out (a receipt filter leaves them out too).
        #[arg(long)]
        no_events: bool,
        /// Print the `h5i.box.log/1` document (docs/json.md) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// One receipt rendered: command, lane, exit, resource usage, egress tally, payload.
    Inspect {
        /// The box.
        name: String,
        /// The receipt's number (`h5i box log NAME` lists them).
        #[arg(long, value_name = "ID")]
        capture: u64,
        /// Print the `h5i.box.inspect/1` document (docs/json.md) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Two boxes side by side: what each is, its policy, its diffstat, its evidence.
    Compare {
        /// The first box.
        a: String,
        /// The second box.
        b: String,
        /// Print the `h5i.box.compare/1` document (docs/json.md) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Write patch.diff, report.md and receipt.json for a human to review.
    Export {
        /// The box.
        name: String,
        /// The directory to write (refused if it exists and is not empty, unless --force).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Replace a non-empty --out.
        #[arg(long)]
        force: bool,
        /// Export although a granted secret is not set in this shell, so the patch is not
        /// scanned for it (report.md says so in its first lines).
        #[arg(long)]
        skip_secret_check: bool,
    },
    /// Land a worktree box's changes on its parent branch.
    Apply {
        /// The box.
        name: String,
        /// Land a patch that changes the clone's .h5i/ policy (review report.md first).
        #[arg(long)]
        allow_policy_change: bool,
        /// Apply although a granted secret is not set in this shell, so the tree is not
        /// scanned for it.
        #[arg(long)]
        skip_secret_check: bool,
    },
    /// Re-pin the box onto its parent branch's current tip.
    Rebase {
        /// The box.
        name: String,
    },
    /// Stop the box; manifest and workspace are kept for forensics.
    Abort {
        /// The box.
        name: String,
    },
    /// Remove a box entirely.
    Rm {
        /// The box.
        name: String,
        /// Discard changes that were never exported.
        #[arg(long)]
        force: bool,
    },
    /// Reclaim applied and aborted workspaces.
    Gc,
    /// Write the OCI bundle a process-tier run would use, for inspection or another runtime.
    Bundle {
        /// The box.
        name: String,
        /// The bundle directory to write.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "CMD")]
        argv: Vec<OsString>,
    },
    /// What this host can enforce at all.
    Probe {
        /// Print the `h5i.box.probe/1` document (docs/json.md) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Can the box still enforce its claim? Are its refs intact? (Looks; repairs nothing.)
    Doctor {
        /// The box.
        name: String,
        /// Print the `h5i.box.doctor/1` document (docs/json.md) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// The box's declared long-lived services (`[service.NAME]` in .h5i/env.toml).
    Service {
        #[command(subcommand)]
        verb: ServiceVerb,
    },
    /// The per-box port map: `127.0.0.1:<host port> -> <box port>` for each live service.
    Ports {
        /// The box.
        name: String,
        /// Print the `h5i.box.ports/1` document (docs/json.md) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Warm dependency caches: one per project and ecosystem, keyed by its lockfiles, mounted
    /// read-only into process and supervised boxes, written only by `refresh`.
    Cache {
        #[command(subcommand)]
        verb: super::cache_cmd::CacheVerb,
    },
    /// Watch the box's browser from your own browser, and take control when you want it:
    /// served on 127.0.0.1 only, every request carrying the box's token, input passed only
    /// while you hold the control lock. Serves until interrupted.
    #[cfg(feature = "ui")]
    View {
        /// The box.
        name: String,
        /// The viewer's loopback port (0: any free one).
        #[arg(long, default_value_t = h5i::browser::viewer::DEFAULT_PORT)]
        port: u16,
        /// Also hand the URL to this desktop's browser (xdg-open, given a private file that
        /// leads to it: the token stays out of every command line).
        #[arg(long, conflicts_with = "term")]
        open: bool,
        /// Draw the page in this terminal instead (Kitty graphics; binds nothing): `i` drives,
        /// Ctrl-] hands back, `q` leaves.
        #[arg(long, conflicts_with = "port")]
        term: bool,
    },
    /// Internal: the background supervisor `service start` launches.
    #[command(name = "__service-supervise", hide = true)]
    ServiceSupervise {
        /// The box.
        name: String,
        /// The service.
        service: String,
    },
    /// Internal: the forwarder an unprivileged service supervisor starts (the host listener
    /// and the box's namespaces arrive as descriptors 3, 4 and 5).
    #[command(name = "__service-forward", hide = true)]
    ServiceForward {
        /// The port inside the box.
        port: u16,
    },
    /// Declared secret grants and a dry run of their resolution: fingerprints, never values.
    Secrets {
        /// The box.
        name: String,
        /// Print the `h5i.box.secrets/1` document (docs/json.md) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// The persistent user egress allowlist (~/.config/h5i/allow.txt): list it, or add
    /// HOST[:PORT] (port 443 when absent). Merged into boxes whose profile already sets
    /// net.egress; a deny-all profile is never widened. Refused inside a box.
    Allow {
        /// The destination to add; without it, the entries are listed.
        #[arg(value_name = "HOST[:PORT]")]
        host: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum ServiceVerb {
    /// Start a declared service in the background; returns once it is running.
    Start {
        /// The box.
        name: String,
        /// The service.
        service: String,
    },
    /// Each declared service: alive or dead, its pid, its host port, its last exit.
    Status {
        /// The box.
        name: String,
        /// Print the `h5i.box.service-status/1` document (docs/json.md) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// A service's stdout and stderr, with control characters and escape sequences shown as
    /// text (the box wrote them).
    Logs {
        /// The box.
        name: String,
        /// The service.
        service: String,
        /// Copy the log's bytes as they are, escape sequences included (they reach your
        /// terminal: a box can set its title, write its clipboard, clear it).
        #[arg(long)]
        raw: bool,
    },
    /// Stop a running service; returns once its exit is recorded.
    Stop {
        /// The box.
        name: String,
        /// The service.
        service: String,
    },
}

pub(super) fn store() -> anyhow::Result<BoxStore> {
    let cwd = std::env::current_dir().context("refusing: cannot read the current directory")?;
    Ok(BoxStore::discover(&cwd)?)
}

fn create_request(name: Option<String>, source: SourceRequest, f: CreateFlags) -> CreateRequest {
    CreateRequest {
        name,
        source,
        policy: ResolveRequest {
            profile: f.profile,
            isolation: f.isolation,
            image: f.image,
            // An empty value (flag or variable) is no value, as when only the variables were read.
            h5i_agent: f.h5i_agent.filter(|v| !v.is_empty()),
            default_isolation: f.default_isolation.filter(|v| !v.is_empty()),
            credential_proxy: f.credential_proxy.filter(|v| !v.is_empty()),
        },
    }
}

fn source_of(positional: Option<String>, f: &CreateFlags) -> SourceRequest {
    if let Some(pr) = &f.pr {
        SourceRequest::PullRequest(pr.clone())
    } else if let Some(url) = &f.clone {
        SourceRequest::Clone(url.clone())
    } else if f.new {
        SourceRequest::New
    } else {
        match positional.as_deref() {
            None | Some(".") => SourceRequest::ThisRepo {
                from: f.from.clone(),
            },
            Some(url) => SourceRequest::Clone(url.to_string()),
        }
    }
}

fn do_create(req: CreateRequest) -> anyhow::Result<i32> {
    let store = store()?;
    let sb = h5i::create::create(&store, &req, &h5i::probe::host_tiers())?;
    let m = &sb.manifest;
    say!(
        "created box {} ({}, tier {})",
        m.name,
        m.source.label(),
        m.tier
    );
    say!("  base      {} (pinned as {})", m.base, m.base_ref);
    say!("  policy    {}", m.policy_digest);
    say!("  workspace {}", sb.paths.workspace().display());
    Ok(0)
}

/// Run a `h5i box` command.
pub fn dispatch(args: BoxArgs) -> anyhow::Result<i32> {
    let Some(verb) = args.verb else {
        if args.source.len() > 1 {
            anyhow::bail!(
                "refusing: one SOURCE at a time (got {}); to fix: `h5i box SOURCE`, then `h5i box ls`",
                args.source.join(" ")
            );
        }
        let source = args.source.into_iter().next();
        if source.is_some() && args.create.from.is_some() && source.as_deref() != Some(".") {
            anyhow::bail!("refusing: --from picks a revision of this repository, not of {}; to fix: drop --from, or use `h5i box . --from REV`", source.unwrap_or_default());
        }
        let source = source_of(source, &args.create);
        return do_create(create_request(args.name, source, args.create));
    };
    match verb {
        BoxVerb::Create { name, create } => {
            let source = source_of(None, &create);
            do_create(create_request(Some(name), source, create))
        }
        BoxVerb::Ls { json } => {
            let boxes = store()?.list()?;
            if json {
                return print_json(&h5i::json_doc::BoxList::of(&boxes));
            }
            if boxes.is_empty() {
                say!("no boxes on this clone (create one with `h5i box .`)");
            }
            for sb in boxes {
                let m = &sb.manifest;
                say!(
                    "{:<24} {:<8} {:<10} {:<8} {} {}",
                    m.name,
                    m.state.as_str(),
                    m.tier,
                    m.agent,
                    &m.base[..12.min(m.base.len())],
                    m.source.label()
                );
            }
            Ok(0)
        }
        BoxVerb::Status { name, json } => {
            let store = store()?;
            let report = h5i::status::status(&store, &name)?;
            if json {
                return print_json(&h5i::json_doc::Status::of(&report));
            }
            print_status(&report);
            if report.policy.tier == h5i_policy::Tier::Container {
                let cache_dirs: Vec<String> = h5i::cache::ECOSYSTEMS
                    .iter()
                    .map(|e| h5i_policy::inbox::cache_dir(e.name))
                    .collect();
                for line in h5i::container::evidence::status_lines(&report.sb, &cache_dirs) {
                    say!("{line}");
                }
            }
            if report.policy.tier == h5i_policy::Tier::Microvm {
                for line in h5i::microvm::status_lines(&report.sb, &report.policy) {
                    say!("{line}");
                }
            }
            if matches!(
                report.policy.tier,
                h5i_policy::Tier::Process | h5i_policy::Tier::Supervised
            ) {
                say!("{}", h5i::sandbox::status_line(&report.sb));
            }
            let services = h5i::service::status(&store, &name)?;
            if !services.is_empty() {
                say!("services");
                for s in &services {
                    say!("  {}", service_line(s));
                }
            }
            Ok(0)
        }
        BoxVerb::Capabilities { name, json: _ } => {
            let report = h5i::status::status(&store()?, &name)?;
            print_json(&h5i::json_doc::Capabilities::of(&report))
        }
        BoxVerb::Run { name, argv } => {
            let store = store().map_err(|e| match e.downcast::<h5i::error::BoxError>() {
                Ok(b) => anyhow::Error::new(RunRefused(b)),
                Err(e) => e,
            })?;
            match h5i::run::run(&store, &name, &argv) {
                Ok(outcome) => {
                    if outcome.exit.timed_out {
                        warn!(
                            "h5i: box {name}: the wall-clock limit killed the command (receipt {})",
                            outcome.receipt_seq
                        );
                    } else if outcome.exit.oom_killed {
                        warn!(
                            "h5i: box {name}: the kernel OOM-killed the command at the box's memory ceiling (receipt {}); to raise it: set `mem` under the profile's resources in .h5i/env.toml",
                            outcome.receipt_seq
                        );
                    }
                    Ok(outcome.exit.passthrough_code())
                }
                Err(h5i::error::BoxError::Supervise(
                    h5i_runtime::supervise::SuperviseError::Spawn { program, source },
                )) => {
                    warn!("h5i: refusing: could not start `{program}` in box {name}: {source}; to fix: check the command exists inside the box");
                    Ok(if source.kind() == std::io::ErrorKind::NotFound {
                        127
                    } else {
                        126
                    })
                }
                Err(e) => Err(RunRefused(e).into()),
            }
        }
        BoxVerb::Shell { name, argv } => {
            use h5i::shell::ShellError;
            use h5i_runtime::supervise::SuperviseError;
            match h5i::shell::shell(&store()?, &name, &argv) {
                Ok(outcome) => {
                    if outcome.exit.timed_out {
                        warn!(
                            "h5i: box {name}: the wall-clock limit ended the session (receipt {})",
                            outcome.receipt_seq
                        );
                    }
                    Ok(outcome.exit.passthrough_code())
                }
                Err(ShellError::Box(h5i::error::BoxError::Supervise(SuperviseError::Spawn {
                    program,
                    source,
                }))) => {
                    warn!("h5i: refusing: could not start `{program}` in box {name}: {source}; to fix: check the command exists inside the box");
                    Ok(if source.kind() == std::io::ErrorKind::NotFound {
                        127
                    } else {
                        126
                    })
                }
                Err(ShellError::Box(e)) => Err(RunRefused(e).into()),
                Err(e @ ShellError::Pty(_)) => {
                    warn!("h5i: {e}");
                    Ok(125)
                }
            }
        }
        BoxVerb::Diff { name, stat } => {
            h5i::diff::print_diff(&store()?, &name, stat)?;
            Ok(0)
        }
        BoxVerb::Log {
            name,
            lane,
            host_observed,
            box_claimed,
            kind,
            failed,
            since,
            last,
            no_events,
            json,
        } => {
            let query = h5i::inspect::LogQuery {
                lane,
                host_observed: match (host_observed, box_claimed) {
                    (true, _) => Some(true),
                    (_, true) => Some(false),
                    _ => None,
                },
                kind,
                failed,
                since,
                last,
                no_events,
            };
            let view = h5i::inspect::log(&store()?, &name, &query)?;
            print_doc(json, &view, || view.lines())
        }
        BoxVerb::Inspect {
            name,
            capture,
            json,
        } => {
            let view = h5i::inspect::capture(&store()?, &name, capture)?;
            print_doc(json, &view, || view.lines())
        }
        BoxVerb::Compare { a, b, json } => {
            let cmp = h5i::compare::compare(&store()?, &a, &b)?;
            print_doc(json, &cmp, || cmp.lines())
        }
        BoxVerb::Export {
            name,
            out,
            force,
            skip_secret_check,
        } => {
            let s = h5i::box_export::export_box(
                &store()?,
                &name,
                &out,
                h5i::box_export::ExportOptions {
                    force,
                    skip_secret_check,
                },
            )?;
            say!("exported box {name} to {}", out.display());
            if let Some(change) = &s.policy_change {
                say!(
                    "  POLICY CHANGE {} ({}); report.md lists it first",
                    change.paths.join(", "),
                    change.summary()
                );
            }
            say!("  patch.diff   {} file(s) changed", s.files_changed);
            for e in &s.excluded {
                say!("  excluded     {} ({})", e.path, e.reason);
            }
            say!("  report.md    read it before applying");
            say!("  receipt.json {} record(s)", s.records);
            say!("apply with: git apply --3way {}/patch.diff", out.display());
            Ok(0)
        }
        BoxVerb::Apply {
            name,
            allow_policy_change,
            skip_secret_check,
        } => {
            let a = h5i::apply::apply(
                &store()?,
                &name,
                h5i::apply::ApplyOptions {
                    allow_policy_change,
                    skip_secret_check,
                },
            )?;
            say!(
                "applied box {name}: commit {} merged into {}",
                a.commit,
                a.branch
            );
            Ok(0)
        }
        BoxVerb::Rebase { name } => {
            let r = h5i::rebase::rebase(&store()?, &name)?;
            let how = if r.resumed {
                " (finished the rebase that was interrupted)"
            } else {
                ""
            };
            say!("rebased box {name}: base {} -> {}{how}", r.from, r.to);
            Ok(0)
        }
        BoxVerb::Abort { name } => {
            h5i::lifecycle::abort(&store()?, &name)?;
            say!("aborted box {name}; its manifest, receipts and workspace are kept (h5i box rm {name} removes them)");
            Ok(0)
        }
        BoxVerb::Rm { name, force } => {
            h5i::lifecycle::rm(&store()?, &name, force)?;
            say!("removed box {name}");
            Ok(0)
        }
        BoxVerb::Gc => {
            let r = h5i::lifecycle::gc(&store()?)?;
            for n in &r.reclaimed {
                say!("reclaimed the workspace of {n}");
            }
            say!(
                "gc: {} workspace(s) reclaimed, {} leftover(s) of interrupted commands removed",
                r.reclaimed.len(),
                r.leftovers
            );
            Ok(0)
        }
        BoxVerb::Bundle { name, out, argv } => {
            let notes = h5i::process::write_bundle_for(&store()?, &name, &argv, &out, &|sb| {
                h5i::cache::run_grant::for_run(sb, h5i_policy::Tier::Process)
            })?;
            say!("wrote {}/config.json and an empty rootfs/", out.display());
            for m in notes.missing {
                say!("  not mounted (missing on this host): {}", m.display());
            }
            Ok(0)
        }
        BoxVerb::Secrets { name, json } => {
            let store = store()?;
            let sb = store.find(&name)?;
            let policy = h5i::store::load_policy(&sb)?;
            let checks = h5i::secrets::dry_run(&sb, &policy)?;
            if json {
                print_json(&h5i::json_doc::Secrets::of(&name, &checks))?;
                return Ok(if checks.iter().all(|c| c.fingerprint.is_some()) {
                    0
                } else {
                    1
                });
            }
            if checks.is_empty() {
                say!("box {name} declares no secrets");
            }
            let mut missing = 0;
            for c in &checks {
                match &c.fingerprint {
                    Some(fp) => say!(
                        "{:<24} {:<32} inject={:<5} resolves  {fp}",
                        c.name,
                        c.source,
                        c.inject
                    ),
                    None => {
                        missing += 1;
                        say!(
                            "{:<24} {:<32} inject={:<5} UNRESOLVED: a run would be refused",
                            c.name,
                            c.source,
                            c.inject
                        )
                    }
                }
            }
            Ok(if missing > 0 { 1 } else { 0 })
        }
        BoxVerb::Allow { host } => {
            let env = |k: &str| std::env::var(k).ok();
            h5i::allow::refuse_inside_box(env)?;
            let path = h5i::allow::allowlist_path(env)?;
            match host {
                None => {
                    let entries = h5i::allow::list(&path)?;
                    if entries.is_empty() {
                        say!(
                            "no entries in {} (add one with `h5i box allow HOST`)",
                            path.display()
                        );
                    }
                    for e in entries {
                        say!("{e}");
                    }
                }
                Some(h) => match h5i::allow::add(&path, &h)? {
                    (hp, true) => say!(
                        "allowed {hp} for boxes whose profile already sets net.egress ({})",
                        path.display()
                    ),
                    (hp, false) => say!("{hp} is already allowed ({})", path.display()),
                },
            }
            Ok(0)
        }
        BoxVerb::Service { verb } => service_verb(verb),
        BoxVerb::Cache { verb } => super::cache_cmd::dispatch(verb),
        BoxVerb::Ports { name, json } => {
            let lines = h5i::service::ports(&store()?, &name)?;
            if json {
                return print_json(&h5i::json_doc::Ports::of(&name, &lines));
            }
            if lines.is_empty() {
                say!("box {name} has no live service with a port (h5i box service start {name} SERVICE)");
            }
            for l in lines {
                match l.host_port {
                    Some(h) => say!(
                        "127.0.0.1:{h} -> {}  ({}: {})",
                        l.box_port,
                        l.service,
                        l.note
                    ),
                    None => say!("(none) -> {}  ({}: {})", l.box_port, l.service, l.note),
                }
            }
            Ok(0)
        }
        #[cfg(feature = "ui")]
        BoxVerb::View {
            term: true, name, ..
        } => {
            let t = h5i::browser::term::run(&store()?, &name)?;
            say!(
                "left box {name}'s browser: {}; {} input events sent, {} dropped",
                if t.took_control {
                    "you took control"
                } else {
                    "watched only"
                },
                t.input_sent,
                t.input_dropped
            );
            Ok(0)
        }
        #[cfg(feature = "ui")]
        BoxVerb::View {
            name, port, open, ..
        } => {
            h5i::browser::view::serve(&store()?, &name, port, open, |url| {
                say!("watching box {name}'s browser at {url}");
                say!("(loopback only; the URL carries the box's token; Ctrl-C stops the viewer)");
            })?;
            Ok(0)
        }
        BoxVerb::ServiceSupervise { name, service } => {
            let above = h5i::service::FromAbove {
                caches: h5i::cache::run_grant::for_run,
                start_relay: h5i::browser::sidecar::start_relay,
            };
            Ok(h5i::service::supervise(&store()?, &name, &service, above)?)
        }
        BoxVerb::ServiceForward { port } => Ok(h5i::service::forward_from_inside(port)?),
        BoxVerb::Doctor { name, json } => {
            let checks = h5i::doctor::doctor(&store()?, &name)?;
            if json {
                print_json(&h5i::json_doc::Doctor::of(&name, &checks))?;
                return Ok(if checks.iter().all(|c| c.ok) { 0 } else { 1 });
            }
            for c in &checks {
                say!(
                    "{:<10} {:<4} {}",
                    c.what,
                    if c.ok { "ok" } else { "FAIL" },
                    c.detail
                );
            }
            Ok(if checks.iter().all(|c| c.ok) { 0 } else { 1 })
        }
        BoxVerb::Probe { json } => {
            let lines = h5i::probe::probe_lines();
            if json {
                return print_json(&h5i::json_doc::Probe::of(&lines));
            }
            for line in lines {
                say!("  {}= {}", line.what, line.answer);
            }
            Ok(0)
        }
    }
}

fn service_verb(verb: ServiceVerb) -> anyhow::Result<i32> {
    match verb {
        ServiceVerb::Start { name, service } => {
            let st = h5i::service::start(&store()?, &name, &service)?;
            let pid = st.pid.map(|p| p.pid).unwrap_or(0);
            say!(
                "started service {service} of box {name} (pid {pid}, tier {})",
                st.tier
            );
            if let (Some(p), Some(h)) = (st.port, st.host_port) {
                say!("  127.0.0.1:{h} -> {p}");
            }
            if let Some(n) = &st.port_note {
                say!("  port: {n}");
            }
            say!("  logs: h5i box service logs {name} {service}");
            Ok(0)
        }
        ServiceVerb::Status { name, json } => {
            let all = h5i::service::status(&store()?, &name)?;
            if json {
                return print_json(&h5i::json_doc::ServiceStatus::of(&name, &all));
            }
            if all.is_empty() {
                say!("box {name} declares no services");
            }
            for s in all {
                say!("{}", service_line(&s));
            }
            Ok(0)
        }
        ServiceVerb::Logs { name, service, raw } => {
            let path = h5i::service::logs(&store()?, &name, &service)?;
            let (dir, file) = (
                path.parent().unwrap_or(std::path::Path::new("/")),
                path.file_name().unwrap_or_default(),
            );
            match h5i::bounded::open_regular(dir, std::path::Path::new(file), u64::MAX) {
                Ok((f, _)) => {
                    let mut out = std::io::stdout().lock();
                    let copied = if raw {
                        warn!("h5i: warning: --raw copies the service's bytes as they are: escape sequences in them reach your terminal");
                        std::io::copy(&mut { f }, &mut out).map(|_| ())
                    } else {
                        h5i::escape::stream(f, &mut out, LOG_LINE_MAX).map(|_| ())
                    };
                    copied.with_context(|| {
                        format!("refusing: cannot read {}", path.display())
                    })?;
                }
                Err(h5i::bounded::Skip::Missing) => {
                    say!("service {service} of box {name} has not run yet (no log)");
                }
                Err(skip) => anyhow::bail!(
                    "refusing: the log {} is {skip}; to fix: `h5i box service stop {name} {service}` and start it again",
                    path.display()
                ),
            }
            Ok(0)
        }
        ServiceVerb::Stop { name, service } => {
            let st = h5i::service::stop(&store()?, &name, &service)?;
            match &st.exit {
                Some(e) => say!(
                    "stopped service {service} of box {name}: exit {}{}",
                    e.passthrough_code(),
                    st.receipt_seq
                        .map(|q| format!(" (receipt {q})"))
                        .unwrap_or_default()
                ),
                None => say!("stopped service {service} of box {name}"),
            }
            Ok(0)
        }
    }
}

/// A rendered view: its `--json` document, or its (already escaped) text lines.
fn print_doc(
    json: bool,
    doc: &impl serde::Serialize,
    lines: impl FnOnce() -> Vec<String>,
) -> anyhow::Result<i32> {
    if json {
        return print_json(doc);
    }
    for line in lines() {
        super::out::line(&line);
    }
    Ok(0)
}

/// Print a `--json` document through the JSON escaper (a box chose some of its strings); exit 0.
pub(super) fn print_json(doc: &impl serde::Serialize) -> anyhow::Result<i32> {
    let text = serde_json::to_string_pretty(doc)?;
    super::out::line(&h5i::escape::json(&text));
    Ok(0)
}

fn print_status(s: &h5i::status::StatusReport) {
    let m = &s.sb.manifest;
    say!("box        {} ({})", m.name, m.state.as_str());
    say!("source     {}", m.source.label());
    say!("base       {} (pinned as {})", m.base, m.base_ref);
    if let Some((from, to)) = &s.rebase_interrupted {
        say!(
            "rebase     interrupted ({from} -> {to}): the workspace is between the two; to fix: `h5i box rebase {}` finishes it",
            m.name
        );
    }
    let how = if s.policy.tier_choice.auto {
        "auto: the strongest tier this host could run for this policy"
    } else {
        s.policy.tier_choice.source.as_str()
    };
    say!("tier       {} (chosen by {how})", m.tier);
    say!(
        "policy     {} profile {} (verified against policy.digest)",
        m.policy_digest,
        s.policy.profile
    );
    say!("enforced");
    for e in &s.enforcement {
        say!(
            "  {:<13}{}{}",
            e.what,
            e.asked,
            if e.enforced { "" } else { " *" }
        );
    }
    if let Some(why) = &s.unenforced_reason {
        say!("  * {why}");
    }
    for e in &s.enforcement {
        if let Some(note) = &e.note {
            say!(
                "  {} {}: {note}",
                if e.enforced { "-" } else { "*" },
                e.what
            );
        }
    }
    if let Some(t) = &s.egress_table {
        say!(
            "egress table loaded by the last supervised run ({})",
            t.digest
        );
        if t.rules.is_empty() {
            say!("  (none: every destination refused)");
        }
        for r in &t.rules {
            say!("  {}:{} -> {}", r.host, r.port, r.addrs.join(", "));
        }
    }
    let (host, claimed, damaged) = s.evidence;
    say!("evidence   {host} host-observed, {claimed} box-claimed record(s), {damaged} damaged line(s)");
    if let Some((seq, argv, code, oom)) = &s.last_run {
        let oom = if *oom {
            " (OOM-killed at the memory ceiling)"
        } else {
            ""
        };
        say!("last run   #{seq} `{}` exit {code}{oom}", argv.join(" "));
    }
    match &s.workspace {
        None => say!("workspace  reclaimed"),
        Some(Err(why)) => say!("workspace  not scanned: {why}"),
        Some(Ok(scan)) if scan.found.is_empty() && scan.stopped.is_empty() => say!(
            "workspace  no set-id, fifo, socket or device file ({} entries scanned)",
            scan.entries
        ),
        Some(Ok(scan)) => {
            say!(
                "workspace  {} entries scanned; found (never opened):",
                scan.entries
            );
            for line in scan.lines() {
                say!("  {line}");
            }
            if scan.setid().next().is_some() {
                say!("  * a set-id file runs as its owner for anyone who can reach it; to fix: `chmod ug-s` it, and never run it");
            }
        }
    }
    match &s.drift {
        Some((b, 0)) => say!("base drift none: `{b}` is at the pinned base"),
        Some((b, n)) => say!(
            "base drift `{b}` is {n} commit(s) ahead of the pinned base (h5i box rebase {})",
            m.name
        ),
        None => say!("base drift n/a (no parent branch)"),
    }
}

/// `--lane`: a receipt lane by the name receipts and reports use.
fn parse_lane(s: &str) -> Result<ReceiptLane, String> {
    [
        ReceiptLane::HostEnvRun,
        ReceiptLane::Viewer,
        ReceiptLane::TeeShim,
        ReceiptLane::InboxCapture,
    ]
    .into_iter()
    .find(|l| l.as_str() == s)
    .ok_or_else(|| {
        format!("no lane `{s}`; the lanes: host-env-run, viewer, tee-shim, inbox-capture")
    })
}

/// One service's line, as `service status` and `status` print it.
fn service_line(s: &h5i::service::ServiceStatus) -> String {
    let st = s.state.as_ref();
    let pid = st
        .and_then(|st| st.pid)
        .map(|p| p.pid.to_string())
        .unwrap_or_else(|| "-".into());
    let port = match (s.port, st.and_then(|st| st.host_port)) {
        (Some(p), Some(h)) if s.alive => format!("127.0.0.1:{h} -> {p}"),
        (Some(p), _) => format!("port {p}"),
        (None, _) => "no port".into(),
    };
    let last = match st.and_then(|st| st.exit.as_ref().map(|e| (e, st.receipt_seq))) {
        Some((e, seq)) => format!(
            "last exit {}{}{}",
            e.passthrough_code(),
            e.signal
                .map(|s| format!(" (signal {s})"))
                .unwrap_or_default(),
            seq.map(|q| format!(" receipt {q}")).unwrap_or_default()
        ),
        None if st.is_some() && !s.alive => "last exit unknown (its supervisor is gone)".into(),
        None => "last exit -".into(),
    };
    format!(
        "{:<16} {:<5} pid {:<8} {}  {}  `{}`",
        s.service,
        if s.alive { "alive" } else { "dead" },
        pid,
        port,
        last,
        s.command
    )
}
