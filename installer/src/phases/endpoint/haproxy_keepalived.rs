//! Mode A (`haproxy-keepalived`): haproxy on the loadbalancer hosts forwards
//! the endpoint port to every control-plane node, and keepalived holds the
//! VIP with unicast VRRP peers (no multicast needed on the network).

use std::sync::Arc;

use kubexm_bom::config::Cluster;
use kubexm_bom::topology::Topology;

use super::{haproxy_cfg, haproxy_steps};
use crate::engine::files::PutFiles;
use crate::engine::plan::Task;
use crate::engine::steps::Shell;
use crate::engine::transport::shell_quote as q;
use crate::paths::KEEPALIVED_CONF;
use crate::paths::KEEPALIVED_IN;
use crate::template::render;

const KEEPALIVED: &str = include_str!("../../../../manifests/templates/keepalived.conf");

/// haproxy and keepalived on each loadbalancer host.
pub fn tasks(cluster: &Cluster, topo: &Topology) -> anyhow::Result<Vec<Task>> {
    let e = &cluster.spec.control_plane_endpoint;
    let g = &cluster.spec.role_groups;
    let mut tasks = Vec::new();
    let vip = e.address.clone().ok_or_else(|| {
        crate::DeployError::Config("controlPlaneEndpoint.address (the VIP) is required in mode haproxy-keepalived".into())
    })?;
    let cfg = haproxy_cfg(
        cluster,
        topo,
        &format!("the control-plane endpoint {vip}:{}", e.port),
        &format!("*:{}", e.port),
    )?;
    for (n, lb) in g.loadbalancer.iter().enumerate() {
        let addr = topo.address(lb);
        let peers: Vec<String> = g
            .loadbalancer
            .iter()
            .filter(|p| *p != lb)
            .map(|p| format!("        {}", topo.address(p)))
            .collect();
        // The interface is found on the host (sed below).
        let conf = render(
            "keepalived.conf",
            KEEPALIVED,
            &[
                ("NAME", lb),
                ("VIP", &vip),
                ("ROUTER_ID", &e.virtual_router_id.to_string()),
                ("PRIORITY", &(150u32.saturating_sub(10 * n as u32).max(60)).to_string()),
                ("ADDRESS", addr),
                ("PEERS", &peers.join("\n")),
            ],
            &["INTERFACE"],
        )?;
        let iface = match &e.interface {
            Some(i) => q(i),
            None => format!("\"$(ip -o -4 route get {vip} | sed -n 's/.* dev \\([^ ]*\\).*/\\1/p')\""),
        };
        let render = format!(
            "iface={iface}; [ -n \"$iface\" ] || {{ echo 'no interface routes to the VIP {vip}; set controlPlaneEndpoint.interface' >&2; exit 1; }}; \
             sed \"s/{{{{INTERFACE}}}}/$iface/g\" {KEEPALIVED_IN}"
        );
        let mut steps = haproxy_steps(cfg.clone());
        steps.push(super::installed("keepalived"));
        steps.push(Arc::new(PutFiles {
            name: "keepalived-template".into(),
            files: vec![(KEEPALIVED_IN.into(), conf.into_bytes(), 0o644)],
            then: None,
        }));
        steps.push(Arc::new(Shell::new(
            "keepalived",
            Some(&format!(
                "{render} | cmp -s - {KEEPALIVED_CONF} && systemctl is-active -q keepalived"
            )),
            &format!(
                "set -e; mkdir -p \"$(dirname {KEEPALIVED_CONF})\"; {render} > {KEEPALIVED_CONF}.tmp; \
                 mv -f {KEEPALIVED_CONF}.tmp {KEEPALIVED_CONF}; \
                 systemctl enable -q keepalived; systemctl restart keepalived; sleep 1; systemctl is-active -q keepalived"
            ),
        )));
        tasks.push(Task {
            name: format!("loadbalancer-{lb}"),
            hosts: vec![lb.clone()],
            steps,
            after: vec![],
        });
    }
    Ok(tasks)
}
