//! Issue 30's scenario: a cluster of Kubernetes v1.36.3 (the lab's older
//! minor, amd64: one control-plane node and etcd member, two workers)
//! upgraded to v1.37.2 while a client on this machine polls a Deployment
//! (a replica on each worker, a PodDisruptionBudget) through a NodePort of
//! the control-plane node every 200 ms. Refusals first (0 steps applied), a
//! run killed after the first worker is cordoned, then the re-run.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kubexm_e2e::{Lab, LabBundle, bin, free_port, ok, signed_bundle, text};

/// The lab's main-job config on three amd64 hosts, reshaped: lab1 the
/// control-plane node and etcd member, lab2 and lab3 workers, amd64 only,
/// at `version`.
fn config(lab: &Lab, dir: &Path, version: &str, arches: &str) -> PathBuf {
    let text = std::fs::read_to_string(&lab.desc.main_job).unwrap();
    let mut out = String::new();
    for line in text.lines() {
        let l = match line.trim_start() {
            l if l.starts_with("etcd: [") => "    etcd: [lab1]".to_string(),
            l if l.starts_with("control-plane: [") => "    control-plane: [lab1]".to_string(),
            l if l.starts_with("worker: [") => "    worker: [lab2, lab3]".to_string(),
            l if l.starts_with("version: v1.37.2") => line.replace("v1.37.2", version),
            l if l.starts_with("arches: [amd64, arm64]") => line.replace("[amd64, arm64]", arches),
            _ => line.to_string(),
        };
        out.push_str(&l);
        out.push('\n');
    }
    out.push_str("  upgrade: {maxUnavailable: 1, drainTimeoutSeconds: 120}\n");
    let path = dir.join(format!("cluster-{version}-{}.yaml", arches.len()));
    std::fs::write(&path, out).unwrap();
    path
}

/// `kubexm-install upgrade -f CONFIG --bundle B` with the scenario's root and state.
fn upgrade_cmd(lab: &Lab, config: &Path, b: &LabBundle, dir: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(bin("kubexm-install"));
    cmd.arg("upgrade")
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
        .args(extra);
    cmd
}

fn upgrade(lab: &Lab, config: &Path, b: &LabBundle, dir: &Path, extra: &[&str]) -> Output {
    upgrade_cmd(lab, config, b, dir, extra).output().unwrap()
}

/// Steps applied by jobs other than the read-only `upgrade-check`, from the state database.
fn applied(dir: &Path) -> i64 {
    let db = rusqlite::Connection::open(dir.join("state.db")).unwrap();
    db.query_row(
        "SELECT count(*) FROM steps s JOIN jobs j ON s.job = j.id WHERE s.status = 'applied' AND j.kind != 'upgrade-check'",
        [],
        |r| r.get(0),
    )
    .unwrap()
}

