//! The `operator` phase, the install's last (and apply's, and an
//! upgrade's hop's): the cluster written into itself, on the first
//! control-plane node with the bundle's kubectl. The Cluster
//! CustomResourceDefinition (established before anything uses it), the
//! admission policy (a Cluster only in `kubexm-system`, one per cluster),
//! the `kubexm-system` namespace, the Cluster object (cluster.yaml's spec as
//! `kubexm_crd::in_cluster` leaves it: nothing naming a file, a variable
//! or the SSH agent of this machine), the same spec as applied to the
//! hosts (the ConfigMap `kubexm_crd::applied_name`, which the controller
//! holds a changed object against) and the object's status (Ready, the
//! nodes, the version, the endpoint, the bundle; `observedGeneration` the
//! object's generation). Each step checks the result first (an annotation
//! carrying the sha256 of what was applied, the status's fields), so a
//! re-run changes nothing. With `operator.enabled: true`, last, the
//! controller inside the cluster: its service account, RBAC and
//! Deployment ([`CONTROLLER`]), running the bundle's controller image on
//! control-plane nodes of its arches; with `false`, those objects are
//! taken away if an earlier run made them.

use std::sync::Arc;
use std::time::Duration;

use kubexm_bom::config::Cluster;
use kubexm_bom::config::model::Spec;
use kubexm_crd::{ClusterResource, ClusterSpec, ClusterStatus, GENERATION_PLACEHOLDER, NAMESPACE, TIME_PLACEHOLDER};

use crate::context::Context;
use crate::engine::files::RunWith;
use crate::engine::plan::{Module, Task};
use crate::engine::transport::shell_quote as q;
use crate::paths::OPERATOR_DIR as DIR;
use crate::waits;

/// The admission policy on Cluster objects: in [`NAMESPACE`] only, and
/// one per cluster (named after it).
const ADMISSION: &str = include_str!("../../../manifests/templates/cluster-admission.json");

/// The controller's objects: service account, RBAC, Deployment.
const CONTROLLER: &str = include_str!("../../../manifests/templates/controller-manager.json");

/// The name of each of the controller's objects.
pub const CONTROLLER_NAME: &str = "kubexm-controller-manager";

/// The annotation carrying the sha256 of what kubexm applied.
const APPLIED: &str = "kubexm.io/applied-sha256";

/// The annotation carrying the object's generation once kubexm applied it.
const GENERATION: &str = "kubexm.io/applied-generation";

/// [`GENERATION`] as a jsonpath.
fn generation_annotation() -> String {
    format!("{{.metadata.annotations.{}}}", GENERATION.replace('.', "\\."))
}

/// The phase's module: one task on the first control-plane node. Nothing
/// under a server-side dry run (the object's spec is the config itself).
pub fn module(i: &Context) -> anyhow::Result<Module> {
    let waited = crate::phases::addons::waited_nodes(i.cluster);
    let unchecked = nodes_where(i.cluster, |n| !waited.contains(n));
    with_unchecked(i, &unchecked)
}

/// The cluster's Kubernetes nodes (control-plane nodes and workers, each
/// once, sorted) for which `keep` holds.
pub fn nodes_where(c: &Cluster, keep: impl Fn(&String) -> bool) -> Vec<String> {
    let g = &c.spec.role_groups;
    let mut nodes: Vec<String> = g.control_plane.iter().chain(&g.worker).filter(|n| keep(n)).cloned().collect();
    nodes.sort();
    nodes.dedup();
    nodes
}

/// [`module`], for an upgrade's hop: the nodes it left alone (`skipped`,
/// `--skip-not-ready`) are listed as not checked.
pub fn hop(i: &Context, skipped: &[String]) -> anyhow::Result<Module> {
    with_unchecked(i, skipped)
}

