//! What a Cluster object asks for, decided without touching anything: its
//! `spec` (hostile: whoever may edit the object wrote it) read under the
//! rules of a config sent as a request, then held against the spec last
//! applied to the hosts with the same rules `kubexm-install apply` uses
//! ([`kubexm_bom::changes`]). The answer is one [`Decision`]; the
//! controller turns it into conditions and Events ([`status_for`]).

use std::collections::BTreeMap;

use kubexm_bom::changes::{Changes, changes};
use kubexm_bom::config::{Cluster, LoadError, Origin, load_str_as};
use kubexm_bom::diag::{Diagnostics, Kind};
use kubexm_bom::record::{ClusterRecord, JobRef};
use kubexm_crd::{ClusterStatus, Condition, ConditionStatus, ConditionType};
use serde_json::{Value, json};

/// At most this many problems are named in one condition's message.
const MAX_NAMED: usize = 5;

/// One problem with a spec: the field's path and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// `spec.kubernetes.podCIDR`, or empty for the whole spec.
    pub path: String,
    pub message: String,
}

/// What the controller does about a Cluster object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// `spec.paused: true`: nothing is read or changed.
    Paused,
    /// The spec asks for nothing on the hosts (as applied, or only
    /// settings the installer's machine reads changed).
    AsApplied,
    /// The spec does not read as a cluster config: each problem named.
    Invalid(Vec<Problem>),
    /// The spec changes what can never change on an installed cluster.
    CannotChange(Vec<Problem>),
    /// The spec asks for a change kubexm does not make yet.
    NotSupportedYet(Vec<Problem>),
    /// A change `kubexm-install remove node` and `apply` make (hosts
    /// removed, hosts added, the registry moved): what it is. A controller
    /// given the installer's state runs it; otherwise it is reported.
    NotRunYet(String),
    /// The spec last applied to the hosts is missing or does not read:
    /// why. Nothing can be decided; the generation stays unobserved, so
    /// the object is decided once it is there.
    AppliedUnreadable(String),
}

/// The config document a Cluster object named `name` whose spec is `spec` is.
fn document(name: &str, spec: &Value) -> String {
    json!({"apiVersion": "kubexm.io/v1alpha1", "kind": "Cluster", "metadata": {"name": name}, "spec": spec}).to_string()
}

/// `spec` as a completed config, read as a request's (it may name no file,
/// variable or agent of the machine the controller runs on). A spec that
/// sets no login for its hosts (the install writes none into the cluster)
/// logs in with the controller's credential, the Secret
/// [`kubexm_crd::CREDENTIAL`].
fn load(name: &str, spec: &Value, file: &str) -> Result<Cluster, LoadError> {
    load_str_as(&config_text(name, spec), file, None, Origin::Request)
}

/// The config document the Cluster object `name` whose spec is `spec`
/// stands for, its hosts logging in with the controller's credential
/// unless the spec names a login.
pub fn config_text(name: &str, spec: &Value) -> String {
    let mut spec = spec.clone();
    if let Some(obj) = spec.as_object_mut() {
        let defaults = obj.entry("hostDefaults").or_insert_with(|| json!({}));
        if let Some(d) = defaults.as_object_mut() {
            d.entry("auth").or_insert_with(|| json!({"credential": kubexm_crd::CREDENTIAL}));
        }
    }
    document(name, &spec)
}

/// `spec` as a completed config (read as a request's).
pub fn load_spec(name: &str, spec: &Value) -> Result<Cluster, LoadError> {
    load(name, spec, &format!("clusters.kubexm.io/{name}"))
}

/// The spec last applied to cluster `name`, as a completed config.
pub fn load_applied(name: &str, applied: &Value) -> Result<Cluster, LoadError> {
    load(name, applied, "the applied spec")
}

/// Every problem of `d`, in order.
fn problems(d: &Diagnostics) -> Vec<Problem> {
    d.diagnostics
        .iter()
        .map(|x| Problem {
            path: x.path.clone(),
            message: match &x.hint {
                Some(h) => format!("{} ({h})", x.message),
                None => x.message.clone(),
            },
        })
        .collect()
}

/// Whether `spec` asks the controller to leave the cluster alone.
pub fn paused(spec: &Value) -> bool {
    spec.get("paused").and_then(Value::as_bool) == Some(true)
}

