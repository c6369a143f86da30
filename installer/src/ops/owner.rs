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
    /// The controller's leader, which holds the Lease itself while it runs
    /// the job (`identity` names it): nothing more to take.
    Leader { identity: String },
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
    format!("{program} on {}", kubexm_lease::this_machine())
}

/// Whether `holder` is gone for certain, to `me`: a `kubexm-install` of
/// this machine whose process no longer runs (killed, or the machine
/// restarted), or an earlier attempt of the same API job (a job is claimed
/// again only once its worker is fenced off). Its Lease is taken over at
/// once rather than after [`DURATION`].
pub fn gone(me: &str, holder: &str) -> bool {
    let job = |who: &str| {
        who.starts_with("kubexm worker ")
            .then(|| who.rsplit_once(" job ").map(|(_, id)| id.to_string()))
            .flatten()
    };
    if job(me).is_some_and(|mine| job(holder) == Some(mine)) {
        return holder != me;
    }
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

/// How long a job's hold on the Lease outlives its last renewal: long
/// enough for an API server an upgrade restarts to come back before a
/// waiting controller may take it over (a `kubexm-install` killed on
/// another machine blocks others this long; one of this machine is taken
/// over at once).
pub const DURATION: Duration = Duration::from_secs(60);

/// What a session holds while it changes a cluster: the Lease (and, once
/// another holder was seen renewing it, what happened), or nothing.
#[derive(Default)]
pub struct Owned {
    held: Option<Held>,
    lost: Arc<std::sync::Mutex<Option<String>>>,
}

impl Owned {
    /// Why the Lease was lost while held, if it was.
    pub fn lost(&self) -> Option<String> {
        self.lost.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether the Lease is held.
    pub fn holds(&self) -> bool {
        self.held.is_some()
    }
}

/// Why a job would act without the Lease where one may be needed.
fn without(name: &str, why: &str) -> anyhow::Result<Owned> {
    tracing::warn!("cluster {name}: {why}: acting without its controller's Lease");
    Ok(Owned::default())
}

/// The same refusal for every way the Lease is not taken.
fn refused(name: &str, why: &str) -> anyhow::Error {
    op(
        OpError::Host,
        anyhow::anyhow!(
            "cluster {name} is in operator mode and {why}: nothing was changed. While it is, change it through its Cluster \
             object (kubectl apply); to act from here, stop the Lease's holder and run this again, or pass --force-local"
        ),
    )
}

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

/// What [`take`] needs besides the kubeconfig.
pub struct Taking<'a> {
    /// The cluster's name.
    pub name: &'a str,
    pub how: &'a Ownership,
    /// Whether the cluster was installed (a missing kubeconfig is then
    /// worth a warning).
    pub installed: bool,
    /// Set by Ctrl-C or a cancel (ends the wait); set when the Lease is
    /// lost while held, if `stop_on_loss` (no new step starts).
    pub stop: Arc<AtomicBool>,
    pub stop_on_loss: bool,
}

/// Takes the cluster's Lease as `t.how` says, through `kubeconfig`; a
/// Lease another owner is seen renewing while it is held is recorded in
/// [`Owned::lost`] (and sets `t.stop` if `t.stop_on_loss`). An API server
/// that stops answering meanwhile (restarted by an upgrade, stopped by a
/// reset) is acted on.
pub fn take(kubeconfig: &Path, t: Taking) -> anyhow::Result<Owned> {
    let name = t.name;
    let identity = match t.how {
        Ownership::ForceLocal => return without(name, "--force-local; if its controller runs, both may act at once"),
        Ownership::Take { identity } => identity,
        Ownership::Leader { identity } => {
            tracing::debug!("cluster {name}: acting as {identity}, the holder of its controller's Lease");
            return Ok(Owned::default());
        }
    };
    let file = kubeconfig.display();
    if !kubeconfig.exists() {
        if t.installed {
            return without(name, &format!("no kubeconfig at {file} says whether it is in operator mode"));
        }
        return Ok(Owned::default());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| op(OpError::Io, anyhow::anyhow!("no runtime to reach cluster {name}'s API server: {e}")))?;
    let mut config = rt.block_on(kubexm_lease::kubeconfig(kubeconfig)).map_err(|e| {
        let e = kubexm_bom::text::line(&e).into_owned();
        op(
            OpError::Io,
            anyhow::anyhow!("{file}: {e}; it says whether cluster {name} is in operator mode: fix it, or pass --force-local"),
        )
    })?;
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(10));
    let server = kubexm_bom::text::line(&config.cluster_url.to_string()).into_owned();
    match rt.block_on(in_operator_mode(config.clone(), name)) {
        Ok(false) => return Ok(Owned::default()),
        Ok(true) => {}
        Err(None) => return without(name, &format!("its API server {server} (from {file}) cannot be reached")),
        Err(Some(e)) => {
            let e = kubexm_bom::text::line(&e).into_owned();
            return Err(op(
                OpError::Host,
                anyhow::anyhow!(
                    "cluster {name}'s API server {server} did not say whether it is in operator mode: {e}; check {file}, \
                     or pass --force-local"
                ),
            ));
        }
    }
    let cfg = LeaseConfig::new(kubexm_lease::NAMESPACE, kubexm_lease::LEASE, identity, DURATION);
    let lost = Arc::new(std::sync::Mutex::new(None));
    let (record, stop, stop_on_loss) = (lost.clone(), t.stop.clone(), t.stop_on_loss);
    let on_loss = move |why: kubexm_lease::Lost| {
        tracing::error!("{why}");
        *record.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.to_string());
        if stop_on_loss {
            stop.store(true, Ordering::SeqCst);
        }
    };
    let me = identity.clone();
    match Held::take(config, cfg, move |holder| gone(&me, holder), t.stop.clone(), on_loss) {
        Ok(held) => Ok(Owned { held: Some(held), lost }),
        Err(Refused::Interrupted { .. }) => Err(op(
            OpError::Interrupted,
            anyhow::anyhow!("stopped while waiting for cluster {name}'s Lease: nothing was changed"),
        )),
        Err(why) => Err(refused(name, &why.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A holder is gone only when it names a kubexm-install of this machine
    /// whose pid does not run, or an earlier attempt of our API job; this
    /// process, other machines and other programs are alive as far as we
    /// can tell.
    #[test]
    fn only_a_dead_kubexm_install_of_this_machine_is_gone() {
        let Ownership::Take { identity: me } = Ownership::this_process("kubexm-install") else {
            panic!("not a Take")
        };
        let gone = |holder: &str| gone(&me, holder);
        assert!(!gone(&me));
        let here = on_this_machine("kubexm-install");
        assert!(gone(&format!("{here} (pid 4294967295)")));
        assert!(!gone(&format!("{here} (pid 1)")));
        assert!(!gone("kubexm-install on another-machine (pid 4294967295)"));
        assert!(!gone("kubexm worker w1 job 7"));
        assert!(!gone(&format!("{here} (pid x)")));
        // An API job claimed again: its earlier attempt, under another
        // worker or the same one, is gone; another job is not.
        let worker = "kubexm worker w2 job 7";
        assert!(super::gone(worker, "kubexm worker w1 job 7"));
        assert!(!super::gone(worker, worker));
        assert!(!super::gone(worker, "kubexm worker w1 job 8"));
        assert!(!super::gone(worker, "kubexm worker w1 job 17"));
    }

    /// Without a kubeconfig (never handed over, or deleted) or with
    /// `--force-local`, nothing is asked of an API server.
    #[test]
    fn no_kubeconfig_or_force_local_takes_nothing() -> anyhow::Result<()> {
        let (take_it, force) = (Ownership::default(), Ownership::ForceLocal);
        let taking = |how| Taking {
            name: "c",
            how,
            installed: true,
            stop: Arc::new(AtomicBool::new(false)),
            stop_on_loss: true,
        };
        let none = Path::new("/nonexistent/kubexm/c.kubeconfig");
        assert!(!take(none, taking(&take_it))?.holds());
        let dir = tempfile::tempdir()?;
        let bad = dir.path().join("c.kubeconfig");
        std::fs::write(&bad, "not: [a kubeconfig")?;
        assert!(!take(&bad, taking(&force))?.holds());
        let Err(e) = take(&bad, taking(&take_it)) else {
            anyhow::bail!("an unreadable kubeconfig was used")
        };
        let msg = format!("{e:#}");
        assert!(msg.contains("c.kubeconfig") && msg.contains("--force-local"), "{msg}");
        assert!(matches!(OpError::find(&e), Some(OpError::Io(_))), "{msg}");
        Ok(())
    }
}
