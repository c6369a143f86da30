//! Reading a bundle: signature first, then every member against `bundle.yaml`.
//!
//! The signature is checked over the compressed bytes before anything is
//! decompressed. Then one streaming pass reads the tar: `bundle.yaml` must
//! come first; every later member must be a regular file listed there, at a
//! safe relative path, with the listed size and sha256. Anything else stops
//! the read, naming the member, the expected and the actual digest.

use std::collections::HashMap;
use std::io::{self, BufReader, Read};
use std::path::{Component, Path};

use crate::digest::Hashing;
use crate::manifest::{BundleManifest, MANIFEST_NAME};

/// `bundle.yaml` may not be larger than this.
const MAX_MANIFEST: u64 = 64 * 1024 * 1024;

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

/// Checks `bundle` against the minisign signature `sig` and public key `pubkey`
/// without decompressing anything. Returns the trusted comment.
pub fn verify_signature(bundle: &Path, sig: &Path, pubkey: &Path) -> Result<String, VerifyError> {
    let io = |p: &Path| {
        let path = p.display().to_string();
        move |source| VerifyError::Io { path, source }
    };
    let pk_text = fs_err::read_to_string(pubkey).map_err(io(pubkey))?;
    let pk = minisign_verify::PublicKey::decode(&pk_text)
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
    let bad = |why: String| VerifyError::BadSignature {
        bundle: bundle.display().to_string(),
        signature: sig.display().to_string(),
        pubkey: pubkey.display().to_string(),
        why,
    };
    let mut verifier = pk.verify_stream(&signature).map_err(|e| bad(e.to_string()))?;
    let mut f = fs_err::File::open(bundle).map_err(io(bundle))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io(bundle))?;
        if n == 0 {
            break;
        }
        verifier.update(&buf[..n]);
    }
    verifier.finalize().map_err(|e| bad(e.to_string()))?;
    Ok(signature.trusted_comment().to_string())
}

/// What to do with each verified member's bytes.
pub trait Sink {
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

/// Streams the archive, checking every member; returns the manifest.
pub fn check_members(bundle: &Path, sink: &mut dyn Sink) -> Result<BundleManifest, VerifyError> {
    let name = bundle.display().to_string();
    let fmt = |why: String| VerifyError::Format { bundle: name.clone(), why };
    let io = |source| VerifyError::Io {
        path: name.clone(),
        source,
    };
    let file = fs_err::File::open(bundle).map_err(io)?;
    let dec =
        zstd::stream::read::Decoder::new(BufReader::with_capacity(1 << 20, file)).map_err(|e| fmt(format!("not a zstd stream: {e}")))?;
    let mut archive = tar::Archive::new(dec);
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
    let manifest = BundleManifest::from_yaml(&text).map_err(|e| fmt(format!("{MANIFEST_NAME}: {e}")))?;
    let mut expected: HashMap<&str, (u64, &str)> = manifest
        .members
        .iter()
        .map(|m| (m.path.as_str(), (m.size, m.sha256.as_str())))
        .collect();
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
                bundle: name.clone(),
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
    Ok(manifest)
}

/// Reads only `bundle.yaml`, without unpacking anything to disk.
pub fn read_manifest(bundle: &Path) -> Result<BundleManifest, VerifyError> {
    read_manifest_text(bundle).map(|(m, _)| m)
}

/// `bundle.yaml`, parsed and as text (its sha256 identifies the bundle's content).
pub fn read_manifest_text(bundle: &Path) -> Result<(BundleManifest, String), VerifyError> {
    let name = bundle.display().to_string();
    let file = fs_err::File::open(bundle).map_err(|source| VerifyError::Io {
        path: name.clone(),
        source,
    })?;
    let dec = zstd::stream::read::Decoder::new(BufReader::new(file)).map_err(|e| VerifyError::Format {
        bundle: name.clone(),
        why: format!("not a zstd stream: {e}"),
    })?;
    let mut archive = tar::Archive::new(dec);
    let mut entries = archive.entries().map_err(|e| VerifyError::Format {
        bundle: name.clone(),
        why: e.to_string(),
    })?;
    let fmt = |why: String| VerifyError::Format { bundle: name.clone(), why };
    let mut first = entries
        .next()
        .ok_or_else(|| fmt("the archive is empty".into()))?
        .map_err(|e| fmt(e.to_string()))?;
    let path = entry_path(&first).map_err(&fmt)?;
    if path != MANIFEST_NAME || first.size() > MAX_MANIFEST {
        return Err(fmt(format!(
            "the first member is {path}, not {MANIFEST_NAME}; this is not a kubexm bundle"
        )));
    }
    let mut text = String::new();
    first.read_to_string(&mut text).map_err(|e| fmt(e.to_string()))?;
    let m = BundleManifest::from_yaml(&text).map_err(|e| fmt(format!("{MANIFEST_NAME}: {e}")))?;
    Ok((m, text))
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
