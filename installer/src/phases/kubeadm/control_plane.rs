//! The `control-plane` phase: each node's binaries, settings and
//! certificates first (beside the earlier phases on other hosts); every
//! etcd member answers; then `kubeadm init` on the first control-plane node
//! (our Kubernetes CA put in place, join credentials renewed on later
//! runs), then the other control-plane nodes join side by side with the
//! certificate key.

use std::sync::Arc;
use std::time::Duration;

use super::{CONFIG_DIR, Render, kubeadm, kubelet_running, node_prerequisites};
use crate::context::Context;
use crate::endpoint_name;
use crate::engine::files::{PutFiles, RunWith};
use crate::engine::plan::{Module, Scope, Task};
use crate::engine::steps::{Shell, Wait};
use crate::paths::ETCD_PKI;
use crate::paths::{ADMIN_CONF, KUBELET_CONF, KUBERNETES_CA_CRT, KUBERNETES_CA_KEY};
use crate::pipelines::PREPARE;
use crate::waits;

/// The task of `kubeadm init` on `first`, the first control-plane node:
/// what the other nodes' joins and the network plugin wait for.
pub fn init_task(first: &str) -> String {
    format!("kubeadm-init-{first}")
}

/// The task of `kubeadm join` on `node` (a control-plane node or a worker).
pub fn join_task(node: &str) -> String {
    format!("kubeadm-join-{node}")
}

/// The task after which `node` is part of the cluster (its init or join),
/// in the phases this run has: what waits for every node wait for.
pub fn node_tasks(i: &Context) -> Vec<String> {
    let g = &i.cluster.spec.role_groups;
    let mut out = Vec::new();
    if i.has(crate::pipelines::Phase::ControlPlane) {
        let first = &i.topo.first_control_plane;
        out.push(init_task(first));
        out.extend(g.control_plane.iter().filter(|h| *h != first).map(|h| join_task(h)));
    }
    if i.has(crate::pipelines::Phase::Workers) {
        out.extend(g.worker.iter().filter(|w| !g.control_plane.contains(w)).map(|w| join_task(w)));
    }
    out
}

/// How long an API server may take to answer `/readyz` after kubeadm.
const API_SERVER_WAIT: u64 = 300;

/// The control-plane phase: init on the first node, then the others join
/// (side by side with etcd outside the control plane).
pub fn module(i: &Context) -> anyhow::Result<Module> {
    let k = i.kube()?;
    let g = &i.cluster.spec.role_groups;
    let r = Render::new(i, k);
    let (ca, creds) = (&k.ca, &k.creds);
    let etcd_files = crate::phases::etcd::client_files(i.pki)?;
    let mut tasks = Vec::new();
    // Every etcd member answers before the control plane starts: a stopped
    // member fails here, on its own host, not inside kubeadm.
    let mut gates = Vec::new();
    for m in &g.etcd {
        let ep = format!("https://{}:2379/health", i.topo.address(m));
        let probe = format!(
            "curl -sf --max-time 3 --cacert {ETCD_PKI}/ca.crt --cert {ETCD_PKI}/client.crt --key {ETCD_PKI}/client.key {ep} | grep -q '\"health\":\"true\"'"
        );
        tasks.push(Task {
            name: format!("etcd-ready-{m}"),
            hosts: vec![m.clone()],
            steps: vec![Arc::new(Wait {
                what: format!("etcd member {m}"),
                shell: Shell {
                    name: "etcd-ready".into(),
                    check: Some(probe.clone()),
                    apply: format!(
                        "for i in $(seq 10); do {probe} && exit 0; sleep 1; done; \
                         echo \"etcd member {m} does not answer at {ep} ($(systemctl is-active kubexm-etcd)); start it (systemctl start kubexm-etcd) or re-run the etcd phase\" >&2; exit 1"
                    ),
                    timeout: Duration::from_secs(60),
                },
            })],
            after: vec![],
        });
        gates.push((format!("etcd-ready-{m}"), Scope::AllHosts));
    }
    // etcd members joined (apply): see [`etcd_followed`].
    let etcd_joined = !i.etcd_joining().is_empty() && i.has(crate::pipelines::Phase::Etcd);
    let mut previous = String::new();
    for (n, h) in g.control_plane.iter().enumerate() {
        // Binaries, settings and certificates first, while etcd and the
        // other nodes are still getting ready (a prepare task waits for no
        // other host).
        let mut files = node_prerequisites(i, h, true)?;
        files.push(Arc::new(PutFiles {
            name: "etcd-client-certs".into(),
            files: etcd_files.clone(),
            then: None,
        }));
        if n == 0 {
            files.push(Arc::new(PutFiles {
                name: "kubernetes-ca".into(),
                files: vec![
                    (KUBERNETES_CA_CRT.into(), ca.cert_pem.clone(), 0o644),
                    (KUBERNETES_CA_KEY.into(), ca.key_pem.clone(), 0o600),
                ],
                then: None,
            }));
        }
        let prepare = format!("{PREPARE}control-plane-{h}");
        tasks.push(Task {
            name: prepare.clone(),
            hosts: vec![h.clone()],
            steps: files,
            after: vec![],
        });
        let mut steps: Vec<Arc<dyn crate::engine::plan::Step>> = Vec::new();
        let task = if n == 0 {
            let init = r.init(h)?;
            steps.push(kubeadm(
                "kubeadm-init",
                &format!("test -s {ADMIN_CONF}"),
                init.clone(),
                "init.yaml",
                "kubeadm init --upload-certs",
                creds,
            ));
            steps.push(kubelet_running());
            steps.push(waits::wait(
                "api-server-ready",
                "the API server through the control-plane endpoint",
                &waits::api_server(None),
                API_SERVER_WAIT,
            ));
            // Credentials renewed on a later run (the token lives 24 h, uploaded
            // certificates 2 h): the step is named by the token, so a renewed one
            // is a new step, not one an earlier job already did.
            steps.push(Arc::new(RunWith {
                name: format!("join-credentials-{}", creds.token_id()),
                check: format!("grep -qx {} {CONFIG_DIR}/tokens 2>/dev/null", creds.token_id()),
                files: vec![(format!("{CONFIG_DIR}/init.yaml"), init.into_bytes(), 0o600)],
                command: format!(
                    "set -e; kubeadm token create --config {CONFIG_DIR}/init.yaml --ttl 24h0m0s >/dev/null; \
                     kubeadm init phase upload-certs --upload-certs --config {CONFIG_DIR}/init.yaml >/dev/null; echo {} >> {CONFIG_DIR}/tokens",
                    creds.token_id()
                ),
                timeout: Duration::from_secs(120),
            }));
            init_task(h)
        } else {
            steps.extend(join_steps(i, &r, h, creds)?);
            join_task(h)
        };
        let mut after = gates.clone();
        after.push((prepare, Scope::SameHost));
        if n > 0 {
            // The others join side by side once the first answers: with
            // etcd outside the control plane (kubexm's etcd, or an
            // existing one), a join adds no member and touches no other
            // node's state. Stacked etcd (kubeadm's) adds a member per
            // join: those join one at a time.
            let stacked = i.cluster.spec.etcd.mode == kubexm_bom::config::model::EtcdMode::Kubeadm;
            let before = if stacked {
                previous.clone()
            } else {
                init_task(&i.topo.first_control_plane)
            };
            after.push((before, Scope::AllHosts));
            if etcd_joined {
                after.push((crate::phases::etcd_members::FOLLOWED.to_string(), Scope::AllHosts));
            }
        }
        let previous_task = task.clone();
        tasks.push(Task {
            name: task,
            hosts: vec![h.clone()],
            steps,
            after,
        });
        previous = previous_task;
    }
    if etcd_joined {
        tasks.extend(etcd_followed(i)?);
    }
    Ok(Module {
        name: "control-plane".into(),
        tasks,
    })
}

