//! Real Kubernetes in the lab (issue: a real cluster in the lab): the
//! components `ci/lab prepare` builds from their Go modules, running on lab
//! hosts. So far: etcd 3.6, CoreDNS, helm and pause built from source and
//! served as their upstreams publish them; kubelet v1.37.2 on Debian's
//! containerd 1.6 in a lab host, standalone (no API server yet), in the
//! host's own cgroups.

use kubexm_e2e::Lab;

const KUBELET_CONFIG: &str = "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
staticPodPath: /etc/kubernetes/manifests
failSwapOn: false
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
imageGCHighThresholdPercent: 100
evictionHard: {nodefs.available: \"0%\", imagefs.available: \"0%\"}
";

/// Debian's containerd 1.6 and runc from the fixture, running on `host` (amd64).
fn containerd_on(lab: &Lab, host: &str) {
    let f = &lab.desc.fixture.http;
    lab.ssh_ok(
        host,
        &format!(
            "set -e; curl -sSf {f}/github.com/containerd/containerd/releases/download/v1.6.20/containerd-1.6.20-linux-amd64.tar.gz | tar -xz -C /usr/local; \
             curl -sSf -o /usr/local/sbin/runc {f}/github.com/opencontainers/runc/releases/download/v1.1.5/runc.amd64; chmod 755 /usr/local/sbin/runc; \
             mkdir -p /etc/containerd; containerd config default > /etc/containerd/config.toml; \
             systemd-run -q --unit=lab-containerd /usr/local/bin/containerd; \
             for i in $(seq 50); do [ -S /run/containerd/containerd.sock ] && break; sleep 0.2; done"
        ),
    );
}

/// The images `ci/lab prepare` builds from the components (pause, the control
/// plane, CoreDNS) are on the fixture registry under their upstream names,
/// and run for real: containerd and runc in a lab host start pause and keep
/// it running, and each other image's program names its version.
#[test]
fn images_of_the_built_components_run_in_a_lab_host() {
    let Some(lab) = Lab::up(1, 0) else { return };
    containerd_on(&lab, "lab1");
    let reg = format!("{}:5000", lab.desc.gateway);
    let out = lab.ssh_ok(
        "lab1",
        &format!(
            "set -e; p={reg}/registry.k8s.io/pause:3.10.2; ctr -n lab images pull -q --plain-http $p >/dev/null; \
             ctr -n lab run -d $p pause1 >/dev/null; sleep 2; ctr -n lab task ls | awk '$1 == \"pause1\" {{print $3}}'; \
             for i in kube-apiserver:v1.37.2 kube-controller-manager:v1.37.2 kube-scheduler:v1.37.2; do \
               ctr -n lab images pull -q --plain-http {reg}/registry.k8s.io/$i >/dev/null; \
               ctr -n lab run --rm {reg}/registry.k8s.io/$i v-$$ /usr/local/bin/${{i%%:*}} --version; done; \
             ctr -n lab images pull -q --plain-http {reg}/registry.k8s.io/coredns/coredns:v1.14.6 >/dev/null; \
             ctr -n lab run --rm {reg}/registry.k8s.io/coredns/coredns:v1.14.6 c-$$ /coredns -version | head -1; \
             ctr -n lab task kill -s KILL pause1 >/dev/null; sleep 1; ctr -n lab container rm pause1"
        ),
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "RUNNING",
            "Kubernetes v1.37.2",
            "Kubernetes v1.37.2",
            "Kubernetes v1.37.2",
            "CoreDNS-1.14.6"
        ],
        "{out}"
    );
    lab.ssh_ok("lab1", "systemctl stop lab-containerd");
}

