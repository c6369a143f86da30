//! `kubexm-install --bundle -f cluster.yaml`: the whole install on four lab
//! hosts (three control-plane nodes, etcd on lab1, lab2 and the arm64 lab4,
//! lab4 a worker behind its local API proxy, endpoint mode D) from the signed
//! lab bundle; a failure between etcd and the control plane; a re-run that
//! changes nothing; reset and a new install. Mode A (haproxy + keepalived,
//! VIP failover) has its own test.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use kubexm_e2e::{Lab, bin, lab_bundle, ok, signed_bundle, text};
use serde_json::Value;

fn install_with(lab: &Lab, config: &Path, bundle: &Path, pubkey: &Path, dir: &Path, phases: Option<&str>) -> Output {
    kubexm_e2e::install_command(lab, config, bundle, pubkey, dir, phases)
        .output()
        .unwrap()
}

fn install(lab: &Lab, dir: &Path, phases: Option<&str>) -> Output {
    let b = lab_bundle(lab);
    install_with(lab, &lab.desc.cluster, &b.bundle, &b.public_key, dir, phases)
}

const CTL: &str = "ETCDCTL_API=3 etcdctl --cacert=/etc/kubexm/etcd/pki/ca.crt \
    --cert=/etc/kubexm/etcd/pki/client.crt --key=/etc/kubexm/etcd/pki/client.key";

