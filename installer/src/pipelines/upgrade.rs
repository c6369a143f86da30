//! The upgrade pipeline: one hop ([`kubexm_bom::upgrade::Hop`]) as engine
//! tasks, wave after wave in the order [`kubexm_bom::upgrade::order`] gives
//! (every task of a wave waits for every task of the wave before it):
//!
//! - the registry serving the hop's bundle with the old one below it;
//! - on every node, the hop's new images pulled through containerd's
//!   `hosts.toml` (nothing is cordoned before every node has them);
//! - each etcd member's new binaries, restarted, the cluster healthy before
//!   the next (when the hop changes etcd);
//! - each node ([`crate::phases::kubeadm::upgrade`]): kubeadm, cordon and
//!   drain, kubelet (and containerd, runc and their config when they
//!   change), Ready and uncordoned; control-plane nodes one at a time, then
//!   workers in batches;
//! - the network plugin's and the addons' manifests (the install's cni and
//!   addons phases with the hop's bundle), and the registry serving the
//!   hop's bundle alone;
//! - last, the Cluster object and its status at the hop's version (the
//!   install's operator phase; the nodes no wave upgraded, left alone by
//!   `--skip-not-ready`, are listed as not checked).
//!
//! The etcd snapshot is taken before this pipeline, by its own job
//! ([`crate::ops::upgrade`]).

use std::sync::Arc;

use kubexm_bom::upgrade::Hop;
use kubexm_bom::upgrade::order::{Action, Wave};

use crate::context::{Context, install_component};
use crate::engine::plan::{Module, Pipeline, Scope, Step, Task};
use crate::engine::steps::Shell;
use crate::engine::transport::shell_quote as q;
use crate::paths::CONTAINERD_CERTS_D;
use crate::phases;
use crate::phases::kubeadm::upgrade as node;

/// Images only control-plane nodes run (kubeadm's static pods).
const CONTROL_PLANE_IMAGES: &[&str] = &["/kube-apiserver", "/kube-controller-manager", "/kube-scheduler", "/etcd"];

/// What a hop's pipeline is built from, besides the hop bundle's context.
#[derive(Debug, Clone)]
pub struct HopRun {
    pub hop: Hop,
    pub waves: Vec<Wave>,
    /// The images the cluster runs now (the record's): no pull needed.
    pub old_images: std::collections::BTreeSet<String>,
    /// The directory names of the bundles the registry serves below the
    /// hop's (the old one's, the sha256 of its `bundle.yaml`).
    pub older: Vec<String>,
    /// Each drain's time limit in seconds (`--drain-timeout`); `None`:
    /// the config's `spec.upgrade.drainTimeoutSeconds`.
    pub drain_timeout: Option<u32>,
}

