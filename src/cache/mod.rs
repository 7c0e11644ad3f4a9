//! Warm dependency caches (`h5i box cache ...`): one per project and ecosystem, keyed by a
//! digest of that ecosystem's lockfiles, stored under `.git/.h5i/cache/<eco>/<key>/`.
//!
//! Owns the reviewed ecosystem table ([`ECOSYSTEMS`]), the key (a SHA-256 over the lockfiles,
//! each read through the one bounded reader, never following a symlink), and the on-disk layout:
//! `<key>/data/` is what a box gets (read-only), `<key>/refresh.json` is what the refresh that
//! wrote it observed. The entry of a node package manager (npm, pnpm, Yarn 1: [`KeptTree`]) also
//! holds `<key>/tree/node_modules`, the tree its install built in the refresh box (pnpm's with
//! its `.pnpm` virtual store, Yarn's with its `.yarn-integrity`), stamped with the platform and
//! node ABI it was built for ([`TreeRecord`]): a box gets it as its `node_modules` (overlaid:
//! [`mounts`]) instead of unpacking every package again. One module per verb: [`ls`],
//! [`mounts`], [`refresh`], [`rm`].
//!
//! Must never: hand a box a cache whose key does not match the lockfiles in that box's workspace
//! (packages resolved for another dependency set are a silent wrong answer), hand one to a tier
//! that cannot mount it read-only, hand out an entry [`CacheRoot::verify`] refuses (a symlink, a
//! directory another user owns or may write, a record of another key), hand out a built tree
//! for another platform or node binary, or let anything but [`refresh`] write one.
//!
//! Guarded by `tests/box_cache.rs` (a real npm, pnpm, Yarn 1, cargo, pip, uv, Poetry and Go
//! project, each against a registry stand-in in the test's own network namespace) and the unit
//! tests below.

pub mod lockfile;
pub mod ls;
pub mod mirror;
pub mod mounts;
pub mod refresh;
pub mod rm;
pub mod run_grant;
pub mod tree_walk;

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::BoxError;

/// A node package manager's built `node_modules`, kept by `refresh` beside its cache.
#[derive(Debug)]
pub struct KeptTree {
    /// Where a process or supervised box sees it (read-only).
    pub inside: &'static str,
    /// The variable naming `inside` in a box that has it (where the tree is also the
    /// workspace's `node_modules`, overlaid: `mounts::TREE_OVERLAY`).
    pub var: &'static str,
    /// The install that finds the kept tree up to date, for `box cache mounts` to name.
    pub warm_install: &'static str,
}

/// The largest `refresh.json` or tree stamp read.
const RECORD_CAP: u64 = 1 << 20;

/// The largest lockfile read for a key (a lockfile past this is refused, not truncated).
pub const LOCKFILE_CAP: u64 = 64 << 20;

/// One ecosystem's entry in the reviewed table.
#[derive(Debug)]
pub struct Ecosystem {
    /// The name `h5i box cache refresh` takes, and the directory under `.git/.h5i/cache/`.
    pub name: &'static str,
    /// The lockfiles at the project root whose bytes make the key; the ecosystem is in use
    /// when at least one exists.
    pub lockfiles: &'static [&'static str],
    /// The install step `refresh` runs in the project root of its dedicated box (`{dir}` in an
    /// argument becomes the cache's data directory as the box sees it).
    pub install: &'static [&'static str],
    /// How a project makes the lockfile, for the refusal when it has none.
    pub lock_hint: &'static str,
    /// The package manager's own documented default registry's hosts: with the hosts of the
    /// registries the host's configuration adds, what a refresh box may reach when that
    /// configuration replaces no default ([`Ecosystem::registry_hosts`]).
    pub default_hosts: &'static [&'static str],
    /// The mirror the host's own configuration names, which the refresh box is pointed at.
    pub mirror: fn(&mirror::Env) -> mirror::Mirror,
    /// Variables pointing an agent box's package manager at the cache (read-only):
    /// `(NAME, VALUE)`, where `{dir}` in VALUE becomes the cache's data directory.
    pub env: &'static [(&'static str, &'static str)],
    /// Variables pointing the refresh box's install step at the cache it fills, the same way.
    pub fill_env: &'static [(&'static str, &'static str)],
    /// For an ecosystem whose install step reads a hashed requirements list h5i derives from
    /// the lockfile ([`lockfile`]): the lockfile's format. `refresh` writes the list into the
    /// cache before the install step runs, and a box installs from the same list.
    pub derived: Option<lockfile::LockFormat>,
    /// Whether `refresh` also keeps the `node_modules` the install built in the project,
    /// stamped with its platform ([`TreeRecord`]), and where a box sees it.
    pub tree: Option<KeptTree>,
}

