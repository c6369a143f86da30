//! Reading a bundle in one pass: signature, decompression, every member.
//!
//! The bundle is opened once. One thread reads the compressed bytes, feeds
//! them to the minisign verifier (the signature covers exactly these bytes)
//! and decompresses them; the calling thread reads the tar: `bundle.yaml`
//! must come first; every later member must be a regular file listed there,
//! at a safe relative path, with the listed size and sha256. The signature is
//! checked when the last byte of the file has been read, so a caller that
//! writes members (unpack) keeps them aside until [`read_bundle`] returns Ok:
//! what it keeps is provably the bytes whose signature was checked, even if
//! the file at the bundle's path is replaced meanwhile. When the signature
//! fails, that is the error reported, whatever else went wrong.
//!
//! No signature is checked before `bundle.yaml` is read (`inspect`, install's
//! validation and the catalog read only it), so the tar crate sees the
//! stream through `tar_guard`: every extension header bounded before it is
//! buffered, and the stream as a whole bounded by what `bundle.yaml` can
//! take, then by what it declares.

use std::collections::HashMap;
use std::io::{self, BufReader, Read};
use std::path::{Component, Path};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use crate::digest::{Hashing, sha256_hex};
use crate::manifest::{BundleManifest, MANIFEST_NAME};
use crate::tar_guard::{BLOCK, Budget, Guarded, MAX_EXTENSION};
use crate::trusted_comment;

/// `bundle.yaml` may not be larger than this: a bundle of 100,000 members
/// lists about 15 MB.
pub const MAX_MANIFEST: u64 = 16 * 1024 * 1024;
/// Decompressed bytes the archive may hold up to the end of `bundle.yaml`:
/// its header, a long name and a PAX header before it, its padded text.
const MANIFEST_BUDGET: u64 = MAX_MANIFEST + 2 * MAX_EXTENSION + 4 * BLOCK;
/// Decompressed bytes allowed past what `bundle.yaml` declares, for the
/// end-of-archive blocks and a writer's record padding.
const RESERVE: u64 = 64 * 1024;
/// Decompressed bytes handed between the threads at a time, and how many
/// such chunks may wait: the pass holds at most a few MB whatever the size.
const CHUNK: usize = 1 << 20;
const CHUNKS_IN_FLIGHT: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a minisign public key: {why}")]
    BadPublicKey { path: String, why: String },
    #[error("{path} is not a minisign signature: {why}")]
    BadSignatureFile { path: String, why: String },
    #[error(
        "{path} is a legacy minisign signature (made with `minisign -S -l`), which kubexm does not accept; sign the bundle again with minisign 0.8 or later without -l, or with `kubexm-bundle build --key`"
    )]
    LegacySignature { path: String },
    #[error(
        "the signature {signature} does not verify {bundle} with key {pubkey}: {why}. The bundle was changed or signed with another key; do not use it"
    )]
    BadSignature {
        bundle: String,
        signature: String,
        pubkey: String,
        why: String,
    },
    #[error("{bundle}: {why}")]
    Format { bundle: String, why: String },
    #[error("{bundle}: member {member}: expected sha256 {expected}, found {actual}. The bundle is damaged or was tampered with")]
    BadDigest {
        bundle: String,
        member: String,
        expected: String,
        actual: String,
    },
}

/// A public key and a signature, loaded (and the signature's kind checked)
/// before the bundle is opened.
pub struct SignatureCheck {
    key: minisign_verify::PublicKey,
    signature: minisign_verify::Signature,
    signature_path: String,
    pubkey_path: String,
    /// The sha256 of `bundle.yaml` the authenticated trusted comment names.
    manifest_sha256: Option<String>,
}

