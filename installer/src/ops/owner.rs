//! One owner acts on a cluster at a time (issue 31). While a cluster has
//! a Cluster object (operator mode), its controller's Lease
//! (`kubexm-system/kubexm-controller-manager`) says who acts on it: a job
//! that changes the hosts takes that Lease first, through the admin
//! kubeconfig the install handed over, holds it while the session lasts and
//! hands it back at the end. A Lease another owner is seen renewing (the
//! controller, another `kubexm-install`, a worker's job) refuses the job
//! before any host is touched, naming the holder; `--force-local` acts
//! without it. A cluster without a kubeconfig here or without a Cluster
//! object has no Lease to take, and one whose API server cannot be reached
//! (an etcd restore's case) is acted on with a warning: nobody can hold
//! the Lease there either, since a holder that cannot renew stops.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kube::api::{ApiResource, DynamicObject};
use kubexm_lease::{Held, LeaseConfig, Refused};

use crate::ops::error::{OpError, op};

/// Who a job that changes a cluster acts as.
#[derive(Debug, Clone)]
pub enum Ownership {
    /// Takes the cluster's Lease, named `identity` in it.
    Take { identity: String },
    /// Acts without the Lease (`--force-local`).
    ForceLocal,
}

impl Ownership {
    /// This process: `program`, the machine it runs on and its pid.
    pub fn this_process(program: &str) -> Ownership {
        Ownership::Take {
            identity: format!("{} (pid {})", on_this_machine(program), std::process::id()),
        }
    }
}

/// `program on HOST`, this machine's name.
fn on_this_machine(program: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{program} on {}", kubexm_bom::text::line(host.trim()))
}

/// Whether `holder` names a `kubexm-install` of this machine whose
/// process no longer runs (killed, or a machine restarted): its Lease is
/// taken over at once rather than after [`DURATION`].
pub fn gone(holder: &str) -> bool {
    holder
        .strip_prefix(&on_this_machine("kubexm-install"))
        .and_then(|rest| rest.strip_prefix(" (pid "))
        .and_then(|rest| rest.strip_suffix(')'))
        .and_then(|pid| pid.parse::<u32>().ok())
        .is_some_and(|pid| pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists())
}

impl Default for Ownership {
    fn default() -> Ownership {
        Ownership::this_process("kubexm-install")
    }
}

/// How long a job's hold on the Lease outlives its last renewal (a killed
/// `kubexm-install` blocks others this long).
pub const DURATION: Duration = Duration::from_secs(15);

