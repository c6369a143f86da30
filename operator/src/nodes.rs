//! The nodes part of a Cluster's status, read from the cluster itself: each
//! Kubernetes node of the applied spec with its roles, its kubelet's
//! version and whether it is Ready, and the Ready condition they make.

use k8s_openapi::api::core::v1::Node;
use kubexm_bom::config::Cluster;
use kubexm_crd::{ConditionStatus, ConditionType, NodeStatus};

use crate::decide::Set;

/// Each control-plane node and worker of `cluster` (spec order, once) as
/// `nodes` (the API server's Node objects) show it; a host without a Node
/// object is listed not ready, without a version.
pub fn node_statuses(cluster: &Cluster, nodes: &[Node]) -> Vec<NodeStatus> {
    let g = &cluster.spec.role_groups;
    cluster
        .spec
        .hosts
        .iter()
        .filter(|h| g.control_plane.contains(&h.name) || g.worker.contains(&h.name))
        .map(|h| {
            let node = nodes.iter().find(|n| n.metadata.name.as_deref() == Some(h.name.as_str()));
            let status = node.and_then(|n| n.status.as_ref());
            NodeStatus {
                name: h.name.clone(),
                roles: cluster.roles_of(&h.name),
                kubelet_version: status.and_then(|s| s.node_info.as_ref()).map(|i| i.kubelet_version.clone()),
                ready: status
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
            }
        })
        .collect()
}

/// The Ready condition `nodes` make.
pub fn ready(nodes: &[NodeStatus]) -> Set {
    let not: Vec<&str> = nodes.iter().filter(|n| !n.ready).map(|n| n.name.as_str()).collect();
    if nodes.is_empty() {
        Set {
            type_: ConditionType::Ready,
            status: ConditionStatus::False,
            reason: "NoNodes".into(),
            message: "the applied spec names no control-plane node or worker".into(),
        }
    } else if not.is_empty() {
        Set {
            type_: ConditionType::Ready,
            status: ConditionStatus::True,
            reason: "NodesReady".into(),
            message: format!("every node Ready ({}), as the controller last read them", nodes.len()),
        }
    } else {
        Set {
            type_: ConditionType::Ready,
            status: ConditionStatus::False,
            reason: "NodesNotReady".into(),
            message: format!(
                "not Ready: {} (look at `kubectl describe node {}`)",
                not.join(", "),
                not.first().copied().unwrap_or_default()
            ),
        }
    }
}
