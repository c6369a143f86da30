//! Kubernetes by kubeadm (deployMode `kubeadm`): the binaries and kubelet on
//! every node, our Kubernetes CA on the first control-plane node, `kubeadm
//! init` there with a config rendered for the version's kubeadm API (external
//! etcd from the etcd phase, the control-plane endpoint), then joins: the other
//! control-plane nodes one at a time with the certificate key, the workers in
//! parallel, each with the bootstrap token and the CA's public-key pin.
//!
//! The token and certificate key are secrets: they live in the installer's
//! PKI directory (mode 0600) and in config files on the hosts (0600, removed at
//! hand-over), never on a command line that is logged or in a step's log.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kubexm_bom::config::Cluster;
use serde::{Deserialize, Serialize};

use crate::context::{Inputs, address_of, install_component};
use crate::endpoint;
use crate::engine::files::{PutFiles, RunWith};
use crate::engine::plan::{Check, Module, Scope, Step, StepError, Task};
use crate::engine::steps::Shell;
use crate::engine::transport::Transport;
use crate::phases::etcd::ETCD_PKI;
use crate::pki;
use futures_util::future::BoxFuture;

const KUBELET_UNIT: &str = include_str!("../../manifests/templates/kubelet.service");
const KUBELET_DROPIN: &str = include_str!("../../manifests/templates/kubelet-kubeadm.conf");
const SYSCTL: &str = include_str!("../../manifests/templates/kubernetes-node.conf");
const INIT_V1BETA4: &str = include_str!("../../manifests/templates/kubeadm/init-v1beta4.yaml");
const JOIN_V1BETA4: &str = include_str!("../../manifests/templates/kubeadm/join-v1beta4.yaml");
const INIT_V1BETA3: &str = include_str!("../../manifests/templates/kubeadm/init-v1beta3.yaml");
const JOIN_V1BETA3: &str = include_str!("../../manifests/templates/kubeadm/join-v1beta3.yaml");
/// Where kubexm keeps kubeadm configs on hosts (they hold the token: 0600, removed at hand-over).
pub const CONFIG_DIR: &str = "/etc/kubexm/kubeadm";
/// kubeadm's output, redacted, root only.
const LOG_DIR: &str = "/var/log/kubexm";
/// The bootstrap token and certificate key are reused this long, then renewed
/// (kubeadm deletes uploaded certificates after two hours).
const CREDENTIALS_FOR_SECS: u64 = 100 * 60;

/// The join credentials, kept in `<root>/pki/kubernetes/join.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JoinCredentials {
    pub token: String,
    pub certificate_key: String,
    pub created: u64,
}

impl JoinCredentials {
    pub fn token_id(&self) -> &str {
        self.token.split('.').next().unwrap_or_default()
    }
}

fn random_bytes(n: usize) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut b = vec![0u8; n];
    fs_err::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b)
}

/// `len` characters of `[a-z0-9]`, unbiased (rejection sampling).
fn token_part(len: usize) -> std::io::Result<String> {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut out = String::new();
    while out.len() < len {
        for b in random_bytes(64)? {
            if b < 252 && out.len() < len {
                out.push(ALPHABET[(b % 36) as usize] as char);
            }
        }
    }
    Ok(out)
}

/// The credentials in `dir`, made or renewed when missing or older than the
/// certificate key's life.
pub fn ensure_credentials(dir: &Path) -> anyhow::Result<JoinCredentials> {
    let path = dir.join("join.json");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    if let Ok(text) = fs_err::read_to_string(&path)
        && let Ok(c) = serde_json::from_str::<JoinCredentials>(&text)
        && now.saturating_sub(c.created) < CREDENTIALS_FOR_SECS
    {
        return Ok(c);
    }
    let c = JoinCredentials {
        token: format!("{}.{}", token_part(6)?, token_part(16)?),
        certificate_key: hex::encode(random_bytes(32)?),
        created: now,
    };
    fs_err::create_dir_all(dir)?;
    pki::write_private(&path, serde_json::to_string(&c)?.as_bytes())?;
    Ok(c)
}

/// The Kubernetes CA, its discovery pin and the join credentials, all kept
/// in `<root>/pki/kubernetes`; made once per run and shared by the phases.
pub struct KubePki {
    pub ca: pki::CaPem,
    /// sha256 of the CA's SubjectPublicKeyInfo (kubeadm's `caCertHashes`).
    pub ca_hash: String,
    pub creds: JoinCredentials,
}

