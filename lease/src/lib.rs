//! kubexm-lease: the Lease one owner of a cluster acts under
//! (`kubexm-system/kubexm-controller-manager`, a `coordination.k8s.io/v1`
//! Lease), taken as Kubernetes' own controllers take theirs: one holder at
//! a time, named in the Lease; the holder renews it every
//! [`LeaseConfig::renew_every`]; another takes it over once the holder has
//! not renewed it for [`LeaseConfig::duration`] as that taker's own clock
//! measures it (the holder's clock is never compared with ours); every
//! write carries the `resourceVersion` it read, so of two racing for it one
//! wins and the other sees a conflict. A replica that cannot renew within
//! [`LeaseConfig::renew_deadline`] stops acting (another may already hold
//! it; [`Elector::hold`]), a day-2 job acts on until another holder is
//! seen renewing it ([`Elector::keep`]); one that stops cleanly hands it
//! back at once.
//!
//! The controller's replicas wait for it ([`Elector::acquire`]); the CLI's
//! and the API's day-2 operations on a cluster in operator mode take it or
//! are refused, naming its holder ([`Elector::take`]).

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use kubexm_bom::text;

#[cfg(test)]
mod tests;

/// Where the Lease lives: with the Cluster objects.
pub use kubexm_crd::NAMESPACE;

/// The Lease's name.
pub const LEASE: &str = "kubexm-controller-manager";

/// Where the Lease is and how it is held.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// Who this replica is (its pod's name): unique among the replicas.
    pub identity: String,
    /// How long a holder that stopped renewing keeps the Lease.
    pub duration: Duration,
    /// How often the holder renews it, and others look at it.
    pub renew_every: Duration,
    /// How long the holder keeps acting without a renewal that succeeded.
    pub renew_deadline: Duration,
}

impl LeaseConfig {
    /// A Lease held for `duration` without renewal: renewed every seventh
    /// of it (at least every half second), given up past two thirds of it.
    pub fn new(namespace: &str, name: &str, identity: &str, duration: Duration) -> LeaseConfig {
        LeaseConfig {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            duration,
            renew_every: (duration / 7).max(Duration::from_millis(500)),
            renew_deadline: duration * 2 / 3,
        }
    }
}

/// This machine's name (for an identity in the Lease), escaped; empty if
/// it cannot be read.
pub fn this_machine() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    text::line(host.trim()).into_owned()
}

/// The client configuration the kubeconfig at `path` gives, or why not.
pub async fn kubeconfig(path: &std::path::Path) -> Result<kube::Config, String> {
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| e.to_string())?;
    kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| e.to_string())
}

/// What the Lease as read says this replica does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// There is no Lease: make it, held by us.
    Create,
    /// We hold it: renew it.
    Renew,
    /// Nobody holds it, or its holder stopped renewing it: take it over.
    TakeOver,
    /// Another replica holds it.
    Wait { holder: String },
}

/// What a replica remembers of the Lease between looks: the holder and
/// renewal it last saw, and when (on its own clock) that changed.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    record: Option<(String, String)>,
    since: Option<Instant>,
}

/// The step for a replica named `me` that reads `lease` at `now`, having
/// `seen` it before; `duration` as [`LeaseConfig::duration`].
pub fn step(lease: Option<&LeaseSpec>, me: &str, seen: &mut Seen, now: Instant, duration: Duration) -> Step {
    let Some(spec) = lease else {
        // Gone while another replica held it: that replica may still be
        // acting until its next renewal fails, so wait out its duration.
        return match (&seen.record, seen.since) {
            (Some((holder, _)), Some(since)) if now.duration_since(since) <= duration => Step::Wait { holder: holder.clone() },
            _ => Step::Create,
        };
    };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder == me {
        return Step::Renew;
    }
    if holder.is_empty() {
        return Step::TakeOver;
    }
    let record = (
        holder.clone(),
        spec.renew_time.as_ref().map(|t| t.0.to_string()).unwrap_or_default(),
    );
    if seen.record.as_ref() != Some(&record) {
        seen.record = Some(record);
        seen.since = Some(now);
    }
    let held_for = spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(duration, Duration::from_secs);
    match seen.since {
        Some(since) if now.duration_since(since) > held_for => Step::TakeOver,
        _ => Step::Wait { holder },
    }
}

