//! The control-plane endpoint: how every node reaches the API servers.
//!
//! Mode A (`haproxy-keepalived`): haproxy on the loadbalancer hosts forwards
//! the endpoint port to every control-plane node, and keepalived holds the VIP
//! with unicast VRRP peers (no multicast needed on the network). Mode D
//! (`local-proxy`): every worker that is not a control-plane node runs haproxy
//! on 127.0.0.1 towards all API servers, started before it joins. In both the
//! endpoint's name (`controlPlaneEndpoint.domain`) resolves through
//! `/etc/hosts` on every node: to the VIP (A), or to 127.0.0.1 on proxied
//! workers and the node's own address on control-plane nodes (D).

use std::sync::Arc;

use kubexm_bom::config::Cluster;
use kubexm_bom::config::model::EndpointMode;
use kubexm_bom::topology::Topology;

use crate::context::Context;
use crate::endpoint_name;
use crate::engine::files::PutFiles;
use crate::engine::plan::{Module, Step, Task};
use crate::engine::steps::Shell;
use crate::paths::HAPROXY_CFG;
use crate::template::render;

mod haproxy_keepalived;
pub(crate) mod local_proxy;

const HAPROXY: &str = include_str!("../../../../manifests/templates/haproxy.cfg");

/// What preflight refuses about the endpoint.
pub fn preflight(cluster: &Cluster) -> Vec<String> {
    let e = &cluster.spec.control_plane_endpoint;
    let g = &cluster.spec.role_groups;
    let mut out = Vec::new();
    if e.mode == EndpointMode::HaproxyKeepalived && e.port == 6443 {
        for lb in g.loadbalancer.iter().filter(|l| g.control_plane.contains(l)) {
            out.push(format!(
                "{lb}: is a loadbalancer and a control-plane node, so haproxy and the API server would both bind port 6443; \
                 set controlPlaneEndpoint.port to another port or use separate loadbalancer hosts"
            ));
        }
    }
    if e.mode == EndpointMode::LocalProxy && e.port != 6443 {
        out.push(format!(
            "controlPlaneEndpoint.port is {} but mode local-proxy serves 127.0.0.1:6443 on workers and the API servers' own port on control-plane nodes; leave the port at 6443",
            e.port
        ));
    }
    out
}

pub(super) fn haproxy_cfg(cluster: &Cluster, topo: &Topology, purpose: &str, bind: &str) -> Result<String, crate::template::Unfilled> {
    let servers: Vec<String> = cluster
        .spec
        .role_groups
        .control_plane
        .iter()
        .map(|c| format!("    server {c} {}:6443", topo.address(c)))
        .collect();
    render(
        "haproxy.cfg",
        HAPROXY,
        &[("PURPOSE", purpose), ("BIND", bind), ("SERVERS", &servers.join("\n"))],
        &[],
    )
}

/// A step that fails, naming what to do, when `program` is not on the host
/// (the bundle's OS packages install it in the os-packages phase).
pub(super) fn installed(program: &str) -> Arc<dyn Step> {
    Arc::new(Shell::new(
        &format!("{program}-installed"),
        Some(&format!("command -v {program} >/dev/null")),
        &format!(
            "echo \"{program} is not installed on $(hostname): add bundle.osPackages to cluster.yaml so the bundle carries it \
             (the os-packages phase installs it), or install {program} on the host\" >&2; exit 1"
        ),
    ))
}

pub(super) fn haproxy_steps(cfg: String) -> Vec<Arc<dyn Step>> {
    vec![
        installed("haproxy"),
        Arc::new(PutFiles {
            name: "haproxy-config".into(),
            files: vec![(HAPROXY_CFG.into(), cfg.into_bytes(), 0o644)],
            then: Some(format!(
                "haproxy -c -q -f {HAPROXY_CFG} && systemctl enable -q haproxy && systemctl reload-or-restart haproxy"
            )),
        }),
        Arc::new(Shell::new(
            "haproxy-running",
            Some("systemctl is-active -q haproxy"),
            "systemctl restart haproxy && systemctl is-active -q haproxy",
        )),
    ]
}

/// The hosts whose haproxy forwards to the control-plane nodes: the
/// loadbalancer hosts (mode A), the proxied workers (mode D).
pub fn proxy_hosts(cluster: &Cluster) -> Vec<String> {
    match cluster.spec.control_plane_endpoint.mode {
        EndpointMode::HaproxyKeepalived => cluster.spec.role_groups.loadbalancer.clone(),
        EndpointMode::LocalProxy => cluster.local_proxy_hosts(),
        _ => Vec::new(),
    }
}

/// The tasks that make every load balancer (mode A) or local proxy (mode
/// D) of `cluster` forward to its control-plane nodes, and nothing else:
/// after control-plane nodes leave (haproxy reloads a changed config).
pub fn backends(cluster: &Cluster, topo: &Topology) -> anyhow::Result<Vec<Task>> {
    let cfg = match cluster.spec.control_plane_endpoint.mode {
        EndpointMode::HaproxyKeepalived => haproxy_keepalived::config(cluster, topo)?,
        EndpointMode::LocalProxy => local_proxy::config(cluster, topo)?,
        other => return Err(crate::DeployError::NotSupported(format!("control-plane endpoint mode {other:?}")).into()),
    };
    Ok(proxy_hosts(cluster)
        .into_iter()
        .map(|h| Task {
            name: format!("haproxy-backends-{h}"),
            hosts: vec![h],
            steps: haproxy_steps(cfg.clone()),
            after: vec![],
        })
        .collect())
}

