//! The `workers` phase: every worker that is not a control-plane node
//! joins, in parallel, after its local proxy (mode D) is up.

use super::{Render, kubeadm, kubelet_running, node_prerequisites};
use crate::context::Context;
use crate::engine::plan::{Module, Task};
use crate::paths::KUBELET_CONF;

/// The workers phase: every worker that is not a control-plane node joins,
/// after its local proxy (mode D) is up.
pub fn module(i: &Context) -> anyhow::Result<Module> {
    let k = i.kube()?;
    let g = &i.cluster.spec.role_groups;
    let r = Render::new(i, k);
    let creds = &k.creds;
    let mut tasks = Vec::new();
    for w in g.worker.iter().filter(|w| !g.control_plane.contains(w)) {
        let mut steps = node_prerequisites(i, w, false)?;
        steps.push(kubeadm(
            "kubeadm-join",
            &format!("test -s {KUBELET_CONF}"),
            r.join(w, false)?,
            "join.yaml",
            "kubeadm join",
            creds,
        ));
        steps.push(kubelet_running());
        tasks.push(Task {
            name: format!("kubeadm-join-{w}"),
            hosts: vec![w.clone()],
            steps,
            after: vec![],
        });
    }
    Ok(Module {
        name: "workers".into(),
        tasks,
    })
}
