//! The reset pipeline: every host back to before kubexm (packages stay),
//! one idempotent step per host.

use std::sync::Arc;
use std::time::Duration;

use kubexm_bom::config::Cluster;

use crate::engine::plan::{Module, Pipeline, Step, Task};
use crate::engine::steps::Shell;
use crate::engine::transport::shell_quote as q;
use crate::paths::{ETCD_BIN, ETCD_UNIT, HOST_ETC, HOST_STATE, KUBELET_BIN, KUBELET_UNIT, KUBERNETES_DIR};
use crate::template::render;

const RESET: &str = include_str!("../../../manifests/templates/reset.sh");

/// `reset`: every host back to before kubexm (packages stay).
pub fn pipeline(cluster: &Cluster) -> Result<Pipeline, crate::template::Unfilled> {
    let data = q(&cluster.spec.etcd.data_dir.display().to_string());
    let leftovers = format!(
        "for p in {HOST_ETC} {HOST_STATE} {KUBERNETES_DIR} {containerd} {KUBELET_BIN} {ETCD_BIN} \
         {ETCD_UNIT} {KUBELET_UNIT} {data}; do [ -e \"$p\" ] && exit 1; done; \
         ! grep -q '# kubexm control-plane endpoint' /etc/hosts",
        containerd = "/etc/containerd"
    );
    let mut step = Shell::new("reset", Some(&leftovers), &render("reset.sh", RESET, &[("ETCD_DATA", &data)], &[])?);
    step.timeout = Duration::from_secs(300);
    let step: Arc<dyn Step> = Arc::new(step);
    Ok(Pipeline {
        name: "reset".into(),
        modules: vec![Module {
            name: "reset".into(),
            tasks: vec![Task {
                name: "reset".into(),
                hosts: cluster.spec.hosts.iter().map(|h| h.name.clone()).collect(),
                steps: vec![step],
                after: vec![],
            }],
        }],
    })
}
