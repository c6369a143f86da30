//! The `workers` phase: every worker that is not a control-plane node
//! joins, in parallel, after its local proxy (mode D) is up and the first
//! control-plane node answers (not after every control-plane join); its
//! binaries and settings are put in place before that, while the control
//! plane comes up.

use super::control_plane::{init_task, join_task};
use super::{Render, kubeadm, kubelet_running, node_prerequisites};
use crate::context::Context;
use crate::engine::plan::{Module, Scope, Task};
use crate::paths::KUBELET_CONF;
use crate::pipelines::{PREPARE, Phase};

/// The workers phase: every worker that is not a control-plane node joins,
/// after its local proxy (mode D) is up and the first control-plane node's
/// init, its binaries put in place first.
pub fn module(i: &Context) -> anyhow::Result<Module> {
    let k = i.kube()?;
    let g = &i.cluster.spec.role_groups;
    let r = Render::new(i, k);
    let creds = &k.creds;
    let mut tasks = Vec::new();
    for w in g.worker.iter().filter(|w| !g.control_plane.contains(w)) {
        let prepare = format!("{PREPARE}worker-{w}");
        tasks.push(Task {
            name: prepare.clone(),
            hosts: vec![w.clone()],
            steps: node_prerequisites(i, w, false)?,
            after: vec![],
        });
        let mut after = vec![(prepare, Scope::SameHost)];
        if i.has(Phase::ControlPlane) {
            after.push((init_task(&i.topo.first_control_plane), Scope::AllHosts));
        }
        let mut steps = vec![kubeadm(
            "kubeadm-join",
            &format!("test -s {KUBELET_CONF}"),
            r.join(w, false)?,
            "join.yaml",
            "kubeadm join",
            creds,
        )];
        steps.push(kubelet_running());
        tasks.push(Task {
            name: join_task(w),
            hosts: vec![w.clone()],
            steps,
            after,
        });
    }
    Ok(Module {
        name: "workers".into(),
        tasks,
    })
}