/// One replica's side of the election.
pub struct Elector {
    api: Api<Lease>,
    cfg: LeaseConfig,
    seen: Seen,
    /// The Lease as last written by us, with its resourceVersion.
    held: Option<Lease>,
    /// When the request of our last write that succeeded was sent: a
    /// follower counts from when it saw that write, so never earlier.
    renewed_at: Option<Instant>,
    /// Says of a holder that it is gone for certain (a process of this
    /// machine that no longer runs): its Lease is taken over at once.
    gone: Option<Gone>,
}

/// See [`Elector::with_gone`].
type Gone = Box<dyn Fn(&str) -> bool + Send>;

/// What one look at the Lease ended with.
enum Outcome {
    /// This replica holds it.
    Held,
    /// Another replica (named) holds it.
    HeldBy(String),
    /// Another replica wrote it between our read and our write.
    Raced,
}

/// Why the holder stopped holding.
#[derive(Debug, thiserror::Error)]
pub enum Lost {
    #[error("the Lease {namespace}/{name} is now held by {holder}")]
    TakenBy { namespace: String, name: String, holder: String },
    #[error("the Lease {namespace}/{name} could not be renewed for {seconds} s (last error: {error}); another replica may hold it")]
    NotRenewed {
        namespace: String,
        name: String,
        seconds: u64,
        error: String,
    },
}

/// Why [`Elector::take`] did not get the Lease.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("the Lease {namespace}/{name} is held by {holder}, which is renewing it")]
    HeldBy { namespace: String, name: String, holder: String },
    #[error("the Lease {namespace}/{name} could not be read or written: {error}")]
    Api { namespace: String, name: String, error: String },
    #[error("stopped while waiting for the Lease {namespace}/{name}")]
    Interrupted { namespace: String, name: String },
}

impl Refused {
    /// An error about `cfg`'s Lease, escaped.
    fn api(cfg: &LeaseConfig, error: &str) -> Refused {
        Refused::Api {
            namespace: cfg.namespace.clone(),
            name: cfg.name.clone(),
            error: text::line(error).into_owned(),
        }
    }
}

impl Elector {
    pub fn new(client: kube::Client, cfg: LeaseConfig) -> Elector {
        Elector {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
            seen: Seen::default(),
            held: None,
            renewed_at: None,
            gone: None,
        }
    }

    /// With `gone` saying which holders are gone for certain.
    pub fn with_gone(mut self, gone: impl Fn(&str) -> bool + Send + 'static) -> Elector {
        self.gone = Some(Box::new(gone));
        self
    }

