//! What the API tests share: a small signed bundle held by digest, and a
//! valid cluster config.

use std::path::{Path, PathBuf};

use kubexm_bundle::pack::{PackMember, Source, listing, pack};

#[allow(dead_code)] // not every user of this module sends a config
pub const EXAMPLE: &str = include_str!("../../../manifests/templates/cluster.example.yaml");

/// A small signed bundle carrying the built-in catalog, held by digest in `dir/bundles`.
pub fn held_bundle(dir: &Path) -> (String, PathBuf) {
    let members: Vec<PackMember> = [("files/a/1/amd64/a", b"alpha".to_vec())]
        .into_iter()
        .map(|(p, d)| PackMember {
            path: p.into(),
            size: d.len() as u64,
            sha256: kubexm_bundle::digest::sha256_hex(&d),
            source: Source::Bytes(d),
        })
        .collect();
    let catalog = kubexm_bom::catalog::Catalog::builtin().unwrap();
    let mut m = kubexm_bundle::testing::manifest(listing(&members));
    m.lock.kubernetes_version = catalog.default_kubernetes().to_string();
    m.catalog = Some(catalog);
    let bundle = dir.join("k.tar.zst");
    pack(&bundle, &m, &members, 1, &|_| {}).unwrap();
    let (secret, public) = (dir.join("k.key"), dir.join("k.pub"));
    kubexm_builder::sign::keygen(&secret, &public, true, false).unwrap();
    kubexm_builder::sign::sign(&bundle, &secret, "test").unwrap();
    let held = kubexm_server::bundles::add(&bundle, &public, &dir.join("bundles")).unwrap();
    (held.digest, public)
}
