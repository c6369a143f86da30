//! The install pipeline: the phases in order, each built by its module in
//! `phases/` from the one [`Context`], and the ordering rules between them
//! (on each host a task waits for the earlier phases' tasks on that host;
//! cross-host gates hold the control plane after etcd and the
//! loadbalancers, joins and the network plugin after init, the CNI's waits
//! and the addons after the nodes).
//! Options a phase does not implement are refused while planning with
//! [`crate::DeployError::NotSupported`] (exit 8).

use super::Phase;
use crate::context::Context;
use crate::engine::plan::{Module, Pipeline};
use crate::phases;

/// The phases, in order.
pub const PHASES: &[Phase] = &[
    Phase::Preflight,
    Phase::OsPackages,
    Phase::Registry,
    Phase::Etcd,
    Phase::Loadbalancer,
    Phase::Containerd,
    Phase::ControlPlane,
    Phase::Workers,
    Phase::Cni,
    Phase::Addons,
    Phase::Kubeconfig,
    Phase::Operator,
];
/// The phases this release implements.
pub const IMPLEMENTED: &[Phase] = PHASES;

/// Phases by name (`--phases`); an unknown name is refused, naming them all.
pub fn parse(names: &[String]) -> Result<Vec<Phase>, String> {
    names
        .iter()
        .map(|n| {
            PHASES
                .iter()
                .copied()
                .find(|p| p.name() == n)
                .ok_or_else(|| format!("unknown phase `{n}`; phases are: {}", super::names(PHASES, ", ")))
        })
        .collect()
}

/// The phases asked for, split into those this release implements and
/// those it does not.
pub fn select(phases: &[Phase]) -> (Vec<Phase>, Vec<Phase>) {
    phases.iter().copied().partition(|p| IMPLEMENTED.contains(p))
}

/// How a phase's module is built from the context.
type Build = fn(&Context) -> anyhow::Result<Module>;

/// Every phase in order, with its module.
const PIPELINE: &[(Phase, Build)] = &[
    (Phase::Preflight, |c| Ok(phases::preflight::module(c))),
    (Phase::OsPackages, phases::os_packages::module),
    (Phase::Registry, phases::registry::module),
    (Phase::Etcd, phases::etcd::module),
    (Phase::Loadbalancer, phases::endpoint::module),
    (Phase::Containerd, phases::containerd::module),
    (Phase::ControlPlane, phases::kubeadm::control_plane),
    (Phase::Workers, phases::kubeadm::workers),
    (Phase::Cni, phases::addons::cni),
    (Phase::Addons, phases::addons::module),
    (Phase::Kubeconfig, phases::kubeadm::kubeconfig),
    (Phase::Operator, phases::operator::module),
];

/// The deployment pipeline for the chosen phases (a phase with nothing to
/// do, such as os-packages for a bundle without repositories, is left out).
pub fn pipeline(ctx: &Context) -> anyhow::Result<Pipeline> {
    let mut modules = Vec::new();
    for (phase, build) in ordered(ctx) {
        if !ctx.has(*phase) {
            continue;
        }
        if *phase == Phase::OsPackages && ctx.bom.os_repos.is_empty() {
            continue;
        }
        modules.push((*phase, build(ctx)?));
    }
    link(&mut modules);
    if ctx.files_from_registry {
        after_the_registry(&mut modules);
    }
    // The registry moved: the old one stops once everything else is done
    // (every node's hosts.toml and the addons' images name the new one).
    if let Some(old) = ctx.registry_retired() {
        let all = modules
            .iter()
            .flat_map(|(_, m)| m.tasks.iter().map(|t| (t.name.clone(), crate::engine::plan::Scope::AllHosts)))
            .collect();
        modules.push((
            Phase::Registry,
            Module {
                name: "registry-retired".into(),
                tasks: vec![phases::registry::retired(old, all)],
            },
        ));
    }
    let modules = modules.into_iter().map(|(_, m)| m).collect();
    Ok(Pipeline {
        name: "install".into(),
        modules,
    })
}

