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
                from_base: false,
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

/// Issue 33: a byte flipped in a bill of materials the bundle carries is
/// refused like in any other member, naming it.
#[test]
fn a_flipped_byte_in_a_bill_of_materials_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for format in kubexm_bundle::sbom::FORMATS {
        let bill = kubexm_bundle::sbom::write(&manifest(listing(&sample())), format);
        let mut flipped = bill.clone();
        flipped[bill.len() / 2] ^= 1;
        let name = format.file_name();
        let yaml = yaml_for(&[(name, &bill)]);
        let out = raw(dir.path(), &[("bundle.yaml", yaml.as_bytes(), REG), (name, &flipped, REG)]);
        match check_members(&out, &mut Discard).unwrap_err() {
            VerifyError::BadDigest { member, .. } => assert_eq!(member, name),
            e => panic!("unexpected {e}"),
        }
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

/// Set to a bundle's path, makes [`read_manifest_in_a_child`] read it.
const CHILD_BUNDLE: &str = "KUBEXM_TEST_CHILD_BUNDLE";

/// Not a check of its own: the child process of [`peak_memory_of_read_manifest`],
/// so that no other test's memory counts in its peak.
#[test]
fn read_manifest_in_a_child() {
    let Some(path) = std::env::var_os(CHILD_BUNDLE) else { return };
    let result = match read_manifest(Path::new(&path)) {
        Ok(_) => "ok".to_string(),
        Err(e) => e.to_string().replace('\n', " "),
    };
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let peak = status.lines().find_map(|l| l.strip_prefix("VmHWM:")).unwrap();
    println!("\nRESULT {result}\nPEAK_KB {}", peak.trim().trim_end_matches(" kB"));
}

/// `read_manifest` of `bundle` in a child process: its outcome and peak RSS in KiB.
fn peak_memory_of_read_manifest(bundle: &Path) -> (String, u64) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["read_manifest_in_a_child", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_BUNDLE, bundle)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let field = |key: &str| stdout.lines().find_map(|l| l.strip_prefix(key)).map(str::to_string);
    let (Some(result), Some(peak)) = (field("RESULT "), field("PEAK_KB ")) else {
        panic!("the child printed no result: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    };
    (result, peak.parse().unwrap())
}

// A 100 MB PAX or GNU long-name header before bundle.yaml was read whole
// into memory by the tar crate, in paths that check no signature first
// (inspect, install's validation, the catalog).
#[test]
fn a_100_mb_extension_header_is_refused_in_little_memory() {
    use kubexm_bundle::testing::Bomb;
    let dir = tempfile::tempdir().unwrap();
    let yaml = yaml_for(&[]);
    let small = dir.path().join("small.tar.zst");
    Bomb::extension(b'x', 0, &yaml).write(&small).unwrap();
    let (result, baseline) = peak_memory_of_read_manifest(&small);
    assert_eq!(result, "ok");
    for kind in [b'x', b'L', b'K'] {
        let out = dir.path().join("header.tar.zst");
        let compressed = Bomb::extension(kind, 100, &yaml).write(&out).unwrap();
        let (result, peak) = peak_memory_of_read_manifest(&out);
        eprintln!(
            "type '{}': 100 MiB header, {compressed} bytes compressed: peak RSS {peak} KiB (an empty one: {baseline} KiB)",
            kind as char
        );
        assert!(
            result.contains("header.tar.zst: ") && result.contains("extension header"),
            "{result}"
        );
        assert!(result.contains("at most 65536"), "{result}");
        assert!(peak < 50 * 1024, "type '{}': peak RSS {peak} KiB", kind as char);
    }
}

// A PAX `size` record moves the next header where a reader that checks the
// headers does not look; a sparse member grows the tar crate's block list
// with every extension block.
#[test]
fn pax_size_records_and_sparse_members_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = yaml_for(&[("files/x", b"a")]);
    let cases: Vec<(&str, Vec<Entry>)> = vec![
        (
            "sets a member's size",
            vec![
                ("pax", b"16 size=1048576\n", tar::EntryType::XHeader),
                ("bundle.yaml", yaml.as_bytes(), REG),
            ],
        ),
        (
            "sparse",
            vec![("bundle.yaml", yaml.as_bytes(), REG), ("files/x", b"a", tar::EntryType::GNUSparse)],
        ),
    ];
    for (want, entries) in cases {
        let out = raw(dir.path(), &entries);
        let err = check_members(&out, &mut Discard).unwrap_err().to_string();
        assert!(err.contains(want), "expected {want:?} in: {err}");
    }
}

// bundle.yaml itself is bounded before it is read.
#[test]
fn an_oversized_bundle_yaml_is_refused_unread() {
    use kubexm_bundle::testing::Bomb;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("big.tar.zst");
    let mut bomb = Bomb::member("", "x", 0);
    bomb.head = kubexm_bundle::testing::header_block("bundle.yaml", 100 << 20, REG).to_vec();
    bomb.runs = 100;
    bomb.tail.clear();
    bomb.write(&out).unwrap();
    let (result, peak) = peak_memory_of_read_manifest(&out);
    assert!(result.contains("is not a regular file of at most 16777216 bytes"), "{result}");
    assert!(peak < 50 * 1024, "peak RSS {peak} KiB");
}