/// The published field lists of the kubeadm config API (tests/fixtures/kubeadm-api).
fn field_lists(api: &str) -> Value {
    let path = format!("{}/fixtures/kubeadm-api/{api}.yaml", env!("CARGO_MANIFEST_DIR"));
    serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// Every key of every document in `config` is a published field of its kind,
/// and the required ones are there. Returns the documents by kind.
fn check_against_api(config: &str, lists: &Value) -> BTreeMap<String, Value> {
    fn walk(v: &Value, path: &str, fields: &serde_json::Map<String, Value>, kind: &str, errors: &mut Vec<String>) {
        let Some(allowed) = fields.get(if path.is_empty() { "." } else { path }) else {
            return;
        };
        let allowed: Vec<&str> = allowed.as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        let Some(obj) = v.as_object() else { return };
        for (k, child) in obj {
            if !allowed.contains(&k.as_str()) {
                errors.push(format!(
                    "{kind}: `{}` is not a field of the published API",
                    if path.is_empty() { k.clone() } else { format!("{path}.{k}") }
                ));
            }
            let sub = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
            match child {
                Value::Array(items) => {
                    for it in items {
                        walk(it, &format!("{sub}[]"), fields, kind, errors);
                    }
                }
                Value::Object(_) => walk(child, &sub, fields, kind, errors),
                _ => {}
            }
        }
    }
    let docs: Vec<Value> = serde_saphyr::from_multiple(config).unwrap();
    let mut errors = Vec::new();
    let mut by_kind = BTreeMap::new();
    for d in docs.into_iter().filter(|d| !d.is_null()) {
        let kind = format!("{}/{}", d["apiVersion"].as_str().unwrap(), d["kind"].as_str().unwrap());
        let Some(spec) = lists["kinds"].get(&kind) else {
            errors.push(format!("{kind}: not a kind of the published API"));
            continue;
        };
        walk(&d, "", spec["fields"].as_object().unwrap(), &kind, &mut errors);
        if let Some(req) = spec.get("required").and_then(|r| r.as_object()) {
            for (path, keys) in req {
                let node = if path == "." {
                    Some(&d)
                } else {
                    path.trim_end_matches("[]").split('.').try_fold(&d, |v, k| v.get(k))
                };
                let nodes: Vec<&Value> = match node {
                    Some(Value::Array(a)) => a.iter().collect(),
                    Some(v) => vec![v],
                    None => vec![],
                };
                for n in nodes {
                    for k in keys.as_array().unwrap() {
                        if n.get(k.as_str().unwrap()).is_none() {
                            errors.push(format!("{kind}: required `{path}.{}` is missing", k.as_str().unwrap()));
                        }
                    }
                }
            }
        }
        by_kind.insert(d["kind"].as_str().unwrap().to_string(), d);
    }
    assert!(
        errors.is_empty(),
        "config not valid for the published kubeadm API:\n{}\n---\n{config}",
        errors.join("\n")
    );
    by_kind
}

/// The kubeadm stand-in's calls on a host since the last `reset`: (time, args, config).
fn kubeadm_calls(lab: &Lab, host: &str) -> Vec<(f64, Vec<String>, String)> {
    let out = lab.ssh_ok(
        host,
        "cd /var/lib/kubexm-lab/kubeadm 2>/dev/null || exit 0; for f in call-*.args; do \
         echo \"@@ $(stat -c %.9Y $f)\"; cat $f; c=${f%.args}.config.yaml; [ -f $c ] && { echo '@@config'; cat $c; }; done",
    );
    let mut calls: Vec<(f64, Vec<String>, String)> = Vec::new();
    let mut in_config = false;
    for line in out.lines() {
        if let Some(t) = line.strip_prefix("@@ ") {
            calls.push((t.trim().parse().unwrap(), Vec::new(), String::new()));
            in_config = false;
        } else if line == "@@config" {
            in_config = true;
        } else if let Some(c) = calls.last_mut() {
            if in_config {
                c.2.push_str(line);
                c.2.push('\n');
            } else {
                c.1.push(line.to_string());
            }
        }
    }
    calls.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    match calls.iter().rposition(|c| c.1.first().map(String::as_str) == Some("reset")) {
        Some(i) => calls.split_off(i + 1),
        None => calls,
    }
}

#[test]
fn whole_install_on_four_hosts_one_arm64_a_failure_a_rerun_and_reset() {
    let Some(lab) = Lab::up(4, 1) else { return };
    let dir = tempfile::tempdir().unwrap();
    let addr = |h: &str| lab.host(h).address.clone();
    let members = ["lab1", "lab2", "lab4"];

    // Failure: etcd stops on lab2 after the etcd phase, before the control plane.
    let infra = Some("preflight,os-packages,registry,etcd,loadbalancer,containerd");
    ok(install(&lab, dir.path(), infra), "install up to containerd");
    lab.ssh_ok("lab2", "systemctl stop kubexm-etcd");
    let failed = install(&lab, dir.path(), Some("control-plane,workers,cni,addons,kubeconfig"));
    assert!(!failed.status.success());
    let err = text(&failed.stderr);
    assert!(err.contains("lab2: control-plane/etcd-ready-lab2/etcd-ready@lab2"), "{err}");
    assert!(err.contains("etcd member lab2 does not answer"), "{err}");
    // kubeadm never ran.
    assert!(kubeadm_calls(&lab, "lab1").is_empty());

    // A re-run of everything completes (the etcd phase starts lab2's member again).
    let first = ok(install(&lab, dir.path(), None), "install after the failure");
    assert!(
        first.contains("installed phases preflight, os-packages, registry, etcd, loadbalancer, containerd, control-plane, workers, cni, addons, kubeconfig on 4 hosts"),
        "{first}"
    );
    assert!(first.contains("kubeconfig: "), "{first}");

    // etcd: three members, healthy over TLS with our certificates, from every host.
    let endpoints: Vec<String> = members.iter().map(|m| format!("https://{}:2379", addr(m))).collect();
    let all = format!("{CTL} --endpoints={}", endpoints.join(","));
    for m in members {
        let health = lab.ssh_ok(m, &format!("{all} endpoint health 2>&1"));
        assert_eq!(health.matches("is healthy").count(), 3, "{m}: {health}");
        let list = lab.ssh_ok(m, &format!("{all} member list"));
        assert_eq!(list.matches(", started, ").count(), 3, "{list}");
    }
    lab.ssh_ok(
        "lab1",
        &format!("{CTL} --endpoints={} put kubexm-key written-on-lab1", endpoints[0]),
    );
    let got = lab.ssh_ok(
        "lab4",
        &format!("{CTL} --endpoints={} get kubexm-key --print-value-only", endpoints[2]),
    );
    assert_eq!(got.trim(), "written-on-lab1");
    let anon = lab.ssh(
        "lab2",
        &format!(
            "ETCDCTL_API=3 etcdctl --cacert=/etc/kubexm/etcd/pki/ca.crt --endpoints={} --dial-timeout=3s get x",
            endpoints[1]
        ),
    );
    assert!(!anon.status.success(), "etcd answered without a client certificate");

    // The arm64 host got arm64 binaries (ELF e_machine 183 = AArch64), the others x86-64 (62).
    let machine = |h: &str, files: &str| {
        lab.ssh_ok(h, &format!("for f in {files}; do od -An -tu2 -j18 -N2 $f; done | tr -s ' \\n' ' '"))
            .trim()
            .to_string()
    };
    let bins = "/usr/local/bin/etcd /usr/local/bin/containerd /usr/local/sbin/runc";
    assert_eq!(machine("lab4", bins), "183 183 183");
    assert_eq!(machine("lab1", bins), "62 62 62");

    // containerd on every node pulls through hosts.toml from our registry, TLS checked against our CA.
    let pull = "ctr -n k8s.io images pull --hosts-dir /etc/containerd/certs.d";
    let registry = format!("{}:5000", addr("lab1"));
    for h in &lab.desc.hosts {
        assert_eq!(
            lab.ssh_ok(&h.name, "systemctl is-active containerd kubelet").trim(),
            "active\nactive",
            "{}",
            h.name
        );
        for image in ["registry.k8s.io/pause:3.10", "registry.k8s.io/coredns/coredns:v1.12.0"] {
            lab.ssh_ok(&h.name, &format!("{pull} {image}"));
        }
        if h.arch == "amd64" {
            let out = lab.ssh_ok(
                &h.name,
                "ctr -n k8s.io run --rm registry.k8s.io/coredns/coredns:v1.12.0 kx-run /bin/busybox echo ran-in-a-container",
            );
            assert!(out.contains("ran-in-a-container"), "{}: {out}", h.name);
        }
    }
    let untrusted = lab.ssh(
        "lab2",
        "mkdir -p /tmp/noca/registry.k8s.io && grep -v '^  ca = ' /etc/containerd/certs.d/registry.k8s.io/hosts.toml > /tmp/noca/registry.k8s.io/hosts.toml \
         && ctr -n kx-noca images pull --hosts-dir /tmp/noca registry.k8s.io/pause:3.10",
    );
    assert!(!untrusted.status.success(), "pulled without trusting our CA");
    let arch = lab.ssh_ok(
        "lab4",
        "ctr -n k8s.io images export --platform linux/arm64 /tmp/p.tar registry.k8s.io/pause:3.10 && tar -xOf /tmp/p.tar index.json >/dev/null && echo exported-arm64",
    );
    assert!(arch.contains("exported-arm64"), "{arch}");

    // Mode D: lab4 (a worker only) reaches the API servers through its local
    // proxy; the endpoint name is 127.0.0.1 there and each control-plane node's
    // own address on it. Lab stand-in listeners on :6443 play the API servers.
    assert!(lab.ssh_ok("lab4", "getent hosts lb.kubexm.local").starts_with("127.0.0.1"));
    assert!(lab.ssh_ok("lab2", "getent hosts lb.kubexm.local").starts_with(&addr("lab2")));
    for cp in ["lab1", "lab2", "lab3"] {
        lab.ssh_ok(
            cp,
            &format!(
                "systemd-run -q --unit kx-standin-apiserver socat TCP-LISTEN:6443,fork,reuseaddr SYSTEM:'echo apiserver-stand-in-on-{cp}'"
            ),
        );
    }
    // haproxy marks a backend up after two good checks, 3 s apart.
    let seen = lab.ssh_ok(
        "lab4",
        "for t in $(seq 10); do s=$(for i in $(seq 12); do timeout 3 bash -c 'exec 3<>/dev/tcp/127.0.0.1/6443; head -1 <&3'; done | sort -u); \
         [ $(echo \"$s\" | grep -c stand-in) = 3 ] && break; sleep 2; done; echo \"$s\"",
    );
    for cp in ["lab1", "lab2", "lab3"] {
        assert!(
            seen.contains(&format!("apiserver-stand-in-on-{cp}")),
            "local proxy did not reach {cp}: {seen}"
        );
        lab.ssh_ok(cp, "systemctl stop kx-standin-apiserver");
    }

    // kubeadm (the lab stand-in) ran init on lab1, then lab2 and lab3 joined
    // as control-plane nodes one after the other, then lab4 as a worker; each
    // config is valid for kubeadm.k8s.io/v1beta4 (Kubernetes v1.33).
    let lists = field_lists("v1beta4");
    let init = kubeadm_calls(&lab, "lab1");
    assert_eq!(init.len(), 1, "{init:?}");
    assert_eq!(init[0].1[..2], ["init".to_string(), "--upload-certs".into()]);
    let init_docs = check_against_api(&init[0].2, &lists);
    let cc = &init_docs["ClusterConfiguration"];
    assert_eq!(cc["controlPlaneEndpoint"], "lb.kubexm.local:6443");
    let ext: Vec<&str> = cc["etcd"]["external"]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert_eq!(ext, endpoints.iter().map(String::as_str).collect::<Vec<_>>());
    let token = init_docs["InitConfiguration"]["bootstrapTokens"][0]["token"]
        .as_str()
        .unwrap()
        .to_string();
    let key = init_docs["InitConfiguration"]["certificateKey"].as_str().unwrap().to_string();
    // The discovery pin is the sha256 of the CA's public key, computed here by openssl.
    let pin = lab.ssh_ok(
        "lab1",
        "openssl x509 -pubkey -noout -in /etc/kubernetes/pki/ca.crt | openssl pkey -pubin -outform der | sha256sum | cut -d' ' -f1",
    );
    let mut order = vec![("lab1", init[0].0)];
    for (h, cp) in [("lab2", true), ("lab3", true), ("lab4", false)] {
        let calls = kubeadm_calls(&lab, h);
        assert_eq!(calls.len(), 1, "{h}: {calls:?}");
        assert_eq!(calls[0].1[0], "join", "{h}");
        let docs = check_against_api(&calls[0].2, &lists);
        let j = &docs["JoinConfiguration"];
        assert_eq!(j["discovery"]["bootstrapToken"]["token"], token.as_str(), "{h}");
        assert_eq!(
            j["discovery"]["bootstrapToken"]["caCertHashes"][0],
            format!("sha256:{}", pin.trim()).as_str()
        );
        assert_eq!(
            j["controlPlane"].get("certificateKey").and_then(Value::as_str),
            cp.then_some(key.as_str()),
            "{h}"
        );
        order.push((h, calls[0].0));
    }
    assert!(order.windows(2).all(|w| w[0].1 < w[1].1), "kubeadm calls out of order: {order:?}");
    // No secret stays on the hosts or in the installer's state.
    for h in &lab.desc.hosts {
        lab.ssh_ok(
            &h.name,
            "! ls /etc/kubexm/kubeadm/*.yaml 2>/dev/null && ! ls /var/lib/kubexm/files 2>/dev/null",
        );
    }
    let state = std::fs::read(dir.path().join("state.db")).unwrap();
    assert!(
        !String::from_utf8_lossy(&state).contains(&token),
        "the bootstrap token is in the state database"
    );

    // The CNI and addons went to the kubectl stand-in with every image on our registry.
    let applied = lab.ssh_ok("lab1", "ls /var/lib/kubexm-lab/kubectl/applied/");
    for part in [
        "calico",
        "nodelocaldns",
        "metallb-native",
        "address-pools",
        "openebs-operator-lite",
        "openebs-lite-sc",
    ] {
        assert!(applied.contains(part), "{part} not applied: {applied}");
    }
    let images = lab.ssh_ok(
        "lab1",
        "grep -h 'image:' /var/lib/kubexm-lab/kubectl/applied/* | sed 's/.*image: *//; s/\"//g' | sort -u",
    );
    assert!(images.lines().count() >= 7, "{images}");
    for i in images.lines() {
        assert!(i.starts_with(&format!("{registry}/")), "image not rewritten to the registry: {i}");
    }
    // A rewritten reference is pulled as written, on the arm64 node too.
    let one = images.lines().find(|l| l.contains("calico/node")).unwrap();
    lab.ssh_ok("lab4", &format!("{pull} {one}"));
    let nodelocal = lab.ssh_ok("lab1", "cat /var/lib/kubexm-lab/kubectl/applied/*nodelocaldns*");
    assert!(!nodelocal.contains("__PILLAR__"), "{nodelocal}");
    // Settings patched into the upstream manifests (manifests/addon-patches.yaml).
    let calico = lab.ssh_ok("lab1", "cat /var/lib/kubexm-lab/kubectl/applied/*calico*");
    assert!(
        calico.contains("            - name: CALICO_IPV4POOL_CIDR\n              value: \"")
            && !calico.contains("# - name: CALICO_IPV4POOL_CIDR"),
        "{calico}"
    );

    // The admin kubeconfig for the user.
    let kc = dir.path().join("root/lab.kubeconfig");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&kc).unwrap().permissions().mode() & 0o777, 0o600);

    // A re-run changes nothing: every step is skipped.
    let again = ok(install(&lab, dir.path(), None), "install again");
    assert!(again.contains(": 0 steps applied"), "{again}");

    // reset undoes it on every host; a new install works.
    let reset = |yes: bool| {
        let mut c = Command::new(bin("kubexm-install"));
        c.arg("reset")
            .arg("-f")
            .arg(&lab.desc.cluster)
            .arg("--root")
            .arg(dir.path().join("root"))
            .arg("--state")
            .arg(dir.path().join("state.db"));
        if yes {
            c.arg("--yes");
        }
        c.output().unwrap()
    };
    let refused = reset(false);
    assert_eq!(
        refused.status.code(),
        Some(2),
        "reset without --yes must refuse: {}",
        text(&refused.stderr)
    );
    lab.ssh_ok("lab1", "test -e /etc/kubexm");
    ok(reset(true), "reset --yes");
    for h in &lab.desc.hosts {
        lab.ssh_ok(
            &h.name,
            "! test -e /etc/kubexm && ! test -e /etc/kubernetes && ! test -e /usr/local/bin/kubelet && ! systemctl is-active -q containerd kubexm-etcd && ! grep -q kubexm /etc/hosts",
        );
    }
    assert!(!kc.exists());
    let fresh = ok(install(&lab, dir.path(), None), "install after reset");
    assert!(!fresh.contains(": 0 steps applied"), "{fresh}");
    let health = lab.ssh_ok("lab1", &format!("{all} endpoint health 2>&1"));
    assert_eq!(health.matches("is healthy").count(), 3, "{health}");
    assert_eq!(kubeadm_calls(&lab, "lab1").len(), 1);
}

