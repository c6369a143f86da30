//! Kubernetes by kubeadm (deployMode `kubeadm`), three phases sharing this
//! file: `control-plane` (control_plane.rs: our Kubernetes CA on the first
//! node, `kubeadm init` there with a config rendered for the bundle's kubeadm
//! API, external etcd from the etcd phase, then the other control-plane nodes
//! join one at a time with the certificate key), `workers` (workers.rs: the
//! workers join in parallel with the bootstrap token and the CA's public-key
//! pin) and `kubeconfig` (kubeconfig.rs: the hand-over). Here: what they
//! share, the node prerequisites (binaries, kernel settings, kubelet unit),
//! the kubeadm configs and the kubeadm step.
//!
//! The token and certificate key are secrets: they live in the installer's
//! PKI directory (mode 0600) and in config files on the hosts (0600, removed at
//! hand-over), never on a command line that is logged or in a step's log.

use std::sync::Arc;
use std::time::Duration;

use kubexm_bom::config::Cluster;
use kubexm_bom::topology::Topology;

use crate::context::{Context, install_component};
use crate::engine::files::{PutFiles, RunWith};
use crate::engine::plan::Step;
use crate::engine::steps::Shell;
use crate::kube_pki::{JoinCredentials, KubePki};
use crate::paths::{KUBEADM_CONFIG as CONFIG_DIR, LOG_DIR};
use crate::paths::{KUBELET_DROPIN as KUBELET_DROPIN_PATH, KUBELET_UNIT as KUBELET_UNIT_PATH, NODE_MODULES, NODE_SYSCTL};

mod control_plane;
pub(crate) mod kubeconfig;
pub mod upgrade;
mod workers;

pub use control_plane::{init_task, module as control_plane, node_tasks};
pub use kubeconfig::{FetchKubeconfig, module as kubeconfig};
pub use workers::module as workers;

const KUBELET_UNIT: &str = include_str!("../../../../manifests/templates/kubelet.service");
const KUBELET_DROPIN: &str = include_str!("../../../../manifests/templates/kubelet-kubeadm.conf");
const SYSCTL: &str = include_str!("../../../../manifests/templates/kubernetes-node.conf");
const INIT_V1BETA4: &str = include_str!("../../../../manifests/templates/kubeadm/init-v1beta4.yaml");
const JOIN_V1BETA4: &str = include_str!("../../../../manifests/templates/kubeadm/join-v1beta4.yaml");
const INIT_V1BETA3: &str = include_str!("../../../../manifests/templates/kubeadm/init-v1beta3.yaml");
const JOIN_V1BETA3: &str = include_str!("../../../../manifests/templates/kubeadm/join-v1beta3.yaml");

/// What a node's kubeadm config is filled with.
struct Render<'a> {
    cluster: &'a Cluster,
    topo: &'a Topology,
    api: &'a str,
    creds: &'a JoinCredentials,
    ca_hash: &'a str,
}

impl<'a> Render<'a> {
    fn new(i: &'a Context, k: &'a KubePki) -> Render<'a> {
        Render {
            cluster: i.cluster,
            topo: &i.topo,
            api: i.kubeadm_api,
            creds: &k.creds,
            ca_hash: &k.ca_hash,
        }
    }
}

