//! kubexm-operator: operator mode's controller (issue 31),
//! `kubexm controller-manager`. It runs inside the cluster it manages (or,
//! with `--kubeconfig`, beside it) as replicas of which one leads, elected
//! through a Lease ([`lease`]). The leader watches the Cluster objects of
//! `kubexm-system` and reconciles each ([`controller`]): a changed spec is
//! read under the rules of a request and held against the spec last
//! applied to the hosts with the rules of `kubexm-install apply`
//! ([`decide`]); what kubexm can never change, does not do yet, or the
//! controller does not run yet is reported as a NotSupported condition
//! naming the field, an unreadable spec as Failed, `spec.paused` as a
//! paused Reconciling. Hosts added or taken out (or the registry moved)
//! are run by a controller given the installer's state (`--root`): the
//! jobs of `kubexm-install remove node` and `apply` ([`act`], reported by
//! `run`). Otherwise the status follows the cluster's nodes ([`nodes`]).
//!
//! Inside the cluster (the install's Deployment, the bundle's image) it
//! decides and keeps the status, but runs nothing: it has no installer
//! state there. Where it will keep that state is built: the installer's
//! database as a working copy journaled into ConfigMaps ([`journal`]),
//! which a new leader reads back; the controller does not open it yet.
//! Not built yet (docs/operator.md): an upgrade by the controller, the
//! handoff of the state (the journal's seed, the PKI) and its use inside.

pub mod act;
pub mod controller;
pub mod decide;
pub use kubexm_lease as lease;
pub mod journal;
pub mod nodes;
mod run;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Where the Cluster objects live.
pub const NAMESPACE: &str = kubexm_crd::NAMESPACE;

/// The Lease the replicas elect their leader with.
pub const LEASE: &str = lease::LEASE;

/// What `kubexm controller-manager` is asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// The kubeconfig to reach the API server with; inside a pod, none.
    pub kubeconfig: Option<PathBuf>,
    /// Where the Cluster objects, the Lease and the applied specs live.
    pub namespace: String,
    /// This replica's name in the Lease.
    pub identity: String,
    /// The Lease's name.
    pub lease_name: String,
    /// How long a leader that stopped renewing keeps the Lease.
    pub lease_duration: Duration,
    /// Where the changes it decides are run; `None`: decided and reported only.
    pub act: Option<act::ActOptions>,
}

/// Why the controller manager stopped.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("the kubeconfig {file}: {message}")]
    Kubeconfig { file: String, message: String },
    #[error("no kubeconfig was given and this is not a pod ({0}): pass --kubeconfig FILE")]
    NotInCluster(String),
    #[error("the API server client cannot be made: {0}; check the kubeconfig's server and certificates")]
    Client(String),
    #[error("leadership lost: {0}; stopping so that only the new leader acts (a Deployment starts this replica again)")]
    Lost(#[from] lease::Lost),
    #[error("the watch of Cluster objects ended (the API server went away?); the Lease was handed back: start the controller again")]
    WatchEnded,
}

/// A client from `kubeconfig`, or the pod's service account.
async fn client(kubeconfig: Option<&PathBuf>) -> Result<kube::Client, OperatorError> {
    let config = match kubeconfig {
        Some(path) => {
            let bad = |message: String| OperatorError::Kubeconfig {
                file: path.display().to_string(),
                message,
            };
            lease::kubeconfig(path).await.map_err(bad)?
        }
        None => kube::Config::incluster().map_err(|e| OperatorError::NotInCluster(e.to_string()))?,
    };
    kube::Client::try_from(config).map_err(|e| OperatorError::Client(e.to_string()))
}

/// Runs until leadership is lost or `stop` resolves (then the Lease is
/// handed back first).
pub async fn run(o: Options, stop: impl std::future::Future<Output = ()>) -> Result<(), OperatorError> {
    let client = client(o.kubeconfig.as_ref()).await?;
    let mut elector = lease::Elector::new(
        client.clone(),
        lease::LeaseConfig::new(&o.namespace, &o.lease_name, &o.identity, o.lease_duration),
    );
    tokio::pin!(stop);
    let stopped = tokio::select! {
        () = elector.acquire() => false,
        () = &mut stop => true,
    };
    if stopped {
        // Stopped while taking it: a write in flight may have taken it.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), elector.release_if_held()).await;
        return Ok(());
    }
    let ctx = Arc::new(controller::Ctx::new(client, &o.namespace, &o.identity, o.act.clone()));
    let (stopping, busy) = (ctx.stop.clone(), ctx.busy.clone());
    let result = tokio::select! {
        lost = elector.hold() => Err(OperatorError::Lost(lost)),
        () = controller::run(ctx) => Err(OperatorError::WatchEnded),
        () = &mut stop => Ok(()),
    };
    // A job running starts no new step.
    stopping.store(true, std::sync::atomic::Ordering::Relaxed);
    // A leader that lost the Lease has nothing to hand back, and stops at
    // once (its job with it): the new leader acts.
    if !matches!(result, Err(OperatorError::Lost(_))) {
        // The Lease is handed back once the job running has stopped (its
        // step finished), renewed meanwhile.
        let ended = async {
            if busy.try_acquire().is_err() {
                tracing::info!("waiting for the running job to finish its step before handing the Lease back");
                let _ = busy.acquire().await;
            }
        };
        tokio::select! {
            () = ended => {}
            lost = elector.hold() => return Err(OperatorError::Lost(lost)),
        }
        // Bounded: a stop must not hang on an API server that does not answer.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), elector.release()).await;
    }
    result
}

#[cfg(test)]
mod tests;