fn with_unchecked(i: &Context, unchecked: &[String]) -> anyhow::Result<Module> {
    let mut tasks = Vec::new();
    if !i.server_dry_run {
        let spec = i.written.as_ref().unwrap_or(&i.cluster.spec);
        let [definition, admission, object, applied, status] = steps(i.cluster, spec, &i.topo.endpoint, i.digest, i.operation, unchecked)?;
        let controller = controller_step(i.cluster, i.bom, &i.arches)?;
        // The nodes the status calls Ready, checked again right before it is written.
        let checked = nodes_where(i.cluster, |n| !unchecked.contains(n));
        let ready = waits::wait(
            "cluster-nodes-ready",
            "the nodes the Cluster object's status calls Ready",
            &waits::nodes_ready(&checked),
            120,
        );
        tasks.push(Task {
            name: "cluster".into(),
            hosts: vec![i.topo.first_control_plane.clone()],
            // The spec as applied before the object: a controller that sees
            // the object's new generation holds it against the new spec.
            steps: vec![
                Arc::new(definition),
                Arc::new(admission),
                Arc::new(applied),
                Arc::new(object),
                ready,
                Arc::new(status),
                Arc::new(controller),
            ],
            after: vec![],
        });
    }
    Ok(Module {
        name: "operator".into(),
        tasks,
    })
}

