//! Bundles a worker holds, by digest. `kubexm bundle add FILE` checks the
//! bundle's signature and keeps a copy (a hard link when the file system
//! allows) as `<dir>/<hex>.tar.zst` with its signature beside it; API jobs
//! name a bundle by that digest. A bundle's digest is the sha256 of its
//! signed `bundle.yaml`, which lists the sha256 of every member: the same
//! digest the installer prints when it checks the signature.

use std::path::{Path, PathBuf};

use kubexm_bundle::verify::{self, SignatureCheck, Sink};

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

/// Reads only `bundle.yaml` (the rest of the file is hashed for the
/// signature, not unpacked).
struct ManifestOnly;

impl Sink for ManifestOnly {
    fn start(&mut self, _: &str) -> std::io::Result<bool> {
        Ok(false)
    }
    fn member(&mut self, _: &str, _: u64, _: &mut dyn std::io::Read) -> std::io::Result<()> {
        Ok(())
    }
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

/// Checks `file`'s signature with `pubkey` and keeps it in `dir` under its
/// digest. Adding the same bundle again changes nothing.
pub fn add(file: &Path, pubkey: &Path, dir: &Path) -> Result<Held, BundleError> {
    let check = SignatureCheck::load(&signature_of(file), pubkey)?;
    let v = verify::read_bundle(file, Some(&check), &mut ManifestOnly)?;
    let hex = kubexm_bundle::digest::sha256_hex(v.text.as_bytes());
    fs_err::create_dir_all(dir).map_err(io(dir))?;
    let dest = dir.join(format!("{hex}.tar.zst"));
    for (from, to) in [(signature_of(file), signature_of(&dest)), (file.to_path_buf(), dest.clone())] {
        if to.exists() {
            continue;
        }
        // Whole or not at all: a temporary name, then a rename.
        let tmp = dir.join(format!(".{hex}.{}.tmp", std::process::id()));
        let _ = fs_err::remove_file(&tmp);
        if std::fs::hard_link(&from, &tmp).is_err() {
            fs_err::copy(&from, &tmp).map_err(io(&tmp))?;
        }
        fs_err::rename(&tmp, &to).map_err(io(&to))?;
    }
    Ok(Held {
        digest: format!("sha256:{hex}"),
        path: dest,
        cluster: v.manifest.name.clone(),
        kubernetes: v.manifest.lock.kubernetes_version.clone(),
    })
}

/// The file of bundle `digest` in `dir`.
pub fn find(dir: &Path, digest: &str) -> Result<PathBuf, BundleError> {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(BundleError::BadDigest { digest: digest.into() });
    }
    let p = dir.join(format!("{}.tar.zst", hex.to_ascii_lowercase()));
    if p.is_file() {
        Ok(p)
    } else {
        Err(BundleError::Unknown {
            digest: format!("sha256:{hex}"),
            dir: dir.display().to_string(),
        })
    }
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
