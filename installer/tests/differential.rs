//! Issue 33: a differential bundle unpacks with its base into what the full
//! bundle of the same content unpacks to, and every pair that does not fit
//! is refused before anything is written under the root.

use std::path::{Path, PathBuf};

use kubexm_bundle::digest::sha256_hex;
use kubexm_bundle::manifest::BundleManifest;
use kubexm_bundle::pack::{PackMember, Source, listing, pack};
use kubexm_bundle::testing::manifest;
use kubexm_installer::unpack::{Trust, UnpackError, unpack, unpack_base};

/// A signed bundle at `dir/name.tar.zst` of `members`; a differential of
/// `base` (its manifest and digest) when given. Returns its path and manifest.
fn signed(
    dir: &Path,
    key: &Path,
    name: &str,
    members: &[(&str, &[u8])],
    base: Option<(&BundleManifest, &str)>,
) -> (PathBuf, BundleManifest) {
    let mut members: Vec<PackMember> = members
        .iter()
        .map(|(p, d)| PackMember {
            path: p.to_string(),
            size: d.len() as u64,
            sha256: sha256_hex(d),
            source: Source::Bytes(d.to_vec()),
        })
        .collect();
    let mut m = manifest(listing(&members));
    if let Some((b, digest)) = base {
        kubexm_bundle::diff::make_differential(&mut m, b, digest).unwrap();
        let taken: Vec<String> = m.members.iter().filter(|x| x.from_base).map(|x| x.path.clone()).collect();
        members.retain(|x| !taken.contains(&x.path));
    }
    let bundle = dir.join(format!("{name}.tar.zst"));
    pack(&bundle, &m, &members, 1, &|_| {}).unwrap();
    let comment = format!("kubexm bundle t bundle.yaml sha256:{}", sha256_hex(m.to_yaml().unwrap().as_bytes()));
    kubexm_builder::sign::sign(&bundle, key, &comment).unwrap();
    (bundle, m)
}

fn digest(m: &BundleManifest) -> String {
    format!("sha256:{}", sha256_hex(m.to_yaml().unwrap().as_bytes()))
}

const OLD: &[(&str, &[u8])] = &[
    ("files/a/1/amd64/a", b"alpha"),
    ("files/b/1/amd64/b", b"beta"),
    ("manifests/m/1/m.yaml", b"kind: X\n"),
];
const NEW: &[(&str, &[u8])] = &[
    ("files/a/1/amd64/a", b"alpha"),
    ("files/b/2/amd64/b", b"beta two"),
    ("manifests/m/1/m.yaml", b"kind: X\n"),
];

struct Pair {
    dir: tempfile::TempDir,
    key: PathBuf,
    public: PathBuf,
    base: PathBuf,
    base_m: BundleManifest,
    diff: PathBuf,
}

fn pair() -> Pair {
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = (dir.path().join("k.key"), dir.path().join("k.pub"));
    kubexm_builder::sign::keygen(&key, &public, true, false).unwrap();
    let (base, base_m) = signed(dir.path(), &key, "old", OLD, None);
    let (diff, _) = signed(dir.path(), &key, "new-diff", NEW, Some((&base_m, &digest(&base_m))));
    Pair {
        dir,
        key,
        public,
        base,
        base_m,
        diff,
    }
}