#[test]
fn mode_a_haproxy_and_keepalived_hold_a_vip_that_fails_over() {
    let Some(lab) = Lab::up(4, 0) else { return };
    let dir = tempfile::tempdir().unwrap();
    let net = lab.host("lab1").address.rsplit_once('.').unwrap().0.to_string();
    let vip = format!("{net}.250");
    // lab1 and lab2 are the control plane; lab3 and lab4 hold the VIP.
    let mut cfg = std::fs::read_to_string(&lab.desc.cluster).unwrap();
    let start = cfg.find("  roleGroups:").unwrap();
    let end = cfg.find("  kubernetes:").unwrap();
    cfg.replace_range(
        start..end,
        &format!(
            "  roleGroups:\n    etcd: [lab1]\n    control-plane: [lab1, lab2]\n    worker: [lab1, lab2]\n    loadbalancer: [lab3, lab4]\n  controlPlaneEndpoint: {{mode: haproxy-keepalived, address: {vip}}}\n"
        ),
    );
    let config = dir.path().join("mode-a.yaml");
    std::fs::write(&config, &cfg).unwrap();
    // A bundle for this config: its OS repositories carry haproxy and keepalived.
    let b = signed_bundle(&lab, &config);
    let phases = Some("preflight,os-packages,loadbalancer");
    let out = ok(
        install_with(&lab, &config, &b.bundle, &b.public_key, dir.path(), phases),
        "install mode A",
    );
    assert!(out.contains("installed phases preflight, os-packages, loadbalancer"), "{out}");

    for cp in ["lab1", "lab2"] {
        lab.ssh_ok(
            cp,
            &format!(
                "systemd-run -q --unit kx-standin-apiserver socat TCP-LISTEN:6443,fork,reuseaddr SYSTEM:'echo apiserver-stand-in-on-{cp}'"
            ),
        );
    }
    let holder = || -> String {
        for _ in 0..30 {
            for lb in ["lab3", "lab4"] {
                if lab.ssh_ok(lb, "ip -o -4 addr show").contains(&format!(" {vip}/")) {
                    return lb.to_string();
                }
            }
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
        panic!("no loadbalancer holds the VIP {vip}");
    };
    let ask = |from: &str| {
        lab.ssh_ok(
            from,
            &format!("for i in $(seq 8); do timeout 3 bash -c 'exec 3<>/dev/tcp/{vip}/6443; head -1 <&3'; done | sort -u"),
        )
    };
    let first = holder();
    assert!(lab.ssh_ok("lab1", "getent hosts lb.kubexm.local").starts_with(&vip));
    // haproxy marks a backend up after two good checks, 3 s apart.
    let mut seen = String::new();
    for _ in 0..10 {
        seen = ask("lab1");
        if seen.contains("apiserver-stand-in-on-lab1") && seen.contains("apiserver-stand-in-on-lab2") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
    assert!(
        seen.contains("apiserver-stand-in-on-lab1") && seen.contains("apiserver-stand-in-on-lab2"),
        "the VIP did not forward to both control-plane nodes: {seen}"
    );
    // keepalived stops on the holder: the VIP moves and the endpoint keeps answering.
    lab.ssh_ok(&first, "systemctl stop keepalived");
    std::thread::sleep(std::time::Duration::from_secs(4));
    let second = holder();
    assert_ne!(first, second, "the VIP did not move");
    let seen = ask("lab2");
    assert!(
        seen.contains("apiserver-stand-in-on-"),
        "the endpoint stopped answering after failover: {seen}"
    );
    let conf = lab.ssh_ok(&second, "cat /etc/keepalived/keepalived.conf");
    assert!(conf.contains("unicast_peer") && conf.contains(&vip), "{conf}");
    for cp in ["lab1", "lab2"] {
        lab.ssh_ok(cp, "systemctl stop kx-standin-apiserver");
    }
}

/// "not supported yet" found while planning (here `registry.mode: external`,
/// refused by the containerd phase) is exit 8 with the reason, not exit 1
/// calling it a bug in kubexm.
#[test]
fn not_supported_yet_raised_while_planning_exits_8_not_as_a_bug() {
    let Some(lab) = Lab::up(1, 0) else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut yaml = std::fs::read_to_string(&lab.desc.cluster).unwrap();
    yaml.push_str("  registry: {mode: external, address: \"harbor.example.internal\"}\n");
    let config = dir.path().join("external.yaml");
    std::fs::write(&config, yaml).unwrap();
    let b = signed_bundle(&lab, &config);
    let out = kubexm_e2e::install_command(&lab, &config, &b.bundle, &b.public_key, dir.path(), None)
        .arg("--dry-run")
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(8), "{err}");
    assert!(err.contains("registry.mode external") && err.contains("not supported yet"), "{err}");
    assert!(!err.contains("bug in kubexm"), "{err}");
}

/// Every entry under `dir`: path, mode, size, mtime and content digest.
fn snapshot(dir: &Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let digest = if m.is_file() {
                kubexm_bundle::digest::sha256_hex(&std::fs::read(&p).unwrap())
            } else {
                String::new()
            };
            out.push(format!(
                "{} {:o} {} {}.{} {digest}",
                p.strip_prefix(dir).unwrap().display(),
                m.mode(),
                m.size(),
                m.mtime(),
                m.mtime_nsec()
            ));
            if m.is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

/// `--dry-run` verifies the bundle and prints the plan, writing nothing
/// anywhere: an empty and a populated `--root` stay byte-identical.
#[test]
fn dry_run_planning_has_side_effects() {
    let Some(lab) = Lab::up(1, 0) else { return };
    let dir = tempfile::tempdir().unwrap();
    let b = lab_bundle(&lab);
    let (empty, populated) = (dir.path().join("empty"), dir.path().join("populated"));
    std::fs::create_dir_all(empty.join("root")).unwrap();
    ok(
        kubexm_e2e::unpack_command(&b.bundle, &b.public_key, &populated.join("root"))
            .output()
            .unwrap(),
        "unpack into the populated root",
    );
    for d in [&empty, &populated] {
        let before = snapshot(d);
        let out = ok(
            kubexm_e2e::install_command(&lab, &lab.desc.cluster, &b.bundle, &b.public_key, d, None)
                .arg("--dry-run")
                .output()
                .unwrap(),
            "install --dry-run",
        );
        assert!(out.contains("etcd") && out.contains("kubeadm-init"), "{out}");
        assert_eq!(snapshot(d), before, "--dry-run wrote under {}", d.display());
    }
}
