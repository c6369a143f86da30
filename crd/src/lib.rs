//! The `Cluster` custom resource of operator mode (issue 31):
//! `clusters.kubexm.io`, v1alpha1, its Rust types and the
//! CustomResourceDefinition generated from them. Shared by the install's
//! handoff and, later, the controller (`operator/`, docs/architecture.md).
//!
//! `spec` is cluster.yaml's `spec`, the same type ([`Spec`]); the object's
//! name is the cluster's. The schema is kube's structural rewrite of the
//! model's, with two changes: no defaults (they live in the model's
//! `defaults.rs` and are applied when a spec is read, never stored in an
//! object), and none of the fields that name a file, a variable or the SSH
//! agent ([`OFF_MACHINE`]): the controller runs inside the cluster, and a
//! host logs in with `auth: {credential: NAME}`. kubectl's strict field
//! validation refuses such a field by name; other clients see it pruned.
//! `status` is the controller's: conditions, nodes, versions and the last
//! operation's job, never a secret.
//!
//! The definition is committed at [`CRD_FILE`]; a test checks that it is
//! what this module generates.

use kube::{CustomResource, CustomResourceExt};
use kubexm_bom::config::model::Spec;
use kubexm_bom::config::untrusted::OFF_MACHINE;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The namespace the Cluster object, its Secrets and its controller live in.
pub const NAMESPACE: &str = "kubexm-system";

/// The credential (a Secret in [`NAMESPACE`]) the controller logs in to
/// the hosts with when the spec names none: the install writes no login
/// into the cluster.
pub const CREDENTIAL: &str = "kubexm-ssh";

/// The ConfigMap in [`NAMESPACE`] holding the spec last applied to the
/// hosts of cluster `name` (key [`APPLIED_KEY`]), as the Cluster object
/// carries it: the install's operator phase writes it, the controller holds
/// a changed object against it. It belongs to the hosts, not to the object:
/// deleting the Cluster leaves it, so an object applied again is held
/// against what the hosts run.
pub fn applied_name(name: &str) -> String {
    format!("kubexm-applied-{name}")
}

/// The key of [`applied_name`]'s ConfigMap holding the spec, as JSON.
pub const APPLIED_KEY: &str = "spec.json";

/// The committed definition, from the repository's root.
pub const CRD_FILE: &str = "manifests/crds/clusters.kubexm.io.yaml";

/// A cluster as kubectl sees it: cluster.yaml's `spec`, and what the
/// controller last saw and did in `status`.
#[derive(CustomResource, Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kubexm.io",
    version = "v1alpha1",
    kind = "Cluster",
    root = "ClusterResource",
    namespaced,
    status = "ClusterStatus",
    shortname = "kxc",
    category = "kubexm",
    printcolumn = r#"{"name": "Version", "type": "string", "jsonPath": ".status.version"}"#,
    printcolumn = r#"{"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name": "Reason", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name": "Nodes", "type": "integer", "jsonPath": ".status.readyNodes", "priority": 1}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(transparent)]
pub struct ClusterSpec {
    /// cluster.yaml's `spec`.
    pub cluster: Spec,
}

/// What the controller last saw and did. Written by the controller only.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct ClusterStatus {
    /// The `metadata.generation` this status describes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready, Reconciling, Failed, NotSupported: one of each at most.
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The Kubernetes version the control plane runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The control-plane endpoint (`host:port`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The digest (`sha256:...`) of the bundle the cluster was last changed with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bundle: Option<String>,
    /// How many of `nodes` are Ready.
    pub ready_nodes: u32,
    /// Every node: its roles, kubelet version and readiness.
    pub nodes: Vec<NodeStatus>,
    /// The last operation the controller ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_operation: Option<Operation>,
}

/// A condition of the Cluster, as Kubernetes' own objects carry them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: ConditionType,
    /// `True`, `False` or `Unknown`.
    pub status: ConditionStatus,
    /// One CamelCase word a program can match.
    pub reason: String,
    /// What a person reads: what happened, where, and what to do.
    pub message: String,
    /// RFC 3339, when `status` last changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The conditions a Cluster has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConditionType {
    /// Every node Ready at the spec's version; nothing left to do.
    Ready,
    /// An operation runs.
    Reconciling,
    /// The last operation failed, or the spec cannot be read; the message names why.
    Failed,
    /// The spec asks for a change kubexm does not make; the message names the field.
    NotSupported,
}

/// A condition's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

