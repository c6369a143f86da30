//! Offline OS packages: Debian repositories built from the lab's signed
//! fixture archive into the bundle, installed on lab hosts (amd64 and the
//! emulated arm64) from the file server with no other apt source, and every
//! way a repository is refused: a bad InRelease signature, a .deb whose hash
//! differs from the index, and a dependency that cannot be met.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kubexm_e2e::{Background, Lab, bin, build_command, free_port, ok, text};

/// The lab cluster config with `extra` OS packages and, if given, another mirror.
fn config(lab: &Lab, dir: &Path, extra: &str, mirror: Option<&str>) -> PathBuf {
    let mut s = std::fs::read_to_string(&lab.desc.cluster).unwrap();
    s = s.replace("osPackages: {releases", &format!("osPackages: {{extra: [{extra}], releases"));
    if let Some(m) = mirror {
        let start = s.find("mirror: \"").unwrap() + "mirror: \"".len();
        let end = start + s[start..].find('"').unwrap();
        s.replace_range(start..end, m);
    }
    let p = dir.join(format!("cluster-{}.yaml", extra.len() + mirror.map_or(0, str::len)));
    std::fs::write(&p, s).unwrap();
    p
}

fn build(lab: &Lab, dir: &Path, cfg: &Path) -> Output {
    build_command(lab, cfg, &dir.join("cache"), &dir.join("k.tar.zst"))
        .output()
        .unwrap()
}

fn archive(lab: &Lab) -> PathBuf {
    lab.desc.fixture.catalog.parent().unwrap().join("files/debian")
}

/// A copy of the fixture archive served over HTTP on loopback, after `tamper` ran on it.
fn tampered_mirror(lab: &Lab, dir: &Path, tamper: impl Fn(&Path)) -> (Background, String) {
    let copy = dir.join("mirror");
    ok(
        Command::new("cp").arg("-a").arg(archive(lab)).arg(&copy).output().unwrap(),
        "copying the fixture archive",
    );
    tamper(&copy);
    let port = free_port("127.0.0.1");
    let url = format!("http://127.0.0.1:{port}");
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "http.server", "--bind", "127.0.0.1", &port.to_string(), "--directory"])
        .arg(&copy);
    let probe = format!("{url}/dists/bookworm/Release");
    let server = Background::start_probe(cmd, move || {
        Command::new("curl")
            .args(["-sf", "-o", "/dev/null", &probe])
            .status()
            .is_ok_and(|s| s.success())
    });
    (server, url)
}

