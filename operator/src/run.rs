//! Running a change the controller decided ([`crate::act`]) and reporting
//! it on the Cluster object. The object is read again first (a reconcile
//! queued from a cache that lags must not run a change already reported).
//! A host without a pinned key, or no login, is refused before any host
//! is touched. Otherwise Reconciling is True while the job runs on a
//! blocking thread, which holds the controller's `busy` permit so that a
//! stopping leader hands its Lease back only once the job has stopped;
//! then Applied or ApplyFailed, with `lastOperation`. A leader that fails
//! over leaves the generation unobserved: the next leader runs the change
//! again at once, skipping the steps done.

use std::sync::Arc;
use std::time::Instant;

use kube::Api;
use kube::api::DynamicObject;
use kubexm_bom::text;
use kubexm_crd::ClusterStatus;
use kubexm_crd::ConditionStatus::{self, False, True};
use kubexm_crd::ConditionType::{self, Failed, NotSupported, Reconciling};
use kubexm_installer::engine::trust::Credentials;
use serde_json::Value;

use crate::act::{self, ActOptions, Pinned};
use crate::controller::{Ctx, ReconcileError, Seen, report};
use crate::decide::{self, Set};

fn set(type_: ConditionType, status: ConditionStatus, reason: &str, message: String) -> Set {
    Set {
        type_,
        status,
        reason: reason.into(),
        message,
    }
}

/// The conditions of a change refused before any host is touched.
fn refused(reason: &str, message: String) -> Vec<Set> {
    vec![
        set(
            Failed,
            True,
            reason,
            format!("{message}; nothing was run and the hosts are as before"),
        ),
        set(Reconciling, False, reason, "see Failed".into()),
        set(
            NotSupported,
            False,
            reason,
            "the change is one the controller runs: see Failed".into(),
        ),
    ]
}

/// What a run needs, checked before any host is touched.
struct Prepared {
    /// The keys of the hosts of both specs (the removal's and the apply's).
    pins: Pinned,
    /// The hosts taken out.
    gone: Vec<String>,
    credentials: Arc<dyn Credentials>,
}

/// A refusal: its reason, message, and whether the generation counts as
/// observed (not for a missing login: the next resync tries again once
/// the Secret is made).
type Refusal = (&'static str, String, bool);

async fn prepare(ctx: &Ctx, act: &ActOptions, name: &str, spec: &Value, applied: &Value) -> Result<Prepared, Refusal> {
    let (new, old) = match (decide::load_spec(name, spec), decide::load_applied(name, applied)) {
        (Ok(n), Ok(o)) => (n, o),
        (Err(e), _) | (_, Err(e)) => return Err(("InvalidSpec", e.to_string(), true)),
    };
    let pins = act::pins(act, &old, &new).map_err(|missing| ("HostKeyMissing", missing.join("; "), true))?;
    let credentials = act::login(&ctx.client, &ctx.namespace)
        .await
        .map_err(|why| ("CredentialMissing", format!("{why}; the controller tries again every 30 s"), false))?;
    Ok(Prepared {
        pins,
        gone: act::removed(&old, &new),
        credentials,
    })
}

/// Runs the change `what` the object `at` asks for, as `kubexm-install
/// remove node` and `apply` would, and reports it.
pub(crate) async fn change(
    ctx: &Ctx,
    act: &ActOptions,
    obj: &DynamicObject,
    at: &Seen<'_>,
    spec: &Value,
    applied: &Value,
    what: &str,
) -> Result<(), ReconcileError> {
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ctx.namespace, &ctx.resource);
    let fresh = api.get(at.name).await?;
    let status = status_of(&fresh);
    if fresh.metadata.generation != Some(at.generation) || status.observed_generation >= Some(at.generation) {
        return Ok(());
    }
    let version = fresh.metadata.resource_version.clone().unwrap_or_default();
    let at = Seen {
        name: at.name,
        version: &version,
        generation: at.generation,
        status: &status,
        operation: None,
    };
    let prepared = match prepare(ctx, act, at.name, spec, applied).await {
        Ok(p) => p,
        Err((reason, message, observed)) => {
            return report(ctx, obj, &at, refused(reason, message), observed, Some((true, reason))).await;
        }
    };
    let running = format!(
        "the spec {what}: {} runs it on the hosts (kubexm-install apply's job)",
        ctx.identity
    );
    let sets = vec![
        set(Reconciling, True, "Applying", running),
        set(Failed, False, "Applying", "the change is running: see Reconciling".into()),
        set(NotSupported, False, "Applying", "the change is one the controller runs".into()),
    ];
    report(ctx, obj, &at, sets, false, Some((false, "Applying"))).await?;
    tracing::info!(cluster = %text::line(at.name), "applying: the spec {}", text::line(what));
    let started = Instant::now();
    let ran = run(ctx, act, at.name, spec, applied, prepared).await;
    let took = started.elapsed().as_secs_f64();
    tracing::info!(
        cluster = %text::line(at.name),
        "the change ran in {took:.1} s: {}",
        text::line(ran.result.as_ref().map_or_else(|e| e.as_str(), |r| r.as_str()))
    );
    // The install's operator phase wrote the status meanwhile: read it again.
    let fresh = api.get(at.name).await?;
    let version = fresh.metadata.resource_version.clone().unwrap_or_default();
    let status = status_of(&fresh);
    let job = ran.operation.as_ref().map(|o| o.job);
    let (sets, reason, warning) = outcome(&ran.result, job, act, took);
    let now_at = Seen {
        name: at.name,
        version: &version,
        generation: at.generation,
        status: &status,
        operation: ran.operation,
    };
    report(ctx, obj, &now_at, sets, true, Some((warning, reason))).await
}

