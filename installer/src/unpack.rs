//! Verify and unpack a bundle into `<root>/bundles/<id>/`.
//!
//! The bundle is opened once and read in one pass (`kubexm_bundle::verify`):
//! the signature covers exactly the bytes that are decompressed, members
//! are checked while they stream and written into a temporary directory
//! beside the target, which is marked complete and renamed into place only
//! after the signature over the whole file checked out. A failure removes
//! the temporary directory; nothing is written outside it. The id is the sha256 of
//! `bundle.yaml`, which pins every member, so unpacking the same bundle again
//! finds the finished directory and does nothing.
//!
//! Before the signature has covered every byte, nothing read is trusted: the
//! members `bundle.yaml` declares must fit the target filesystem's free
//! space before the first is written, and no more than they declare is
//! written, so a zstd bomb beside a copied signature costs at most what its
//! `bundle.yaml` admits to, which the free space bounds.

use std::collections::BTreeMap;
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

impl UnpackError {
    /// As an operation's failure: a file that cannot be read or written is
    /// I/O, everything else a verification failure.
    pub fn classified(self) -> anyhow::Error {
        let kind = match &self {
            UnpackError::Io { .. } | UnpackError::Verify(verify::VerifyError::Io { .. }) => crate::ops::error::OpError::Io,
            _ => crate::ops::error::OpError::Verify,
        };
        crate::ops::error::op(kind, self)
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> UnpackError + '_ {
    move |source| UnpackError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Verifies and unpacks `bundle` under `root/bundles`, opening it once.
pub fn unpack(bundle: &Path, trust: &Trust, root: &Path) -> Result<Unpacked, UnpackError> {
    let check = signature_check(bundle, trust)?;
    // A signature that does not name bundle.yaml (minisign -S) cannot stop
    // a forged one before members are written: check it over the file first.
    if let Some(c) = check.as_ref().filter(|c| !c.names_manifest()) {
        c.verify_file(bundle)?;
    }
    let file = fs_err::File::open(bundle).map_err(io_err(bundle))?;
    unpack_opened(file, bundle, check.as_ref(), root)
}

/// Loads the public key and the signature beside `bundle` (before the bundle is opened).
pub fn signature_check(bundle: &Path, trust: &Trust) -> Result<Option<verify::SignatureCheck>, UnpackError> {
    let Trust::PublicKey(pk) = trust else {
        tracing::warn!("{}: NOT VERIFIED: no signature check was made (--allow-unsigned)", bundle.display());
        return Ok(None);
    };
    let mut sig = bundle.as_os_str().to_owned();
    sig.push(".minisig");
    let sig = PathBuf::from(sig);
    if !sig.exists() {
        return Err(UnpackError::NoSignature {
            bundle: bundle.display().to_string(),
            sig: sig.display().to_string(),
        });
    }
    Ok(Some(verify::SignatureCheck::load(&sig, pk)?))
}

/// Unpacks the bundle read from `source` (opened once by the caller; `bundle`
/// names it in messages). Members go to a temporary directory that becomes
/// `<root>/bundles/<id>` only after the signature over every byte read
/// checked out; on any failure nothing is left under `root`.
pub fn unpack_opened(
    source: impl Read + Send,
    bundle: &Path,
    check: Option<&verify::SignatureCheck>,
    root: &Path,
) -> Result<Unpacked, UnpackError> {
    let bundles = root.join("bundles");
    let made_bundles = !bundles.exists();
    let mut sink = DirSink {
        bundles: bundles.clone(),
        tmp: None,
        done: None,
        text_len: 0,
        allowed: 0,
        written: 0,
    };
    let read = verify::read_stream(source, &bundle.display().to_string(), check, &mut sink);
    let result = (|| {
        let read = read?;
        if let Some(c) = &read.comment {
            tracing::info!("signature good: {c}");
        }
        if let Some(dir) = sink.done.take().filter(|_| !read.members_read) {
            return Ok(Unpacked {
                dir,
                manifest: read.manifest,
                fresh: false,
            });
        }
        let tmp = sink.tmp.clone().ok_or_else(|| {
            UnpackError::Verify(verify::VerifyError::Format {
                bundle: bundle.display().to_string(),
                why: "no members were read".into(),
            })
        })?;
        let id = sha256_hex(read.text.as_bytes());
        let dir = bundles.join(&id);
        fs_err::write(tmp.join(MANIFEST_NAME), &read.text).map_err(io_err(&tmp))?;
        // Marked complete only now, after the signature covered every byte.
        fs_err::write(tmp.join(COMPLETE), format!("{id}\n")).map_err(io_err(&tmp))?;
        if dir.exists() {
            // An unfinished directory from an older layout; replace it.
            fs_err::remove_dir_all(&dir).map_err(io_err(&dir))?;
        }
        fs_err::rename(&tmp, &dir).map_err(io_err(&dir))?;
        Ok(Unpacked {
            dir,
            manifest: read.manifest,
            fresh: true,
        })
    })();
    if result.is_err() {
        if let Some(tmp) = &sink.tmp {
            let _ = fs_err::remove_dir_all(tmp);
        }
        if made_bundles {
            let _ = std::fs::remove_dir(&bundles);
        }
    }
    result
}

/// What a dry run reads of a bundle, writing nothing: every member checked
/// against the signature and `bundle.yaml` as in [`unpack`], the manifests
/// (small text the plan renders) kept in memory. Returns the manifest, where
/// `unpack` would put the bundle, and those members.
pub fn read_for_plan(bundle: &Path, trust: &Trust, root: &Path) -> Result<Planned, UnpackError> {
    struct KeepManifests(BTreeMap<String, Vec<u8>>);
    impl Sink for KeepManifests {
        fn member(&mut self, path: &str, _size: u64, data: &mut dyn Read) -> io::Result<()> {
            if path.starts_with("manifests/") {
                let mut buf = Vec::new();
                data.read_to_end(&mut buf)?;
                self.0.insert(path.to_string(), buf);
                return Ok(());
            }
            io::copy(data, &mut io::sink()).map(|_| ())
        }
    }
    let check = signature_check(bundle, trust)?;
    let mut keep = KeepManifests(BTreeMap::new());
    let read = verify::read_bundle(bundle, check.as_ref(), &mut keep)?;
    Ok(Planned {
        dir: root.join("bundles").join(sha256_hex(read.text.as_bytes())),
        manifest: read.manifest,
        members: keep.0,
    })
}

/// A bundle read for a dry run.
#[derive(Debug)]
pub struct Planned {
    /// Where [`unpack`] would put it (not created).
    pub dir: PathBuf,
    pub manifest: BundleManifest,
    /// Its `manifests/...` members, by path.
    pub members: BTreeMap<String, Vec<u8>>,
}

/// Writes verified members under a temporary directory named after the
/// bundle's id; skips them when that id is already unpacked. Paths were
/// checked to be relative with only normal components before they reach here.
struct DirSink {
    bundles: PathBuf,
    tmp: Option<PathBuf>,
    /// The finished directory, when an earlier run unpacked this bundle.
    done: Option<PathBuf>,
    /// `bundle.yaml`'s size: it is written beside the members at the end.
    text_len: u64,
    /// Member bytes `bundle.yaml` declares, and those written so far.
    allowed: u64,
    written: u64,
}

/// Room kept free beyond the members and `bundle.yaml`: directories, the
/// completion marker, and a filesystem that is not left full.
const FREE_RESERVE: u64 = 64 << 20;

/// Bytes an unprivileged writer may still use on the filesystem of `path`.
fn free_bytes(path: &Path) -> io::Result<u64> {
    let st = rustix::fs::statvfs(path).map_err(io::Error::from)?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

impl Sink for DirSink {
    fn start(&mut self, manifest_text: &str) -> io::Result<bool> {
        let id = sha256_hex(manifest_text.as_bytes());
        let dir = self.bundles.join(&id);
        if dir.join(COMPLETE).exists() {
            self.done = Some(dir);
            return Ok(false);
        }
        fs_err::create_dir_all(&self.bundles)?;
        let tmp = self.bundles.join(format!(".{id}.tmp-{}", std::process::id()));
        if tmp.exists() {
            fs_err::remove_dir_all(&tmp)?;
        }
        fs_err::create_dir(&tmp)?;
        self.tmp = Some(tmp);
        self.text_len = manifest_text.len() as u64;
        Ok(true)
    }

    fn declared(&mut self, bytes: u64) -> io::Result<()> {
        let need = bytes.saturating_add(self.text_len).saturating_add(FREE_RESERVE);
        let free = free_bytes(&self.bundles)?;
        if need > free {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!(
                    "its members take {bytes} bytes as bundle.yaml declares; {} has {free} bytes free and needs {need}. Free space there or unpack under another --root",
                    self.bundles.display()
                ),
            ));
        }
        self.allowed = bytes;
        Ok(())
    }

    fn member(&mut self, path: &str, _size: u64, data: &mut dyn Read) -> io::Result<()> {
        let root = self
            .tmp
            .as_ref()
            .ok_or_else(|| io::Error::other("a member came before bundle.yaml"))?;
        let target = root.join(path);
        if !target.starts_with(root) {
            return Err(io::Error::other(format!("{path} leaves the target directory")));
        }
        if let Some(parent) = target.parent() {
            fs_err::create_dir_all(parent)?;
        }
        let mut f = fs_err::OpenOptions::new().write(true).create_new(true).open(&target)?;
        // The parser stops each member at its declared size; this is the
        // writer's own bound on the whole, whatever reaches it.
        self.written += io::copy(&mut data.take(self.allowed - self.written), &mut f)?;
        if data.read(&mut [0u8])? != 0 {
            return Err(io::Error::other(format!(
                "more bytes than bundle.yaml declares for all members ({})",
                self.allowed
            )));
        }
        Ok(())
    }
}