/// [`PIPELINE`], with the registry right after preflight when hosts fetch
/// their files from it ([`Context::files_from_registry`]).
fn ordered(ctx: &Context) -> Vec<&'static (Phase, Build)> {
    let mut phases: Vec<&(Phase, Build)> = PIPELINE.iter().collect();
    if ctx.files_from_registry {
        phases.sort_by_key(|(p, _)| match p {
            Phase::Preflight => 0,
            Phase::Registry => 1,
            _ => 2,
        });
    }
    phases
}

/// Every task after the registry phase's, on every host, waits for it: the
/// registry host's service, which serves the files, may restart there.
fn after_the_registry(modules: &mut [(Phase, Module)]) {
    use crate::engine::plan::Scope;
    let Some(k) = modules.iter().position(|(p, _)| *p == Phase::Registry) else {
        return;
    };
    let registry: Vec<String> = modules[k].1.tasks.iter().map(|t| t.name.clone()).collect();
    for (_, m) in modules.iter_mut().skip(k + 1) {
        for t in &mut m.tasks {
            for r in &registry {
                t.after.retain(|(a, _)| a != r);
                t.after.push((r.clone(), Scope::AllHosts));
            }
        }
    }
}

/// The install's cross-host gates: a phase's tasks wait for every host's
/// tasks of the phases listed (the control plane after etcd's health and
/// the loadbalancers, joins after init, the network plugin after init and
/// its waits after every join (named by the cni phase), the addons after
/// the control plane, workers and CNI; the Cluster object last).
const GATES: &[(Phase, &[Phase])] = {
    use Phase::*;
    &[
        (ControlPlane, &[Etcd, Loadbalancer, Registry]),
        (Workers, &[ControlPlane, Registry]),
        (Cni, &[ControlPlane]),
        (Addons, &[ControlPlane, Workers, Cni]),
        (Kubeconfig, &[ControlPlane, Workers, Cni, Addons]),
        (Operator, &[ControlPlane, Workers, Cni, Addons, Kubeconfig]),
    ]
};

