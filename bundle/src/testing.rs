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
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(*kind);
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        if let Some(gnu) = h.as_gnu_mut() {
            let n = path.len().min(gnu.name.len());
            gnu.name[..n].copy_from_slice(&path.as_bytes()[..n]);
        }
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
        lock,
        members,
    }
}
