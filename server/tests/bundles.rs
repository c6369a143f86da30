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
