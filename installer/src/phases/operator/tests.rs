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
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin)?;
    let fake = bin.join("kubectl");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\necho \"$*\" >> {log}\ncase \"$*\" in *'jsonpath={{.metadata.generation}}') echo 3;; esac\n",
            log = dir.join("kubectl.log").display()
        ),
    )?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755))?;
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    std::process::Command::new("sh")
        .arg("-c")
        .arg(command.replace(DIR, &dir.display().to_string()))
        .env("PATH", path)
        .output()
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