/// npm's variables in agent boxes (the refresh box's: [`NPM_FILL_ENV`]).
const NPM_ENV: &[(&str, &str)] = &[
    ("npm_config_cache", "{dir}"),
    // Use what the cache holds without asking the registry whether it is current: the
    // lockfile's integrity hashes already say which bytes are wanted.
    ("npm_config_prefer_offline", "true"),
    // npm writes debug logs under its cache by default, which is read-only in a box.
    ("npm_config_logs_dir", "/tmp/.npm-logs"),
    ("npm_config_update_notifier", "false"),
];

/// npm's variables in the refresh box: an agent box's, and the `git` npm runs for a git
/// dependency fixed to the one on the box's PATH (the project's `.npmrc`, which npm reads in
/// the project, may name a program of the project's own; a variable outranks it).
const NPM_FILL_ENV: &[(&str, &str)] = &[
    ("npm_config_cache", "{dir}"),
    ("npm_config_prefer_offline", "true"),
    ("npm_config_logs_dir", "/tmp/.npm-logs"),
    ("npm_config_update_notifier", "false"),
    ("npm_config_git", "git"),
];

/// pnpm's variables, the same in agent boxes and the refresh box (pnpm 10 reads its settings
/// from `npm_config_*`; npm warns that it does not know the two pnpm-only ones). The store is
/// read-only in an agent box: pnpm copies each package out of it (`package-import-method=copy`;
/// a hard link or reflink across the read-only bind is refused anyway, EXDEV) and never writes
/// it when every locked package is there. The one write pnpm 10 makes into a store on every
/// install is the project's registration link (`v10/projects/<hash of the project dir>`), which
/// the refresh box made for `/work`, where every box's project is: the link exists, so
/// pnpm's symlink answers EEXIST (before EROFS) and pnpm takes it as done.
const PNPM_ENV: &[(&str, &str)] = &[
    ("npm_config_store_dir", "{dir}"),
    ("npm_config_package_import_method", "copy"),
    ("npm_config_prefer_offline", "true"),
    ("npm_config_update_notifier", "false"),
];

/// Yarn 1's variables in agent boxes (the refresh box's: [`YARN_FILL_ENV`]). An explicit cache folder is
/// used as it is, read-only or not (only yarn's own default candidates are tried for
/// writability); a box installs offline with `yarn install --frozen-lockfile --offline`.
const YARN_ENV: &[(&str, &str)] = &[
    ("YARN_CACHE_FOLDER", "{dir}"),
    // Yarn asks its registry for a newer yarn after an install: a request a warm install must
    // not make.
    ("YARN_DISABLE_SELF_UPDATE_CHECK", "true"),
];

/// Yarn's variables in the refresh box: an agent box's, and `yarn-path` refused from any
/// source (the variable is read before any rc file).
const YARN_FILL_ENV: &[(&str, &str)] = &[
    ("YARN_CACHE_FOLDER", "{dir}"),
    ("YARN_DISABLE_SELF_UPDATE_CHECK", "true"),
    ("YARN_IGNORE_PATH", "true"),
];

/// cargo's variables in the refresh box: an agent box's, and the compiler cargo asks for its
/// version (`rustc -vV`, which `cargo fetch` runs to learn the host) fixed to the `rustc` on
/// the box's PATH with no wrapper: the project's `.cargo/config.toml` may name a wrapper or a
/// `rustc` of its own (the project's code), and variables outrank config files (an empty
/// wrapper variable turns a configured wrapper off).
const CARGO_FILL_ENV: &[(&str, &str)] = &[
    ("CARGO_HOME", "{dir}"),
    ("CARGO_HTTP_TIMEOUT", "30"),
    ("RUSTC", "rustc"),
    ("RUSTC_WRAPPER", ""),
    ("RUSTC_WORKSPACE_WRAPPER", ""),
];