    fn spec(&self, transitions: i32, acquired: Option<MicroTime>) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        LeaseSpec {
            holder_identity: Some(self.cfg.identity.clone()),
            lease_duration_seconds: Some(i32::try_from(self.cfg.duration.as_secs()).unwrap_or(i32::MAX)),
            acquire_time: Some(acquired.unwrap_or_else(|| now.clone())),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// One look at the Lease and the write it calls for.
    async fn try_once(&mut self) -> Result<Outcome, kube::Error> {
        let sent = Instant::now();
        let lease = self.api.get_opt(&self.cfg.name).await?;
        let spec = lease.as_ref().and_then(|l| l.spec.as_ref());
        let decided = match step(spec, &self.cfg.identity, &mut self.seen, Instant::now(), self.cfg.duration) {
            Step::Wait { holder } if spec.is_some() && self.gone.as_ref().is_some_and(|gone| gone(&holder)) => {
                tracing::info!(lease = %self.cfg.name, holder = %text::line(&holder), "its holder is gone: taking it over");
                Step::TakeOver
            }
            decided => decided,
        };
        let transitions = spec.and_then(|s| s.lease_transitions).unwrap_or(0);
        let written = match (decided, lease) {
            (Step::Create, _) => {
                let l = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.cfg.name.clone()),
                        namespace: Some(self.cfg.namespace.clone()),
                        ..Default::default()
                    },
                    spec: Some(self.spec(0, None)),
                };
                self.api.create(&PostParams::default(), &l).await
            }
            (Step::Renew, Some(mut l)) => {
                let acquired = l.spec.as_ref().and_then(|s| s.acquire_time.clone());
                l.spec = Some(self.spec(transitions, acquired));
                self.api.replace(&self.cfg.name, &PostParams::default(), &l).await
            }
            (Step::TakeOver, Some(mut l)) => {
                l.spec = Some(self.spec(transitions + 1, None));
                self.api.replace(&self.cfg.name, &PostParams::default(), &l).await
            }
            (Step::Wait { holder }, _) => {
                self.held = None;
                return Ok(Outcome::HeldBy(holder));
            }
            // Read as held or free, gone before the write: look again.
            (_, None) => return Ok(Outcome::Raced),
        };
        match written {
            Ok(l) => {
                self.held = Some(l);
                self.renewed_at = Some(sent);
                Ok(Outcome::Held)
            }
            // Another replica wrote first: look again next time.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                self.held = None;
                Ok(Outcome::Raced)
            }
            Err(e) => Err(e),
        }
    }

    /// Waits until this replica holds the Lease. Errors of the API server
    /// are logged and tried again.
    pub async fn acquire(&mut self) {
        let mut waiting_for = String::new();
        loop {
            match tokio::time::timeout(self.cfg.duration, self.try_once()).await {
                Ok(Ok(Outcome::Held)) => {
                    tracing::info!(lease = %self.cfg.name, identity = %text::line(&self.cfg.identity), "holding the Lease: this replica leads");
                    return;
                }
                Ok(Ok(Outcome::HeldBy(holder))) if holder != waiting_for => {
                    tracing::info!(lease = %self.cfg.name, holder = %text::line(&holder), "another replica leads; waiting");
                    waiting_for = holder;
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(lease = %self.cfg.name, "reading the Lease failed: {}; trying again", text::line(&e.to_string()))
                }
                Err(_) => tracing::warn!(lease = %self.cfg.name, "the API server did not answer about the Lease in time; trying again"),
            }
            tokio::time::sleep(self.cfg.renew_every).await;
        }
    }

    /// Takes the Lease unless another holder is seen renewing it: a holder
    /// is taken to be alive once its record changes while we look (every
    /// [`LeaseConfig::renew_every`]), and dead once it has not changed for
    /// the Lease's duration (then it is taken over, as a replica would).
    /// An error of the API server, or one that does not answer within the
    /// duration, refuses.
    pub async fn take(&mut self) -> Result<(), Refused> {
        let mut first: Option<(String, String)> = None;
        loop {
            match tokio::time::timeout(self.cfg.duration, self.try_once()).await {
                Ok(Ok(Outcome::Held)) => return Ok(()),
                Ok(Ok(Outcome::HeldBy(holder))) => match (&first, &self.seen.record) {
                    (None, seen) => {
                        tracing::info!(
                            lease = %self.cfg.name,
                            holder = %text::line(&holder),
                            "the Lease is held: waiting to see whether its holder renews it"
                        );
                        first = seen.clone();
                    }
                    (Some(f), Some(seen)) if f != seen => {
                        return Err(Refused::HeldBy {
                            namespace: self.cfg.namespace.clone(),
                            name: self.cfg.name.clone(),
                            holder: text::line(&holder).into_owned(),
                        });
                    }
                    _ => {}
                },
                Ok(Ok(Outcome::Raced)) => {}
                Ok(Err(e)) => return Err(Refused::api(&self.cfg, &e.to_string())),
                Err(_) => return Err(Refused::api(&self.cfg, "the API server did not answer in time")),
            }
            tokio::time::sleep(self.cfg.renew_every).await;
        }
    }

    /// Renews the Lease until it is lost; returns why. A renewal that
    /// does not answer in time counts as failed: the deadline is measured
    /// from when the last successful write was sent.
    pub async fn hold(&mut self) -> Lost {
        loop {
            tokio::time::sleep(self.cfg.renew_every).await;
            let since = self.renewed_at.map_or(self.cfg.renew_deadline, |t| t.elapsed());
            let left = self.cfg.renew_deadline.saturating_sub(since);
            if left.is_zero() {
                return self.not_renewed("no renewal succeeded in time".into());
            }
            match tokio::time::timeout(left, self.try_once()).await {
                Ok(Ok(Outcome::Held | Outcome::Raced)) => {}
                Ok(Ok(Outcome::HeldBy(holder))) => {
                    return self.taken_by(&holder);
                }
                Ok(Err(e)) => tracing::warn!(
                    lease = %self.cfg.name,
                    "renewing the Lease failed: {}; trying again",
                    text::line(&e.to_string())
                ),
                Err(_) => return self.not_renewed("the API server did not answer the renewal in time".into()),
            }
        }
    }

    /// Renews the Lease until another holder is seen renewing it. A
    /// renewal that fails past the deadline (an API server restarted by an
    /// upgrade, stopped by a reset), or another holder in the Lease that
    /// does not renew it (the Lease as an etcd snapshot had it), is not
    /// that: the holder acts on and takes the Lease back by
    /// [`Elector::take`]'s rule once the API server answers.
    pub async fn keep(&mut self) -> Lost {
        loop {
            let why = self.hold().await;
            tracing::warn!("{why}: acting on, and taking it back unless another holder is seen renewing it");
            loop {
                match self.take().await {
                    Ok(()) => break,
                    Err(Refused::HeldBy { holder, .. }) => return self.taken_by(&holder),
                    Err(_) => tokio::time::sleep(self.cfg.renew_every).await,
                }
            }
        }
    }

    fn taken_by(&self, holder: &str) -> Lost {
        Lost::TakenBy {
            namespace: self.cfg.namespace.clone(),
            name: self.cfg.name.clone(),
            holder: text::line(holder).into_owned(),
        }
    }

    fn not_renewed(&self, error: String) -> Lost {
        Lost::NotRenewed {
            namespace: self.cfg.namespace.clone(),
            name: self.cfg.name.clone(),
            seconds: self.cfg.renew_deadline.as_secs(),
            error,
        }
    }

    /// Hands the Lease back if the API server says this identity holds it,
    /// whatever this side knows: for a replica stopped while [`Self::acquire`]
    /// was writing, whose write may have taken the Lease after all.
    pub async fn release_if_held(&mut self) {
        if self.held.is_none() {
            match self.api.get_opt(&self.cfg.name).await {
                Ok(Some(l)) if l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(self.cfg.identity.as_str()) => {
                    self.held = Some(l);
                }
                _ => return,
            }
        }
        self.release().await;
    }

    /// Hands the Lease back (no holder), so another replica takes it at
    /// once instead of after [`LeaseConfig::duration`]. A renewal cut off
    /// by the stop may have been written after all, leaving this side's
    /// copy one version behind: on a conflict the Lease is read again and
    /// handed back if this identity still holds it (a few times).
    pub async fn release(&mut self) {
        let Some(mut l) = self.held.take() else { return };
        for attempt in 1..=3 {
            if let Some(s) = l.spec.as_mut() {
                s.holder_identity = None;
            }
            match self.api.replace(&self.cfg.name, &PostParams::default(), &l).await {
                Ok(_) => {
                    tracing::info!(lease = %self.cfg.name, "the Lease handed back");
                    return;
                }
                Err(kube::Error::Api(s)) if s.code == 409 && attempt == 3 => break,
                Err(kube::Error::Api(s)) if s.code == 409 => match self.api.get_opt(&self.cfg.name).await {
                    Ok(Some(fresh))
                        if fresh.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(self.cfg.identity.as_str()) =>
                    {
                        l = fresh;
                    }
                    // Another replica holds it now, or it is gone: nothing to hand back.
                    Ok(_) => return,
                    Err(e) => return self.release_failed(&e.to_string()),
                },
                Err(e) => return self.release_failed(&e.to_string()),
            }
        }
        self.release_failed("it kept changing while handed back");
    }

    fn release_failed(&self, error: &str) {
        tracing::warn!(
            lease = %self.cfg.name,
            "handing the Lease back failed: {}; another replica takes it when it expires",
            text::line(error)
        );
    }
}

