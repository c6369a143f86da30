//! Issue 31 on a real API server, inside the other scenarios (their
//! clusters, no install of their own). The main job's: its install wrote the
//! cluster into itself (the operator phase). The upgrade scenario's: the
//! committed Cluster definition is accepted and established; the scenario's
//! own cluster.yaml, each login replaced by a credential, would be stored
//! exactly as written; a login by private key is refused by name; the
//! admission policy refuses a second Cluster object and one outside
//! kubexm-system; the controller decides changes made with kubectl.

use std::path::Path;

use kubexm_bom::config::model::{Auth, Cluster};
use kubexm_crd::{CRD_FILE, ClusterResource, ClusterSpec, NAMESPACE};
use kubexm_e2e::{Lab, repo_root, text};

/// Runs on `lab`'s control-plane node lab1, after the upgrade: the hop
/// wrote the Cluster object's status at v1.37.2; the committed definition
/// applies as it is; `config` (the cluster's cluster.yaml), each login
/// replaced by a credential, would be stored exactly as written (a
/// server-side dry run); a login by private key is refused by name; the
/// install's admission policy refuses a second Cluster object and one
/// outside kubexm-system, naming why. `dir` is a scratch directory on this
/// machine.
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
    // The object as the API server would store it (a server-side dry run
    // of a replace of this cluster's object: nothing is changed).
    let mut object = ClusterResource::new(
        "lab",
        ClusterSpec {
            cluster: cluster.spec.clone(),
        },
    );
    object.metadata.namespace = Some(NAMESPACE.into());
    let put = |name: &str, body: &serde_json::Value, how: &str| {
        let local = dir.join(name);
        std::fs::write(&local, serde_json::to_vec_pretty(body).unwrap()).unwrap();
        lab.copy_to("lab1", &local, &format!("/root/{name}"));
        lab.ssh(
            "lab1",
            &format!("kubectl --kubeconfig /etc/kubernetes/admin.conf {how} --dry-run=server -o json -f /root/{name}"),
        )
    };
    let json = serde_json::to_value(&object).unwrap();
    let out = put("cluster-object.json", &json, "replace");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stored: ClusterResource = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stored.spec.cluster, cluster.spec, "the API server changed the spec it stored");

    // Refused by the API server, saying `why`.
    let refused = |file: &str, body: &serde_json::Value, how: &str, what: &str, why: &str| {
        let out = put(file, body, how);
        assert!(!out.status.success(), "{what} was accepted");
        assert!(text(&out.stderr).contains(why), "{}", text(&out.stderr));
    };
    // A private key's path (a file on the controller's machine) is no field
    // of the resource: kubectl's strict field validation names it.
    let mut bad = json.clone();
    bad["spec"]["hosts"][0]["auth"] = serde_json::json!({"privateKey": {"path": "/root/.ssh/id_ed25519"}});
    refused(
        "cluster-object-bad.json",
        &bad,
        "replace",
        "a private key",
        "unknown field \"spec.hosts[0].auth.privateKey\"",
    );

    // The admission policy the install applied: a second Cluster object, or
    // one outside kubexm-system, is refused, naming why.
    let mut second = json.clone();
    second["metadata"]["name"] = "copy".into();
    refused(
        "cluster-second.json",
        &second,
        "create",
        "a second Cluster object",
        "a second one (copy)",
    );
    let mut elsewhere = json.clone();
    elsewhere["metadata"]["namespace"] = "default".into();
    refused(
        "cluster-elsewhere.json",
        &elsewhere,
        "create",
        "a Cluster object outside kubexm-system",
        "a Cluster lives in kubexm-system",
    );
    let mine = k(&format!(
        "-n {NAMESPACE} get clusters.kubexm.io lab -o jsonpath={{.metadata.generation}}"
    ));
    assert!(!mine.trim().is_empty());
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
    let mut ready = if unchecked.is_empty() { "True" } else { "False" };
    // With the controller inside the cluster (operator.enabled: true), its
    // leader may have read the nodes already (every 30 s), after the install
    // wrote the status: then the condition is its own.
    let reason = st["conditions"][0]["reason"].as_str().unwrap_or_default();
    let by_the_controller = !unchecked.is_empty() && ["NodesReady", "NodesNotReady"].contains(&reason);
    if by_the_controller {
        let holder = k(&format!(
            "-n {NAMESPACE} get lease kubexm-controller-manager -o jsonpath='{{.spec.holderIdentity}}'"
        ));
        assert!(
            holder.starts_with("kubexm-controller-manager-"),
            "{reason} without the controller inside: {holder} {text}"
        );
        ready = st["conditions"][0]["status"].as_str().unwrap_or_default();
    } else {
        assert_eq!(st["conditions"][0]["status"], ready, "{text}");
    }
    if !unchecked.is_empty() && !by_the_controller {
        assert_eq!(st["conditions"][0]["reason"], "NodesNotChecked", "{text}");
        let message = st["conditions"][0]["message"].as_str().unwrap_or_default();
        assert!(message.contains(&unchecked.join(", ")), "{text}");
    }
    assert_eq!(st["version"], version, "{text}");
    if !by_the_controller {
        assert_eq!(st["readyNodes"], nodes.len() - unchecked.len(), "{text}");
    }
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

