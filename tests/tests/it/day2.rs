//! Day 2 on the main scenario's cluster (issue 29), called from it in
//! order: `apply` adds a worker (a spare lab host) to the running cluster;
//! etcd snapshots are taken and pruned.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kubexm_e2e::{Lab, LabBundle, bin, free_port, ok, text};

/// `kubexm-install apply -f CONFIG` with the scenario's bundle, root and state.
fn apply(lab: &Lab, config: &Path, b: &LabBundle, dir: &Path, extra: &[&str]) -> Output {
    Command::new(bin("kubexm-install"))
        .arg("apply")
        .arg("-f")
        .arg(config)
        .arg("--bundle")
        .arg(&b.bundle)
        .arg("--pubkey")
        .arg(&b.public_key)
        .arg("--root")
        .arg(dir.join("root"))
        .arg("--state")
        .arg(dir.join("state.db"))
        .args(["--advertise", &lab.desc.gateway, "--serve-port"])
        .arg(free_port(&lab.desc.gateway).to_string())
        .args(extra)
        .output()
        .unwrap()
}

/// `config` with `host` added to its hosts and workers, written into `dir`.
fn with_worker(lab: &Lab, config: &Path, host: &str, dir: &Path) -> PathBuf {
    let mut text = std::fs::read_to_string(config).unwrap();
    let h = lab.host(host);
    let line = format!("    - {{name: {host}, address: {}, arch: {}}}\n", h.address, h.arch);
    text = text.replacen("  roleGroups:\n", &format!("{line}  roleGroups:\n"), 1);
    let start = text.find("    worker: [").expect("a worker list");
    let end = start + text[start..].find(']').unwrap();
    text.insert_str(end, &format!(", {host}"));
    let path = dir.join(format!("with-{host}.yaml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// Issue 29: `apply` adds the lab's spare host as a worker. A change of a
/// field that never changes is refused first (exit 3, at its line, nothing
/// run); the dry run names the new worker and plans steps on it (and the
/// registry's service, whose node list grows); the apply makes it a Ready
/// node while no other old host applies anything; a re-run applies
/// nothing; the record lists it. Returns the new config.
pub fn apply_adds_a_worker(lab: &Lab, config: &Path, b: &LabBundle, dir: &Path, kubectl: &dyn Fn(&str) -> String) -> PathBuf {
    let spare = lab.desc.hosts.iter().find(|h| h.spare).expect("a spare lab host").name.clone();
    let new = with_worker(lab, config, &spare, dir);
    let text_of = std::fs::read_to_string(&new).unwrap();
    assert!(text_of.contains("podCIDR: 198.19.0.0/16"), "{text_of}");
    let bad = dir.join("bad-pod-cidr.yaml");
    std::fs::write(&bad, text_of.replace("podCIDR: 198.19.0.0/16", "podCIDR: 198.19.0.0/17")).unwrap();
    let refused = apply(lab, &bad, b, dir, &[]);
    let err = text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(3), "{err}");
    assert!(
        err.contains("bad-pod-cidr.yaml:") && err.contains("spec.kubernetes.podCIDR: cannot change"),
        "{err}"
    );
    lab.ssh_ok(&spare, "! test -e /etc/kubexm"); // nothing ran

    let plan = ok(apply(lab, &new, b, dir, &["--dry-run"]), "apply --dry-run");
    eprintln!("{plan}");
    assert!(plan.contains(&format!("apply: adds worker(s) {spare}")), "{plan}");
    let planned = |h: &str| {
        plan.lines()
            .find_map(|l| l.trim_start().strip_prefix(&format!("{h}: ")).map(str::to_string))
    };
    assert!(planned(&spare).is_some(), "no step planned on {spare}:\n{plan}");
    for old in lab.desc.hosts.iter().filter(|h| !h.spare) {
        let on = planned(&old.name);
        assert!(
            on.is_none() || on.as_deref() == Some("registry-service"),
            "a step planned on {}:\n{plan}",
            old.name
        );
    }

    let start = std::time::Instant::now();
    let applied = ok(apply(lab, &new, b, dir, &[]), "apply");
    eprintln!("apply (a worker added) took {:?}:\n{applied}", start.elapsed());
    kubectl(&format!("wait --for=condition=Ready node/{spare} --timeout=180s"));
    let state = kubexm_installer::engine::state::State::open(&dir.join("state.db"), vec![]).unwrap();
    let job = state.job(None).unwrap().expect("the apply's job");
    assert_eq!((job.kind.as_str(), job.status.as_str()), ("apply", "succeeded"));
    let steps = state.steps(job.id).unwrap();
    // On old hosts nothing, but the registry's service on lab1: its unit
    // lists the nodes, each with its own connection quota, lab6 now too.
    let on_old: Vec<String> = steps
        .iter()
        .filter(|s| s.host != spare && s.status == "applied")
        .map(|s| s.node.clone())
        .collect();
    assert!(
        on_old.iter().all(|n| n == "registry/registry/registry-service@lab1"),
        "steps applied on old hosts: {on_old:?}"
    );
    assert!(
        steps.iter().any(|s| s.host == spare && s.status == "applied"),
        "nothing applied on {spare}"
    );

    let again = ok(apply(lab, &new, b, dir, &[]), "apply again");
    assert!(again.contains(": 0 steps applied"), "{again}");
    let record = Command::new(bin("kubexm-install"))
        .args(["status", "--cluster", "lab", "--state"])
        .arg(dir.join("state.db"))
        .output()
        .unwrap();
    let record = ok(record, "status --cluster lab");
    assert!(record.contains("(apply, succeeded)"), "{record}");
    assert!(
        record
            .lines()
            .any(|l| l.trim_start().starts_with(&spare) && l.trim_end().ends_with("worker,local-proxy")),
        "{record}"
    );
    new
}

/// Issue 29: `etcd snapshot` through a healthy member, three times with
/// `--keep 2`: two snapshots stay, each with a sha256 that matches and a
/// sidecar naming the cluster, etcd's cluster ID and its three members.
pub fn etcd_snapshots_are_taken_and_pruned(config: &Path, dir: &Path) {
    let snapshots = dir.join("snapshots");
    let mut taken = Vec::new();
    for _ in 0..3 {
        let out = Command::new(bin("kubexm-install"))
            .args(["etcd", "snapshot", "--keep", "2", "-o", "json", "-f"])
            .arg(config)
            .arg("--dir")
            .arg(&snapshots)
            .arg("--root")
            .arg(dir.join("root"))
            .arg("--state")
            .arg(dir.join("state.db"))
            .output()
            .unwrap();
        let s: serde_json::Value = serde_json::from_str(&ok(out, "etcd snapshot")).unwrap();
        taken.push(s["file"].as_str().unwrap().to_string());
    }
    let mut left: Vec<String> = std::fs::read_dir(&snapshots)
        .unwrap()
        .flatten()
        .map(|e| e.path().display().to_string())
        .filter(|p| p.ends_with(".db"))
        .collect();
    left.sort();
    assert_eq!(left, taken[1..], "the newest two are kept");
    for f in &left {
        let info: serde_json::Value = serde_json::from_slice(&std::fs::read(format!("{f}.json")).unwrap()).unwrap();
        assert_eq!(info["cluster"], "lab", "{info}");
        assert!(info["clusterId"].as_str().is_some_and(|c| !c.is_empty()), "{info}");
        let mut names: Vec<&str> = info["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["lab1", "lab2", "lab3"], "{info}");
        let sum = Command::new("sha256sum").arg(f).output().unwrap();
        let sum = text(&sum.stdout);
        assert_eq!(sum.split_whitespace().next(), info["sha256"].as_str(), "{info}");
        let sidecar = std::fs::read_to_string(format!("{f}.sha256")).unwrap();
        assert!(sidecar.starts_with(info["sha256"].as_str().unwrap()), "{sidecar}");
        assert!(info["size"].as_u64().unwrap() > 4096, "{info}");
    }
}