/// The hop's pipeline, on the context of the hop's bundle.
pub fn pipeline(i: &Context, run: &HopRun) -> anyhow::Result<Pipeline> {
    let HopRun {
        hop,
        waves,
        old_images,
        older,
        drain_timeout,
    } = run;
    let version = i.cluster.spec.kubernetes.version.clone();
    let first = i.topo.first_control_plane.clone();
    let drain_timeout = drain_timeout.unwrap_or(i.cluster.spec.upgrade.drain_timeout_seconds);
    let mut modules: Vec<Module> = Vec::new();
    // What the next wave waits for: every task of the wave before.
    let mut previous: Vec<(String, Scope)> = Vec::new();
    let push = |modules: &mut Vec<Module>, name: &str, mut tasks: Vec<Task>, previous: &mut Vec<(String, Scope)>| {
        let names: Vec<String> = tasks.iter().map(|t| t.name.clone()).collect();
        for t in &mut tasks {
            // Tasks of the same wave that name each other keep that order.
            t.after.extend(previous.iter().cloned());
        }
        if !tasks.is_empty() {
            *previous = names.into_iter().map(|n| (n, Scope::AllHosts)).collect();
            modules.push(Module { name: name.into(), tasks });
        }
    };
    let runtime = hop.change("containerd").is_some() || hop.change("runc").is_some();
    let containerd = if runtime { Some(phases::containerd::module(i)?) } else { None };
    for (n, w) in waves.iter().enumerate() {
        match &w.action {
            Action::Registry => {
                if w.hosts.is_empty() {
                    return Err(crate::DeployError::NotSupported(
                        "upgrading with registry.mode external (push the hop's bundle with `kubexm-install mirror` first)".into(),
                    )
                    .into());
                }
                let m = phases::registry::serving(i, older)?;
                push(&mut modules, "upgrade-registry", renamed(m.tasks, "upgrade-"), &mut previous);
            }
            Action::PullImages => {
                let tasks = w
                    .hosts
                    .iter()
                    .map(|h| pull_task(i, old_images, h))
                    .collect::<anyhow::Result<Vec<_>>>()?
                    .into_iter()
                    .flatten()
                    .collect();
                push(&mut modules, "upgrade-images", tasks, &mut previous);
            }
            // Taken before the pipeline, by its own job.
            Action::Snapshot => {}
            Action::Etcd => {
                let members = &i.cluster.spec.role_groups.etcd;
                let mut tasks = Vec::new();
                for h in &w.hosts {
                    let mut steps = install_component(i.bundle_file(h, "etcd")?, i.bundle_dir, i.file_server);
                    // The cluster keeps a leader: a leading member hands it on first.
                    if let Some(off) = phases::etcd_members::leader_off(&i.topo, h, members)? {
                        steps.push(Arc::new(off));
                    }
                    steps.push(node::restarted("kubexm-etcd"));
                    steps.push(Arc::new(phases::etcd::healthy("etcd-healthy", &i.topo, members)));
                    tasks.push(Task {
                        name: format!("upgrade-etcd-{h}"),
                        hosts: vec![h.clone()],
                        steps,
                        after: vec![],
                    });
                }
                push(&mut modules, &format!("upgrade-etcd-{n}"), tasks, &mut previous);
            }
            Action::KubeadmApply { .. } | Action::KubeadmNode { .. } => {
                let apply = matches!(w.action, Action::KubeadmApply { .. });
                let mut tasks = Vec::new();
                for h in &w.hosts {
                    tasks.extend(node_tasks(i, h, &first, apply, &version, drain_timeout, containerd.as_ref())?);
                }
                push(&mut modules, &format!("upgrade-nodes-{n}"), tasks, &mut previous);
            }
            Action::Addons => {
                // The install's cni and addons phases, with the hop's bundle:
                // what is as it was is skipped.
                let mut addons = phases::addons::cni(i)?;
                addons.tasks.extend(phases::addons::module(i)?.tasks);
                // What they name of the install's other phases is not in this pipeline.
                let own: Vec<String> = addons.tasks.iter().map(|t| t.name.clone()).collect();
                for t in &mut addons.tasks {
                    t.after.retain(|(a, _)| own.contains(a));
                }
                push(&mut modules, "upgrade-addons", addons.tasks, &mut previous);
            }
        }
    }
    // The old bundle is no longer needed: the registry serves the hop's alone.
    if waves.iter().any(|w| w.action == Action::Registry && !w.hosts.is_empty()) && !older.is_empty() {
        let m = phases::registry::module(i)?;
        push(
            &mut modules,
            "upgrade-registry-after",
            renamed(m.tasks, "upgrade-after-"),
            &mut previous,
        );
    }
    // The Cluster object's status at the hop's version, last; the nodes no
    // wave upgrades (left alone by --skip-not-ready) are not called Ready.
    let upgraded: Vec<&String> = waves
        .iter()
        .filter(|w| matches!(w.action, Action::KubeadmApply { .. } | Action::KubeadmNode { .. }))
        .flat_map(|w| &w.hosts)
        .collect();
    let skipped = phases::operator::nodes_where(i.cluster, |n| !upgraded.contains(&n));
    let operator = phases::operator::hop(i, &skipped)?;
    push(&mut modules, "upgrade-operator", renamed(operator.tasks, "upgrade-"), &mut previous);
    Ok(Pipeline {
        name: "upgrade".into(),
        modules,
    })
}

