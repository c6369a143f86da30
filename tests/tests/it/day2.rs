//! Day 2 on the main scenario's cluster (issue 29), called from it in
//! order: `apply` adds a worker (a spare lab host) to the running cluster;
//! etcd snapshots are taken and pruned.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kubexm_e2e::{Lab, LabBundle, bin, free_port, ok, text};

/// `kubexm-install apply -f CONFIG` with the scenario's bundle, root and state.
pub(crate) fn apply(lab: &Lab, config: &Path, b: &LabBundle, dir: &Path, extra: &[&str]) -> Output {
    apply_with(lab, config, Some(b), dir, extra, &[])
}

/// [`apply`] with `env` set (a fault point); without a bundle, apply
/// takes the one the record names, as the install unpacked it.
pub(crate) fn apply_with(lab: &Lab, config: &Path, b: Option<&LabBundle>, dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(bin("kubexm-install"));
    cmd.envs(env.iter().copied()).arg("apply").arg("-f").arg(config);
    if let Some(b) = b {
        cmd.arg("--bundle").arg(&b.bundle).arg("--pubkey").arg(&b.public_key);
    }
    cmd.arg("--root")
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
    // lists the nodes, each with its own connection quota, lab6 now too
    // (restarted, it may still be starting when its readiness is checked);
    // and the Cluster object, which lists lab6 now, the spec as applied, and its status.
    let on_old: Vec<String> = steps
        .iter()
        .filter(|s| s.host != spare && s.status == "applied")
        .map(|s| s.node.clone())
        .collect();
    assert!(
        on_old.iter().all(|n| [
            "registry/registry/registry-service@lab1",
            "registry/registry/registry-ready@lab1",
            "operator/cluster/cluster-object@lab1",
            "operator/cluster/cluster-applied@lab1",
            "operator/cluster/cluster-status@lab1"
        ]
        .contains(&n.as_str())),
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
        let to = snapshots.to_str().unwrap();
        let out = on_cluster(&["etcd", "snapshot", "--keep", "2", "-o", "json", "--dir", to], config, dir);
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

/// `kubexm-install ARGS -f CONFIG` with the scenario's root and state.
pub(crate) fn on_cluster(args: &[&str], config: &Path, dir: &Path) -> Output {
    Command::new(bin("kubexm-install"))
        .args(args)
        .arg("-f")
        .arg(config)
        .arg("--root")
        .arg(dir.join("root"))
        .arg("--state")
        .arg(dir.join("state.db"))
        .output()
        .unwrap()
}

/// `kubexm-install remove node ARGS -f CONFIG` with the scenario's root and state.
pub(crate) fn remove_node(config: &Path, dir: &Path, args: &[&str]) -> Output {
    on_cluster(&[&["remove", "node"], args].concat(), config, dir)
}

/// The nodes are Ready, but lab5, the emulated arm64 host, which never is.
pub(crate) fn nodes_ready(kubectl: &dyn Fn(&str) -> String) {
    let nodes = kubectl("get nodes --no-headers");
    assert!(
        nodes
            .lines()
            .filter(|l| !l.starts_with("lab5 "))
            .all(|l| l.split_whitespace().nth(1) == Some("Ready")),
        "{nodes}"
    );
}

/// `status --cluster lab` as text.
pub(crate) fn cluster_status(dir: &Path) -> String {
    let out = Command::new(bin("kubexm-install"))
        .args(["status", "--cluster", "lab", "--state"])
        .arg(dir.join("state.db"))
        .output()
        .unwrap();
    ok(out, "status --cluster lab")
}

/// What kubexm left on `host` (empty: nothing).
pub(crate) fn left_on(lab: &Lab, host: &str) -> String {
    lab.ssh_ok(
        host,
        "for p in /etc/kubexm /var/lib/kubexm /etc/kubernetes /usr/local/bin/kubelet; do test -e $p && echo $p; done; \
         systemctl is-active -q kubelet && echo kubelet-running; true",
    )
}

/// Issue 29: `remove node` on the running cluster, with the spare worker
/// `apply` added (`config` lists it; `base` does not). A drain a
/// PodDisruptionBudget blocks fails naming the pod and leaves the node
/// cordoned; `--force-drain` removes it: Node gone, host reset, record
/// without it. Added again by `apply` (every step runs again on it), then
/// stopped like a dead machine and removed with `--unreachable`: no step
/// is attempted on it, `status` lists it as removed, not reset; back up,
/// `remove node` resets it.
pub fn remove_nodes(lab: &Lab, config: &Path, base: &Path, b: &LabBundle, dir: &Path, kubectl: &dyn Fn(&str) -> String) {
    let spare = lab.desc.hosts.iter().find(|h| h.spare).expect("a spare lab host").name.clone();
    let image = "docker.io/library/nginx:1.27-lab";
    kubectl(&format!(
        "create deployment pinned --image={image} --replicas=0 -- /bin/busybox sleep 3600"
    ));
    kubectl(&format!(
        "patch deployment pinned -p '{{\"spec\":{{\"template\":{{\"spec\":{{\"terminationGracePeriodSeconds\":1,\"nodeSelector\":{{\"kubernetes.io/hostname\":\"{spare}\"}}}}}}}}}}'"
    ));
    // Scaled up once pinned: no replica of another spec is left terminating.
    kubectl("scale deployment pinned --replicas=1");
    kubectl("create poddisruptionbudget pinned --selector=app=pinned --min-available=1");
    kubectl("rollout status deployment/pinned --timeout=180s");

    let start = std::time::Instant::now();
    let blocked = remove_node(config, dir, &[&spare, "--drain-timeout", "3"]);
    let err = text(&blocked.stderr);
    assert_eq!(blocked.status.code(), Some(7), "{err}");
    assert!(
        err.contains("blocked by a PodDisruptionBudget") && err.contains("default/pinned-") && err.contains("--force-drain"),
        "{err}"
    );
    eprintln!("remove node, blocked by a PDB: {:?}", start.elapsed());
    let cordoned = kubectl(&format!("get node {spare} -o jsonpath={{.spec.unschedulable}}"));
    assert_eq!(cordoned.trim(), "true", "the node is not cordoned");
    assert!(cluster_status(dir).contains(&spare), "a failed removal changed the record");

    let start = std::time::Instant::now();
    let removed = ok(remove_node(config, dir, &[&spare, "--force-drain"]), "remove node --force-drain");
    eprintln!("remove node --force-drain took {:?}:\n{removed}", start.elapsed());
    assert!(
        removed.contains(&format!("removed {spare} from cluster lab")) && removed.contains("delete this host from the config"),
        "{removed}"
    );
    let gone = kubectl(&format!("get node {spare} --ignore-not-found -o name"));
    assert!(gone.trim().is_empty(), "{spare} is still a Node: {gone}");
    let left = left_on(lab, &spare);
    assert!(left.trim().is_empty(), "{spare} not reset:\n{left}");
    let status = cluster_status(dir);
    assert!(
        status.contains("(remove-node, succeeded)") && !status.lines().any(|l| l.trim_start().starts_with(&spare)),
        "{status}"
    );
    kubectl("delete deployment pinned");
    kubectl("delete poddisruptionbudget pinned");

    // Added again: every step runs on it again.
    let again = ok(apply(lab, config, b, dir, &[]), "apply (the spare again)");
    assert!(!again.contains(": 0 steps applied"), "{again}");
    kubectl(&format!("wait --for=condition=Ready node/{spare} --timeout=180s"));

    // Dead: never contacted, removed all the same.
    kubexm_e2e::lab_cmd(&["stop", &spare]);
    let start = std::time::Instant::now();
    let out = ok(
        remove_node(base, dir, &[&spare, "--unreachable", &spare, "-o", "json"]),
        "remove node --unreachable",
    );
    eprintln!("remove node --unreachable took {:?}", start.elapsed());
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["hosts"][0]["reset"], false, "{r}");
    assert_eq!(r["hosts"][0]["skipped"], serde_json::json!(["drain", "reset"]), "{r}");
    let state = kubexm_installer::engine::state::State::open(&dir.join("state.db"), vec![]).unwrap();
    let steps = state.steps(r["job"].as_i64().unwrap()).unwrap();
    assert!(steps.iter().all(|s| s.host != spare), "a step was attempted on {spare}");
    let gone = kubectl(&format!("get node {spare} --ignore-not-found -o name"));
    assert!(gone.trim().is_empty(), "{spare} is still a Node: {gone}");
    let status = cluster_status(dir);
    assert!(
        status
            .lines()
            .any(|l| l.trim_start().starts_with(&spare) && l.contains("removed, not reset")),
        "{status}"
    );
    // An apply with it listed is refused until it is reset.
    let refused = apply(lab, config, b, dir, &[]);
    assert_eq!(refused.status.code(), Some(3), "{}", text(&refused.stderr));

    // Back up: remove node resets it (its Node is gone already).
    kubexm_e2e::lab_cmd(&["start", &spare]);
    let reset = ok(remove_node(config, dir, &[&spare]), "remove node (reset what came back)");
    assert!(reset.contains("host reset; its Node deleted if it had registered again"), "{reset}");
    let gone = kubectl(&format!("get node {spare} --ignore-not-found -o name"));
    assert!(gone.trim().is_empty(), "{spare} is a Node again: {gone}");
    let left = left_on(lab, &spare);
    assert!(left.trim().is_empty(), "{spare} not reset:\n{left}");
    assert!(!cluster_status(dir).lines().any(|l| l.trim_start().starts_with(&spare)));
}

/// Issue 29: `certs check` reads every certificate on the hosts: kubeadm's
/// leafs (a year) are flagged under `--warn-days 400` (exit 7), the CAs
/// (ten years) are not; under the default 30 days nothing is (exit 0).
pub fn certificates_are_checked(config: &Path, dir: &Path) {
    let check = |extra: &[&str]| on_cluster(&[&["certs", "check"], extra].concat(), config, dir);
    let start = std::time::Instant::now();
    let fine = ok(check(&[]), "certs check");
    eprintln!("certs check took {:?}", start.elapsed());
    assert!(fine.contains("expire within 30 days") && !fine.contains("<-- renew"), "{fine}");
    let flagged = check(&["--warn-days", "400", "-o", "json"]);
    assert_eq!(flagged.status.code(), Some(7), "{}", text(&flagged.stderr));
    let r: serde_json::Value = serde_json::from_slice(&flagged.stdout).unwrap();
    let certs = r["certs"].as_array().unwrap();
    let find = |host: &str, path: &str| {
        certs
            .iter()
            .find(|c| c["host"] == host && c["path"] == path)
            .unwrap_or_else(|| panic!("no {path} on {host}: {r}"))
    };
    let leaf = find("lab1", "/etc/kubernetes/pki/apiserver.crt");
    assert!(leaf["daysLeft"].as_i64().unwrap() < 400 && leaf["ca"] == false, "{leaf}");
    let ca = find("lab1", "/etc/kubernetes/pki/ca.crt");
    assert!(ca["daysLeft"].as_i64().unwrap() > 3000 && ca["ca"] == true, "{ca}");
    find("lab1", "/etc/kubernetes/admin.conf");
    find("lab4", "/var/lib/kubelet/pki/kubelet-client-current.pem");
    assert!(
        certs
            .iter()
            .any(|c| c["path"].as_str().unwrap().starts_with("/etc/kubexm/etcd/pki/")),
        "no etcd certificate: {r}"
    );
    assert!(!String::from_utf8_lossy(&flagged.stdout).contains("PRIVATE KEY"), "a key was read");
}

/// Issue 29: `certs renew`. With `certificates.leafDays: 5`, `--all` issues
/// every kubexm leaf for 5 days (etcd member by member, each checked
/// healthy; the registry's server certificate too) and
/// renews kubeadm's (static pods restarted): `certs check` flags the 5-day
/// leafs (exit 7) and kubeadm's end later than before. Back to the default
/// lifetime, a plain renew issues only what is due; the check passes; a
/// re-run changes nothing; the nodes stay Ready through the new admin
/// kubeconfig.
pub fn certificates_are_renewed(lab: &Lab, config: &Path, dir: &Path, kubectl: &dyn Fn(&str) -> String) {
    let run = |args: &[&str], file: &Path| on_cluster(args, file, dir);
    let json = |o: Output, what: &str| -> serde_json::Value { serde_json::from_str(&ok(o, what)).unwrap() };
    let end_of = |r: &serde_json::Value, host: &str, path: &str| -> i64 {
        r["certs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["host"] == host && c["path"] == path)
            .unwrap_or_else(|| panic!("no {path} on {host}: {r}"))["notAfter"]
            .as_i64()
            .unwrap()
    };
    let before = json(run(&["certs", "check", "-o", "json"], config), "certs check");
    let apiserver = end_of(&before, "lab2", "/etc/kubernetes/pki/apiserver.crt");
    let kubeconfig = std::fs::read(dir.join("root/lab.kubeconfig")).unwrap();
    let five = dir.join("five-days.yaml");
    let yaml = std::fs::read_to_string(config).unwrap();
    std::fs::write(
        &five,
        yaml.replacen("  kubernetes:\n", "  certificates: {leafDays: 5}\n  kubernetes:\n", 1),
    )
    .unwrap();
    let start = std::time::Instant::now();
    let all = json(run(&["certs", "renew", "--all", "-o", "json"], &five), "certs renew --all");
    eprintln!("certs renew --all took {:?}: {all}", start.elapsed());
    let changed = all["changed"].as_array().unwrap();
    for h in ["lab1", "lab2", "lab3"] {
        for step in ["etcd-pki", "kubeadm-certs-renewed", "static-pods-restarted"] {
            assert!(
                changed.iter().any(|c| c.as_str().unwrap().starts_with(&format!("{h}: {step}: "))),
                "{h} {step}: {all}"
            );
        }
    }
    assert_ne!(
        std::fs::read(dir.join("root/lab.kubeconfig")).unwrap(),
        kubeconfig,
        "a new admin kubeconfig"
    );
    let flagged = run(&["certs", "check", "-o", "json"], config);
    assert_eq!(flagged.status.code(), Some(7), "{}", text(&flagged.stderr));
    let flagged: serde_json::Value = serde_json::from_slice(&flagged.stdout).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    for (h, path) in [
        ("lab1", "/etc/kubexm/etcd/pki/server.crt"),
        ("lab3", "/etc/kubexm/etcd/pki/peer.crt"),
        ("lab1", "/etc/kubexm/pki/registry.crt"),
    ] {
        let days = (end_of(&flagged, h, path) - now) / 86_400;
        assert!((5..=6).contains(&days), "{h} {path}: {days} days");
    }
    assert!(
        end_of(&flagged, "lab2", "/etc/kubernetes/pki/apiserver.crt") > apiserver,
        "kubeadm's leaf renewed"
    );
    let start = std::time::Instant::now();
    let due = json(run(&["certs", "renew", "-o", "json"], config), "certs renew");
    eprintln!("certs renew (the 5-day leafs) took {:?}: {due}", start.elapsed());
    assert!(!due["reissued"].as_array().unwrap().is_empty(), "{due}");
    assert!(
        !due["changed"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c.as_str().unwrap().contains("kubeadm-certs-renewed")),
        "kubeadm's leafs were not due: {due}"
    );
    let fine = json(run(&["certs", "check", "-o", "json"], config), "certs check after renew");
    assert!(
        (end_of(&fine, "lab1", "/etc/kubexm/etcd/pki/server.crt") - now) / 86_400 >= 360,
        "{fine}"
    );
    let again = json(run(&["certs", "renew", "-o", "json"], config), "certs renew again");
    assert_eq!(
        (
            again["reissued"].as_array().unwrap().len(),
            again["changed"].as_array().unwrap().len()
        ),
        (0, 0),
        "a re-run changes nothing: {again}"
    );
    nodes_ready(kubectl);
    lab.ssh_ok("lab1", "ETCDCTL_API=3 etcdctl --endpoints=https://127.0.0.1:2379 --cacert=/etc/kubexm/etcd/pki/ca.crt --cert=/etc/kubexm/etcd/pki/client.crt --key=/etc/kubexm/etcd/pki/client.key endpoint health --cluster");
}

/// Issue 29: `etcd restore`. k=v1 is put, a snapshot taken, k=v2 put; a
/// copy with one byte flipped is refused (exit 6), and so are a snapshot of
/// another cluster (exit 2) and one of a cluster with another etcd CA, each
/// before anything stops (etcd still answers v2); without --yes the plan
/// only (exit 2). The restore brings k=v1 back on every member, the API
/// servers and every node Ready.
pub fn etcd_is_restored(lab: &Lab, config: &Path, dir: &Path, kubectl: &dyn Fn(&str) -> String) {
    let ctl = "ETCDCTL_API=3 etcdctl --endpoints=https://127.0.0.1:2379 --cacert=/etc/kubexm/etcd/pki/ca.crt \
               --cert=/etc/kubexm/etcd/pki/client.crt --key=/etc/kubexm/etcd/pki/client.key";
    let get = |h: &str| {
        lab.ssh_ok(h, &format!("{ctl} get kubexm-restore-k --consistency=s --print-value-only"))
            .trim()
            .to_string()
    };
    let run = |args: &[&str]| on_cluster(args, config, dir);
    lab.ssh_ok("lab1", &format!("{ctl} put kubexm-restore-k v1 >/dev/null"));
    let taken: serde_json::Value = serde_json::from_str(&ok(run(&["etcd", "snapshot", "-o", "json"]), "etcd snapshot")).unwrap();
    let file = PathBuf::from(taken["file"].as_str().unwrap());
    lab.ssh_ok("lab1", &format!("{ctl} put kubexm-restore-k v2 >/dev/null"));
    // Copies beside it: one byte flipped; another cluster's; another CA's.
    let name = file.file_name().unwrap().to_str().unwrap().to_string();
    let sidecar: serde_json::Value = serde_json::from_slice(&std::fs::read(format!("{}.json", file.display())).unwrap()).unwrap();
    let copy = |sub: &str, edit: &dyn Fn(&mut Vec<u8>, &mut serde_json::Value)| -> PathBuf {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d).unwrap();
        let (mut bytes, mut info) = (std::fs::read(&file).unwrap(), sidecar.clone());
        edit(&mut bytes, &mut info);
        std::fs::write(d.join(&name), bytes).unwrap();
        std::fs::write(d.join(format!("{name}.json")), serde_json::to_vec(&info).unwrap()).unwrap();
        d.join(&name)
    };
    let flipped = copy("flipped", &|b, _| {
        let i = b.len() / 2;
        b[i] ^= 0x01;
    });
    let other = copy("other", &|_, i| i["cluster"] = "other".into());
    let other_ca = copy("other-ca", &|_, i| i["etcdCa"] = "0".repeat(64).into());
    for (f, code, says) in [
        (&flipped, 6, "the file is damaged"),
        (&other, 2, "a snapshot of cluster other"),
        (&other_ca, 2, "another cluster's snapshot"),
    ] {
        let out = run(&["etcd", "restore", "--yes", "--snapshot", f.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(code), "{}: {}", f.display(), text(&out.stderr));
        assert!(text(&out.stderr).contains(says), "{}: {}", f.display(), text(&out.stderr));
    }
    let plan = run(&["etcd", "restore", "--snapshot", file.to_str().unwrap()]);
    assert_eq!(plan.status.code(), Some(2), "{}", text(&plan.stderr));
    assert!(text(&plan.stderr).contains("Pass --yes"), "{}", text(&plan.stderr));
    assert_eq!(get("lab1"), "v2", "nothing was stopped or restored");
    let start = std::time::Instant::now();
    let restored = ok(
        run(&["etcd", "restore", "--yes", "--snapshot", file.to_str().unwrap()]),
        "etcd restore",
    );
    eprintln!("etcd restore took {:?}:\n{restored}", start.elapsed());
    for h in ["lab1", "lab2", "lab3"] {
        assert_eq!(get(h), "v1", "{h} after the restore");
    }
    nodes_ready(kubectl);
    lab.ssh_ok("lab1", &format!("{ctl} endpoint health --cluster"));
}

/// Issue 29: `etcd.backup` added by `apply` installs a timer on every etcd
/// host; its service, started by hand three times on lab1, leaves the
/// newest two snapshots, each with a sha256 that checks.
pub fn etcd_backup_timer(lab: &Lab, config: &Path, b: &LabBundle, dir: &Path) {
    let text = std::fs::read_to_string(config).unwrap().replacen(
        "  kubernetes:\n",
        "  etcd: {backup: {schedule: daily, keep: 2, directory: /var/lib/etcd-backups}}\n  kubernetes:\n",
        1,
    );
    let new = dir.join("with-backup.yaml");
    std::fs::write(&new, text).unwrap();
    let start = std::time::Instant::now();
    let applied = ok(apply(lab, &new, b, dir, &[]), "apply (etcd.backup)");
    eprintln!("apply (etcd.backup) took {:?}", start.elapsed());
    eprintln!("{applied}");
    let state = kubexm_installer::engine::state::State::open(&dir.join("state.db"), vec![]).unwrap();
    let job = state.job(None).unwrap().expect("the apply's job");
    let backups: Vec<String> = state
        .steps(job.id)
        .unwrap()
        .into_iter()
        .filter(|s| s.status == "applied" && s.node.contains("/etcd-backup@"))
        .map(|s| s.host)
        .collect();
    assert_eq!(backups.len(), 3, "etcd-backup applied on {backups:?}");
    for h in ["lab1", "lab2", "lab3"] {
        lab.ssh_ok(
            h,
            "systemctl is-enabled -q kubexm-etcd-backup.timer && systemctl is-active -q kubexm-etcd-backup.timer",
        );
    }
    let left = lab.ssh_ok(
        "lab1",
        "for i in 1 2 3; do systemctl start kubexm-etcd-backup.service; sleep 1; done; \
         cd /var/lib/etcd-backups && sha256sum -c --quiet *.sha256 && ls -1",
    );
    let files: Vec<&str> = left.lines().collect();
    assert_eq!(files.len(), 4, "two snapshots and their sums: {left}");
    assert_eq!(
        files.iter().filter(|f| f.starts_with("lab1-") && f.ends_with(".db")).count(),
        2,
        "{left}"
    );
}
