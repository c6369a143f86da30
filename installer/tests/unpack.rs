//! Verify and unpack: signature before anything, members while streaming,
//! nothing written outside the target, nothing half-written.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

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
    // The trusted comment the builder writes, naming bundle.yaml's sha256.
    let yaml = manifest(listing(&members)).to_yaml().unwrap();
    let comment = format!("kubexm bundle t bundle.yaml sha256:{}", sha256_hex(yaml.as_bytes()));
    kubexm_builder::sign::sign(&bundle, &secret, &comment).unwrap();
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
            from_base: false,
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

/// Bytes in the files under `root`.
fn bytes_under(root: &Path) -> u64 {
    tree(root)
        .iter()
        .filter_map(|p| std::fs::symlink_metadata(root.join(p)).ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

/// Watches the bytes under a root while an unpack runs: the peak seen, and
/// a tripwire the bundle's reader checks, so that code which writes a bomb
/// out stops at [`DiskWatch::TRIP`] instead of filling the disk.
struct DiskWatch {
    peak: Arc<AtomicU64>,
    tripped: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DiskWatch {
    const TRIP: u64 = 64 << 20;

    fn start(root: &Path) -> DiskWatch {
        let (peak, tripped, stop) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (p, t, s, root) = (peak.clone(), tripped.clone(), stop.clone(), root.to_path_buf());
        let thread = std::thread::spawn(move || {
            while !s.load(Relaxed) {
                let now = bytes_under(&root);
                p.fetch_max(now, Relaxed);
                t.fetch_or(now > Self::TRIP, Relaxed);
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        });
        DiskWatch {
            peak,
            tripped,
            stop,
            thread: Some(thread),
        }
    }

    /// The bundle at `path`, read until the tripwire fires, in small reads:
    /// a bomb's compressed bytes are few, and one large read would take
    /// them all before the tripwire could fire.
    fn reader(&self, path: &Path) -> impl std::io::Read + Send + use<> {
        struct Tripwire(std::fs::File, Arc<AtomicBool>);
        impl std::io::Read for Tripwire {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                if self.1.load(Relaxed) {
                    return Err(std::io::Error::other("tripwire: the unpack wrote more than 64 MiB"));
                }
                let end = buf.len().min(512);
                self.0.read(&mut buf[..end])
            }
        }
        Tripwire(std::fs::File::open(path).unwrap(), self.tripped.clone())
    }

    /// Stops watching; the peak bytes seen.
    fn finish(mut self) -> u64 {
        self.stop.store(true, Relaxed);
        self.thread.take().unwrap().join().unwrap();
        self.peak.load(Relaxed)
    }
}

/// `bundle.yaml` listing one member of `size` bytes with a made-up digest.
fn lying_yaml(path: &str, size: u64) -> String {
    manifest(vec![Member {
        path: path.into(),
        size,
        sha256: "0".repeat(64),
        from_base: false,
    }])
    .to_yaml()
    .unwrap()
}

// Members were written while streaming and the signature's verdict came at
// the end, so a zstd bomb beside a copied valid signature filled
// /var/lib/kubexm before it was refused.
#[test]
fn a_10_gib_zstd_bomb_beside_a_copied_signature_writes_nothing() {
    use kubexm_bundle::testing::Bomb;
    use kubexm_installer::unpack::{signature_check, unpack_opened};
    let f = signed();
    let bomb = f.dir.path().join("bomb.tar.zst");
    let member = "images/blobs/sha256/x";
    let compressed = Bomb::member(&lying_yaml(member, 10 << 30), member, 10 << 10).write(&bomb).unwrap();
    std::fs::copy(f.dir.path().join("k.tar.zst.minisig"), f.dir.path().join("bomb.tar.zst.minisig")).unwrap();
    let root = f.dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let check = signature_check(&bomb, &Trust::PublicKey(f.public.clone())).unwrap();
    let watch = DiskWatch::start(&root);
    let started = std::time::Instant::now();
    let err = unpack_opened(watch.reader(&bomb), &bomb, check.as_ref(), &root).unwrap_err();
    let (elapsed, peak) = (started.elapsed(), watch.finish());
    eprintln!(
        "10 GiB bomb, {compressed} bytes compressed, signed copy: refused in {elapsed:?}, peak {peak} bytes under --root, {} at the end",
        bytes_under(&root)
    );
    assert!(err.to_string().contains("do not use it"), "{err}");
    assert_eq!(peak, 0, "bytes were written before the refusal");
    assert!(tree(&root).is_empty(), "left {:?}", tree(&root));
}

// Without a signature (--allow-unsigned) nothing authenticates bundle.yaml:
// what it declares must fit the free space before the first member is
// written, and no more is written.
#[test]
fn a_bomb_declaring_more_than_the_free_space_writes_nothing() {
    use kubexm_bundle::testing::{Bomb, header_block};
    let dir = tempfile::tempdir().unwrap();
    let bomb_path = dir.path().join("bomb.tar.zst");
    let member = "images/blobs/sha256/x";
    let mut bomb = Bomb::member(&lying_yaml(member, 1 << 50), member, 256);
    let at = bomb.head.len() - 512;
    bomb.head[at..].copy_from_slice(&header_block(member, 1 << 50, tar::EntryType::Regular));
    bomb.write(&bomb_path).unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let watch = DiskWatch::start(&root);
    let result = kubexm_installer::unpack::unpack_opened(watch.reader(&bomb_path), &bomb_path, None, &root);
    let peak = watch.finish();
    let err = result.unwrap_err();
    eprintln!("1 PiB declared, unsigned: {err}; peak {peak} bytes under --root");
    assert!(err.to_string().contains("bytes free"), "{err}");
    assert!(err.to_string().contains("bomb.tar.zst"), "{err}");
    assert_eq!(peak, 0, "bytes were written before the refusal");
    assert!(tree(&root).is_empty(), "left {:?}", tree(&root));
}

// A signature made with `minisign -S` names no bundle.yaml in its trusted
// comment, so nothing could refuse a forged bundle.yaml before members were
// written: such a signature is now checked over the whole file first.
#[test]
fn a_bomb_beside_a_copied_plain_minisign_signature_is_refused_before_decompressing() {
    use kubexm_bundle::testing::Bomb;
    let f = signed();
    let (secret, public) = (f.dir.path().join("plain.key"), f.dir.path().join("plain.pub"));
    kubexm_builder::sign::keygen(&secret, &public, true, false).unwrap();
    kubexm_builder::sign::sign(&f.bundle, &secret, "timestamp:1764000000\tfile:k.tar.zst").unwrap();
    let bomb = f.dir.path().join("bomb.tar.zst");
    let member = "images/blobs/sha256/x";
    Bomb::member(&lying_yaml(member, 10 << 30), member, 10 << 10).write(&bomb).unwrap();
    std::fs::copy(f.dir.path().join("k.tar.zst.minisig"), f.dir.path().join("bomb.tar.zst.minisig")).unwrap();
    let root = f.dir.path().join("root");
    let started = std::time::Instant::now();
    let err = unpack(&bomb, &Trust::PublicKey(public.clone()), &root).unwrap_err();
    eprintln!("plain-signed copy beside a 10 GiB bomb: refused in {:?}", started.elapsed());
    assert!(err.to_string().contains("do not use it"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert!(tree(&root).is_empty(), "left {:?}", tree(&root));
    // The bundle itself, with that signature, still unpacks.
    let u = unpack(&f.bundle, &Trust::PublicKey(public), &root).unwrap();
    assert_eq!(std::fs::read(u.dir.join("files/a/1/amd64/a")).unwrap(), b"alpha");
}