#[test]
fn repositories_are_built_served_and_installed_on_amd64_and_arm64() {
    let Some(lab) = Lab::up(2, 1) else { return };
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&lab, dir.path(), "haproxy, keepalived, conntrack, socat", None);
    ok(build(&lab, dir.path(), &cfg), "build with osPackages");
    let bundle = dir.path().join("k.tar.zst");
    let listing = text(&Command::new("tar").arg("--zstd").arg("-tf").arg(&bundle).output().unwrap().stdout);
    for arch in ["amd64", "arm64"] {
        for f in ["Packages", "Packages.gz", "Release"] {
            assert!(
                listing.contains(&format!("os/debian-bookworm/{arch}/{f}\n")),
                "{arch} {f} missing:\n{listing}"
            );
        }
        assert!(listing.contains(&format!("os/debian-bookworm/{arch}/haproxy_")), "{listing}");
        assert!(listing.contains(&format!("os/debian-bookworm/{arch}/keepalived_")), "{listing}");
    }
    // The base set (priority required here) is not carried.
    assert!(!listing.contains("/libc6_") && !listing.contains("/dpkg_"), "{listing}");

    let root = dir.path().join("root");
    let unpacked = ok(
        Command::new(bin("kubexm-install"))
            .args(["unpack", "--allow-unsigned", "-o", "json", "--bundle"])
            .arg(&bundle)
            .arg("--root")
            .arg(&root)
            .output()
            .unwrap(),
        "unpack",
    );
    let bdir = serde_json::from_str::<serde_json::Value>(&unpacked).unwrap()["dir"]
        .as_str()
        .unwrap()
        .to_string();
    let addr = format!("{}:{}", lab.desc.gateway, free_port(&lab.desc.gateway));
    let mut serve = Command::new(bin("kubexm-install"));
    // Over TLS from the installer's CA: the hosts' apt source checks no
    // signature, so plain http is refused.
    let pki = dir.path().join("pki");
    serve
        .args(["serve", "--no-registry", "--bundle-dir", &bdir, "--listen", &addr, "--pki-dir"])
        .arg(&pki);
    let _server = Background::start(serve, "serving on");
    let host_ca = "/tmp/kubexm-packages-ca.crt";
    // Hosts have their own (unreachable) apt source, which must be put back after.
    for h in ["lab1", "lab2"] {
        lab.ssh_ok(h, "test -s /etc/apt/sources.list && ! command -v haproxy");
        lab.copy_to(h, &pki.join("ca.crt"), host_ca);
    }
    let packages = |state: &Path| {
        Command::new(bin("kubexm-install"))
            .args(["packages", "-f"])
            .arg(&cfg)
            .args([
                "--bundle-dir",
                &bdir,
                "--file-server",
                &format!("https://{addr}"),
                "--host-ca",
                host_ca,
                "--state",
            ])
            .arg(state)
            .output()
            .unwrap()
    };
    let state = dir.path().join("state.db");
    let first = ok(packages(&state), "packages");
    assert!(
        first.contains("lab1: ") && first.contains("haproxy 2.6") && first.contains("lab2: "),
        "{first}"
    );
    for h in ["lab1", "lab2"] {
        let v = lab.ssh_ok(h, "haproxy -v | head -1; keepalived --version 2>&1 | head -1; uname -m");
        assert!(v.contains("HAProxy version 2.6") && v.contains("Keepalived v2"), "{h}: {v}");
        assert!(v.contains(if h == "lab2" { "aarch64" } else { "x86_64" }), "{h}: {v}");
        // Only the bundle's source was used, and the host's own came back.
        lab.ssh_ok(
            h,
            "test -s /etc/apt/sources.list && test ! -e /etc/apt/sources.list.d/kubexm-bundle.list",
        );
    }
    // The installed versions are in the state.
    let status = kubexm_e2e::status(&state);
    assert!(status.contains("os-packages") && status.contains("applied"), "{status}");
    let raw = String::from_utf8_lossy(&std::fs::read(&state).unwrap()).into_owned();
    assert!(raw.contains("keepalived 1:2.2"), "versions not recorded in the state");
    // A re-run changes nothing.
    let again = ok(packages(&state), "packages again");
    assert!(
        again.contains("lab1: already installed") && again.contains("lab2: already installed"),
        "{again}"
    );
}

#[test]
fn tampered_archives_and_unmet_dependencies_are_refused() {
    let Some(lab) = Lab::up(1, 0) else { return };
    let dir = tempfile::tempdir().unwrap();

    // 1. InRelease whose signed text was changed: the signature fails (exit 6).
    let d1 = dir.path().join("sig");
    std::fs::create_dir_all(&d1).unwrap();
    let (_s1, url1) = tampered_mirror(&lab, &d1, |m| {
        let p = m.join("dists/bookworm/InRelease");
        let t = std::fs::read_to_string(&p)
            .unwrap()
            .replace("Codename: bookworm", "Codename: bookwurm");
        std::fs::write(p, t).unwrap();
    });
    let out = build(&lab, &d1, &config(&lab, &d1, "socat", Some(&url1)));
    assert_eq!(out.status.code(), Some(6), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("InRelease") && err.contains("signature") && err.contains("debian-bookworm"),
        "{err}"
    );

    // 2. A .deb whose bytes differ from the index's SHA256: refused (exit 6), naming the package.
    let d2 = dir.path().join("deb");
    std::fs::create_dir_all(&d2).unwrap();
    let (_s2, url2) = tampered_mirror(&lab, &d2, |m| {
        let pool = m.join("pool/main/s/socat");
        for e in std::fs::read_dir(&pool).unwrap() {
            let p = e.unwrap().path();
            let mut b = std::fs::read(&p).unwrap();
            let n = b.len() / 2;
            b[n] ^= 0xff;
            std::fs::write(&p, b).unwrap();
        }
    });
    let out = build(&lab, &d2, &config(&lab, &d2, "socat", Some(&url2)));
    assert_eq!(out.status.code(), Some(6), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("socat") && err.contains("sha256 mismatch"), "{err}");
    assert!(!d2.join("k.tar.zst").exists(), "a bundle was written");

    // 3. A dependency that cannot be met: the build fails (exit 3) and names the chain.
    let d3 = dir.path().join("dep");
    std::fs::create_dir_all(&d3).unwrap();
    let out = build(&lab, &d3, &config(&lab, &d3, "kubexm-lab-broken, nosuch-package", None));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("kubexm-lab-broken → kubexm-lab-middle → kubexm-lab-absent (>= 1.0): not in the archive"),
        "{err}"
    );
    assert!(
        err.contains("nosuch-package: not in the archive") && err.contains("debian-bookworm amd64"),
        "{err}"
    );
}
