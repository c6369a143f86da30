//! kubexm-install refuses what is not built yet, after validating the config,
//! and what it cannot do safely, before touching a host.

use assert_cmd::Command;

#[test]
fn an_option_not_built_yet_is_refused_as_not_supported_yet() {
    let text = std::fs::read_to_string(format!("{}/../examples/ha.yaml", manifest_dir())).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("clean.yaml");
    std::fs::write(&cfg, text.replace("    leftovers: fail", "    leftovers: clean")).unwrap();
    let out = Command::cargo_bin("kubexm-install")
        .unwrap()
        .args(["--bundle", "k.tar.zst", "--allow-unsigned", "-f"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(8));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("preflight.leftovers") && err.contains("not supported yet"), "{err}");
}

#[test]
fn install_without_a_trust_decision_is_refused() {
    let ha = format!("{}/../examples/ha.yaml", manifest_dir());
    let out = Command::cargo_bin("kubexm-install")
        .unwrap()
        .args(["-f", &ha, "--bundle", "k.tar.zst"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--pubkey"), "{err}");
}

#[test]
fn a_closed_stdout_panics_the_binary() {
    let ha = format!("{}/../examples/ha.yaml", manifest_dir());
    let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin("kubexm-install"));
    cmd.args(["facts", "-f", &ha, "--dry-run"]);
    let (code, err) = kubexm_cli::testing::run_with_closed_stdout(cmd).unwrap();
    assert_eq!(code, Some(0), "{err}");
    assert!(err.is_empty(), "{err}");
}

#[test]
fn help_works() {
    Command::cargo_bin("kubexm-install").unwrap().arg("--help").assert().success();
}

#[test]
fn facts_dry_run_prints_the_plan_and_touches_no_host() {
    let ha = format!("{}/../examples/ha.yaml", manifest_dir());
    let dir = tempfile::tempdir().unwrap();
    let dot = dir.path().join("plan.dot");
    let out = Command::cargo_bin("kubexm-install")
        .unwrap()
        .args(["facts", "-f", &ha, "--dry-run", "--graph"])
        .arg(&dot)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("facts\n") && text.contains("  worker3: facts/facts/facts"),
        "{text}"
    );
    assert!(std::fs::read_to_string(dot).unwrap().starts_with("digraph plan {"));
}

/// Issue 26: a host named unreachable is left out of the reset's plan; a
/// name that is not a host of the config is refused (exit 2), naming them.
#[test]
fn reset_plans_without_a_host_named_unreachable_and_refuses_an_unknown_one() {
    let ha = format!("{}/../examples/ha.yaml", manifest_dir());
    let run = |unreachable: &str| {
        Command::cargo_bin("kubexm-install")
            .unwrap()
            .args(["reset", "-f", &ha, "--unreachable", unreachable])
            .output()
            .unwrap()
    };
    let out = run("worker1");
    let (plan, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(plan.contains("  worker2: reset/reset/reset") && !plan.contains("worker1"), "{plan}");
    assert!(err.contains("on 7 host(s)"), "{err}");
    let out = run("nosuch");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("nosuch is not a host of cluster prod (its hosts: lb1"), "{err}");
}

/// The package's folder, read when the test runs: a test binary reused from a
/// checkout elsewhere (a shared CARGO_TARGET_DIR) must not point there.
fn manifest_dir() -> String {
    std::env::var("CARGO_MANIFEST_DIR").expect("cargo test sets CARGO_MANIFEST_DIR")
}

#[test]
fn a_bundle_built_before_the_lock_carried_the_catalog_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("old.tar.zst");
    let mut old = kubexm_bundle::testing::manifest(vec![]);
    old.catalog = None;
    old.created_by = "kubexm-bundle 0.0.9".into();
    let yaml = old.to_yaml().unwrap();
    kubexm_bundle::testing::raw_archive(&bundle, &[("bundle.yaml", yaml.as_bytes(), tar::EntryType::Regular)]).unwrap();
    let ha = format!("{}/../examples/ha.yaml", manifest_dir());
    let out = Command::cargo_bin("kubexm-install")
        .unwrap()
        .args(["-f", &ha, "--allow-unsigned", "--dry-run", "--bundle"])
        .arg(&bundle)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("built by an older kubexm-bundle (kubexm-bundle 0.0.9)") && err.contains("rebuild it with this kubexm-bundle"),
        "{err}"
    );
}

#[test]
fn catalog_is_no_longer_taken_by_the_installer() {
    let ha = format!("{}/../examples/ha.yaml", manifest_dir());
    let out = Command::cargo_bin("kubexm-install")
        .unwrap()
        .args(["-f", &ha, "--bundle", "k.tar.zst", "--catalog", "c.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the bundle's lock carries what it needs"), "{err}");
}

// Before: `packages --file-server http://...` was accepted while the hosts'
// apt source is `[trusted=yes]`: anyone on the path served them packages.
#[test]
fn packages_from_a_plain_http_file_server_are_refused() {
    let ha = format!("{}/../examples/ha.yaml", manifest_dir());
    let out = Command::cargo_bin("kubexm-install")
        .unwrap()
        .args([
            "packages",
            "-f",
            &ha,
            "--bundle-dir",
            "/nonexistent",
            "--file-server",
            "http://198.18.0.1:5443",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("plain HTTP is refused") && err.contains("https://"), "{err}");
}

/// Issue 29: `status --cluster` names a cluster without a record, exit 2,
/// and refuses to mix with --job.
#[test]
fn status_of_a_cluster_without_a_record_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.db");
    let st = kubexm_installer::engine::state::State::open(&state, vec![]).unwrap();
    let job = st.begin_job("kept", "install").unwrap();
    st.finish_job(job, "succeeded").unwrap();
    let out = Command::cargo_bin("kubexm-install")
        .unwrap()
        .args(["status", "--cluster", "gone", "--state"])
        .arg(&state)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("no record of cluster gone") && err.contains("none has a record yet"),
        "{err}"
    );
    let out = Command::cargo_bin("kubexm-install")
        .unwrap()
        .args(["status", "--cluster", "gone", "--job", "1", "--state"])
        .arg(&state)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// Issue 29: apply takes no phases (it runs what the change needs) and needs
/// the changed config.
#[test]
fn apply_refuses_phases_and_needs_a_config() {
    let ha = format!("{}/../examples/ha.yaml", manifest_dir());
    let out = Command::cargo_bin("kubexm-install")
        .unwrap()
        .args([
            "apply",
            "-f",
            &ha,
            "--bundle",
            "k.tar.zst",
            "--allow-unsigned",
            "--phases",
            "workers",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("apply takes no --phases"), "{err}");
    let out = Command::cargo_bin("kubexm-install")
        .unwrap()
        .args(["apply", "--bundle", "k.tar.zst"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("pass -f cluster.yaml"), "{err}");
}
