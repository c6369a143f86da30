//! Hostile archives for tests: raw tar.zst members written without the tar
//! crate's own path checks, as an attacker's tool would write them.

use std::io::Write;
use std::path::Path;

use crate::manifest::{API_VERSION, BundleManifest, KIND, Member};

/// One raw member: path, content, entry type.
pub type RawEntry<'a> = (&'a str, &'a [u8], tar::EntryType);

/// Writes `entries` as a tar.zst at `out`.
pub fn raw_archive(out: &Path, entries: &[RawEntry]) -> std::io::Result<()> {
    let enc = zstd::Encoder::new(std::fs::File::create(out)?, 3)?;
    let mut t = tar::Builder::new(enc);
    for (path, data, kind) in entries {
        let mut h = raw_header(path, data.len() as u64, *kind);
        if matches!(kind, tar::EntryType::Symlink | tar::EntryType::Link) {
            h.set_link_name_literal(b"../../../../etc/passwd")?;
        }
        h.set_cksum();
        t.append(&h, *data)?;
    }
    t.into_inner()?.finish()?.flush()
}

/// A minimal valid manifest listing `members` (cluster `t`, amd64).
pub fn manifest(members: Vec<Member>) -> BundleManifest {
    let lock = kubexm_bom::Bom {
        cluster: "t".into(),
        kubernetes_version: "v1.33.4".into(),
        arches: vec!["amd64".into()],
        ..Default::default()
    };
    BundleManifest {
        api_version: API_VERSION.into(),
        kind: KIND.into(),
        name: "t".into(),
        created_by: "test".into(),
        config_digest: "sha256:00".into(),
        catalog: None,
        base: None,
        lock,
        members,
    }
}

/// A GNU header for `path` (cut to the name field, unchecked) of `size`
/// bytes of type `kind`, without its checksum.
fn raw_header(path: &str, size: u64, kind: tar::EntryType) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(0o644);
    if let Some(gnu) = h.as_gnu_mut() {
        let n = path.len().min(gnu.name.len());
        gnu.name[..n].copy_from_slice(&path.as_bytes()[..n]);
    }
    h
}

/// One tar header block for a member `path` of `size` bytes of type `kind`.
pub fn header_block(path: &str, size: u64, kind: tar::EntryType) -> [u8; 512] {
    let mut h = raw_header(path, size, kind);
    h.set_cksum();
    *h.as_bytes()
}

/// A hostile tar.zst written without holding its decompressed bytes: `head`
/// compressed, then `runs` times one precompressed frame of `RUN` bytes of
/// `fill` (a zstd decoder reads concatenated frames as one stream), then
/// `tail` compressed. A 10 GiB run of zeros takes well under 1 MB.
pub struct Bomb {
    pub head: Vec<u8>,
    pub fill: u8,
    pub runs: u64,
    pub tail: Vec<u8>,
}

impl Bomb {
    /// Bytes in one run.
    pub const RUN: u64 = 1 << 20;

    /// `bundle.yaml` with `yaml`, then a member `path` whose header declares
    /// `runs` MiB of zeros, then the end of the archive.
    pub fn member(yaml: &str, path: &str, runs: u64) -> Bomb {
        let mut head = entry(MANIFEST, yaml.as_bytes());
        head.extend_from_slice(&header_block(path, runs * Self::RUN, tar::EntryType::Regular));
        Bomb {
            head,
            fill: 0,
            runs,
            tail: vec![0; 1024],
        }
    }

    /// An extension header of type `kind` (`x`, `L`, `K`) holding `runs`
    /// MiB of `a`, before `bundle.yaml` with `yaml`.
    pub fn extension(kind: u8, runs: u64, yaml: &str) -> Bomb {
        let mut tail = entry(MANIFEST, yaml.as_bytes());
        tail.extend_from_slice(&[0; 1024]);
        Bomb {
            head: header_block("././@LongLink", runs * Self::RUN, tar::EntryType::new(kind)).to_vec(),
            fill: b'a',
            runs,
            tail,
        }
    }

    /// Writes it at `out`; returns the compressed size.
    pub fn write(&self, out: &Path) -> std::io::Result<u64> {
        let mut f = std::io::BufWriter::new(std::fs::File::create(out)?);
        let frame = zstd::bulk::compress(&vec![self.fill; Self::RUN as usize], 3)?;
        f.write_all(&zstd::bulk::compress(&self.head, 3)?)?;
        for _ in 0..self.runs {
            f.write_all(&frame)?;
        }
        f.write_all(&zstd::bulk::compress(&self.tail, 3)?)?;
        let f = f.into_inner().map_err(|e| e.into_error())?;
        Ok(f.metadata()?.len())
    }
}

const MANIFEST: &str = crate::manifest::MANIFEST_NAME;

/// A regular member's header, data and padding.
fn entry(path: &str, data: &[u8]) -> Vec<u8> {
    let mut out = header_block(path, data.len() as u64, tar::EntryType::Regular).to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().next_multiple_of(512), 0);
    out
}
