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
//! A differential bundle (see `kubexm_bundle::diff`) unpacks into the same
//! kind of directory, whole: the members it carries are written, and those
//! it takes from its base are hard-linked from the base's directory beside
//! it, which must be unpacked first ([`unpack_base`]) and is checked to fit
//! before anything is written. Everything after the unpack (the registry,
//! the file server, the plan) sees a full bundle.
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

impl Trust {
    /// A signature check with `pubkey`, or none without one.
    pub fn of(pubkey: Option<&Path>) -> Trust {
        match pubkey {
            Some(k) => Trust::PublicKey(k.to_path_buf()),
            None => Trust::Unsigned,
        }
    }
}

#[derive(Debug)]
pub struct Unpacked {
    /// `<root>/bundles/<hex>`, hex the content's id
    /// ([`kubexm_bundle::diff::content_digest`]).
    pub dir: PathBuf,
    pub manifest: BundleManifest,
    /// `sha256:<hex>` of the bundle's own `bundle.yaml` (a differential
    /// bundle's differs from its directory's name).
    pub digest: String,
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
    /// A differential bundle and the base it was given (or found) do not fit.
    #[error(transparent)]
    Base(#[from] kubexm_bundle::diff::DiffError),
    #[error(
        "{bundle} is a differential bundle of base {digest}, which is not unpacked under {root}: pass --base FILE (the full bundle it was built against), or unpack that bundle first"
    )]
    NoBase { bundle: String, digest: String, root: String },
    #[error(
        "{bundle} is a differential bundle of base {digest}: pass that base with --base FILE (the registry host unpacks the bundle too and needs it)"
    )]
    NeedBase { bundle: String, digest: String },
    #[error("--base {base}: --allow-unsigned never applies to a base; pass --pubkey FILE to verify it")]
    UnsignedBase { base: String },
    #[error("the base {base} has no signature beside it ({sig} is missing): a base is always verified; carry its .minisig with it")]
    BaseNoSignature { base: String, sig: String },
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
            UnpackError::Base(e) if e.is_unsupported() => crate::ops::error::OpError::Unsupported,
            UnpackError::Base(kubexm_bundle::diff::DiffError::NotDifferential { .. })
            | UnpackError::NoBase { .. }
            | UnpackError::NeedBase { .. }
            | UnpackError::UnsignedBase { .. } => crate::ops::error::OpError::Usage,
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
        name: bundle.display().to_string(),
        base: None,
        refused: None,
        tmp: None,
        done: None,
        text_len: 0,
        allowed: 0,
        written: 0,
    };
    let read = verify::read_stream(source, &bundle.display().to_string(), check, &mut sink);
    let result = (|| {
        if let Some(refused) = sink.refused.take() {
            return Err(refused);
        }
        let read = read?;
        if let Some(c) = &read.comment {
            tracing::info!("signature good: {c}");
        }
        let digest = format!("sha256:{}", sha256_hex(read.text.as_bytes()));
        if let Some(dir) = sink.done.take().filter(|_| !read.members_read) {
            return Ok(Unpacked {
                dir,
                manifest: read.manifest,
                digest,
                fresh: false,
            });
        }
        let tmp = sink.tmp.clone().ok_or_else(|| {
            UnpackError::Verify(verify::VerifyError::Format {
                bundle: bundle.display().to_string(),
                why: "no members were read".into(),
            })
        })?;
        let full = kubexm_bundle::diff::full_text(&read.manifest, &read.text).map_err(|why| {
            UnpackError::Verify(verify::VerifyError::Format {
                bundle: bundle.display().to_string(),
                why,
            })
        })?;
        let id = sha256_hex(full.as_bytes());
        let dir = bundles.join(&id);
        fs_err::write(tmp.join(MANIFEST_NAME), full.as_bytes()).map_err(io_err(&tmp))?;
        if let Some(base) = &sink.base {
            link_from_base(&read.manifest, base, &tmp)?;
        }
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
            digest,
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
pub fn read_for_plan(bundle: &Path, base: Option<&Path>, trust: &Trust, root: &Path) -> Result<Planned, UnpackError> {
    let check = signature_check(bundle, trust)?;
    let mut keep = KeepManifests(BTreeMap::new());
    let read = verify::read_bundle(bundle, check.as_ref(), &mut keep)?;
    let name = bundle.display().to_string();
    let content = kubexm_bundle::diff::content_digest(&read.manifest, &read.text)
        .map_err(|why| UnpackError::Verify(verify::VerifyError::Format { bundle: name.clone(), why }))?;
    let bundles = root.join("bundles");
    let dir = bundles.join(kubexm_bundle::diff::hex(&content));
    // A differential bundle's manifests that its base carries: from its
    // content or its base unpacked here, else from the base file, in memory.
    if read.manifest.base.is_some() {
        let taken = read
            .manifest
            .members
            .iter()
            .filter(|m| m.from_base && m.path.starts_with("manifests/"));
        let from = if dir.join(COMPLETE).exists() {
            Some(dir.clone())
        } else if base.is_none() {
            base_of(&read.manifest, &name, &bundles)?
        } else {
            None
        };
        match (from, base) {
            (Some(from), _) => {
                for m in taken {
                    let path = from.join(&m.path);
                    keep.0.insert(m.path.clone(), fs_err::read(&path).map_err(io_err(&path))?);
                }
            }
            (None, Some(base)) => {
                let mut in_base = KeepManifests(BTreeMap::new());
                let b = verify::read_bundle(base, base_signature(base, trust)?.as_ref(), &mut in_base)?;
                let digest = format!("sha256:{}", sha256_hex(b.text.as_bytes()));
                kubexm_bundle::diff::check_base(&read.manifest, &name, &b.manifest, &digest, &base.display().to_string())?;
                for m in taken {
                    if let Some(bytes) = in_base.0.remove(&m.path) {
                        keep.0.insert(m.path.clone(), bytes);
                    }
                }
            }
            (None, None) => {}
        }
    }
    Ok(Planned {
        dir,
        digest: format!("sha256:{}", sha256_hex(read.text.as_bytes())),
        manifest: read.manifest,
        members: keep.0,
    })
}

/// Keeps a bundle's `manifests/...` members (small text a plan renders) in
/// memory and skips the others.
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

/// A bundle read for a dry run.
#[derive(Debug)]
pub struct Planned {
    /// Where [`unpack`] would put it (not created).
    pub dir: PathBuf,
    /// `sha256:<hex>` of its own `bundle.yaml`.
    pub digest: String,
    pub manifest: BundleManifest,
    /// Its `manifests/...` members, by path.
    pub members: BTreeMap<String, Vec<u8>>,
}

/// Writes verified members under a temporary directory named after the
/// bundle's id; skips them when that id is already unpacked. Paths were
/// checked to be relative with only normal components before they reach here.
struct DirSink {
    bundles: PathBuf,
    /// The bundle, for messages.
    name: String,
    /// A differential bundle's base, unpacked under `bundles`.
    base: Option<PathBuf>,
    /// Why `start` refused the bundle, as the caller reports it.
    refused: Option<UnpackError>,
    tmp: Option<PathBuf>,
    /// The finished directory, when an earlier run unpacked this bundle.
    done: Option<PathBuf>,
    /// `bundle.yaml`'s size: it is written beside the members at the end.
    text_len: u64,
    /// Member bytes `bundle.yaml` declares, and those written so far.
    allowed: u64,
    written: u64,
}

/// The unpacked base a differential bundle (`diff`, named `name`) needs
/// under `bundles`, checked to fit it; `None` for a full bundle.
fn base_of(diff: &BundleManifest, name: &str, bundles: &Path) -> Result<Option<PathBuf>, UnpackError> {
    let Some(want) = &diff.base else { return Ok(None) };
    let dir = bundles.join(kubexm_bundle::diff::hex(&want.digest));
    if !dir.join(COMPLETE).exists() {
        return Err(UnpackError::NoBase {
            bundle: name.to_string(),
            digest: want.digest.clone(),
            root: bundles.parent().unwrap_or(bundles).display().to_string(),
        });
    }
    let path = dir.join(MANIFEST_NAME);
    let text = fs_err::read_to_string(&path).map_err(io_err(&path))?;
    let base = BundleManifest::from_yaml(&text).map_err(|why| {
        UnpackError::Verify(verify::VerifyError::Format {
            bundle: path.display().to_string(),
            why,
        })
    })?;
    let digest = format!("sha256:{}", sha256_hex(text.as_bytes()));
    kubexm_bundle::diff::check_base(diff, name, &base, &digest, &dir.display().to_string())?;
    Ok(Some(dir))
}

/// Gives the unpacked differential bundle at `tmp` every member it takes
/// from its unpacked `base`: a hard link (both live under `bundles/`), or a
/// copy where the filesystem refuses one.
fn link_from_base(diff: &BundleManifest, base: &Path, tmp: &Path) -> Result<(), UnpackError> {
    for m in diff.members.iter().filter(|m| m.from_base) {
        let (from, to) = (base.join(&m.path), tmp.join(&m.path));
        if let Some(parent) = to.parent() {
            fs_err::create_dir_all(parent).map_err(io_err(parent))?;
        }
        // The base's copy was verified when it was unpacked; a size that
        // changed since says it was modified in place.
        let size = fs_err::metadata(&from).map_err(io_err(&from))?.len();
        if size != m.size {
            return Err(UnpackError::Io {
                path: from.display().to_string(),
                source: io::Error::other(format!(
                    "{size} bytes, but the base listed {} for it: the unpacked base was changed; remove its directory and unpack it again",
                    m.size
                )),
            });
        }
        match std::fs::hard_link(&from, &to) {
            Ok(()) => {}
            // Duplicate paths are refused when bundle.yaml is read.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Err(io_err(&to)(e)),
            // Across filesystems, or one without hard links: a copy.
            Err(_) => {
                fs_err::copy(&from, &to).map_err(io_err(&from))?;
            }
        }
    }
    Ok(())
}

/// Refuses `--base` under `--allow-unsigned`: a base is always verified.
pub fn refuse_unsigned_base(base: &Path, trust: &Trust) -> Result<(), UnpackError> {
    match trust {
        Trust::Unsigned => Err(UnpackError::UnsignedBase {
            base: base.display().to_string(),
        }),
        Trust::PublicKey(_) => Ok(()),
    }
}

/// Verifies a differential `bundle` and its full `base`, each against its
/// signature, and that the base fits (it is the one the differential
/// names and holds every member taken from it), and that both fit the free
/// space; then unpacks the base under `root`, where [`unpack`] of the
/// differential finds it. Everything is checked before anything is
/// written; nothing is unpacked when the base or the content is there. [`Trust::Unsigned`] is only for bundles checked
/// before (held by a worker): a person's `--allow-unsigned` never covers a
/// base ([`refuse_unsigned_base`]).
pub fn unpack_base(bundle: &Path, base: &Path, trust: &Trust, root: &Path) -> Result<(), UnpackError> {
    let Pair {
        diff,
        content,
        base: head,
        digest,
    } = check_pair(bundle, base, trust)?;
    let bundles = root.join("bundles");
    // Its content (from the full bundle, or an earlier pair) or its base is
    // here already: nothing to unpack.
    let unpacked = |d: &str| bundles.join(kubexm_bundle::diff::hex(d)).join(COMPLETE).exists();
    if unpacked(&content) || unpacked(&digest) {
        return Ok(());
    }
    // Both must fit before the base is written.
    let need = head
        .total_size()
        .saturating_add(diff.carried_size())
        .saturating_add(2 * FREE_RESERVE);
    let existing = root.ancestors().find(|p| p.exists()).unwrap_or(root);
    let free = free_bytes(existing).map_err(io_err(existing))?;
    if need > free {
        return Err(UnpackError::Io {
            path: existing.display().to_string(),
            source: io::Error::new(
                io::ErrorKind::StorageFull,
                format!(
                    "{} and its base {} need {need} bytes there, {free} are free: free space or unpack under another --root",
                    bundle.display(),
                    base.display()
                ),
            ),
        });
    }
    unpack(base, trust, root).map(|_| ())
}

/// A differential bundle and its base, checked to fit.
struct Pair {
    diff: BundleManifest,
    /// The full content's digest.
    content: String,
    base: BundleManifest,
    /// The base's digest.
    digest: String,
}

/// Verifies the differential `bundle` (every member) and its `base`
/// (its signature over every byte), and that the base fits; writes nothing.
fn check_pair(bundle: &Path, base: &Path, trust: &Trust) -> Result<Pair, UnpackError> {
    let diff_check = signature_check(bundle, trust)?;
    let base_check = base_signature(base, trust)?;
    let diff = verify::read_bundle(bundle, diff_check.as_ref(), &mut verify::Discard)?;
    let content = kubexm_bundle::diff::content_digest(&diff.manifest, &diff.text).map_err(|why| {
        UnpackError::Verify(verify::VerifyError::Format {
            bundle: bundle.display().to_string(),
            why,
        })
    })?;
    let head = verify::read_bundle(base, base_check.as_ref(), &mut verify::ManifestOnly)?;
    let digest = format!("sha256:{}", sha256_hex(head.text.as_bytes()));
    kubexm_bundle::diff::check_base(
        &diff.manifest,
        &bundle.display().to_string(),
        &head.manifest,
        &digest,
        &base.display().to_string(),
    )?;
    Ok(Pair {
        diff: diff.manifest,
        content,
        base: head.manifest,
        digest,
    })
}

/// What an operation that deploys from `bundle` (its `bundle.yaml` is
/// `manifest`) needs of `base` (`--base`, or held), checked before any
/// host is touched: a differential bundle needs its base file (the
/// registry host unpacks the bundle too), which is verified against it
/// when `verify` (nothing is written); a full bundle takes none.
pub fn check_deploy(bundle: &Path, manifest: &BundleManifest, base: Option<&Path>, trust: &Trust, verify: bool) -> Result<(), UnpackError> {
    match (&manifest.base, base) {
        (None, None) => Ok(()),
        (None, Some(_)) => Err(UnpackError::Base(kubexm_bundle::diff::DiffError::NotDifferential {
            bundle: bundle.display().to_string(),
        })),
        (Some(want), None) => Err(UnpackError::NeedBase {
            bundle: bundle.display().to_string(),
            digest: want.digest.clone(),
        }),
        (Some(_), Some(base)) if verify => check_pair(bundle, base, trust).map(|_| ()),
        (Some(_), Some(_)) => Ok(()),
    }
}

/// A base's signature check: always one (a base is never unsigned under
/// a key), refused without its `.minisig`.
fn base_signature(base: &Path, trust: &Trust) -> Result<Option<verify::SignatureCheck>, UnpackError> {
    match signature_check(base, trust) {
        Err(UnpackError::NoSignature { bundle, sig }) => Err(UnpackError::BaseNoSignature { base: bundle, sig }),
        other => other,
    }
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
        let m = BundleManifest::from_yaml(manifest_text).map_err(io::Error::other)?;
        let dir = self.bundles.join(kubexm_bundle::diff::hex(
            &kubexm_bundle::diff::content_digest(&m, manifest_text).map_err(io::Error::other)?,
        ));
        if dir.join(COMPLETE).exists() {
            self.done = Some(dir);
            return Ok(false);
        }
        // A differential bundle's base is checked before anything is written.
        match base_of(&m, &self.name, &self.bundles) {
            Ok(base) => self.base = base,
            Err(e) => {
                let why = e.to_string();
                self.refused = Some(e);
                return Err(io::Error::other(why));
            }
        }
        fs_err::create_dir_all(&self.bundles)?;
        let id = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
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