/// The definition, the object (`spec`, cluster.yaml's as written), the
/// spec as applied to the hosts (for the controller to hold a changed
/// object against) and the status of `cluster` (its endpoint, the bundle's
/// digest, the operation that writes them, the nodes not checked), each
/// applied when its check fails.
fn steps(
    cluster: &Cluster,
    spec: &Spec,
    endpoint: &str,
    digest: Option<&str>,
    operation: &'static str,
    unchecked: &[String],
) -> anyhow::Result<[RunWith; 5]> {
    let k = waits::kubectl();
    let name = &cluster.metadata.name;
    let apply = format!("{k} apply --server-side --force-conflicts --field-manager=kubexm");
    let get = |what: &str, jsonpath: &str| format!("{k} get {what} -o jsonpath='{jsonpath}' 2>/dev/null");
    let annotation = format!("{{.metadata.annotations.{}}}", APPLIED.replace('.', "\\."));

    let (crd, crd_sum) = annotated(kubexm_crd::definition()?)?;
    let crd_file = format!("{DIR}/clusters.kubexm.io.json");
    let the_crd = "crd clusters.kubexm.io";
    let definition = RunWith {
        name: "cluster-definition".into(),
        check: format!(
            "[ \"$({})\" = {crd_sum} ] && [ \"$({})\" = True ]",
            get(the_crd, &annotation),
            get(the_crd, "{.status.conditions[?(@.type==\"Established\")].status}")
        ),
        files: vec![(crd_file.clone(), crd, 0o644)],
        command: format!(
            "set -e\n{apply} -f {crd_file}\n{k} wait --for=condition=Established --timeout=60s crd/clusters.kubexm.io || \
             {{ echo 'the Cluster definition was applied but is not established after 60 s: look at `kubectl describe crd clusters.kubexm.io` and run again' >&2; exit 1; }}\n"
        ),
        timeout: Duration::from_secs(120),
    };

    let mut object = serde_json::to_value(ClusterResource::new(name, ClusterSpec::default()))?;
    object["metadata"]["namespace"] = NAMESPACE.into();
    let in_cluster = kubexm_crd::in_cluster(spec)?;
    let applied = applied_step(name, &in_cluster, &k, &apply, &get, &annotation)?;
    object["spec"] = in_cluster;
    let (body, sum) = annotated(object)?;
    let file = format!("{DIR}/cluster.json");
    // The resource by its full name: `clusters` alone may be another API's
    // (Cluster API's, Rancher's).
    let the_object = format!("clusters.kubexm.io {} -n {NAMESPACE}", q(name));
    let generation = get(&the_object, "{.metadata.generation}");
    let numeric = |what: &str| {
        format!(
            "case \"$g\" in ''|*[!0-9]*) echo \"the Cluster object {what} has no generation ($g): check that the API server answers \
             ({k} get clusters.kubexm.io -n {NAMESPACE}) and run again\" >&2; exit 1;; esac"
        )
    };
    // Applied, and not changed since (a `kubectl edit` moves the generation
    // past the one recorded): a re-run applies it again.
    let object_step = RunWith {
        name: "cluster-object".into(),
        check: format!(
            "[ \"$({})\" = \"{sum}/$({generation})\" ]",
            get(&the_object, &format!("{}/{}", annotation, generation_annotation()))
        ),
        files: vec![(file.clone(), body, 0o644)],
        command: format!(
            "set -e\n{apply} -f {file}\n\
             g=$({generation})\n{}\n{k} annotate --overwrite {the_object} {GENERATION}=\"$g\"\n",
            numeric("just applied")
        ),
        timeout: Duration::from_secs(120),
    };

    let status = ClusterStatus::settled(cluster, endpoint, digest, operation, unchecked);
    let fields = format!(
        "{}|{}|{}",
        status.version.as_deref().unwrap_or_default(),
        status.bundle.as_deref().unwrap_or_default(),
        status.endpoint.as_deref().unwrap_or_default()
    );
    let text = serde_json::to_string(&serde_json::json!({ "status": status }))?;
    let status_file = format!("{DIR}/status.json");
    let status_step = RunWith {
        name: "cluster-status".into(),
        // The Ready nodes as this run counts them, or as the controller
        // inside the cluster read them since (its own reasons), when it
        // found at least as many: a re-run writes nothing over that, and
        // writes over a count older than what this run checked.
        check: format!(
            "g=$({}) && [ -n \"$g\" ] && [ \"$({})\" = \"$g|\"{} ] && r=$({}) && n=${{r%%|*}} && \
             case \"$r\" in \"$n|NodesReady\"|\"$n|NodesNotReady\") [ \"$n\" -ge {} ] 2>/dev/null;; *) [ \"$n\" = {} ];; esac && ! {} | grep -q True",
            generation,
            get(
                &the_object,
                "{.status.observedGeneration}|{.status.version}|{.status.bundle}|{.status.endpoint}"
            ),
            q(&fields),
            get(
                &the_object,
                "{.status.readyNodes}|{.status.conditions[?(@.type==\"Ready\")].reason}"
            ),
            status.ready_nodes,
            status.ready_nodes,
            // A refusal the controller wrote before this run made the
            // change: the status is written anew.
            get(
                &the_object,
                "{.status.conditions[?(@.type==\"NotSupported\")].status}{.status.conditions[?(@.type==\"Failed\")].status}"
            ),
        ),
        files: vec![(status_file.clone(), text.into_bytes(), 0o644)],
        command: format!(
            "set -e\ng=$({generation})\n{}\n\
             now=$(date -u +%Y-%m-%dT%H:%M:%SZ)\n\
             sed -e 's/{placeholder}/\"observedGeneration\":'\"$g\"'/g' -e \"s/{TIME_PLACEHOLDER}/$now/g\" {status_file} > {status_file}.now\n\
             {k} patch {the_object} --subresource=status --type=merge --patch-file {status_file}.now\n",
            numeric(""),
            placeholder = GENERATION_PLACEHOLDER,
        ),
        timeout: Duration::from_secs(120),
    };
    let admission = admission_step(name, &apply, &get, &annotation)?;
    Ok([definition, admission, object_step, applied, status_step])
}

