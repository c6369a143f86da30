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

/// The loadbalancers' haproxy config.
pub fn config(cluster: &Cluster, topo: &Topology) -> anyhow::Result<String> {
    let e = &cluster.spec.control_plane_endpoint;
    let vip = e.address.as_deref().unwrap_or_default();
    Ok(haproxy_cfg(
        cluster,
        topo,
        &format!("the control-plane endpoint {vip}:{}", e.port),
        &format!("*:{}", e.port),
    )?)
}

/// haproxy and keepalived on each loadbalancer host.
pub fn tasks(cluster: &Cluster, topo: &Topology) -> anyhow::Result<Vec<Task>> {
    let e = &cluster.spec.control_plane_endpoint;
    let g = &cluster.spec.role_groups;
    let mut tasks = Vec::new();
    let vip = e.address.clone().ok_or_else(|| {
        crate::DeployError::Config("controlPlaneEndpoint.address (the VIP) is required in mode haproxy-keepalived".into())
    })?;
    let cfg = config(cluster, topo)?;
    for (n, lb) in g.loadbalancer.iter().enumerate() {
        let addr = topo.address(lb);
        let peers: Vec<String> = g
            .loadbalancer
            .iter()
            .filter(|p| *p != lb)
            .map(|p| format!("        {}", topo.address(p)))
            .collect();
        let (conf, render) = keepalived_conf(
            &[
                ("NAME", lb),
                ("VIP", &vip),
                ("ROUTER_ID", &e.virtual_router_id.to_string()),
                ("PRIORITY", &(150u32.saturating_sub(10 * n as u32).max(60)).to_string()),
                ("ADDRESS", addr),
                ("PEERS", &peers.join("\n")),
            ],
            e.interface.as_deref(),
            &vip,
        )?;
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

/// keepalived.conf from `values`, and the shell that prints it on the host:
/// with the interface configured (a name checked at validation) it is
/// filled here and the file printed as it is; otherwise the host finds the
/// interface routing to the VIP, checks it is a plain interface name, and
/// only then fills it in with sed (no value from the config reaches sed).
fn keepalived_conf(values: &[(&str, &str)], interface: Option<&str>, vip: &str) -> anyhow::Result<(String, String)> {
    if let Some(iface) = interface {
        let mut all = values.to_vec();
        all.push(("INTERFACE", iface));
        return Ok((render("keepalived.conf", KEEPALIVED, &all, &[])?, format!("cat {KEEPALIVED_IN}")));
    }
    let conf = render("keepalived.conf", KEEPALIVED, values, &["INTERFACE"])?;
    let missing = q(&format!("no interface routes to the VIP {vip}; set controlPlaneEndpoint.interface"));
    let route = format!("ip -o -4 route get {}", q(vip));
    let shell = format!(
        "iface=\"$({route} | sed -n 's/.* dev \\([^ ]*\\).*/\\1/p')\"; \
         case \"$iface\" in ''|*[!A-Za-z0-9._-]*) echo {missing} >&2; exit 1;; esac; \
         sed \"s/{{{{INTERFACE}}}}/$iface/g\" {KEEPALIVED_IN}"
    );
    Ok((conf, shell))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 25, item 2: the configured interface went into a sed script
    /// on the host (`x/;e id #` ran a command through GNU sed's `e`). Now
    /// it is filled in here and the host only prints the file.
    #[test]
    fn a_configured_interface_never_reaches_sed() -> anyhow::Result<()> {
        let hostile = "x/;e id>/tmp/p #";
        let values = [
            ("NAME", "lb1"),
            ("VIP", "10.0.0.100"),
            ("ROUTER_ID", "51"),
            ("PRIORITY", "150"),
            ("ADDRESS", "10.0.0.5"),
            ("PEERS", ""),
        ];
        let (conf, shell) = keepalived_conf(&values, Some(hostile), "10.0.0.100")?;
        assert!(!shell.contains(hostile) && !shell.contains("sed"), "{shell}");
        assert!(conf.contains(&format!("interface {hostile}")), "{conf}");
        // Discovered on the host: the name is checked before sed sees it.
        let (conf, found) = keepalived_conf(&values, None, "10.0.0.100")?;
        assert!(
            conf.contains("interface {{INTERFACE}}") && found.contains("*[!A-Za-z0-9._-]*"),
            "{found}"
        );
        Ok(())
    }
}
