//! Verify and unpack a bundle into `<root>/bundles/<id>/`.
//!
//! The signature is checked before anything is decompressed. Members are
//! then checked while they stream (see `kubexm_bundle::verify`) and written
//! into a temporary directory beside the target, which is renamed into place
//! only when every member checked out. A failure removes the temporary
//! directory; nothing is written outside it. The id is the sha256 of
//! `bundle.yaml`, which pins every member, so unpacking the same bundle again
//! finds the finished directory and does nothing.

use std::io::{self, Read};
use std::path::{Path, PathBuf};

use kubexm_bundle::digest::sha256_hex;
use kubexm_bundle::manifest::{BundleManifest, MANIFEST_NAME};
use kubexm_bundle::verify::{self, Sink};

/// Marks a finished unpack.
pub const COMPLETE: &str = ".kubexm-complete";

/// How the bundle's origin is established.
#[derive(Debug, Clone)]
pub enum Trust {
    /// Verify `<bundle>.minisig` with this public key.
    PublicKey(PathBuf),
    /// No signature check, by explicit request.
    Unsigned,
}

#[derive(Debug)]
pub struct Unpacked {
    pub dir: PathBuf,
    pub manifest: BundleManifest,
    /// False when an earlier run had already unpacked it.
    pub fresh: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error(
        "{bundle} has no signature beside it ({sig} is missing); pass --pubkey with a signed bundle, or --allow-unsigned to accept it unverified"
    )]
    NoSignature { bundle: String, sig: String },
    #[error(transparent)]
    Verify(#[from] verify::VerifyError),
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> UnpackError + '_ {
    move |source| UnpackError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Verifies and unpacks `bundle` under `root/bundles`.
pub fn unpack(bundle: &Path, trust: &Trust, root: &Path) -> Result<Unpacked, UnpackError> {
    if let Trust::PublicKey(pk) = trust {
        let mut sig = bundle.as_os_str().to_owned();
        sig.push(".minisig");
        let sig = PathBuf::from(sig);
        if !sig.exists() {
            return Err(UnpackError::NoSignature {
                bundle: bundle.display().to_string(),
                sig: sig.display().to_string(),
            });
        }
        let comment = verify::verify_signature(bundle, &sig, pk)?;
        tracing::info!("signature good: {comment}");
    } else {
        tracing::warn!("{}: NOT VERIFIED: no signature check was made (--allow-unsigned)", bundle.display());
    }
    let (_, text) = verify::read_manifest_text(bundle)?;
    let id = sha256_hex(text.as_bytes());
    let bundles = root.join("bundles");
    let dir = bundles.join(&id);
    if dir.join(COMPLETE).exists() {
        let manifest = BundleManifest::from_yaml(&text).map_err(|why| verify::VerifyError::Format {
            bundle: bundle.display().to_string(),
            why,
        })?;
        return Ok(Unpacked {
            dir,
            manifest,
            fresh: false,
        });
    }
    fs_err::create_dir_all(&bundles).map_err(io_err(&bundles))?;
    let tmp = bundles.join(format!(".{id}.tmp-{}", std::process::id()));
    if tmp.exists() {
        fs_err::remove_dir_all(&tmp).map_err(io_err(&tmp))?;
    }
    fs_err::create_dir(&tmp).map_err(io_err(&tmp))?;
    let result = (|| {
        let manifest = verify::check_members(bundle, &mut DirSink { root: tmp.clone() })?;
        fs_err::write(tmp.join(MANIFEST_NAME), &text).map_err(io_err(&tmp))?;
        fs_err::write(tmp.join(COMPLETE), format!("{id}\n")).map_err(io_err(&tmp))?;
        if dir.exists() {
            // An unfinished directory from an older layout; replace it.
            fs_err::remove_dir_all(&dir).map_err(io_err(&dir))?;
        }
        fs_err::rename(&tmp, &dir).map_err(io_err(&dir))?;
        Ok(manifest)
    })();
    match result {
        Ok(manifest) => Ok(Unpacked {
            dir,
            manifest,
            fresh: true,
        }),
        Err(e) => {
            let _ = fs_err::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

/// Writes verified members under a directory. Paths were checked to be
/// relative with only normal components before they reach here.
struct DirSink {
    root: PathBuf,
}

impl Sink for DirSink {
    fn member(&mut self, path: &str, _size: u64, data: &mut dyn Read) -> io::Result<()> {
        let target = self.root.join(path);
        if !target.starts_with(&self.root) {
            return Err(io::Error::other(format!("{path} leaves the target directory")));
        }
        if let Some(parent) = target.parent() {
            fs_err::create_dir_all(parent)?;
        }
        let mut f = fs_err::OpenOptions::new().write(true).create_new(true).open(&target)?;
        io::copy(data, &mut f)?;
        Ok(())
    }
}
