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
            _ => line.replace("arches: [amd64, arm64]", &format!("arches: {arches}")),
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
    served(Command::new(bin("kubexm-install")), &["upgrade"], lab, config, b, dir, extra)
}

/// `cmd VERB... -f CONFIG --bundle B` with the scenario's key, root, state
/// and an address the hosts reach this machine at.
fn served(mut cmd: Command, verb: &[&str], lab: &Lab, config: &Path, b: &LabBundle, dir: &Path, extra: &[&str]) -> Command {
    cmd.args(verb)
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

/// Steps applied by jobs other than the read-only `upgrade-check` and
/// `certs-check` (the hop's preflight), from the state database.
fn applied(dir: &Path) -> i64 {
    let db = rusqlite::Connection::open(dir.join("state.db")).unwrap();
    db.query_row(
        "SELECT count(*) FROM steps s JOIN jobs j ON s.job = j.id WHERE s.status = 'applied' AND j.kind NOT IN ('upgrade-check', 'certs-check')",
        [],
        |r| r.get(0),
    )
    .unwrap()
}

/// Milliseconds since the epoch (the state database's clock).
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// A gap: its start (epoch ms), length, and curl's exit codes in it.
type Gap = (i64, Duration, Vec<i32>);

/// Polls `url` every 200 ms until stopped (each request may take 3 s);
/// returns the longest time without an answer, and every gap over a second.
fn poll(url: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<(Duration, Vec<Gap>)> {
    std::thread::spawn(move || {
        let mut last_ok = (Instant::now(), now_ms());
        let mut longest = Duration::ZERO;
        let mut gaps = Vec::new();
        let mut codes = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let code = Command::new("curl")
                .args(["-sf", "--max-time", "3", &url])
                .stdout(Stdio::null())
                .status()
                .map(|s| s.code().unwrap_or(-1))
                .unwrap_or(-1);
            if code == 0 {
                let gap = last_ok.0.elapsed();
                if gap > Duration::from_secs(1) {
                    gaps.push((last_ok.1, gap, std::mem::take(&mut codes)));
                }
                codes.clear();
                longest = longest.max(gap);
                last_ok = (Instant::now(), now_ms());
            } else {
                codes.push(code);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        (longest.max(last_ok.0.elapsed()), gaps)
    })
}

#[test]
fn upgrade_from_v1_36_keeps_a_deployment_answering_and_a_killed_run_converges() {
    // lab4 a spare: the controller adds it (issue 31).
    let Some(lab) = Lab::up_with_spares(3, 0, 1) else { return };
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
    // A replica on each worker, a budget that lets one go at a time, a
    // NodePort on lab1; Kubernetes' default grace period (busybox's httpd
    // ignores SIGTERM: a replica told to stop serves 30 s more while its
    // endpoint leaves every node's rules; with 10 s, requests went on
    // reaching a stopped replica for up to 9.9 s: issue 30's closing note).
    let web = r#"{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
      "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
        "template": {"metadata": {"labels": {"app": "web"}},
          "spec": {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
              "whenUnsatisfiable": "DoNotSchedule", "nodeTaintsPolicy": "Honor", "labelSelector": {"matchLabels": {"app": "web"}}}],
            "containers": [{"name": "web", "image": "docker.io/library/nginx:1.27-lab",
              "command": ["/bin/busybox", "httpd", "-f", "-p", "8080", "-h", "/etc"]}]}}}}"#;
    lab.ssh_ok(
        "lab1",
        &format!("printf '%s' '{web}' | kubectl --kubeconfig /etc/kubernetes/admin.conf apply -f - >/dev/null"),
    );
    k("create poddisruptionbudget web --selector=app=web --min-available=1");
    k(
        "expose deployment web --type=NodePort --port=80 --target-port=8080 --overrides='{\"spec\":{\"ports\":[{\"port\":80,\"targetPort\":8080,\"nodePort\":30080}]}}'",
    );
    k(
        "rollout status deployment/web --timeout=180s || { kubectl --kubeconfig /etc/kubernetes/admin.conf get nodes,pods -A -o wide; \
       kubectl --kubeconfig /etc/kubernetes/admin.conf describe pods -l app=web | tail -40; exit 1; } >&2",
    );
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
    // A bundle whose OS packages are arm64's only: the amd64 nodes lack theirs.
    let arm = dir.path().join("cluster-arm64-packages.yaml");
    let arm_text = std::fs::read_to_string(&new)
        .unwrap()
        .replace("arches: [amd64], mirror", "arches: [arm64], mirror");
    assert!(arm_text.contains("arches: [arm64], mirror"), "{arm_text}");
    std::fs::write(&arm, arm_text).unwrap();
    kubexm_e2e::lab_cmd(&["upstream", "start"]);
    let b_arm = signed_bundle(&lab, &arm);
    kubexm_e2e::lab_cmd(&["upstream", "stop"]);
    let refused = upgrade(&lab, &new, &b_arm, dir.path(), &[]);
    assert_eq!(refused.status.code(), Some(3), "{}", text(&refused.stderr));
    assert!(text(&refused.stderr).contains("OS packages for amd64"), "{}", text(&refused.stderr));
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
    let (gap, gaps) = poller.join().unwrap();
    eprintln!("upgrade v1.36.3 -> v1.37.2 took {took:?} (killed once); the longest gap the client saw: {gap:?}\n{done}");
    for (at, len, codes) in &gaps {
        // What ran then, by the state database's clock.
        let db = rusqlite::Connection::open(dir.path().join("state.db")).unwrap();
        let running: Vec<String> = db
            .prepare("SELECT node FROM steps WHERE started <= ?1 + ?2 AND started + duration_ms >= ?1 ORDER BY started")
            .unwrap()
            .query_map([*at, len.as_millis() as i64], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        eprintln!("a gap of {len:?} from {at} ms (curl exited {codes:?}), while {running:?}");
    }
    assert!(gap < Duration::from_secs(5), "the Deployment did not answer for {gap:?}");
    // One restore point for the hop: the re-run named the killed run's.
    let points: Vec<String> = std::fs::read_dir(dir.path().join("root/clusters/lab/snapshots"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with("-before-v1.37.2.db"))
        .collect();
    assert_eq!(points.len(), 1, "{points:?}");
    assert!(done.contains("taken by an earlier run of this hop"), "{done}");

    // Every kubelet, kube-proxy and the API server at v1.37.2; nothing cordoned.
    let nodes = k(
        "get nodes -o jsonpath='{range .items[*]}{.metadata.name} {.status.nodeInfo.kubeletVersion} {.spec.unschedulable}{\"\\n\"}{end}'",
    );
    for h in ["lab1", "lab2", "lab3"] {
        assert!(nodes.lines().any(|l| l.trim() == format!("{h} v1.37.2")), "{nodes}");
    }
    assert!(k("version -o json").contains("\"gitVersion\": \"v1.37.2\""));
    assert!(k("-n kube-system get ds kube-proxy -o jsonpath='{.spec.template.spec.containers[0].image}'").ends_with(":v1.37.2"));
    // The last job's log: each worker cordoned, drained, uncordoned, the
    // second cordoned only once the first was uncordoned.
    let steps = steps_of_last_upgrade(dir.path());
    let when = |what: &str| {
        steps
            .iter()
            .find(|(node, _, _, log)| node.contains(what) && !log.is_empty())
            .map(|(_, start, end, _)| (*start, *end))
            .unwrap_or_else(|| panic!("no {what} in {steps:#?}"))
    };
    for h in ["lab2", "lab3"] {
        let logs: String = steps
            .iter()
            .filter(|(n, ..)| n.contains(&format!("-{h}/")))
            .map(|(.., l)| l.as_str())
            .collect();
        for word in [format!("cordoned {h}"), format!("drained {h}"), format!("uncordoned {h}")] {
            assert!(logs.contains(&word), "{word}: {steps:#?}");
        }
    }
    assert!(
        when("upgrade-uncordon-lab2/uncordon").1 <= when("upgrade-drain-lab3/cordon-drain").0,
        "{steps:#?}"
    );
    // A re-run, as a job of `kubexm upgrade cluster` run here, has nothing
    // to do; the old config is now a downgrade, through `apply` (a version
    // change is routed to the upgrade).
    let again = applied(dir.path());
    let mut kubexm = Command::new(bin("kubexm"));
    kubexm.arg("--db").arg(dir.path().join("jobs.db"));
    let job = served(kubexm, &["upgrade", "cluster"], &lab, &new, &b_new, dir.path(), &[])
        .output()
        .unwrap();
    let said = ok(job, "kubexm upgrade cluster once more");
    assert!(said.contains("cluster lab already runs v1.37.2: nothing to do"), "{said}");
    assert_eq!(applied(dir.path()), again);
    let down = served(Command::new(bin("kubexm-install")), &["apply"], &lab, &old, &b_old, dir.path(), &[])
        .output()
        .unwrap();
    assert_eq!(down.status.code(), Some(3), "{}", text(&down.stderr));
    assert!(text(&down.stderr).contains("downgrade"), "{}", text(&down.stderr));
    assert_eq!(applied(dir.path()), again);
    kubexm_e2e::lab_cmd(&["upstream", "start"]);
    // The binaries on the hosts are the new lock's (the fixture publishes their sha256).
    for (h, bins) in [
        ("lab1", &["kubeadm", "kubelet", "kubectl"][..]),
        ("lab2", &["kubeadm", "kubelet"][..]),
        ("lab3", &["kubeadm", "kubelet"][..]),
    ] {
        for b in bins {
            let url = format!("{}/dl.k8s.io/release/v1.37.2/bin/linux/amd64/{b}.sha256", lab.desc.fixture.http);
            let want = text(&Command::new("curl").args(["-sf", &url]).output().unwrap().stdout);
            let got = lab.ssh_ok(h, &format!("sha256sum /usr/local/bin/{b}"));
            assert!(!want.trim().is_empty() && got.starts_with(want.trim()), "{h} {b}: {got} != {want}");
        }
    }
    // Issue 31's Cluster resource on this cluster's API server.
    crate::operator::cluster_resource_on_a_real_api_server(&lab, &new, dir.path());
    let day2 = |verb: &str, extra: &[&str]| served(Command::new(bin("kubexm-install")), &[verb], &lab, &new, &b_new, dir.path(), extra);
    crate::operator::controller_reconciles_the_cluster(&lab, dir.path(), &day2);
}

/// (node, started, ended, log) of every step of the last `upgrade` job, in order.
fn steps_of_last_upgrade(dir: &Path) -> Vec<(String, i64, i64, String)> {
    let db = rusqlite::Connection::open(dir.join("state.db")).unwrap();
    let mut q = db
        .prepare(
            "SELECT node, started, started + duration_ms, log FROM steps WHERE job = \
             (SELECT max(id) FROM jobs WHERE kind = 'upgrade' AND status = 'succeeded') ORDER BY started",
        )
        .unwrap();
    q.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}