impl Render<'_> {
    fn common(&self, name: &str, template: &str, node: &str, extra: &[(&str, &str)]) -> Result<String, crate::template::Unfilled> {
        let c = self.cluster;
        let g = &c.spec.role_groups;
        let taints = if g.control_plane.iter().any(|h| h == node) && g.worker.iter().any(|h| h == node) {
            // A control-plane node that is also a worker takes workloads.
            "  taints: []"
        } else {
            ""
        };
        let etcd: Vec<String> = g
            .etcd
            .iter()
            .map(|m| format!("      - https://{}:2379", self.topo.address(m)))
            .collect();
        let mut sans: Vec<String> = vec![c.spec.control_plane_endpoint.domain.clone()];
        if let Some(vip) = &c.spec.control_plane_endpoint.address {
            sans.push(vip.clone());
        }
        for h in &g.control_plane {
            sans.push(h.clone());
            sans.push(self.topo.address(h).to_string());
        }
        sans.push("127.0.0.1".into());
        let dns = if c.spec.dns.nodelocaldns.enabled {
            c.spec.dns.nodelocaldns.ip.clone()
        } else {
            self.topo.cluster_dns.clone()
        };
        let address = self.topo.address(node);
        let endpoint = self.topo.endpoint.as_str();
        let etcd = etcd.join("\n");
        let sans = sans.iter().map(|s| format!("    - \"{s}\"")).collect::<Vec<_>>().join("\n");
        let proxy_mode = match c.spec.kubernetes.proxy_mode {
            kubexm_bom::config::model::ProxyMode::Ipvs => "ipvs",
            _ => "iptables",
        };
        let k = &c.spec.kubernetes;
        let driver = match k.kubelet.cgroup_driver {
            kubexm_bom::config::model::CgroupDriver::Systemd => "systemd",
            kubexm_bom::config::model::CgroupDriver::Cgroupfs => "cgroupfs",
        };
        let mut kubelet_extra = Vec::new();
        if k.kubelet.cgroup_v1 {
            kubelet_extra.push("failCgroupV1: false".to_string());
        }
        if !k.kubelet.eviction_hard.is_empty() {
            kubelet_extra.push("evictionHard:".into());
            for (signal, value) in &k.kubelet.eviction_hard {
                // JSON strings are YAML scalars: quoted and escaped, whatever they hold.
                let quoted = |s: &str| serde_json::Value::from(s).to_string();
                kubelet_extra.push(format!("  {}: {}", quoted(signal), quoted(value)));
            }
        }
        let kubelet_extra = kubelet_extra.join("\n");
        let kube_proxy_extra = [
            k.kube_proxy
                .conntrack_max_per_core
                .map(|n| format!("conntrack:\n  maxPerCore: {n}")),
            k.kube_proxy
                .localhost_node_ports
                .map(|b| format!("iptables:\n  localhostNodePorts: {b}")),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join("\n");
        let ignore = if k.kubeadm.ignore_preflight_errors.is_empty() {
            String::new()
        } else {
            format!("  ignorePreflightErrors: [{}]", k.kubeadm.ignore_preflight_errors.join(", "))
        };
        let v1beta4 = self.api == "kubeadm.k8s.io/v1beta4";
        let (timeouts, apiserver_timeout) = match k.kubeadm.control_plane_timeout_seconds {
            Some(t) if v1beta4 => (format!("timeouts:\n  controlPlaneComponentHealthCheck: {t}s"), String::new()),
            Some(t) => (String::new(), format!("  timeoutForControlPlane: {t}s")),
            None => (String::new(), String::new()),
        };
        let mut values = vec![
            ("NODE", node),
            ("ADDRESS", address),
            ("TOKEN", self.creds.token.as_str()),
            ("CERT_KEY", self.creds.certificate_key.as_str()),
            ("CA_HASH", self.ca_hash),
            ("ENDPOINT", endpoint),
            ("CLUSTER", c.metadata.name.as_str()),
            ("VERSION", c.spec.kubernetes.version.as_str()),
            ("POD_CIDR", c.spec.kubernetes.pod_cidr.as_str()),
            ("SERVICE_CIDR", c.spec.kubernetes.service_cidr.as_str()),
            ("DNS_DOMAIN", c.spec.kubernetes.dns_domain.as_str()),
            ("ETCD_ENDPOINTS", etcd.as_str()),
            ("SANS", sans.as_str()),
            ("CLUSTER_DNS", dns.as_str()),
            ("PROXY_MODE", proxy_mode),
            ("TAINTS", taints),
            ("CGROUP_DRIVER", driver),
            ("KUBELET_EXTRA", kubelet_extra.as_str()),
            ("KUBE_PROXY_EXTRA", kube_proxy_extra.as_str()),
            ("IGNORE_PREFLIGHT", ignore.as_str()),
            ("INIT_TIMEOUTS", timeouts.as_str()),
            ("JOIN_TIMEOUTS", timeouts.as_str()),
            ("APISERVER_TIMEOUT", apiserver_timeout.as_str()),
        ];
        values.extend_from_slice(extra);
        crate::template::render(name, template, &values, &[])
    }

    fn templates(&self) -> anyhow::Result<(&'static str, &'static str)> {
        match self.api {
            "kubeadm.k8s.io/v1beta4" => Ok((INIT_V1BETA4, JOIN_V1BETA4)),
            "kubeadm.k8s.io/v1beta3" => Ok((INIT_V1BETA3, JOIN_V1BETA3)),
            other => Err(crate::DeployError::NotSupported(format!("kubeadm API {other} (v1beta3 and v1beta4 are supported)")).into()),
        }
    }

    /// The `kubeadm init` config for the first control-plane node.
    pub fn init(&self, node: &str) -> anyhow::Result<String> {
        Ok(self.common(&format!("kubeadm init ({})", self.api), self.templates()?.0, node, &[])?)
    }

    /// The `kubeadm join` config; control-plane joins carry the certificate key.
    pub fn join(&self, node: &str, control_plane: bool) -> anyhow::Result<String> {
        let cp = if control_plane {
            format!(
                "controlPlane:\n  localAPIEndpoint:\n    advertiseAddress: {}\n    bindPort: 6443\n  certificateKey: \"{}\"\n",
                self.topo.address(node),
                self.creds.certificate_key
            )
        } else {
            String::new()
        };
        // Where the joining node finds the cluster. In mode D a control-plane
        // node's endpoint name points at its own API server, which does not
        // run before it has joined: it asks the first control-plane node.
        let discovery =
            if control_plane && self.cluster.spec.control_plane_endpoint.mode == kubexm_bom::config::model::EndpointMode::LocalProxy {
                format!("{}:6443", self.topo.address(&self.topo.first_control_plane))
            } else {
                self.topo.endpoint.clone()
            };
        Ok(self.common(
            &format!("kubeadm join ({})", self.api),
            self.templates()?.1,
            node,
            &[("CONTROL_PLANE", &cp), ("DISCOVERY", &discovery)],
        )?)
    }
}

