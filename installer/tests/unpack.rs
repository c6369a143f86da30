//! Verify and unpack: signature before anything, members while streaming,
//! nothing written outside the target, nothing half-written.

use std::path::{Path, PathBuf};

use kubexm_bundle::digest::sha256_hex;
use kubexm_bundle::manifest::Member;
use kubexm_bundle::pack::{PackMember, Source, listing, pack};
use kubexm_bundle::testing::manifest;
use kubexm_installer::unpack::{Trust, UnpackError, unpack};

struct Fixture {
    dir: tempfile::TempDir,
    bundle: PathBuf,
    public: PathBuf,
}

/// A small signed bundle.
fn signed() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let members: Vec<PackMember> = [
        ("files/a/1/amd64/a", b"alpha".to_vec()),
        ("manifests/m/1/m.yaml", b"kind: X\n".to_vec()),
    ]
    .into_iter()
    .map(|(p, d)| PackMember {
        path: p.into(),
        size: d.len() as u64,
        sha256: sha256_hex(&d),
        source: Source::Bytes(d),
    })
    .collect();
    let bundle = dir.path().join("k.tar.zst");
    pack(&bundle, &manifest(listing(&members)), &members, 1, &|_| {}).unwrap();
    let (secret, public) = (dir.path().join("k.key"), dir.path().join("k.pub"));
    kubexm_builder::sign::keygen(&secret, &public, true, false).unwrap();
    kubexm_builder::sign::sign(&bundle, &secret, "test").unwrap();
    Fixture { dir, bundle, public }
}

fn entries(root: &Path) -> Vec<String> {
    match std::fs::read_dir(root.join("bundles")) {
        Ok(rd) => rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => vec![],
    }
}

#[test]
fn unpacks_once_then_is_a_no_op() {
    let f = signed();
    let root = f.dir.path().join("root");
    let u = unpack(&f.bundle, &Trust::PublicKey(f.public.clone()), &root).unwrap();
    assert!(u.fresh);
    assert_eq!(std::fs::read(u.dir.join("files/a/1/amd64/a")).unwrap(), b"alpha");
    let again = unpack(&f.bundle, &Trust::PublicKey(f.public.clone()), &root).unwrap();
    assert!(!again.fresh);
    assert_eq!(again.dir, u.dir);
    assert_eq!(entries(&root).len(), 1, "{:?}", entries(&root));
}

fn flip(path: &Path, at: usize) {
    let mut b = std::fs::read(path).unwrap();
    let i = at.min(b.len() - 1);
    b[i] ^= 0x01;
    std::fs::write(path, b).unwrap();
}

#[test]
fn a_flipped_byte_in_the_archive_is_refused_before_unpacking() {
    let f = signed();
    let root = f.dir.path().join("root");
    let len = std::fs::metadata(&f.bundle).unwrap().len() as usize;
    flip(&f.bundle, len / 2);
    let err = unpack(&f.bundle, &Trust::PublicKey(f.public.clone()), &root).unwrap_err();
    assert!(
        matches!(err, UnpackError::Verify(kubexm_bundle::verify::VerifyError::BadSignature { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("do not use it"), "{err}");
    assert!(entries(&root).is_empty(), "something was written: {:?}", entries(&root));
}

#[test]
fn a_flipped_byte_in_the_signature_is_refused() {
    let f = signed();
    let root = f.dir.path().join("root");
    let sig = f.dir.path().join("k.tar.zst.minisig");
    // Flip a byte inside the base64 signature line (the second line).
    let text = std::fs::read_to_string(&sig).unwrap();
    let at = text.find('\n').unwrap() + 10;
    flip(&sig, at);
    let err = unpack(&f.bundle, &Trust::PublicKey(f.public.clone()), &root).unwrap_err();
    assert!(matches!(err, UnpackError::Verify(_)), "{err}");
    assert!(entries(&root).is_empty());
}

#[test]
fn a_missing_signature_is_refused_without_allow_unsigned() {
    let f = signed();
    std::fs::remove_file(f.dir.path().join("k.tar.zst.minisig")).unwrap();
    let err = unpack(&f.bundle, &Trust::PublicKey(f.public.clone()), &f.dir.path().join("root")).unwrap_err();
    assert!(err.to_string().contains("--allow-unsigned"), "{err}");
    // The CLI maps it to the verification exit code.
    let out = assert_cmd::Command::cargo_bin("kubexm-install")
        .unwrap()
        .args(["unpack", "--bundle"])
        .arg(&f.bundle)
        .arg("--pubkey")
        .arg(&f.public)
        .arg("--root")
        .arg(f.dir.path().join("root"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(6));
}

#[test]
fn crafted_archives_are_refused_and_nothing_lands_outside() {
    use tar::EntryType as T;
    let dir = tempfile::tempdir().unwrap();
    let listed = |p: &str, d: &[u8]| {
        manifest(vec![Member {
            path: p.into(),
            size: d.len() as u64,
            sha256: sha256_hex(d),
        }])
        .to_yaml()
        .unwrap()
    };
    let cases: Vec<(&str, String, &str, &[u8], T)> = vec![
        ("traversal", listed("../../escaped", b"x"), "../../escaped", b"x", T::Regular),
        (
            "absolute path",
            listed("/tmp/kubexm-escaped-abs", b"x"),
            "/tmp/kubexm-escaped-abs",
            b"x",
            T::Regular,
        ),
        ("escaping symlink", listed("files/link", b""), "files/link", b"", T::Symlink),
        ("escaping hardlink", listed("files/hard", b""), "files/hard", b"", T::Link),
        ("device file", listed("files/dev", b""), "files/dev", b"", T::Char),
        ("unlisted member", listed("files/a", b"x"), "files/b", b"x", T::Regular),
    ];
    for (what, yaml, path, data, kind) in cases {
        let bundle = dir.path().join("crafted.tar.zst");
        kubexm_bundle::testing::raw_archive(&bundle, &[("bundle.yaml", yaml.as_bytes(), T::Regular), (path, data, kind)]).unwrap();
        let root = dir.path().join("state/root");
        let err = unpack(&bundle, &Trust::Unsigned, &root).unwrap_err();
        assert!(matches!(err, UnpackError::Verify(_)), "{what}: {err}");
        assert!(entries(&root).is_empty(), "{what}: left {:?}", entries(&root));
        assert!(
            !dir.path().join("state/escaped").exists() && !dir.path().join("escaped").exists(),
            "{what}: wrote outside"
        );
        assert!(!Path::new("/tmp/kubexm-escaped-abs").exists(), "{what}: wrote an absolute path");
    }
}