/// `tasks` with `prefix` before their names and the names they wait for.
fn renamed(mut tasks: Vec<Task>, prefix: &str) -> Vec<Task> {
    for t in &mut tasks {
        t.name = format!("{prefix}{}", t.name);
        for (a, _) in &mut t.after {
            *a = format!("{prefix}{a}");
        }
    }
    tasks
}

/// The images of the hop's bundle the cluster did not run (not in `had`)
/// that `host` runs (the control plane's on control-plane nodes only),
/// pulled into containerd's `k8s.io` namespace through its `hosts.toml`
/// (the registry), unless every one is there.
fn pull_task(i: &Context, had: &std::collections::BTreeSet<String>, host: &str) -> anyhow::Result<Option<Task>> {
    let cp = i.cluster.spec.role_groups.control_plane.iter().any(|h| h == host);
    let arch = i.arch_of(host)?;
    let refs: Vec<String> = i
        .bom
        .images
        .iter()
        .filter(|im| im.platforms.is_empty() || im.platforms.iter().any(|p| p.ends_with(arch)))
        // The controller's pods pull theirs when they start.
        .filter(|im| !im.reference.is_controller())
        .map(|im| im.reference.to_string())
        .filter(|r| !had.contains(r))
        .filter(|r| cp || !CONTROL_PLANE_IMAGES.iter().any(|c| r.contains(&format!("{c}:"))))
        .collect();
    if refs.is_empty() {
        return Ok(None);
    }
    let list = refs.iter().map(|r| q(r)).collect::<Vec<_>>().join(" ");
    let have =
        format!("have=$(ctr -n k8s.io images ls -q) && for r in {list}; do printf '%s\\n' \"$have\" | grep -qxF \"$r\" || exit 1; done");
    let mut step = Shell::new(
        "pull-images",
        Some(&have),
        &format!(
            "for r in {list}; do ctr -n k8s.io images pull --hosts-dir {CONTAINERD_CERTS_D} --platform linux/{arch} \"$r\" >/dev/null || \
             {{ echo \"{host}: pulling $r from the registry failed\" >&2; exit 1; }}; echo \"pulled $r\"; done"
        ),
    );
    step.timeout = std::time::Duration::from_secs(900);
    Ok(Some(Task {
        name: format!("upgrade-images-{host}"),
        hosts: vec![host.to_string()],
        steps: vec![Arc::new(step) as Arc<dyn Step>],
        after: vec![],
    }))
}

