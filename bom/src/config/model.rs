//! The cluster.yaml model, `kubexm.io/v1alpha1` `Cluster`.
//!
//! Every option the architecture names is here, so the file a user writes is
//! read whole even where the installer does not implement an option yet
//! (`support.rs` says which). Defaults live in `defaults.rs`, nowhere else:
//! these types only say `#[serde(default)]`.
//!
//! Secrets are never inline: a password or passphrase is a [`SecretRef`]
//! naming an environment variable or a file.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The whole cluster.yaml document.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Cluster {
    pub api_version: String,
    pub kind: String,
    pub metadata: Metadata,
    pub spec: Spec,
}

impl Cluster {
    /// Hosts that run a local API proxy (mode D): workers that are not
    /// control-plane nodes, which reach the API servers through 127.0.0.1.
    pub fn local_proxy_hosts(&self) -> Vec<String> {
        let g = &self.spec.role_groups;
        if self.spec.control_plane_endpoint.mode != EndpointMode::LocalProxy {
            return Vec::new();
        }
        g.worker.iter().filter(|w| !g.control_plane.contains(w)).cloned().collect()
    }

    /// The roles a host has, by role group, plus `local-proxy` (mode D).
    pub fn roles_of(&self, host: &str) -> Vec<String> {
        let g = &self.spec.role_groups;
        let mut roles: Vec<String> = [
            ("etcd", &g.etcd),
            ("control-plane", &g.control_plane),
            ("worker", &g.worker),
            ("loadbalancer", &g.loadbalancer),
        ]
        .into_iter()
        .filter(|(_, hosts)| hosts.iter().any(|h| h == host))
        .map(|(r, _)| r.to_string())
        .collect();
        if self.local_proxy_hosts().iter().any(|h| h == host) {
            roles.push("local-proxy".into());
        }
        roles
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Metadata {
    pub name: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Spec {
    /// Settings every host inherits unless it sets its own.
    pub host_defaults: HostDefaults,
    pub hosts: Vec<Host>,
    pub role_groups: RoleGroups,
    pub control_plane_endpoint: ControlPlaneEndpoint,
    pub etcd: Etcd,
    pub kubernetes: Kubernetes,
    pub container_runtime: ContainerRuntime,
    pub network: Network,
    pub dns: Dns,
    pub storage: Storage,
    pub load_balancer_service: LoadBalancerService,
    pub registry: Registry,
    pub system: System,
    pub preflight: Preflight,
    pub bundle: BundleSpec,
    /// The certificates kubexm issues (etcd's, the registry's).
    #[serde(skip_serializing_if = "Certificates::is_default")]
    pub certificates: Certificates,
    /// Kubernetes' own conformance tests carried in the bundle.
    #[serde(skip_serializing_if = "Conformance::is_off")]
    pub conformance: Conformance,
    /// How `kubexm-install upgrade` moves the workers.
    #[serde(skip_serializing_if = "Upgrade::is_default")]
    pub upgrade: Upgrade,
    /// Operator mode: the cluster as a Cluster object in itself.
    #[serde(skip_serializing_if = "Operator::is_default")]
    pub operator: Operator,
    /// Operator mode: `true` stops the Cluster's controller from acting on
    /// this cluster (it reports the pause and changes nothing) until it is
    /// `false` again. kubexm-install does not read it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

/// `operator`: every install, apply and upgrade writes the cluster into
/// itself as a Cluster object (`kubexm-system`), its status filled, in its
/// last phase (`operator`). `enabled: true` adds the controller that
/// reconciles that object, inside the cluster: its image comes in the
/// bundle, its Deployment runs on control-plane nodes.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Operator {
    /// Run the Cluster's controller inside the cluster.
    pub enabled: bool,
}

impl Operator {
    fn is_default(&self) -> bool {
        self == &Operator::default()
    }
}

/// `upgrade`: how many workers an upgrade takes out of service at once, and
/// how long a node's drain may take before the upgrade stops on it (the
/// node stays cordoned and named; a re-run continues there).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Upgrade {
    /// Workers cordoned, drained and upgraded at once (1..100).
    pub max_unavailable: u32,
    /// Seconds a node's drain may take (30..86400).
    pub drain_timeout_seconds: u32,
}

impl Upgrade {
    fn is_default(&self) -> bool {
        self == &Upgrade::default()
    }
}

impl Default for Upgrade {
    fn default() -> Self {
        Upgrade {
            max_unavailable: 1,
            drain_timeout_seconds: 600,
        }
    }
}

/// `conformance.enabled`: the bundle carries the Kubernetes e2e test binaries
/// (`e2e.test`, `ginkgo`, for the installer host's arch) and every image the
/// conformance tests pull, so `kubexm-install conformance` runs them offline.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Conformance {
    pub enabled: bool,
}

impl Conformance {
    fn is_off(&self) -> bool {
        !self.enabled
    }
}

/// `certificates`: how long the leaf certificates kubexm issues (etcd's
/// members and clients, the registry's server and clients) are valid.
/// kubeadm's own leafs keep kubeadm's year. A change applies to
/// certificates issued after it: `kubexm-install certs renew` issues them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Certificates {
    /// Days a leaf is valid from the day it is issued (1..3650).
    pub leaf_days: u32,
}

