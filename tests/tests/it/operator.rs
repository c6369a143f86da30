//! Issue 31 on a real API server, inside the other scenarios (their
//! clusters, no install of their own). The main job's: its install wrote the
//! cluster into itself (the operator phase). The upgrade scenario's: the
//! committed Cluster definition is accepted and established; the scenario's
//! own cluster.yaml, each login replaced by a credential, is stored as a
//! Cluster object exactly as written; a login by private key is refused by
//! name.

use std::path::Path;

use kubexm_bom::config::model::{Auth, Cluster};
use kubexm_crd::{CRD_FILE, ClusterResource, ClusterSpec, NAMESPACE};
use kubexm_e2e::{Lab, repo_root, text};

/// Runs on `lab`'s control-plane node lab1, after the upgrade: the hop
/// wrote the Cluster object's status at v1.37.2; the committed definition
/// applies as it is; `config` (the cluster's cluster.yaml), each login
/// replaced by a credential, is stored as a second object exactly as
/// written; a login by private key is refused by name. `dir` is a scratch
/// directory on this machine.
pub fn cluster_resource_on_a_real_api_server(lab: &Lab, config: &Path, dir: &Path) {
    let k = |args: &str| lab.ssh_ok("lab1", &format!("kubectl --kubeconfig /etc/kubernetes/admin.conf {args}"));
    the_install_wrote_the_cluster_into_itself(&k, "lab", "v1.37.2", &["lab1", "lab2", "lab3"], &[]);
    lab.copy_to("lab1", &repo_root().join(CRD_FILE), "/root/clusters.kubexm.io.yaml");
    k("apply --server-side --field-manager=kubexm-test -f /root/clusters.kubexm.io.yaml");
    k("wait --for=condition=Established --timeout=60s crd/clusters.kubexm.io");

    let mut cluster: Cluster = serde_saphyr::from_str(&std::fs::read_to_string(config).unwrap()).unwrap();
    let credential = || Auth {
        credential: Some("ssh".into()),
        ..Default::default()
    };
    cluster.spec.host_defaults.auth = Some(credential());
    for h in &mut cluster.spec.hosts {
        h.auth = h.auth.as_ref().map(|_| credential());
    }
    let mut object = ClusterResource::new(
        "copy",
        ClusterSpec {
            cluster: cluster.spec.clone(),
        },
    );
    object.metadata.namespace = Some(NAMESPACE.into());
    let put = |name: &str, body: &serde_json::Value| {
        let local = dir.join(name);
        std::fs::write(&local, serde_json::to_vec_pretty(body).unwrap()).unwrap();
        lab.copy_to("lab1", &local, &format!("/root/{name}"));
        lab.ssh(
            "lab1",
            &format!("kubectl --kubeconfig /etc/kubernetes/admin.conf apply -f /root/{name}"),
        )
    };
    let json = serde_json::to_value(&object).unwrap();
    let out = put("cluster-object.json", &json);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stored: ClusterResource = serde_json::from_str(&k(&format!("-n {NAMESPACE} get clusters.kubexm.io copy -o json"))).unwrap();
    assert_eq!(stored.spec.cluster, cluster.spec, "the API server changed the spec it stored");

    // A private key's path (a file on the controller's machine) is no field
    // of the resource: kubectl's strict field validation names it.
    let mut bad = json.clone();
    bad["spec"]["hosts"][0]["auth"] = serde_json::json!({"privateKey": {"path": "/root/.ssh/id_ed25519"}});
    let out = put("cluster-object-bad.json", &bad);
    assert!(!out.status.success(), "a private key was accepted");
    assert!(
        text(&out.stderr).contains("unknown field \"spec.hosts[0].auth.privateKey\""),
        "{}",
        text(&out.stderr)
    );
    k(&format!("-n {NAMESPACE} delete clusters.kubexm.io copy"));
}

/// After an install (`k` runs kubectl against it): the definition
/// established; the Cluster object `name` in kubexm-system, its status
/// at `version` with every node of `nodes`, Ready unless some were not
/// waited for (`unchecked`: listed not ready, Ready False naming them), observedGeneration its generation, and
/// nothing in it naming a login (the lab logs in by private key).
pub fn the_install_wrote_the_cluster_into_itself(
    k: &dyn Fn(&str) -> String,
    name: &str,
    version: &str,
    nodes: &[&str],
    unchecked: &[&str],
) {
    let established = k("get crd clusters.kubexm.io -o jsonpath='{.status.conditions[?(@.type==\"Established\")].status}'");
    assert_eq!(established.trim(), "True");
    let text = k(&format!("-n {NAMESPACE} get clusters.kubexm.io {name} -o json"));
    let o: serde_json::Value = serde_json::from_str(&text).unwrap();
    let st = &o["status"];
    assert_eq!(o["metadata"]["generation"], st["observedGeneration"], "{text}");
    assert_eq!(st["conditions"][0]["type"], "Ready", "{text}");
    let ready = if unchecked.is_empty() { "True" } else { "False" };
    assert_eq!(st["conditions"][0]["status"], ready, "{text}");
    if !unchecked.is_empty() {
        assert_eq!(st["conditions"][0]["reason"], "NodesNotChecked", "{text}");
        let message = st["conditions"][0]["message"].as_str().unwrap_or_default();
        assert!(message.contains(&unchecked.join(", ")), "{text}");
    }
    assert_eq!(st["version"], version, "{text}");
    assert_eq!(st["readyNodes"], nodes.len() - unchecked.len(), "{text}");
    let names: Vec<&str> = st["nodes"].as_array().unwrap().iter().filter_map(|n| n["name"].as_str()).collect();
    assert_eq!(names, nodes, "{text}");
    assert!(st["bundle"].as_str().is_some_and(|b| b.starts_with("sha256:")), "{text}");
    for word in ["privateKey", "id_ed25519", "password", "fromFile", "fromEnv"] {
        assert!(!text.contains(word), "{word} in the Cluster object: {text}");
    }
    let listed = k(&format!("-n {NAMESPACE} get clusters.kubexm.io"));
    eprintln!("{listed}");
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with(name) && l.contains(version) && l.contains(ready)),
        "{listed}"
    );
}
