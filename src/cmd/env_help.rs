//! The environment variables h5i reads, for `h5i --help` (after the commands) and h5i(1)
//! (clap_mangen renders it as the page's EXTRA section). `tests/cli_docs.rs` scans the
//! workspace's sources for every variable the code reads and insists it is named here.

/// The text: one variable (or a group of them) a line, what it does.
pub const TEXT: &str = "\
Environment (all optional):
  H5I_AGENT               box create --agent: the runtime a box is scoped to (claude, codex)
  H5I_DEFAULT_ISOLATION   box create --default-isolation: this clone's default tier
  H5I_CREDENTIAL_PROXY    box create --credential-proxy: 0 turns the credential proxy off
  H5I_SECRET_<NAME>       the default source of the secret grant <NAME> (one run, redacted)
  H5I_SKILL_DIR           where `h5i skill install` writes
  H5I_LOG                 tracing filter for h5i's own diagnostics on stderr, e.g. h5i=debug
                          (RUST_LOG when H5I_LOG is unset); every h5i binary reads it
  H5I_LOG_DIR             set by h5i for a container-tier run's OCI hooks (with H5I_LOG): where
                          they write the events h5i then shows on its own stderr
  H5I_NO_PROBE_CACHE      re-probe host capabilities instead of reusing the cached answer
  H5I_SANDBOX             off: a container per run instead of the long-lived box sandbox
  H5I_SANDBOX_IDLE_SECS   how long a box sandbox with no run stays up (default 600, at most
                          86400); a sandbox made with another idle time is rebuilt
  H5I_CONTAINER_USER      the engine user whose rootless Podman runs a root caller's
                          container boxes (overrides /etc/h5i/container.toml)
  H5I_TEST_HOSTS          test seam, with H5I_TEST_CA_FILE: name=ip:port pins for the
                          credential proxy and a DER test CA it trusts (both or neither)
  H5I_BLESS_SECCOMP       developers: rewrite the seccomp golden data in its unit test
Read on the host for `box cache refresh` (the mirror the refresh box fetches from):
  PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST, PIP_CONFIG_FILE (and pip.conf);
  GOPROXY, GOSUMDB, GONOSUMDB, GOPRIVATE, GONOPROXY, GOINSECURE, GOENV (and Go's env file);
  UV_DEFAULT_INDEX, UV_INDEX_URL, UV_INDEX, UV_EXTRA_INDEX_URL, UV_INSECURE_HOST,
  UV_CONFIG_FILE, UV_NO_CONFIG (and uv.toml), for the uv cache (poetry's uses pip's);
  NPM_CONFIG_REGISTRY and the other npm_config_* variables (any case; the user's and the
  global npmrc, npm's own, pnpm's rc; PREFIX, DESTDIR and PATH find the global one) for npm,
  pnpm and yarn, and YARN_REGISTRY, the other YARN_* variables and .yarnrc for yarn;
  CARGO_HOME (its config.toml: crates.io's source replacement, [registries]) and
  CARGO_REGISTRIES_<NAME>_INDEX for cargo; XDG_CONFIG_HOME, HOME. Never the project's own
  files: a cache-<eco> profile may grant egress to these registries' hosts and no other
Passed from the caller into a box's runs: TERM, LANG, LC_ALL, COLORTERM, NO_COLOR, and the
  variables a profile's `credential_env` names (read on the host, never seen in the box)
Also read: HOME, PATH, XDG_RUNTIME_DIR; CONTAINERS_CONF, CONTAINERS_STORAGE_CONF (for Podman);
  XDG_CACHE_HOME (the microvm tier's extracted guest kernels, under h5i/microvm)
Set by h5i inside a box (do not set them yourself): H5I_ENV_ID, H5I_ENV_POLICY_DIGEST,
  H5I_ENV_CAPTURE_SPOOL, H5I_SECRET_FILE_<NAME>, H5I_TEE_SHIM_NESTED (a Codex box's bash shim: a
  command inside a recorded command), H5I_NPM_TREE, H5I_PNPM_TREE, H5I_YARN_TREE (the cache's built
  node_modules, read-only, at the process and supervised tiers, where it is also overlaid as the
  workspace's node_modules: `npm install --offline --no-save`, `pnpm install --frozen-lockfile
  --offline` or `yarn install --frozen-lockfile --offline --ignore-scripts` then installs without
  unpacking a package)
Read inside a Claude box by h5i-hook before each run: ANTHROPIC_API_KEY (when it is h5i's
  per-run dummy, its suffix is approved in Claude Code's state), CLAUDE_CONFIG_DIR (where that
  state lives; else HOME)";