/// cargo's variables in agent boxes (the refresh box's: [`CARGO_FILL_ENV`]). The whole CARGO_HOME is the
/// cache: cargo uses a read-only one whose registry holds every locked crate (index, .crate
/// files and unpacked sources; it takes its package lock shared when the home is read-only). A
/// box's own ~/.cargo (its config, `cargo install`) is not used while the cache is mounted.
const CARGO_ENV: &[(&str, &str)] = &[
    ("CARGO_HOME", "{dir}"),
    // cargo's own default. Cargo 1.65 (Debian 12's) turns off libgit2's repository owner check
    // only when an http option is configured (fixed in 1.66), and a root caller's cache is
    // owned by the caller, not by the box's identity: without it that cargo cannot open the
    // cached registry index. (`--offline` still trips it there.)
    ("CARGO_HTTP_TIMEOUT", "30"),
];

/// The install step of a wheelhouse cache (pip, uv, poetry): `pip download` of a hashed
/// requirements list, wheels only, so no package's build code (setup.py) runs while the cache
/// is filled, and every file checked against the hash the list pins.
macro_rules! pip_download {
    ($list:literal) => {
        [
            "python3",
            "-m",
            "pip",
            "download",
            "--only-binary=:all:",
            "--require-hashes",
            "--no-input",
            "--disable-pip-version-check",
            "-r",
            $list,
            "-d",
            "{dir}",
        ]
    };
}

/// PyPI's hosts, for the profile text when the host names no mirror.
const PYPI_HOSTS: &[&str] = &["pypi.org:443", "files.pythonhosted.org:443"];

/// pip's variables in an agent box: it installs from the wheelhouse alone, since the key says
/// it holds the whole locked set and asking the index too would be a request per package. A
/// package outside the lockfile needs `PIP_NO_INDEX=0` (and the box's egress to the index).
const PIP_WHEELHOUSE_ENV: &[(&str, &str)] = &[("PIP_FIND_LINKS", "{dir}"), ("PIP_NO_INDEX", "1")];