/// The binaries, kernel settings and kubelet unit a node needs before kubeadm.
fn node_prerequisites(i: &Context, host: &str, with_kubectl: bool) -> anyhow::Result<Vec<Arc<dyn Step>>> {
    let mut steps = Vec::new();
    let mut components = vec!["kubeadm", "kubelet"];
    if with_kubectl {
        components.push("kubectl");
    }
    for component in components {
        let file = i.bundle_file(host, component)?;
        steps.extend(install_component(file, i.bundle_dir, i.file_server));
    }
    steps.push(Arc::new(PutFiles {
        name: "kernel-settings".into(),
        files: vec![
            (NODE_SYSCTL.into(), SYSCTL.as_bytes().to_vec(), 0o644),
            (
                NODE_MODULES.into(),
                b"# kubexm: modules a Kubernetes node needs.\noverlay\nbr_netfilter\n".to_vec(),
                0o644,
            ),
        ],
        // Containers (like the lab's hosts) may not load modules or set every
        // key; kubeadm's own preflight names what is really missing.
        then: Some(
            "modprobe overlay 2>/dev/null; modprobe br_netfilter 2>/dev/null; sysctl -q --system >/dev/null 2>&1; swapoff -a; true".into(),
        ),
    }));
    steps.push(Arc::new(PutFiles {
        name: "kubelet-unit".into(),
        files: vec![
            (KUBELET_UNIT_PATH.into(), KUBELET_UNIT.as_bytes().to_vec(), 0o644),
            (KUBELET_DROPIN_PATH.into(), KUBELET_DROPIN.as_bytes().to_vec(), 0o644),
        ],
        then: Some("systemctl daemon-reload && systemctl enable -q kubelet".into()),
    }));
    Ok(steps)
}

fn kubelet_running() -> Arc<dyn Step> {
    Arc::new(Shell::new(
        "kubelet-running",
        Some("systemctl is-enabled -q kubelet && systemctl is-active -q kubelet"),
        "systemctl enable -q kubelet && systemctl restart kubelet && sleep 1 && systemctl is-active -q kubelet",
    ))
}

/// Redacts bootstrap tokens (`[a-z0-9]{6}.[a-z0-9]{16}`) and certificate
/// keys (64 hex digits) from a stream: kubeadm prints both in its join
/// commands. Also used on logs an older kubexm left.
const REDACT: &str = "sed -E -e 's/[a-z0-9]{6}\\.[a-z0-9]{16}/<redacted-token>/g' -e 's/[a-f0-9]{64}/<redacted-key>/g'";

/// Runs kubeadm with a config file. Its output reaches the root-only log on
/// the host only after the token and certificate key are redacted (they
/// never touch the disk); on failure the log's tail is shown.
fn kubeadm(name: &str, check: &str, config: String, file: &str, command: &str, creds: &JoinCredentials) -> Arc<dyn Step> {
    let log = format!("{LOG_DIR}/{name}.log");
    Arc::new(RunWith {
        name: name.into(),
        check: check.into(),
        files: vec![(format!("{CONFIG_DIR}/{file}"), config.into_bytes(), 0o600)],
        command: format!(
            "mkdir -p {LOG_DIR} && chmod 700 {LOG_DIR} && umask 077 && rm -f {log}\n\
             {{ {command} --config {CONFIG_DIR}/{file} 2>&1 || echo \"kubexm-exit-code=$?\"; }} | {REDACT} > {log}\n\
             if rc=$(sed -n 's/^kubexm-exit-code=//p' {log}) && [ -n \"$rc\" ]; then\n  grep -v '^kubexm-exit-code=' {log} | tail -25 >&2; exit \"$rc\"\nfi\n\
             echo {id} >> {CONFIG_DIR}/tokens; echo \"{name}: done (log {log})\"",
            id = creds.token_id()
        ),
        timeout: Duration::from_secs(600),
    })
}