impl Certificates {
    /// The lifetime of a leaf unless the config sets another.
    pub const LEAF_DAYS: u32 = 365;

    fn is_default(&self) -> bool {
        self == &Certificates::default()
    }
}

impl Default for Certificates {
    fn default() -> Self {
        Certificates {
            leaf_days: Certificates::LEAF_DAYS,
        }
    }
}

/// Connection settings shared by hosts.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HostDefaults {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth: Option<Auth>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bastion: Option<Bastion>,
}

/// One machine of the cluster.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Host {
    pub name: String,
    /// Where the installer reaches the host over SSH.
    pub address: String,
    /// The address cluster components use; defaults to `address`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub internal_address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth: Option<Auth>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bastion: Option<Bastion>,
    /// `amd64` or `arm64`; gathered from the host at install time if unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// The host's SSH host key as `TYPE BASE64` (the first two fields of its
    /// `/etc/ssh/ssh_host_*_key.pub`): the key it must present, checked at
    /// first contact instead of trusting whatever it offers. A host added
    /// through a Cluster object needs it (no trust on first use).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_key: Option<String>,
}

/// How the installer logs in. Exactly one method is set.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Auth {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<SecretRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub private_key: Option<PrivateKey>,
    /// Use the keys of the running SSH agent (`SSH_AUTH_SOCK`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<bool>,
    /// A credential held by the `kubexm` server, by name (`kubexm credential
    /// create`): the only method a config sent to the API may use.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PrivateKey {
    pub path: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub passphrase: Option<SecretRef>,
}

/// A jump host the installer goes through to reach a host.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Bastion {
    pub address: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth: Option<Auth>,
}

/// Where a secret comes from. Never the secret itself.
#[derive(Debug, Clone, PartialEq, Default, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_env: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_file: Option<PathBuf>,
}

/// Host names per role.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RoleGroups {
    pub etcd: Vec<String>,
    #[serde(rename = "control-plane")]
    pub control_plane: Vec<String>,
    pub worker: Vec<String>,
    pub loadbalancer: Vec<String>,
    pub registry: Vec<String>,
}