/// Every ecosystem h5i keeps a cache for. Each entry is proved by a real install in
/// `tests/box_cache.rs`; an ecosystem without such a test is not listed.
pub const ECOSYSTEMS: &[Ecosystem] = &[
    Ecosystem {
        name: "npm",
        lockfiles: &["package-lock.json", "npm-shrinkwrap.json"],
        // --ignore-scripts: the refresh box exists to fill the cache, and a dependency's install
        // script is the one thing in it that could write the cache with something other than
        // what the registry served.
        install: &["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund"],
        lock_hint: "npm install --package-lock-only",
        default_hosts: &["registry.npmjs.org:443"],
        mirror: mirror::npm,
        env: NPM_ENV,
        fill_env: NPM_FILL_ENV,
        derived: None,
        tree: Some(KeptTree {
            inside: "/.h5i/cache/npm-tree",
            var: "H5I_NPM_TREE",
            warm_install: "npm install --offline --no-save",
        }),
    },
    Ecosystem {
        name: "pnpm",
        lockfiles: &["pnpm-lock.yaml"],
        // --ignore-scripts, as npm's: nothing but what the registry served lands in the store;
        // --ignore-pnpmfile: the project's `.pnpmfile.cjs` is the project's code, which pnpm
        // would otherwise load and run while it fills the store.
        install: &[
            "pnpm",
            "install",
            "--frozen-lockfile",
            "--ignore-scripts",
            "--ignore-pnpmfile",
        ],
        lock_hint: "pnpm install --lockfile-only",
        default_hosts: &["registry.npmjs.org:443"],
        mirror: mirror::pnpm,
        env: PNPM_ENV,
        fill_env: PNPM_ENV,
        derived: None,
        // node_modules holds relative symlinks into node_modules/.pnpm (the virtual store,
        // copies out of the store: package-import-method=copy), so the one tree serves whole;
        // its .modules.yaml names the store at the path every box gets it at.
        tree: Some(KeptTree {
            inside: "/.h5i/cache/pnpm-tree",
            var: "H5I_PNPM_TREE",
            warm_install: "pnpm install --frozen-lockfile --offline",
        }),
    },
    Ecosystem {
        name: "yarn",
        lockfiles: &["yarn.lock"],
        // --no-default-rc: the project's `.yarnrc` and `.npmrc` are not read (a `yarn-path`
        // there names a script yarn would run instead of itself); the caller's registry
        // settings reach the box as variables.
        install: &[
            "yarn",
            "install",
            "--frozen-lockfile",
            "--ignore-scripts",
            "--non-interactive",
            "--no-default-rc",
        ],
        lock_hint: "yarn install",
        default_hosts: &["registry.yarnpkg.com:443"],
        mirror: mirror::yarn,
        env: YARN_ENV,
        fill_env: YARN_FILL_ENV,
        derived: None,
        // Its node_modules/.yarn-integrity records the install's flags, `ignoreScripts` among
        // them: yarn finds the tree up to date only for an install with the same flag, and
        // relinks every package from the cache (offline, as correct, and as slow as before)
        // for one without it, since that one asks for the scripts the refresh did not run.
        tree: Some(KeptTree {
            inside: "/.h5i/cache/yarn-tree",
            var: "H5I_YARN_TREE",
            warm_install: "yarn install --frozen-lockfile --offline --ignore-scripts",
        }),
    },
    Ecosystem {
        name: "cargo",
        lockfiles: &["Cargo.lock"],
        // `cargo fetch` downloads every locked crate and unpacks it under CARGO_HOME; it runs
        // no build script and compiles nothing, so nothing in the cache is a dependency's
        // own output.
        install: &["cargo", "fetch", "--locked"],
        lock_hint: "cargo generate-lockfile",
        default_hosts: &["index.crates.io:443", "static.crates.io:443"],
        mirror: mirror::cargo,
        env: CARGO_ENV,
        fill_env: CARGO_FILL_ENV,
        derived: None,
        tree: None,
    },
    Ecosystem {
        name: "pip",
        lockfiles: &["requirements.txt"],
        // --require-hashes makes the file a lockfile: every line pinned with `==` and its
        // hashes, and a VCS, URL or editable requirement (whose metadata step would run its
        // code) refused.
        install: &pip_download!("requirements.txt"),
        lock_hint: "pip-compile --generate-hashes",
        default_hosts: PYPI_HOSTS,
        mirror: mirror::pip,
        env: PIP_WHEELHOUSE_ENV,
        fill_env: &[],
        derived: None,
        tree: None,
    },
    Ecosystem {
        name: "uv",
        lockfiles: &["uv.lock"],
        // uv cannot use a read-only cache of its own (it takes a lock inside it), so the cache
        // is a wheelhouse of the locked set, as pip's is: h5i derives the hashed list from
        // uv.lock ([`lockfile`]) and pip downloads it.
        install: &pip_download!("{dir}/h5i-requirements.txt"),
        lock_hint: "uv lock",
        default_hosts: PYPI_HOSTS,
        mirror: mirror::uv,
        // uv installs from the wheelhouse alone (`uv pip install -r {dir}/h5i-requirements.txt`
        // in a venv): UV_OFFLINE keeps it off every index, as PIP_NO_INDEX does pip.
        env: &[("UV_FIND_LINKS", "{dir}"), ("UV_OFFLINE", "1")],
        fill_env: &[],
        derived: Some(lockfile::LockFormat::Uv),
        tree: None,
    },
    Ecosystem {
        name: "poetry",
        lockfiles: &["poetry.lock"],
        // Poetry asks its sources for every locked package's links at install time, so no cache
        // of its own serves a box offline: the cache is a wheelhouse of the locked set derived
        // from poetry.lock ([`lockfile`]), installed with pip (`poetry run pip install -r
        // {dir}/h5i-requirements.txt`). Poetry names no mirror of its own for PyPI: the refresh
        // box fetches from pip's.
        install: &pip_download!("{dir}/h5i-requirements.txt"),
        lock_hint: "poetry lock",
        default_hosts: PYPI_HOSTS,
        mirror: mirror::pip,
        env: PIP_WHEELHOUSE_ENV,
        fill_env: &[],
        derived: Some(lockfile::LockFormat::Poetry),
        tree: None,
    },
    Ecosystem {
        name: "go",
        lockfiles: &["go.sum"],
        // `go mod download` fetches every module of the build list into GOMODCACHE, checked
        // against go.sum; it builds and runs nothing.
        install: &["go", "mod", "download"],
        lock_hint: "go mod tidy",
        default_hosts: &["proxy.golang.org:443"],
        mirror: mirror::go,
        env: &[("GOMODCACHE", "{dir}")],
        // Writable module directories in the fill (Go makes them read-only), so a failed
        // refresh's staging directory can be removed; the stored cache is read-only anyway.
        fill_env: &[("GOMODCACHE", "{dir}"), ("GOFLAGS", "-modcacherw")],
        derived: None,
        tree: None,
    },
];

