//! The image a container box runs: looked up in the engine user's Podman storage (never
//! pulled) and pinned by id the first time the box uses it.
//!
//! Owns `<box>/container-image.json` (host-written; no grant of the box reaches its
//! directory): the name the policy gave, the image id and its digest. Every run names the
//! pinned id, so re-tagging the name later cannot change what a box runs, and the run's
//! evidence names the image without asking Podman again. Must never: pull, run an image
//! other than the pinned one, or pin an image whose own annotations hold an `h5i.` key (Podman
//! passes them to h5i-runc as if h5i had set them).
//!
//! Guarded by `tests/container_tier.rs`.

use h5i_log::Traced as _;
use std::path::Path;
use std::process::Stdio;

use serde::{Deserialize, Serialize};

use super::engine::Engine;
use crate::error::BoxError;
use crate::store::StoredBox;

/// The file, beside the box's manifest.
pub const PIN_FILE: &str = "container-image.json";

/// An image as Podman's storage holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedImage {
    /// The reference the policy names.
    pub name: String,
    /// Podman's image id (`sha256:` hex).
    pub id: String,
    /// The manifest digest, when Podman knows one (`sha256:...`).
    pub digest: Option<String>,
    /// For a Codex box: why h5i's tee shim is not the shell its agent runs commands through
    /// in this image (`super::check_shim_image`), when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shim_not_agent_shell: Option<String>,
}

/// Look `name` up in the engine's storage: `Ok(None)` when it is not there.
pub fn inspect(engine: &Engine, name: &str) -> Result<Option<PinnedImage>, BoxError> {
    let out = engine
        .podman()
        .args([
            "image",
            "inspect",
            "--format",
            "{{.Id}} {{.Digest}} {{json .Annotations}}",
            "--",
            name,
        ])
        .stdin(Stdio::null())
        .traced()
        .output()
        .map_err(|e| BoxError::BadRequest {
            what: format!("cannot run podman as `{}`: {e}", engine.user),
            mend: "install Podman (apt-get install podman) and make sure it is on PATH".into(),
        })?;
    if !out.status.success() {
        return Ok(None);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = text.trim_end().splitn(3, ' ');
    let Some(id) = words
        .next()
        .filter(|id| id.len() >= 12 && id.bytes().all(|b| b.is_ascii_hexdigit()))
    else {
        return Ok(None);
    };
    let digest = words
        .next()
        .filter(|d| d.starts_with("sha256:") && d.len() > 7)
        .map(str::to_owned);
    refuse_h5i_annotations(name, words.next().unwrap_or("null"))?;
    Ok(Some(PinnedImage {
        name: name.to_owned(),
        id: format!("sha256:{id}"),
        digest,
        shim_not_agent_shell: None,
    }))
}

/// Refuse an image whose own annotations (`annotations_json`, as `podman image inspect`
/// prints them) hold an `h5i.` key: Podman copies an image's annotations into the spec it
/// hands the runtime, where h5i-runc cannot tell them from h5i's, and those keys widen what the
/// box may do (`h5i.net.families` grants socket families, `h5i.net.unix` the unix socket) or
/// name host paths h5i-runc writes (`h5i.evidence.spec`, `h5i.log.dir`, `h5i.net.dir`).
fn refuse_h5i_annotations(name: &str, annotations_json: &str) -> Result<(), BoxError> {
    let notes: std::collections::BTreeMap<String, serde_json::Value> =
        serde_json::from_str::<Option<_>>(annotations_json)
            .map_err(|e| BoxError::BadRequest {
                what: format!("cannot read the annotations of image `{name}`: {e}"),
                mend: format!("check the image with `podman image inspect {name}`"),
            })?
            .unwrap_or_default();
    let keys: Vec<&str> = notes
        .keys()
        .map(String::as_str)
        .filter(|k| k.starts_with("h5i."))
        .collect();
    if keys.is_empty() {
        return Ok(());
    }
    Err(BoxError::BadRequest {
        what: format!(
            "image `{name}` carries the annotation(s) {}, which Podman would hand h5i-runc as \
             if h5i had set them (they widen the box's sockets or name host paths h5i-runc \
             writes)",
            keys.join(", ")
        ),
        mend: "use an image without `h5i.*` annotations (rebuild it without them, or remove \
               them: `buildah config --annotation KEY- IMAGE`)"
            .into(),
    })
}

/// The refusal for an image the engine does not hold.
pub fn missing(engine: &Engine, name: &str) -> BoxError {
    BoxError::BadRequest {
        what: format!(
            "image `{name}` is not in {}'s Podman storage, and container-tier runs never pull",
            engine.user
        ),
        mend: format!(
            "build or import it as that user (`make images`, or `podman load`/`podman import`), then retry; `runuser -u {0} -- podman images` lists what is there",
            engine.user
        ),
    }
}

/// The box's pinned image: the stored pin, or `name` looked up and pinned now.
pub fn pinned(engine: &Engine, sb: &StoredBox, name: &str) -> Result<PinnedImage, BoxError> {
    let path = sb.paths.dir.join(PIN_FILE);
    if let Some(pin) = read_pin(&path)? {
        if pin.name == name {
            return Ok(pin);
        }
    }
    let pin = inspect(engine, name)?.ok_or_else(|| missing(engine, name))?;
    write_pin(&sb.paths.dir, &pin)?;
    Ok(pin)
}

/// Store `pin` in the box directory `dir`.
pub fn write_pin(dir: &Path, pin: &PinnedImage) -> Result<(), BoxError> {
    let path = dir.join(PIN_FILE);
    let text = serde_json::to_vec_pretty(pin).map_err(|e| BoxError::Corrupt {
        path: path.clone(),
        what: e.to_string(),
    })?;
    crate::store::write_atomic(&path, &text)
}

/// The stored pin, if any.
pub fn read_pin(path: &Path) -> Result<Option<PinnedImage>, BoxError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| BoxError::Corrupt {
                path: path.to_path_buf(),
                what: e.to_string(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(BoxError::io(path, e)),
    }
}

/// The images the engine holds (`repository:tag`), for `box probe`.
pub fn present(engine: &Engine) -> Result<Vec<String>, String> {
    let out = engine
        .podman()
        .args(["images", "--format", "{{.Repository}}:{{.Tag}}"])
        .stdin(Stdio::null())
        .traced()
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
    }
    let mut v: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("<none>"))
        .map(str::to_owned)
        .collect();
    v.sort();
    v.dedup();
    Ok(v)
}
