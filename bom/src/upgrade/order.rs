//! The order of one hop, as waves: the hosts of a wave move together, a
//! wave starts when the one before it has ended (the next slice of issue 30
//! runs each action as engine steps with a health gate at the end of each
//! wave). What moves one at a time does so because a quorum or a replica
//! depends on it:
//!
//! 1. the hop's bundle served by the registry beside the old one (the
//!    registry host, local mode; an external registry gets its images
//!    pushed), so that every node can pull either;
//! 2. the hop's images pulled on every node, before anything is cordoned;
//! 3. an etcd snapshot (the restore point): on the first member (binary
//!    mode), through the first control-plane node (stacked); none for an
//!    external etcd;
//! 4. etcd member by member, each healthy before the next (binary mode,
//!    when the hop changes etcd's version);
//! 5. `kubeadm upgrade apply` on the first control-plane node, then
//!    `kubeadm upgrade node` on the others one at a time, each cordoned,
//!    drained, its kubelet (and containerd and runc when the hop changes
//!    them: never on a node that still runs workloads) replaced, Ready and
//!    uncordoned before the next;
//! 6. the workers the same way, in batches of `maxUnavailable` less the
//!    workers already out of service (left alone by `--skip-not-ready`),
//!    at least one;
//! 7. the network plugin's and addons' manifests, then the record.
//!
//! Nodes left alone are in no wave.

use std::fmt;

use super::Hop;
use crate::config::model::{EtcdMode, RegistryMode};
use crate::record::ClusterRecord;

/// What a host does in a wave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// The hop's bundle served by the local registry beside the old one, or
    /// its images pushed to the external registry (from the installer).
    Registry,
    /// Pull the hop's images into containerd.
    PullImages,
    /// Save an etcd snapshot.
    Snapshot,
    /// Replace this etcd member's binaries and restart it; healthy before the next.
    Etcd,
    /// Cordon and drain, `kubeadm upgrade apply VERSION`, the node's kubelet
    /// (and runtime), Ready, uncordon.
    KubeadmApply { runtime: bool },
    /// Cordon and drain, `kubeadm upgrade node`, the node's kubelet (and
    /// runtime), Ready, uncordon.
    KubeadmNode { runtime: bool },
    /// The network plugin's and addons' manifests applied (on the first control-plane node).
    Addons,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let runtime = |r: &bool| if *r { " (+ containerd, runc)" } else { "" };
        match self {
            Action::Registry => f.write_str("the hop's bundle on the registry"),
            Action::PullImages => f.write_str("pull images"),
            Action::Snapshot => f.write_str("etcd snapshot"),
            Action::Etcd => f.write_str("etcd"),
            Action::KubeadmApply { runtime: r } => write!(f, "kubeadm upgrade apply{}", runtime(r)),
            Action::KubeadmNode { runtime: r } => write!(f, "kubeadm upgrade node{}", runtime(r)),
            Action::Addons => f.write_str("addons"),
        }
    }
}

/// Hosts that move together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wave {
    pub action: Action,
    pub hosts: Vec<String>,
}