/// A refusal from a cache verb.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// An ecosystem name outside the table.
    #[error("refusing: no cache ecosystem `{0}`; to fix: use one of: {list}", list = names())]
    UnknownEcosystem(String),
    /// The project has none of the ecosystem's lockfiles.
    #[error("refusing: this project has no {eco} lockfile ({files}); to fix: commit one (e.g. `{hint}`), then refresh")]
    NoLockfile {
        /// The ecosystem.
        eco: &'static str,
        /// How to make one.
        hint: &'static str,
        /// The lockfiles looked for.
        files: String,
    },
    /// A lockfile that cannot be read safely.
    #[error("refusing: the lockfile {path} is {why}; to fix: make it a regular file under {cap} MiB at the project root", cap = LOCKFILE_CAP >> 20)]
    BadLockfile {
        /// Which.
        path: PathBuf,
        /// What it is instead.
        why: String,
    },
    /// `refresh` without the project-declared registry profile.
    /// The message's first line is the refusal; the profile follows on its own lines, which the
    /// binary prints as they are (after escaping each), so it can be pasted.
    #[error("refusing: refreshing the {eco} cache needs a profile `{profile}` in .h5i/env.toml whose egress is the registry hosts and nothing else ({why}); to fix: add this to .h5i/env.toml (adjust the hosts to your registry):\n{text}")]
    NoRegistryProfile {
        /// The ecosystem.
        eco: &'static str,
        /// The profile name looked for.
        profile: String,
        /// What was wrong with what is there.
        why: String,
        /// The profile, ready to paste.
        text: String,
    },
    /// The install step failed; nothing was stored.
    #[error("refusing: the {eco} install step exited {code} in the refresh box (receipt {receipt}; egress {egress}); nothing was stored; to fix: check the registry profile's hosts and the lockfile, then refresh again")]
    InstallFailed {
        /// The ecosystem.
        eco: &'static str,
        /// Its exit code.
        code: i32,
        /// The receipt of the run.
        receipt: u64,
        /// The egress tally, one line.
        egress: String,
    },
    /// The built tree could not be kept; nothing was stored.
    #[error("refusing: the {eco} install succeeded but its node_modules could not be kept ({why}; receipt {receipt} of the refresh box); nothing was stored; to fix: check that the refresh box runs node, then refresh again")]
    TreeNotKept {
        /// The ecosystem.
        eco: &'static str,
        /// The receipt of the copy.
        receipt: u64,
        /// What went wrong.
        why: String,
    },
    /// A uv or Poetry lockfile that does not pin a package the cache can hold.
    #[error("refusing: {file} {why}; to fix: lock every package from a registry with its hashes (`uv lock`, `poetry lock`), commit it, then refresh")]
    UnlockedPackage {
        /// The lockfile.
        file: &'static str,
        /// Which package and why.
        why: String,
    },
    /// No cache of that ecosystem to remove.
    #[error("refusing: there is no {0} cache on this clone; to fix: `h5i box cache ls` lists what there is")]
    NoCache(&'static str),
    /// A box-store refusal on the way.
    #[error(transparent)]
    Box(#[from] BoxError),
}

fn names() -> String {
    ECOSYSTEMS
        .iter()
        .map(|e| e.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The ecosystem called `name`.
pub fn ecosystem(name: &str) -> Result<&'static Ecosystem, CacheError> {
    ECOSYSTEMS
        .iter()
        .find(|e| e.name == name)
        .ok_or_else(|| CacheError::UnknownEcosystem(name.to_string()))
}

impl Ecosystem {
    /// The custom profile `refresh` runs under.
    pub fn profile_name(&self) -> String {
        format!("cache-{}", self.name)
    }

    /// The registry hosts the host's configuration makes the package manager reach: `mirror`'s,
    /// after the default registry's unless `mirror` replaces it. The only egress a refresh box
    /// may be granted, and what the ready-to-paste profile names.
    pub fn registry_hosts(&self, mirror: &mirror::Mirror) -> Vec<String> {
        let mut hosts: Vec<String> = if mirror.replaces_default && !mirror.hosts.is_empty() {
            Vec::new()
        } else {
            self.default_hosts.iter().map(|h| h.to_string()).collect()
        };
        for h in &mirror.hosts {
            if !hosts.contains(h) {
                hosts.push(h.clone());
            }
        }
        hosts
    }

    /// The profile `refresh` asks for, ready to paste into `.h5i/env.toml`, naming the hosts
    /// of the host's configured mirror.
    pub fn profile_text(&self, mirror: &mirror::Mirror) -> String {
        let hosts = self
            .registry_hosts(mirror)
            .iter()
            .map(|h| format!("\"{h}\""))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "[profile.{p}]\nisolation = \"supervised\"\n[profile.{p}.net]\negress = [{hosts}]\n",
            p = self.profile_name()
        )
    }

    /// The variables pointing an agent box's package manager at `data`.
    pub fn env_for(&self, data: &Path) -> Vec<String> {
        with_dir(self.env, data)
    }

    /// The variables pointing the refresh box's install step at `data`.
    pub fn fill_env_for(&self, data: &Path) -> Vec<String> {
        with_dir(self.fill_env, data)
    }

    /// The install step with `{dir}` made `data`.
    pub fn install_for(&self, data: &Path) -> Vec<String> {
        let dir = data.display().to_string();
        self.install
            .iter()
            .map(|a| a.replace("{dir}", &dir))
            .collect()
    }

    /// Every variable name this ecosystem sets in any box.
    pub fn var_names(&self) -> impl Iterator<Item = &'static str> {
        self.env
            .iter()
            .chain(self.fill_env)
            .map(|(k, _)| *k)
            .chain(self.tree.as_ref().map(|t| t.var))
    }

    /// The key of the project rooted at `root`: `None` when it has none of the lockfiles.
    /// Each lockfile is opened beneath `root` without following a symlink (a box's workspace
    /// is hostile), and a present-but-unreadable one is refused rather than skipped.
    pub fn key_of(&self, root: &Path) -> Result<Option<String>, CacheError> {
        let mut h = Sha256::new();
        let mut any = false;
        for name in self.lockfiles {
            h.update(name.as_bytes());
            h.update([0]);
            match crate::bounded::open_regular(root, Path::new(name), LOCKFILE_CAP) {
                Ok((mut f, size)) => {
                    any = true;
                    let mut bytes = Vec::with_capacity(size as usize);
                    f.read_to_end(&mut bytes)
                        .map_err(|e| CacheError::BadLockfile {
                            path: root.join(name),
                            why: format!("unreadable ({e})"),
                        })?;
                    h.update((bytes.len() as u64).to_le_bytes());
                    h.update(&bytes);
                }
                Err(crate::bounded::Skip::Missing) => h.update(b"absent"),
                Err(skip) => {
                    return Err(CacheError::BadLockfile {
                        path: root.join(name),
                        why: skip.to_string(),
                    })
                }
            }
        }
        if !any {
            return Ok(None);
        }
        let d = h.finalize();
        Ok(Some(format!("{:x}", d)[..32].to_string()))
    }
}

