//! Mode D (`local-proxy`): every worker that is not a control-plane node
//! runs haproxy on 127.0.0.1:6443 towards all API servers, started before
//! it joins.

use kubexm_bom::config::Cluster;
use kubexm_bom::topology::Topology;

use super::{haproxy_cfg, haproxy_steps};
use crate::engine::plan::Task;

/// haproxy on 127.0.0.1 on each proxied worker.
pub fn tasks(cluster: &Cluster, topo: &Topology) -> anyhow::Result<Vec<Task>> {
    let mut tasks = Vec::new();
    let cfg = config(cluster, topo)?;
    for w in cluster.local_proxy_hosts() {
        tasks.push(Task {
            name: format!("local-proxy-{w}"),
            hosts: vec![w.clone()],
            steps: haproxy_steps(cfg.clone()),
            after: vec![],
        });
    }
    Ok(tasks)
}

/// The local proxy's haproxy config.
pub fn config(cluster: &Cluster, topo: &Topology) -> Result<String, crate::template::Unfilled> {
    haproxy_cfg(cluster, topo, "the local API proxy (endpoint mode D)", "127.0.0.1:6443")
}