/// One node as the controller last read it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct NodeStatus {
    /// The host's name in the spec (its node's name).
    pub name: String,
    /// `etcd`, `control-plane`, `worker`, `loadbalancer`, `local-proxy`.
    pub roles: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubelet_version: Option<String>,
    pub ready: bool,
}

/// The last operation the controller ran: its job and how it ended.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct Operation {
    /// The job's id in the controller's state.
    pub job: i64,
    /// `apply`, `add-nodes`, `remove-nodes`, `upgrade`.
    pub kind: String,
    /// `running`, `succeeded` or `failed`.
    pub result: String,
    /// The critical path's length per phase, as `status --timeline` sums it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeline: Option<String>,
}

/// Why the definition could not be generated: the model and [`OFF_MACHINE`]
/// disagree (a field moved or was renamed), a bug caught by this crate's tests.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    #[error("the generated CustomResourceDefinition has no {0} (a bug in kubexm: OFF_MACHINE and the model disagree; report it)")]
    Missing(String),
    #[error("the CustomResourceDefinition does not serialize: {0}")]
    Json(#[from] serde_json::Error),
    #[error("the CustomResourceDefinition does not serialize as YAML: {0}")]
    Yaml(String),
}

/// The CustomResourceDefinition, as JSON: kube's, without defaults and
/// without the [`OFF_MACHINE`] fields.
pub fn definition() -> Result<Value, CrdError> {
    let mut crd = serde_json::to_value(ClusterResource::crd())?;
    let schema = crd
        .pointer_mut("/spec/versions/0/schema/openAPIV3Schema")
        .ok_or_else(|| CrdError::Missing("openAPIV3Schema".into()))?;
    strip_defaults(schema);
    let spec = schema
        .pointer_mut("/properties/spec")
        .ok_or_else(|| CrdError::Missing("spec in its schema".into()))?;
    for path in OFF_MACHINE {
        remove(spec, path)?;
    }
    Ok(crd)
}

/// The definition as the YAML committed at [`CRD_FILE`].
pub fn yaml() -> Result<String, CrdError> {
    let body = serde_saphyr::to_string(&definition()?).map_err(|e| CrdError::Yaml(e.to_string()))?;
    Ok(format!(
        "# The Cluster custom resource, generated from cluster.yaml's Rust model\n\
         # (crd/src/lib.rs); do not edit: regenerate with\n\
         # KUBEXM_BLESS=1 cargo test -p kubexm-crd\n{body}"
    ))
}

/// Where a host's login is set: until the controller is built (it will log
/// in with a credential Secret), the object carries none.
pub const LOGINS: &[&str] = &[
    "hostDefaults.auth",
    "hostDefaults.bastion.auth",
    "hosts[].auth",
    "hosts[].bastion.auth",
];

/// `spec` as a Cluster object carries it, as JSON: every [`OFF_MACHINE`]
/// field and every login ([`LOGINS`]) left out. What is left names nothing
/// on the machine that read cluster.yaml. JSON, not a [`Spec`]: read back
/// into one, a required field cleared would come back empty.
pub fn in_cluster(spec: &Spec) -> Result<Value, CrdError> {
    let mut v = serde_json::to_value(spec)?;
    for path in OFF_MACHINE.iter().chain(LOGINS) {
        clear(&mut v, &steps(path));
    }
    Ok(v)
}

/// A path (`a.b[].c`) as its steps: each name, and whether it steps into
/// a list's items.
fn steps(path: &str) -> Vec<(&str, bool)> {
    path.split('.')
        .map(|part| match part.strip_suffix("[]") {
            Some(name) => (name, true),
            None => (part, false),
        })
        .collect()
}

/// Removes the field at `path` from a value, wherever it is set.
fn clear(v: &mut Value, path: &[(&str, bool)]) {
    let Some(((name, list), rest)) = path.split_first() else { return };
    let Some(obj) = v.as_object_mut() else { return };
    if rest.is_empty() {
        obj.remove(*name);
        return;
    }
    match obj.get_mut(*name) {
        Some(Value::Array(items)) if *list => items.iter_mut().for_each(|i| clear(i, rest)),
        Some(inner) if !*list => clear(inner, rest),
        _ => {}
    }
}

/// A status's placeholders, filled on the host when it is written:
/// `metadata.generation` (every `observedGeneration`) and the time.
pub const GENERATION_PLACEHOLDER: &str = "\"observedGeneration\":0";
pub const TIME_PLACEHOLDER: &str = "1970-01-01T00:00:00Z";

