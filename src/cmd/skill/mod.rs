//! `h5i skill ...`: the agent skill this binary carries (`h5i::skill`). One module per verb.
//!
//! Guarded by the unit test below: every `h5i` command and flag the skill's pages name is one
//! this binary's clap definitions have, so the skill cannot document what the binary lacks.

mod install;
mod path;
mod show;

use clap::{Args, Subcommand};

/// `h5i skill`.
#[derive(Debug, Args)]
pub struct SkillArgs {
    #[command(subcommand)]
    verb: SkillVerb,
}

#[derive(Debug, Subcommand)]
enum SkillVerb {
    /// Write the skill out (default: ~/.claude/skills/h5i, or ~/.codex/skills/h5i when
    /// H5I_AGENT=codex; H5I_SKILL_DIR overrides). Refused inside a box and through a symlink.
    Install {
        /// Write it into DIR instead.
        #[arg(long, value_name = "DIR")]
        target: Option<std::path::PathBuf>,
    },
    /// Print SKILL.md, or one reference page (in-a-box, policy, proposal, browser).
    Show {
        /// The reference page.
        page: Option<String>,
    },
    /// Where `h5i skill install` would write.
    Path,
}

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok()
}

/// Run a `h5i skill` command.
pub fn dispatch(args: SkillArgs) -> anyhow::Result<i32> {
    match args.verb {
        SkillVerb::Install { target } => install::run(target, env),
        SkillVerb::Show { page } => show::run(page.as_deref()),
        SkillVerb::Path => path::run(env),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every `h5i ...` command line in `text`'s code (inline spans and fenced blocks), as words.
    fn command_lines(text: &str) -> Vec<Vec<String>> {
        let mut code = Vec::new();
        let mut fenced = false;
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                continue;
            }
            if fenced {
                code.push(line.split('#').next().unwrap_or("").to_owned());
            } else {
                code.extend(line.split('`').skip(1).step_by(2).map(str::to_owned));
            }
        }
        let mut out = Vec::new();
        for c in code {
            let words: Vec<&str> = c.split_whitespace().collect();
            for (i, w) in words.iter().enumerate() {
                if *w == "h5i" && (i == 0 || matches!(words[i - 1], "&&" | "||" | ";" | "$")) {
                    out.push(words[i + 1..].iter().map(|s| s.to_string()).collect());
                }
            }
        }
        out
    }

    /// Walk `words` down h5i's clap tree: subcommands by name, `--flags` on the command reached,
    /// and upper-case placeholders (`NAME`, `DIR`) against a positional of that command.
    fn check(words: &[String]) -> Result<(), String> {
        let mut cmd = super::super::Cli::command();
        cmd.build();
        let mut placeholders = 0;
        let mut flag_value = false;
        for w in words {
            if w == "--" {
                break;
            }
            if std::mem::take(&mut flag_value) {
                continue;
            }
            if let Some(flag) = w.strip_prefix("--") {
                let (flag, inline) = flag
                    .split_once('=')
                    .map_or((flag, false), |(f, _)| (f, true));
                let Some(arg) = cmd.get_arguments().find(|a| a.get_long() == Some(flag)) else {
                    return Err(format!("`{}` has no flag --{flag}", cmd.get_name()));
                };
                flag_value = !inline && arg.get_action().takes_values();
            } else if let Some(sub) = cmd.find_subcommand(w).cloned() {
                cmd = sub;
                placeholders = 0;
            } else if w.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
                placeholders += 1;
                let positionals = cmd.get_positionals().count();
                if placeholders > positionals {
                    return Err(format!("`{}` takes no argument {w}", cmd.get_name()));
                }
            } else if cmd.has_subcommands() {
                return Err(format!("`{}` has no command `{w}`", cmd.get_name()));
            }
        }
        Ok(())
    }

    #[test]
    fn every_h5i_command_and_flag_the_skill_names_exists() {
        let mut seen = 0;
        for f in h5i::skill::FILES {
            for words in command_lines(f.text) {
                seen += 1;
                if let Err(e) = check(&words) {
                    panic!("{}: `h5i {}`: {e}", f.path, words.join(" "));
                }
            }
        }
        assert!(seen >= 4, "the check found only {seen} command(s)");
    }

    #[test]
    fn the_check_refuses_what_the_binary_lacks() {
        let lines = command_lines(
            "`h5i box frobnicate`\n```sh\nh5i skill install --nope   # x\n```\nthe `h5i box run NAME --` and `h5i skill show PAGE EXTRA` and `h5i skill install --target DIR`",
        );
        assert_eq!(lines.len(), 5, "{lines:?}");
        assert!(check(&lines[0])
            .unwrap_err()
            .contains("no command `frobnicate`"));
        assert!(check(&lines[1]).unwrap_err().contains("no flag --nope"));
        check(&lines[2]).unwrap();
        assert!(check(&lines[3]).unwrap_err().contains("no argument EXTRA"));
        check(&lines[4]).unwrap();
    }
}