/// The loadbalancer phase for the configured mode (A or D).
pub fn module(ctx: &Context) -> anyhow::Result<Module> {
    plan(ctx.cluster, &ctx.topo)
}

fn plan(cluster: &Cluster, topo: &Topology) -> anyhow::Result<Module> {
    let e = &cluster.spec.control_plane_endpoint;
    let mut tasks = Vec::new();
    // The endpoint's name on every host (a joining control-plane node in
    // mode D points at the first one; the control-plane phase moves it).
    for h in &cluster.spec.hosts {
        let step = match endpoint_name::while_joining(cluster, topo, &h.name) {
            Some(first) => endpoint_name::step("endpoint-name", &endpoint_name::line(cluster, &first), true),
            None => endpoint_name::step(
                "endpoint-name",
                &endpoint_name::line(cluster, &endpoint_name::resolves_to(cluster, topo, &h.name)),
                false,
            ),
        };
        tasks.push(Task {
            name: format!("endpoint-name-{}", h.name),
            hosts: vec![h.name.clone()],
            steps: vec![step],
            after: vec![],
        });
    }
    match e.mode {
        EndpointMode::HaproxyKeepalived => tasks.extend(haproxy_keepalived::tasks(cluster, topo)?),
        EndpointMode::LocalProxy => tasks.extend(local_proxy::tasks(cluster, topo)?),
        other => return Err(crate::DeployError::NotSupported(format!("control-plane endpoint mode {other:?}")).into()),
    }
    Ok(Module {
        name: "loadbalancer".into(),
        tasks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint_name::resolves_to;

    fn cluster(mode: &str) -> Result<Cluster, Box<dyn std::error::Error>> {
        let vip = if mode == "local-proxy" { "" } else { ", address: 10.0.0.100" };
        let text = format!(
            "apiVersion: kubexm.io/v1alpha1\nkind: Cluster\nmetadata: {{name: t}}\nspec:\n  hostDefaults: {{auth: {{agent: true}}}}\n  hosts:\n    - {{name: a, address: 10.0.0.1}}\n    - {{name: b, address: 10.0.0.2}}\n    - {{name: c, address: 10.0.0.3}}\n    - {{name: d, address: 10.0.0.4}}\n  roleGroups: {{etcd: [a], control-plane: [a, b], worker: [a, b, c, d], loadbalancer: [c, d]}}\n  controlPlaneEndpoint: {{mode: {mode}{vip}}}\n  kubernetes: {{version: v1.33.4}}\n"
        );
        let catalog = kubexm_bom::catalog::Catalog::builtin()?;
        Ok(kubexm_bom::config::load_str(&text, "t.yaml", &catalog)?)
    }

    #[test]
    fn local_proxy_resolves_to_loopback_on_workers_and_self_on_control_plane() -> Result<(), Box<dyn std::error::Error>> {
        let c = cluster("local-proxy")?;
        let t = Topology::of(&c)?;
        assert_eq!(c.local_proxy_hosts(), ["c", "d"]);
        assert_eq!(resolves_to(&c, &t, "c"), "127.0.0.1");
        assert_eq!(resolves_to(&c, &t, "b"), "10.0.0.2");
        // b joins through the first control-plane node, then points at itself.
        assert_eq!(endpoint_name::while_joining(&c, &t, "b").as_deref(), Some("10.0.0.1"));
        assert_eq!(endpoint_name::while_joining(&c, &t, "a"), None);
        assert_eq!(endpoint_name::while_joining(&c, &t, "c"), None);
        let cfg = haproxy_cfg(&c, &t, "x", "127.0.0.1:6443")?;
        assert!(
            cfg.contains("server a 10.0.0.1:6443") && cfg.contains("server b 10.0.0.2:6443"),
            "{cfg}"
        );
        let m = plan(&c, &t)?;
        assert_eq!(m.tasks.iter().filter(|t| t.name.starts_with("local-proxy-")).count(), 2);
        Ok(())
    }

    #[test]
    fn mode_a_uses_the_vip_and_unicast_peers() -> Result<(), Box<dyn std::error::Error>> {
        let c = cluster("haproxy-keepalived")?;
        let t = Topology::of(&c)?;
        assert_eq!(resolves_to(&c, &t, "a"), "10.0.0.100");
        assert_eq!(t.external_server, "https://10.0.0.100:6443");
        let m = plan(&c, &t)?;
        assert_eq!(m.tasks.iter().filter(|t| t.name.starts_with("loadbalancer-")).count(), 2);
        assert!(preflight(&c).is_empty());
        // b leaves the control plane: the loadbalancers forward to a only.
        let mut without = c.clone();
        without.spec.role_groups.control_plane.retain(|h| h != "b");
        let tasks = backends(&without, &t)?;
        let hosts: Vec<&str> = tasks.iter().flat_map(|t| t.hosts.iter().map(String::as_str)).collect();
        assert_eq!(hosts, ["c", "d"]);
        let cfg = haproxy_keepalived::config(&without, &t)?;
        assert!(
            cfg.contains("server a 10.0.0.1:6443") && !cfg.contains("server b ") && cfg.contains("bind *:6443"),
            "{cfg}"
        );
        Ok(())
    }
}