/// What a session holds while it changes a cluster: the Lease, or nothing.
pub struct Owned(#[allow(dead_code)] Option<Held>);

/// Whether cluster `name` has a Cluster object, by the API server
/// `config` reaches: `Err(None)` if it cannot be reached.
async fn in_operator_mode(config: kube::Config, name: &str) -> Result<bool, Option<String>> {
    let client = kube::Client::try_from(config).map_err(|e| Some(e.to_string()))?;
    let resource = ApiResource::erase::<kubexm_crd::ClusterResource>(&());
    let api: kube::Api<DynamicObject> = kube::Api::namespaced_with(client, kubexm_crd::NAMESPACE, &resource);
    match api.get_opt(name).await {
        Ok(found) => Ok(found.is_some()),
        // No CRD: the group is unknown.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(kube::Error::Api(s)) => Err(Some(format!("{} ({})", s.message, s.code))),
        Err(_) => Err(None),
    }
}

/// Takes cluster `name`'s Lease as `how` says, through `kubeconfig`; a
/// Lease another owner takes while it is held sets `stop` (no new step
/// starts). An API server that stops answering meanwhile (restarted by an
/// upgrade, stopped by a reset) is acted on.
pub fn take(kubeconfig: &Path, name: &str, how: &Ownership, stop: Arc<AtomicBool>) -> anyhow::Result<Owned> {
    let identity = match how {
        Ownership::ForceLocal => {
            tracing::warn!(
                "--force-local: acting on cluster {name} without its controller's Lease; if its controller runs, both may act at once"
            );
            return Ok(Owned(None));
        }
        Ownership::Take { identity } => identity,
    };
    if !kubeconfig.exists() {
        return Ok(Owned(None));
    }
    let file = kubeconfig.display();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| op(OpError::Io, anyhow::anyhow!("no runtime to reach cluster {name}'s API server: {e}")))?;
    let mut config = rt.block_on(kubexm_lease::kubeconfig(kubeconfig)).map_err(|e| {
        op(
            OpError::Io,
            anyhow::anyhow!("{file}: {e}; it is the kubeconfig the install of {name} wrote"),
        )
    })?;
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(10));
    let server = kubexm_bom::text::line(&config.cluster_url.to_string()).into_owned();
    match rt.block_on(in_operator_mode(config.clone(), name)) {
        Ok(false) => return Ok(Owned(None)),
        Ok(true) => {}
        Err(None) => {
            tracing::warn!("cluster {name}'s API server {server} (from {file}) cannot be reached: acting without its controller's Lease");
            return Ok(Owned(None));
        }
        Err(Some(e)) => {
            return Err(op(
                OpError::Host,
                anyhow::anyhow!(
                    "cluster {name}'s API server {server} refused to say whether it is in operator mode: {}; check {file}",
                    kubexm_bom::text::line(&e)
                ),
            ));
        }
    }
    let cfg = LeaseConfig::new(kubexm_lease::NAMESPACE, kubexm_lease::LEASE, identity, DURATION);
    let lost = move |why: kubexm_lease::Lost| {
        tracing::error!("{why}: no new step starts; run the operation again");
        stop.store(true, Ordering::SeqCst);
    };
    match Held::take(config, cfg, gone, lost) {
        Ok(held) => Ok(Owned(Some(held))),
        Err(refused @ Refused::HeldBy { .. }) => Err(op(
            OpError::Host,
            anyhow::anyhow!(
                "cluster {name} is in operator mode and {refused}: nothing was changed. Change it through its Cluster object \
                 (kubectl apply), or stop the holder and run this again, or pass --force-local to act anyway"
            ),
        )),
        Err(refused) => Err(op(
            OpError::Host,
            anyhow::anyhow!(
                "cluster {name} is in operator mode and {refused}: nothing was changed; check {file} and the API server {server}"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A holder is gone only when it names a kubexm-install of this machine
    /// whose pid does not run; this process, other machines and other
    /// programs are alive as far as we can tell.
    #[test]
    fn only_a_dead_kubexm_install_of_this_machine_is_gone() {
        let Ownership::Take { identity: me } = Ownership::this_process("kubexm-install") else {
            panic!("not a Take")
        };
        assert!(!gone(&me));
        let here = on_this_machine("kubexm-install");
        assert!(gone(&format!("{here} (pid 4294967295)")));
        assert!(!gone(&format!("{here} (pid 1)")));
        assert!(!gone("kubexm-install on another-machine (pid 4294967295)"));
        assert!(!gone("kubexm worker w1 job 7"));
        assert!(!gone(&format!("{here} (pid x)")));
    }

    /// Without a kubeconfig (never handed over, or deleted) or with
    /// `--force-local`, nothing is asked of an API server.
    #[test]
    fn no_kubeconfig_or_force_local_takes_nothing() -> anyhow::Result<()> {
        let stop = Arc::new(AtomicBool::new(false));
        let none = Path::new("/nonexistent/kubexm/c.kubeconfig");
        assert!(take(none, "c", &Ownership::default(), stop.clone())?.0.is_none());
        let dir = tempfile::tempdir()?;
        let bad = dir.path().join("c.kubeconfig");
        std::fs::write(&bad, "not: [a kubeconfig")?;
        assert!(take(&bad, "c", &Ownership::ForceLocal, stop.clone())?.0.is_none());
        let Err(e) = take(&bad, "c", &Ownership::default(), stop) else {
            anyhow::bail!("an unreadable kubeconfig was used")
        };
        assert!(format!("{e:#}").contains("c.kubeconfig"), "{e:#}");
        Ok(())
    }
}