/// The Lease taken for one operation of synchronous code and held, on a
/// thread of its own, until dropped (then it is handed back). `lost` is
/// called if another holder is seen renewing it meanwhile
/// ([`Elector::keep`]).
pub struct Held {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Held {
    /// Takes the Lease with a client made from `config` ([`Elector::take`]),
    /// or says why not; `gone` as [`Elector::with_gone`]. Waiting for it
    /// ends when `interrupted` is set.
    pub fn take(
        config: kube::Config,
        cfg: LeaseConfig,
        gone: impl Fn(&str) -> bool + Send + 'static,
        interrupted: std::sync::Arc<std::sync::atomic::AtomicBool>,
        lost: impl FnOnce(Lost) + Send + 'static,
    ) -> Result<Held, Refused> {
        let (taken_tx, taken_rx) = std::sync::mpsc::channel::<Result<(), Refused>>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Refused::api(&cfg, &format!("no runtime for it: {e}")))?;
        let on_thread = cfg.clone();
        let thread = std::thread::Builder::new()
            .name("kubexm-lease".into())
            .spawn(move || {
                let cfg = on_thread;
                rt.block_on(async move {
                    let client = match kube::Client::try_from(config) {
                        Ok(c) => c,
                        Err(e) => {
                            let _ = taken_tx.send(Err(Refused::api(&cfg, &format!("no client for the API server: {e}"))));
                            return;
                        }
                    };
                    let stopped = Refused::Interrupted {
                        namespace: cfg.namespace.clone(),
                        name: cfg.name.clone(),
                    };
                    let mut elector = Elector::new(client, cfg).with_gone(gone);
                    let watch = async {
                        while !interrupted.load(std::sync::atomic::Ordering::Relaxed) {
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    };
                    let taken = tokio::select! {
                        taken = elector.take() => taken,
                        () = watch => Err(stopped),
                    };
                    let ok = taken.is_ok();
                    let _ = taken_tx.send(taken);
                    if !ok {
                        return;
                    }
                    tokio::select! {
                        why = elector.keep() => lost(why),
                        _ = stop_rx => {
                            // An API server gone for good (a reset) is not waited for.
                            let _ = tokio::time::timeout(Duration::from_secs(5), elector.release()).await;
                        }
                    }
                })
            })
            .map_err(|e| Refused::api(&cfg, &format!("no thread for it: {e}")))?;
        match taken_rx.recv() {
            Ok(Ok(())) => Ok(Held {
                stop: Some(stop_tx),
                thread: Some(thread),
            }),
            Ok(Err(refused)) => {
                let _ = thread.join();
                Err(refused)
            }
            Err(_) => {
                let _ = thread.join();
                Err(Refused::api(&cfg, "its thread ended before it was taken"))
            }
        }
    }
}

impl Drop for Held {
    /// Hands the Lease back and waits for that (at most about 5 s: an API
    /// server that does not answer is not waited for).
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
