//! kubexm-install refuses what is not built yet, after validating the config.

use assert_cmd::Command;

#[test]
fn install_is_refused_as_not_supported_yet() {
    let ha = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/ha.yaml");
    let out = Command::cargo_bin("kubexm-install")
        .unwrap()
        .args(["-f", ha, "--bundle", "k.tar.zst"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(8));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("config valid (cluster prod)") && err.contains("not supported yet"),
        "{err}"
    );
}

#[test]
fn help_works() {
    Command::cargo_bin("kubexm-install").unwrap().arg("--help").assert().success();
}