/// Every file under `dir` with its bytes, paths relative.
fn tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push((p.strip_prefix(dir).unwrap().display().to_string(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_differential_with_its_base_unpacks_to_the_full_content() {
    let p = pair();
    let trust = Trust::PublicKey(p.public.clone());
    let root = p.dir.path().join("root");
    // The differential carries only what the base lacks.
    let carried = kubexm_bundle::verify::read_manifest(&p.diff).unwrap();
    assert_eq!(
        carried.carried().map(|m| m.path.as_str()).collect::<Vec<_>>(),
        ["files/b/2/amd64/b"]
    );
    // Without its base: refused, nothing written.
    let e = unpack(&p.diff, &trust, &root).unwrap_err();
    assert!(matches!(e, UnpackError::NoBase { .. }), "{e}");
    assert!(e.to_string().contains("--base"), "{e}");
    assert!(!root.exists(), "something was written under the root");
    unpack_base(&p.diff, &p.base, &trust, &root).unwrap();
    let u = unpack(&p.diff, &trust, &root).unwrap();
    // The full bundle of the same content unpacks to the same files.
    let (full, _) = signed(p.dir.path(), &p.key, "new-full", NEW, None);
    let full_root = p.dir.path().join("full-root");
    let f = unpack(&full, &trust, &full_root).unwrap();
    let without_yaml = |t: Vec<(String, Vec<u8>)>| -> Vec<(String, Vec<u8>)> {
        t.into_iter()
            .filter(|(p, _)| p != "bundle.yaml" && p != ".kubexm-complete")
            .collect()
    };
    assert_eq!(without_yaml(tree(&u.dir)), without_yaml(tree(&f.dir)));
    // Again: a no-op, the base already there.
    unpack_base(&p.diff, &p.base, &trust, &root).unwrap();
    assert!(!unpack(&p.diff, &trust, &root).unwrap().fresh);
}

/// Refused, each with its reason, nothing under the root.
#[test]
fn pairs_that_do_not_fit_are_refused_before_anything_is_written() {
    let p = pair();
    let trust = Trust::PublicKey(p.public.clone());
    let root = p.dir.path().join("root");
    let refused = |bundle: &Path, base: &Path, trust: &Trust, want: &str| {
        let e = unpack_base(bundle, base, trust, &root).unwrap_err();
        assert!(e.to_string().contains(want), "want {want:?} in: {e}");
        assert!(!root.exists(), "{want}: something was written under the root");
        e
    };
    // Another base.
    let (other, other_m) = signed(
        p.dir.path(),
        &p.key,
        "other",
        &[("files/a/1/amd64/a", b"alpha"), ("files/c", b"c")],
        None,
    );
    refused(&p.diff, &other, &trust, "another bundle");
    // A full bundle given as the differential.
    refused(&p.base, &p.base, &trust, "not a differential one");
    // A chain: a differential as the base.
    let (chained, _) = signed(p.dir.path(), &p.key, "chained", NEW, Some((&other_m, &digest(&other_m))));
    let e = refused(&p.diff, &chained, &trust, "not supported yet");
    assert!(matches!(&e, UnpackError::Base(d) if d.is_unsupported()));
    // A differential that takes from its base what the base lacks.
    let (forged, _) = forged_claim(&p, "files/q", b"q");
    refused(&forged, &p.base, &trust, "has no such member");
    // The base tampered with (a byte flipped), or signed by another key.
    let flipped = p.dir.path().join("flipped.tar.zst");
    let mut bytes = std::fs::read(&p.base).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 1;
    std::fs::write(&flipped, &bytes).unwrap();
    std::fs::copy(format!("{}.minisig", p.base.display()), format!("{}.minisig", flipped.display())).unwrap();
    refused(&p.diff, &flipped, &trust, "signature");
    let (key2, public2) = (p.dir.path().join("k2.key"), p.dir.path().join("k2.pub"));
    kubexm_builder::sign::keygen(&key2, &public2, true, false).unwrap();
    let resigned = p.dir.path().join("resigned.tar.zst");
    std::fs::copy(&p.base, &resigned).unwrap();
    kubexm_builder::sign::sign(&resigned, &key2, "kubexm bundle t").unwrap();
    refused(&p.diff, &resigned, &trust, "signature");
    // The differential's bundle.yaml changed after signing.
    let tampered = p.dir.path().join("tampered.tar.zst");
    let mut m = kubexm_bundle::verify::read_manifest(&p.diff).unwrap();
    m.members.iter_mut().for_each(|x| x.from_base = false);
    let members = carried_members(NEW, &m);
    pack(&tampered, &m, &members, 1, &|_| {}).unwrap();
    std::fs::copy(format!("{}.minisig", p.diff.display()), format!("{}.minisig", tampered.display())).unwrap();
    refused(&tampered, &p.base, &trust, "signature");
}

/// Issue 33: an install from a differential bundle needs its base file
/// (the registry host unpacks the bundle too); a full bundle takes none.
#[test]
fn a_deploy_needs_the_base_of_a_differential_and_refuses_one_for_a_full_bundle() {
    let p = pair();
    let trust = Trust::PublicKey(p.public.clone());
    let diff_m = kubexm_bundle::verify::read_manifest(&p.diff).unwrap();
    let e = kubexm_installer::unpack::check_deploy(&p.diff, &diff_m, None, &trust, true).unwrap_err();
    assert!(
        matches!(e, UnpackError::NeedBase { .. }) && e.to_string().contains("--base FILE"),
        "{e}"
    );
    kubexm_installer::unpack::check_deploy(&p.diff, &diff_m, Some(&p.base), &trust, true).unwrap();
    let e = kubexm_installer::unpack::check_deploy(&p.base, &p.base_m, Some(&p.base), &trust, true).unwrap_err();
    assert!(e.to_string().contains("not a differential one"), "{e}");
    kubexm_installer::unpack::check_deploy(&p.base, &p.base_m, None, &trust, true).unwrap();
    assert!(!p.dir.path().join("root").exists());
}

/// The pack members of `content` that `m` carries.
fn carried_members(content: &[(&str, &[u8])], m: &BundleManifest) -> Vec<PackMember> {
    content
        .iter()
        .filter(|(p, _)| m.carried().any(|x| x.path == *p))
        .map(|(p, d)| PackMember {
            path: p.to_string(),
            size: d.len() as u64,
            sha256: sha256_hex(d),
            source: Source::Bytes(d.to_vec()),
        })
        .collect()
}

/// A signed differential of `p`'s base that claims `path` (with `data`)
/// comes from the base, which lacks it.
fn forged_claim(p: &Pair, path: &str, data: &[u8]) -> (PathBuf, BundleManifest) {
    let mut content: Vec<(&str, &[u8])> = NEW.to_vec();
    content.push((path, data));
    let mut m = manifest(vec![]);
    m.members = content
        .iter()
        .map(|(x, d)| kubexm_bundle::manifest::Member {
            path: x.to_string(),
            size: d.len() as u64,
            sha256: sha256_hex(d),
            from_base: false,
        })
        .collect();
    kubexm_bundle::diff::make_differential(&mut m, &p.base_m, &digest(&p.base_m)).unwrap();
    m.members.iter_mut().filter(|x| x.path == path).for_each(|x| x.from_base = true);
    let bundle = p.dir.path().join("forged.tar.zst");
    pack(&bundle, &m, &carried_members(&content, &m), 1, &|_| {}).unwrap();
    let comment = format!("kubexm bundle t bundle.yaml sha256:{}", sha256_hex(m.to_yaml().unwrap().as_bytes()));
    kubexm_builder::sign::sign(&bundle, &p.key, &comment).unwrap();
    (bundle, m)
}
