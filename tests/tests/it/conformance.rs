//! Kubernetes' own conformance tests on the main scenario's cluster (called
//! from `deploy::main_job...`, no install of their own): the quick subset
//! listed in `manifests/conformance/`, run by `kubexm-install conformance`
//! from the bundle, and asserted from the JUnit report e2e.test wrote, read
//! here with an XML parser of its own (not kubexm's reader): every listed
//! spec ran and passed, none skipped. And its refusals.

use std::path::{Path, PathBuf};
use std::process::Command;

use kubexm_e2e::{bin, repo_root, text};

/// The main job's config with `conformance: {enabled: true}`, written into `dir`.
pub fn config_with_conformance(main_job: &Path, dir: &Path) -> PathBuf {
    let cfg = std::fs::read_to_string(main_job).unwrap();
    assert!(cfg.contains("\n  kubernetes:"), "{cfg}");
    let cfg = cfg.replacen("\n  kubernetes:", "\n  conformance: {enabled: true}\n  kubernetes:", 1);
    let path = dir.join("main-job-conformance.yaml");
    std::fs::write(&path, cfg).unwrap();
    path
}

fn conformance(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(bin("kubexm-install"))
        .arg("conformance")
        .args(args)
        .arg("--root")
        .arg(dir.join("root"))
        .arg("--state")
        .arg(dir.join("state.db"))
        .output()
        .unwrap()
}

#[derive(serde::Deserialize)]
struct Quick {
    specs: Vec<Listed>,
}

#[derive(serde::Deserialize)]
struct Listed {
    name: String,
}

/// The quick subset on the installed cluster `cluster`: refusals first,
/// then the run; every listed spec passed, by the JUnit report.
pub fn quick_subset_passes(dir: &Path, cluster: &str, not_ready: &str) {
    let unknown = conformance(dir, &["--cluster", "not-installed"]);
    assert_eq!(unknown.status.code(), Some(2), "{}", text(&unknown.stderr));
    assert!(
        text(&unknown.stderr).contains("records no successful install of cluster not-installed"),
        "{}",
        text(&unknown.stderr)
    );

    let start = std::time::Instant::now();
    let out = conformance(
        dir,
        &[
            "--cluster",
            cluster,
            "--mode",
            "quick",
            "--parallel",
            "4",
            "--allow-not-ready",
            not_ready,
            // The lab's 2 cores run five hosts (one arm64, emulated): a
            // spec that times out once and passes on a second attempt is
            // reported as flaky in the summary printed below, not hidden.
            "--flake-attempts",
            "2",
        ],
    );
    let taken = start.elapsed();
    let stdout = text(&out.stdout);
    eprintln!("conformance --mode quick took {taken:?}\n{stdout}");
    assert!(out.status.success(), "conformance: {stdout}\n{}", text(&out.stderr));

    let runs = dir.join("root/conformance").join(cluster);
    let mut stamps: Vec<PathBuf> = std::fs::read_dir(&runs).unwrap().map(|e| e.unwrap().path()).collect();
    stamps.sort();
    let run = stamps.last().unwrap_or_else(|| panic!("no run under {}", runs.display()));
    for f in ["junit_01.xml", "e2e.log", "summary.json", "summary.txt"] {
        assert!(run.join(f).is_file(), "{} has no {f}", run.display());
    }
    let xml = std::fs::read_to_string(run.join("junit_01.xml")).unwrap();
    let doc = roxmltree::Document::parse(&xml).unwrap();
    let cases: Vec<(String, String, bool)> = doc
        .descendants()
        .filter(|n| n.has_tag_name("testcase"))
        .map(|n| {
            let name = n.attribute("name").unwrap_or_default();
            let name = name.strip_prefix("[It] ").unwrap_or(name).to_string();
            let failed = n.children().any(|c| c.has_tag_name("failure") || c.has_tag_name("error"));
            (name, n.attribute("status").unwrap_or_default().to_string(), failed)
        })
        .collect();
    let list = repo_root().join("manifests/conformance/quick-v1.37.yaml");
    let quick: Quick = serde_saphyr::from_str(&std::fs::read_to_string(&list).unwrap()).unwrap();
    let mut bad = Vec::new();
    for spec in &quick.specs {
        match cases.iter().find(|(n, _, _)| *n == spec.name) {
            Some((_, status, false)) if status == "passed" => {}
            Some((_, status, _)) => bad.push(format!("{} ({status})", spec.name)),
            None => bad.push(format!("{} (not in the report)", spec.name)),
        }
    }
    assert!(bad.is_empty(), "listed specs that did not pass:\n{}", bad.join("\n"));
    let summary: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["passed"], quick.specs.len(), "{summary}");
    assert_eq!(summary["notReadyNodes"], serde_json::json!([not_ready]), "{summary}");
}

/// Refusals before anything runs, with both of the scenario's bundles
/// unpacked under the root (the conformance one and the addons one, built
/// without the tests; without --bundle-dir the one the cluster's record
/// names is used): the addons bundle carries no tests (exit 3); a bundle
/// whose lock lost an image names it (exit 3).
pub fn refusals(dir: &Path, cluster: &str) {
    let bundles: Vec<PathBuf> = std::fs::read_dir(dir.join("root/bundles"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("bundle.yaml").is_file())
        .collect();
    let (with, without): (Vec<&PathBuf>, Vec<&PathBuf>) = bundles.iter().partition(|p| p.join("files/kubernetes-test").is_dir());
    assert_eq!((with.len(), without.len()), (1, 1), "{bundles:?}");
    let arg = |p: &Path| p.to_str().unwrap().to_string();
    let none = conformance(dir, &["--cluster", cluster, "--bundle-dir", &arg(without[0])]);
    assert_eq!(none.status.code(), Some(3), "{}", text(&none.stderr));
    assert!(
        text(&none.stderr).contains("carries no conformance tests"),
        "{}",
        text(&none.stderr)
    );

    // The conformance bundle's manifest with agnhost:2.66.1 taken out of its lock.
    let agnhost = "registry.k8s.io/e2e-test-images/agnhost:2.66.1";
    let text_of = std::fs::read_to_string(with[0].join("bundle.yaml")).unwrap();
    let mut manifest: serde_json::Value = serde_saphyr::from_str(&text_of).unwrap();
    let images = manifest["lock"]["images"].as_array_mut().unwrap();
    let before = images.len();
    images.retain(|i| i["reference"] != agnhost);
    assert_eq!(images.len() + 1, before, "{agnhost} not in the lock once");
    let lost = dir.join("lost-an-image");
    std::fs::create_dir_all(&lost).unwrap();
    std::fs::write(lost.join("bundle.yaml"), serde_json::to_string(&manifest).unwrap()).unwrap();
    let missing = conformance(dir, &["--cluster", cluster, "--bundle-dir", &arg(&lost)]);
    assert_eq!(missing.status.code(), Some(3), "{}", text(&missing.stderr));
    assert!(
        text(&missing.stderr).contains(&format!("it lacks {agnhost}")),
        "{}",
        text(&missing.stderr)
    );
}