impl SignatureCheck {
    /// Reads the minisign public key `pubkey` and the signature `sig`.
    pub fn load(sig: &Path, pubkey: &Path) -> Result<SignatureCheck, VerifyError> {
        let io = |p: &Path| {
            let path = p.display().to_string();
            move |source| VerifyError::Io { path, source }
        };
        let pk_text = fs_err::read_to_string(pubkey).map_err(io(pubkey))?;
        let key = minisign_verify::PublicKey::decode(&pk_text)
            .or_else(|_| minisign_verify::PublicKey::from_base64(pk_text.trim()))
            .map_err(|e| VerifyError::BadPublicKey {
                path: pubkey.display().to_string(),
                why: e.to_string(),
            })?;
        let sig_text = fs_err::read_to_string(sig).map_err(io(sig))?;
        let signature = minisign_verify::Signature::decode(&sig_text).map_err(|e| VerifyError::BadSignatureFile {
            path: sig.display().to_string(),
            why: e.to_string(),
        })?;
        let mut check = SignatureCheck {
            key,
            signature,
            signature_path: sig.display().to_string(),
            pubkey_path: pubkey.display().to_string(),
            manifest_sha256: None,
        };
        let bundle = check.signature_path.strip_suffix(".minisig").unwrap_or_default().to_string();
        // Refused now, with the reason, rather than as a bad signature later.
        check.verifier(&bundle)?;
        let comment = trusted_comment::authenticate(&pk_text, &sig_text).map_err(|why| check.bad(&bundle, why))?;
        check.manifest_sha256 = trusted_comment::manifest_digest(&comment).map(str::to_string);
        Ok(check)
    }

    /// Whether the authenticated trusted comment names `bundle.yaml`'s
    /// sha256 (kubexm-bundle writes it): then a forged `bundle.yaml` is
    /// refused before a member is written. A signature without it (made
    /// with `minisign -S`, or before kubexm named it) is checked over the
    /// whole file first: [`read_bundle`] does so.
    pub fn names_manifest(&self) -> bool {
        self.manifest_sha256.is_some()
    }

    /// Checks the signature over every byte of the file `bundle`, reading
    /// it once and decompressing nothing.
    pub fn verify_file(&self, bundle: &Path) -> Result<(), VerifyError> {
        let name = bundle.display().to_string();
        let mut v = self.verifier(&name)?;
        let mut file = fs_err::File::open(bundle).map_err(|source| VerifyError::Io {
            path: name.clone(),
            source,
        })?;
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = file.read(&mut buf).map_err(|source| VerifyError::Io {
                path: name.clone(),
                source,
            })?;
            if n == 0 {
                break;
            }
            v.update(&buf[..n]);
        }
        v.finalize().map_err(|e| self.bad(&name, e.to_string()))
    }

    fn verifier(&self, bundle: &str) -> Result<minisign_verify::StreamVerifier<'_>, VerifyError> {
        self.key.verify_stream(&self.signature).map_err(|e| match e {
            minisign_verify::Error::UnsupportedLegacyMode => VerifyError::LegacySignature {
                path: self.signature_path.clone(),
            },
            e => self.bad(bundle, e.to_string()),
        })
    }

    fn bad(&self, bundle: &str, why: String) -> VerifyError {
        VerifyError::BadSignature {
            bundle: bundle.to_string(),
            signature: self.signature_path.clone(),
            pubkey: self.pubkey_path.clone(),
            why,
        }
    }
}

/// What to do with each verified member's bytes.
pub trait Sink {
    /// Called with `bundle.yaml`'s text before any other member. Returning
    /// false skips the members: they are not decompressed, only covered by
    /// the signature check.
    fn start(&mut self, _manifest_text: &str) -> io::Result<bool> {
        Ok(true)
    }
    /// Called after `start` returned true, with the bytes of members
    /// `bundle.yaml` declares, before any member: a sink that writes them
    /// checks its room here and writes no more than that.
    fn declared(&mut self, _bytes: u64) -> io::Result<()> {
        Ok(())
    }
    /// Receives one member; it must read `data` to the end.
    fn member(&mut self, path: &str, size: u64, data: &mut dyn Read) -> io::Result<()>;
}

/// A sink that only reads (for `verify`).
pub struct Discard;

impl Sink for Discard {
    fn member(&mut self, _: &str, _: u64, data: &mut dyn Read) -> io::Result<()> {
        io::copy(data, &mut io::sink()).map(|_| ())
    }
}