/// The waves of `hop` on `record`'s cluster, workers `max_unavailable` at a
/// time less those `skipped` (at least 1), leaving out `skipped`.
pub fn waves(record: &ClusterRecord, hop: &Hop, max_unavailable: usize, skipped: &[String]) -> Vec<Wave> {
    let spec = &record.config.spec;
    let g = &spec.role_groups;
    let kept = |h: &&String| !skipped.contains(*h);
    let cp: Vec<String> = g.control_plane.iter().filter(kept).cloned().collect();
    let kubelets: Vec<String> = record
        .members()
        .map(|n| &n.name)
        .filter(|h| g.control_plane.contains(*h) || g.worker.contains(*h))
        .filter(kept)
        .cloned()
        .collect();
    let workers: Vec<String> = kubelets.iter().filter(|h| !cp.contains(*h)).cloned().collect();
    let out_of_service = skipped
        .iter()
        .filter(|h| g.worker.contains(*h) && !g.control_plane.contains(*h))
        .count();
    let batch = max_unavailable.saturating_sub(out_of_service).max(1);
    let one = |action: Action, host: &String| Wave {
        action,
        hosts: vec![host.clone()],
    };
    let mut out = Vec::new();
    match (spec.registry.mode, g.registry.first()) {
        (RegistryMode::Local, Some(host)) => out.push(one(Action::Registry, host)),
        (RegistryMode::External, _) => out.push(Wave {
            action: Action::Registry,
            hosts: vec![],
        }),
        _ => {}
    }
    out.push(Wave {
        action: Action::PullImages,
        hosts: kubelets.clone(),
    });
    match spec.etcd.mode {
        EtcdMode::Binary => {
            if let Some(first) = g.etcd.first() {
                out.push(one(Action::Snapshot, first));
                if hop.change("etcd").is_some() {
                    out.extend(g.etcd.iter().map(|h| one(Action::Etcd, h)));
                }
            }
        }
        // Stacked: kubeadm upgrades etcd with the control plane; the
        // snapshot is taken through the first control-plane node.
        EtcdMode::Kubeadm => {
            if let Some(first) = cp.first() {
                out.push(one(Action::Snapshot, first));
            }
        }
        EtcdMode::External => {}
    }
    let runtime = hop.change("containerd").is_some() || hop.change("runc").is_some();
    for (i, h) in cp.iter().enumerate() {
        let action = if i == 0 {
            Action::KubeadmApply { runtime }
        } else {
            Action::KubeadmNode { runtime }
        };
        out.push(one(action, h));
    }
    for b in workers.chunks(batch) {
        out.push(Wave {
            action: Action::KubeadmNode { runtime },
            hosts: b.to_vec(),
        });
    }
    if let Some(first) = cp.first() {
        out.push(one(Action::Addons, first));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::JobRef;
    use crate::upgrade::Version;

    /// Three control-plane nodes and etcd members, four workers.
    const CLUSTER: &str = "apiVersion: kubexm.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: c\nspec:\n  hosts:\n\
        \x20   - {name: cp1, address: 10.0.0.1, auth: {agent: true}}\n\
        \x20   - {name: cp2, address: 10.0.0.2, auth: {agent: true}}\n\
        \x20   - {name: cp3, address: 10.0.0.3, auth: {agent: true}}\n\
        \x20   - {name: w1, address: 10.0.0.4, auth: {agent: true}}\n\
        \x20   - {name: w2, address: 10.0.0.5, auth: {agent: true}}\n\
        \x20   - {name: w3, address: 10.0.0.6, auth: {agent: true}}\n\
        \x20   - {name: w4, address: 10.0.0.7, auth: {agent: true}}\n\
        \x20 roleGroups: {control-plane: [cp1, cp2, cp3], etcd: [cp1, cp2, cp3], worker: [w1, w2, w3, w4]}\n\
        \x20 controlPlaneEndpoint: {mode: local-proxy}\n\
        \x20 kubernetes: {version: v1.36.3}\n";

    fn record() -> Result<ClusterRecord, Box<dyn std::error::Error>> {
        let cluster = crate::config::load_str_hosts(CLUSTER, "c.yaml")?;
        let job = JobRef {
            id: 1,
            kind: "install".into(),
            status: "succeeded".into(),
            finished: 0,
        };
        Ok(ClusterRecord::new(&cluster, job, None, None, &Default::default()))
    }

    fn hop(changes: &[(&str, &str, &str)]) -> Hop {
        let v = |s: &str| Version::parse(s).unwrap_or_else(|| panic!("{s}"));
        Hop {
            from: v("v1.36.3"),
            to: v("v1.37.2"),
            bundle: 0,
            bundle_name: "k.tar.zst".into(),
            changes: changes
                .iter()
                .map(|(c, a, b)| (c.to_string(), a.to_string(), b.to_string()))
                .collect(),
        }
    }

    fn shown(w: &[Wave]) -> Vec<String> {
        w.iter().map(|w| format!("{}: {}", w.action, w.hosts.join(","))).collect()
    }

    /// Issue 30's order for 3 control-plane nodes, 3 etcd members and 4
    /// workers at maxUnavailable 2: the bundle on the registry, images
    /// everywhere, the snapshot, etcd one member at a time, kubeadm apply
    /// then node one at a time, workers two by two (containerd in each
    /// node's own drain), the addons last.
    #[test]
    fn three_control_plane_nodes_three_members_and_four_workers_two_at_a_time() -> Result<(), Box<dyn std::error::Error>> {
        let r = record()?;
        let h = hop(&[("etcd", "v3.6.8", "v3.6.16"), ("containerd", "1.7.13", "2.3.4")]);
        assert_eq!(
            shown(&waves(&r, &h, 2, &[])),
            [
                "the hop's bundle on the registry: cp1",
                "pull images: cp1,cp2,cp3,w1,w2,w3,w4",
                "etcd snapshot: cp1",
                "etcd: cp1",
                "etcd: cp2",
                "etcd: cp3",
                "kubeadm upgrade apply (+ containerd, runc): cp1",
                "kubeadm upgrade node (+ containerd, runc): cp2",
                "kubeadm upgrade node (+ containerd, runc): cp3",
                "kubeadm upgrade node (+ containerd, runc): w1,w2",
                "kubeadm upgrade node (+ containerd, runc): w3,w4",
                "addons: cp1",
            ]
        );
        // Without an etcd or runtime change, and w3 left alone (out of
        // service already: at 2, one more at a time).
        assert_eq!(
            shown(&waves(&r, &hop(&[]), 2, &["w3".to_string()])),
            [
                "the hop's bundle on the registry: cp1",
                "pull images: cp1,cp2,cp3,w1,w2,w4",
                "etcd snapshot: cp1",
                "kubeadm upgrade apply: cp1",
                "kubeadm upgrade node: cp2",
                "kubeadm upgrade node: cp3",
                "kubeadm upgrade node: w1",
                "kubeadm upgrade node: w2",
                "kubeadm upgrade node: w4",
                "addons: cp1",
            ]
        );
        Ok(())
    }
}