/// Orders the phases ([`super::link`] with the install's gates).
fn link(modules: &mut [(Phase, Module)]) {
    super::link(modules, GATES);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under the install's gates, the network plugin (its apply naming the
    /// init) goes on right after the first control-plane node's init, beside
    /// the joins; its waits (naming every join) wait for every node; the
    /// workers join after the init, not after every control-plane join.
    #[test]
    fn the_network_plugin_goes_on_after_the_init_and_its_waits_after_every_join() {
        use super::super::tests::{after_of, module, task};
        use crate::engine::plan::Scope::AllHosts;
        let mut modules = vec![
            (
                Phase::ControlPlane,
                module(
                    "control-plane",
                    vec![
                        task("init-a", "a", &[]),
                        task("join-b", "b", &[("init-a", AllHosts)]),
                        task("join-c", "c", &[("init-a", AllHosts)]),
                    ],
                ),
            ),
            (
                Phase::Workers,
                module("workers", vec![task("join-w", "w", &[("init-a", AllHosts)])]),
            ),
            (
                Phase::Cni,
                module(
                    "cni",
                    vec![
                        task("cni-apply", "a", &[("init-a", AllHosts)]),
                        task(
                            "cni-ready",
                            "a",
                            &[
                                ("cni-apply", AllHosts),
                                ("init-a", AllHosts),
                                ("join-b", AllHosts),
                                ("join-c", AllHosts),
                                ("join-w", AllHosts),
                            ],
                        ),
                    ],
                ),
            ),
            (Phase::Addons, module("addons", vec![task("addon", "a", &[])])),
        ];
        link(&mut modules);
        let s = |n: &str, sc| (n.to_string(), sc);
        assert_eq!(after_of(&modules, "cni-apply"), [s("init-a", AllHosts)]);
        assert_eq!(after_of(&modules, "join-w"), [s("init-a", AllHosts)]);
        assert_eq!(after_of(&modules, "cni-ready").len(), 5);
        assert_eq!(
            after_of(&modules, "addon"),
            [
                s("cni-apply", AllHosts),
                s("cni-ready", AllHosts),
                s("init-a", AllHosts),
                s("join-b", AllHosts),
                s("join-c", AllHosts),
                s("join-w", AllHosts)
            ]
        );
    }

    /// Hosts fetching from the registry host: the registry phase runs right
    /// after preflight, and every later task, a worker's prepare task too,
    /// waits for it on every host.
    #[test]
    fn with_files_from_the_registry_host_every_later_task_waits_for_the_registry() -> anyhow::Result<()> {
        use crate::context::TWO_HOSTS as CLUSTER;
        let catalog = kubexm_bom::catalog::Catalog::builtin()?;
        let cluster = kubexm_bom::config::load_str(CLUSTER, "s.yaml", &catalog)?;
        let bom = kubexm_bom::resolve::resolve(&cluster, &catalog, &Default::default())?;
        let pki = crate::pki::Pki::DryRun;
        let dir = tempfile::tempdir()?;
        let installer = dir.path().join("kubexm-install");
        std::fs::write(&installer, b"installer")?;
        // The node phases (the network plugin's and addons' need their
        // manifests from a bundle).
        let phases: Vec<Phase> = PHASES
            .iter()
            .copied()
            .filter(|p| !matches!(p, Phase::Cni | Phase::Addons | Phase::Operator))
            .collect();
        let mut ctx = Context {
            kube: Some(crate::kube_pki::KubePki::ensure(&pki)?),
            phases: &phases,
            ..Context::testing(&cluster, &bom, dir.path(), &pki, &installer)?
        };
        type After = Vec<(String, crate::engine::plan::Scope)>;
        let tasks = |p: &Pipeline| -> Vec<(String, String, After)> {
            p.modules
                .iter()
                .flat_map(|m| m.tasks.iter().map(move |t| (m.name.clone(), t.name.clone(), t.after.clone())))
                .collect()
        };
        let waits = |after: &[(String, crate::engine::plan::Scope)]| {
            after
                .iter()
                .any(|(a, s)| a == "registry" && *s == crate::engine::plan::Scope::AllHosts)
        };
        // As before: a worker's prepare task does not wait for the registry.
        let before = tasks(&pipeline(&ctx)?);
        assert!(before.iter().any(|(_, t, a)| t.starts_with(crate::pipelines::PREPARE) && !waits(a)));
        ctx.files_from_registry = true;
        let p = pipeline(&ctx)?;
        let names: Vec<&str> = p.modules.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names.first().copied(), Some("preflight"), "{names:?}");
        assert_eq!(names.get(1).copied(), Some("registry"), "{names:?}");
        let after = tasks(&p);
        let later: Vec<_> = after.iter().filter(|(m, _, _)| m != "preflight" && m != "registry").collect();
        assert!(later.len() > 5, "{names:?}");
        for (m, t, a) in later {
            assert!(waits(a), "{m}/{t} does not wait for the registry: {a:?}");
        }
        Ok(())
    }

    #[test]
    fn phases_are_selected_and_unknown_ones_refused() -> Result<(), Box<dyn std::error::Error>> {
        let (ok, missing) = select(&parse(&["preflight".into(), "etcd".into(), "cni".into()])?);
        assert_eq!(ok, [Phase::Preflight, Phase::Etcd, Phase::Cni]);
        assert!(missing.is_empty());
        assert!(parse(&["etdc".into()]).unwrap_err().contains("unknown phase `etdc`"));
        Ok(())
    }
}

#[test]
fn the_pipeline_lists_every_phase_in_order() {
    let phases: Vec<Phase> = PIPELINE.iter().map(|(p, _)| *p).collect();
    assert_eq!(phases, PHASES);
}
