//! One node's share of an upgrade's hop (kubeadm): the hop's kubeadm and
//! `kubeadm upgrade apply` (the first control-plane node) or `kubeadm
//! upgrade node` (the others); cordon and drain (asked on the first
//! control-plane node, where the admin kubeconfig is); the node's new
//! kubelet and kubectl, and its containerd, runc and their config when the
//! hop changes them, each service restarted once its binary was replaced;
//! then Ready at the new version and uncordoned. Every step checks first,
//! so a run stopped anywhere continues where it stopped.

use std::sync::Arc;
use std::time::Duration;

use super::REDACT;
use crate::context::{Context, install_component};
use crate::engine::plan::Step;
use crate::engine::steps::Shell;
use crate::engine::transport::shell_quote as q;
use crate::paths::{LOG_DIR, STATIC_POD_MANIFESTS};
use crate::waits;

/// Stamps of the kubeadm upgrades done on a host, one file per version.
pub const UPGRADED: &str = "/var/lib/kubexm/upgraded";

/// The hop's kubeadm on `host`, then `kubeadm upgrade apply VERSION` (the
/// first control-plane node: the control plane's static pods, kube-proxy
/// and CoreDNS) or `kubeadm upgrade node` (the others: their static pods
/// and the kubelet's config), its output in a root-only log on the host.
pub fn kubeadm_steps(i: &Context, host: &str, first: bool) -> anyhow::Result<Vec<Arc<dyn Step>>> {
    let version = &i.cluster.spec.kubernetes.version;
    let mut steps = install_component(i.bundle_file(host, "kubeadm")?, i.bundle_dir, i.file_server);
    let stamp = format!("{UPGRADED}/kubeadm-{}", q(version));
    let cp = i.cluster.spec.role_groups.control_plane.iter().any(|h| h == host);
    let ignore = &i.cluster.spec.kubernetes.kubeadm.ignore_preflight_errors;
    let ignore = if ignore.is_empty() {
        String::new()
    } else {
        format!(" --ignore-preflight-errors={}", q(&ignore.join(",")))
    };
    let (name, command) = if first {
        (
            "kubeadm-upgrade-apply",
            format!("kubeadm upgrade apply {} --yes --etcd-upgrade=false{ignore}", q(version)),
        )
    } else {
        ("kubeadm-upgrade-node", format!("kubeadm upgrade node --etcd-upgrade=false{ignore}"))
    };
    // A control-plane node is done once its API server's manifest names
    // the new version too (the stamp alone could outlive a restore).
    let mut check = format!("test -f {stamp}");
    if cp {
        check.push_str(&format!(
            " && grep -q {} {STATIC_POD_MANIFESTS}/kube-apiserver.yaml",
            q(&format!("image: .*/kube-apiserver:{version}$"))
        ));
    }
    let log = format!("{LOG_DIR}/{name}.log");
    let mut step = Shell::new(
        name,
        Some(&check),
        &format!(
            "mkdir -p {LOG_DIR} {UPGRADED} && chmod 700 {LOG_DIR} && umask 077 && rm -f {log}\n\
             {{ {command} 2>&1 || echo \"kubexm-exit-code=$?\"; }} | {REDACT} > {log}\n\
             if rc=$(sed -n 's/^kubexm-exit-code=//p' {log}) && [ -n \"$rc\" ]; then\n  grep -v '^kubexm-exit-code=' {log} | tail -25 >&2; exit \"$rc\"\nfi\n\
             touch {stamp}; echo \"{name}: done (log {log})\""
        ),
    );
    step.timeout = Duration::from_secs(900);
    steps.push(Arc::new(step));
    Ok(steps)
}

/// `node` cordoned and drained (on the first control-plane node), unless it
/// already runs the hop's kubelet and takes pods. Evictions respect
/// PodDisruptionBudgets; after `timeout` the drain fails and the node stays
/// cordoned: the run stops there and names it.
pub fn drain(version: &str, node: &str, timeout: u32) -> Arc<dyn Step> {
    let k = waits::kubectl();
    let n = q(node);
    let mut step = Shell::new(
        "cordon-drain",
        Some(&format!(
            "[ \"$({k} get node {n} -o jsonpath='{{.status.nodeInfo.kubeletVersion}}/{{.spec.unschedulable}}')\" = {} ]",
            q(&format!("{version}/"))
        )),
        &format!(
            "{cordon} || exit 1; echo cordoned {n}\n\
             out=$({k} drain {n} --ignore-daemonsets --delete-emptydir-data --timeout={timeout}s 2>&1); rc=$?\n\
             printf '%s\\n' \"$out\" | tail -20\n\
             if [ \"$rc\" = 0 ]; then echo drained {n}; else \
             echo {n}\": not drained within {timeout} s (upgrade.drainTimeoutSeconds; a PodDisruptionBudget that allows no eviction, \
             or a pod no controller manages?); it stays cordoned; fix it and run the upgrade again: it continues here\" >&2; exit 1; fi",
            cordon = waits::retried(&format!("{k} cordon {n}"), 120)
        ),
    );
    step.timeout = Duration::from_secs(u64::from(timeout) + 120);
    Arc::new(step)
}

/// The node's new kubelet (and kubectl on a control-plane node), the
/// kubelet restarted once replaced.
pub fn kubelet_steps(i: &Context, host: &str) -> anyhow::Result<Vec<Arc<dyn Step>>> {
    let cp = i.cluster.spec.role_groups.control_plane.iter().any(|h| h == host);
    let mut steps = Vec::new();
    let components: &[&str] = if cp { &["kubelet", "kubectl"] } else { &["kubelet"] };
    for c in components {
        steps.extend(install_component(i.bundle_file(host, c)?, i.bundle_dir, i.file_server));
    }
    steps.push(restarted("kubelet"));
    Ok(steps)
}

/// A step restarting systemd unit `unit` when the program it runs was
/// replaced on disk (`/proc/PID/exe` reads `... (deleted)`).
pub fn restarted(unit: &str) -> Arc<dyn Step> {
    let u = q(unit);
    let mut step = Shell::new(
        &format!("{unit}-restarted"),
        Some(&format!(
            "pid=$(systemctl show -p MainPID --value {u}) && [ \"$pid\" != 0 ] && ! readlink /proc/$pid/exe | grep -q ' (deleted)$'"
        )),
        &format!("systemctl restart {u} && sleep 1 && systemctl is-active -q {u} && echo {u} restarted on its new binary"),
    );
    step.timeout = Duration::from_secs(180);
    Arc::new(step)
}

/// `node` Ready with the hop's kubelet, then uncordoned (on the first
/// control-plane node).
pub fn uncordon(version: &str, node: &str) -> Vec<Arc<dyn Step>> {
    let k = waits::kubectl();
    let n = q(node);
    let probe = format!(
        "{ready}; v=$({k} get node {n} -o jsonpath='{{.status.nodeInfo.kubeletVersion}}' 2>&1); \
         [ \"$v\" = {want} ] || echo \"  \"{n}\": kubelet $v, not \"{want}",
        ready = waits::nodes_ready(&[node.to_string()]),
        want = q(version)
    );
    vec![
        waits::wait("node-ready", &format!("node {node} at {version}"), &probe, 300),
        Arc::new(Shell::new(
            "uncordon",
            Some(&format!(
                "u=$({k} get node {n} -o jsonpath='{{.spec.unschedulable}}') && [ -z \"$u\" ]"
            )),
            &format!("{} && echo uncordoned {n}", waits::retried(&format!("{k} uncordon {n}"), 120)),
        )),
    ]
}
