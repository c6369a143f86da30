//! `kubexm-install --bundle -f cluster.yaml`: the phases this release
//! implements (preflight, os-packages, registry, etcd in binary mode,
//! containerd) on three lab
//! hosts, one of them arm64, from the signed lab bundle.

use std::path::Path;
use std::process::{Command, Output};

use kubexm_e2e::{Lab, bin, lab_bundle, ok, text};

fn install(lab: &Lab, dir: &Path, phases: Option<&str>) -> Output {
    let b = lab_bundle(lab);
    let mut c = Command::new(bin("kubexm-install"));
    c.arg("-f")
        .arg(&lab.desc.cluster)
        .arg("--catalog")
        .arg(&lab.desc.fixture.catalog)
        .arg("--bundle")
        .arg(&b.bundle)
        .arg("--pubkey")
        .arg(&b.public_key)
        .arg("--root")
        .arg(dir.join("root"))
        .arg("--state")
        .arg(dir.join("state.db"))
        .args(["--advertise", &lab.desc.gateway, "--serve-port"])
        .arg(kubexm_e2e::free_port(&lab.desc.gateway).to_string());
    if let Some(p) = phases {
        c.args(["--phases", p]);
    }
    c.output().unwrap()
}

const CTL: &str = "ETCDCTL_API=3 etcdctl --cacert=/etc/kubexm/etcd/pki/ca.crt \
    --cert=/etc/kubexm/etcd/pki/client.crt --key=/etc/kubexm/etcd/pki/client.key";