/// The admission policy and its binding ([`ADMISSION`], for cluster
/// `name`), each annotated with its own sha256 ([`annotated`]), applied
/// with `apply` unless `get` finds both annotations at them.
fn admission_step(name: &str, apply: &str, get: &dyn Fn(&str, &str) -> String, annotation: &str) -> anyhow::Result<RunWith> {
    // `name` goes into CEL string literals as text: load checked it is a
    // DNS label (letters, digits, '-'), which holds no quote.
    let text = crate::template::render(
        "cluster-admission.json",
        ADMISSION,
        &[("NAMESPACE", NAMESPACE), ("CLUSTER", name)],
        &[],
    )?;
    // Each object annotated with the sha256 of itself, like every other
    // object of the phase, in a file of its own.
    let list: serde_json::Value = serde_json::from_str(&text)?;
    let mut files = Vec::new();
    let mut checks = Vec::new();
    for item in list["items"].as_array().into_iter().flatten() {
        let kind = item["kind"].as_str().unwrap_or_default().to_ascii_lowercase();
        let (body, sum) = annotated(item.clone())?;
        checks.push(format!(
            "[ \"$({})\" = {sum} ]",
            get(&format!("{kind} clusters.kubexm.io"), annotation)
        ));
        files.push((format!("{DIR}/{kind}.json"), body, 0o644));
    }
    let paths: Vec<String> = files.iter().map(|(f, _, _)| format!("-f {f}")).collect();
    Ok(RunWith {
        name: "cluster-admission".into(),
        check: checks.join(" && "),
        command: format!("set -e\n{apply} {}\n", paths.join(" ")),
        files,
        timeout: Duration::from_secs(120),
    })
}

/// The controller inside the cluster ([`CONTROLLER`]) with
/// `operator.enabled: true`: each object annotated with its sha256, applied
/// unless every annotation is found and the Deployment is Available, then
/// rolled out. Its image is the bundle's, by digest; its pods run on
/// control-plane nodes of the image's arches, and none being one is refused
/// (not supported yet) before any step runs (`arches`: each host's, as its
/// facts say). With `false`: the objects an earlier run made are deleted.
fn controller_step(
    cluster: &Cluster,
    bom: &kubexm_bom::Bom,
    host_arches: &std::collections::BTreeMap<String, String>,
) -> anyhow::Result<RunWith> {
    let k = waits::kubectl();
    let get = |what: &str, jsonpath: &str| format!("{k} get {what} -o jsonpath='{jsonpath}' 2>/dev/null");
    let deployment = format!("deployment {CONTROLLER_NAME} -n {NAMESPACE}");
    let kinds = [
        "serviceaccount",
        "role",
        "rolebinding",
        "clusterrole",
        "clusterrolebinding",
        "deployment",
    ];
    if !cluster.spec.operator.enabled {
        let names: Vec<String> = kinds.iter().map(|kind| format!("{kind}/{CONTROLLER_NAME}")).collect();
        return Ok(RunWith {
            name: "cluster-controller-absent".into(),
            // None of the six (an earlier run may have stopped before the Deployment).
            check: format!("! {k} get -n {NAMESPACE} {} -o name 2>/dev/null | grep -q .", names.join(" ")),
            files: vec![],
            command: format!(
                "set -e\n{k} delete -n {NAMESPACE} --ignore-not-found --wait=true {}\n",
                names.join(" ")
            ),
            timeout: Duration::from_secs(120),
        });
    }
    let item = bom.images.iter().find(|im| im.reference.is_controller()).ok_or_else(|| {
        crate::DeployError::Config(format!(
            "operator.enabled is true but the bundle carries no controller image ({}): build the bundle again \
             from this config (kubexm-bundle build adds it)",
            kubexm_bom::image::CONTROLLER_REPOSITORY
        ))
    })?;
    let arches: Vec<&str> = item.platforms.iter().filter_map(|p| p.strip_prefix("linux/")).collect();
    let control_plane = &cluster.spec.role_groups.control_plane;
    let known: Vec<(&String, &String)> = control_plane.iter().filter_map(|n| host_arches.get(n).map(|a| (n, a))).collect();
    if !known.is_empty() && !known.iter().any(|(_, a)| arches.contains(&a.as_str())) {
        let nodes: Vec<String> = known.iter().map(|(n, a)| format!("{n} ({a})")).collect();
        return Err(crate::DeployError::NotSupported(format!(
            "the controller on these control-plane nodes: the bundle's controller image is for {} only and the nodes are {}; \
             build the bundle with kubexm-bundle build --controller-binary ARCH=FILE for their arch",
            arches.join(", "),
            nodes.join(", ")
        ))
        .into());
    }
    let image = match &item.digest {
        Some(d) => format!("{}@{d}", item.reference),
        None => item.reference.to_string(),
    };
    let text = crate::template::render(
        "controller-manager.json",
        CONTROLLER,
        &[
            ("NAMESPACE", NAMESPACE),
            ("APPLIED", &kubexm_crd::applied_name(&cluster.metadata.name)),
            ("LEASE", kubexm_lease::LEASE),
            ("IMAGE", &image),
            ("ARCHES", &serde_json::to_string(&arches)?),
        ],
        &[],
    )?;
    let list: serde_json::Value = serde_json::from_str(&text)?;
    let annotation = format!("{{.metadata.annotations.{}}}", APPLIED.replace('.', "\\."));
    let mut files = Vec::new();
    let mut checks = Vec::new();
    for item in list["items"].as_array().into_iter().flatten() {
        let kind = item["kind"].as_str().unwrap_or_default().to_ascii_lowercase();
        let namespaced = !kind.starts_with("cluster");
        let (body, sum) = annotated(item.clone())?;
        let what = if namespaced {
            format!("{kind} {CONTROLLER_NAME} -n {NAMESPACE}")
        } else {
            format!("{kind} {CONTROLLER_NAME}")
        };
        checks.push(format!("[ \"$({})\" = {sum} ]", get(&what, &annotation)));
        files.push((format!("{DIR}/controller-{kind}.json"), body, 0o644));
    }
    checks.push(format!(
        "[ \"$({})\" = True ]",
        get(&deployment, "{.status.conditions[?(@.type==\"Available\")].status}")
    ));
    let paths: Vec<String> = files.iter().map(|(f, _, _)| format!("-f {f}")).collect();
    let apply = format!("{k} apply --server-side --force-conflicts --field-manager=kubexm");
    Ok(RunWith {
        name: "cluster-controller".into(),
        check: checks.join(" && "),
        command: format!(
            "set -e\n{apply} {}\n{k} rollout status {} --timeout=180s || \
             {{ echo 'the controller (deployment/{CONTROLLER_NAME} in {NAMESPACE}) did not become available in 180 s: look at \
             `kubectl -n {NAMESPACE} describe pods -l app.kubernetes.io/name={CONTROLLER_NAME}`, then run again (if a replica \
             leads meanwhile, the run is refused: scale the Deployment to 0 first, or pass --force-local)' >&2; exit 1; }}\n",
            paths.join(" "),
            deployment.replacen(' ', "/", 1)
        ),
        files,
        timeout: Duration::from_secs(240),
    })
}

