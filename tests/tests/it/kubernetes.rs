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
    containerd_with(lab, host, "");
}

/// The same, with `extra` run after the default config is written (edits to it).
fn containerd_with(lab: &Lab, host: &str, extra: &str) {
    let f = &lab.desc.fixture.http;
    lab.ssh_ok(
        host,
        &format!(
            "set -e; curl -sSf {f}/github.com/containerd/containerd/releases/download/v1.6.20/containerd-1.6.20-linux-amd64.tar.gz | tar -xz -C /usr/local; \
             curl -sSf -o /usr/local/sbin/runc {f}/github.com/opencontainers/runc/releases/download/v1.1.5/runc.amd64; chmod 755 /usr/local/sbin/runc; \
             mkdir -p /etc/containerd; containerd config default > /etc/containerd/config.toml; {extra} \
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
                 curl -sSf -o pause {f}/kubexm-lab/pause/v3.10.2/{arch}/pause; chmod 755 pause; ./pause -v; \
                 h=helm-v3.20.2-linux-{arch}.tar.gz; curl -sSfO {f}/get.helm.sh/$h; curl -sSf {f}/get.helm.sh/$h.sha256sum | sha256sum -c --quiet -; \
                 tar -xzf $h; ./linux-{arch}/helm version --short; \
                 curl -sSf -o flanneld {f}/github.com/flannel-io/flannel/releases/download/v0.28.10/flanneld-{arch}; chmod 755 flanneld; ./flanneld --version 2>&1; \
                 curl -sSf -o flannel {f}/kubexm-lab/flannel-cni/v0.9.1/{arch}/flannel; chmod 755 flannel; ./flannel 2>&1 | head -1"
            ),
        );
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            [
                "etcd Version: 3.6.16",
                "etcdctl version: 3.6.16",
                "pause.c v3.10.2-kubexm-lab",
                "v3.20.2",
                "v0.28.10",
                "CNI flannel plugin version unknown"
            ],
            "{host}"
        );
    }
    let out = lab.ssh_ok(
        "lab1",
        &format!(
            "set -e; cd /tmp; c=coredns_1.14.6_linux_amd64.tgz; u={f}/github.com/coredns/coredns/releases/download/v1.14.6; \
             curl -sSfO $u/$c; curl -sSf $u/$c.sha256 | sha256sum -c --quiet -; tar -xzf $c; ./coredns -version | head -1"
        ),
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines, ["CoreDNS-1.14.6"], "{out}");
}

const INIT_CONFIG: &str = "apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint: {advertiseAddress: ADDRESS, bindPort: 6443}
nodeRegistration:
  name: lab1
  criSocket: unix:///run/containerd/containerd.sock
  imagePullPolicy: IfNotPresent
  ignorePreflightErrors: [SystemVerification]
  kubeletExtraArgs:
    - {name: node-ip, value: ADDRESS}
