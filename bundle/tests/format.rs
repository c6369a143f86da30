//! The bundle format: pack, then read back; every deviation is refused.

use std::path::Path;

use kubexm_bundle::digest::sha256_hex;
use kubexm_bundle::manifest::Member;
use kubexm_bundle::pack::{PackMember, Source, listing, pack};
use kubexm_bundle::testing::manifest;
use kubexm_bundle::verify::{Discard, VerifyError, check_members, read_manifest};

fn member(path: &str, data: &[u8]) -> PackMember {
    PackMember {
        path: path.into(),
        size: data.len() as u64,
        sha256: sha256_hex(data),
        source: Source::Bytes(data.to_vec()),
    }
}

fn sample() -> Vec<PackMember> {
    vec![
        member("files/a/1/amd64/a", b"hello"),
        member("images/blobs/sha256/x", &vec![7u8; 300_000]),
        member("manifests/m/1/m.yaml", b"kind: X\n"),
    ]
}

fn packed(dir: &Path, name: &str) -> std::path::PathBuf {
    let out = dir.join(name);
    let members = sample();
    pack(&out, &manifest(listing(&members)), &members, 2, &|_| {}).unwrap();
    out
}

#[test]
fn round_trip_and_bundle_yaml_first() {
    let dir = tempfile::tempdir().unwrap();
    let out = packed(dir.path(), "b.tar.zst");
    let m = check_members(&out, &mut Discard).unwrap();
    assert_eq!(m.members.len(), 3);
    assert_eq!(read_manifest(&out).unwrap(), m);
    // No temporary file is left beside the bundle.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn same_inputs_same_bytes_whatever_the_worker_count() {
    let dir = tempfile::tempdir().unwrap();
    let a = packed(dir.path(), "a.tar.zst");
    let members = sample();
    let b = dir.path().join("b.tar.zst");
    pack(&b, &manifest(listing(&members)), &members, 7, &|_| {}).unwrap();
    assert_eq!(std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
}

#[test]
fn a_member_that_changed_while_packing_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut members = sample();
    members[0].sha256 = sha256_hex(b"something else");
    let out = dir.path().join("b.tar.zst");
    let err = pack(&out, &manifest(listing(&members)), &members, 1, &|_| {}).unwrap_err();
    assert!(err.to_string().contains("files/a/1/amd64/a changed while packing"), "{err}");
    assert!(!out.exists(), "a failed pack left an archive");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "a failed pack left a temporary file"
    );
}

fn raw(dir: &Path, entries: &[Entry]) -> std::path::PathBuf {
    let out = dir.join("raw.tar.zst");
    kubexm_bundle::testing::raw_archive(&out, entries).unwrap();
    out
}

fn yaml_for(entries: &[(&str, &[u8])]) -> String {
    manifest(
        entries
            .iter()
            .map(|(p, d)| Member {
                path: p.to_string(),
                size: d.len() as u64,
                sha256: sha256_hex(d),
            })
            .collect(),
    )
    .to_yaml()
    .unwrap()
}

const REG: tar::EntryType = tar::EntryType::Regular;

use kubexm_bundle::testing::RawEntry as Entry;

#[test]
fn tampered_member_is_named_with_both_digests() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = yaml_for(&[("files/x", b"good")]);
    let out = raw(dir.path(), &[("bundle.yaml", yaml.as_bytes(), REG), ("files/x", b"evil", REG)]);
    match check_members(&out, &mut Discard).unwrap_err() {
        VerifyError::BadDigest {
            member, expected, actual, ..
        } => {
            assert_eq!(member, "files/x");
            assert_eq!(expected, sha256_hex(b"good"));
            assert_eq!(actual, sha256_hex(b"evil"));
        }
        e => panic!("unexpected {e}"),
    }
}

#[test]
fn unsafe_or_unlisted_members_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = yaml_for(&[("files/x", b"a")]);
    let cases: Vec<(&str, Vec<Entry>)> = vec![
        (
            "not listed",
            vec![
                ("bundle.yaml", yaml.as_bytes(), REG),
                ("files/x", b"a", REG),
                ("files/extra", b"b", REG),
            ],
        ),
        ("unsafe path", vec![("bundle.yaml", yaml.as_bytes(), REG), ("../escape", b"a", REG)]),
        (
            "unsafe path",
            vec![("bundle.yaml", yaml.as_bytes(), REG), ("/etc/passwd", b"a", REG)],
        ),
        (
            "Symlink",
            vec![("bundle.yaml", yaml.as_bytes(), REG), ("files/x", b"", tar::EntryType::Symlink)],
        ),
        (
            "Char",
            vec![("bundle.yaml", yaml.as_bytes(), REG), ("files/x", b"", tar::EntryType::Char)],
        ),
        (
            "not bundle.yaml",
            vec![("files/x", b"a", REG), ("bundle.yaml", yaml.as_bytes(), REG)],
        ),
        ("missing from the archive", vec![("bundle.yaml", yaml.as_bytes(), REG)]),
        ("bytes;", vec![("bundle.yaml", yaml.as_bytes(), REG), ("files/x", b"ab", REG)]),
    ];
    for (want, entries) in cases {
        let out = raw(dir.path(), &entries);
        let err = check_members(&out, &mut Discard).unwrap_err().to_string();
        assert!(err.contains(want), "expected {want:?} in: {err}");
    }
}
