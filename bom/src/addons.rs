//! The addons a config turns on, and the catalog names of the network
//! plugin and storage provider it picks: one place that the catalog, the
//! topology, defaults and validation all read (none of them reads another
//! for it, so the crate has no loop).

use crate::config::model::{NetworkPlugin, Spec, StorageProvider};

/// Where an addon is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddonPhase {
    /// The pod network (`cni` phase).
    Cni,
    /// Everything else (`addons` phase).
    Addons,
}

/// One addon a config turns on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnabledAddon {
    /// The catalog's name for it.
    pub name: &'static str,
    /// The version asked for (a completed config fills the catalog default).
    pub version: Option<String>,
    pub phase: AddonPhase,
}

/// The addons `spec` turns on, in install order: the network plugin and
/// multus, then NodeLocalDNS, MetalLB and the storage provider.
pub fn enabled_addons(spec: &Spec) -> Vec<EnabledAddon> {
    let mut out = vec![EnabledAddon {
        name: network_addon(spec.network.plugin),
        version: spec.network.version.clone(),
        phase: AddonPhase::Cni,
    }];
    let toggles = [
        ("multus", spec.network.multus.enabled, &spec.network.multus.version, AddonPhase::Cni),
        (
            "nodelocaldns",
            spec.dns.nodelocaldns.enabled,
            &spec.dns.nodelocaldns.version,
            AddonPhase::Addons,
        ),
        (
            "metallb",
            spec.load_balancer_service.metallb.enabled,
            &spec.load_balancer_service.metallb.version,
            AddonPhase::Addons,
        ),
    ];
    for (name, on, version, phase) in toggles {
        if on {
            out.push(EnabledAddon {
                name,
                version: version.clone(),
                phase,
            });
        }
    }
    if let Some(name) = storage_addon(spec.storage.provider) {
        out.push(EnabledAddon {
            name,
            version: spec.storage.version.clone(),
            phase: AddonPhase::Addons,
        });
    }
    out
}

/// The catalog addon that implements a network plugin.
pub fn network_addon(plugin: NetworkPlugin) -> &'static str {
    match plugin {
        NetworkPlugin::Calico => "calico",
        NetworkPlugin::Flannel => "flannel",
        NetworkPlugin::Cilium => "cilium",
        NetworkPlugin::KubeOvn => "kube-ovn",
        NetworkPlugin::Hybridnet => "hybridnet",
    }
}

/// The catalog addon that implements a storage provider, if any.
pub fn storage_addon(provider: StorageProvider) -> Option<&'static str> {
    match provider {
        StorageProvider::None => None,
        StorageProvider::OpenebsLocalpv => Some("openebs-localpv"),
        StorageProvider::Longhorn => Some("longhorn"),
        StorageProvider::RookCeph => Some("rook-ceph"),
    }
}
