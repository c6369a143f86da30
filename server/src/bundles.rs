//! Bundles a worker holds, by digest. `kubexm bundle add FILE` copies the
//! bundle (never a link: the operator's file could be rewritten after the
//! check) into a directory only its owner writes, checks the signature of
//! that copy, and keeps it read-only for others as `<dir>/<hex>.tar.zst`
//! with its signature beside it; API jobs name a bundle by that digest,
//! and the worker checks, while unpacking, that the bundle is that one. A bundle's digest is the sha256 of its
//! signed `bundle.yaml`, which lists the sha256 of every member: the same
//! digest the installer prints when it checks the signature. A differential
//! bundle is held only beside its base (added first), and a job that names
//! it unpacks the base too.

use std::path::{Path, PathBuf};

use kubexm_bundle::verify::{self, SignatureCheck};

/// Where a worker keeps its bundles unless told otherwise.
pub const BUNDLES_DIR: &str = "/var/lib/kubexm/bundles";

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error(transparent)]
    Verify(#[from] verify::VerifyError),
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{digest:?} is not a bundle digest: expected sha256:<64 hex digits> (`kubexm bundle list` shows them)")]
    BadDigest { digest: String },
    #[error("no bundle {digest} in {dir}: add it on this machine with `kubexm bundle add FILE --pubkey KEY`")]
    Unknown { digest: String, dir: String },
    #[error(
        "{bundle} is a differential bundle of base {digest}, which is not held in {dir}: add the base first (`kubexm bundle add BASE --pubkey KEY`)"
    )]
    NoBase { bundle: String, digest: String, dir: String },
    /// A differential bundle and the held base it names do not fit.
    #[error(transparent)]
    Base(#[from] kubexm_bundle::diff::DiffError),
}

/// A bundle held.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Held {
    /// `sha256:<hex>` of its `bundle.yaml`.
    pub digest: String,
    pub path: PathBuf,
    /// The cluster name and Kubernetes version it was built for.
    pub cluster: String,
    pub kubernetes: String,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BundleError + '_ {
    move |source| BundleError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn signature_of(bundle: &Path) -> PathBuf {
    PathBuf::from(format!("{}.minisig", bundle.display()))
}

/// Copies `file` into `dir`, checks the copy's signature with `pubkey` and
/// keeps it under its digest (0644 in a 0755 directory). Adding the same
/// bundle again changes nothing.
pub fn add(file: &Path, pubkey: &Path, dir: &Path) -> Result<Held, BundleError> {
    use std::os::unix::fs::PermissionsExt;
    fs_err::create_dir_all(dir).map_err(io(dir))?;
    fs_err::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).map_err(io(dir))?;
    // The copies are checked, not the originals: what is verified is what is kept.
    let tmp = |what: &str| dir.join(format!(".add-{}-{what}.tmp", std::process::id()));
    let (tmp_bundle, tmp_sig) = (tmp("bundle"), tmp("sig"));
    let copied = (|| {
        for (from, to) in [(file.to_path_buf(), &tmp_bundle), (signature_of(file), &tmp_sig)] {
            let _ = fs_err::remove_file(to);
            fs_err::copy(&from, to).map_err(io(&from))?;
            fs_err::set_permissions(to, std::fs::Permissions::from_mode(0o644)).map_err(io(to))?;
        }
        let check = SignatureCheck::load(&tmp_sig, pubkey)?;
        let v = verify::read_bundle(&tmp_bundle, Some(&check), &mut verify::ManifestOnly)?;
        base_of(dir, file, &v.manifest)?;
        Ok::<_, BundleError>(v)
    })();
    let v = match copied {
        Ok(v) => v,
        Err(e) => {
            let _ = fs_err::remove_file(&tmp_bundle);
            let _ = fs_err::remove_file(&tmp_sig);
            return Err(e);
        }
    };
    let hex = kubexm_bundle::digest::sha256_hex(v.text.as_bytes());
    let dest = dir.join(format!("{hex}.tar.zst"));
    // Whole or not at all: renamed into place, the signature first.
    fs_err::rename(&tmp_sig, signature_of(&dest)).map_err(io(&dest))?;
    fs_err::rename(&tmp_bundle, &dest).map_err(io(&dest))?;
    Ok(Held {
        digest: format!("sha256:{hex}"),
        path: dest,
        cluster: v.manifest.name.clone(),
        kubernetes: v.manifest.lock.kubernetes_version.clone(),
    })
}

/// The file of bundle `digest` in `dir`.
pub fn find(dir: &Path, digest: &str) -> Result<PathBuf, BundleError> {
    // Exactly the OpenAPI document's pattern: ^sha256:[0-9a-f]{64}$.
    let hex = digest.strip_prefix("sha256:").unwrap_or("");
    if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(BundleError::BadDigest {
            digest: crate::text::line(digest).into_owned(),
        });
    }
    let p = dir.join(format!("{hex}.tar.zst"));
    if p.is_file() {
        Ok(p)
    } else {
        Err(BundleError::Unknown {
            digest: format!("sha256:{hex}"),
            dir: dir.display().to_string(),
        })
    }
}

/// The held base of the differential bundle `file` (whose `bundle.yaml`
/// is `m`), checked to fit it; `None` for a full bundle. A differential is
/// held only beside its base: add the base first.
pub fn base_of(dir: &Path, file: &Path, m: &kubexm_bundle::manifest::BundleManifest) -> Result<Option<PathBuf>, BundleError> {
    let Some(want) = &m.base else { return Ok(None) };
    let base = find(dir, &want.digest).map_err(|_| BundleError::NoBase {
        bundle: file.display().to_string(),
        digest: want.digest.clone(),
        dir: dir.display().to_string(),
    })?;
    let head = verify::read_head(&base)?;
    kubexm_bundle::diff::check_base(
        m,
        &file.display().to_string(),
        &head.manifest,
        &head.digest,
        &base.display().to_string(),
    )?;
    Ok(Some(base))
}

/// The digests of the bundles in `dir`, sorted.
pub fn list(dir: &Path) -> Result<Vec<String>, BundleError> {
    let mut out = Vec::new();
    let Ok(rd) = fs_err::read_dir(dir) else {
        return Ok(out);
    };
    for e in rd {
        let name = e.map_err(io(dir))?.file_name().to_string_lossy().to_string();
        if let Some(hex) = name.strip_suffix(".tar.zst").filter(|h| h.len() == 64 && !h.starts_with('.')) {
            out.push(format!("sha256:{hex}"));
        }
    }
    out.sort();
    Ok(out)
}
