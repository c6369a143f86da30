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
    let cfg = haproxy_cfg(cluster, topo, "the local API proxy (endpoint mode D)", "127.0.0.1:6443")?;
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
