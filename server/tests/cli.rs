//! The `kubexm` command's own refusals (issue 24, item 10; issue 31: `controller-manager`).

use assert_cmd::Command;

/// A PostgreSQL password is never taken from the command line.
#[test]
fn a_password_in_the_database_url_is_refused() {
    for url in [
        "postgres://kubexm:s3cret@127.0.0.1/kubexm",
        "postgres://kubexm@127.0.0.1/kubexm?password=s3cret",
    ] {
        let out = Command::cargo_bin("kubexm")
            .unwrap()
            .args(["--db", url, "get", "jobs"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("~/.pgpass") && !err.contains("s3cret"), "{err}");
    }
}

/// A client config naming a plain-HTTP server is refused: no token in the clear.
#[test]
fn a_client_config_without_https_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), "kxm_x").unwrap();
    std::fs::write(dir.path().join("ca.crt"), "").unwrap();
    let cfg = dir.path().join("client.yaml");
    std::fs::write(&cfg, "server: http://10.0.0.5:8443\nca: ca.crt\ntokenFile: token\n").unwrap();
    let out = Command::cargo_bin("kubexm")
        .unwrap()
        .arg("--config")
        .arg(&cfg)
        .args(["get", "jobs"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("is not https://"), "{err}");
}

/// The plain-HTTP health listener is for loopback only.
#[test]
fn a_health_listener_off_loopback_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::cargo_bin("kubexm")
        .unwrap()
        .arg("--db")
        .arg(dir.path().join("jobs.db"))
        .args([
            "api-server",
            "--no-worker",
            "--health-listen",
            "0.0.0.0:8444",
            "--listen",
            "127.0.0.1:0",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("loopback only"), "{err}");
}

/// `kubexm controller-manager` names a kubeconfig it cannot read, and
/// refuses a Lease duration too short to renew within.
#[test]
fn the_controller_manager_names_a_bad_kubeconfig_and_refuses_a_short_lease() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nowhere.conf");
    let out = Command::cargo_bin("kubexm")
        .unwrap()
        .args(["controller-manager", "--kubeconfig"])
        .arg(&missing)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains(&*missing.to_string_lossy()), "{err}");
    let out = Command::cargo_bin("kubexm")
        .unwrap()
        .args(["controller-manager", "--lease-seconds", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
}