#[test]
fn registry_etcd_and_containerd_on_three_hosts_one_arm64_and_a_rerun_changes_nothing() {
    let Some(lab) = Lab::up(3, 1) else { return };
    let dir = tempfile::tempdir().unwrap();

    // Every phase by default: the ones not built yet are refused before anything is touched.
    let all = install(&lab, dir.path(), None);
    assert_eq!(all.status.code(), Some(8), "{}", text(&all.stderr));
    assert!(text(&all.stderr).contains("not supported yet"), "{}", text(&all.stderr));
    lab.ssh_ok("lab1", "test ! -e /etc/kubexm");

    let phases = Some("preflight,os-packages,registry,etcd,containerd");
    let first = ok(install(&lab, dir.path(), phases), "install preflight..containerd");
    assert!(
        first.contains("installed phases preflight, os-packages, registry, etcd, containerd on 3 hosts"),
        "{first}"
    );

    let endpoints: Vec<String> = lab.desc.hosts.iter().map(|h| format!("https://{}:2379", h.address)).collect();
    let all = format!("{CTL} --endpoints={}", endpoints.join(","));
    for h in &lab.desc.hosts {
        let health = lab.ssh_ok(&h.name, &format!("{all} endpoint health 2>&1"));
        assert_eq!(health.matches("is healthy").count(), 3, "{}: {health}", h.name);
        let members = lab.ssh_ok(&h.name, &format!("{all} member list"));
        assert_eq!(members.matches(", started, ").count(), 3, "{members}");
        // The packages of the host's roles came from the bundle.
        lab.ssh_ok(&h.name, "command -v conntrack && command -v socat");
    }
    // A write on one member reads back on another, over TLS with our certificates.
    lab.ssh_ok(
        "lab1",
        &format!("{CTL} --endpoints={} put kubexm-key written-on-lab1", endpoints[0]),
    );
    let got = lab.ssh_ok(
        "lab3",
        &format!("{CTL} --endpoints={} get kubexm-key --print-value-only", endpoints[2]),
    );
    assert_eq!(got.trim(), "written-on-lab1");
    // Without a client certificate the member refuses.
    let anon = lab.ssh(
        "lab2",
        &format!(
            "ETCDCTL_API=3 etcdctl --cacert=/etc/kubexm/etcd/pki/ca.crt --endpoints={} --dial-timeout=3s get x",
            endpoints[1]
        ),
    );
    assert!(!anon.status.success(), "etcd answered without a client certificate");
    // The arm64 host got arm64 binaries (ELF e_machine 183 = AArch64), amd64 ones x86-64 (62).
    let machine = |h: &str| {
        lab.ssh_ok(
            h,
            "for f in /usr/local/bin/etcd /usr/local/bin/etcdctl; do od -An -tu2 -j18 -N2 $f; done | tr -s ' \\n' ' '",
        )
    };
    assert_eq!(machine("lab3").trim(), "183 183");
    assert_eq!(machine("lab1").trim(), "62 62");

    // The registry runs as a service on the first control-plane node, and
    // containerd on every node pulls through hosts.toml from it, TLS checked
    // against our CA.
    let reg = lab.ssh(
        "lab1",
        "systemctl is-active kubexm-registry; journalctl -u kubexm-registry --no-pager | tail -20",
    );
    assert!(text(&reg.stdout).starts_with("active"), "{}", text(&reg.stdout));
    let pull = "ctr -n k8s.io images pull --hosts-dir /etc/containerd/certs.d";
    for h in &lab.desc.hosts {
        assert_eq!(lab.ssh_ok(&h.name, "systemctl is-active containerd").trim(), "active", "{}", h.name);
        for image in ["registry.k8s.io/pause:3.10", "registry.k8s.io/coredns/coredns:v1.12.0"] {
            lab.ssh_ok(&h.name, &format!("{pull} {image}"));
        }
        assert!(
            lab.ssh_ok(&h.name, "cat /etc/containerd/config.toml")
                .contains("config_path = \"/etc/containerd/certs.d\"")
        );
        if h.arch == "amd64" {
            let out = lab.ssh_ok(
                &h.name,
                "ctr -n k8s.io run --rm registry.k8s.io/coredns/coredns:v1.12.0 kx-run /bin/busybox echo ran-in-a-container",
            );
            assert!(out.contains("ran-in-a-container"), "{}: {out}", h.name);
        }
    }
    // Without the CA the registry's certificate is refused.
    let untrusted = lab.ssh(
        "lab2",
        "mkdir -p /tmp/noca/registry.k8s.io && grep -v '^  ca = ' /etc/containerd/certs.d/registry.k8s.io/hosts.toml > /tmp/noca/registry.k8s.io/hosts.toml \
         && ctr -n kx-noca images pull --hosts-dir /tmp/noca registry.k8s.io/pause:3.10",
    );
    assert!(!untrusted.status.success(), "pulled without trusting our CA");
    // The arm64 host pulled the arm64 variant, and runs arm64 containerd and runc.
    let arm = |f: &str| lab.ssh_ok("lab3", &format!("od -An -tu2 -j18 -N2 {f}")).trim().to_string();
    assert_eq!(arm("/usr/local/bin/containerd"), "183");
    assert_eq!(arm("/usr/local/sbin/runc"), "183");
    let arch = lab.ssh_ok(
        "lab3",
        "ctr -n k8s.io run --rm --platform linux/arm64 registry.k8s.io/pause:3.10 x true >/dev/null 2>&1; \
         ctr -n k8s.io images export --platform linux/arm64 /tmp/p.tar registry.k8s.io/pause:3.10 && echo exported-arm64",
    );
    assert!(arch.contains("exported-arm64"), "{arch}");

    // A re-run changes nothing.
    let again = ok(install(&lab, dir.path(), phases), "install again");
    assert!(again.contains(": 0 steps applied"), "{again}");

    // A member stopped behind the installer's back is started again by a re-run.
    lab.ssh_ok("lab2", "systemctl stop kubexm-etcd");
    let healed = ok(install(&lab, dir.path(), phases), "install after etcd stopped on lab2");
    assert!(!healed.contains(": 0 steps applied"), "{healed}");
    let health = lab.ssh_ok("lab2", &format!("{all} endpoint health 2>&1"));
    assert_eq!(health.matches("is healthy").count(), 3, "{health}");
}
