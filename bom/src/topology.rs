//! Facts derived from a completed config that several parts of kubexm need,
//! decided in one place: [`Topology`] (host addresses, the first
//! control-plane node, the registry host, the control-plane endpoint, the
//! cluster DNS address, the enabled addons), computed once; downstream code
//! reads it and never falls back to a default of its own.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

pub use crate::addons::{AddonPhase, EnabledAddon, enabled_addons};
use crate::config::Cluster;
use crate::config::model::EndpointMode;

/// The shape of a completed config, computed once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// Host name → the address the other hosts reach it at
    /// (`internalAddress`, which a completed config always has).
    pub addresses: BTreeMap<String, String>,
    /// Where kubeadm inits, addons are applied and the kubeconfig comes from.
    pub first_control_plane: String,
    /// The registry service hosts pull from (`registry.mode: local`).
    pub registry: Option<RegistryAt>,
    /// `domain:port` of the control-plane endpoint: what kubeadm and every
    /// kubeconfig on the nodes use.
    pub endpoint: String,
    /// The address the endpoint's domain resolves to where it is not a
    /// local proxy: the VIP, else the first control-plane node.
    pub endpoint_address: String,
    /// `https://host:port` the user's machines reach the API servers at.
    pub external_server: String,
    /// The cluster DNS service address: the tenth of the service network.
    pub cluster_dns: String,
    /// The addons the config turns on, in install order.
    pub addons: Vec<EnabledAddon>,
}

/// The registry service: its host and `address:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryAt {
    pub host: String,
    pub address: String,
}

/// Why a topology cannot be computed (a config that skipped validation).
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("roleGroups.control-plane is empty; name at least one host")]
    NoControlPlane,
    #[error("roleGroups names host `{0}`, which is not in spec.hosts")]
    UnknownHost(String),
    #[error("spec.kubernetes.serviceCidr `{0}` is not an IPv4 network")]
    ServiceCidr(String),
}

impl Topology {
    /// The topology of a validated, completed config.
    pub fn of(cluster: &Cluster) -> Result<Topology, TopologyError> {
        let spec = &cluster.spec;
        let addresses: BTreeMap<String, String> = spec
            .hosts
            .iter()
            .map(|h| (h.name.clone(), h.internal_address.clone().unwrap_or_else(|| h.address.clone())))
            .collect();
        let g = &spec.role_groups;
        for h in g
            .etcd
            .iter()
            .chain(&g.control_plane)
            .chain(&g.worker)
            .chain(&g.loadbalancer)
            .chain(&g.registry)
        {
            if !addresses.contains_key(h) {
                return Err(TopologyError::UnknownHost(h.clone()));
            }
        }
        let first = g.control_plane.first().cloned().ok_or(TopologyError::NoControlPlane)?;
        let first_address = addresses[&first].clone();
        let registry = g.registry.first().map(|h| RegistryAt {
            host: h.clone(),
            address: format!("{}:{}", addresses[h], spec.registry.port),
        });
        let e = &spec.control_plane_endpoint;
        let endpoint_address = e.address.clone().unwrap_or_else(|| first_address.clone());
        let external_server = match e.mode {
            EndpointMode::LocalProxy => format!("https://{first_address}:6443"),
            _ => format!("https://{endpoint_address}:{}", e.port),
        };
        let cidr = &spec.kubernetes.service_cidr;
        let base: Ipv4Addr = cidr
            .split('/')
            .next()
            .and_then(|b| b.parse().ok())
            .ok_or_else(|| TopologyError::ServiceCidr(cidr.clone()))?;
        Ok(Topology {
            addresses,
            first_control_plane: first,
            registry,
            endpoint: format!("{}:{}", e.domain, e.port),
            endpoint_address,
            external_server,
            cluster_dns: Ipv4Addr::from(u32::from(base) + 10).to_string(),
            addons: enabled_addons(spec),
        })
    }

    /// The address of `host`, one of the config's hosts ([`Topology::of`]
    /// checked every role names one).
    pub fn address(&self, host: &str) -> &str {
        self.addresses.get(host).map_or("", String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topology_is_computed_once_from_a_completed_config() -> Result<(), Box<dyn std::error::Error>> {
        let text = "apiVersion: kubexm.io/v1alpha1\nkind: Cluster\nmetadata: {name: t}\nspec:\n  hostDefaults: {auth: {agent: true}}\n  hosts:\n    - {name: a, address: 192.0.2.1, internalAddress: 10.0.0.1}\n    - {name: b, address: 10.0.0.2}\n  roleGroups: {etcd: [a], control-plane: [a], worker: [b]}\n  controlPlaneEndpoint: {mode: local-proxy}\n  kubernetes: {version: v1.33.4, serviceCIDR: 10.233.0.0/18}\n";
        let c = crate::config::load_str(text, "t.yaml", &crate::catalog::Catalog::builtin()?)?;
        let t = Topology::of(&c)?;
        assert_eq!(t.address("a"), "10.0.0.1");
        assert_eq!(t.first_control_plane, "a");
        assert_eq!(t.registry.as_ref().map(|r| r.address.as_str()), Some("10.0.0.1:5000"));
        assert_eq!(t.cluster_dns, "10.233.0.10");
        assert_eq!(t.external_server, "https://10.0.0.1:6443");
        assert!(t.endpoint.ends_with(":6443"), "{}", t.endpoint);
        Ok(())
    }
}
