//! Pipelines: each a plain list of phases (modules from `phases/`) with
//! their ordering rules. `install` deploys a cluster, `reset` undoes it; the
//! day-2 operations add theirs here.

pub mod install;
pub mod reset;

/// A phase of a pipeline, by the name users type (`--phases etcd,cni`) and
/// requests carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    Preflight,
    OsPackages,
    Registry,
    Etcd,
    Loadbalancer,
    Containerd,
    ControlPlane,
    Workers,
    Cni,
    Addons,
    Kubeconfig,
    /// Every host back to before kubexm (the reset pipeline's one phase).
    Reset,
}

impl Phase {
    /// Its name (`control-plane`), the module's name too.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Preflight => "preflight",
            Phase::OsPackages => "os-packages",
            Phase::Registry => "registry",
            Phase::Etcd => "etcd",
            Phase::Loadbalancer => "loadbalancer",
            Phase::Containerd => "containerd",
            Phase::ControlPlane => "control-plane",
            Phase::Workers => "workers",
            Phase::Cni => "cni",
            Phase::Addons => "addons",
            Phase::Kubeconfig => "kubeconfig",
            Phase::Reset => "reset",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Names of `phases`, joined with `sep`.
pub fn names(phases: &[Phase], sep: &str) -> String {
    phases.iter().map(|p| p.name()).collect::<Vec<_>>().join(sep)
}
