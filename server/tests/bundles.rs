//! Issue 24, item 3: a held bundle is a copy the operator cannot rewrite
//! after its check, and a job installs only the bundle it names.

use std::os::unix::fs::{MetadataExt, PermissionsExt};

mod common;
use common::{held_bundle, held_bundle_of};

#[test]
fn a_held_bundle_is_a_checked_copy_and_an_install_refuses_any_other() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (digest, _) = held_bundle(d);
    let held = kubexm_server::bundles::find(&d.join("bundles"), &digest).unwrap();
    // Issue 24, item 10: only the OpenAPI pattern's spelling names a bundle.
    for other in [
        digest.to_uppercase().replace("SHA256", "sha256"),
        digest[7..].to_string(),
        format!("{digest}\n"),
    ] {
        assert!(kubexm_server::bundles::find(&d.join("bundles"), &other).is_err(), "{other:?}");
    }
    let (orig, copy) = (std::fs::metadata(d.join("k.tar.zst")).unwrap(), std::fs::metadata(&held).unwrap());
    assert_ne!(orig.ino(), copy.ino(), "the held bundle is a link to the operator's file");
    assert_eq!(copy.permissions().mode() & 0o777, 0o644);
    assert_eq!(std::fs::metadata(d.join("bundles")).unwrap().permissions().mode() & 0o777, 0o755);
    // The operator's file rewritten afterwards: the held copy is unchanged.
    let before = std::fs::read(&held).unwrap();
    std::fs::write(d.join("k.tar.zst"), b"rewritten").unwrap();
    assert_eq!(std::fs::read(&held).unwrap(), before);

    // Another signed bundle put in the held one's place: refused before anything is installed.
    let other = tempfile::tempdir().unwrap();
    let (other_digest, _) = held_bundle_of(other.path(), b"beta");
    assert_ne!(other_digest, digest);
    let other_file = kubexm_server::bundles::find(&other.path().join("bundles"), &other_digest).unwrap();
    std::fs::copy(&other_file, &held).unwrap();
    std::fs::copy(format!("{}.minisig", other_file.display()), format!("{}.minisig", held.display())).unwrap();
    let pub2 = other.path().join("k.pub");
    // Loopback addresses: a regression reaches nothing outside this machine.
    let config = include_str!("../../manifests/templates/cluster.example.yaml").replace("192.168.10.", "127.0.10.");
    std::fs::write(d.join("cluster.yaml"), config).unwrap();
    use kubexm_installer::ops::session::{Config, Session, Settings};
    let settings = Settings {
        engine: kubexm_installer::ops::EngineSettings {
            state: d.join("state.db"),
            accept_new_host_key: false,
            concurrency: 1,
            events: None,
            stop: None,
            trust: Default::default(),
            connect_timeout: kubexm_installer::ops::CONNECT_TIMEOUT,
            connect_attempts: kubexm_installer::ops::CONNECT_ATTEMPTS,
            owner: Default::default(),
        },
        root: d.join("root"),
        pubkey: Some(pub2),
        base: None,
        advertise: Some("127.0.0.1".parse().unwrap()),
        serve_port: 0,
        kubeconfig: None,
        installer: None,
    };
    let session = Session::open(&Config::File(d.join("cluster.yaml")), Some(&held), None, settings).unwrap();
    let opts = kubexm_installer::ops::install::InstallOptions {
        expect_digest: Some(digest.clone()),
        ..Default::default()
    };
    let e = format!("{:#}", kubexm_installer::ops::install::install(&session, &opts).unwrap_err());
    assert!(e.contains("is not the bundle this job asked for") && e.contains(&digest), "{e}");
    assert!(!d.join("root/pki").exists(), "PKI was made for a refused bundle");
}

/// Issue 33: `kubexm bundle add` holds a differential bundle only beside
/// its base, checked against it.
#[test]
fn a_differential_bundle_is_held_only_beside_its_base() {
    use kubexm_bundle::pack::{PackMember, Source, listing, pack};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (secret, public) = (d.join("k.key"), d.join("k.pub"));
    kubexm_builder::sign::keygen(&secret, &public, true, false).unwrap();
    let signed = |name: &str, content: &[(&str, &[u8])], base: Option<&kubexm_bundle::manifest::BundleManifest>| {
        let mut members: Vec<PackMember> = content
            .iter()
            .map(|(p, x)| PackMember {
                path: p.to_string(),
                size: x.len() as u64,
                sha256: kubexm_bundle::digest::sha256_hex(x),
                source: Source::Bytes(x.to_vec()),
            })
            .collect();
        let mut m = kubexm_bundle::testing::manifest(listing(&members));
        if let Some(b) = base {
            let digest = format!("sha256:{}", kubexm_bundle::digest::sha256_hex(b.to_yaml().unwrap().as_bytes()));
            kubexm_bundle::diff::make_differential(&mut m, b, &digest).unwrap();
            members.retain(|x| m.carried().any(|c| c.path == x.path));
        }
        let path = d.join(name);
        pack(&path, &m, &members, 1, &|_| {}).unwrap();
        kubexm_builder::sign::sign(&path, &secret, "test").unwrap();
        (path, m)
    };
    let (base, base_m) = signed("old.tar.zst", &[("files/a", b"a")], None);
    let (diff, _) = signed("new.tar.zst", &[("files/a", b"a"), ("files/b", b"b")], Some(&base_m));
    let held = d.join("held");
    let e = kubexm_server::bundles::add(&diff, &public, &held).unwrap_err();
    assert!(matches!(e, kubexm_server::bundles::BundleError::NoBase { .. }), "{e}");
    assert!(e.to_string().contains("add the base first"), "{e}");
    assert_eq!(
        kubexm_server::bundles::list(&held).unwrap(),
        Vec::<String>::new(),
        "a refused bundle was kept"
    );
    let b = kubexm_server::bundles::add(&base, &public, &held).unwrap();
    let x = kubexm_server::bundles::add(&diff, &public, &held).unwrap();
    let m = kubexm_bundle::verify::read_manifest(&x.path).unwrap();
    assert_eq!(kubexm_server::bundles::base_of(&held, &x.path, &m).unwrap(), Some(b.path));
}