/// What the Cluster `name` whose spec is `spec` asks for, against the spec
/// last applied (`applied`, read from `applied_source`). An applied spec
/// that does not read decides nothing ([`Decision::AppliedUnreadable`]):
/// the controller cannot know what the hosts run.
pub fn decide(name: &str, spec: &Value, applied: &Value, applied_source: &str) -> Decision {
    if paused(spec) {
        return Decision::Paused;
    }
    let file = format!("clusters.kubexm.io/{name}");
    let new = match load(name, spec, &file) {
        Ok(c) => c,
        Err(LoadError::Invalid(d)) => return Decision::Invalid(problems(&d)),
        Err(e) => {
            return Decision::Invalid(vec![Problem {
                path: String::new(),
                message: e.to_string(),
            }]);
        }
    };
    let old = match load(name, applied, applied_source) {
        Ok(c) => c,
        Err(e) => {
            return Decision::AppliedUnreadable(format!(
                "the spec last applied ({applied_source}) does not read as a cluster config: {e}"
            ));
        }
    };
    let job = JobRef {
        id: 0,
        kind: "install".into(),
        status: "succeeded".into(),
        finished: 0,
    };
    // Hosts taken out are removed first (as `remove node`): the rest is
    // held against the cluster without them.
    let gone = crate::act::removed(&old, &new);
    let record = ClusterRecord::new(&without(&old, &gone), job, None, None, &BTreeMap::new());
    match changes(&record, &new, None, &file) {
        Ok(c) if c.is_empty() && gone.is_empty() => Decision::AsApplied,
        Ok(c) => Decision::NotRunYet(describe(&c, &gone)),
        Err(d) => {
            // Every problem, what can never change first (a stable sort):
            // one of those makes the whole change impossible.
            let mut all: Vec<(bool, Problem)> = d
                .diagnostics
                .iter()
                .map(|x| x.kind == Kind::Unsupported)
                .zip(problems(&d))
                .collect();
            all.sort_by_key(|(unsupported, _)| *unsupported);
            let never = all.first().is_some_and(|(unsupported, _)| !unsupported);
            let ordered = all.into_iter().map(|(_, p)| p).collect();
            if never {
                Decision::CannotChange(ordered)
            } else {
                Decision::NotSupportedYet(ordered)
            }
        }
    }
}

/// `c` without the hosts `gone`, from its hosts and every role.
fn without(c: &Cluster, gone: &[String]) -> Cluster {
    let mut out = c.clone();
    let kept = |h: &String| !gone.contains(h);
    out.spec.hosts.retain(|h| kept(&h.name));
    let g = &mut out.spec.role_groups;
    for list in [
        &mut g.etcd,
        &mut g.control_plane,
        &mut g.worker,
        &mut g.loadbalancer,
        &mut g.registry,
    ] {
        list.retain(kept);
    }
    out
}

/// What a removal and an apply would do, in a sentence.
fn describe(c: &Changes, gone: &[String]) -> String {
    let mut parts = Vec::new();
    if !gone.is_empty() {
        parts.push(format!("removes {}", gone.join(", ")));
    }
    if !c.added.is_empty() {
        parts.push(format!("adds {}", c.added.join(", ")));
    }
    if let Some((from, to)) = &c.registry {
        parts.push(format!("moves the registry from {from} to {to}"));
    }
    parts.join(" and ")
}

/// `problems` as one message: each `path: message`, at most [`MAX_NAMED`].
fn listed(problems: &[Problem]) -> String {
    let mut text: Vec<String> = problems
        .iter()
        .take(MAX_NAMED)
        .map(|p| {
            if p.path.is_empty() {
                p.message.clone()
            } else {
                format!("{}: {}", p.path, p.message)
            }
        })
        .collect();
    if problems.len() > MAX_NAMED {
        text.push(format!("and {} more", problems.len() - MAX_NAMED));
    }
    text.join("; ")
}

/// A condition the controller sets: its type, status, reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Set {
    pub type_: ConditionType,
    pub status: ConditionStatus,
    pub reason: String,
    pub message: String,
}

