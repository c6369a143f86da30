//! Issue 31 on a real API server, inside the upgrade scenario (its cluster,
//! no install of its own): the committed Cluster definition is accepted and
//! established; the scenario's own cluster.yaml, each login replaced by a
//! credential, is stored as a Cluster object exactly as written; a login by
//! private key is refused by name.

use std::path::Path;

use kubexm_bom::config::model::{Auth, Cluster};
use kubexm_crd::{CRD_FILE, ClusterResource, ClusterSpec, NAMESPACE};
use kubexm_e2e::{Lab, repo_root, text};

/// Runs on `lab`'s control-plane node lab1; `config` is the cluster's
/// cluster.yaml, `dir` a scratch directory on this machine.
pub fn cluster_resource_on_a_real_api_server(lab: &Lab, config: &Path, dir: &Path) {
    let k = |args: &str| lab.ssh_ok("lab1", &format!("kubectl --kubeconfig /etc/kubernetes/admin.conf {args}"));
    lab.copy_to("lab1", &repo_root().join(CRD_FILE), "/root/clusters.kubexm.io.yaml");
    k("apply -f /root/clusters.kubexm.io.yaml");
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
        &cluster.metadata.name,
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
    k(&format!("create namespace {NAMESPACE}"));
    let json = serde_json::to_value(&object).unwrap();
    let out = put("cluster-object.json", &json);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stored: ClusterResource =
        serde_json::from_str(&k(&format!("-n {NAMESPACE} get cluster {} -o json", cluster.metadata.name))).unwrap();
    assert_eq!(stored.spec.cluster, cluster.spec, "the API server changed the spec it stored");
    let listed = k(&format!("-n {NAMESPACE} get clusters"));
    assert!(listed.starts_with("NAME") && listed.contains("VERSION"), "{listed}");

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
    k(&format!("delete namespace {NAMESPACE}"));
    k("delete crd clusters.kubexm.io");
}