/// The four ways to reach the API servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum EndpointMode {
    /// A: haproxy and keepalived on loadbalancer hosts, holding a VIP.
    #[default]
    HaproxyKeepalived,
    /// B: kube-vip holds a VIP on the control-plane nodes.
    KubeVip,
    /// C: an existing load balancer (F5, cloud) at `address`.
    External,
    /// D: no load balancer; each worker proxies 127.0.0.1:6443 to all API servers.
    LocalProxy,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ControlPlaneEndpoint {
    pub mode: EndpointMode,
    pub domain: String,
    /// The VIP (modes A and B) or the external load balancer (mode C).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    pub port: u16,
    /// Network interface for the VIP; gathered from the host if unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    /// VRRP router id for keepalived (mode A).
    pub virtual_router_id: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum EtcdMode {
    /// systemd units with their own TLS PKI.
    #[default]
    Binary,
    /// Stacked static pods managed by kubeadm.
    Kubeadm,
    /// An existing etcd cluster.
    External,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Etcd {
    pub mode: EtcdMode,
    /// etcd release; the catalog's pairing for the Kubernetes minor if unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    pub data_dir: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external: Option<ExternalEtcd>,
    /// Snapshots each etcd member takes of itself on a systemd timer
    /// (binary mode); unset: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backup: Option<EtcdBackup>,
}

/// `etcd.backup`: a systemd timer on every etcd host saving a snapshot of
/// its member into `directory`, the newest `keep` kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EtcdBackup {
    /// When, as systemd's OnCalendar takes it (`daily`, `*-*-* 02:30:00`, `hourly`).
    pub schedule: String,
    /// Snapshots kept on each host (the newest).
    pub keep: u32,
    /// Where on each etcd host (a directory of its own; reset leaves it).
    pub directory: PathBuf,
}

impl Default for EtcdBackup {
    fn default() -> Self {
        Self {
            schedule: "daily".into(),
            keep: 7,
            directory: PathBuf::from("/var/lib/etcd-backups"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ExternalEtcd {
    pub endpoints: Vec<String>,
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum DeployMode {
    #[default]
    Kubeadm,
    Binary,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ProxyMode {
    #[default]
    Iptables,
    Ipvs,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Kubernetes {
    pub version: String,
    pub deploy_mode: DeployMode,
    #[serde(rename = "serviceCIDR")]
    pub service_cidr: String,
    #[serde(rename = "podCIDR")]
    pub pod_cidr: String,
    /// The network the hosts live in, if it should be checked for overlaps.
    #[serde(rename = "nodeCIDR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_cidr: Option<String>,
    pub dns_domain: String,
    pub proxy_mode: ProxyMode,
    /// What kubelet needs to know of the hosts it runs on.
    pub kubelet: KubeletSettings,
    /// kube-proxy settings some sites (and nested machines) need.
    pub kube_proxy: KubeProxySettings,
    /// How kubeadm runs.
    pub kubeadm: KubeadmSettings,
    /// Whether the install waits for the workers to be Ready (and the CNI's
    /// pods on them), or only for the control-plane nodes. Default: true.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_for_workers: Option<bool>,
}

/// The cgroup driver kubelet and containerd agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum CgroupDriver {
    #[default]
    Systemd,
    Cgroupfs,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct KubeletSettings {
    /// Run kubelet on cgroup v1 hosts: kubelet 1.35 to 1.37 refuse them
    /// unless told (`failCgroupV1: false`); 1.38 no longer runs there.
    #[serde(rename = "cgroupV1")]
    pub cgroup_v1: bool,
    pub cgroup_driver: CgroupDriver,
    /// kubelet's hard eviction thresholds by signal (`nodefs.available:
    /// "5%"`), replacing kubelet's defaults: for hosts whose shared or very
    /// large disks sit below the default 10% / 15% free.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_hard: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct KubeProxySettings {
    /// conntrack entries per CPU kube-proxy sets; 0 leaves the kernel's
    /// value alone (needed where `nf_conntrack_max` is read-only, as in a
    /// container or a network namespace).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conntrack_max_per_core: Option<u32>,
    /// Whether NodePorts answer on 127.0.0.1 (iptables mode); `false` where
    /// kube-proxy may not set `route_localnet` (network namespaces it does
    /// not own). kube-proxy's default: true.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub localhost_node_ports: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct KubeadmSettings {
    /// kubeadm preflight checks whose errors are ignored (kubeadm's names,
    /// e.g. `SystemVerification`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ignore_preflight_errors: Vec<String>,
    /// How long kubeadm waits for the control plane's components to be
    /// healthy, in seconds (kubeadm's default: 240).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub control_plane_timeout_seconds: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RuntimeKind {
    #[default]
    Containerd,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ContainerRuntime {
    #[serde(rename = "type")]
    pub kind: RuntimeKind,
    /// containerd release; the catalog's pairing if unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    pub data_root: PathBuf,
    /// Extra mirrors per upstream registry host, tried before the bundle's registry.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub registry_mirrors: BTreeMap<String, Vec<String>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub insecure_registries: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub auths: Vec<RegistryAuth>,
    /// Keep containers' OOM scores at or above containerd's own, for hosts
    /// that may not lower them (no CAP_SYS_RESOURCE: nested containers, some
    /// VMs), where every pod sandbox would fail to start otherwise.
    pub restrict_oom_score_adj: bool,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RegistryAuth {
    pub registry: String,
    pub username: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<SecretRef>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum NetworkPlugin {
    #[default]
    Calico,
    Flannel,
    Cilium,
    KubeOvn,
    Hybridnet,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Network {
    pub plugin: NetworkPlugin,
    /// The plugin's release; the catalog default if unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    pub multus: Toggle,
}

/// An addon that is on or off, at an optional version.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Toggle {
    pub enabled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Dns {
    pub coredns: Toggle,
    pub nodelocaldns: NodeLocalDns,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct NodeLocalDns {
    pub enabled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The link-local address node-local-dns listens on.
    pub ip: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum StorageProvider {
    #[default]
    None,
    OpenebsLocalpv,
    Longhorn,
    RookCeph,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Storage {
    pub provider: StorageProvider,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Host directory for local volumes (openebs-localpv).
    pub base_path: PathBuf,
    /// Make this the cluster's default StorageClass.
    pub default_class: bool,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LoadBalancerService {
    pub metallb: MetalLb,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MetalLb {
    pub enabled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    pub address_pools: Vec<AddressPool>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AddressPool {
    pub name: String,
    /// CIDRs or `first-last` ranges.
    pub addresses: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RegistryMode {
    /// The installer's own registry service on the registry host.
    #[default]
    Local,
    /// An existing Harbor or distribution registry.
    External,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Registry {
    pub mode: RegistryMode,
    /// Port of the local registry service.
    pub port: u16,
    /// `host[:port]` of the external registry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Path prefix under which images are mirrored into the external registry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<SecretRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    pub insecure: bool,
    /// Mirror as `<prefix>/<repository>` without the upstream host.
    pub flatten: bool,
    /// The local registry requires a client certificate: each node gets
    /// one from the installer's registry CA, named in its `hosts.toml`.
    pub client_auth: bool,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct System {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ntp_servers: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum LeftoverPolicy {
    #[default]
    Fail,
    Warn,
    Clean,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Preflight {
    /// What to do with leftovers of earlier Kubernetes, etcd or container runtime installs.
    pub leftovers: LeftoverPolicy,
    /// Largest clock offset from the installer a host may have.
    pub max_clock_skew_seconds: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct BundleSpec {
    pub arches: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub extra_images: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub charts: Vec<ChartSpec>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<ExtraFile>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub os_packages: Option<OsPackages>,
    /// Upstream rewriting: `host[/path]` to a base URL.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub mirrors: BTreeMap<String, String>,
}

/// A Helm chart carried in the bundle. Exactly one of `repo`, `url`, `oci`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ChartSpec {
    pub name: String,
    pub version: String,
    /// An HTTP chart repository (with `index.yaml`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,
    /// A plain `.tgz` URL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// An OCI reference without tag, e.g. `oci://ghcr.io/org/charts/name`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oci: Option<String>,
    /// The sha256 of the `.tgz`; required for `url` (a plain URL has no other proof).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// An extra file carried in the bundle.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ExtraFile {
    pub name: String,
    pub url: String,
    pub sha256: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
}

/// Debian package repositories carried in the bundle.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct OsPackages {
    /// `debian-bookworm`, ...
    pub releases: Vec<String>,
    pub arches: Vec<String>,
    pub extra: Vec<String>,
    pub mirror: String,
}
