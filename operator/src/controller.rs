//! The reconcile loop: kube-rs' `Controller` over the Cluster objects of
//! one namespace, read as untyped objects (a spec the model cannot read is
//! reported on the object, it never stops the watch). A generation past
//! `observedGeneration` is decided ([`crate::decide`]) against the spec
//! last applied (the ConfigMap [`applied_name`], written by the install's
//! operator phase); otherwise the nodes are read again and the status
//! follows them. Every status is written with a merge patch of the status
//! subresource, only when it changed; an Event goes with each decision
//! that is worth one. Text from the object is escaped before it reaches a
//! log, a condition or an Event.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use kubexm_bom::text;
use kubexm_crd::{APPLIED_KEY, ClusterResource, ClusterStatus, applied_name};
use serde_json::{Value, json};

use crate::act::ActOptions;
use crate::decide::{self, Decision};
use crate::nodes;

/// How often a Cluster is looked at again when nothing happened (its nodes).
const RESYNC: Duration = Duration::from_secs(30);

/// An Event's note is at most 1 kB.
const MAX_NOTE: usize = 1000;

/// Why one reconcile failed (it is tried again).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("the API server: {0} (tried again)")]
    Kube(#[from] kube::Error),
}

/// What every reconcile shares.
pub struct Ctx {
    pub client: Client,
    pub namespace: String,
    pub resource: ApiResource,
    pub recorder: Recorder,
    /// This replica's name in the Lease.
    pub identity: String,
    /// Where changes are run; `None`: they are decided and reported only.
    pub act: Option<ActOptions>,
    /// Set when the controller stops: a running job starts no new step.
    pub stop: Arc<AtomicBool>,
    /// Held by a running job (one permit): a stopping leader takes it
    /// before it hands the Lease back.
    pub busy: Arc<tokio::sync::Semaphore>,
}

impl Ctx {
    pub fn new(client: Client, namespace: &str, identity: &str, act: Option<ActOptions>) -> Ctx {
        let reporter = Reporter {
            controller: "kubexm-controller-manager".into(),
            instance: Some(identity.to_string()),
        };
        Ctx {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            namespace: namespace.to_string(),
            resource: ApiResource::erase::<ClusterResource>(&()),
            identity: identity.to_string(),
            act,
            stop: Arc::new(AtomicBool::new(false)),
            busy: Arc::new(tokio::sync::Semaphore::new(1)),
        }
    }
}

/// Runs the controller until the watch ends.
pub async fn run(ctx: Arc<Ctx>) {
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ctx.namespace, &ctx.resource);
    Controller::new_with(api, watcher::Config::default(), ctx.resource.clone())
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::warn!("{}", text::line(&e.to_string()));
            }
        })
        .await;
}

fn error_policy(obj: Arc<DynamicObject>, e: &ReconcileError, _: Arc<Ctx>) -> Action {
    // Written by someone else since it was read: read it again at once.
    if let ReconcileError::Kube(kube::Error::Api(s)) = e
        && s.code == 409
    {
        return Action::requeue(Duration::from_secs(1));
    }
    tracing::warn!(cluster = %text::line(&obj.name_any()), "reconcile failed: {}; trying again in 10 s", text::line(&e.to_string()));
    Action::requeue(Duration::from_secs(10))
}

/// Now, as a condition's time.
fn now() -> String {
    Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The spec last applied to `name`'s hosts (`source` names where), or why
/// there is none to read.
async fn applied(ctx: &Ctx, name: &str, source: &str) -> Result<Result<Value, String>, ReconcileError> {
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let missing = |what: String| {
        format!(
            "{what}: kubexm-install's operator phase writes it; run `kubexm-install apply -f cluster.yaml --bundle BUNDLE` \
             where the cluster was installed"
        )
    };
    let Some(map) = maps.get_opt(&applied_name(name)).await? else {
        return Ok(Err(missing(format!("the spec last applied to the hosts is not there ({source})"))));
    };
    Ok(match map.data.as_ref().and_then(|d| d.get(APPLIED_KEY)) {
        Some(t) => serde_json::from_str(t).map_err(|e| missing(format!("{source}'s {APPLIED_KEY} is not JSON ({e})"))),
        None => Err(missing(format!("{source} has no {APPLIED_KEY}"))),
    })
}

async fn reconcile(obj: Arc<DynamicObject>, ctx: Arc<Ctx>) -> Result<Action, ReconcileError> {
    let name = obj.name_any();
    let generation = obj.metadata.generation.unwrap_or(0);
    let version = obj.metadata.resource_version.clone().unwrap_or_default();
    let spec = obj.data.get("spec").cloned().unwrap_or_else(|| json!({}));
    // A status the controller cannot read is written anew.
    let status: ClusterStatus = obj
        .data
        .get("status")
        .and_then(|s| serde_json::from_value(s.clone()).ok())
        .unwrap_or_default();
    let started = Instant::now();
    let source = format!("configmap {}/{}", ctx.namespace, applied_name(&name));
    let applied = applied(&ctx, &name, &source).await?;
    let paused = decide::paused(&spec);
    if status.observed_generation == Some(generation) && !paused {
        if let Ok(a) = &applied {
            refresh_nodes(&ctx, &status, &name, &version, a, generation).await?;
        }
        return Ok(Action::requeue(RESYNC));
    }
    let decision = match &applied {
        _ if paused => Decision::Paused,
        Err(why) => Decision::AppliedUnreadable(why.clone()),
        Ok(a) => decide::decide(&name, &spec, a, &source),
    };
    if let (Decision::NotRunYet(what), Some(act), Ok(a)) = (&decision, &ctx.act, &applied) {
        let at = Seen {
            name: &name,
            version: &version,
            generation,
            status: &status,
            operation: None,
        };
        crate::run::change(&ctx, act, &obj, &at, &spec, a, what).await?;
        return Ok(Action::requeue(RESYNC));
    }
    let (mut sets, observed) = decide::conditions_for(&decision, &name);
    for s in &mut sets {
        s.message = text::line(&s.message).into_owned();
    }
    let next = decide::status_for(&status, &sets, observed, generation, &now());
    let changed = write_status(&ctx, &name, &version, &status, &next).await?;
    tracing::info!(
        cluster = %text::line(&name),
        generation,
        "decided {} in {} ms",
        text::line(&format!("{decision:?}")),
        started.elapsed().as_millis()
    );
    if changed && let Some((warning, reason, note)) = decide::event_for(&decision, &sets) {
        event(&ctx, &obj, warning, &reason, &note).await;
    }
    Ok(Action::requeue(RESYNC))
}

/// A Cluster object as a reconcile read it.
pub(crate) struct Seen<'a> {
    pub(crate) name: &'a str,
    pub(crate) version: &'a str,
    pub(crate) generation: i64,
    pub(crate) status: &'a ClusterStatus,
    /// The job a run ended with, for `lastOperation`.
    pub(crate) operation: Option<kubexm_crd::Operation>,
}

