//! Every path kubexm uses, in one place: on the installer's machine (under
//! its state root) and on the hosts. Scripts and templates name them through
//! these constants; `reset` removes what lives under them.

/// The installer's state root: unpacked bundles, PKI, the admin kubeconfig.
pub const ROOT: &str = "/var/lib/kubexm";

/// A cluster's PKI (its CAs, join token) under the state root.
pub fn cluster_pki(root: &std::path::Path, name: &str) -> std::path::PathBuf {
    root.join("clusters").join(name).join("pki")
}

/// The port of the file server the installer runs during an install.
pub const SERVE_PORT: u16 = 5443;

// On every host.
/// kubexm's configuration and certificates.
pub const HOST_ETC: &str = "/etc/kubexm";
/// kubexm's state: stamps of installed components and applied addons.
pub const HOST_STATE: &str = "/var/lib/kubexm";
/// The registry CA every host trusts.
pub const HOST_CA: &str = "/etc/kubexm/pki/registry-ca.crt";
/// The registry service's certificate and key on the registry host.
pub const REGISTRY_CERT: &str = "/etc/kubexm/pki/registry.crt";
pub const REGISTRY_KEY: &str = "/etc/kubexm/pki/registry.key";
/// The CA whose client certificates the registry service accepts
/// (`registry.clientAuth`), on the registry host.
pub const REGISTRY_CLIENT_CA: &str = "/etc/kubexm/pki/registry-clients-ca.crt";
/// A node's client certificate for the registry, beside its `hosts.toml` files.
pub const REGISTRY_CLIENT_CERT: &str = "/etc/containerd/certs.d/kubexm-registry-client.crt";
pub const REGISTRY_CLIENT_KEY: &str = "/etc/containerd/certs.d/kubexm-registry-client.key";
/// Where the registry host receives the installer and the bundle.
pub const REGISTRY_UPLOAD: &str = "/var/lib/kubexm/upload";
/// Bundles unpacked on the registry host, by id.
pub const HOST_BUNDLES: &str = "/var/lib/kubexm/bundles";
/// Component archives fetched from the file server (removed once installed).
pub const HOST_FILES: &str = "/var/lib/kubexm/files";
/// One stamp per installed component: version, arch and digest.
pub const INSTALLED: &str = "/var/lib/kubexm/installed";
/// One stamp per applied addon: the digest of what was applied.
pub const APPLIED: &str = "/var/lib/kubexm/applied";
/// etcd's certificates (server, peer, client).
pub const ETCD_PKI: &str = "/etc/kubexm/etcd/pki";
/// How an etcd member first joined (`KUBEXM_INITIAL_CLUSTER{,_STATE}`),
/// written once, read by its unit.
pub const ETCD_INITIAL_ENV: &str = "/etc/kubexm/etcd/initial.env";
/// kubeadm configs (they hold the token: 0600, removed at hand-over).
pub const KUBEADM_CONFIG: &str = "/etc/kubexm/kubeadm";
/// kubeadm's output, redacted, root only.
pub const LOG_DIR: &str = "/var/log/kubexm";
/// kubeadm's static pods' manifests, on a control-plane node.
pub const STATIC_POD_MANIFESTS: &str = "/etc/kubernetes/manifests";

/// Addon manifests as applied, on the first control-plane node.
pub const ADDONS_DIR: &str = "/etc/kubexm/addons";
/// keepalived's config before the VRRP interface is filled in.
pub const KEEPALIVED_IN: &str = "/etc/kubexm/keepalived.conf.in";
/// The admin kubeconfig kubeadm writes on control-plane nodes.
pub const ADMIN_CONF: &str = "/etc/kubernetes/admin.conf";
/// The operator phase's files on the first control-plane node (the Cluster
/// definition, object and status; no secret).
pub const OPERATOR_DIR: &str = "/var/lib/kubexm/operator";
/// Other apt sources wait here while the OS packages step runs.
pub const APT_ASIDE: &str = "/etc/apt/kubexm-aside";
/// The bundle's apt source and its package lists.
pub const APT_LIST: &str = "/etc/apt/sources.list.d/kubexm-bundle.list";
pub const APT_LISTS: &str = "/var/lib/kubexm/apt-lists";
/// containerd's config, its registry hosts directory and unit.
pub const CONTAINERD_CONFIG: &str = "/etc/containerd/config.toml";
pub const CONTAINERD_CERTS_D: &str = "/etc/containerd/certs.d";
pub const CONTAINERD_UNIT: &str = "/etc/systemd/system/containerd.service";
/// kubelet's unit and kubeadm drop-in.
pub const KUBELET_UNIT: &str = "/etc/systemd/system/kubelet.service";
pub const KUBELET_DROPIN: &str = "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf";
/// The kernel settings and modules a Kubernetes node needs.
pub const NODE_SYSCTL: &str = "/etc/sysctl.d/90-kubexm-kubernetes.conf";
pub const NODE_MODULES: &str = "/etc/modules-load.d/kubexm-kubernetes.conf";
/// kubeadm's directory, our Kubernetes CA in it, and the kubelet's kubeconfig.
pub const KUBERNETES_DIR: &str = "/etc/kubernetes";
pub const KUBERNETES_CA_CRT: &str = "/etc/kubernetes/pki/ca.crt";
pub const KUBERNETES_CA_KEY: &str = "/etc/kubernetes/pki/ca.key";
pub const KUBELET_CONF: &str = "/etc/kubernetes/kubelet.conf";
/// kubexm's etcd unit, and the registry service's on the registry host.
pub const ETCD_UNIT: &str = "/etc/systemd/system/kubexm-etcd.service";
/// `etcd.backup`: the script and its systemd service and timer on each etcd host.
pub const ETCD_BACKUP_SCRIPT: &str = "/etc/kubexm/etcd-backup.sh";
pub const ETCD_BACKUP_SERVICE: &str = "/etc/systemd/system/kubexm-etcd-backup.service";
pub const ETCD_BACKUP_TIMER: &str = "/etc/systemd/system/kubexm-etcd-backup.timer";
pub const REGISTRY_UNIT: &str = "/etc/systemd/system/kubexm-registry.service";
/// The installer binary on the registry host, which serves the registry.
pub const HOST_INSTALLER: &str = "/usr/local/bin/kubexm-install";
/// Binaries `reset` checks are gone.
pub const KUBELET_BIN: &str = "/usr/local/bin/kubelet";
pub const ETCD_BIN: &str = "/usr/local/bin/etcd";
/// haproxy's and keepalived's configs (endpoint modes A and D).
pub const HAPROXY_CFG: &str = "/etc/haproxy/haproxy.cfg";
pub const KEEPALIVED_CONF: &str = "/etc/keepalived/keepalived.conf";
/// The NTP servers from cluster.yaml.
pub const TIMESYNCD_CONF: &str = "/etc/systemd/timesyncd.conf.d/kubexm.conf";