timeouts: {controlPlaneComponentHealthCheck: 600s}
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
clusterName: lab
kubernetesVersion: v1.37.2
controlPlaneEndpoint: ADDRESS:6443
networking: {podSubnet: 198.19.0.0/16, serviceSubnet: 198.18.128.0/20}
etcd:
  external: {endpoints: [\"http://127.0.0.1:2379\"]}
---
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
evictionHard: {nodefs.available: \"1%\", imagefs.available: \"1%\"}
---
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
conntrack: {maxPerCore: 0}
iptables: {localhostNodePorts: false}
";

/// The pod network by hand: Debian's bridge and host-local CNI plugins on a
/// node's pod CIDR, and a route to each other node's pod CIDR through it
/// (kindnet's design; masquerading off: the minbase hosts have no iptables).
/// A real two-node cluster by a real kubeadm, by hand (what kubexm-install
/// automates, proven without it): kubeadm v1.37.2 inits lab1 against etcd 3.6 (built
/// from source) with the images built from source, pulled through
/// containerd from the fixture registry; lab2 joins with a bootstrap token;
/// with flannel (vxlan, built from source) both nodes are Ready at v1.37.2, the static
/// pods run, a pod on lab1 reaches a pod on lab2, kube-proxy runs on both,
/// and CoreDNS answers for `kubernetes.default` through its service address. What the lab needs
/// besides the settings cluster.yaml types (`failCgroupV1: false`, the
/// `SystemVerification` check on cgroup v1): containerd's
/// `restrict_oom_score_adj`, because this machine's bounding set lacks
/// CAP_SYS_RESOURCE, so no sandbox may lower its OOM score.
#[test]
fn kubeadm_init_and_join_make_two_ready_nodes_whose_pods_reach_each_other() {
    let Some(lab) = Lab::up(2, 0) else { return };
    let f = &lab.desc.fixture.http;
    let gw = &lab.desc.gateway;
    let mut registries = String::new();
    for r in ["registry.k8s.io", "docker.io"] {
        registries.push_str(&format!(
            "mkdir -p /etc/containerd/certs.d/{r}; \
             printf 'server = \"http://{gw}:5000\"\\n[host.\"http://{gw}:5000/v2/{r}\"]\\n  capabilities = [\"pull\", \"resolve\"]\\n  override_path = true\\n' > /etc/containerd/certs.d/{r}/hosts.toml; "
        ));
    }
    let edits = format!(
        "{registries} sed -i -e 's|sandbox_image = .*|sandbox_image = \"registry.k8s.io/pause:3.10.2\"|' -e 's|config_path = .*|config_path = \"/etc/containerd/certs.d\"|' \
           -e 's|restrict_oom_score_adj = .*|restrict_oom_score_adj = true|' /etc/containerd/config.toml;"
    );
    let k8s = format!("{f}/dl.k8s.io/release/v1.37.2/bin/linux/amd64");
    let cni = format!("{f}/github.com/containernetworking/plugins/releases/download/v1.1.1/cni-plugins-linux-amd64-v1.1.1.tgz");
    let unit = std::fs::read_to_string(kubexm_e2e::repo_root().join("manifests/templates/kubelet.service")).unwrap();
    let dropin = std::fs::read_to_string(kubexm_e2e::repo_root().join("manifests/templates/kubelet-kubeadm.conf")).unwrap();
    for host in ["lab1", "lab2"] {
        containerd_with(&lab, host, &edits);
        lab.ssh_ok(
            host,
            &format!(
                "set -e; for b in kubelet kubeadm kubectl; do curl -sSf -o /usr/local/bin/$b {k8s}/$b; chmod 755 /usr/local/bin/$b; done; \
                 mkdir -p /opt/cni/bin /etc/cni/net.d; curl -sSf {cni} | tar -xz -C /opt/cni/bin; \
                 printf '%s' '{unit}' > /etc/systemd/system/kubelet.service; mkdir -p /etc/systemd/system/kubelet.service.d /etc/kubexm; \
                 printf '%s' '{dropin}' > /etc/systemd/system/kubelet.service.d/10-kubeadm.conf; systemctl daemon-reload; systemctl enable -q kubelet"
            ),
        );
    }
    let a1 = &lab.host("lab1").address;
    let etcd = format!("{f}/github.com/etcd-io/etcd/releases/download/v3.6.16/etcd-v3.6.16-linux-amd64.tar.gz");
    lab.ssh_ok(
        "lab1",
        &format!(
            "set -e; curl -sSf {etcd} | tar -xz -C /tmp; cp /tmp/etcd-v3.6.16-linux-amd64/etcd /usr/local/bin/; \
             systemd-run -q --unit=lab-etcd /usr/local/bin/etcd --data-dir /var/lib/lab-etcd \
               --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379; \
             printf '%s' '{}' > /etc/kubexm/init.yaml",
            INIT_CONFIG.replace("ADDRESS", a1)
        ),
    );
    let start = std::time::Instant::now();
    let init = lab.ssh("lab1", "kubeadm init --config /etc/kubexm/init.yaml 2>&1 | tail -30");
    let init_took = start.elapsed();
    let log = String::from_utf8_lossy(&init.stdout).into_owned();
    assert!(log.contains("Your Kubernetes control-plane has initialized successfully"), "{log}");
    let join = lab.ssh_ok("lab1", "kubeadm token create --print-join-command");
    let joined = lab.ssh(
        "lab2",
        &format!("{} --ignore-preflight-errors=SystemVerification 2>&1 | tail -5", join.trim()),
    );
    let joined = String::from_utf8_lossy(&joined.stdout).into_owned();
    assert!(joined.contains("to see this node join the cluster"), "{joined}");
    eprintln!("kubeadm init took {init_took:?}; init and join {:?}", start.elapsed());
    let kubectl = "KUBECONFIG=/etc/kubernetes/admin.conf kubectl";
    for (host, own) in [("lab1", "198.19.0.0/24"), ("lab2", "198.19.1.0/24")] {
        let cidr = lab.ssh_ok("lab1", &format!("{kubectl} get node {host} -o jsonpath='{{.spec.podCIDR}}'"));
        assert_eq!(cidr.trim(), own, "{host}'s pod CIDR");
    }
    // The pod network: flannel (vxlan) from its manifest, its images built
    // from source; its install-cni containers write the CNI config and plugin.
    lab.ssh_ok(
        "lab1",
        &format!(
            "set -e; curl -sSf {f}/github.com/flannel-io/flannel/releases/download/v0.28.10/kube-flannel.yml \
               | sed 's|10.244.0.0/16|198.19.0.0/16|' > /tmp/kube-flannel.yml; {kubectl} apply -f /tmp/kube-flannel.yml >/dev/null"
        ),
    );
    let flannel = lab.ssh(
        "lab1",
        &format!("{kubectl} -n kube-flannel rollout status ds/kube-flannel-ds --timeout=180s"),
    );
    if !flannel.status.success() {
        let diag = lab.ssh(
            "lab1",
            &format!(
                "{kubectl} -n kube-flannel get pods -o wide; {kubectl} -n kube-flannel logs ds/kube-flannel-ds --all-containers --tail=30"
            ),
        );
        panic!(
            "flannel did not become available: {}{}",
            String::from_utf8_lossy(&diag.stdout),
            String::from_utf8_lossy(&diag.stderr)
        );
    }
    let mut out = String::new();
    for _ in 0..60 {
        out = lab.ssh_ok(
            "lab1",
            &format!(
                "{kubectl} get nodes -o jsonpath='{{range .items[*]}}{{.metadata.name}} {{.status.nodeInfo.kubeletVersion}} {{.status.conditions[?(@.type==\"Ready\")].status}}{{\"\\n\"}}{{end}}'"
            ),
        );
        if out.matches(" True").count() == 2 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
    assert_eq!(out.lines().collect::<Vec<_>>(), ["lab1 v1.37.2 True", "lab2 v1.37.2 True"], "{out}");
    let statics = lab.ssh_ok(
        "lab1",
        &format!("{kubectl} -n kube-system get pods -o jsonpath='{{range .items[*]}}{{.metadata.name}} {{.status.phase}}{{\"\\n\"}}{{end}}' | grep lab1 | sort"),
    );
    assert_eq!(
        statics.lines().collect::<Vec<_>>(),
        [
            "kube-apiserver-lab1 Running",
            "kube-controller-manager-lab1 Running",
            "kube-scheduler-lab1 Running"
        ],
        "{statics}"
    );
    // A pod on each node; the one on lab1 reaches the one on lab2.
    for n in ["lab1", "lab2"] {
        lab.ssh_ok(
            "lab1",
            &format!(
                "{kubectl} run p-{n} --image=docker.io/library/nginx:1.27-lab --restart=Never \
                 --overrides='{{\"spec\":{{\"nodeName\":\"{n}\"}}}}' --command -- /bin/busybox sleep 3600 >/dev/null"
            ),
        );
    }
    let ready = lab.ssh(
        "lab1",
        &format!("{kubectl} wait --for=condition=Ready pod/p-lab1 pod/p-lab2 --timeout=120s"),
    );
    assert!(ready.status.success(), "{}", String::from_utf8_lossy(&ready.stderr));
    let ping = lab.ssh_ok(
        "lab1",
        &format!(
            "ip=$({kubectl} get pod p-lab2 -o jsonpath='{{.status.podIP}}'); {kubectl} exec p-lab1 -- /bin/busybox ping -c 2 -W 2 $ip | grep -c 'bytes from'"
        ),
    );
    assert_eq!(ping.trim(), "2", "pod on lab1 -> pod on lab2");
    // kube-proxy (its image built from source, with Debian's iptables) runs on
    // both nodes, so CoreDNS reaches the API server and answers through its
    // service address.
    let proxy = lab.ssh(
        "lab1",
        &format!(
            "{kubectl} -n kube-system rollout status ds/kube-proxy --timeout=120s && \
             {kubectl} -n kube-system wait --for=condition=Available deploy/coredns --timeout=180s"
        ),
    );
    assert!(
        proxy.status.success(),
        "{}{}",
        String::from_utf8_lossy(&proxy.stdout),
        String::from_utf8_lossy(&proxy.stderr)
    );
    // kube-proxy programs the service rules a moment after it reports ready.
    let mut dns = String::new();
    for _ in 0..30 {
        dns = String::from_utf8_lossy(
            &lab.ssh(
                "lab1",
                &format!(
                    "{kubectl} exec p-lab2 -- /bin/busybox nslookup kubernetes.default.svc.cluster.local 198.18.128.10 2>&1 | sed -n 's/^Address: *//p'"
                ),
            )
            .stdout,
        )
        .into_owned();
        if dns.lines().any(|l| l.trim() == "198.18.128.1") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
    if !dns.lines().any(|l| l.trim() == "198.18.128.1") {
        let diag = lab.ssh(
            "lab1",
            &format!(
                "{kubectl} -n kube-system get pods -o wide; {kubectl} -n kube-system logs deploy/coredns --tail=20; \
                 {kubectl} -n kube-system logs ds/kube-proxy --tail=30; {kubectl} get endpointslices -A; \
                 iptables-save | grep -c KUBE; iptables-save | grep 198.18.128.10; \
                 {kubectl} exec p-lab2 -- /bin/busybox nslookup kubernetes.default.svc.cluster.local 198.18.128.10 2>&1"
            ),
        );
        panic!(
            "no answer from CoreDNS through 198.18.128.10: {dns}\n{}{}",
            String::from_utf8_lossy(&diag.stdout),
            String::from_utf8_lossy(&diag.stderr)
        );
    }
}
