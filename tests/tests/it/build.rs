//! `kubexm-bundle build` against the lab's fixture upstream, with every
//! upstream mapped (`--strict-mirrors`), checked with outside tools.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kubexm_e2e::{Lab, bin, fixture_control, fixture_stats, ok, text};

/// `kubexm-bundle inspect -o json` of `bundle`.
fn inspect(bundle: &Path) -> serde_json::Value {
    serde_json::from_str(&ok(
        Command::new(bin("kubexm-bundle"))
            .args(["inspect", "-o", "json", "--bundle"])
            .arg(bundle)
            .output()
            .unwrap(),
        "inspect",
    ))
    .unwrap()
}

/// `bundle` unpacked with GNU tar into the new directory `dir`.
fn untar(bundle: &Path, dir: &Path) {
    std::fs::create_dir(dir).unwrap();
    ok(
        Command::new("tar")
            .arg("--zstd")
            .arg("-xf")
            .arg(bundle)
            .arg("-C")
            .arg(dir)
            .output()
            .unwrap(),
        "tar -x",
    );
}

/// `kubexm-bundle verify` of `bundle` with `public`.
fn verify(bundle: &Path, public: &Path) -> Output {
    Command::new(bin("kubexm-bundle"))
        .arg("verify")
        .arg("--bundle")
        .arg(bundle)
        .arg("--pubkey")
        .arg(public)
        .output()
        .unwrap()
}

struct Build {
    dir: tempfile::TempDir,
    cache: PathBuf,
}

