//! The kubexm-bundle command line as a user runs it.

use std::path::PathBuf;

use assert_cmd::Command;

fn bundle() -> Command {
    Command::cargo_bin("kubexm-bundle").unwrap()
}

fn example(name: &str) -> PathBuf {
    PathBuf::from(manifest_dir()).join("../examples").join(name)
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_closed_stdout_panics_the_binary() {
    let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin("kubexm-bundle"));
    cmd.args(["bom", "-o", "json", "-f"]).arg(example("ha.yaml"));
    let (code, err) = kubexm_cli::testing::run_with_closed_stdout(cmd).unwrap();
    assert_eq!(code, Some(0), "{err}");
    assert!(err.is_empty(), "{err}");
}

#[test]
fn help_on_every_command() {
    for args in [&["--help"][..], &["validate", "--help"], &["bom", "--help"], &["init", "--help"]] {
        let out = bundle().args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}");
        assert!(stdout(&out).contains("Usage:"), "{args:?}");
    }
    let out = bundle().arg("--help").output().unwrap();
    assert!(stdout(&out).contains("Exit codes"));
}

#[test]
fn validate_a_good_config() {
    let out = bundle().arg("validate").arg("-f").arg(example("ha.yaml")).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("valid: cluster prod, 8 hosts, Kubernetes v1.33.4"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn validate_prints_the_completed_config() {
    let out = bundle()
        .arg("validate")
        .arg("-f")
        .arg(example("single-node.yaml"))
        .args(["-o", "yaml"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    // Defaults filled in: SSH port and user, pod CIDR, paired versions, registry host.
    for want in [
        "port: 22",
        "user: root",
        "podCIDR: 10.244.0.0/16",
        "version: v3.5.22",
        "registry:\n    - node1",
    ] {
        assert!(text.contains(want), "{want:?} missing from:\n{text}");
    }
    // The completed config is itself a valid config.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("complete.yaml");
    std::fs::write(&p, &text).unwrap();
    bundle().arg("validate").arg("-f").arg(&p).assert().success();
}

#[test]
fn invalid_config_exits_3_with_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.yaml");
    let text = std::fs::read_to_string(example("ha.yaml"))
        .unwrap()
        .replace("etcd: [cp1, cp2, cp3]", "etcd: [cp1, cp2]");
    std::fs::write(&p, text).unwrap();
    let out = bundle().arg("validate").arg("-f").arg(&p).output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("{}:26:5: spec.roleGroups.etcd: 2 etcd members", p.display())),
        "{err}"
    );

    let out = bundle().arg("validate").arg("-f").arg(&p).args(["-o", "json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["valid"], false);
    assert_eq!(v["diagnostics"][0]["line"], 26);
    assert_eq!(v["diagnostics"][0]["kind"], "invalid");
}

#[test]
fn unsupported_option_exits_8() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("vip.yaml");
    let text = std::fs::read_to_string(example("ha.yaml"))
        .unwrap()
        .replace("mode: haproxy-keepalived", "mode: kube-vip");
    std::fs::write(&p, text).unwrap();
    let out = bundle().arg("validate").arg("-f").arg(&p).output().unwrap();
    assert_eq!(out.status.code(), Some(8), "{}", stderr(&out));
    assert!(stderr(&out).contains("not supported yet"));
}

#[test]
fn missing_file_exits_4_and_names_it() {
    let out = bundle().args(["validate", "-f", "/nonexistent/cluster.yaml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(4));
    assert!(stderr(&out).contains("/nonexistent/cluster.yaml"), "{}", stderr(&out));
}

#[test]
fn bad_flag_exits_2() {
    let out = bundle().args(["bom", "--frobnicate"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn bom_json_lists_files_images_and_manifests() {
    let out = bundle()
        .arg("bom")
        .arg("-f")
        .arg(example("ha.yaml"))
        .args(["-o", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["arches"], serde_json::json!(["amd64", "arm64"]));
    assert_eq!(v["files"].as_array().unwrap().len(), 18);
    assert!(
        v["images"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["reference"] == "registry.k8s.io/pause:3.10")
    );
    assert!(v["manifests"].as_array().unwrap().iter().any(|m| m["addon"] == "calico"));
}

#[test]
fn bom_mirror_flag_rewrites_and_bad_mirror_is_a_usage_error() {
    let out = bundle()
        .arg("bom")
        .arg("-f")
        .arg(example("single-node.yaml"))
        .args(["--mirror", "dl.k8s.io=http://127.0.0.1:9/k8s", "-o", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("\"source\": \"http://127.0.0.1:9/k8s/release/v1.33.4/bin/linux/amd64/kubeadm\""));
    let out = bundle()
        .arg("bom")
        .arg("-f")
        .arg(example("single-node.yaml"))
        .args(["--mirror", "nonsense"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("expected UPSTREAM=URL"));
}

#[test]
fn catalog_override_adds_a_kubernetes_version() {
    let dir = tempfile::tempdir().unwrap();
    let cat = dir.path().join("extra.yaml");
    let digest = "a".repeat(64);
    std::fs::write(
        &cat,
        format!(
            "components:\n  kubeadm: {{versions: {{v1.33.9: {{amd64: {digest}}}}}}}\n  kubelet: {{versions: {{v1.33.9: {{}}}}}}\n  kubectl: {{versions: {{v1.33.9: {{}}}}}}\n"
        ),
    )
    .unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(
        &cfg,
        std::fs::read_to_string(example("single-node.yaml"))
            .unwrap()
            .replace("v1.33.4", "v1.33.9"),
    )
    .unwrap();
    bundle().arg("validate").arg("-f").arg(&cfg).assert().code(3);
    let out = bundle()
        .arg("bom")
        .arg("-f")
        .arg(&cfg)
        .arg("--catalog")
        .arg(&cat)
        .args(["-o", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let kubelet = v["files"].as_array().unwrap().iter().find(|f| f["component"] == "kubelet").unwrap();
    // No pinned digest: the upstream's published checksum decides.
    assert_eq!(
        kubelet["checksum"]["published"],
        "https://dl.k8s.io/release/v1.33.9/bin/linux/amd64/kubelet.sha256"
    );
}

#[test]
fn init_writes_a_valid_example_and_never_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("cluster.yaml");
    bundle().arg("init").arg("-f").arg(&p).assert().success();
    bundle().arg("validate").arg("-f").arg(&p).assert().success();
    std::fs::write(&p, "mine").unwrap();
    let out = bundle().arg("init").arg("-f").arg(&p).output().unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--force"));
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "mine");
    bundle().arg("init").arg("-f").arg(&p).arg("--force").assert().success();
    // No temporary file is left behind.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

/// The package's folder, read when the test runs: a test binary reused from a
/// checkout elsewhere (a shared CARGO_TARGET_DIR) must not point there.
fn manifest_dir() -> String {
    std::env::var("CARGO_MANIFEST_DIR").expect("cargo test sets CARGO_MANIFEST_DIR")
}
