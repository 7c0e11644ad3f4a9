//! The host-side values a box's policy makes secret: resolved for one run, scrubbed everywhere
//! else.
//!
//! Owns the box's fingerprint key (`<box>/secret.key`, host-only, never mounted), resolving a
//! policy's grants for a run through the broker (fail closed), the dry run `h5i box secrets`
//! prints, and the [`Redactor`] loaded with every value the host holds now. Must never: print,
//! store or pass a value anywhere but into the one run's environment.
//!
//! Guarded by `tests/secrets.rs`.

use std::io::Read;

use h5i_broker::redact::{Redactor, SecretValue};
use h5i_broker::secrets::{ResolvedSecret, SecretCheck};
use h5i_policy::ResolvedPolicy;

use crate::error::BoxError;
use crate::store::StoredBox;

fn host_env(var: &str) -> Option<String> {
    std::env::var(var).ok()
}

/// The box's fingerprint key, made on first use (32 bytes from the kernel's CSPRNG, mode 0600).
pub fn box_key(sb: &StoredBox) -> Result<Vec<u8>, BoxError> {
    let path = sb.paths.dir.join("secret.key");
    match std::fs::read(&path) {
        Ok(k) if k.len() == 32 => return Ok(k),
        Ok(_) => {
            return Err(BoxError::Corrupt {
                path,
                what: "not a 32-byte key".into(),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(BoxError::io(&path, e)),
    }
    let mut key = vec![0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut key))
        .map_err(|e| BoxError::io(std::path::Path::new("/dev/urandom"), e))?;
    crate::store::write_atomic(&path, &key)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| BoxError::io(&path, e))?;
    Ok(key)
}

/// Resolve every declared secret for one run, or refuse before anything starts.
pub fn resolve_for_run(policy: &ResolvedPolicy) -> Result<Vec<ResolvedSecret>, BoxError> {
    Ok(h5i_broker::secrets::resolve(&policy.secrets, host_env)?)
}

/// `h5i box secrets NAME`: the grants, and how each would resolve now (fingerprints only).
pub fn dry_run(sb: &StoredBox, policy: &ResolvedPolicy) -> Result<Vec<SecretCheck>, BoxError> {
    let key = box_key(sb)?;
    Ok(h5i_broker::secrets::check(&policy.secrets, host_env, &key))
}

/// A redactor for everything this policy treats as secret, with values read from the host's
/// environment (a grant whose source is unset has nothing to scrub).
pub fn redactor_for(policy: &ResolvedPolicy) -> Redactor {
    redactor_with(policy, Vec::new())
}

/// The redactor an export (or apply) scans with, and the grants it could not scan for.
#[derive(Debug)]
pub struct ExportRedactor {
    /// Every resolvable granted secret and credential, literal and encoded.
    pub redactor: Redactor,
    /// Grants skipped under `--skip-secret-check` (`NAME (env:VAR)`), for report.md's first
    /// lines. Empty unless skipping was asked for.
    pub unchecked: Vec<String>,
}

/// Resolve every granted secret in this shell for an export, refusing (naming the variable)
/// when one is unset unless `skip_unresolved`; then the redactor over all of them. The scan is
/// only as good as the values it has: a grant exported from a shell that lacks it would
/// otherwise pass the box's copy of it through.
pub fn redactor_for_export(
    policy: &ResolvedPolicy,
    skip_unresolved: bool,
    verb: &'static str,
) -> Result<ExportRedactor, BoxError> {
    let mut unchecked = Vec::new();
    for grant in &policy.secrets {
        let h5i_policy::SecretSource::Env(var) = &grant.source;
        if host_env(var).is_some_and(|v| !v.is_empty()) {
            continue;
        }
        if !skip_unresolved {
            return Err(BoxError::SecretUnchecked {
                verb,
                name: grant.name.clone(),
                source_desc: grant.source.to_string(),
                var: var.clone(),
            });
        }
        unchecked.push(format!("{} ({})", grant.name, grant.source));
    }
    Ok(ExportRedactor {
        redactor: redactor_for(policy),
        unchecked,
    })
}

/// [`redactor_for`], plus `extra` values (a run's credential-proxy dummies).
pub fn redactor_with(policy: &ResolvedPolicy, extra: Vec<SecretValue>) -> Redactor {
    let mut values = extra;
    for grant in &policy.secrets {
        let h5i_policy::SecretSource::Env(var) = &grant.source;
        if let Some(v) = host_env(var) {
            values.push(SecretValue::new(format!("secret:{}", grant.name), v));
        }
    }
    for (env, _) in policy.auth.iter().flat_map(|a| a.credential_choices()) {
        if let Ok(v) = std::env::var(env) {
            values.push(SecretValue::new(format!("credential:{env}"), v));
        }
    }
    Redactor::new(values)
}

/// Secret files for one workspace-tier run, removed when dropped.
pub struct SecretFiles {
    dir: Option<std::path::PathBuf>,
}

impl Drop for SecretFiles {
    fn drop(&mut self) {
        if let Some(d) = self.dir.take() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Inject resolved secrets into a workspace-tier command: `inject = "env"` as the variable
/// `<NAME>`; `inject = "file"` as a 0600 file in a private directory outside the box directory,
/// named by `H5I_SECRET_FILE_<NAME>`, removed after the run.
pub fn inject_workspace(
    cmd: &mut std::process::Command,
    secrets: &[ResolvedSecret],
) -> Result<SecretFiles, BoxError> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let mut files = SecretFiles { dir: None };
    for s in secrets {
        match s.inject {
            h5i_policy::SecretInject::Env => {
                cmd.env(&s.name, s.value());
            }
            h5i_policy::SecretInject::File => {
                let dir = match &files.dir {
                    Some(d) => d.clone(),
                    None => {
                        let d = crate::tier_host::runtime_dir()?.join(format!(
                            "secrets-{}-{}",
                            std::process::id(),
                            crate::store::now_ms()
                        ));
                        std::fs::DirBuilder::new()
                            .mode(0o700)
                            .create(&d)
                            .map_err(|e| BoxError::io(&d, e))?;
                        files.dir = Some(d.clone());
                        d
                    }
                };
                let path = dir.join(&s.name);
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)
                    .and_then(|mut f| std::io::Write::write_all(&mut f, s.value().as_bytes()))
                    .map_err(|e| BoxError::io(&path, e))?;
                cmd.env(format!("H5I_SECRET_FILE_{}", s.name), &path);
            }
        }
    }
    Ok(files)
}