/// The ConfigMap holding `spec` as applied to the hosts of cluster `name`
/// ([`kubexm_crd::applied_name`]), applied with `apply` (the namespace made
/// with kubectl `k` first) unless `get` finds its `annotation` at the
/// sha256 of what is written.
fn applied_step(
    name: &str,
    spec: &serde_json::Value,
    k: &str,
    apply: &str,
    get: &dyn Fn(&str, &str) -> String,
    annotation: &str,
) -> anyhow::Result<RunWith> {
    let map_name = kubexm_crd::applied_name(name);
    let map = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": map_name, "namespace": NAMESPACE, "labels": {"kubexm.io/cluster": name}},
        "data": {kubexm_crd::APPLIED_KEY: serde_json::to_string(spec)?},
    });
    let (body, sum) = annotated(map)?;
    let file = format!("{DIR}/applied.json");
    Ok(RunWith {
        name: "cluster-applied".into(),
        check: format!(
            "[ \"$({})\" = {sum} ]",
            get(&format!("configmap {} -n {NAMESPACE}", q(&map_name)), annotation)
        ),
        files: vec![(file.clone(), body, 0o644)],
        command: format!("set -e\n{k} get namespace {NAMESPACE} >/dev/null 2>&1 || {k} create namespace {NAMESPACE}\n{apply} -f {file}\n"),
        timeout: Duration::from_secs(120),
    })
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