impl KubePki {
    /// Made in `<root>/pki/kubernetes` on first use; placeholders in a dry run.
    pub fn ensure(pki: &pki::Pki) -> anyhow::Result<KubePki> {
        let ca = pki.ca("kubernetes", "kubernetes")?;
        let creds = match pki.dir("kubernetes") {
            Some(dir) => ensure_credentials(&dir)?,
            None => JoinCredentials {
                token: format!("{g}.{g}", g = pki::GENERATED),
                certificate_key: pki::GENERATED.into(),
                created: 0,
            },
        };
        Ok(KubePki {
            ca_hash: pki.spki_sha256(&ca)?,
            creds,
            ca,
        })
    }
}

/// What a node's kubeadm config is filled with.
struct Render<'a> {
    cluster: &'a Cluster,
    api: &'a str,
    creds: &'a JoinCredentials,
    ca_hash: &'a str,
}

impl<'a> Render<'a> {
    fn new(i: &'a Inputs, k: &'a KubePki) -> Render<'a> {
        Render {
            cluster: i.cluster,
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
            .map(|m| format!("      - https://{}:2379", address_of(c, m)))
            .collect();
        let mut sans: Vec<String> = vec![c.spec.control_plane_endpoint.domain.clone()];
        if let Some(vip) = &c.spec.control_plane_endpoint.address {
            sans.push(vip.clone());
        }
        for h in &g.control_plane {
            sans.push(h.clone());
            sans.push(address_of(c, h));
        }
        sans.push("127.0.0.1".into());
        let dns = if c.spec.dns.nodelocaldns.enabled {
            c.spec.dns.nodelocaldns.ip.clone()
        } else {
            crate::addons::cluster_dns_ip(&c.spec.kubernetes.service_cidr)
        };
        let address = address_of(c, node);
        let endpoint = endpoint::endpoint(c);
        let etcd = etcd.join("\n");
        let sans = sans.iter().map(|s| format!("    - \"{s}\"")).collect::<Vec<_>>().join("\n");
        let proxy_mode = match c.spec.kubernetes.proxy_mode {
            kubexm_bom::config::model::ProxyMode::Ipvs => "ipvs",
            _ => "iptables",
        };
        let mut values = vec![
            ("NODE", node),
            ("ADDRESS", address.as_str()),
            ("TOKEN", self.creds.token.as_str()),
            ("CERT_KEY", self.creds.certificate_key.as_str()),
            ("CA_HASH", self.ca_hash),
            ("ENDPOINT", endpoint.as_str()),
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
                address_of(self.cluster, node),
                self.creds.certificate_key
            )
        } else {
            String::new()
        };
        Ok(self.common(
            &format!("kubeadm join ({})", self.api),
            self.templates()?.1,
            node,
            &[("CONTROL_PLANE", &cp)],
        )?)
    }
}

