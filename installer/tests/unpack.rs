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

/// A reader over the opened bundle that runs `action` once, when the read
/// position first reaches `at`: a deterministic moment "between the reads".
struct At<F: FnMut()> {
    file: std::fs::File,
    pos: u64,
    at: u64,
    action: Option<F>,
}

impl<F: FnMut()> std::io::Read for At<F> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.pos >= self.at
            && let Some(mut a) = self.action.take()
        {
            a();
        }
        // Reads stop at the moment, so it is reached exactly.
        let room = if self.pos < self.at {
            (self.at - self.pos) as usize
        } else {
            buf.len()
        };
        let end = buf.len().min(room.max(1));
        let n = std::io::Read::read(&mut self.file, &mut buf[..end])?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// An unsigned payload shaped like the signed bundle, with other content.
fn payload(dir: &Path) -> Vec<u8> {
    let data = b"EVIL!".to_vec();
    let members = vec![PackMember {
        path: "files/a/1/amd64/a".into(),
        size: data.len() as u64,
        sha256: sha256_hex(&data),
        source: Source::Bytes(data),
    }];
    let p = dir.join("payload.tar.zst");
    pack(&p, &manifest(listing(&members)), &members, 1, &|_| {}).unwrap();
    std::fs::read(&p).unwrap()
}

/// Every file under `root`, as paths relative to it.
fn tree(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(root).unwrap().display().to_string());
            if p.is_dir() {
                stack.push(p);
            }
        }
    }
    out
}

#[test]
fn unpack_signature_not_tied_to_what_is_unpacked_bundle_replaced_between_reads() {
    use kubexm_installer::unpack::{signature_check, unpack_opened};
    let f = signed();
    let original = std::fs::read(&f.bundle).unwrap();
    let evil = payload(f.dir.path());
    let len = original.len() as u64;
    let trust = Trust::PublicKey(f.public.clone());

    // Moment 1: after the key and signature are read, before the bundle is opened.
    let root = f.dir.path().join("root-before-open");
    std::fs::create_dir(&root).unwrap();
    let check = signature_check(&f.bundle, &trust).unwrap();
    std::fs::write(&f.bundle, &evil).unwrap();
    let file = std::fs::File::open(&f.bundle).unwrap();
    let err = unpack_opened(file, &f.bundle, check.as_ref(), &root).unwrap_err();
    assert!(err.to_string().contains("do not use it"), "{err}");
    assert!(tree(&root).is_empty(), "left {:?}", tree(&root));

    // Later moments: just after open, after bundle.yaml, mid-members, at the
    // end. Replacing the file by rename cannot change what is read (one
    // descriptor); overwriting it in place changes the bytes, which the
    // signature then refuses. Either way nothing unsigned is unpacked.
    let moments = [
        ("just after open", 0),
        ("after bundle.yaml", 512 + 1),
        ("mid-members", len / 2),
        ("at the end", len),
    ];
    for (moment, at) in moments {
        for in_place in [false, true] {
            let how = if in_place { "overwritten in place" } else { "replaced by rename" };
            std::fs::write(&f.bundle, &original).unwrap();
            let root = f.dir.path().join(format!("root-{at}-{in_place}"));
            std::fs::create_dir(&root).unwrap();
            let check = signature_check(&f.bundle, &trust).unwrap();
            let (path, evil) = (f.bundle.clone(), evil.clone());
            let reader = At {
                file: std::fs::File::open(&f.bundle).unwrap(),
                pos: 0,
                at,
                action: Some(move || {
                    if in_place {
                        let mut w = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                        std::io::Write::write_all(&mut w, &evil).unwrap();
                    } else {
                        let other = path.with_extension("swap");
                        std::fs::write(&other, &evil).unwrap();
                        std::fs::rename(&other, &path).unwrap();
                    }
                }),
            };
            match unpack_opened(reader, &f.bundle, check.as_ref(), &root) {
                Ok(u) => {
                    assert!(!in_place || at >= len, "{moment}, {how}: changed bytes were accepted");
                    assert_eq!(
                        std::fs::read(u.dir.join("files/a/1/amd64/a")).unwrap(),
                        b"alpha",
                        "{moment}, {how}: unpacked what was not signed"
                    );
                }
                Err(e) => {
                    assert!(in_place, "{moment}, {how}: the signed bytes were refused: {e}");
                    assert!(e.to_string().contains("do not use it"), "{moment}, {how}: {e}");
                    assert!(tree(&root).is_empty(), "{moment}, {how}: left {:?}", tree(&root));
                }
            }
        }
    }
}

#[test]
fn unpack_signature_not_tied_to_what_is_unpacked_trusted_comment_names_another_bundle_yaml() {
    let f = signed();
    let root = f.dir.path().join("root");
    // Signed by the right key, but its comment names another bundle.yaml.
    let secret = f.dir.path().join("k.key");
    kubexm_builder::sign::sign(
        &f.bundle,
        &secret,
        &format!("kubexm bundle x bundle.yaml sha256:{}", "0".repeat(64)),
    )
    .unwrap();
    let err = unpack(&f.bundle, &Trust::PublicKey(f.public.clone()), &root).unwrap_err();
    assert!(err.to_string().contains("trusted comment names bundle.yaml"), "{err}");
    assert!(tree(&root).is_empty(), "left {:?}", tree(&root));
}