/// `sets` written into the status of the object `at` read (observing its
/// generation when `observed`), with an Event when it changed.
pub(crate) async fn report(
    ctx: &Ctx,
    obj: &DynamicObject,
    at: &Seen<'_>,
    mut sets: Vec<decide::Set>,
    observed: bool,
    event_of: Option<(bool, &str)>,
) -> Result<(), ReconcileError> {
    for s in &mut sets {
        s.message = bounded(&s.message);
    }
    let mut next = decide::status_for(at.status, &sets, observed, at.generation, &now());
    if let Some(op) = &at.operation {
        next.last_operation = Some(op.clone());
    }
    let changed = write_status(ctx, at.name, at.version, at.status, &next).await?;
    if changed && let Some((warning, reason)) = event_of {
        let note = sets
            .iter()
            .find(|s| s.reason == reason)
            .map(|s| s.message.clone())
            .unwrap_or_default();
        event(ctx, obj, warning, reason, &note).await;
    }
    Ok(())
}

/// `message` on one line, escaped, at most [`MAX_NOTE`] bytes.
fn bounded(message: &str) -> String {
    let mut note = text::line(message).into_owned();
    if note.len() > MAX_NOTE {
        let mut cut = MAX_NOTE - 3;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
        note.push_str("...");
    }
    note
}

/// The nodes as the API server shows them now, into the status when they moved.
async fn refresh_nodes(
    ctx: &Ctx,
    status: &ClusterStatus,
    name: &str,
    resource_version: &str,
    applied: &Value,
    generation: i64,
) -> Result<(), ReconcileError> {
    let cluster = match decide::load_applied(name, applied) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(
                cluster = %text::line(name),
                "the applied spec does not read, the nodes are not refreshed: {}",
                text::line(&e.to_string())
            );
            return Ok(());
        }
    };
    let list = Api::<Node>::all(ctx.client.clone()).list(&ListParams::default()).await?;
    let now_nodes = nodes::node_statuses(&cluster, &list.items);
    let mut next = status.clone();
    next.ready_nodes = now_nodes.iter().filter(|n| n.ready).count() as u32;
    next.nodes = now_nodes;
    let ready = nodes::ready(&next.nodes);
    let next = decide::status_for(&next, std::slice::from_ref(&ready), false, generation, &now());
    if write_status(ctx, name, resource_version, status, &next).await? {
        tracing::info!(cluster = %text::line(name), "nodes: {}", text::line(&ready.message));
    }
    Ok(())
}

/// Writes `next` when it is not `old`, over the object at
/// `resource_version` only: a status written meanwhile (by the install's
/// operator phase) is a conflict and read again, never overwritten with
/// what the controller read before. Whether it wrote.
async fn write_status(
    ctx: &Ctx,
    name: &str,
    resource_version: &str,
    old: &ClusterStatus,
    next: &ClusterStatus,
) -> Result<bool, ReconcileError> {
    if old == next {
        return Ok(false);
    }
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ctx.namespace, &ctx.resource);
    let patch = json!({ "metadata": {"resourceVersion": resource_version}, "status": next });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(true)
}

/// Publishes an Event on the Cluster object; a failure is only logged.
async fn event(ctx: &Ctx, obj: &DynamicObject, warning: bool, reason: &str, note: &str) {
    let note = bounded(note);
    let ev = Event {
        type_: if warning { EventType::Warning } else { EventType::Normal },
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &obj.object_ref(&ctx.resource)).await {
        tracing::warn!("publishing an Event failed: {}", text::line(&e.to_string()));
    }
}
