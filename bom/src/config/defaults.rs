//! Every default of cluster.yaml, in one place.
//!
//! Static defaults are the `Default` impls below; serde fills them in for any
//! section or field the user leaves out. Defaults that depend on other fields
//! or on the catalog (a host inheriting `hostDefaults`, component versions
//! paired with the Kubernetes minor) are filled by [`complete`], which runs
//! once after a config has been read and validated. Serializing a completed
//! `Cluster` back gives the whole effective config.

use std::path::PathBuf;

use super::model::*;
use crate::addons::{network_addon, storage_addon};
use crate::catalog::Catalog;

pub const API_VERSION: &str = "kubexm.io/v1alpha1";
pub const KIND: &str = "Cluster";
pub const SSH_PORT: u16 = 22;
pub const SSH_USER: &str = "root";

impl Default for ControlPlaneEndpoint {
    fn default() -> Self {
        Self {
            mode: EndpointMode::default(),
            domain: "lb.kubexm.local".into(),
            address: None,
            port: 6443,
            interface: None,
            virtual_router_id: 51,
        }
    }
}

impl Default for Etcd {
    fn default() -> Self {
        Self {
            mode: EtcdMode::default(),
            version: None,
            data_dir: PathBuf::from("/var/lib/etcd"),
            external: None,
            backup: None,
        }
    }
}

impl Default for Kubernetes {
    fn default() -> Self {
        Self {
            version: String::new(),
            deploy_mode: DeployMode::default(),
            service_cidr: "10.96.0.0/12".into(),
            pod_cidr: "10.244.0.0/16".into(),
            node_cidr: None,
            dns_domain: "cluster.local".into(),
            proxy_mode: ProxyMode::default(),
            kubelet: Default::default(),
            kube_proxy: Default::default(),
            kubeadm: Default::default(),
            wait_for_workers: None,
        }
    }
}

impl Default for ContainerRuntime {
    fn default() -> Self {
        Self {
            restrict_oom_score_adj: false,
            kind: RuntimeKind::default(),
            version: None,
            data_root: PathBuf::from("/var/lib/containerd"),
            registry_mirrors: Default::default(),
            insecure_registries: Vec::new(),
            auths: Vec::new(),
        }
    }
}

impl Default for Dns {
    fn default() -> Self {
        Self {
            coredns: Toggle {
                enabled: true,
                version: None,
            },
            nodelocaldns: NodeLocalDns::default(),
        }
    }
}

impl Default for NodeLocalDns {
    fn default() -> Self {
        Self {
            enabled: false,
            version: None,
            ip: "169.254.25.10".into(),
        }
    }
}

impl Default for Storage {
    fn default() -> Self {
        Self {
            provider: StorageProvider::default(),
            version: None,
            base_path: PathBuf::from("/var/openebs/local"),
            default_class: true,
        }
    }
}

impl Default for Registry {
    fn default() -> Self {
        Self {
            mode: RegistryMode::default(),
            port: 5000,
            address: None,
            prefix: None,
            username: None,
            password: None,
            ca_file: None,
            insecure: false,
            flatten: false,
            client_auth: false,
        }
    }
}

impl Default for Preflight {
    fn default() -> Self {
        Self {
            leftovers: LeftoverPolicy::default(),
            max_clock_skew_seconds: 5,
        }
    }
}

impl Default for BundleSpec {
    fn default() -> Self {
        Self {
            arches: vec!["amd64".into(), "arm64".into()],
            extra_images: Vec::new(),
            charts: Vec::new(),
            files: Vec::new(),
            os_packages: None,
            mirrors: Default::default(),
        }
    }
}

/// Fills the defaults that depend on other fields or on the catalog.
///
/// Runs on a config that passed validation, so every version it looks up
/// exists in the catalog; anything it cannot fill stays as the user wrote it.
/// Without a catalog only the host and role defaults are filled.
pub fn complete(cluster: &mut Cluster, catalog: Option<&Catalog>) {
    let spec = &mut cluster.spec;
    let d = spec.host_defaults.clone();
    for host in &mut spec.hosts {
        host.internal_address.get_or_insert_with(|| host.address.clone());
        host.port = host.port.or(d.port).or(Some(SSH_PORT));
        if host.user.is_none() {
            host.user = Some(d.user.clone().unwrap_or_else(|| SSH_USER.into()));
        }
        if host.auth.is_none() {
            host.auth = d.auth.clone();
        }
        if host.bastion.is_none() {
            host.bastion = d.bastion.clone();
        }
        if let Some(b) = &mut host.bastion {
            b.port = b.port.or(Some(SSH_PORT));
            if b.user.is_none() {
                b.user = host.user.clone();
            }
            // A key or the agent proves who the user is without leaving
            // this machine; a password (or a named credential, which may be
            // one) is never sent to a bastion: config/bastion.rs refuses it.
            if b.auth.is_none() && host.auth.as_ref().is_some_and(|a| !sends_secret(a)) {
                b.auth = host.auth.clone();
            }
        }
    }
    if spec.registry.mode == RegistryMode::Local && spec.role_groups.registry.is_empty() {
        spec.role_groups.registry = spec.role_groups.control_plane.iter().take(1).cloned().collect();
    }
    let Some(catalog) = catalog else { return };
    if spec.kubernetes.version.is_empty() {
        spec.kubernetes.version = catalog.default_kubernetes().to_string();
    }
    let version = spec.kubernetes.version.clone();
    let pair = |component: &str| catalog.paired_version(&version, component);
    if spec.etcd.mode == EtcdMode::Binary && spec.etcd.version.is_none() {
        spec.etcd.version = pair("etcd");
    }
    if spec.container_runtime.version.is_none() {
        spec.container_runtime.version = pair("containerd");
    }
    let addon = |name: &str| catalog.addon(name).map(|a| a.default.clone());
    if spec.network.version.is_none() {
        spec.network.version = addon(network_addon(spec.network.plugin));
    }
    if spec.network.multus.enabled && spec.network.multus.version.is_none() {
        spec.network.multus.version = addon("multus");
    }
    if spec.dns.nodelocaldns.enabled && spec.dns.nodelocaldns.version.is_none() {
        spec.dns.nodelocaldns.version = addon("nodelocaldns");
    }
    if spec.load_balancer_service.metallb.enabled && spec.load_balancer_service.metallb.version.is_none() {
        spec.load_balancer_service.metallb.version = addon("metallb");
    }
    if let Some(name) = storage_addon(spec.storage.provider)
        && spec.storage.version.is_none()
    {
        spec.storage.version = addon(name);
    }
}

/// Whether logging in with `a` hands a secret to the other side (a
/// password, or a named credential that may be one).
pub fn sends_secret(a: &super::model::Auth) -> bool {
    a.password.is_some() || a.credential.is_some()
}