impl Build {
    fn new() -> Build {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        Build { dir, cache }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `kubexm-bundle keygen` of `NAME.key` and `NAME.pub` (no password).
    fn keygen(&self, name: &str) -> (PathBuf, PathBuf) {
        let (key, public) = (self.path(&format!("{name}.key")), self.path(&format!("{name}.pub")));
        ok(
            Command::new(bin("kubexm-bundle"))
                .args(["keygen", "--no-password", "--secret-key"])
                .arg(&key)
                .arg("--public-key")
                .arg(&public)
                .output()
                .unwrap(),
            "keygen",
        );
        (key, public)
    }

    /// `kubexm-bundle build` of `config` into `bundle` with the lab catalog and any extra args.
    fn run(&self, lab: &Lab, config: &Path, bundle: &str, extra: &[&str]) -> Output {
        kubexm_e2e::build_command(lab, config, &self.cache, &self.path(bundle))
            .args(extra)
            .output()
            .unwrap()
    }
}

#[test]
fn build_inspect_verify_extract_and_rebuild_identically() {
    let Some(lab) = Lab::up(1, 0) else { return };
    let b = Build::new();
    let (key, public) = b.keygen("k");
    let summary = ok(
        b.run(
            &lab,
            &lab.desc.cluster,
            "k.tar.zst",
            &["--key", key.to_str().unwrap(), "-o", "json"],
        ),
        "build",
    );
    let summary: serde_json::Value = serde_json::from_str(&summary).unwrap();
    assert_eq!(summary["files"], 18);
    assert!(summary["images"].as_u64().unwrap() >= 13, "{summary}");
    let bundle = b.path("k.tar.zst");

    // inspect lists every BOM item, without unpacking.
    let m = inspect(&bundle);
    let bom: serde_json::Value = serde_json::from_str(&ok(
        Command::new(bin("kubexm-bundle"))
            .arg("bom")
            .arg("-f")
            .arg(&lab.desc.cluster)
            .arg("--catalog")
            .arg(&lab.desc.fixture.catalog)
            .args(["-o", "json"])
            .output()
            .unwrap(),
        "bom",
    ))
    .unwrap();
    let members: Vec<&str> = m["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["path"].as_str().unwrap())
        .collect();
    for kind in ["files", "manifests", "charts"] {
        for item in bom[kind].as_array().unwrap() {
            assert!(
                members.contains(&item["path"].as_str().unwrap()),
                "{kind} {} is not in the bundle",
                item["path"]
            );
        }
    }
    let locked: Vec<&str> = m["lock"]["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["reference"].as_str().unwrap())
        .collect();
    for i in bom["images"].as_array().unwrap() {
        assert!(
            locked.contains(&i["reference"].as_str().unwrap()),
            "image {} is not in the lock",
            i["reference"]
        );
    }
    // Images found in the manifests were added, with pinned digests.
    assert!(
        locked.contains(&"docker.io/calico/node:v3.28.1") && locked.contains(&"quay.io/metallb/speaker:v0.14.8"),
        "{locked:?}"
    );
    assert!(
        m["lock"]["images"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["digest"].as_str().is_some_and(|d| d.starts_with("sha256:")))
    );
    let human = ok(
        Command::new(bin("kubexm-bundle"))
            .arg("inspect")
            .arg("--bundle")
            .arg(&bundle)
            .output()
            .unwrap(),
        "inspect",
    );
    assert!(
        human.contains("FILES arm64") && human.contains("IMAGES") && human.contains("CHARTS"),
        "{human}"
    );

    // verify, and the minisign CLI, accept it.
    ok(verify(&bundle, &public), "verify");
    let mv = ok(
        Command::new("minisign")
            .arg("-Vm")
            .arg(&bundle)
            .arg("-p")
            .arg(&public)
            .output()
            .unwrap(),
        "minisign -V",
    );
    assert!(mv.contains("kubexm bundle lab bundle.yaml sha256:"), "{mv}");

    // tar lists it, bundle.yaml first; skopeo reads an image from the extracted layout.
    let list = ok(
        Command::new("tar").arg("--zstd").arg("-tf").arg(&bundle).output().unwrap(),
        "tar -t",
    );
    assert_eq!(list.lines().next(), Some("bundle.yaml"));
    let x = b.path("x");
    untar(&bundle, &x);
    bills_of_materials(&bundle, &x, &m);
    let pause = m["lock"]["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["reference"] == "registry.k8s.io/pause:3.10.2")
        .unwrap();
    let raw = Command::new("skopeo")
        .arg("inspect")
        .arg("--raw")
        .arg(format!("oci:{}/images:registry.k8s.io/pause:3.10.2", x.display()))
        .output()
        .unwrap();
    assert!(raw.status.success(), "skopeo: {}", text(&raw.stderr));
    assert_eq!(
        format!("sha256:{}", kubexm_bundle::digest::sha256_hex(&raw.stdout)),
        pause["digest"].as_str().unwrap()
    );
    let img = ok(
        Command::new("skopeo")
            .arg("inspect")
            .arg(format!("oci:{}/images:registry.k8s.io/pause:3.10.2", x.display()))
            .output()
            .unwrap(),
        "skopeo inspect",
    );
    assert!(img.contains("\"Architecture\": \"amd64\""), "{img}");

    // A second build from the warm cache asks the fixture upstream nothing and gives the same bytes.
    fixture_control(&lab, "stats/reset", "{}");
    let again: serde_json::Value =
        serde_json::from_str(&ok(b.run(&lab, &lab.desc.cluster, "k2.tar.zst", &["-o", "json"]), "rebuild")).unwrap();
    assert_eq!(fixture_stats(&lab)["requests"], 0, "the warm build made upstream requests");
    assert_eq!(again["upstreamRequests"], 0);
    assert_eq!(again["downloadedBytes"], 0);
    assert!(
        std::fs::read(&bundle).unwrap() == std::fs::read(b.path("k2.tar.zst")).unwrap(),
        "two builds from the same cache differ"
    );
    differential_bundle(&lab, &b, &bundle, &key, &public);
    controller_image(&lab, &b, &key);
}

/// Issue 31: with `operator.enabled: true` the bundle carries the
/// controller's image, made from the `kubexm` binary, amd64 only (the one
/// binary given), pinned in the lock; two builds give the same bytes;
/// skopeo reads it; its layer alone, as a root file system, runs `kubexm`
/// as its user 65532 (nothing from this machine but the kernel).
fn controller_image(lab: &Lab, b: &Build, key: &Path) {
    let config = b.path("operator.yaml");
    let yaml = std::fs::read_to_string(&lab.desc.cluster).unwrap();
    assert!(yaml.contains("  bundle:\n"), "{yaml}");
    std::fs::write(&config, yaml.replace("  bundle:\n", "  operator: {enabled: true}\n  bundle:\n")).unwrap();
    let kubexm = bin("kubexm");
    bin("kubexm-install"); // beside it, into the image too
    let flag = format!("amd64={}", kubexm.display());
    let args = ["--key", key.to_str().unwrap(), "--controller-binary", &flag, "-o", "json"];
    let t0 = std::time::Instant::now();
    ok(b.run(lab, &config, "op.tar.zst", &args), "build with the controller's image");
    eprintln!("the build with the controller's image: {:.1} s", t0.elapsed().as_secs_f64());
    ok(b.run(lab, &config, "op2.tar.zst", &args), "build again");
    let bundle = b.path("op.tar.zst");
    assert!(
        std::fs::read(&bundle).unwrap() == std::fs::read(b.path("op2.tar.zst")).unwrap(),
        "two builds with the controller's image differ"
    );
    let m = inspect(&bundle);
    let reference = format!("kubexm.io/kubexm:{}", env!("CARGO_PKG_VERSION"));
    let image = m["lock"]["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["reference"] == reference.as_str())
        .unwrap_or_else(|| panic!("{reference} is not in the lock: {}", m["lock"]["images"]))
        .clone();
    assert_eq!(image["platforms"], serde_json::json!(["linux/amd64"]), "{image}");
    assert!(image.get("source").is_none(), "{image}");
    let x = b.path("op");
    untar(&bundle, &x);
    let layout = format!("oci:{}/images:{reference}", x.display());
    let raw = Command::new("skopeo").args(["inspect", "--raw", &layout]).output().unwrap();
    assert!(raw.status.success(), "skopeo: {}", text(&raw.stderr));
    assert_eq!(
        format!("sha256:{}", kubexm_bundle::digest::sha256_hex(&raw.stdout)),
        image["digest"].as_str().unwrap()
    );
    let copied = b.path("op-dir");
    ok(
        Command::new("skopeo")
            .args(["copy", "--override-arch", "amd64", &layout])
            .arg(format!("dir:{}", copied.display()))
            .output()
            .unwrap(),
        "skopeo copy",
    );
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(copied.join("manifest.json")).unwrap()).unwrap();
    let config_hex = manifest["config"]["digest"].as_str().unwrap().trim_start_matches("sha256:");
    let image_config: serde_json::Value = serde_json::from_slice(&std::fs::read(copied.join(config_hex)).unwrap()).unwrap();
    assert_eq!(image_config["config"]["User"], "65532:65532", "{image_config}");
    assert_eq!(image_config["config"]["Entrypoint"], serde_json::json!(["/usr/local/bin/kubexm"]));
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "{manifest}");
    let layer = copied.join(layers[0]["digest"].as_str().unwrap().trim_start_matches("sha256:"));
    let root = b.path("op-root");
    std::fs::create_dir(&root).unwrap();
    ok(
        Command::new("tar").arg("-xf").arg(&layer).arg("-C").arg(&root).output().unwrap(),
        "tar -x of the layer",
    );
    // Run as the image's user, in its root: nothing of this machine's but the kernel.
    let in_root = |args: &[&str]| {
        ok(
            Command::new("chroot")
                .arg("--userspec=65532:65532")
                .arg(&root)
                .args(args)
                .output()
                .unwrap(),
            &format!("{} in the image's root", args.join(" ")),
        )
    };
    let version = in_root(&["/usr/local/bin/kubexm", "--version"]);
    assert!(version.starts_with("kubexm "), "{version}");
    let help = in_root(&["/usr/local/bin/kubexm", "controller-manager", "--help"]);
    assert!(help.contains("--lease-seconds"), "{help}");
    let installer = in_root(&["/usr/local/bin/kubexm-install", "--version"]);
    assert!(installer.starts_with("kubexm-install "), "{installer}");
    // Only the binary, its loader and libraries, and the user's files.
    let files = ok(Command::new("find").arg(&root).args(["-type", "f"]).output().unwrap(), "find");
    for f in files.lines() {
        let f = f.strip_prefix(root.to_str().unwrap()).unwrap();
        assert!(
            [
                "/usr/local/bin/kubexm",
                "/usr/local/bin/kubexm-install",
                "/etc/passwd",
                "/etc/group"
            ]
            .contains(&f)
                || f.contains(".so"),
            "{f} is in the controller's image"
        );
    }
}

/// Issue 33: the lab's bundle as the base, and the same config with one
/// more image as the new content. The differential carries exactly what
/// the base lacks, and unpacks with its base into what the full new bundle
/// unpacks to; it describes the full content; it is deterministic too.
fn differential_bundle(lab: &Lab, b: &Build, base: &Path, key: &Path, public: &Path) {
    let config = b.path("more.yaml");
    let text_in = std::fs::read_to_string(&lab.desc.cluster)
        .unwrap()
        .replace("  bundle:\n", "  bundle:\n    extraImages: [docker.io/library/nginx:1.27-lab]\n");
    std::fs::write(&config, text_in).unwrap();
    let k = ["--key", key.to_str().unwrap(), "-o", "json"];
    let built = |name: &str, extra: &[&str]| -> serde_json::Value {
        let args: Vec<&str> = k.iter().chain(extra).copied().collect();
        serde_json::from_str(&ok(b.run(lab, &config, name, &args), name)).unwrap()
    };
    let full = built("new.tar.zst", &[]);
    // The figure's baseline: the same full build again, from the warm cache.
    let warm_full = built("new2.tar.zst", &[])["seconds"].as_f64().unwrap();
    let with_base = ["--base", base.to_str().unwrap(), "--pubkey", public.to_str().unwrap()];
    let diff = built("new-diff.tar.zst", &with_base);
    let again = built("new-diff2.tar.zst", &with_base);
    let (full_path, diff_path) = (b.path("new.tar.zst"), b.path("new-diff.tar.zst"));
    assert!(
        std::fs::read(&diff_path).unwrap() == std::fs::read(b.path("new-diff2.tar.zst")).unwrap(),
        "two differential builds from the same inputs differ"
    );
    let (base_m, full_m, diff_m) = (inspect(base), inspect(&full_path), inspect(&diff_path));
    let pairs = |m: &serde_json::Value| -> std::collections::BTreeSet<(String, String)> {
        m["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| (x["path"].as_str().unwrap().to_string(), x["sha256"].as_str().unwrap().to_string()))
            .collect()
    };
    // It lists the full content, and carries exactly what the base lacks.
    assert_eq!(pairs(&diff_m), pairs(&full_m));
    let carried: std::collections::BTreeSet<String> = diff_m["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["fromBase"] != true)
        .map(|x| x["path"].as_str().unwrap().to_string())
        .collect();
    let lacking: std::collections::BTreeSet<String> = pairs(&full_m).difference(&pairs(&base_m)).map(|(p, _)| p.clone()).collect();
    assert_eq!(carried, lacking);
    assert!(carried.iter().any(|p| p.starts_with("images/blobs/")), "{carried:?}");
    let listed = ok(
        Command::new("tar").arg("--zstd").arg("-tf").arg(&diff_path).output().unwrap(),
        "tar -t",
    );
    let in_archive: std::collections::BTreeSet<String> = listed.lines().skip(1).map(str::to_string).collect();
    assert_eq!(
        in_archive, carried,
        "the archive holds other members than bundle.yaml says it carries"
    );
    let base_digest = format!(
        "sha256:{}",
        kubexm_bundle::digest::sha256_hex(
            &std::process::Command::new("tar")
                .arg("--zstd")
                .arg("-xOf")
                .arg(base)
                .arg("bundle.yaml")
                .output()
                .unwrap()
                .stdout
        )
    );
    assert_eq!(diff_m["base"]["digest"], base_digest.as_str());
    assert_eq!(diff["base"], base_digest.as_str());
    let human = ok(
        Command::new(bin("kubexm-bundle"))
            .args(["inspect", "--bundle"])
            .arg(&diff_path)
            .output()
            .unwrap(),
        "inspect",
    );
    assert!(human.contains(&format!("differential bundle of base {base_digest}")), "{human}");
    // The bills describe the full content: the same as the full bundle's.
    for format in ["spdx", "cyclonedx"] {
        let sbom = |bundle: &Path| {
            ok(
                Command::new(bin("kubexm-bundle"))
                    .args(["inspect", "--sbom", format, "--bundle"])
                    .arg(bundle)
                    .output()
                    .unwrap(),
                "inspect --sbom",
            )
        };
        assert!(
            sbom(&diff_path) == sbom(&full_path),
            "{format}: the differential's bill is not the full content's"
        );
    }
    // verify: alone (the base named), and with its base.
    let alone = ok(verify(&diff_path, public), "verify");
    assert!(alone.contains("pass --base FILE"), "{alone}");
    let pair = ok(
        Command::new(bin("kubexm-bundle"))
            .args(["verify", "--bundle"])
            .arg(&diff_path)
            .arg("--pubkey")
            .arg(public)
            .arg("--base")
            .arg(base)
            .output()
            .unwrap(),
        "verify --base",
    );
    assert!(pair.contains("the base's signature is good"), "{pair}");
    // Unpacked with its base: the full bundle's directory, file for file.
    let (r1, r2) = (b.path("root-diff"), b.path("root-full"));
    let refused = kubexm_e2e::unpack_command(&diff_path, public, &r1).output().unwrap();
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused.stderr));
    assert!(text(&refused.stderr).contains("pass --base FILE"), "{}", text(&refused.stderr));
    assert!(!r1.exists(), "a refused unpack wrote under its root");
    let unsigned = Command::new(bin("kubexm-install"))
        .args(["unpack", "--allow-unsigned", "--bundle"])
        .arg(&diff_path)
        .arg("--base")
        .arg(base)
        .arg("--root")
        .arg(&r1)
        .output()
        .unwrap();
    assert_eq!(unsigned.status.code(), Some(2), "{}", text(&unsigned.stderr));
    assert!(!r1.exists(), "a refused unpack wrote under its root");
    ok(
        kubexm_e2e::unpack_command(&diff_path, public, &r1)
            .arg("--base")
            .arg(base)
            .output()
            .unwrap(),
        "unpack --base",
    );
    ok(kubexm_e2e::unpack_command(&full_path, public, &r2).output().unwrap(), "unpack");
    let id = full["bundleYamlSha256"].as_str().unwrap();
    let same = Command::new("diff")
        .arg("-r")
        .arg(r1.join("bundles").join(id))
        .arg(r2.join("bundles").join(id))
        .output()
        .unwrap();
    assert!(
        same.status.success(),
        "base + differential unpack differently from the full bundle:\n{}",
        text(&same.stdout)
    );
    // The full content's bills, as the pair unpacked them, pass the validators.
    bills_of_materials(&diff_path, &r1.join("bundles").join(id), &diff_m);
    // A differential signed with another key than its base's is refused (an
    // install checks both with one key), and nothing is kept.
    let (key2, _) = b.keygen("k2");
    let other_key = [
        "--key",
        key2.to_str().unwrap(),
        "--base",
        base.to_str().unwrap(),
        "--pubkey",
        public.to_str().unwrap(),
    ];
    let other = b.run(lab, &config, "other-key.tar.zst", &other_key);
    assert_eq!(other.status.code(), Some(2), "{}", text(&other.stderr));
    assert!(
        text(&other.stderr).contains("sign with the base's --key"),
        "{}",
        text(&other.stderr)
    );
    assert!(
        !b.path("other-key.tar.zst").exists(),
        "a differential signed with another key was kept"
    );
    // The figures (issue 33): size ratio and build time against a full build, both from a warm cache.
    let (full_size, diff_size) = (full["bundleSize"].as_f64().unwrap(), diff["bundleSize"].as_f64().unwrap());
    let figures = format!(
        "differential bundle (one more image): {diff_size} bytes, {:.4} of the full new bundle ({full_size} bytes); \
         {} members carried (bundle.yaml included), {} taken from the base; build {:.1} s against {warm_full:.1} s \
         for a full build of the same content (warm cache)\n",
        diff_size / full_size,
        diff["members"],
        diff["fromBaseMembers"],
        again["seconds"].as_f64().unwrap()
    );
    eprint!("{figures}");
    let _ = std::fs::create_dir_all("/var/cache/kubexm-lab/timelines")
        .and_then(|()| std::fs::write("/var/cache/kubexm-lab/timelines/differential-bundle.txt", &figures));
}

/// Issue 33: the bundle carries both bills of materials, byte for byte
/// what `inspect --sbom` writes from its bundle.yaml; every member's sha256
/// is in both; SPDX's own validator (pyspdxtools) and CycloneDX's 1.6
/// schema (cyclonedx-python-lib) accept them. `x`: the bundle extracted;
/// `m`: `inspect -o json`.
fn bills_of_materials(bundle: &std::path::Path, x: &std::path::Path, m: &serde_json::Value) {
    let venv = std::path::PathBuf::from(std::env::var("KUBEXM_SBOM_VENV").unwrap_or_else(|_| "/var/cache/kubexm-lab/venv-sbom".into()));
    for (format, file) in [("spdx", "sbom.spdx.json"), ("cyclonedx", "sbom.cdx.json")] {
        let printed = Command::new(bin("kubexm-bundle"))
            .args(["inspect", "--sbom", format, "--bundle"])
            .arg(bundle)
            .output()
            .unwrap();
        assert!(printed.status.success(), "inspect --sbom {format}: {}", text(&printed.stderr));
        let carried = std::fs::read(x.join(file)).unwrap();
        assert!(
            printed.stdout == carried,
            "inspect --sbom {format} differs from the bundle's {file}"
        );
        let doc = String::from_utf8(carried).unwrap();
        for member in m["members"].as_array().unwrap() {
            let (path, sha) = (member["path"].as_str().unwrap(), member["sha256"].as_str().unwrap());
            assert!(path.starts_with("sbom.") || doc.contains(sha), "{file}: {path} ({sha}) missing");
        }
        // Each image's platform manifests, as the lock pins them.
        let platforms: Vec<&str> = m["lock"]["images"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|i| i["platformManifests"].as_object())
            .flat_map(|p| p.values().filter_map(|d| d.as_str()?.strip_prefix("sha256:")))
            .collect();
        assert!(!platforms.is_empty(), "no image index in the lab bundle");
        for d in platforms {
            assert!(doc.contains(d), "{file}: platform manifest {d} missing");
        }
        let check = if format == "spdx" {
            Command::new(venv.join("bin/pyspdxtools")).arg("-i").arg(x.join(file)).output()
        } else {
            Command::new(venv.join("bin/python"))
                .arg(kubexm_e2e::repo_root().join("ci/lab.d/cyclonedx-validate"))
                .arg(x.join(file))
                .output()
        };
        match check {
            Ok(out) => assert!(
                out.status.success(),
                "{file} is not valid:\n{}{}",
                text(&out.stdout),
                text(&out.stderr)
            ),
            Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => {
                panic!("the SBOM validators in {} cannot run ({e}); ci/test installs them", venv.display())
            }
            Err(e) => eprintln!("skipping the {format} validator: {} ({e}); ci/test installs it", venv.display()),
        }
    }
}

#[test]
fn wrong_catalog_digest_fails_and_names_the_artifact() {
    let Some(lab) = Lab::up(1, 0) else { return };
    let b = Build::new();
    let bad = b.path("bad-catalog.yaml");
    std::fs::write(
        &bad,
        format!(
            "components:\n  etcd:\n    versions:\n      \"v3.6.16\": {{amd64: \"{}\"}}\n",
            "ab".repeat(32)
        ),
    )
    .unwrap();
    let out = b.run(&lab, &lab.desc.cluster, "k.tar.zst", &["--catalog", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(6), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("etcd v3.6.16 amd64")
            && err.contains("sha256 mismatch")
            && err.contains(&"ab".repeat(32))
            && err.contains("etcd-v3.6.16-linux-amd64.tar.gz"),
        "{err}"
    );
    assert!(!b.path("k.tar.zst").exists(), "an archive was written");
}

#[test]
fn a_download_cut_mid_file_is_resumed() {
    let Some(lab) = Lab::up(1, 0) else { return };
    let b = Build::new();
    let path = "/github.com/containerd/containerd/releases/download/v1.6.20/containerd-1.6.20-linux-amd64.tar.gz";
    fixture_control(&lab, "fault", &format!(r#"{{"path": "{path}", "cut_after": 4000000}}"#));
    ok(b.run(&lab, &lab.desc.cluster, "k.tar.zst", &[]), "build");
    let stats = fixture_stats(&lab);
    assert!(stats["paths"][path].as_u64().unwrap_or(0) >= 2, "{stats}");
    assert!(
        stats["ranged"][path].as_u64().unwrap_or(0) >= 1,
        "the retry did not resume with Range: {stats}"
    );
}

#[test]
fn a_missing_image_fails_before_any_archive_is_written() {
    let Some(lab) = Lab::up(1, 0) else { return };
    let b = Build::new();
    let config = b.path("cluster.yaml");
    let text_in = std::fs::read_to_string(&lab.desc.cluster)
        .unwrap()
        .replace("  bundle:\n", "  bundle:\n    extraImages: [docker.io/library/nope:1]\n");
    std::fs::write(&config, text_in).unwrap();
    let out = b.run(&lab, &config, "k.tar.zst", &[]);
    assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("image docker.io/library/nope:1"),
        "{}",
        text(&out.stderr)
    );
    let left: Vec<_> = std::fs::read_dir(b.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != "cluster.yaml" && n != "cache")
        .collect();
    assert!(left.is_empty(), "files left beside the bundle: {left:?}");
}

/// The minisign CLI as a real peer: its default (prehashed) signature is
/// accepted by `verify` and `unpack`; its legacy one (`-l`) is refused, with
/// the reason and what to do, not as a changed bundle.
#[test]
fn legacy_minisign_signature_gets_a_false_explanation() {
    if Command::new("minisign").arg("-v").output().is_err() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but the minisign CLI is missing"
        );
        eprintln!("SKIP: the minisign CLI is missing (ci/lab prepare installs it)");
        return;
    }
    let b = Build::new();
    let bundle = b.path("k.tar.zst");
    let data = b"alpha".to_vec();
    let members = vec![kubexm_bundle::pack::PackMember {
        path: "files/a/1/amd64/a".into(),
        size: data.len() as u64,
        sha256: kubexm_bundle::digest::sha256_hex(&data),
        source: kubexm_bundle::pack::Source::Bytes(data),
    }];
    let listing = kubexm_bundle::pack::listing(&members);
    kubexm_bundle::pack::pack(&bundle, &kubexm_bundle::testing::manifest(listing), &members, 1, &|_| {}).unwrap();
    let (public, secret) = (b.path("m.pub"), b.path("m.key"));
    ok(
        Command::new("minisign")
            .arg("-GW")
            .arg("-p")
            .arg(&public)
            .arg("-s")
            .arg(&secret)
            .output()
            .unwrap(),
        "minisign -G",
    );
    let sign = |legacy: bool| {
        let mut c = Command::new("minisign");
        c.arg("-S").arg("-s").arg(&secret).arg("-m").arg(&bundle);
        if legacy {
            c.arg("-l");
        }
        ok(c.output().unwrap(), "minisign -S");
    };
    let verify = || verify(&bundle, &public);
    let unpack = |root: &str| kubexm_e2e::unpack_command(&bundle, &public, &b.path(root)).output().unwrap();
    sign(false);
    ok(verify(), "verify of a minisign signature");
    ok(unpack("root-ok"), "unpack of a minisign signature");
    sign(true);
    for (what, out) in [("verify", verify()), ("unpack", unpack("root-legacy"))] {
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(6), "{what}: {err}");
        assert!(err.contains("legacy") && err.contains("without -l"), "{what}: {err}");
        assert!(!err.contains("was changed"), "{what} gives a false explanation: {err}");
    }
    assert!(!b.path("root-legacy/bundles").exists(), "unpack of a legacy signature left files");
}
