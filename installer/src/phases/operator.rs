//! The `operator` phase, the install's last (and apply's, and an
//! upgrade's hop's): the cluster written into itself, on the first
//! control-plane node with the bundle's kubectl. The Cluster
//! CustomResourceDefinition (established before anything uses it), the
//! `kubexm-system` namespace, the Cluster object (cluster.yaml's spec as
//! `kubexm_crd::in_cluster` leaves it: nothing naming a file, a variable
//! or the SSH agent of this machine) and its status (Ready, the nodes, the
//! version, the endpoint, the bundle; `observedGeneration` the object's
//! generation). Each step checks the result first (an annotation carrying
//! the sha256 of what was applied, the status's fields), so a re-run
//! changes nothing. The controller that would reconcile the object
//! (`operator.enabled: true`) is not built yet.

use std::sync::Arc;
use std::time::Duration;

use kubexm_bom::config::Cluster;
use kubexm_crd::{ClusterResource, ClusterSpec, ClusterStatus, GENERATION_PLACEHOLDER, NAMESPACE, TIME_PLACEHOLDER};

use crate::context::Context;
use crate::engine::files::RunWith;
use crate::engine::plan::{Module, Step, Task};
use crate::engine::transport::shell_quote as q;
use crate::paths::OPERATOR_DIR as DIR;
use crate::waits;

/// The annotation carrying the sha256 of what kubexm applied.
const APPLIED: &str = "kubexm.io/applied-sha256";

/// The phase's module: one task on the first control-plane node. Nothing
/// under a server-side dry run (the object's spec is the config itself).
pub fn module(i: &Context) -> anyhow::Result<Module> {
    let mut tasks = Vec::new();
    if !i.server_dry_run {
        tasks.push(Task {
            name: "cluster".into(),
            hosts: vec![i.topo.first_control_plane.clone()],
            steps: steps(i.cluster, &i.topo.endpoint, i.digest, i.operation)?
                .into_iter()
                .map(|s| Arc::new(s) as Arc<dyn Step>)
                .collect(),
            after: vec![],
        });
    }
    Ok(Module {
        name: "operator".into(),
        tasks,
    })
}

/// The definition, the object and its status of `cluster` (its endpoint,
/// the bundle's digest, the operation that writes them), each applied when
/// its check fails.
fn steps(cluster: &Cluster, endpoint: &str, digest: Option<&str>, operation: &'static str) -> anyhow::Result<Vec<RunWith>> {
    let k = waits::kubectl();
    let name = &cluster.metadata.name;
    let apply = format!("{k} apply --server-side --force-conflicts --field-manager=kubexm");
    let get = |what: &str, jsonpath: &str| format!("{k} get {what} -o jsonpath='{jsonpath}' 2>/dev/null");
    let annotation = format!("{{.metadata.annotations.{}}}", APPLIED.replace('.', "\\."));

    let (crd, crd_sum) = annotated(kubexm_crd::definition()?)?;
    let crd_file = format!("{DIR}/clusters.kubexm.io.json");
    let definition = RunWith {
        name: "cluster-definition".into(),
        check: format!("[ \"$({})\" = {crd_sum} ]", get("crd clusters.kubexm.io", &annotation)),
        files: vec![(crd_file.clone(), crd, 0o644)],
        command: format!("set -e\n{apply} -f {crd_file}\n{k} wait --for=condition=Established --timeout=60s crd/clusters.kubexm.io\n"),
        timeout: Duration::from_secs(120),
    };

    let spec = kubexm_crd::in_cluster(&cluster.spec)?;
    let mut object = ClusterResource::new(name, ClusterSpec { cluster: spec });
    object.metadata.namespace = Some(NAMESPACE.into());
    let (body, sum) = annotated(serde_json::to_value(&object)?)?;
    let file = format!("{DIR}/cluster.json");
    let the_object = format!("cluster {} -n {NAMESPACE}", q(name));
    let object_step = RunWith {
        name: "cluster-object".into(),
        check: format!("[ \"$({})\" = {sum} ]", get(&the_object, &annotation)),
        files: vec![(file.clone(), body, 0o644)],
        command: format!("set -e\n{k} get namespace {NAMESPACE} >/dev/null 2>&1 || {k} create namespace {NAMESPACE}\n{apply} -f {file}\n"),
        timeout: Duration::from_secs(120),
    };

    let status = ClusterStatus::settled(cluster, endpoint, digest, operation);
    let fields = format!(
        "{}|{}|{}|{}",
        status.version.as_deref().unwrap_or_default(),
        status.bundle.as_deref().unwrap_or_default(),
        status.ready_nodes,
        status.endpoint.as_deref().unwrap_or_default()
    );
    let text = serde_json::to_string(&serde_json::json!({ "status": status }))?;
    let status_file = format!("{DIR}/status.json");
    let status_step = RunWith {
        name: "cluster-status".into(),
        check: format!(
            "g=$({}) && [ -n \"$g\" ] && [ \"$({})\" = \"$g|\"{} ]",
            get(&the_object, "{.metadata.generation}"),
            get(
                &the_object,
                "{.status.observedGeneration}|{.status.version}|{.status.bundle}|{.status.readyNodes}|{.status.endpoint}"
            ),
            q(&fields)
        ),
        files: vec![(status_file.clone(), text.into_bytes(), 0o644)],
        command: format!(
            "set -e\ng=$({get_gen})\ncase \"$g\" in ''|*[!0-9]*) echo \"the Cluster object has no generation: $g\" >&2; exit 1;; esac\n\
             now=$(date -u +%Y-%m-%dT%H:%M:%SZ)\n\
             sed -e 's/{placeholder}/\"observedGeneration\":'\"$g\"'/g' -e \"s/{TIME_PLACEHOLDER}/$now/g\" {status_file} > {status_file}.now\n\
             {k} patch {the_object} --subresource=status --type=merge --patch-file {status_file}.now\n",
            get_gen = get(&the_object, "{.metadata.generation}"),
            placeholder = GENERATION_PLACEHOLDER,
        ),
        timeout: Duration::from_secs(120),
    };
    Ok(vec![definition, object_step, status_step])
}

/// `value` with the sha256 of its JSON as an annotation, and its bytes.
fn annotated(mut value: serde_json::Value) -> anyhow::Result<(Vec<u8>, String)> {
    let sum = kubexm_bundle::digest::sha256_hex(&serde_json::to_vec(&value)?);
    let meta = value
        .get_mut("metadata")
        .and_then(serde_json::Value::as_object_mut)
        .ok_or_else(|| anyhow::anyhow!("an object without metadata"))?;
    let annotations = meta
        .entry("annotations")
        .or_insert_with(|| serde_json::json!({}))
        .as_object_mut()
        .ok_or_else(|| anyhow::anyhow!("annotations that are not a map"))?;
    annotations.insert(APPLIED.into(), sum.clone().into());
    Ok((serde_json::to_vec_pretty(&value)?, sum))
}

#[cfg(test)]
mod tests;
