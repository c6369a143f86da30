//! What the API tests share: a small signed bundle held by digest, and a
//! valid cluster config.

use std::path::{Path, PathBuf};

use kubexm_bundle::pack::{PackMember, Source, listing, pack};

/// The shipped example as a request sends it: hosts log in with a
/// server-side credential (a request may name no file or variable).
#[allow(dead_code)] // not every user of this module sends a config
pub static EXAMPLE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let text = include_str!("../../../manifests/templates/cluster.example.yaml");
    let start = text.find("    auth:\n").expect("the example's auth");
    let end = start + text[start..].find("  hosts:\n").expect("the example's hosts");
    format!("{}    auth: {{credential: ops}}\n{}", &text[..start], &text[end..])
});

/// A small signed bundle carrying the built-in catalog, held by digest in `dir/bundles`.
#[allow(dead_code)] // not every user of this module holds the default bundle
pub fn held_bundle(dir: &Path) -> (String, PathBuf) {
    held_bundle_of(dir, b"alpha")
}

#[allow(dead_code)]
/// [`held_bundle`] with one member holding `data` (another bundle, another digest).
pub fn held_bundle_of(dir: &Path, data: &[u8]) -> (String, PathBuf) {
    let members: Vec<PackMember> = [("files/a/1/amd64/a", data.to_vec())]
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