/// Hand-over: logs on the host keep no credential and are root only,
/// including those an earlier kubexm wrote.
fn logs_redacted() -> Arc<dyn Step> {
    let pattern = "'[a-z0-9]{6}\\.[a-z0-9]{16}|[a-f0-9]{64}'";
    Arc::new(Shell::new(
        "logs-redacted",
        Some(&format!(
            "! grep -qsE {pattern} {LOG_DIR}/*.log && [ -z \"$(find {LOG_DIR} -type f -perm /077 2>/dev/null)\" ]"
        )),
        &format!(
            "for f in {LOG_DIR}/*.log; do [ -f \"$f\" ] && {REDACT} -i \"$f\"; done; \
             find {LOG_DIR} -type f -exec chmod 600 {{}} +; echo 'kubeadm logs redacted, root only'"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(c: &Cluster, api: &str) -> Result<(String, String), Box<dyn std::error::Error>> {
        let topo = Topology::of(c)?;
        let creds = JoinCredentials {
            token: "abcdef.0123456789abcdef".into(),
            certificate_key: "k".into(),
            created: 0,
        };
        let r = Render {
            cluster: c,
            topo: &topo,
            api,
            creds: &creds,
            ca_hash: "h",
        };
        let first = c.spec.role_groups.control_plane[0].clone();
        let worker = c.spec.role_groups.worker.last().cloned().unwrap_or_default();
        Ok((r.init(&first)?, r.join(&worker, false)?))
    }

    #[test]
    fn kubelet_kube_proxy_and_kubeadm_settings_reach_the_configs_and_nothing_else_by_default() -> Result<(), Box<dyn std::error::Error>> {
        let text = std::fs::read_to_string(format!("{}/../examples/ha.yaml", env!("CARGO_MANIFEST_DIR")))?;
        let mut c = kubexm_bom::config::load_str(&text, "ha.yaml", &kubexm_bom::catalog::Catalog::builtin()?)?;
        let (init, _) = render(&c, "kubeadm.k8s.io/v1beta4")?;
        for absent in [
            "failCgroupV1",
            "evictionHard",
            "conntrack",
            "localhostNodePorts",
            "ignorePreflightErrors",
            "timeouts",
            "timeoutForControlPlane",
        ] {
            assert!(!init.contains(absent), "{absent} rendered by default:\n{init}");
        }
        assert!(init.contains("cgroupDriver: systemd"), "{init}");
        let k = &mut c.spec.kubernetes;
        k.kubelet.cgroup_v1 = true;
        k.kubelet.cgroup_driver = kubexm_bom::config::model::CgroupDriver::Cgroupfs;
        k.kubelet.eviction_hard.insert("nodefs.available".into(), "1%".into());
        k.kube_proxy.conntrack_max_per_core = Some(0);
        k.kube_proxy.localhost_node_ports = Some(false);
        k.kubeadm.ignore_preflight_errors = vec!["SystemVerification".into()];
        k.kubeadm.control_plane_timeout_seconds = Some(600);
        let (init, join) = render(&c, "kubeadm.k8s.io/v1beta4")?;
        for present in [
            "cgroupDriver: cgroupfs\nfailCgroupV1: false\nevictionHard:\n  \"nodefs.available\": \"1%\"\n",
            "mode: ipvs\nconntrack:\n  maxPerCore: 0\niptables:\n  localhostNodePorts: false\n",
            "  ignorePreflightErrors: [SystemVerification]\n",
            "timeouts:\n  controlPlaneComponentHealthCheck: 600s\n---",
        ] {
            assert!(init.contains(present), "{present:?} missing:\n{init}");
        }
        assert!(join.contains("  ignorePreflightErrors: [SystemVerification]\n"), "{join}");
        // Issue 25, item 3: a quote and a newline in a threshold (past
        // validation) stay inside its string; `{{TOKEN}}` stays text.
        let hostile = "1%\"\nanonymous: {enabled: true}\n{{TOKEN}}";
        c.spec
            .kubernetes
            .kubelet
            .eviction_hard
            .insert("nodefs.available".into(), hostile.into());
        let (init, join) = render(&c, "kubeadm.k8s.io/v1beta4")?;
        for doc in [&init, &join] {
            assert!(!doc.lines().any(|l| l.starts_with("anonymous")), "{doc}");
        }
        assert!(init.contains(&serde_json::Value::from(hostile).to_string()), "{init}");
        let (init, _) = render(&c, "kubeadm.k8s.io/v1beta3")?;
        assert!(
            init.contains("  timeoutForControlPlane: 600s\n") && !init.contains("timeouts:"),
            "{init}"
        );
        Ok(())
    }
}
