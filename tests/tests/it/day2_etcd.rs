//! Day 2 on the main scenario's cluster (issue 29): etcd 3 → 5 → 3 members
//! and a fourth control-plane node while a client writes. `apply` adds two
//! spare lab hosts as members, the first also as a control-plane node
//! (each a learner, promoted once caught up; every API server told; every
//! worker's local proxy lists the new node; the installer killed between
//! the first learner's addition and its promotion, then run again); the
//! control-plane node is stopped like a dead machine and removed with
//! `--unreachable` (an even etcd count: a warning; the local proxies
//! forward to the others), the other member removed as a live one
//! (leadership moved off it first); the dead one is reset once it is back.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use kubexm_e2e::{Lab, LabBundle, ok};

use crate::day2::{apply, apply_with, cluster_status, left_on, nodes_ready, remove_node};

/// etcdctl with lab1's client certificate, through `endpoints`.
fn ctl(endpoints: &str) -> String {
    format!(
        "ETCDCTL_API=3 etcdctl --cacert=/etc/kubexm/etcd/pki/ca.crt --cert=/etc/kubexm/etcd/pki/client.crt \
         --key=/etc/kubexm/etcd/pki/client.key --endpoints={endpoints}"
    )
}

/// `config` with `hosts` added to its hosts and etcd members, and `cp` (the
/// first of them) to its control-plane nodes and workers, written into `dir`.
fn with_members(lab: &Lab, config: &Path, hosts: &[&str], cp: &str, dir: &Path) -> PathBuf {
    let mut text = std::fs::read_to_string(config).unwrap();
    for host in hosts {
        let h = lab.host(host);
        let line = format!("    - {{name: {host}, address: {}, arch: {}}}\n", h.address, h.arch);
        text = text.replacen("  roleGroups:\n", &format!("{line}  roleGroups:\n"), 1);
    }
    for (old, new) in [
        (
            "    etcd: [lab1, lab2, lab3]\n",
            format!("    etcd: [lab1, lab2, lab3, {}]\n", hosts.join(", ")),
        ),
        (
            "    control-plane: [lab1, lab2, lab3]\n",
            format!("    control-plane: [lab1, lab2, lab3, {cp}]\n"),
        ),
    ] {
        assert!(text.contains(old), "{text}");
        text = text.replacen(old, &new, 1);
    }
    let start = text.find("    worker: [").expect("a worker list");
    let end = start + text[start..].find(']').unwrap();
    text.insert_str(end, &format!(", {cp}"));
    let path = dir.join("with-etcd-members.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A client on lab1 putting keys `w/1`, `w/2`, ... through lab1 to lab3
/// until told to stop; each failed attempt is counted and retried. Its
/// last acknowledged key and failures are in /root/writer.acked.
const WRITER: &str = "i=0; fails=0; rm -f /root/writer.stop /root/writer.acked
while [ ! -e /root/writer.stop ]; do
  i=$((i + 1))
  until $CTL --command-timeout=3s put w/$i $i >/dev/null 2>&1; do
    fails=$((fails + 1)); [ -e /root/writer.stop ] && exit 0; sleep 0.2
  done
  echo \"$i $fails\" > /root/writer.acked
  sleep 0.05
done
";

/// The client ([`WRITER`]) started on lab1 through `ctl`.
fn start_writer(lab: &Lab, ctl: &str, dir: &Path) {
    let writer = WRITER.replace("$CTL", ctl);
    std::fs::write(dir.join("writer.sh"), &writer).unwrap();
    lab.ssh_ok(
        "lab1",
        &format!("cat > /root/writer.sh <<'EOF'\n{writer}EOF\nsystemd-run --unit=kx-writer --collect sh /root/writer.sh >/dev/null"),
    );
}

/// The client stopped: every write it got an acknowledgement for is
/// readable through `ctl`.
fn writes_are_readable(lab: &Lab, ctl: &str) {
    lab.ssh_ok(
        "lab1",
        "touch /root/writer.stop; for i in $(seq 30); do systemctl is-active -q kx-writer || break; sleep 1; done",
    );
    let acked = lab.ssh_ok("lab1", "cat /root/writer.acked");
    let (n, fails) = acked.trim().split_once(' ').expect("the writer's count");
    let n: u64 = n.parse().unwrap();
    let keys = lab.ssh_ok(
        "lab1",
        &format!("{ctl} get w/ --prefix --keys-only | grep '^w/' | cut -d/ -f2 | sort -n | awk -v n={n} '$1 <= n {{ c++ }} END {{ print c + 0 }}'"),
    );
    assert_eq!(keys.trim(), n.to_string(), "acknowledged writes lost");
    eprintln!("the client wrote {n} keys throughout, all readable after; {fails} failed attempts retried");
}

/// Issue 29: etcd 3 → 5 → 3 members on the running cluster, a client
/// writing throughout.
pub fn etcd_grows_and_shrinks(lab: &Lab, config: &Path, b: &LabBundle, dir: &Path, kubectl: &dyn Fn(&str) -> String) {
    let spares: Vec<&str> = lab.desc.hosts.iter().filter(|h| h.spare).map(|h| h.name.as_str()).collect();
    let [.., a, z] = spares[..] else {
        panic!("two more spare lab hosts are needed: {spares:?}")
    };
    let addr = |h: &str| lab.host(h).address.clone();
    let three: Vec<String> = ["lab1", "lab2", "lab3"]
        .iter()
        .map(|m| format!("https://{}:2379", addr(m)))
        .collect();
    let lab1 = ctl(&three.join(","));
    start_writer(lab, &lab1, dir);
    let new = with_members(lab, config, &[a, z], a, dir);

    // 3 → 5: the plan, then the two join one at a time; a is a
    // control-plane node too.
    let plan = ok(apply(lab, &new, b, dir, &["--dry-run"]), "apply --dry-run (etcd members)");
    assert!(plan.contains(&format!("apply: adds etcd member(s) {a}, {z}")), "{plan}");
    assert!(plan.contains(&format!("apply: adds control-plane node(s) {a}")), "{plan}");
    // The installer killed (SIGKILL, a fault point of the test build) right
    // after the first learner is added, before its promotion; the re-run
    // converges.
    let killed = apply_with(
        lab,
        &new,
        Some(b),
        dir,
        &[],
        &[("KUBEXM_FAULT_KILL_AFTER", &format!("etcd-member-add@{a}"))],
    );
    assert_eq!(
        killed.status.signal(),
        Some(9),
        "not killed at the fault point: {}",
        kubexm_e2e::text(&killed.stderr)
    );
    let list = lab.ssh_ok("lab1", &format!("{lab1} member list"));
    assert!(
        list.lines()
            .any(|l| l.contains(&format!("https://{}:2380", addr(a))) && l.ends_with(", true")),
        "no learner {a} after the kill: {list}"
    );
    let start = Instant::now();
    let applied = ok(apply(lab, &new, b, dir, &[]), "apply (etcd members, again after the kill)");
    eprintln!(
        "apply (2 etcd members added, one a control-plane node) took {:?}:\n{applied}",
        start.elapsed()
    );
    let list = lab.ssh_ok("lab1", &format!("{lab1} member list"));
    assert_eq!(
        list.lines().filter(|l| l.contains(", started, ") && l.ends_with(", false")).count(),
        5,
        "{list}"
    );
    let five: Vec<String> = ["lab1", "lab2", "lab3", a, z]
        .iter()
        .map(|m| format!("https://{}:2379", addr(m)))
        .collect();
    let health = lab.ssh_ok("lab1", &format!("{} endpoint health 2>&1", ctl(&five.join(","))));
    assert_eq!(health.matches("is healthy").count(), 5, "{health}");
    let log = lab.ssh_ok(a, "journalctl -u kubexm-etcd --no-pager -o cat | grep -ci promot || true");
    let leader_log = lab.ssh_ok("lab1", "journalctl -u kubexm-etcd --no-pager -o cat | grep -i 'promote' | tail -2");
    assert!(log.trim() != "0" || !leader_log.trim().is_empty(), "no promotion in etcd's log");
    eprintln!("etcd's log of the promotion: {leader_log}");
    let servers = |h: &str| lab.ssh_ok(h, "ps -eo args | grep '^kube-apiserver ' | grep -o -- '--etcd-servers=[^ ]*'");
    for cp in ["lab1", "lab2", "lab3", a] {
        assert_eq!(servers(cp).trim(), format!("--etcd-servers={}", five.join(",")), "on {cp}");
    }
    let cc = kubectl("-n kube-system get configmap kubeadm-config -o jsonpath={.data.ClusterConfiguration}");
    assert!(five.iter().all(|e| cc.contains(e.as_str())), "{cc}");
    // The fourth control-plane node: Ready, its API server answers, every
    // worker's local proxy forwards to it.
    kubectl(&format!("wait --for=condition=Ready node/{a} --timeout=180s"));
    for cp in ["lab1", "lab2", "lab3", a] {
        let ready = kubectl(&format!("--server https://{}:6443 get --raw=/readyz", addr(cp)));
        assert_eq!(ready.trim(), "ok", "through {cp}");
    }
    let proxies = |line: &str| {
        ["lab4", "lab5"]
            .iter()
            .map(|w| {
                lab.ssh_ok(w, &format!("grep -c {line} /etc/haproxy/haproxy.cfg || true"))
                    .trim()
                    .to_string()
            })
            .collect::<Vec<_>>()
    };
    let server_a = format!("'server {a} {}:6443'", addr(a));
    assert_eq!(proxies(&server_a), ["1", "1"], "the local proxies do not list {a}");
    // Again, without --bundle: the one the record names, unpacked here.
    let again = ok(apply_with(lab, &new, None, dir, &[], &[]), "apply again without --bundle");
    assert!(again.contains(": 0 steps applied"), "{again}");

    // A dead control-plane node and member: removed with --unreachable,
    // leaving 4 members (a warning); the local proxies forward to the others.
    kubexm_e2e::lab_cmd(&["stop", a]);
    let start = Instant::now();
    let out = remove_node(&new, dir, &[a, "--unreachable", a]);
    let removed = ok(out, "remove node (a dead control-plane node and etcd member)");
    eprintln!("remove node {a} --unreachable took {:?}:\n{removed}", start.elapsed());
    assert!(removed.contains("4 etcd members, an even count"), "{removed}");
    assert!(removed.contains("still hold(s) the cluster's keys"), "{removed}");
    assert!(
        removed.contains("haproxy forwards to the control-plane nodes that stay on lab4, lab5"),
        "{removed}"
    );
    assert_eq!(proxies(&server_a), ["0", "0"], "the local proxies still list {a}");
    let nodes = kubectl("get nodes -o name");
    assert!(!nodes.contains(&format!("node/{a}\n")), "{nodes}");
    let list = lab.ssh_ok("lab1", &format!("{lab1} member list"));
    assert_eq!(list.lines().count(), 4, "{list}");
    assert!(!list.contains(&addr(a)), "{list}");
    let four: Vec<String> = five.iter().filter(|e| !e.contains(&format!("//{}:", addr(a)))).cloned().collect();
    let health = lab.ssh_ok("lab1", &format!("{} endpoint health 2>&1", ctl(&four.join(","))));
    assert_eq!(health.matches("is healthy").count(), 4, "{health}");
    for cp in ["lab1", "lab2", "lab3"] {
        assert_eq!(servers(cp).trim(), format!("--etcd-servers={}", four.join(",")), "on {cp}");
    }

    // A live member leaves: 3 again; its host reset.
    let start = Instant::now();
    let removed = ok(remove_node(&new, dir, &[z]), "remove node (an etcd member)");
    eprintln!("remove node {z} took {:?}:\n{removed}", start.elapsed());
    let list = lab.ssh_ok("lab1", &format!("{lab1} member list"));
    assert_eq!(list.lines().filter(|l| l.contains(", started, ")).count(), 3, "{list}");
    for cp in ["lab1", "lab2", "lab3"] {
        assert_eq!(servers(cp).trim(), format!("--etcd-servers={}", three.join(",")), "on {cp}");
    }
    let left = left_on(lab, z);
    assert!(left.trim().is_empty(), "{z} not reset:\n{left}");
    lab.ssh_ok(z, "! systemctl is-active -q kubexm-etcd && ! test -e /usr/local/bin/etcd");
    let status = cluster_status(dir);
    assert!(
        status
            .lines()
            .any(|l| l.trim_start().starts_with(a) && l.contains("removed, not reset")),
        "{status}"
    );

    writes_are_readable(lab, &lab1);

    // The dead node back: reset.
    kubexm_e2e::lab_cmd(&["start", a]);
    ok(remove_node(&new, dir, &[a]), "remove node (reset what came back)");
    let left = left_on(lab, a);
    assert!(left.trim().is_empty(), "{a} not reset:\n{left}");
    nodes_ready(kubectl);
}

/// Issue 29: the registry moves from lab1 (its default host, the first
/// control-plane node) to lab2 when roleGroups.registry names it. Without
/// the bundle's file apply is refused before any host is touched; with it,
/// every node's hosts.toml and the addons' images name lab2, lab1's
/// registry stops, an image pulls through lab2, and a re-run applies
/// nothing. `config` is the scenario's latest config.
pub fn registry_moves(lab: &Lab, config: &Path, b: &LabBundle, dir: &Path, kubectl: &dyn Fn(&str) -> String) {
    let addr = |h: &str| lab.host(h).address.clone();
    let text = std::fs::read_to_string(config)
        .unwrap()
        .replacen("  roleGroups:\n", "  roleGroups:\n    registry: [lab2]\n", 1);
    let new = dir.join("with-registry-on-lab2.yaml");
    std::fs::write(&new, text).unwrap();
    let refused = apply_with(lab, &new, None, dir, &[], &[]);
    let err = kubexm_e2e::text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{err}");
    assert!(
        err.contains("moving cluster lab's registry to lab2 needs the bundle's file"),
        "{err}"
    );
    let start = Instant::now();
    let applied = ok(apply(lab, &new, b, dir, &[]), "apply (the registry moved to lab2)");
    eprintln!(
        "apply (the registry moved from lab1 to lab2) took {:?}:\n{applied}",
        start.elapsed()
    );
    assert!(applied.contains("apply: moves the registry from lab1 to lab2"), "{applied}");
    let (from, to) = (format!("{}:5000", addr("lab1")), format!("{}:5000", addr("lab2")));
    for h in ["lab1", "lab2", "lab3", "lab4", "lab5"] {
        lab.ssh_ok(
            h,
            &format!("grep -q 'https://{to}' /etc/containerd/certs.d/registry.k8s.io/hosts.toml"),
        );
    }
    lab.ssh_ok(
        "lab1",
        "! systemctl is-active -q kubexm-registry && ! test -e /etc/systemd/system/kubexm-registry.service",
    );
    lab.ssh_ok("lab2", "systemctl is-active -q kubexm-registry");
    // An image lab4 no longer holds pulls through lab2 (containerd's own client).
    let image = "docker.io/library/nginx:1.27-lab";
    lab.ssh_ok(
        "lab4",
        &format!(
            "ctr -n k8s.io images rm {image} >/dev/null 2>&1; ctr -n k8s.io images pull --hosts-dir /etc/containerd/certs.d {image} >/dev/null"
        ),
    );
    let images = kubectl("get daemonsets,deployments -A -o jsonpath={..image}");
    assert!(images.contains(&to) && !images.contains(&from), "{images}");
    nodes_ready(kubectl);
    let again = ok(apply(lab, &new, b, dir, &[]), "apply again (the registry on lab2)");
    assert!(again.contains(": 0 steps applied"), "{again}");
}
