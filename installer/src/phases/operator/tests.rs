//! The phase's commands as a shell runs them, with a `kubectl` that records
//! its arguments and answers like an API server holding the object at
//! generation 3.

use super::*;

const CONFIG: &str = "apiVersion: kubexm.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: lab\nspec:\n  hostDefaults:\n    auth: {privateKey: {path: /root/.ssh/id}}\n  hosts:\n\
                      \x20 - {name: a, address: 10.0.0.1}\n\
                      \x20 - {name: b, address: 10.0.0.2, auth: {password: {fromEnv: PW}}}\n\
                      \x20 roleGroups: {control-plane: [a], etcd: [a], worker: [b]}\n\
                      \x20 kubernetes: {version: v1.37.2}\n";

/// Runs `command` with the fake kubectl, the phase's directory moved to `dir`.
fn run(dir: &std::path::Path, command: &str) -> std::io::Result<std::process::Output> {
    let answers = format!(
        "echo \"$*\" >> {log}\ncase \"$*\" in *'jsonpath={{.metadata.generation}}') echo 3;; esac\n",
        log = dir.join("kubectl.log").display()
    );
    with_kubectl(dir, &answers, &command.replace(DIR, &dir.display().to_string()))
}

/// Runs `command` in `sh` with a `kubectl` on PATH (under `dir`) whose
/// body is `answers`.
fn with_kubectl(dir: &std::path::Path, answers: &str, command: &str) -> std::io::Result<std::process::Output> {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin)?;
    let fake = bin.join("kubectl");
    std::fs::write(&fake, format!("#!/bin/sh\n{answers}"))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755))?;
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    std::process::Command::new("sh").arg("-c").arg(command).env("PATH", path).output()
}