/// Polls `ok` every 250 ms until it holds; fails naming `what` after
/// `secs`. Returns how long it took.
fn until(what: &str, secs: u64, ok: &dyn Fn() -> bool) -> std::time::Duration {
    let t0 = std::time::Instant::now();
    while !ok() {
        assert!(t0.elapsed().as_secs() < secs, "{what}: not within {secs} s");
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    t0.elapsed()
}

/// `config` with the controller inside the cluster (`operator.enabled: true`).
pub fn with_the_controller(config: &Path) {
    let text = std::fs::read_to_string(config).unwrap();
    assert!(text.contains("\n  kubernetes:") && !text.contains("\n  operator:"), "{text}");
    std::fs::write(
        config,
        text.replacen("\n  kubernetes:", "\n  operator: {enabled: true}\n  kubernetes:", 1),
    )
    .unwrap();
}

/// Issue 31's controller inside the main job's cluster (`operator.enabled:
/// true`), with kubectl `k` right after the install: its Deployment is
/// available with both replicas Running on control-plane nodes
/// (`control_plane`), one of them holds the Lease and writes the nodes into
/// the status. Then the Deployment is scaled to 0 (its pods hand the Lease
/// back): the scenario acts from this machine, one owner at a time, and its
/// re-runs apply nothing (the status the controller keeps is not written
/// again; the Deployment stays scaled).
pub fn the_controller_runs_inside_the_cluster(k: &dyn Fn(&str) -> String, control_plane: &[&str]) {
    let ns = format!("-n {NAMESPACE}");
    k(&format!("{ns} rollout status deploy/kubexm-controller-manager --timeout=120s"));
    let pods = controller_pods(k);
    eprintln!("the controller's pods:\n{pods}");
    let names: Vec<String> = pods.lines().map(|l| l.split(' ').next().unwrap_or_default().to_string()).collect();
    assert_eq!(names.len(), 2, "{pods}");
    for l in pods.lines() {
        let f: Vec<&str> = l.split(' ').collect();
        assert!(control_plane.contains(&f[1]) && f[2] == "Running", "{pods}");
    }
    until("a controller pod holds the Lease", 60, &|| names.contains(&holder(k)));
    let reason = || {
        k(&format!(
            "{ns} get clusters.kubexm.io lab -o jsonpath='{{.status.conditions[?(@.type==\"Ready\")].reason}}'"
        ))
    };
    until("the leader writes the nodes into the status", 60, &|| {
        ["NodesReady", "NodesNotReady"].contains(&reason().trim())
    });
    scale_the_controller(k, 0);
}

/// The controller's pods: name, node and phase per line.
fn controller_pods(k: &dyn Fn(&str) -> String) -> String {
    k(&format!(
        "-n {NAMESPACE} get pods -l app.kubernetes.io/name=kubexm-controller-manager -o jsonpath='{{range .items[*]}}{{.metadata.name}} {{.spec.nodeName}} {{.status.phase}}{{\"\\n\"}}{{end}}'"
    ))
}

/// The holder of the controller's Lease ("" when none).
fn holder(k: &dyn Fn(&str) -> String) -> String {
    k(&format!(
        "-n {NAMESPACE} get lease kubexm-controller-manager -o jsonpath='{{.spec.holderIdentity}}'"
    ))
    .trim()
    .to_string()
}

/// The controller's Deployment scaled to `replicas`: at 0 its pods are
/// gone and the Lease handed back; otherwise they run and one leads.
fn scale_the_controller(k: &dyn Fn(&str) -> String, replicas: u32) {
    let ns = format!("-n {NAMESPACE}");
    k(&format!("{ns} scale deploy/kubexm-controller-manager --replicas={replicas}"));
    if replicas == 0 {
        until("the controller's pods are gone", 120, &|| {
            k(&format!(
                "{ns} get pods -l app.kubernetes.io/name=kubexm-controller-manager -o name"
            ))
            .trim()
            .is_empty()
        });
        until("the Lease handed back", 30, &|| holder(k).is_empty());
    } else {
        k(&format!("{ns} rollout status deploy/kubexm-controller-manager --timeout=120s"));
        until("a controller pod holds the Lease", 60, &|| {
            controller_pods(k).contains(&holder(k)) && !holder(k).is_empty()
        });
    }
}

/// The controller inside the main job's cluster deciding (before the
/// scenario's apply, which applies the object again anyway): scaled back
/// to 2, a podCIDR change applied with kubectl is NotSupported naming the
/// field (the time printed) and put back is as applied; the leader's pod
/// deleted, the other replica takes the Lease (the time printed); before,
/// the leader's peak memory, as `peak` (its pod's name) reads it from its
/// cgroup, printed (the issue's goal: under 64 MB). Scaled to 0 again after.
pub fn the_controller_decides_inside_the_cluster(k: &dyn Fn(&str) -> String, peak: &dyn Fn(&str) -> Option<u64>) {
    scale_the_controller(k, 2);
    let the = format!("-n {NAMESPACE} clusters.kubexm.io lab");
    let jsonpath = |p: &str| k(&format!("get {the} -o jsonpath='{p}'"));
    let condition = |t: &str, field: &str| jsonpath(&format!("{{.status.conditions[?(@.type==\"{t}\")].{field}}}"));
    let cidr = jsonpath("{.spec.kubernetes.podCIDR}");
    k(&format!(
        "patch {the} --type=merge -p '{{\"spec\":{{\"kubernetes\":{{\"podCIDR\":\"10.250.0.0/16\"}}}}}}'"
    ));
    let decided = until("NotSupported for the podCIDR", 10, &|| {
        condition("NotSupported", "status").trim() == "True" && condition("NotSupported", "message").contains("spec.kubernetes.podCIDR")
    });
    eprintln!(
        "kubectl patch of the podCIDR to NotSupported, decided inside the cluster: {} ms",
        decided.as_millis()
    );
    assert_eq!(condition("NotSupported", "reason").trim(), "CannotChange");
    k(&format!(
        "patch {the} --type=merge -p '{{\"spec\":{{\"kubernetes\":{{\"podCIDR\":\"{}\"}}}}}}'",
        cidr.trim()
    ));
    until("put back: as applied", 10, &|| {
        condition("NotSupported", "status").trim() == "False" && condition("NotSupported", "reason").trim() == "AsApplied"
    });
    // The leader's pod deleted: the other replica leads.
    let leader = holder(k);
    match peak(&leader) {
        Some(bytes) => eprintln!(
            "the leader's peak memory inside the cluster (its pod's cgroup): {:.1} MB",
            bytes as f64 / 1e6
        ),
        None => eprintln!("the leader's peak memory: its pod's cgroup was not found"),
    }
    let names: Vec<String> = controller_pods(k)
        .lines()
        .map(|l| l.split(' ').next().unwrap_or_default().to_string())
        .collect();
    let other = names.iter().find(|n| **n != leader).expect("a second replica").clone();
    k(&format!("-n {NAMESPACE} delete pod {leader} --wait=false"));
    let took = until("the other replica takes the Lease", 60, &|| holder(k) == other);
    eprintln!(
        "the leader's pod deleted, the other replica held the Lease after {:.1} s",
        took.as_secs_f64()
    );
    scale_the_controller(k, 0);
}

/// Issue 31's controller on the upgrade scenario's cluster (after
/// [`cluster_resource_on_a_real_api_server`]): two `kubexm controller-manager`
/// replicas on this machine, with lab1's admin kubeconfig. One leads through
/// the Lease; it brings the nodes into the status; a podCIDR change applied
/// with kubectl sets NotSupported naming the field within 5 s, leaves the
/// rest of the status alone and makes a Warning Event; put back, it clears;
/// `spec.paused` stops all of it; the leader killed with SIGKILL, the other
/// replica takes the Lease and decides the next change; `kubectl delete`
/// of the Cluster resets nothing, and the object created again is as
/// applied; stopped with SIGTERM, the last replica hands the Lease back.
/// One owner at a time: `apply` (`day2`: a verb with extra flags) is
/// refused while a replica leads, naming it, and nothing is applied; once
/// the Lease is handed back it takes it while it runs and hands it back.
/// Prints the figures: apply to decision, failover, and each replica's
/// peak RSS (goal under 64 MB).
pub fn controller_reconciles_the_cluster(lab: &Lab, dir: &Path, day2: &dyn Fn(&str, &[&str]) -> std::process::Command) {
    let k = |args: &str| lab.ssh_ok("lab1", &format!("kubectl --kubeconfig /etc/kubernetes/admin.conf {args}"));
    let the = format!("-n {NAMESPACE} clusters.kubexm.io lab");
    let jsonpath = |p: &str| k(&format!("get {the} -o jsonpath='{p}'"));
    let condition = |t: &str, field: &str| jsonpath(&format!("{{.status.conditions[?(@.type==\"{t}\")].{field}}}"));
    // lab1's admin kubeconfig, pointed at lab1's API server by address.
    let conf = lab.ssh_ok("lab1", "cat /etc/kubernetes/admin.conf");
    let server = format!("    server: https://{}:6443", lab.host("lab1").address);
    let conf: Vec<String> = conf
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("server:") {
                server.clone()
            } else {
                l.to_string()
            }
        })
        .collect();
    let kubeconfig = dir.join("admin.conf");
    std::fs::write(&kubeconfig, conf.join("\n")).unwrap();
    std::fs::set_permissions(&kubeconfig, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    // Each replica runs what it decides from the scenario's installer
    // state; the hosts fetch files from the registry host (no --advertise).
    let start = |identity: &str| {
        let mut cmd = std::process::Command::new(kubexm_e2e::bin("kubexm"));
        cmd.args(["controller-manager", "--kubeconfig"])
            .arg(&kubeconfig)
            .args(["--identity", identity, "--lease-seconds", "6", "-v", "--root"])
            .arg(dir.join("root"))
            .arg("--state")
            .arg(dir.join("state.db"));
        kubexm_e2e::Background::start_probe(cmd, || true)
    };
    let mut replicas = vec![start("replica-a"), start("replica-b")];
    let holder = || {
        k(&format!(
            "-n {NAMESPACE} get lease kubexm-controller-manager -o jsonpath='{{.spec.holderIdentity}}'"
        ))
    };
    until("a replica holds the Lease", 30, &|| holder().starts_with("replica-"));
    // The leader reads the nodes: every one Ready.
    until("the status follows the nodes", 30, &|| condition("Ready", "reason") == "NodesReady");
    // The CLI's day-2 operation is refused while the controller leads.
    let t0 = std::time::Instant::now();
    let refused = day2("apply", &[]).output().unwrap();
    let err = kubexm_e2e::text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(7), "{err}");
    assert!(
        err.contains("cluster lab is in operator mode and the Lease kubexm-system/kubexm-controller-manager is held by replica-")
            && err.contains("--force-local"),
        "{err}"
    );
    eprintln!("operator: apply refused while a replica leads, after {:?}", t0.elapsed());
    let before = k(&format!("get {the} -o json"));
    let before: serde_json::Value = serde_json::from_str(&before).unwrap();

    // A podCIDR change: NotSupported names the field; nothing else moves.
    let patch = |json: &str| format!("patch {the} --type=merge -p '{json}'");
    let wait_for = |t: &str, status: &str| {
        format!("wait {the} --timeout=30s --for=jsonpath='{{.status.conditions[?(@.type==\"{t}\")].status}}'={status}")
    };
    let timed = lab.ssh_ok(
        "lab1",
        &format!(
            "export KUBECONFIG=/etc/kubernetes/admin.conf; s=$(date +%s%N); kubectl {} >/dev/null && kubectl {} >/dev/null && \
             echo $(( ($(date +%s%N) - s) / 1000000 ))",
            patch(r#"{"spec":{"kubernetes":{"podCIDR":"10.99.0.0/16"}}}"#),
            wait_for("NotSupported", "True")
        ),
    );
    let ms: u64 = timed.trim().parse().unwrap();
    eprintln!("operator: kubectl apply of a podCIDR change to NotSupported in the status: {ms} ms (goal under 5000)");
    assert!(ms < 5000, "{ms} ms");
    let after: serde_json::Value = serde_json::from_str(&k(&format!("get {the} -o json"))).unwrap();
    let st = &after["status"];
    assert_eq!(st["observedGeneration"], after["metadata"]["generation"], "{after}");
    assert_eq!(condition("NotSupported", "reason"), "CannotChange");
    assert!(
        condition("NotSupported", "message").starts_with("spec.kubernetes.podCIDR: "),
        "{st}"
    );
    for same in ["version", "endpoint", "bundle", "readyNodes", "nodes"] {
        assert_eq!(st[same], before["status"][same], "{same} moved: {after}");
    }
    assert_eq!(condition("Ready", "status"), "True");
    let events = k(&format!(
        "-n {NAMESPACE} get events --field-selector involvedObject.name=lab -o json"
    ));
    assert!(events.contains("CannotChange") && events.contains("Warning"), "{events}");
    // Put back: nothing asked, nothing refused.
    let put_back = patch(&serde_json::json!({"spec": {"kubernetes": {"podCIDR": before["spec"]["kubernetes"]["podCIDR"]}}}).to_string());
    k(&put_back);
    k(&wait_for("NotSupported", "False"));
    assert_eq!(condition("NotSupported", "reason"), "AsApplied");

    a_worker_added_and_taken_out_through_the_object(lab, dir, &k, &the);

    // Paused: the same change is not even read.
    k(&patch(r#"{"spec":{"paused":true,"kubernetes":{"podCIDR":"10.99.0.0/16"}}}"#));
    until("the pause is reported", 10, &|| condition("Reconciling", "reason") == "Paused");
    assert_eq!(condition("NotSupported", "status"), "False");
    let g = jsonpath("{.metadata.generation}|{.status.observedGeneration}");
    let (gen_now, observed) = g.split_once('|').unwrap();
    assert_ne!(gen_now, observed, "a paused object's generation was observed");

    // The leader killed: the other replica takes the Lease and acts.
    let rss = |r: &kubexm_e2e::Background| {
        let s = std::fs::read_to_string(format!("/proc/{}/status", r.child.id())).unwrap_or_default();
        s.lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    for (r, name) in replicas.iter().zip(["replica-a", "replica-b"]) {
        eprintln!("operator: {name} peak RSS {} kB (goal under 65536)", rss(r));
        assert!(rss(r) < 64 * 1024, "{name}: {} kB", rss(r));
    }
    let leader = holder();
    let i = usize::from(leader == "replica-b");
    let killed = std::time::Instant::now();
    let _ = std::process::Command::new("kill")
        .args(["-9", &replicas[i].child.id().to_string()])
        .status();
    let _ = replicas[i].child.wait();
    until("the other replica takes the Lease", 30, &|| {
        let h = holder();
        h.starts_with("replica-") && h != leader
    });
    eprintln!(
        "operator: the leader killed with SIGKILL, the other replica holds the Lease after {:?}",
        killed.elapsed()
    );
    k(&patch(r#"{"spec":{"paused":null}}"#));
    k(&wait_for("NotSupported", "True"));
    eprintln!("operator: and decided the change paused before after {:?}", killed.elapsed());
    assert_eq!(condition("NotSupported", "reason"), "CannotChange");
    k(&put_back);
    k(&wait_for("NotSupported", "False"));

    // `kubectl delete` of the Cluster resets nothing: the nodes stay Ready
    // and the spec as applied stays. Created again from the file the
    // operator phase left on lab1, it is held against that spec: as
    // applied, and its status follows the nodes again.
    k(&format!("delete {the} --wait=true"));
    std::thread::sleep(std::time::Duration::from_secs(3));
    let ready = k("get nodes -o jsonpath='{.items[*].status.conditions[?(@.type==\"Ready\")].status}'");
    assert_eq!(ready.split_whitespace().collect::<Vec<_>>(), ["True"; 3], "{ready}");
    k(&format!("-n {NAMESPACE} get configmap kubexm-applied-lab"));
    k("create -f /var/lib/kubexm/operator/cluster.json");
    k(&wait_for("NotSupported", "False"));
    assert_eq!(condition("NotSupported", "reason"), "AsApplied");
    until("the new object's status follows the nodes", 60, &|| {
        condition("Ready", "reason") == "NodesReady"
    });

    // Stopped with SIGTERM: the Lease handed back at once.
    let last = replicas.remove(1 - i);
    let _ = std::process::Command::new("kill").arg(last.child.id().to_string()).status();
    until("the Lease is handed back", 10, &|| holder().is_empty());
    eprintln!("controller-manager log (the last replica):\n{}", last.stderr_tail());
    assert!(!last.stderr_tail().contains("panicked"), "{}", last.stderr_tail());

    // Nobody leads: apply takes the Lease while it runs, and hands it back.
    let mut running = day2("apply", &[])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let seen = (0..240).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(250));
        holder().starts_with("kubexm-install on ") || running.try_wait().ok().flatten().is_some()
    });
    let still = running.try_wait().ok().flatten().is_none();
    let ran = running.wait_with_output().unwrap();
    let said = format!("{}{}", kubexm_e2e::text(&ran.stdout), kubexm_e2e::text(&ran.stderr));
    assert!(seen && still, "apply was not seen holding the Lease while it ran:\n{said}");
    assert!(ran.status.success(), "{said}");
    assert!(holder().is_empty(), "the Lease was not handed back: {}", holder());
}

/// A worker added with kubectl: the spare host (lab4) appended to the
/// object's hosts and workers. Without its host key pinned in the spec the
/// controller refuses before touching a host; with it (and the Secret
/// kubexm-ssh holding the lab's key) it runs the apply: the node joins, the
/// old hosts apply nothing, and the status names the node. Then taken out
/// the same way, so the cluster is as the scenario's config says again.
fn a_worker_added_and_taken_out_through_the_object(lab: &Lab, dir: &Path, k: &dyn Fn(&str) -> String, the: &str) {
    let spare = lab.desc.hosts.iter().find(|h| h.spare).expect("the scenario's spare host").clone();
    let condition = |t: &str, field: &str| {
        k(&format!(
            "get {the} -o jsonpath='{{.status.conditions[?(@.type==\"{t}\")].{field}}}'"
        ))
    };
    let patch = |ops: &serde_json::Value| k(&format!("patch {the} --type=json -p '{ops}'"));
    let host = serde_json::json!({"name": spare.name, "address": spare.address, "arch": spare.arch});
    patch(&serde_json::json!([
        {"op": "add", "path": "/spec/hosts/-", "value": host},
        {"op": "add", "path": "/spec/roleGroups/worker/-", "value": spare.name},
    ]));
    until("a host without its key is refused", 30, &|| {
        condition("Failed", "reason") == "HostKeyMissing"
    });
    let why = condition("Failed", "message");
    assert!(why.contains("spec.hosts[3].hostKey: host lab4 is added"), "{why}");
    assert_eq!(condition("Reconciling", "status"), "False");

    // The spare's key pinned in the spec, but no login yet: refused, the
    // generation left unobserved so that the Secret, once made, is enough.
    let host_key = lab.ssh_ok("lab4", "cut -d' ' -f1,2 /etc/ssh/ssh_host_ed25519_key.pub");
    patch(&serde_json::json!([{"op": "add", "path": "/spec/hosts/3/hostKey", "value": host_key.trim()}]));
    until("a missing login is refused", 30, &|| {
        condition("Failed", "reason") == "CredentialMissing"
    });
    let why = condition("Failed", "message");
    assert!(why.contains("create secret generic kubexm-ssh"), "{why}");
    let g = k(&format!(
        "get {the} -o jsonpath='{{.metadata.generation}}|{{.status.observedGeneration}}'"
    ));
    let (generation, observed) = g.split_once('|').unwrap();
    assert_ne!(generation, observed, "a missing login observed the generation");
    let mut secret = lab.ssh_command("lab1");
    secret
        .arg(format!(
            "kubectl --kubeconfig /etc/kubernetes/admin.conf -n {NAMESPACE} create secret generic kubexm-ssh \
             --from-file=ssh-privatekey=/dev/stdin"
        ))
        .stdin(std::process::Stdio::piped());
    let mut child = secret.spawn().unwrap();
    let key = std::fs::read(&lab.desc.ssh.key).unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), &key).unwrap();
    assert!(child.wait().unwrap().success(), "creating the Secret kubexm-ssh");
    let made = std::time::Instant::now();
    // The next resync (every 30 s) runs the change.
    until("the controller runs the change", 60, &|| {
        condition("Reconciling", "reason") == "Applying"
    });
    eprintln!(
        "operator: the Secret made, the change running after {:?} (the next resync)",
        made.elapsed()
    );
    until("the change is run", 600, &|| condition("Reconciling", "reason") != "Applying");
    assert_eq!(
        condition("Reconciling", "reason"),
        "Applied",
        "{}",
        k(&format!("get {the} -o jsonpath='{{.status.conditions}}'"))
    );
    // The job it ran: nothing applied on the hosts that were there.
    let db = rusqlite::Connection::open(dir.join("state.db")).unwrap();
    let job: i64 = db
        .query_row("SELECT max(id) FROM jobs WHERE kind = 'apply'", [], |r| r.get(0))
        .unwrap();
    let last = k(&format!(
        "get {the} -o jsonpath='{{.status.lastOperation.job}} {{.status.lastOperation.kind}} {{.status.lastOperation.result}}'"
    ));
    assert_eq!(last, format!("{job} apply succeeded"));
    let timeline = k(&format!("get {the} -o jsonpath='{{.status.lastOperation.timeline}}'"));
    assert!(timeline.contains("critical path by phase: "), "{timeline}");
    eprintln!("operator: lastOperation's timeline: {timeline}");
    let mut q = db
        .prepare("SELECT host, count(*) FROM steps WHERE job = ?1 AND status = 'applied' GROUP BY host")
        .unwrap();
    let per_host: Vec<(String, i64)> = q
        .query_map([job], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    eprintln!("operator: steps applied by the controller's job {job}: {per_host:?}");
    for (h, n) in &per_host {
        assert!(h == "lab4" || h == "lab1" || *n == 0, "{h} applied {n} steps: {per_host:?}");
    }
    assert!(per_host.iter().any(|(h, n)| h == "lab4" && *n > 0), "{per_host:?}");
    // lab4's files came from a lab host (the registry host's kubexm-registry):
    // the replicas run no file server of their own.
    let mut q = db
        .prepare("SELECT log FROM steps WHERE job = ?1 AND host = 'lab4' AND status = 'applied' AND module != 'preflight'")
        .unwrap();
    let logs: Vec<String> = q.query_map([job], |r| r.get(0)).unwrap().map(Result::unwrap).collect();
    let fetched: Vec<&String> = logs.iter().filter(|l| l.starts_with("fetched ")).collect();
    // The scenario's registry host: the first control-plane node, lab1.
    let origin = format!(" from https://{}:", lab.host("lab1").address);
    assert!(!fetched.is_empty(), "no fetch on lab4: {logs:?}");
    for l in &fetched {
        assert!(l.contains(&origin), "not from the registry host lab1: {l}");
    }
    assert!(!logs.iter().any(|l| l.contains("over SFTP")), "{logs:?}");
    eprintln!(
        "operator: lab4's {} fetches came from the registry host ({})",
        fetched.len(),
        fetched[0]
    );
    until("lab4 is Ready", 240, &|| {
        k("get node lab4 -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}'") == "True"
    });
    until("the status names lab4", 60, &|| {
        k(&format!("get {the} -o jsonpath='{{.status.nodes[*].name}}'")).contains("lab4")
    });
    let g = k(&format!(
        "get {the} -o jsonpath='{{.metadata.generation}}|{{.status.observedGeneration}}'"
    ));
    let (generation, observed) = g.split_once('|').unwrap();
    assert_eq!(generation, observed);
    let events = k(&format!(
        "-n {NAMESPACE} get events --field-selector involvedObject.name=lab -o json"
    ));
    assert!(events.contains("Applied") && events.contains("HostKeyMissing"), "{events}");
    assert!(!events.contains("PRIVATE KEY"), "{events}");

    // Taken out again the same way: drained, its Node deleted, the host
    // reset; the spec as applied and the status follow.
    let asked = now_ms();
    patch(&serde_json::json!([
        {"op": "test", "path": "/spec/hosts/3/name", "value": "lab4"},
        {"op": "remove", "path": "/spec/hosts/3"},
        {"op": "test", "path": "/spec/roleGroups/worker/2", "value": "lab4"},
        {"op": "remove", "path": "/spec/roleGroups/worker/2"},
    ]));
    let t0 = std::time::Instant::now();
    until("the controller takes lab4 out", 30, &|| {
        condition("Reconciling", "reason") == "Applying"
    });
    until("lab4 is taken out", 600, &|| condition("Reconciling", "reason") != "Applying");
    let said = condition("Reconciling", "message");
    assert_eq!(condition("Reconciling", "reason"), "Applied", "{said}");
    assert!(said.contains("removed lab4 from cluster lab"), "{said}");
    eprintln!("operator: lab4 taken out through the object in {:?}", t0.elapsed());
    let first: i64 = db
        .query_row(
            "SELECT min(started) FROM steps WHERE job = (SELECT max(id) FROM jobs WHERE kind = 'remove-node')",
            [],
            |r| r.get(0),
        )
        .unwrap();
    eprintln!(
        "operator: kubectl patch taking lab4 out to the controller's first step: {} ms (goal under 5000)",
        first - asked
    );
    assert!(first - asked < 30_000, "{} ms", first - asked);
    assert!(!k("get nodes -o name").contains("node/lab4"));
    until("the status no longer names lab4", 60, &|| {
        !k(&format!("get {the} -o jsonpath='{{.status.nodes[*].name}}'")).contains("lab4")
    });
    let applied = k(&format!(
        "-n {NAMESPACE} get configmap kubexm-applied-lab -o jsonpath='{{.data.spec\\.json}}'"
    ));
    assert!(applied.contains("lab3") && !applied.contains("lab4"), "{applied}");
    assert!(
        !lab.ssh("lab4", "systemctl is-active kubelet").status.success(),
        "lab4's kubelet still runs"
    );
}

/// Milliseconds since the epoch (the state database's clock).
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}