fn with_dir(vars: &[(&str, &str)], data: &Path) -> Vec<String> {
    vars.iter()
        .map(|(k, v)| format!("{k}={}", v.replace("{dir}", &data.display().to_string())))
        .collect()
}

/// `.git/.h5i/cache` of one clone.
#[derive(Debug, Clone)]
pub struct CacheRoot {
    /// The directory.
    pub dir: PathBuf,
}

impl CacheRoot {
    /// The cache root of the store.
    pub fn of(store: &crate::store::BoxStore) -> CacheRoot {
        CacheRoot {
            dir: store.common_dir.join(".h5i").join("cache"),
        }
    }

    /// The cache root of the clone a box lives in (`<common>/.h5i/env/<agent>/<box>`), or None
    /// when the box directory is not laid out that way.
    pub fn of_box(sb: &crate::store::StoredBox) -> Option<CacheRoot> {
        let env = sb.paths.dir.parent()?.parent()?;
        let h5i = env.parent()?;
        (env.file_name()? == "env" && h5i.file_name()? == ".h5i").then(|| CacheRoot {
            dir: h5i.join("cache"),
        })
    }

    /// Where one ecosystem's caches live.
    pub fn eco_dir(&self, eco: &Ecosystem) -> PathBuf {
        self.dir.join(eco.name)
    }

    /// The directory of the cache of `eco` under `key`.
    pub fn entry(&self, eco: &Ecosystem, key: &str) -> PathBuf {
        self.eco_dir(eco).join(key)
    }

    /// The part of an entry a box gets.
    pub fn data(&self, eco: &Ecosystem, key: &str) -> PathBuf {
        self.entry(eco, key).join("data")
    }

    /// The directory of `eco`'s built tree under `key` ([`KeptTree`]): `tree/node_modules`.
    pub fn tree(&self, eco: &Ecosystem, key: &str) -> PathBuf {
        self.entry(eco, key).join("tree").join("node_modules")
    }