/// The status of `obj` (written anew when it does not read).
fn status_of(obj: &DynamicObject) -> ClusterStatus {
    obj.data
        .get("status")
        .and_then(|s| serde_json::from_value(s.clone()).ok())
        .unwrap_or_default()
}

/// The removal, then the apply, on a blocking thread holding `busy`.
async fn run(ctx: &Ctx, act: &ActOptions, name: &str, spec: &Value, applied: &Value, p: Prepared) -> act::Ran {
    let Ok(busy) = ctx.busy.clone().acquire_owned().await else {
        return act::Ran {
            result: Err("the controller is stopping".into()),
            operation: None,
        };
    };
    let login = || act::Login {
        credentials: p.credentials.clone(),
        pins: p.pins.all.clone(),
        identity: ctx.identity.clone(),
        stop: ctx.stop.clone(),
    };
    let (to_apply, to_remove) = (login(), login());
    let (added, gone) = (p.pins.added, p.gone);
    let (a, name, doc, old_doc) = (
        act.clone(),
        name.to_string(),
        decide::config_text(name, spec),
        decide::config_text(name, applied),
    );
    tokio::task::spawn_blocking(move || {
        let _busy = busy;
        let mut removed = act::Ran {
            result: Ok(String::new()),
            operation: None,
        };
        if !gone.is_empty() {
            removed = act::remove(&a, &name, old_doc, gone, to_remove);
            if removed.result.is_err() {
                return removed;
            }
        }
        // The apply brings the spec as applied and the status up to date.
        let ran = act::apply(&a, &name, doc, to_apply);
        if ran.result.is_ok()
            && let Err(e) = act::remember(&a, &added)
        {
            tracing::warn!("the added hosts' keys are not kept: {}", text::line(&e));
        }
        act::Ran {
            result: ran.result.map(|r| format!("{}{r}", removed.result.unwrap_or_default())),
            operation: ran.operation.or(removed.operation),
        }
    })
    .await
    .unwrap_or_else(|e| act::Ran {
        result: Err(format!("the run stopped: {e}")),
        operation: None,
    })
}

/// The conditions a run ended with, its reason and whether it is a warning.
fn outcome(result: &Result<String, String>, job: Option<i64>, act: &ActOptions, took: f64) -> (Vec<Set>, &'static str, bool) {
    match result {
        Ok(r) => {
            let said: Vec<&str> = r
                .lines()
                .filter(|l| l.starts_with("apply: adds") || l.starts_with("removed "))
                .collect();
            let said = if said.is_empty() { "applied".to_string() } else { said.join("; ") };
            (
                vec![
                    set(Reconciling, False, "Applied", format!("{said} (in {took:.0} s)")),
                    set(Failed, False, "Applied", "the change ran".into()),
                    set(NotSupported, False, "Applied", "the change is one the controller runs".into()),
                ],
                "Applied",
                false,
            )
        }
        Err(why) => {
            let steps = job
                .map(|j| {
                    format!(
                        "job {j} (`kubexm-install status --job {j} --state {}` shows its steps): ",
                        act.state.display()
                    )
                })
                .unwrap_or_default();
            (
                vec![
                    set(
                        Failed,
                        True,
                        "ApplyFailed",
                        format!("{steps}{why}; the steps done are kept: edit the object again to run the change again"),
                    ),
                    set(Reconciling, False, "ApplyFailed", "see Failed".into()),
                ],
                "ApplyFailed",
                true,
            )
        }
    }
}