/// One node's tasks, in order: kubeadm on it, cordon and drain (on
/// `first`), its kubelet (and runtime) on it, Ready and uncordoned (on
/// `first`).
fn node_tasks(
    i: &Context,
    h: &str,
    first: &str,
    apply: bool,
    version: &str,
    drain_timeout: u32,
    containerd: Option<&Module>,
) -> anyhow::Result<Vec<Task>> {
    let names = [
        format!("upgrade-kubeadm-{h}"),
        format!("upgrade-drain-{h}"),
        format!("upgrade-kubelet-{h}"),
        format!("upgrade-uncordon-{h}"),
    ];
    let mut kubelet: Vec<Arc<dyn Step>> = Vec::new();
    if let Some(m) = containerd {
        // Never on a node that still runs workloads: inside its drain.
        if let Some(t) = m.tasks.iter().find(|t| t.name == format!("containerd-{h}")) {
            kubelet.extend(t.steps.iter().cloned());
            kubelet.push(node::restarted("containerd"));
        }
    }
    kubelet.extend(node::kubelet_steps(i, h)?);
    let steps: [(Vec<Arc<dyn Step>>, &str); 4] = [
        (node::kubeadm_steps(i, h, apply)?, h),
        (vec![node::drain(version, h, drain_timeout)], first),
        (kubelet, h),
        (node::uncordon(version, h), first),
    ];
    Ok(steps
        .into_iter()
        .enumerate()
        .map(|(k, (steps, on))| Task {
            name: names[k].clone(),
            hosts: vec![on.to_string()],
            steps,
            after: if k == 0 {
                vec![]
            } else {
                vec![(names[k - 1].clone(), Scope::AllHosts)]
            },
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::fixture::Fixture;
    use kubexm_bom::upgrade::Version;

    /// Three control-plane nodes and etcd members, four workers, two at a time.
    const CLUSTER: &str = "apiVersion: kubexm.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: s\nspec:\n  hosts:\n\
        \x20   - {name: cp1, address: 10.0.0.1, auth: {agent: true}}\n\
        \x20   - {name: cp2, address: 10.0.0.2, auth: {agent: true}}\n\
        \x20   - {name: cp3, address: 10.0.0.3, auth: {agent: true}}\n\
        \x20   - {name: w1, address: 10.0.0.4, auth: {agent: true}}\n\
        \x20   - {name: w2, address: 10.0.0.5, auth: {agent: true}}\n\
        \x20   - {name: w3, address: 10.0.0.6, auth: {agent: true}}\n\
        \x20   - {name: w4, address: 10.0.0.7, auth: {agent: true}}\n\
        \x20 roleGroups: {control-plane: [cp1, cp2, cp3], etcd: [cp1, cp2, cp3], worker: [w1, w2, w3, w4], registry: [cp1]}\n\
        \x20 controlPlaneEndpoint: {mode: local-proxy}\n\
        \x20 upgrade: {maxUnavailable: 2}\n\
        \x20 kubernetes: {version: v1.37.2}\n";

    /// On fake hosts, a hop from v1.36.3 that changes etcd: the registry,
    /// the pulls on every node, etcd member by member, each control-plane
    /// node whole (kubeadm, drain, kubelet, uncordoned) before the next,
    /// then the workers two at a time: a batch's nodes move together, the
    /// next batch waits for both to be uncordoned.
    #[test]
    fn a_hop_runs_etcd_member_by_member_then_each_control_plane_node_then_workers_in_batches() -> anyhow::Result<()> {
        let f = Fixture::installed()?;
        let session = f.session(CLUSTER)?;
        let catalog = kubexm_bom::catalog::Catalog::builtin()?;
        let cluster = kubexm_bom::config::load_str(CLUSTER, "s.yaml", &catalog)?;
        let bom = kubexm_bom::resolve::resolve(&cluster, &catalog, &Default::default())?;
        let job = kubexm_bom::record::JobRef {
            id: 1,
            kind: "install".into(),
            status: "succeeded".into(),
            finished: 0,
        };
        let record = kubexm_bom::record::ClusterRecord::new(&cluster, job, None, None, &Default::default());
        let v = |s: &str| Version::parse(s).ok_or_else(|| anyhow::anyhow!("{s}"));
        let hop = Hop {
            from: v("v1.36.3")?,
            to: v("v1.37.2")?,
            bundle: 0,
            bundle_name: "k.tar.zst".into(),
            changes: vec![("etcd".into(), "v3.6.8".into(), "v3.7.0".into())],
        };
        // The addons are the install's phases, tested there.
        let waves: Vec<Wave> = kubexm_bom::upgrade::order::waves(&record, &hop, 2, &[])
            .into_iter()
            .filter(|w| w.action != Action::Addons)
            .collect();
        let pki = crate::pki::Pki::DryRun;
        let phases = crate::pipelines::install::PHASES;
        let dir = tempfile::tempdir()?;
        let installer = dir.path().join("kubexm-install");
        std::fs::write(&installer, b"installer")?;
        let ctx = Context {
            kube: Some(crate::kube_pki::KubePki::ensure(&pki)?),
            phases,
            operation: "upgrade",
            etcd_before: Some(cluster.spec.role_groups.etcd.clone()),
            ..Context::testing(&cluster, &bom, dir.path(), &pki, &installer)?
        };
        let run = HopRun {
            hop,
            waves,
            old_images: Default::default(),
            older: vec!["ab".repeat(32)],
            drain_timeout: Some(77),
        };
        let p = pipeline(&ctx, &run)?;
        // A batch's nodes do not wait for each other.
        let task = |name: &str| p.modules.iter().flat_map(|m| &m.tasks).find(|t| t.name == name);
        let after = |name: &str| {
            task(name)
                .map(|t| t.after.iter().map(|(a, _)| a.clone()).collect::<Vec<_>>())
                .unwrap_or_default()
        };
        assert!(
            !after("upgrade-kubeadm-w2").iter().any(|a| a.ends_with("-w1")),
            "{:?}",
            after("upgrade-kubeadm-w2")
        );
        assert!(after("upgrade-kubeadm-w3").contains(&"upgrade-uncordon-w2".to_string()));
        let modules: Vec<String> = p.modules.iter().map(|m| m.name.clone()).collect();
        let ex = session.execute("upgrade", crate::engine::run::Policy::FailFast, |_| Ok(p))?;
        assert!(ex.ok(), "{:?}", ex.errors());

        let calls: Vec<String> = f.connecting.log.calls().into_iter().map(|(h, c)| format!("{h} {c}")).collect();
        let at = |host: &str, what: &str| {
            calls
                .iter()
                .position(|c| c.starts_with(&format!("{host} ")) && c.contains(what))
                .unwrap_or_else(|| panic!("no {what} on {host}: {calls:#?}"))
        };
        let kubeadm = |h: &str| at(h, "/var/lib/kubexm/upgraded/kubeadm-");
        let drained = |h: &str| at("cp1", &format!("get node '{h}' -o jsonpath='{{.status.nodeInfo.kubeletVersion}}/"));
        let uncordoned = |h: &str| at("cp1", &format!("get node '{h}' -o jsonpath='{{.spec.unschedulable}}'"));
        let pulled = |h: &str| at(h, "ctr -n k8s.io images ls");
        let etcd = |h: &str| at(h, "--value 'kubexm-etcd'");
        let kubelet = |h: &str| at(h, "--value 'kubelet'");
        assert!(at("cp1", "kubexm-registry") < pulled("w4"));
        for h in ["cp1", "cp2", "cp3", "w1", "w2", "w3", "w4"] {
            assert!(pulled(h) < etcd("cp1"), "{h} pulls before etcd moves");
            assert!(
                kubeadm(h) < drained(h) && drained(h) < kubelet(h) && kubelet(h) < uncordoned(h),
                "{h}"
            );
        }
        assert!(etcd("cp1") < etcd("cp2") && etcd("cp2") < etcd("cp3") && etcd("cp3") < kubeadm("cp1"));
        assert!(uncordoned("cp1") < kubeadm("cp2") && uncordoned("cp2") < kubeadm("cp3") && uncordoned("cp3") < kubeadm("w1"));
        for (w, next) in [("w1", "w3"), ("w2", "w3"), ("w1", "w4"), ("w2", "w4")] {
            assert!(uncordoned(w) < kubeadm(next), "{w} before {next}");
        }
        // The registry serves the hop's bundle with the old one below, then alone.
        assert_eq!(modules.first().map(String::as_str), Some("upgrade-registry"), "{modules:?}");
        // The Cluster object's status at the hop's version, last.
        assert_eq!(
            modules.iter().rev().take(2).collect::<Vec<_>>(),
            ["upgrade-operator", "upgrade-registry-after"],
            "{modules:?}"
        );
        let last_registry = calls.iter().rposition(|c| c.starts_with("cp1 ") && c.contains("kubexm-registry"));
        assert!(last_registry > Some(uncordoned("w4")), "{calls:#?}");
        Ok(())
    }
}