/// The binaries, kernel settings and kubelet unit a node needs before kubeadm.
fn node_prerequisites(i: &Inputs, host: &str, with_kubectl: bool) -> anyhow::Result<Vec<Arc<dyn Step>>> {
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
            ("/etc/sysctl.d/90-kubexm-kubernetes.conf".into(), SYSCTL.as_bytes().to_vec(), 0o644),
            (
                "/etc/modules-load.d/kubexm-kubernetes.conf".into(),
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
            (
                "/etc/systemd/system/kubelet.service".into(),
                KUBELET_UNIT.as_bytes().to_vec(),
                0o644,
            ),
            (
                "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf".into(),
                KUBELET_DROPIN.as_bytes().to_vec(),
                0o644,
            ),
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

/// The control-plane phase: init on the first node, then the others join in turn.
pub fn control_plane_module(i: &Inputs, k: &KubePki) -> anyhow::Result<Module> {
    let c = i.cluster;
    let g = &c.spec.role_groups;
    if g.control_plane.is_empty() {
        return Err(crate::DeployError::Config("roleGroups.control-plane is empty".into()).into());
    }
    let r = Render::new(i, k);
    let (ca, creds) = (&k.ca, &k.creds);
    let etcd_ca = i.pki.ca("etcd", "kubexm etcd CA")?;
    let client = i.pki.cert(&etcd_ca, "client", "kubexm-etcd-client", &[], pki::Usage::Client)?;
    let etcd_files = vec![
        (format!("{ETCD_PKI}/ca.crt"), etcd_ca.cert_pem.clone(), 0o644),
        (format!("{ETCD_PKI}/client.crt"), client.cert_pem.clone().into_bytes(), 0o644),
        (format!("{ETCD_PKI}/client.key"), client.key_pem.clone().into_bytes(), 0o600),
    ];
    let mut tasks = Vec::new();
    // Every etcd member answers before the control plane starts: a stopped
    // member fails here, on its own host, not inside kubeadm.
    let mut gates = Vec::new();
    for m in &g.etcd {
        let ep = format!("https://{}:2379/health", address_of(c, m));
        let probe = format!(
            "curl -sf --max-time 3 --cacert {ETCD_PKI}/ca.crt --cert {ETCD_PKI}/client.crt --key {ETCD_PKI}/client.key {ep} | grep -q '\"health\":\"true\"'"
        );
        tasks.push(Task {
            name: format!("etcd-ready-{m}"),
            hosts: vec![m.clone()],
            steps: vec![Arc::new(Shell {
                name: "etcd-ready".into(),
                check: Some(probe.clone()),
                apply: format!(
                    "for i in $(seq 10); do {probe} && exit 0; sleep 1; done; \
                     echo \"etcd member {m} does not answer at {ep} ($(systemctl is-active kubexm-etcd)); start it (systemctl start kubexm-etcd) or re-run the etcd phase\" >&2; exit 1"
                ),
                timeout: Duration::from_secs(60),
            })],
            after: vec![],
        });
        gates.push((format!("etcd-ready-{m}"), Scope::AllHosts));
    }
    let mut previous: Option<String> = None;
    for (n, h) in g.control_plane.iter().enumerate() {
        let mut steps = node_prerequisites(i, h, true)?;
        steps.push(Arc::new(PutFiles {
            name: "etcd-client-certs".into(),
            files: etcd_files.clone(),
            then: None,
        }));
        let task = if n == 0 {
            steps.push(Arc::new(PutFiles {
                name: "kubernetes-ca".into(),
                files: vec![
                    ("/etc/kubernetes/pki/ca.crt".into(), ca.cert_pem.clone(), 0o644),
                    ("/etc/kubernetes/pki/ca.key".into(), ca.key_pem.clone(), 0o600),
                ],
                then: None,
            }));
            let init = r.init(h)?;
            steps.push(kubeadm(
                "kubeadm-init",
                "test -s /etc/kubernetes/admin.conf",
                init.clone(),
                "init.yaml",
                "kubeadm init --upload-certs",
                creds,
            ));
            steps.push(kubelet_running());
            // Credentials renewed on a later run (the token lives 24 h, uploaded certificates 2 h).
            steps.push(Arc::new(RunWith {
                name: "join-credentials".into(),
                check: format!("grep -qx {} {CONFIG_DIR}/tokens 2>/dev/null", creds.token_id()),
                files: vec![(format!("{CONFIG_DIR}/init.yaml"), init.into_bytes(), 0o600)],
                command: format!(
                    "set -e; kubeadm token create --config {CONFIG_DIR}/init.yaml --ttl 24h0m0s >/dev/null; \
                     kubeadm init phase upload-certs --upload-certs --config {CONFIG_DIR}/init.yaml >/dev/null; echo {} >> {CONFIG_DIR}/tokens",
                    creds.token_id()
                ),
                timeout: Duration::from_secs(120),
            }));
            format!("kubeadm-init-{h}")
        } else {
            steps.push(kubeadm(
                "kubeadm-join",
                "test -s /etc/kubernetes/kubelet.conf && test -s /etc/kubernetes/admin.conf",
                r.join(h, true)?,
                "join.yaml",
                "kubeadm join",
                creds,
            ));
            steps.push(kubelet_running());
            format!("kubeadm-join-{h}")
        };
        let mut after = gates.clone();
        if let Some(p) = &previous {
            after.push((p.clone(), Scope::AllHosts));
        }
        tasks.push(Task {
            name: task.clone(),
            hosts: vec![h.clone()],
            steps,
            after,
        });
        previous = Some(task);
    }
    Ok(Module {
        name: "control-plane".into(),
        tasks,
    })
}

/// The workers phase: every worker that is not a control-plane node joins,
/// after its local proxy (mode D) is up.
pub fn workers_module(i: &Inputs, k: &KubePki) -> anyhow::Result<Module> {
    let g = &i.cluster.spec.role_groups;
    let r = Render::new(i, k);
    let creds = &k.creds;
    let mut tasks = Vec::new();
    for w in g.worker.iter().filter(|w| !g.control_plane.contains(w)) {
        let mut steps = node_prerequisites(i, w, false)?;
        steps.push(kubeadm(
            "kubeadm-join",
            "test -s /etc/kubernetes/kubelet.conf",
            r.join(w, false)?,
            "join.yaml",
            "kubeadm join",
            creds,
        ));
        steps.push(kubelet_running());
        tasks.push(Task {
            name: format!("kubeadm-join-{w}"),
            hosts: vec![w.clone()],
            steps,
            after: vec![],
        });
    }
    Ok(Module {
        name: "workers".into(),
        tasks,
    })
}

/// The admin kubeconfig from the first control-plane node, its server set to
/// an address the user's machine reaches, written locally (0600) whole or
/// not at all. Its content never enters a log.
pub struct FetchKubeconfig {
    pub local: std::path::PathBuf,
    pub server: String,
}

impl FetchKubeconfig {
    async fn wanted(&self, t: &dyn Transport) -> Result<Vec<u8>, StepError> {
        let out = t.run("cat /etc/kubernetes/admin.conf", Duration::from_secs(30)).await?;
        if !out.success() {
            return Err(StepError::Failed(
                "/etc/kubernetes/admin.conf is missing: run the control-plane phase first".into(),
            ));
        }
        let mut text = String::new();
        for line in out.stdout.split_inclusive('\n') {
            let body = line.trim_start();
            if body.starts_with("server: ") {
                let indent = &line[..line.len() - body.len()];
                text.push_str(&format!("{indent}server: {}\n", self.server));
            } else {
                text.push_str(line);
            }
        }
        Ok(text.into_bytes())
    }
}

impl Step for FetchKubeconfig {
    fn name(&self) -> &str {
        "admin-kubeconfig"
    }

    fn check<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<Check, StepError>> {
        Box::pin(async move {
            let want = self.wanted(t).await?;
            Ok(match fs_err::read(&self.local) {
                Ok(have) if have == want => Check::Holds,
                _ => Check::Missing,
            })
        })
    }

    fn apply<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<String, StepError>> {
        Box::pin(async move {
            let want = self.wanted(t).await?;
            if let Some(dir) = self.local.parent() {
                fs_err::create_dir_all(dir).map_err(|e| StepError::Failed(e.to_string()))?;
            }
            pki::write_private(&self.local, &want).map_err(|e| StepError::Failed(e.to_string()))?;
            Ok(format!("wrote {} (server {})", self.local.display(), self.server))
        })
    }
}

/// Hand-over: the admin kubeconfig for the user, the temporary files
/// (kubeadm configs holding the token) removed from every host, and no
/// credential left in a kubeadm log.
pub fn handover_module(i: &Inputs) -> anyhow::Result<Module> {
    let first = crate::context::first_control_plane(i.cluster)?;
    let mut tasks = vec![Task {
        name: "admin-kubeconfig".into(),
        hosts: vec![first],
        steps: vec![Arc::new(FetchKubeconfig {
            local: i.kubeconfig.to_path_buf(),
            server: endpoint::external_server(i.cluster),
        })],
        after: vec![],
    }];
    let temp = format!("{CONFIG_DIR}/*.yaml /var/lib/kubexm/files");
    tasks.push(Task {
        name: "remove-temporary-files".into(),
        hosts: i.cluster.spec.hosts.iter().map(|h| h.name.clone()).collect(),
        steps: vec![
            Arc::new(Shell::new(
                "remove-temporary-files",
                Some(&format!("! ls -d {temp} >/dev/null 2>&1")),
                &format!("rm -rf {temp}"),
            )),
            logs_redacted(),
        ],
        after: vec![("admin-kubeconfig".into(), Scope::AllHosts)],
    });
    Ok(Module {
        name: "kubeconfig".into(),
        tasks,
    })
}