/// Polls `url` every 200 ms until stopped; returns the longest time without an answer.
fn poll(url: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Duration> {
    std::thread::spawn(move || {
        let mut last_ok = Instant::now();
        let mut longest = Duration::ZERO;
        while !stop.load(Ordering::Relaxed) {
            let got = Command::new("curl")
                .args(["-sf", "--max-time", "1", &url])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if got {
                longest = longest.max(last_ok.elapsed());
                last_ok = Instant::now();
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        longest.max(last_ok.elapsed())
    })
}

#[test]
#[ignore = "issue 30: written, not yet run on the lab (next session)"]
fn upgrade_from_v1_36_keeps_a_deployment_answering_and_a_killed_run_converges() {
    let Some(lab) = Lab::up(3, 0) else { return };
    let dir = tempfile::tempdir().unwrap();
    let old = config(&lab, dir.path(), "v1.36.3", "[amd64]");
    let new = config(&lab, dir.path(), "v1.37.2", "[amd64]");
    let (b_old, b_new) = (signed_bundle(&lab, &old), signed_bundle(&lab, &new));
    kubexm_e2e::lab_cmd(&["upstream", "stop"]);
    ok(
        kubexm_e2e::install_command(&lab, &old, &b_old.bundle, &b_old.public_key, dir.path(), None)
            .output()
            .unwrap(),
        "install v1.36.3",
    );
    let k = |args: &str| lab.ssh_ok("lab1", &format!("kubectl --kubeconfig /etc/kubernetes/admin.conf {args}"));
    // A replica on each worker, a budget that lets one go at a time, a NodePort on lab1.
    k("create deployment web --image=docker.io/library/nginx:1.27-lab --replicas=2 -- /bin/busybox httpd -f -p 8080 -h /etc");
    k(
        "patch deployment web -p '{\"spec\":{\"template\":{\"spec\":{\"topologySpreadConstraints\":[{\"maxSkew\":1,\"topologyKey\":\"kubernetes.io/hostname\",\"whenUnsatisfiable\":\"DoNotSchedule\",\"labelSelector\":{\"matchLabels\":{\"app\":\"web\"}}}]}}}}'",
    );
    k("create poddisruptionbudget web --selector=app=web --min-available=1");
    k(
        "expose deployment web --type=NodePort --port=80 --target-port=8080 --overrides='{\"spec\":{\"ports\":[{\"port\":80,\"targetPort\":8080,\"nodePort\":30080}]}}'",
    );
    k("rollout status deployment/web --timeout=180s");
    let url = format!("http://{}:30080/kubexm-lab-image", lab.host("lab1").address);

    // Refusals, nothing applied: a downgrade (the old config against a
    // record of the new version comes after; here a NotReady worker), a
    // missing artifact (a bundle without amd64).
    let before = applied(dir.path());
    lab.ssh_ok("lab3", "systemctl stop kubelet");
    lab.ssh_ok(
        "lab1",
        "for i in $(seq 90); do kubectl --kubeconfig /etc/kubernetes/admin.conf get node lab3 | grep -q NotReady && exit 0; sleep 2; done; exit 1",
    );
    let refused = upgrade(&lab, &new, &b_new, dir.path(), &[]);
    assert_eq!(refused.status.code(), Some(3), "{}", text(&refused.stderr));
    assert!(text(&refused.stderr).contains("lab3"), "{}", text(&refused.stderr));
    lab.ssh_ok("lab3", "systemctl start kubelet");
    lab.ssh_ok(
        "lab1",
        "for i in $(seq 90); do kubectl --kubeconfig /etc/kubernetes/admin.conf get node lab3 | grep -q ' Ready' && exit 0; sleep 2; done; exit 1",
    );
    let arm = config(&lab, dir.path(), "v1.37.2", "[arm64]");
    kubexm_e2e::lab_cmd(&["upstream", "start"]);
    let b_arm = signed_bundle(&lab, &arm);
    kubexm_e2e::lab_cmd(&["upstream", "stop"]);
    let refused = upgrade(&lab, &new, &b_arm, dir.path(), &[]);
    assert_eq!(refused.status.code(), Some(3), "{}", text(&refused.stderr));
    assert!(text(&refused.stderr).contains("kubeadm"), "{}", text(&refused.stderr));
    assert_eq!(applied(dir.path()), before, "a refusal applied steps");

    // The dry run prints the chain; the upgrade is killed once lab2 is cordoned.
    let plan = ok(upgrade(&lab, &new, &b_new, dir.path(), &["--dry-run"]), "upgrade --dry-run");
    assert!(plan.contains("v1.36.3 -> v1.37.2"), "{plan}");
    let stop = Arc::new(AtomicBool::new(false));
    let poller = poll(url, stop.clone());
    let start = Instant::now();
    let mut child = upgrade_cmd(&lab, &new, &b_new, dir.path(), &[]).spawn().unwrap();
    let cordoned = (0..1800).any(|_| {
        std::thread::sleep(Duration::from_millis(500));
        lab.ssh(
            "lab1",
            "kubectl --kubeconfig /etc/kubernetes/admin.conf get node lab2 -o jsonpath='{.spec.unschedulable}'",
        )
        .stdout
        .starts_with(b"true")
            || child.try_wait().ok().flatten().is_some()
    });
    assert!(
        cordoned && child.try_wait().unwrap().is_none(),
        "lab2 never cordoned while the upgrade ran"
    );
    child.kill().unwrap();
    let _ = child.wait();
    let done = ok(upgrade(&lab, &new, &b_new, dir.path(), &[]), "the upgrade run again");
    let took = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    let gap = poller.join().unwrap();
    eprintln!("upgrade v1.36.3 -> v1.37.2 took {took:?} (killed once); the longest gap the client saw: {gap:?}\n{done}");
    assert!(gap < Duration::from_secs(5), "the Deployment did not answer for {gap:?}");

    // Every kubelet, kube-proxy and the API server at v1.37.2; nothing cordoned.
    let nodes = k(
        "get nodes -o jsonpath='{range .items[*]}{.metadata.name} {.status.nodeInfo.kubeletVersion} {.spec.unschedulable}{\"\\n\"}{end}'",
    );
    for h in ["lab1", "lab2", "lab3"] {
        assert!(nodes.lines().any(|l| l.trim() == format!("{h} v1.37.2")), "{nodes}");
    }
    assert!(k("version -o json").contains("\"gitVersion\": \"v1.37.2\""));
    assert!(k("-n kube-system get ds kube-proxy -o jsonpath='{.spec.template.spec.containers[0].image}'").ends_with(":v1.37.2"));
    // A re-run has nothing to do; the old config is now a downgrade.
    let again = applied(dir.path());
    ok(upgrade(&lab, &new, &b_new, dir.path(), &[]), "the upgrade once more");
    assert_eq!(applied(dir.path()), again);
    let down = upgrade(&lab, &old, &b_old, dir.path(), &[]);
    assert_eq!(down.status.code(), Some(3), "{}", text(&down.stderr));
    assert!(text(&down.stderr).contains("downgrade"), "{}", text(&down.stderr));
    kubexm_e2e::lab_cmd(&["upstream", "start"]);
}
