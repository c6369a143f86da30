//! Writing a bundle: one streaming pass of tar through multi-threaded zstd.
//!
//! Deterministic by construction: members in the order given (the caller
//! sorts them), `bundle.yaml` first, fixed mtime, uid, gid and modes, no
//! directory entries. zstd's multi-threaded output does not depend on the
//! worker count, so any machine gives the same bytes for the same inputs.
//! The archive is written to a temporary file beside the target and renamed
//! into place only when complete.

use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use crate::digest::Hashing;
use crate::manifest::{BundleManifest, MANIFEST_NAME, Member};

/// 2020-01-01T00:00:00Z: every member's mtime.
pub const MTIME: u64 = 1_577_836_800;
/// zstd level: fast, and within a few percent of level 9 on binaries.
pub const LEVEL: i32 = 3;

/// Where a member's bytes come from.
#[derive(Debug, Clone)]
pub enum Source {
    File(PathBuf),
    Bytes(Vec<u8>),
}

/// A member to pack, with the digest and size it must have.
#[derive(Debug, Clone)]
pub struct PackMember {
    pub path: String,
    pub source: Source,
    pub size: u64,
    pub sha256: String,
}

#[derive(Debug, thiserror::Error)]
pub enum PackError {
    #[error("writing {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error(
        "member {path} changed while packing: expected sha256 {expected} ({expected_size} bytes), read {actual} ({actual_size} bytes); is the cache being modified?"
    )]
    Changed {
        path: String,
        expected: String,
        actual: String,
        expected_size: u64,
        actual_size: u64,
    },
    #[error("cannot encode bundle.yaml: {0}")]
    Manifest(String),
}

/// Progress callback: bytes of member content written so far.
pub type Progress<'a> = &'a (dyn Fn(u64) + Sync);

/// Writes `manifest` and `members` as a bundle at `out`. Returns the archive size.
pub fn pack(out: &Path, manifest: &BundleManifest, members: &[PackMember], workers: u32, progress: Progress) -> Result<u64, PackError> {
    let tmp = out.with_file_name(format!(
        ".{}.tmp-{}",
        out.file_name().map(|n| n.to_string_lossy()).unwrap_or_default(),
        std::process::id()
    ));
    let result = write(&tmp, manifest, members, workers, progress);
    match result {
        Ok(size) => {
            fs_err::rename(&tmp, out).map_err(|source| PackError::Io {
                path: out.display().to_string(),
                source,
            })?;
            Ok(size)
        }
        Err(e) => {
            let _ = fs_err::remove_file(&tmp);
            Err(e)
        }
    }
}

fn write(tmp: &Path, manifest: &BundleManifest, members: &[PackMember], workers: u32, progress: Progress) -> Result<u64, PackError> {
    let io = |source| PackError::Io {
        path: tmp.display().to_string(),
        source,
    };
    let file = fs_err::File::create(tmp).map_err(io)?;
    let mut enc = zstd::stream::write::Encoder::new(BufWriter::with_capacity(1 << 20, file), LEVEL).map_err(io)?;
    enc.multithread(workers.max(1)).map_err(io)?;
    let mut tar = tar::Builder::new(enc);
    tar.mode(tar::HeaderMode::Deterministic);
    let yaml = manifest.to_yaml().map_err(|e| PackError::Manifest(e.to_string()))?;
    append(&mut tar, MANIFEST_NAME, yaml.len() as u64, yaml.as_bytes()).map_err(io)?;
    let mut done = 0u64;
    for m in members {
        let reader: Box<dyn Read> = match &m.source {
            Source::File(p) => Box::new(fs_err::File::open(p).map_err(io)?),
            Source::Bytes(b) => Box::new(&b[..]),
        };
        // Hash while packing: a cache file that changed since it was verified
        // must not slip into a signed bundle.
        let mut hashing = Hashing::new(reader.take(m.size));
        append(&mut tar, &m.path, m.size, &mut hashing).map_err(io)?;
        let count = hashing.count();
        let (actual, _) = hashing.finish();
        if actual != m.sha256 || count != m.size {
            return Err(PackError::Changed {
                path: m.path.clone(),
                expected: m.sha256.clone(),
                actual,
                expected_size: m.size,
                actual_size: count,
            });
        }
        done += m.size;
        progress(done);
    }
    let enc = tar.into_inner().map_err(io)?;
    let mut w = enc.finish().map_err(io)?;
    w.flush().map_err(io)?;
    let file = w.into_inner().map_err(|e| io(e.into_error()))?;
    file.sync_all().map_err(io)?;
    Ok(file.metadata().map_err(io)?.len())
}

fn append<W: Write>(tar: &mut tar::Builder<W>, path: &str, size: u64, data: impl Read) -> io::Result<()> {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_mtime(MTIME);
    h.set_uid(0);
    h.set_gid(0);
    tar.append_data(&mut h, path, data)
}

/// Members listed for `bundle.yaml`, from the members to pack.
pub fn listing(members: &[PackMember]) -> Vec<Member> {
    members
        .iter()
        .map(|m| Member {
            path: m.path.clone(),
            size: m.size,
            sha256: m.sha256.clone(),
            from_base: false,
        })
        .collect()
}