/// Reads `bundle.yaml` and skips the members: they are not decompressed,
/// and a signature still covers every byte.
pub struct ManifestOnly;

impl Sink for ManifestOnly {
    fn start(&mut self, _: &str) -> io::Result<bool> {
        Ok(false)
    }
    fn member(&mut self, _: &str, _: u64, _: &mut dyn Read) -> io::Result<()> {
        Ok(())
    }
}

/// What one pass over a bundle established.
#[derive(Debug)]
pub struct Verified {
    pub manifest: BundleManifest,
    /// `bundle.yaml` as stored; its sha256 identifies the bundle's content.
    pub text: String,
    /// The signature's trusted comment, when a signature was checked.
    pub comment: Option<String>,
    /// False when the sink skipped the members.
    pub members_read: bool,
}

/// Opens `bundle` once and reads it in one pass (see the module header).
/// A signature whose comment does not name `bundle.yaml` is checked over
/// the whole file first, so nothing unsigned reaches the sink.
pub fn read_bundle(bundle: &Path, signature: Option<&SignatureCheck>, sink: &mut dyn Sink) -> Result<Verified, VerifyError> {
    if let Some(sig) = signature.filter(|s| !s.names_manifest()) {
        sig.verify_file(bundle)?;
    }
    let name = bundle.display().to_string();
    let file = fs_err::File::open(bundle).map_err(|source| VerifyError::Io {
        path: name.clone(),
        source,
    })?;
    read_stream(file, &name, signature, sink)
}

/// [`read_bundle`] over an opened source; `name` is for messages.
pub fn read_stream(
    source: impl Read + Send,
    name: &str,
    signature: Option<&SignatureCheck>,
    sink: &mut dyn Sink,
) -> Result<Verified, VerifyError> {
    let skip = AtomicBool::new(false);
    let (tx, rx) = sync_channel(CHUNKS_IN_FLIGHT);
    std::thread::scope(|s| {
        let reader = s.spawn(|| decompress(source, name, signature, tx, &skip));
        let mut chunks = Chunks {
            rx,
            chunk: Vec::new(),
            pos: 0,
        };
        let parsed = parse(&mut chunks, name, signature, sink);
        // Whatever happened, the rest of the file is only hashed, not
        // decompressed, and the reader thread is let finish.
        skip.store(true, Ordering::Relaxed);
        while chunks.rx.recv().is_ok() {}
        let signed = reader.join().unwrap_or_else(|_| {
            Err(VerifyError::Format {
                bundle: name.to_string(),
                why: "the reading thread stopped unexpectedly".into(),
            })
        });
        // A bad signature explains any other error: report it first.
        let comment = signed?;
        let (manifest, text, members_read) = parsed?;
        Ok(Verified {
            manifest,
            text,
            comment,
            members_read,
        })
    })
}

/// Feeds the signature check with every byte of `source` in order.
struct Tee<'a, R> {
    inner: R,
    verifier: Option<minisign_verify::StreamVerifier<'a>>,
}

impl<R: Read> Read for Tee<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(v) = &mut self.verifier {
            v.update(&buf[..n]);
        }
        Ok(n)
    }
}

