//! `h5i box cache ...`: parse, call `h5i::cache`, print (every line through the one escaper).

use std::io::IsTerminal;

use clap::Subcommand;

use h5i::cache::mounts::{BoxTree, Offer, TreeOffer, TreeOverlay};
use h5i::cache::refresh::Report;

/// Print one line to stdout through the one escaper.
macro_rules! say {
    ($($t:tt)*) => {
        super::out::line(&h5i::escape::escape_controls(&format!($($t)*)))
    };
}

/// The cache verbs.
#[derive(Debug, Subcommand)]
pub enum CacheVerb {
    /// Caches for this project, and whether they are stale.
    Ls {
        /// Print the `h5i.box.cache-ls/1` document (docs/json.md) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Exactly what a box would get (with NAME: that box, keyed by its own workspace).
    Mounts {
        /// The box (default: a box made from this working tree now).
        name: Option<String>,
        /// Print the `h5i.box.cache-mounts/1` document (docs/json.md) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Populate one ecosystem's cache, in a dedicated box with no agent in it; needs the
    /// project-declared profile `cache-<ECO>` whose egress is the registry hosts and no other.
    /// Every ecosystem fetches from the registries the host's own configuration names, which
    /// the refresh box is handed and which are the only hosts the profile may grant (pip.conf
    /// and PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST, PIP_CONFIG_FILE for pip and
    /// poetry; uv.toml and UV_DEFAULT_INDEX, UV_INDEX, UV_EXTRA_INDEX_URL, UV_INSECURE_HOST for
    /// uv; GOPROXY, GOSUMDB, GONOSUMDB, GOPRIVATE, GONOPROXY, GOINSECURE and Go's env file,
    /// GOENV; npm's registry and @scope:registry settings from npm_config_* and the user's and
    /// global npmrc for npm, pnpm (and pnpm's rc) and yarn (and .yarnrc, YARN_REGISTRY); cargo's
    /// source replacement and [registries] in $CARGO_HOME/config.toml and
    /// CARGO_REGISTRIES_<NAME>_INDEX). The project's own registry files are never read for this.
    Refresh {
        /// The ecosystem: npm, pnpm, yarn, cargo, pip, uv, poetry or go.
        eco: String,
    },
    /// Remove one ecosystem's caches.
    Rm {
        /// The ecosystem: npm, pnpm, yarn, cargo, pip, uv, poetry or go.
        eco: String,
    },
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// Run a cache verb.
pub fn dispatch(verb: CacheVerb) -> anyhow::Result<i32> {
    let store = super::box_cmd::store()?;
    match verb {
        CacheVerb::Ls { json } => {
            let all = h5i::cache::ls::list(&store)?;
            if json {
                return super::box_cmd::print_json(&h5i::json_doc::CacheLs {
                    schema: h5i::json_doc::CACHE_LS,
                    caches: all,
                });
            }
            if all.is_empty() {
                say!("no caches on this clone (h5i box cache refresh ECO fills one)");
            }
            for c in all {
                say!(
                    "{:<5} {} {:<7} {:>10}  {}",
                    c.eco,
                    c.key,
                    if c.stale { "STALE" } else { "current" },
                    mib(c.bytes),
                    match &c.refresh {
                        Some(r) => format!(
                            "install {} ms; egress {}",
                            r.wall_ms,
                            h5i::cache::refresh::egress_line(r.egress.as_ref())
                        ),
                        None => "no refresh record".into(),
                    }
                );
            }
            Ok(0)
        }
        CacheVerb::Mounts { name, json } => {
            let (root, project, who, host_usr, base) = match &name {
                Some(n) => {
                    let sb = store.find(n)?;
                    let tier: h5i_policy::Tier = h5i::store::load_policy(&sb)?.tier;
                    let host_usr = !matches!(
                        tier,
                        h5i_policy::Tier::Container | h5i_policy::Tier::Microvm
                    );
                    if !h5i::cache::mounts::tier_mounts_caches(tier) {
                        if json {
                            return super::box_cmd::print_json(&h5i::json_doc::CacheMounts {
                                schema: h5i::json_doc::CACHE_MOUNTS,
                                name: name.clone(),
                                tier_mounts_caches: false,
                                offers: Vec::new(),
                                node_modules: None,
                            });
                        }
                        say!("box {n} runs at the {tier} tier, which gets no cache (it cannot be mounted read-only there)");
                        return Ok(0);
                    }
                    let root = h5i::cache::CacheRoot::of_box(&sb)
                        .unwrap_or_else(|| h5i::cache::CacheRoot::of(&store));
                    let base = h5i::cache::mounts::box_tree(&sb, &root, host_usr);
                    (
                        root,
                        sb.paths.workspace(),
                        format!("box {n}"),
                        host_usr,
                        base,
                    )
                }
                None => (
                    h5i::cache::CacheRoot::of(&store),
                    store.repo_root.clone(),
                    "a box made from this working tree".to_string(),
                    true,
                    None,
                ),
            };
            let mut offers = h5i::cache::mounts::offers(&root, &project, host_usr, name.is_some())?;
            h5i::cache::mounts::keep_base(&mut offers, base.as_ref());
            if json {
                return super::box_cmd::print_json(&h5i::json_doc::CacheMounts {
                    schema: h5i::json_doc::CACHE_MOUNTS,
                    name,
                    tier_mounts_caches: true,
                    offers,
                    node_modules: base,
                });
            }
            if offers.is_empty() {
                say!("{who} uses no ecosystem h5i caches (no lockfile found)");
            }
            for o in offers {
                match o {
                    Offer::Mounted {
                        eco,
                        key,
                        data,
                        inside,
                        env,
                        tree,
                    } => {
                        say!(
                            "{eco}: {key} ({}) mounted read-only at {inside}",
                            data.display()
                        );
                        for e in env {
                            say!("  {e}");
                        }
                        match tree {
                            Some(TreeOffer::Mounted {
                                platform,
                                data,
                                inside,
                                env,
                                overlay,
                                warm_install,
                            }) => {
                                say!(
                                    "  built node_modules for {platform} ({}) mounted read-only at {inside}",
                                    data.display()
                                );
                                say!("  {env}");
                                match overlay {
                                    TreeOverlay::Overlaid { inside } => {
                                        say!(
                                            "  and overlaid at {inside}: the tree read-only beneath, the box's changes in an upper layer of its own"
                                        );
                                        say!("  `{warm_install}` finds it up to date");
                                    }
                                    TreeOverlay::Kept { eco: base, key } => say!(
                                        "  not overlaid: the box's node_modules stays its own, built on the tree of {base} cache {key}"
                                    ),
                                    TreeOverlay::OtherTree { eco: first } => say!(
                                        "  not overlaid: the project is locked for {first} too, whose tree is the box's node_modules"
                                    ),
                                    TreeOverlay::OwnTree => say!(
                                        "  not overlaid: the workspace has a node_modules of its own (remove it in the box to get the cached tree there)"
                                    ),
                                }
                            }
                            Some(TreeOffer::OtherNode { platform, built_by }) => say!(
                                "  built node_modules not mounted: built for {platform} by {}, which is not the node this box runs (h5i box cache refresh {eco})",
                                built_by.display()
                            ),
                            Some(TreeOffer::OtherTier { platform }) => say!(
                                "  built node_modules not mounted: built for {platform} with the host's node; this tier brings its own (its image's node, which no refresh built a tree with), so the box keeps no node_modules on the cache: it installs its own from the read-only cache, offline"
                            ),
                            None => {}
                        }
                    }
                    Offer::Stale { eco, want, have } => say!(
                        "{eco}: nothing mounted: the lockfiles make key {want}, the cache is {} (stale); h5i box cache refresh {eco}",
                        have.join(", ")
                    ),
                    Offer::Missing { eco, want } => say!(
                        "{eco}: nothing mounted: no cache for key {want}; h5i box cache refresh {eco}"
                    ),
                    Offer::Refused { eco, why } => say!("{eco}: nothing mounted: {why}"),
                }
            }
            match base {
                Some(BoxTree::Overlaid {
                    eco,
                    key,
                    current: false,
                    lower,
                    upper,
                    inside,
                }) => say!(
                    "node_modules: the box's own, overlaid at {inside}: the tree of {eco} cache {key} it started from ({}) read-only beneath its upper layer ({}); kept across the lockfile change, since a box's node_modules is its own, not the cache's",
                    lower.display(),
                    upper.display()
                ),
                Some(BoxTree::Unavailable {
                    eco,
                    key,
                    upper,
                    why,
                }) => say!(
                    "node_modules: not overlaid: the box's was built on the tree of {eco} cache {key}, and {why}; its changes stay in {} until h5i box rm",
                    upper.display()
                ),
                _ => {}
            }
            Ok(0)
        }
        CacheVerb::Refresh { eco } => {
            let tty = std::io::stderr().is_terminal();
            let eco_shown = h5i::escape::escape_controls(&eco);
            // Written to the caller's stderr, which the refresh hands in: while a step runs in
            // the refresh box this process's own descriptors point into its capture.
            let report = |r: Report<'_>, to: &mut dyn std::io::Write| {
                let _ = match r {
                    Report::Started => writeln!(
                        to,
                        "h5i: refresh {eco_shown}: installing in a dedicated supervised box (no agent, egress: the cache-{eco_shown} profile's hosts)"
                    ),
                    Report::Progress(p) => {
                        let line = format!(
                            "h5i: refresh {eco_shown}: {} in the cache, {} s",
                            mib(p.bytes),
                            p.secs
                        );
                        if tty {
                            write!(to, "\r{line}\x1b[K")
                        } else if p.secs.is_multiple_of(5) {
                            writeln!(to, "{line}")
                        } else {
                            Ok(())
                        }
                    }
                    // What the box printed: escaped, on a line of its own (over the progress
                    // line on a terminal, which the next tick draws again).
                    Report::Said(bytes) => writeln!(
                        to,
                        "{}h5i: refresh {eco_shown}: | {}",
                        if tty { "\r\x1b[K" } else { "" },
                        h5i::escape::bytes(bytes)
                    ),
                };
            };
            let result = h5i::cache::refresh::refresh(&store, &eco, &report);
            if tty {
                eprintln!();
            }
            let r = match result {
                Ok(r) => r,
                Err(e @ h5i::cache::CacheError::NoRegistryProfile { .. }) => {
                    // One escaped line at a time, so the profile keeps its line breaks.
                    let text = e.to_string();
                    for (i, line) in text.lines().enumerate() {
                        let prefix = if i == 0 { "h5i: " } else { "" };
                        eprintln!("{prefix}{}", h5i::escape::escape_controls(line));
                    }
                    return Ok(1);
                }
                Err(e) => return Err(e.into()),
            };
            say!(
                "refreshed the {} cache: key {}, {}, install {} ms (receipt {} of the refresh box)",
                r.record.eco,
                r.record.key,
                mib(r.record.bytes),
                r.record.wall_ms,
                r.receipt_seq
            );
            say!(
                "  egress {}",
                h5i::cache::refresh::egress_line(r.record.egress.as_ref())
            );
            for k in r.replaced {
                say!("  replaced the stale cache {k}");
            }
            Ok(0)
        }
        CacheVerb::Rm { eco } => {
            for k in h5i::cache::rm::rm(&store, &eco)? {
                say!("removed the {eco} cache {k}");
            }
            Ok(0)
        }
    }
}