impl Set {
    fn new(type_: ConditionType, status: ConditionStatus, reason: &str, message: impl Into<String>) -> Set {
        Set {
            type_,
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// The conditions `decision` sets (the others stay as they are), and
/// whether the generation counts as observed: a paused object's does not,
/// so that unpausing acts on it.
pub fn conditions_for(decision: &Decision, name: &str) -> (Vec<Set>, bool) {
    use ConditionStatus::{False, True};
    use ConditionType::{Failed, NotSupported, Reconciling};
    let nothing_run = "nothing was run and the hosts are as before";
    let apply = format!(
        "run it with kubexm-install for cluster {name} where it was installed (`remove node HOST -f cluster.yaml` for a \
         host taken out, then `apply -f cluster.yaml --bundle BUNDLE`), or start the controller with --root; apply's \
         operator phase brings this object's status up to date"
    );
    // A refusal: NotSupported True with `reason` and `message`, nothing
    // reconciling, the spec read.
    let refused = |reason: &str, message: String| {
        (
            vec![
                Set::new(NotSupported, True, reason, message),
                Set::new(Reconciling, False, reason, "see NotSupported"),
                Set::new(Failed, False, reason, "the spec reads as a cluster config: see NotSupported"),
            ],
            true,
        )
    };
    match decision {
        Decision::Paused => (
            vec![Set::new(
                Reconciling,
                False,
                "Paused",
                "spec.paused is true: the controller changes nothing until it is false",
            )],
            false,
        ),
        Decision::AsApplied => (
            vec![
                Set::new(Reconciling, False, "AsApplied", "the spec asks for nothing on the hosts"),
                Set::new(NotSupported, False, "AsApplied", "the spec asks for nothing kubexm cannot do"),
                Set::new(Failed, False, "AsApplied", "the spec reads as a cluster config"),
            ],
            true,
        ),
        Decision::Invalid(p) => (
            vec![
                Set::new(Failed, True, "InvalidSpec", format!("{}; {nothing_run}", listed(p))),
                Set::new(Reconciling, False, "InvalidSpec", "the spec does not read: see Failed"),
                Set::new(NotSupported, False, "InvalidSpec", "the spec does not read: see Failed"),
            ],
            true,
        ),
        Decision::AppliedUnreadable(why) => (
            vec![
                Set::new(Failed, True, "AppliedSpecUnreadable", format!("{why}; {nothing_run}")),
                Set::new(Reconciling, False, "AppliedSpecUnreadable", "see Failed"),
            ],
            false,
        ),
        Decision::CannotChange(p) => refused("CannotChange", format!("{}; {nothing_run}: put the applied value back", listed(p))),
        Decision::NotSupportedYet(p) => refused("NotSupportedYet", format!("{}; {nothing_run}", listed(p))),
        Decision::NotRunYet(what) => refused(
            "ControllerDoesNotApplyYet",
            format!("the spec {what}: the controller does not run that change yet ({nothing_run}); {apply}"),
        ),
    }
}

/// `status` with `sets` merged in at `generation` (`now`, RFC 3339, as the
/// transition time of each condition whose status moves), and
/// `observedGeneration` moved when `observed`.
pub fn status_for(status: &ClusterStatus, sets: &[Set], observed: bool, generation: i64, now: &str) -> ClusterStatus {
    let mut out = status.clone();
    for s in sets {
        let old = out.conditions.iter().position(|c| c.type_ == s.type_);
        let moved = old.is_none_or(|i| out.conditions[i].status != s.status);
        let kept = old.and_then(|i| out.conditions[i].last_transition_time.clone());
        let c = Condition {
            type_: s.type_,
            status: s.status,
            reason: s.reason.clone(),
            message: s.message.clone(),
            last_transition_time: if moved { Some(now.to_string()) } else { kept },
            observed_generation: Some(generation),
        };
        match old {
            Some(i) => out.conditions[i] = c,
            None => out.conditions.push(c),
        }
    }
    if observed {
        out.observed_generation = Some(generation);
    }
    out
}

/// The Event a decision is worth, if any: `(warning, reason, note)`.
pub fn event_for(decision: &Decision, sets: &[Set]) -> Option<(bool, String, String)> {
    let first = |t: ConditionType| sets.iter().find(|s| s.type_ == t && s.status == ConditionStatus::True);
    match decision {
        Decision::Invalid(_) | Decision::AppliedUnreadable(_) => {
            first(ConditionType::Failed).map(|s| (true, s.reason.clone(), s.message.clone()))
        }
        Decision::CannotChange(_) | Decision::NotSupportedYet(_) | Decision::NotRunYet(_) => {
            first(ConditionType::NotSupported).map(|s| (true, s.reason.clone(), s.message.clone()))
        }
        Decision::Paused => Some((false, "Paused".into(), "spec.paused is true: nothing is changed".into())),
        Decision::AsApplied => None,
    }
}