    /// The entry of `eco` under `key` as `refresh` leaves it, or why it is not: every directory
    /// a box could be handed ([`real_dir`]), and a `refresh.json` (not followed) naming this
    /// ecosystem and this key, whose tree, when it records one, is there too.
    pub fn verify(&self, eco: &Ecosystem, key: &str) -> Result<RefreshRecord, String> {
        let entry = self.entry(eco, key);
        real_dir(&self.dir)?;
        real_dir(&self.eco_dir(eco))?;
        real_dir(&entry)?;
        real_dir(&entry.join("data"))?;
        let (mut f, size) =
            crate::bounded::open_regular(&entry, Path::new("refresh.json"), RECORD_CAP)
                .map_err(|skip| format!("its refresh.json is {skip}"))?;
        let mut bytes = Vec::with_capacity(size as usize);
        f.read_to_end(&mut bytes)
            .map_err(|e| format!("its refresh.json is unreadable ({e})"))?;
        let record: RefreshRecord = serde_json::from_slice(&bytes)
            .map_err(|e| format!("its refresh.json is not a refresh record ({e})"))?;
        if record.eco != eco.name || record.key != key {
            return Err(format!(
                "its refresh.json is the record of the {} cache {}, not of {} {key}",
                record.eco.escape_debug(),
                record.key.escape_debug(),
                eco.name
            ));
        }
        if let Some(tree) = &record.tree {
            if !is_platform(&tree.platform) {
                return Err(format!(
                    "its tree's platform {:?} is malformed",
                    tree.platform.escape_debug().to_string()
                ));
            }
            real_dir(&entry.join("tree"))?;
            real_dir(&self.tree(eco, key))?;
        }
        Ok(record)
    }

    /// The keys stored for `eco` (complete entries only: a key-named directory or symlink, not
    /// followed, and no leading dot, which marks a refresh in progress). A listed key is not yet
    /// one a box may get: [`CacheRoot::verify`] says that (and refuses the symlink).
    pub fn keys(&self, eco: &Ecosystem) -> Result<Vec<String>, CacheError> {
        let dir = self.eco_dir(eco);
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(BoxError::io(&dir, e).into()),
        };
        let mut keys = Vec::new();
        for entry in rd {
            let entry = entry.map_err(|e| BoxError::io(&dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if is_key(&name)
                && entry
                    .file_type()
                    .is_ok_and(|t| t.is_dir() || t.is_symlink())
            {
                keys.push(name);
            }
        }
        keys.sort();
        Ok(keys)
    }
}

/// Whether `name` has the shape of a key (so nothing else under the cache is ever taken for one).
pub fn is_key(name: &str) -> bool {
    name.len() == 32
        && name
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// What `refresh` observed, stored beside the data as `refresh.json`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RefreshRecord {
    /// Schema version.
    pub v: u32,
    /// The ecosystem.
    pub eco: String,
    /// The key.
    pub key: String,
    /// When the refresh finished, ms since the epoch.
    pub at_ms: u64,
    /// The install step.
    pub argv: Vec<String>,
    /// Its wall time, ms.
    pub wall_ms: u64,
    /// The policy digest of the refresh box.
    pub policy_digest: String,
    /// The egress the install made (host-observed by the sentry).
    pub egress: Option<h5i_policy::receipt::EgressTally>,
    /// Bytes stored.
    pub bytes: u64,
    /// npm, pnpm and Yarn: the built `node_modules` stored beside the download cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<TreeRecord>,
}

/// What a built `node_modules` was built for. npm leaves out an optional package whose `os`,
/// `cpu` or `libc` does not match (the esbuild and @swc pattern), and a native addon is built
/// for one node ABI, so a tree is right only for the platform, libc and node of the box that
/// built it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TreeRecord {
    /// `<platform>-<arch>-<libc>-abi<N>` as node in the refresh box reported it
    /// (`process.platform`, `process.arch`, glibc or other, `process.versions.modules`).
    pub platform: String,
    /// The node binary that built it, as the host sees it: the process and supervised tiers run
    /// the host's `/usr`, so the same binary is the same platform and ABI.
    pub node: NodeBinary,
}

/// One node binary's identity: where `PATH` finds it (resolved) and its inode's stat.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeBinary {
    /// The resolved path.
    pub path: PathBuf,
    /// Device.
    pub dev: u64,
    /// Inode.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, ns since the epoch.
    pub mtime_ns: i64,
}