/// The reading thread: hashes and decompresses `source` into chunks until
/// the end or until `skip`, then hashes the rest. Returns the trusted
/// comment once the signature checked out.
fn decompress<R: Read>(
    source: R,
    name: &str,
    signature: Option<&SignatureCheck>,
    tx: SyncSender<io::Result<Vec<u8>>>,
    skip: &AtomicBool,
) -> Result<Option<String>, VerifyError> {
    let verifier = signature.map(|s| s.verifier(name)).transpose()?;
    let mut tee = BufReader::with_capacity(CHUNK, Tee { inner: source, verifier });
    // A stream that is not zstd reaches the parser as a read error; the
    // signature check below still runs, so a bad signature is what is reported.
    let pumped = zstd::stream::read::Decoder::with_buffer(&mut tee).and_then(|mut dec| {
        while !skip.load(Ordering::Relaxed) {
            let mut chunk = vec![0u8; CHUNK];
            let n = read_full(&mut dec, &mut chunk)?;
            if n == 0 {
                break;
            }
            chunk.truncate(n);
            if tx.send(Ok(chunk)).is_err() {
                break;
            }
        }
        Ok(())
    });
    if let Err(e) = pumped {
        let _ = tx.send(Err(io::Error::other(format!("not a zstd stream: {e}"))));
    }
    drop(tx);
    let Some(sig) = signature else { return Ok(None) };
    io::copy(&mut tee, &mut io::sink()).map_err(|source| VerifyError::Io {
        path: name.to_string(),
        source,
    })?;
    let Some(mut v) = tee.into_inner().verifier else {
        return Ok(None);
    };
    v.finalize().map_err(|e| sig.bad(name, e.to_string()))?;
    Ok(Some(sig.signature.trusted_comment().to_string()))
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Decompressed bytes from the reading thread, as a reader.
struct Chunks {
    rx: Receiver<io::Result<Vec<u8>>>,
    chunk: Vec<u8>,
    pos: usize,
}

impl Read for Chunks {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.chunk.len() {
            match self.rx.recv() {
                Ok(Ok(c)) => {
                    self.chunk = c;
                    self.pos = 0;
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len() - self.pos);
        buf[..n].copy_from_slice(&self.chunk[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Reads the tar, checking every member; returns the manifest, its text and
/// whether the members were read.
fn parse(
    data: &mut impl Read,
    name: &str,
    signature: Option<&SignatureCheck>,
    sink: &mut dyn Sink,
) -> Result<(BundleManifest, String, bool), VerifyError> {
    let fmt = |why: String| VerifyError::Format {
        bundle: name.to_string(),
        why,
    };
    let budget = Budget::new(MANIFEST_BUDGET, "a bundle.yaml can take before its end");
    let mut archive = tar::Archive::new(Guarded::new(data, &budget));
    let mut entries = archive.entries().map_err(|e| fmt(format!("not a tar archive: {e}")))?;
    let mut first = entries
        .next()
        .ok_or_else(|| fmt("the archive is empty".into()))?
        .map_err(|e| fmt(format!("reading the first member: {e}")))?;
    let first_path = entry_path(&first).map_err(&fmt)?;
    if first_path != MANIFEST_NAME {
        return Err(fmt(format!(
            "the first member is {first_path}, not {MANIFEST_NAME}; this is not a kubexm bundle"
        )));
    }
    if first.header().entry_type() != tar::EntryType::Regular || first.size() > MAX_MANIFEST {
        return Err(fmt(format!(
            "{MANIFEST_NAME} is not a regular file of at most {MAX_MANIFEST} bytes"
        )));
    }
    let mut text = String::new();
    first
        .read_to_string(&mut text)
        .map_err(|e| fmt(format!("{MANIFEST_NAME} is not UTF-8 text: {e}")))?;
    drop(first);
    // The builder names bundle.yaml's sha256 in the trusted comment, which
    // was authenticated when the signature was loaded: a bundle.yaml that is
    // not the one signed is refused here, before any member is written.
    if let Some(sig) = signature
        && let Some(named) = &sig.manifest_sha256
        && *named != sha256_hex(text.as_bytes())
    {
        return Err(sig.bad(
            name,
            format!("its trusted comment names {MANIFEST_NAME} sha256:{named}, the bundle holds another"),
        ));
    }
    let manifest = BundleManifest::from_yaml(&text).map_err(|e| fmt(format!("{MANIFEST_NAME}: {e}")))?;
    budget.allow(declared_bytes(&manifest), "bundle.yaml declares");
    if !sink.start(&text).map_err(|e| fmt(e.to_string()))? {
        return Ok((manifest, text, false));
    }
    sink.declared(manifest.carried_size()).map_err(|e| fmt(e.to_string()))?;
    let mut expected: HashMap<&str, (u64, &str)> = manifest.carried().map(|m| (m.path.as_str(), (m.size, m.sha256.as_str()))).collect();
    for entry in entries {
        let mut entry = entry.map_err(|e| fmt(format!("reading the archive: {e}")))?;
        let path = entry_path(&entry).map_err(&fmt)?;
        if entry.header().entry_type() != tar::EntryType::Regular {
            return Err(fmt(format!(
                "member {path} is a {:?}; a bundle holds only regular files",
                entry.header().entry_type()
            )));
        }
        let Some((size, sha)) = expected.remove(path.as_str()) else {
            return Err(fmt(format!("member {path} is not listed in {MANIFEST_NAME} (or appears twice)")));
        };
        if entry.size() != size {
            return Err(fmt(format!(
                "member {path} is {} bytes; {MANIFEST_NAME} lists {size}",
                entry.size()
            )));
        }
        let mut hashing = Hashing::new((&mut entry).take(size));
        sink.member(&path, size, &mut hashing)
            .map_err(|e| fmt(format!("member {path}: {e}")))?;
        let (actual, _) = hashing.finish();
        if actual != sha {
            return Err(VerifyError::BadDigest {
                bundle: name.to_string(),
                member: path,
                expected: sha.to_string(),
                actual,
            });
        }
    }
    if let Some(missing) = expected.keys().next() {
        return Err(fmt(format!(
            "member {missing} is listed in {MANIFEST_NAME} but missing from the archive ({} missing)",
            expected.len()
        )));
    }
    Ok((manifest, text, true))
}

/// The decompressed bytes the members `manifest` lists take in the archive:
/// each one's data, header, long-name header and padding, plus [`RESERVE`].
fn declared_bytes(manifest: &BundleManifest) -> u64 {
    manifest.carried().fold(RESERVE, |n, m| {
        n.saturating_add(m.size)
            .saturating_add(4 * BLOCK)
            .saturating_add(m.path.len() as u64)
    })
}

/// Streams the archive without a signature check, checking every member;
/// returns the manifest.
pub fn check_members(bundle: &Path, sink: &mut dyn Sink) -> Result<BundleManifest, VerifyError> {
    read_bundle(bundle, None, sink).map(|v| v.manifest)
}

/// Reads only `bundle.yaml` (no signature check, nothing decompressed past it).
pub fn read_manifest(bundle: &Path) -> Result<BundleManifest, VerifyError> {
    read_bundle(bundle, None, &mut ManifestOnly).map(|v| v.manifest)
}

/// What [`read_head`] reads of a bundle.
#[derive(Debug, Clone)]
pub struct Head {
    pub manifest: BundleManifest,
    /// `sha256:<hex>` of its own `bundle.yaml`: the bundle file's identity
    /// (what a worker holds it under and a job names).
    pub digest: String,
    /// The content's id ([`crate::diff::content_digest`]): the same as
    /// `digest` for a full bundle, the full bundle's for a differential one;
    /// the directory it unpacks to and what an install records.
    pub content_digest: String,
}

/// A bundle's manifest and digests, nothing unpacked (no signature check).
pub fn read_head(bundle: &Path) -> Result<Head, VerifyError> {
    let v = read_bundle(bundle, None, &mut ManifestOnly)?;
    let content_digest = crate::diff::content_digest(&v.manifest, &v.text).map_err(|why| VerifyError::Format {
        bundle: bundle.display().to_string(),
        why,
    })?;
    Ok(Head {
        digest: format!("sha256:{}", crate::digest::sha256_hex(v.text.as_bytes())),
        manifest: v.manifest,
        content_digest,
    })
}

/// A member's path, refused unless it is relative and stays inside the bundle.
fn entry_path<R: Read>(entry: &tar::Entry<R>) -> Result<String, String> {
    let raw = entry.path_bytes();
    let text = std::str::from_utf8(&raw)
        .map_err(|_| "a member name is not UTF-8".to_string())?
        .to_string();
    let p = Path::new(&text);
    let safe = !text.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
    if !safe {
        return Err(format!("member {text:?} has an unsafe path (absolute, empty, or with ..)"));
    }
    Ok(text)
}