/// etcd members joined (apply): kubeadm's ClusterConfiguration lists them
/// once they are healthy (the joins wait on it: a joining node's API server
/// reads them from the start), then every API server after the joins, one
/// node at a time.
fn etcd_followed(i: &Context) -> anyhow::Result<Vec<Task>> {
    let g = &i.cluster.spec.role_groups;
    let first = &i.topo.first_control_plane;
    let mut after = vec![(crate::phases::etcd::HEALTH_TASK.to_string(), Scope::AllHosts)];
    after.push((init_task(first), Scope::AllHosts));
    let mut tasks = vec![crate::phases::etcd_members::kubeadm_config(&i.topo, &g.etcd, first, after.clone())?];
    after.extend(g.control_plane.iter().skip(1).map(|h| (join_task(h), Scope::AllHosts)));
    tasks.extend(crate::phases::etcd_members::api_servers(
        &i.topo,
        &g.etcd,
        &g.control_plane,
        &after,
    )?);
    Ok(tasks)
}

/// The steps of a control-plane node joining: the endpoint's name at the
/// first node until it has joined (mode D), `kubeadm join --control-plane`,
/// the name at its own API server, the kubelet running, its API server
/// answering.
fn join_steps(
    i: &Context,
    r: &Render,
    h: &str,
    creds: &crate::kube_pki::JoinCredentials,
) -> anyhow::Result<Vec<Arc<dyn crate::engine::plan::Step>>> {
    let mut steps: Vec<Arc<dyn crate::engine::plan::Step>> = Vec::new();
    let joined = format!("test -s {KUBELET_CONF} && test -s {ADMIN_CONF}");
    let first = endpoint_name::while_joining(i.cluster, &i.topo, h);
    if let Some(first) = &first {
        steps.push(endpoint_name::before_join(
            "endpoint-name-first",
            &endpoint_name::line(i.cluster, first),
            &joined,
        ));
    }
    steps.push(kubeadm(
        "kubeadm-join",
        &joined,
        r.join(h, true)?,
        "join.yaml",
        "kubeadm join",
        creds,
    ));
    if first.is_some() {
        // Joined: the endpoint's name now points at its own API server.
        let own = endpoint_name::resolves_to(i.cluster, &i.topo, h);
        steps.push(endpoint_name::step(
            "endpoint-name-own",
            &endpoint_name::line(i.cluster, &own),
            false,
        ));
    }
    steps.push(kubelet_running());
    let own = format!("https://{}:6443", i.topo.address(h));
    steps.push(waits::wait(
        "api-server-ready",
        &format!("the API server on {h}"),
        &waits::api_server(Some(&own)),
        API_SERVER_WAIT,
    ));
    Ok(steps)
}