impl NodeBinary {
    /// The node a kernel-tier box's `PATH` finds first on this host, or None.
    pub fn on_box_path() -> Option<NodeBinary> {
        use std::os::unix::fs::MetadataExt;
        let found = crate::agent::BOX_PATH_DIRS
            .iter()
            .map(|d| Path::new(d).join("node"))
            .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file()))?;
        let path = std::fs::canonicalize(found).ok()?;
        let m = std::fs::metadata(&path).ok()?;
        Some(NodeBinary {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            path,
        })
    }
}

/// Whether `s` is a platform stamp as the refresh box writes it.
pub fn is_platform(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    let word = |p: &str| {
        !p.is_empty()
            && p.len() <= 16
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    parts.len() == 4
        && word(parts[0])
        && word(parts[1])
        && matches!(parts[2], "glibc" | "other")
        && parts[3]
            .strip_prefix("abi")
            .is_some_and(|n| !n.is_empty() && n.len() <= 6 && n.bytes().all(|b| b.is_ascii_digit()))
}

/// A directory of a cache entry, checked without following it: a real directory the caller
/// owns that no one else may write.
fn real_dir(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let m = path
        .symlink_metadata()
        .map_err(|e| format!("{} cannot be read ({e})", path.display()))?;
    let euid = h5i_sys::ids::euid();
    if m.file_type().is_symlink() {
        Err(format!("{} is a symlink", path.display()))
    } else if !m.is_dir() {
        Err(format!("{} is not a directory", path.display()))
    } else if m.uid() != euid {
        Err(format!(
            "{} is owned by uid {}, not {euid}",
            path.display(),
            m.uid()
        ))
    } else if m.mode() & 0o022 != 0 {
        Err(format!(
            "{} is writable by others (mode {:o})",
            path.display(),
            m.mode() & 0o7777
        ))
    } else {
        Ok(())
    }
}

/// The size of a tree in bytes (symlinks counted as themselves, never followed).
pub fn tree_bytes(root: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in rd.flatten() {
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total += meta.len();
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_follows_the_lockfile_bytes_and_nothing_else() {
        let eco = ecosystem("npm").unwrap();
        let d = tempfile::tempdir().unwrap();
        assert_eq!(eco.key_of(d.path()).unwrap(), None);
        std::fs::write(d.path().join("package-lock.json"), "{\"a\":1}").unwrap();
        let k1 = eco.key_of(d.path()).unwrap().unwrap();
        assert!(is_key(&k1), "{k1}");
        std::fs::write(d.path().join("package.json"), "{}").unwrap();
        assert_eq!(eco.key_of(d.path()).unwrap().unwrap(), k1);
        std::fs::write(d.path().join("package-lock.json"), "{\"a\":2}").unwrap();
        assert_ne!(eco.key_of(d.path()).unwrap().unwrap(), k1);
    }

    #[test]
    fn a_symlinked_lockfile_is_refused_not_followed() {
        let eco = ecosystem("npm").unwrap();
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("elsewhere"), "{}").unwrap();
        std::os::unix::fs::symlink(
            d.path().join("elsewhere"),
            d.path().join("package-lock.json"),
        )
        .unwrap();
        assert!(matches!(
            eco.key_of(d.path()),
            Err(CacheError::BadLockfile { .. })
        ));
    }

    #[test]
    fn the_ready_to_paste_profile_parses_and_names_only_the_registry() {
        for eco in ECOSYSTEMS {
            let mirror = mirror::Mirror {
                hosts: vec!["mirror.example.com:443".into()],
                replaces_default: true,
                ..mirror::Mirror::default()
            };
            for text in [
                eco.profile_text(&mirror::Mirror::default()),
                eco.profile_text(&mirror),
            ] {
                let f = h5i_policy::parse_env_file(Path::new(".h5i/env.toml"), &text).unwrap();
                assert_eq!(
                    f.profile_names().collect::<Vec<_>>(),
                    [eco.profile_name().as_str()]
                );
            }
            assert!(eco
                .profile_text(&mirror)
                .contains("egress = [\"mirror.example.com:443\"]"));
        }
    }

    #[test]
    fn an_unknown_ecosystem_is_refused_naming_the_known_ones() {
        let e = ecosystem("maven").unwrap_err().to_string();
        assert!(e.starts_with("refusing: ") && e.contains("npm"), "{e}");
    }
}