#[test]
fn the_object_carries_no_login_and_its_status_names_the_generation() -> Result<(), Box<dyn std::error::Error>> {
    let cluster: Cluster = serde_saphyr::from_str(CONFIG)?;
    let all = steps(&cluster, &cluster.spec, "lb.kubexm.local:6443", Some("sha256:ab"), "install", &[])?;
    let names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
    // A node not waited for is listed, not ready, and Ready is False.
    let partial = steps(&cluster, &cluster.spec, "e:6443", None, "install", &["b".into()])?;
    let st: serde_json::Value = serde_json::from_slice(&partial[4].files[0].1)?;
    assert_eq!(st["status"]["conditions"][0]["status"], "False", "{st}");
    assert_eq!(st["status"]["conditions"][0]["reason"], "NodesNotChecked", "{st}");
    assert_eq!(st["status"]["readyNodes"], 1, "{st}");
    assert_eq!(st["status"]["nodes"][1]["ready"], false, "{st}");
    assert_eq!(
        names,
        [
            "cluster-definition",
            "cluster-admission",
            "cluster-object",
            "cluster-applied",
            "cluster-status"
        ]
    );
    // The admission policy: this cluster's object, in kubexm-system, only.
    let policy: serde_json::Value = serde_json::from_slice(&all[1].files[0].1)?;
    let binding: serde_json::Value = serde_json::from_slice(&all[1].files[1].1)?;
    let rules = policy["spec"]["validations"].to_string();
    assert!(
        rules.contains("object.metadata.name == 'lab'") && rules.contains("== 'kubexm-system'"),
        "{rules}"
    );
    assert!(binding["metadata"]["annotations"][APPLIED].as_str().is_some_and(|a| a.len() == 64));
    // Every check and command is a shell's.
    for s in &all {
        for text in [&s.check, &s.command] {
            let out = std::process::Command::new("sh").arg("-n").arg("-c").arg(text).output()?;
            assert!(out.status.success(), "{text}: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
    // The object: no login but by credential, annotated with its sha256.
    let object: serde_json::Value = serde_json::from_slice(&all[2].files[0].1)?;
    assert_eq!(object["metadata"]["namespace"], NAMESPACE);
    assert!(object["metadata"]["annotations"][APPLIED].as_str().is_some_and(|a| a.len() == 64));
    assert!(
        object["spec"]["hostDefaults"]
            .get("auth")
            .is_none_or(|a| a.get("privateKey").is_none()),
        "{object}"
    );
    assert!(
        object["spec"]["hosts"][1].get("auth").is_none_or(|a| a.get("password").is_none()),
        "{object}"
    );
    // The spec as applied: the object's, for the controller to hold a changed object against.
    let applied: serde_json::Value = serde_json::from_slice(&all[3].files[0].1)?;
    assert_eq!(applied["metadata"]["name"], "kubexm-applied-lab");
    let spec: serde_json::Value = serde_json::from_str(applied["data"][kubexm_crd::APPLIED_KEY].as_str().unwrap_or_default())?;
    assert_eq!(spec, object["spec"]);
    // The status, written with the generation the API server gives.
    let dir = tempfile::tempdir()?;
    let s = &all[4];
    std::fs::write(dir.path().join("status.json"), &s.files[0].1)?;
    let out = run(dir.path(), &s.command)?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let written: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join("status.json.now"))?)?;
    let st = &written["status"];
    assert_eq!(st["observedGeneration"], 3);
    assert_eq!(st["conditions"][0]["observedGeneration"], 3);
    assert_eq!(st["conditions"][0]["type"], "Ready");
    assert_eq!(st["conditions"][0]["reason"], "Installed");
    assert_ne!(st["conditions"][0]["lastTransitionTime"], kubexm_crd::TIME_PLACEHOLDER);
    assert_eq!(st["readyNodes"], 2);
    assert_eq!(st["bundle"], "sha256:ab");
    assert_eq!(st["nodes"][1]["roles"], serde_json::json!(["worker"]));
    let log = std::fs::read_to_string(dir.path().join("kubectl.log"))?;
    assert!(
        log.contains("patch clusters.kubexm.io lab -n kubexm-system --subresource=status --type=merge"),
        "{log}"
    );
    Ok(())
}

/// Issue 31: the controller's objects with `operator.enabled: true`: the
/// bundle's image by digest, its arches in the Deployment's affinity, RBAC
/// by name; refused without the image in the bundle, and when no
/// control-plane node is of the image's arches; taken away when `false`.
#[test]
fn the_controller_runs_the_bundle_s_image_on_control_plane_nodes_of_its_arches() -> Result<(), Box<dyn std::error::Error>> {
    let mut cluster: Cluster = serde_saphyr::from_str(CONFIG)?;
    let bom = kubexm_bom::Bom::default();
    let none = std::collections::BTreeMap::new();
    let off = controller_step(&cluster, &bom, &none)?;
    assert_eq!(off.name, "cluster-controller-absent");
    assert!(
        off.command.contains("delete -n kubexm-system --ignore-not-found"),
        "{}",
        off.command
    );
    assert!(off.command.contains("deployment/kubexm-controller-manager"), "{}", off.command);
    assert!(
        off.check
            .contains("serviceaccount/kubexm-controller-manager role/kubexm-controller-manager"),
        "{}",
        off.check
    );

    cluster.spec.operator.enabled = true;
    let e = controller_step(&cluster, &bom, &none).err().ok_or("no error")?.to_string();
    assert!(e.contains("carries no controller image"), "{e}");
    let mut bom = kubexm_bom::Bom::default();
    bom.images.push(kubexm_bom::ImageItem {
        reference: kubexm_bom::image::controller_image(),
        source: None,
        platforms: vec!["linux/amd64".into()],
        digest: Some(format!("sha256:{}", "cd".repeat(32))),
        upstream_digest: None,
        platform_manifests: Default::default(),
        from_manifest: None,
    });
    let arm: std::collections::BTreeMap<String, String> = [("a".to_string(), "arm64".to_string())].into();
    let e = controller_step(&cluster, &bom, &arm).err().ok_or("no error")?;
    assert!(
        matches!(e.downcast_ref::<crate::DeployError>(), Some(crate::DeployError::NotSupported(_))),
        "{e}"
    );
    assert!(e.to_string().contains("a (arm64)"), "{e}");

    let on = controller_step(&cluster, &bom, &none)?;
    assert_eq!(on.name, "cluster-controller");
    let kinds: Vec<String> = on
        .files
        .iter()
        .map(|(f, _, _)| f.rsplit('/').next().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        kinds,
        [
            "controller-serviceaccount.json",
            "controller-role.json",
            "controller-rolebinding.json",
            "controller-clusterrole.json",
            "controller-clusterrolebinding.json",
            "controller-deployment.json"
        ]
    );
    let deployment: serde_json::Value = serde_json::from_slice(&on.files[5].1)?;
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(
        pod["containers"][0]["image"],
        format!("kubexm.io/kubexm:{}@sha256:{}", env!("CARGO_PKG_VERSION"), "cd".repeat(32))
    );
    assert_eq!(
        pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"],
        serde_json::json!(["amd64"])
    );
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    let role: serde_json::Value = serde_json::from_slice(&on.files[1].1)?;
    let rules = role["rules"].to_string();
    assert!(rules.contains("kubexm-applied-lab") && !rules.contains("secrets"), "{rules}");
    // A re-run applies nothing once every object carries its sha256 and the Deployment is Available.
    assert_eq!(on.check.matches("kubexm.io/applied-sha256").count(), 0, "{}", on.check);
    assert_eq!(on.check.matches("applied-sha256").count(), 6, "{}", on.check);
    assert!(on.check.contains("Available"), "{}", on.check);
    assert!(
        on.command
            .contains("rollout status deployment/kubexm-controller-manager -n kubexm-system"),
        "{}",
        on.command
    );
    Ok(())
}

/// A re-run writes the status again unless it holds this run's fields;
/// the Ready nodes may be the controller's count since (its reasons), not
/// only this run's.
#[test]
fn a_status_the_controller_keeps_current_is_not_written_again() -> Result<(), Box<dyn std::error::Error>> {
    let cluster: Cluster = serde_saphyr::from_str(CONFIG)?;
    let all = steps(&cluster, &cluster.spec, "e:6443", Some("sha256:ab"), "install", &["b".into()])?;
    let check = &all[4].check;
    let holds = |ready: &str| -> Result<bool, Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let answers = format!(
            "case \"$*\" in\n\
             *'jsonpath={{.metadata.generation}}') echo 3;;\n\
             *'jsonpath={{.status.observedGeneration}}'*) echo '3|v1.37.2|sha256:ab|e:6443';;\n\
             *'jsonpath={{.status.readyNodes}}'*) echo '{ready}';;\n\
             *) echo FalseFalse;;\nesac\n"
        );
        Ok(with_kubectl(dir.path(), &answers, check)?.status.success())
    };
    // This run's count (b not checked: 1 Ready), or the controller's when at least that.
    assert!(holds("1|NodesNotChecked")?, "{check}");
    assert!(holds("2|NodesReady")?, "{check}");
    assert!(holds("1|NodesNotReady")?, "{check}");
    // The controller's, older than what this run checked; another count by no controller: written again.
    assert!(!holds("0|NodesNotReady")?, "{check}");
    assert!(!holds("2|NodesNotChecked")?, "{check}");
    assert!(!holds("2|Installed")?, "{check}");
    Ok(())
}