/// kubelet starts and stays healthy in a lab host with the settings a
/// cgroup v1, containerd 1.x machine needs (`failCgroupV1: false`, the
/// cgroupfs driver), and the pod cgroups it creates land in that host's own
/// subtree on the machine, not in a tree shared with the other hosts.
#[test]
fn a_real_kubelet_runs_in_a_lab_host_in_its_own_cgroups() {
    let Some(lab) = Lab::up(2, 0) else { return };
    let f = &lab.desc.fixture.http;
    let k8s = format!("{f}/dl.k8s.io/release/v1.37.2/bin/linux/amd64");
    containerd_on(&lab, "lab1");
    lab.ssh_ok(
        "lab1",
        &format!(
            "set -e; curl -sSf -o /usr/local/bin/kubelet {k8s}/kubelet; chmod 755 /usr/local/bin/kubelet; \
             mkdir -p /etc/kubernetes/manifests /var/lib/kubelet; \
             printf '%s' '{KUBELET_CONFIG}' > /var/lib/kubelet/config.yaml; \
             systemd-run -q --unit=lab-kubelet /usr/local/bin/kubelet --config=/var/lib/kubelet/config.yaml --hostname-override=lab1"
        ),
    );
    // Healthy, and still running a while later (a fatal check would have stopped it).
    let mut healthy = String::new();
    for _ in 0..60 {
        healthy = String::from_utf8_lossy(&lab.ssh("lab1", "curl -s -m 2 localhost:10248/healthz").stdout).into_owned();
        if healthy == "ok" {
            break;
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
    let journal = || lab.ssh_ok("lab1", "journalctl -u lab-kubelet --no-pager | tail -40");
    assert_eq!(healthy, "ok", "kubelet never became healthy:\n{}", journal());
    std::thread::sleep(std::time::Duration::from_secs(5));
    let state = lab.ssh_ok("lab1", "systemctl is-active lab-kubelet; curl -sk https://localhost:10250/pods");
    assert!(
        state.starts_with("active\n") && state.contains("\"kind\":\"PodList\""),
        "{state}\n{}",
        journal()
    );
    let version = lab.ssh_ok(
        "lab1",
        "journalctl -u lab-kubelet --no-pager | grep -o 'kubeletVersion=\"[^\"]*\"' | head -1",
    );
    assert!(version.contains("v1.37.2"), "{version}");
    // Its pod cgroups are lab1's own: under kxlab/lab1 on the machine, none elsewhere.
    let found = std::process::Command::new("sh")
        .arg("-c")
        .arg("find /sys/fs/cgroup/cpu /sys/fs/cgroup/memory -type d -name kubepods 2>/dev/null")
        .output()
        .unwrap();
    let found = String::from_utf8_lossy(&found.stdout).into_owned();
    assert_eq!(found.lines().count(), 2, "{found}");
    assert!(found.lines().all(|l| l.ends_with("/kxlab/lab1/kubepods")), "{found}");
    assert!(!lab.ssh("lab2", "test -d /sys/fs/cgroup/cpu/kubepods").status.success());
    lab.ssh_ok("lab1", "systemctl stop lab-kubelet lab-containerd");
}

/// etcd 3.6, CoreDNS, helm and pause, built from source by `ci/lab prepare`:
/// each archive matches the checksum file beside it, as upstream publishes
/// them, and each program runs and names its version on amd64, and etcd and
/// pause on (emulated) arm64.
#[test]
fn components_built_from_source_are_served_as_upstream_publishes_them_and_run() {
    let Some(lab) = Lab::up(2, 1) else { return };
    let f = &lab.desc.fixture.http;
    for (host, arch) in [("lab1", "amd64"), ("lab2", "arm64")] {
        let out = lab.ssh_ok(
            host,
            &format!(
                "set -e; cd /tmp; e=etcd-v3.6.16-linux-{arch}.tar.gz; u={f}/github.com/etcd-io/etcd/releases/download/v3.6.16; \
                 curl -sSfO $u/$e; curl -sSf $u/SHA256SUMS | grep \" $e$\" | sha256sum -c --quiet -; \
                 tar -xzf $e; ./etcd-v3.6.16-linux-{arch}/etcd --version | head -1; ./etcd-v3.6.16-linux-{arch}/etcdctl version | head -1; \
                 curl -sSf -o pause {f}/kubexm-lab/pause/v3.10.2/{arch}/pause; chmod 755 pause; ./pause -v"
            ),
        );
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            ["etcd Version: 3.6.16", "etcdctl version: 3.6.16", "pause.c v3.10.2-kubexm-lab"],
            "{host}"
        );
    }
    let out = lab.ssh_ok(
        "lab1",
        &format!(
            "set -e; cd /tmp; c=coredns_1.14.6_linux_amd64.tgz; u={f}/github.com/coredns/coredns/releases/download/v1.14.6; \
             curl -sSfO $u/$c; curl -sSf $u/$c.sha256 | sha256sum -c --quiet -; tar -xzf $c; ./coredns -version | head -1; \
             h=helm-v3.20.2-linux-amd64.tar.gz; curl -sSfO {f}/get.helm.sh/$h; curl -sSf {f}/get.helm.sh/$h.sha256sum | sha256sum -c --quiet -; \
             tar -xzf $h; ./linux-amd64/helm version --short"
        ),
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines, ["CoreDNS-1.14.6", "v3.20.2"], "{out}");
}
