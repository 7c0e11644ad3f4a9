//! `h5i man [COMMAND...]`: the man page (roff), generated from the same clap definitions as
//! `--help`. `h5i man` is h5i(1), `h5i man box` is h5i-box(1), `h5i man box cache` is
//! h5i-box-cache(1); `--out DIR` writes every page as DIR/<name>.1.

use std::path::Path;

use anyhow::Context;
use clap::CommandFactory;

/// The command at `path` below `h5i`, named as its man page is (`h5i-box-cache`).
fn find(path: &[String]) -> anyhow::Result<clap::Command> {
    let mut cmd = super::Cli::command();
    cmd.build();
    let mut name = "h5i".to_string();
    for word in path {
        let sub = cmd
            .find_subcommand(word)
            .cloned()
            .with_context(|| format!("refusing: `{name}` has no command `{word}`; to fix: `h5i man` lists them under COMMANDS (or `{} --help`)", name.replace('-', " ")))?;
        name = format!("{name}-{}", sub.get_name());
        cmd = sub;
    }
    Ok(cmd.name(name))
}

/// Print the page for `path`, or write every page into `out`.
pub fn run(path: &[String], out: Option<&Path>) -> anyhow::Result<i32> {
    let Some(dir) = out else {
        let mut page = Vec::new();
        clap_mangen::Man::new(find(path)?).render(&mut page)?;
        super::out::bytes(&page);
        return Ok(0);
    };
    std::fs::create_dir_all(dir)
        .with_context(|| format!("refusing: cannot create {}", dir.display()))?;
    let mut stack = vec![Vec::<String>::new()];
    while let Some(p) = stack.pop() {
        let cmd = find(&p)?;
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            let mut q = p.clone();
            q.push(sub.get_name().to_string());
            stack.push(q);
        }
        let file = dir.join(format!("{}.1", cmd.get_name()));
        let mut f = std::fs::File::create(&file)
            .with_context(|| format!("refusing: cannot write {}", file.display()))?;
        clap_mangen::Man::new(cmd).render(&mut f)?;
    }
    Ok(0)
}
