//! `h5i browser status|take|release|url`: parse, call `h5i::browser::{control, viewer}`, print.

use clap::{Args, Subcommand};

use h5i::browser::{control, sidecar, viewer};

/// `h5i browser ...`.
#[derive(Debug, Args)]
pub struct BrowserArgs {
    #[command(subcommand)]
    verb: BrowserVerb,
}

#[derive(Debug, Subcommand)]
enum BrowserVerb {
    /// Who holds control of the box's browser (agent or human), since when, and whether the
    /// agent's @refs are stale.
    Status {
        /// The box.
        name: String,
        /// Print the `h5i.browser.status/1` document (docs/json.md) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Take control as a human (never asks): the agent's mutating verbs are refused with a
    /// typed message until `release`; its read-only verbs keep working.
    Take {
        /// The box.
        name: String,
    },
    /// Hand control back to the agent: every @ref it held is stale until it snapshots again.
    Release {
        /// The box.
        name: String,
    },
    /// The URL a human's viewer of the box's browser connects to, token included: loopback
    /// only; the box's token is minted on first ask and kept where the box cannot read it.
    Url {
        /// The box.
        name: String,
        /// The viewer's loopback port.
        #[arg(long, default_value_t = viewer::DEFAULT_PORT, value_parser = clap::value_parser!(u16).range(1..))]
        port: u16,
    },
}

fn line(text: &str) {
    super::out::line(&h5i::escape::escape_controls(text));
}

/// Run a `h5i browser` command.
pub fn dispatch(args: BrowserArgs) -> anyhow::Result<i32> {
    let store = super::box_cmd::store()?;
    match args.verb {
        BrowserVerb::Status { name, json } => {
            let c = control::status(&store, &name)?;
            let sb = store.find(&name)?;
            let policy = h5i::store::load_policy(&sb)?;
            let box_lifetime = sidecar::lives_for_the_box(&policy);
            let running = box_lifetime && sidecar::alive(&sb);
            let note = match (box_lifetime, running) {
                (true, true) => {
                    "the box's browser is running; h5i's relay enforces the lock".to_string()
                }
                (true, false) => {
                    "the box's browser starts with the next run; h5i's relay will enforce the lock"
                        .to_string()
                }
                (false, _) => sidecar::why_per_run(&policy).to_string(),
            };
            if json {
                let doc = h5i::json_doc::BrowserStatus {
                    schema: h5i::json_doc::BROWSER_STATUS,
                    name,
                    holder: c.holder.as_str(),
                    since_ms: c.since_ms,
                    refs_stale: c.refs_stale,
                    box_lifetime,
                    running,
                    note,
                };
                return super::box_cmd::print_json(&doc);
            }
            let since = if c.since_ms == 0 {
                "since the box was made".to_string()
            } else {
                format!("since {}", control::ago(c.since_ms))
            };
            let by = c
                .taken_by_uid
                .map(|u| format!(" ({})", control::user_label(u)))
                .unwrap_or_default();
            line(&format!("holder      {}{by} {since}", c.holder.as_str()));
            line(&format!(
                "refs        {}",
                if c.refs_stale {
                    "stale: the agent must snapshot before acting on an @ref"
                } else {
                    "fresh"
                }
            ));
            line(&format!("browser     {note}"));
            line("chat        refused: h5i never gives the box agent-browser's AI gateway credential (chat would send page content out of the box)");
            Ok(0)
        }
        BrowserVerb::Take { name } => {
            control::take(&store, &name)?;
            line(&format!("browser of box {name}: a human holds control; the agent's mutating verbs are refused until `h5i browser release {name}`"));
            Ok(0)
        }
        BrowserVerb::Release { name } => {
            control::release(&store, &name)?;
            line(&format!("browser of box {name}: the agent holds control; its @refs are stale until it snapshots again"));
            Ok(0)
        }
        BrowserVerb::Url { name, port } => {
            line(&viewer::url(&store, &name, port)?);
            Ok(0)
        }
    }
}