impl ClusterStatus {
    /// The status an install, apply or upgrade (`kind`) leaves once every
    /// node is Ready at the spec's version: Ready, the nodes with their
    /// roles, the endpoint and the bundle. `observedGeneration` and the
    /// transition time are the placeholders above.
    ///
    /// Nodes in `unchecked` (workers not waited for under
    /// `kubernetes.waitForWorkers: false`, workers an upgrade skipped) are
    /// listed not ready with no version, and Ready is False, naming them.
    pub fn settled(
        cluster: &kubexm_bom::config::model::Cluster,
        endpoint: &str,
        bundle: Option<&str>,
        kind: &str,
        unchecked: &[String],
    ) -> ClusterStatus {
        let g = &cluster.spec.role_groups;
        let version = cluster.spec.kubernetes.version.clone();
        let nodes: Vec<NodeStatus> = cluster
            .spec
            .hosts
            .iter()
            .filter(|h| g.control_plane.contains(&h.name) || g.worker.contains(&h.name))
            .map(|h| {
                let checked = !unchecked.contains(&h.name);
                NodeStatus {
                    name: h.name.clone(),
                    roles: cluster.roles_of(&h.name),
                    kubelet_version: checked.then(|| version.clone()),
                    ready: checked,
                }
            })
            .collect();
        let reason = match kind {
            "apply" => "Applied",
            "upgrade" => "Upgraded",
            _ => "Installed",
        };
        let not_checked: Vec<&str> = nodes.iter().filter(|n| !n.ready).map(|n| n.name.as_str()).collect();
        let (status, reason, message) = if not_checked.is_empty() {
            (
                ConditionStatus::True,
                reason.to_string(),
                format!("every node Ready at {version}, written by kubexm-install's {kind} (its operator phase)"),
            )
        } else {
            (
                ConditionStatus::False,
                "NodesNotChecked".to_string(),
                format!(
                    "kubexm-install's {kind} did not wait for {} (kubernetes.waitForWorkers: false, or skipped by \
                     --skip-not-ready): look at `kubectl get nodes`",
                    not_checked.join(", ")
                ),
            )
        };
        ClusterStatus {
            observed_generation: Some(0),
            conditions: vec![Condition {
                type_: ConditionType::Ready,
                status,
                reason,
                message,
                last_transition_time: Some(TIME_PLACEHOLDER.into()),
                observed_generation: Some(0),
            }],
            version: Some(version),
            endpoint: Some(endpoint.into()),
            bundle: bundle.map(str::to_string),
            ready_nodes: nodes.iter().filter(|n| n.ready).count() as u32,
            nodes,
            last_operation: None,
        }
    }
}

/// Drops every `default` of a schema (not a property named `default`),
/// and the integer formats schemars names that the API server does not
/// know (`uint8`, `uint16`, `uint32`: it warns on each apply; `minimum`
/// and `maximum` stay).
fn strip_defaults(schema: &mut Value) {
    let Some(obj) = schema.as_object_mut() else { return };
    obj.remove("default");
    if obj.get("format").and_then(Value::as_str).is_some_and(|f| f.starts_with("uint")) {
        obj.remove("format");
    }
    for (key, value) in obj.iter_mut() {
        match (key.as_str(), value) {
            ("properties", Value::Object(props)) => props.values_mut().for_each(strip_defaults),
            (_, v @ Value::Object(_)) => strip_defaults(v),
            (_, Value::Array(items)) => items.iter_mut().for_each(strip_defaults),
            _ => {}
        }
    }
}

/// Removes the property at `path` (`a.b[].c`: `[]` steps into a list's
/// items) from an object schema.
fn remove(schema: &mut Value, path: &str) -> Result<(), CrdError> {
    let missing = || CrdError::Missing(format!("spec.{path} in its schema"));
    let mut parts = steps(path);
    let (last, _) = parts.pop().ok_or_else(missing)?;
    let mut node = schema;
    for (name, list) in parts {
        node = node.get_mut("properties").and_then(|p| p.get_mut(name)).ok_or_else(missing)?;
        if list {
            node = node.get_mut("items").ok_or_else(missing)?;
        }
    }
    if let Some(Value::Array(required)) = node.get_mut("required") {
        required.retain(|r| r != last);
    }
    node.get_mut("properties")
        .and_then(Value::as_object_mut)
        .and_then(|p| p.remove(last))
        .map(|_| ())
        .ok_or_else(missing)
}

#[cfg(test)]
mod tests;
