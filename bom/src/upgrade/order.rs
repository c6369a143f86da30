//! The order of one hop, as waves: the hosts of a wave move together, a
//! wave starts when the one before it has ended (the next slice of issue 30
//! runs each action as engine steps with a health gate at the end of each
//! wave). What moves one at a time does so because a quorum or a replica
//! depends on it:
//!
//! 1. the hop's images pulled on every node, before anything is cordoned;
//! 2. an etcd snapshot on the first member (the restore point);
//! 3. etcd member by member, each healthy before the next (binary mode,
//!    when the hop changes etcd's version);
//! 4. `kubeadm upgrade apply` on the first control-plane node, then
//!    `kubeadm upgrade node` on the others one at a time, each drained,
//!    its kubelet replaced and Ready again before the next;
//! 5. the workers in batches of `maxUnavailable` (cordon, drain, `kubeadm
//!    upgrade node`, kubelet, Ready, uncordon);
//! 6. containerd and runc, node by node, when the hop changes them;
//! 7. the network plugin's and addons' manifests, then the record.
//!
//! Nodes left alone (`--skip-not-ready`) are in no wave.

use std::fmt;

use super::Hop;
use crate::config::model::EtcdMode;
use crate::record::ClusterRecord;

/// What a host does in a wave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Pull the hop's images into containerd.
    PullImages,
    /// Save an etcd snapshot.
    Snapshot,
    /// Replace this etcd member's binaries and restart it; healthy before the next.
    Etcd,
    /// `kubeadm upgrade apply VERSION`, then the node's kubelet.
    KubeadmApply,
    /// `kubeadm upgrade node`, then the node's kubelet (cordoned and drained first).
    KubeadmNode,
    /// containerd and runc replaced and restarted (cordoned and drained first).
    Runtime,
    /// The network plugin's and addons' manifests applied (on the first control-plane node).
    Addons,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::PullImages => "pull images",
            Action::Snapshot => "etcd snapshot",
            Action::Etcd => "etcd",
            Action::KubeadmApply => "kubeadm upgrade apply",
            Action::KubeadmNode => "kubeadm upgrade node",
            Action::Runtime => "containerd",
            Action::Addons => "addons",
        })
    }
}

/// Hosts that move together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wave {
    pub action: Action,
    pub hosts: Vec<String>,
}

/// The waves of `hop` on `record`'s cluster, workers `max_unavailable` at a
/// time (at least 1), leaving out `skipped`.
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
    let one = |action: Action, host: &String| Wave {
        action,
        hosts: vec![host.clone()],
    };
    let mut out = vec![Wave {
        action: Action::PullImages,
        hosts: kubelets.clone(),
    }];
    let binary_etcd = spec.etcd.mode == EtcdMode::Binary;
    if let Some(first) = g.etcd.first().filter(|_| binary_etcd) {
        out.push(one(Action::Snapshot, first));
        if hop.change("etcd").is_some() {
            out.extend(g.etcd.iter().map(|h| one(Action::Etcd, h)));
        }
    } else if let Some(first) = cp.first().filter(|_| spec.etcd.mode == EtcdMode::Kubeadm) {
        // Stacked etcd: kubeadm upgrades it with the control plane; the
        // snapshot is taken through the first control-plane node.
        out.push(one(Action::Snapshot, first));
    }
    for (i, h) in cp.iter().enumerate() {
        out.push(one(if i == 0 { Action::KubeadmApply } else { Action::KubeadmNode }, h));
    }
    for batch in workers.chunks(max_unavailable.max(1)) {
        out.push(Wave {
            action: Action::KubeadmNode,
            hosts: batch.to_vec(),
        });
    }
    if hop.change("containerd").is_some() || hop.change("runc").is_some() {
        out.extend(kubelets.iter().map(|h| one(Action::Runtime, h)));
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
    /// workers at maxUnavailable 2: images everywhere first, the snapshot,
    /// etcd one member at a time, kubeadm apply then node one at a time,
    /// workers two by two, containerd node by node, the addons last.
    #[test]
    fn three_control_plane_nodes_three_members_and_four_workers_two_at_a_time() -> Result<(), Box<dyn std::error::Error>> {
        let r = record()?;
        let h = hop(&[("etcd", "v3.6.8", "v3.6.16"), ("containerd", "1.7.13", "2.3.4")]);
        assert_eq!(
            shown(&waves(&r, &h, 2, &[])),
            [
                "pull images: cp1,cp2,cp3,w1,w2,w3,w4",
                "etcd snapshot: cp1",
                "etcd: cp1",
                "etcd: cp2",
                "etcd: cp3",
                "kubeadm upgrade apply: cp1",
                "kubeadm upgrade node: cp2",
                "kubeadm upgrade node: cp3",
                "kubeadm upgrade node: w1,w2",
                "kubeadm upgrade node: w3,w4",
                "containerd: cp1",
                "containerd: cp2",
                "containerd: cp3",
                "containerd: w1",
                "containerd: w2",
                "containerd: w3",
                "containerd: w4",
                "addons: cp1",
            ]
        );
        // Without an etcd or runtime change, and w3 left alone, one at a time.
        assert_eq!(
            shown(&waves(&r, &hop(&[]), 0, &["w3".to_string()])),
            [
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
