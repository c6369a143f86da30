//! The lab itself: real hosts, a real fixture upstream, and a clean teardown.

use std::process::Command;
use std::time::Instant;

use kubexm_bom::catalog::Catalog;
use kubexm_bom::config;
use kubexm_bom::mirror::Mirrors;
use kubexm_bom::resolve::resolve;
use kubexm_e2e::{Lab, lab_cmd, text};

fn sha256_of_url(url: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("curl -sSf '{url}' | sha256sum"))
        .output()
        .unwrap();
    assert!(out.status.success(), "curl {url}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn three_hosts_one_arm64_each_its_own_machine() {
    let start = Instant::now();
    let Some(lab) = Lab::up(3, 1) else { return };
    eprintln!("lab up with 3 hosts (1 arm64) in {:?}", start.elapsed());
    let mut seen_ids = Vec::new();
    for (name, arch) in [("lab1", "x86_64"), ("lab2", "x86_64"), ("lab3", "aarch64")] {
        let h = lab.host(name);
        let out = lab.ssh_ok(
            name,
            "hostname; uname -m; ip -4 -o addr show eth0 | awk '{print $4}'; cat /etc/machine-id",
        );
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], name, "hostname");
        assert_eq!(lines[1], arch, "uname -m on {name}");
        assert_eq!(lines[2], format!("{}/24", h.address));
        seen_ids.push(lines[3].to_string());
    }
    seen_ids.dedup();
    assert_eq!(seen_ids.len(), 3, "machine ids must differ");
    // Each host has its own filesystem.
    lab.ssh_ok("lab1", "echo only-here > /root/marker");
    for other in ["lab2", "lab3"] {
        assert!(
            !lab.ssh(other, "test -e /root/marker").status.success(),
            "lab1's file is visible on {other}"
        );
    }
    // Password auth for root and the sudo path of the non-root user, on amd64 and emulated arm64.
    for host in ["lab1", "lab3"] {
        let h = lab.host(host);
        for (user, cmd) in [("root", "id -u"), (lab.desc.ssh.sudo_user.as_str(), "sudo -n id -u")] {
            let out = Command::new("sshpass")
                .args([
                    "-p",
                    &lab.desc.ssh.password,
                    "ssh",
                    "-o",
                    "StrictHostKeyChecking=no",
                    "-o",
                    "UserKnownHostsFile=/dev/null",
                ])
                .args([
                    "-o",
                    "LogLevel=ERROR",
                    "-o",
                    "PubkeyAuthentication=no",
                    &format!("{user}@{}", h.address),
                    cmd,
                ])
                .output()
                .unwrap();
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                "0",
                "{user}@{host} `{cmd}`: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    // containerd's state directory is a plain bind mount, not the overlay.
    let src = lab.ssh_ok("lab1", "findmnt -n -o SOURCE /var/lib/containerd");
    assert!(src.contains("/containerd"), "{src}");
}

#[test]
fn fixture_registry_and_files_match_the_lab_catalog() {
    let Some(lab) = Lab::up(1, 0) else { return };
    let fx = &lab.desc.fixture;
    // A real client against the real registry: skopeo reads every fixture image by its upstream name.
    let images = std::fs::read_to_string(&fx.images).unwrap();
    for line in images.lines().filter(|l| !l.is_empty()) {
        let mut parts = line.split_whitespace();
        let (reference, _, digest) = (parts.next().unwrap(), parts.next(), parts.next().unwrap());
        let out = Command::new("skopeo")
            .args([
                "inspect",
                "--raw",
                "--tls-verify=false",
                &format!("docker://{}/{reference}", fx.registry),
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "skopeo inspect {reference}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got = format!("sha256:{}", kubexm_bundle::digest::sha256_hex(&out.stdout));
        assert_eq!(got, digest, "{reference}");
        let index: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let arches: Vec<&str> = index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["platform"]["architecture"].as_str().unwrap())
            .collect();
        assert_eq!(arches, ["amd64", "arm64"], "{reference}");
        if reference == "quay.io/metallb/speaker:v0.14.8" {
            assert_eq!(index["mediaType"], "application/vnd.docker.distribution.manifest.list.v2+json");
        }
    }
    // The lab cluster resolves, through the mirrors, to fixture files: those
    // of Debian's programs pinned by the lab catalog, those built from source
    // (Kubernetes, etcd 3.6, helm) not pinned, each with its published checksum file.
    let catalog = Catalog::with_overrides(&[fx.catalog.as_path()]).unwrap();
    let cluster = config::load_file(&lab.desc.cluster, &catalog).unwrap();
    let bom = resolve(&cluster, &catalog, &Mirrors::default()).unwrap();
    assert_eq!(bom.files.len(), 18);
    let (mut pinned, mut published) = (0, 0);
    for f in &bom.files {
        assert!(f.source.starts_with(&fx.http), "{} is not mapped to the fixture", f.source);
        let sha = sha256_of_url(&f.source);
        match &f.checksum {
            kubexm_bom::Checksum::Sha256(want) => {
                assert_eq!(*want, sha, "{}", f.source);
                pinned += 1;
            }
            kubexm_bom::Checksum::Published(url) => {
                assert!(url.starts_with(&fx.http), "{url} is not mapped to the fixture");
                let sums = text(&Command::new("curl").args(["-sf", url]).output().unwrap().stdout);
                assert!(sums.contains(&sha), "{url} does not list the sha256 of {}: {sums}", f.source);
                published += 1;
            }
            other => panic!("{}: {other:?}", f.source),
        }
    }
    assert!(pinned > 0 && published > 0, "{pinned} pinned, {published} published");
    for m in &bom.manifests {
        sha256_of_url(&m.source);
    }
}

/// Everything the lab could leave behind, as text, for before/after comparison.
fn lab_traces() -> Vec<String> {
    let mut t = Vec::new();
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    t.extend(
        mounts
            .lines()
            .filter(|l| l.contains("kubexm-lab/hosts"))
            .map(|l| format!("mount {l}")),
    );
    let links = Command::new("ip").args(["-o", "link"]).output().unwrap();
    t.extend(
        String::from_utf8_lossy(&links.stdout)
            .lines()
            .filter(|l| l.contains("kxv-") || l.contains("kxlab0"))
            .map(|l| format!("link {l}")),
    );
    let ns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    t.extend(
        String::from_utf8_lossy(&ns.stdout)
            .lines()
            .filter(|l| l.starts_with("kx-"))
            .map(|l| format!("netns {l}")),
    );
    let ps = Command::new("ps").args(["-eo", "pid,args"]).output().unwrap();
    t.extend(
        String::from_utf8_lossy(&ps.stdout)
            .lines()
            .filter(|l| l.contains("/run/kubexm-lab") || l.contains("fixture-server.py"))
            .filter(|l| !l.contains(" ps "))
            .map(|l| format!("process {l}")),
    );
    let cgroups = Command::new("sh")
        .arg("-c")
        .arg("find /sys/fs/cgroup -maxdepth 5 -type d -name kxlab 2>/dev/null")
        .output()
        .unwrap();
    t.extend(String::from_utf8_lossy(&cgroups.stdout).lines().map(|l| format!("cgroup {l}")));
    t.extend(forward_rule().into_iter().map(|(_, l)| format!("iptables {l}")));
    t
}

/// The lab's FORWARD rule on the machine (packets it dropped, the line), if present.
fn forward_rule() -> Option<(u64, String)> {
    let out = Command::new("iptables")
        .args(["-w", "-L", "FORWARD", "-v", "-x", "-n"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text.lines().find(|l| l.contains("kubexm-lab"))?.to_string();
    let packets = line.split_whitespace().next()?.parse().ok()?;
    Some((packets, line))
}

fn machine_sysctl(key: &str) -> String {
    std::fs::read_to_string(format!("/proc/sys/{}", key.replace('.', "/")))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// What kubelet needs of a host, and lab traffic kept in the lab: each host
/// in its own cgroup subtree with writable controllers, /dev/kmsg, the
/// kernel parameters kubelet checks (global ones set by `up`, restored by
/// `down`; ip_forward per host namespace), a lab nameserver, a default route
/// to the bridge address, and nothing forwarded from the bridge elsewhere.
#[test]
fn hosts_are_fit_for_kubelet_and_their_traffic_stays_in_the_lab() {
    const GLOBAL: [(&str, &str); 3] = [("vm.overcommit_memory", "1"), ("kernel.panic", "10"), ("kernel.panic_on_oops", "1")];
    let before: Vec<String> = GLOBAL.iter().map(|(k, _)| machine_sysctl(k)).collect();
    {
        let Some(lab) = Lab::up(2, 0) else { return };
        for (k, v) in GLOBAL {
            assert_eq!(machine_sysctl(k), v, "{k} while the lab is up");
        }
        let gw = &lab.desc.gateway;
        for name in ["lab1", "lab2"] {
            let out = lab.ssh_ok(
                name,
                "test -c /dev/kmsg && head -c 0 /dev/kmsg && echo kmsg; \
                 grep -E ':(cpu|memory|pids):' /proc/1/cgroup | awk -F: '$3 != \"/\"' | wc -l; \
                 cat /proc/sys/net/ipv4/ip_forward; awk '/^nameserver/{print $2}' /etc/resolv.conf; \
                 ip -4 route show default | awk '{print $3}'",
            );
            let lines: Vec<&str> = out.lines().collect();
            assert_eq!(
                lines,
                ["kmsg", "0", "1", gw.as_str(), gw.as_str()],
                "{name}: kmsg, cgroup root, ip_forward, nameserver, default route"
            );
        }
        // A cgroup made on lab1 lands in lab1's subtree on the machine, writable, and nowhere else.
        lab.ssh_ok("lab1", "mkdir /sys/fs/cgroup/cpu/kxprobe && mkdir /sys/fs/cgroup/memory/kxprobe");
        let found = Command::new("sh")
            .arg("-c")
            .arg("find /sys/fs/cgroup/cpu /sys/fs/cgroup/memory -type d -name kxprobe")
            .output()
            .unwrap();
        let found = String::from_utf8_lossy(&found.stdout).into_owned();
        assert_eq!(found.lines().count(), 2, "{found}");
        assert!(found.lines().all(|l| l.ends_with("/kxlab/lab1/kxprobe")), "{found}");
        assert!(!lab.ssh("lab2", "test -d /sys/fs/cgroup/cpu/kxprobe").status.success());
        lab.ssh_ok("lab1", "rmdir /sys/fs/cgroup/cpu/kxprobe /sys/fs/cgroup/memory/kxprobe");
        // Nothing leaves the lab through the machine: a packet for an outside
        // address is dropped by the lab's FORWARD rule (or not forwarded at all).
        let (dropped, _) = forward_rule().expect("the lab's FORWARD rule is in place while it is up");
        assert!(!lab.ssh("lab1", "curl -s -m 3 -o /dev/null http://192.0.2.1/").status.success());
        let (after, line) = forward_rule().unwrap();
        if machine_sysctl("net.ipv4.ip_forward") == "1" {
            assert!(after > dropped, "the machine forwards and the lab rule dropped nothing: {line}");
        }
    }
    let after: Vec<String> = GLOBAL.iter().map(|(k, _)| machine_sysctl(k)).collect();
    assert_eq!(after, before, "down restores the kernel parameters it changed");
    assert_eq!(lab_traces(), Vec::<String>::new(), "the lab left traces");
}

/// Kubernetes built from its Go modules by `ci/lab prepare`, served by the
/// fixture as dl.k8s.io publishes it: each binary beside its `.sha256`,
/// version-stamped, for amd64 and (emulated) arm64.
#[test]
fn real_kubernetes_binaries_are_served_as_upstream_publishes_them() {
    let Some(lab) = Lab::up(2, 1) else { return };
    let v = "v1.37.2";
    let base = format!("{}/dl.k8s.io/release/{v}/bin/linux", lab.desc.fixture.http);
    for (host, arch, bins) in [
        (
            "lab1",
            "amd64",
            &[
                "kubeadm",
                "kubelet",
                "kubectl",
                "kube-apiserver",
                "kube-controller-manager",
                "kube-scheduler",
                "kube-proxy",
            ][..],
        ),
        ("lab2", "arm64", &["kubeadm", "kubelet", "kubectl", "kube-proxy"][..]),
    ] {
        for b in bins {
            let url = format!("{base}/{arch}/{b}");
            let out = lab.ssh_ok(
                host,
                &format!(
                    "curl -sSf -o /usr/local/bin/{b} {url} && chmod 755 /usr/local/bin/{b} && \
                     [ \"$(sha256sum /usr/local/bin/{b} | cut -d' ' -f1)\" = \"$(curl -sSf {url}.sha256)\" ] && echo ok"
                ),
            );
            assert_eq!(out.trim(), "ok", "{host}: {b} and its .sha256");
        }
        let versions = lab.ssh_ok(
            host,
            "kubeadm version -o short; kubelet --version; kubectl version --client -o json | grep -o '\"gitVersion\": *\"[^\"]*\"'",
        );
        let lines: Vec<&str> = versions.lines().collect();
        assert_eq!(lines[0], v, "{host}: kubeadm version");
        assert_eq!(lines[1], format!("Kubernetes {v}"), "{host}: kubelet --version");
        assert!(lines[2].contains(v), "{host}: kubectl: {versions}");
    }
}

#[test]
fn down_after_a_failed_test_leaves_nothing_behind() {
    // A test that fails while the lab is up: the guard's drop brings it down during unwinding.
    let result = std::panic::catch_unwind(|| {
        let Some(_lab) = Lab::up(2, 0) else { return false };
        assert!(!lab_traces().is_empty(), "the lab shows no traces while up");
        panic!("simulated test failure");
    });
    if matches!(result, Ok(false)) {
        return; // skipped: no lab here
    }
    assert!(result.is_err(), "the simulated failure did not happen");
    assert_eq!(lab_traces(), Vec::<String>::new(), "the lab left traces after a failed test");
    // And `ci/lab down` is safe to run again with nothing up.
    lab_cmd(&["down"]);
}
