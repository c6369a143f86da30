//! The control-plane endpoint's name on a host: the one `/etc/hosts` line
//! kubexm owns (marked), written by the loadbalancer phase and, in mode D,
//! moved by the control-plane phase once a control-plane node has joined.
//!
//! Mode A: the VIP everywhere. Mode D: 127.0.0.1 on proxied workers (their
//! local haproxy) and each control-plane node's own address; a control-plane
//! node other than the first points at the first one until it has joined,
//! because kubeadm join reads the cluster's config through the endpoint
//! before the node's own API server runs.

use std::sync::Arc;

use kubexm_bom::config::Cluster;
use kubexm_bom::config::model::EndpointMode;
use kubexm_bom::topology::Topology;

use crate::engine::plan::Step;
use crate::engine::steps::Shell;
use crate::engine::transport::shell_quote as q;

/// The marker on the `/etc/hosts` line kubexm owns.
pub const HOSTS_MARK: &str = "# kubexm control-plane endpoint";

/// The address the endpoint's name resolves to on `host` once installed.
pub fn resolves_to(cluster: &Cluster, topo: &Topology, host: &str) -> String {
    let cp = cluster.spec.role_groups.control_plane.iter().any(|c| c == host);
    match cluster.spec.control_plane_endpoint.mode {
        EndpointMode::LocalProxy if cp => topo.address(host).to_string(),
        EndpointMode::LocalProxy => "127.0.0.1".into(),
        _ => topo.endpoint_address.clone(),
    }
}

/// Where the name points on `host` while it joins, when that differs
/// (mode D, a control-plane node other than the first).
pub fn while_joining(cluster: &Cluster, topo: &Topology, host: &str) -> Option<String> {
    let cp = cluster.spec.role_groups.control_plane.iter().any(|c| c == host);
    (cluster.spec.control_plane_endpoint.mode == EndpointMode::LocalProxy && cp && host != topo.first_control_plane)
        .then(|| topo.address(&topo.first_control_plane).to_string())
}

/// The `/etc/hosts` line for `address`.
pub fn line(cluster: &Cluster, address: &str) -> String {
    format!("{address} {} {HOSTS_MARK}", cluster.spec.control_plane_endpoint.domain)
}

/// A step making `line` kubexm's endpoint line. With `keep_any`, an
/// endpoint line already there (of any address) is left alone.
pub fn step(name: &str, line: &str, keep_any: bool) -> Arc<dyn Step> {
    let check = if keep_any {
        format!("grep -qF {} /etc/hosts", q(HOSTS_MARK))
    } else {
        format!("grep -qxF {} /etc/hosts", q(line))
    };
    with_check(name, line, &check)
}

/// A step pointing the name at `line` (the first control-plane node) before
/// a join, unless `joined` (a shell test) says the node has joined already.
/// A node reset by hand (`kubeadm reset`) keeps a line naming itself, whose
/// API server no longer runs: its join would wait on it forever.
pub fn before_join(name: &str, line: &str, joined: &str) -> Arc<dyn Step> {
    with_check(name, line, &format!("{{ {joined}; }} || grep -qxF {} /etc/hosts", q(line)))
}

fn with_check(name: &str, line: &str, check: &str) -> Arc<dyn Step> {
    Arc::new(Shell::new(
        name,
        Some(check),
        &format!(
            "grep -vF {mark} /etc/hosts > /etc/hosts.kubexm.tmp; echo {line} >> /etc/hosts.kubexm.tmp; cat /etc/hosts.kubexm.tmp > /etc/hosts; rm -f /etc/hosts.kubexm.tmp",
            mark = q(HOSTS_MARK),
            line = q(line)
        ),
    ))
}
