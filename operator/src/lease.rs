//! Leader election through a `coordination.k8s.io/v1` Lease, as
//! Kubernetes' own controllers do it: one holder at a time, named in the
//! Lease; the holder renews it every [`LeaseConfig::renew_every`]; another
//! replica takes it over once the holder has not renewed it for
//! [`LeaseConfig::duration`] as that replica's own clock measures it (the
//! holder's clock is never compared with ours); every write carries the
//! `resourceVersion` it read, so of two replicas racing for it one wins and
//! the other sees a conflict. A holder that cannot renew within
//! [`LeaseConfig::renew_deadline`] stops acting (a replica elsewhere may
//! already hold it); one that stops cleanly hands it back at once.
//!
//! Written here rather than taken from a crate so that the CLI's and the
//! API's day-2 operations can take the same Lease later with the same code.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use kubexm_bom::text;

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
}

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

impl Elector {
    pub fn new(client: kube::Client, cfg: LeaseConfig) -> Elector {
        Elector {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
            seen: Seen::default(),
            held: None,
            renewed_at: None,
        }
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
        let decided = step(spec, &self.cfg.identity, &mut self.seen, Instant::now(), self.cfg.duration);
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
                    return Lost::TakenBy {
                        namespace: self.cfg.namespace.clone(),
                        name: self.cfg.name.clone(),
                        holder: text::line(&holder).into_owned(),
                    };
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

    fn not_renewed(&self, error: String) -> Lost {
        Lost::NotRenewed {
            namespace: self.cfg.namespace.clone(),
            name: self.cfg.name.clone(),
            seconds: self.cfg.renew_deadline.as_secs(),
            error,
        }
    }

    /// Hands the Lease back (no holder), so another replica takes it at
    /// once instead of after [`LeaseConfig::duration`].
    pub async fn release(&mut self) {
        let Some(mut l) = self.held.take() else { return };
        if let Some(s) = l.spec.as_mut() {
            s.holder_identity = None;
        }
        match self.api.replace(&self.cfg.name, &PostParams::default(), &l).await {
            Ok(_) => tracing::info!(lease = %self.cfg.name, "the Lease handed back"),
            Err(e) => tracing::warn!(
                lease = %self.cfg.name,
                "handing the Lease back failed: {}; another replica takes it when it expires",
                text::line(&e.to_string())
            ),
        }
    }
}
