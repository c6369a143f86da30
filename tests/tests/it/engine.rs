//! The engine over real SSH: facts from several hosts at once by key,
//! password and a sudoer, and host keys pinned on first contact.

use std::path::Path;
use std::process::Command;

use kubexm_e2e::{Lab, bin, ok, text};

/// A cluster config for the running lab hosts; `auth` gives each host's
/// user and auth block by index.
fn config(lab: &Lab, dir: &Path, auth: impl Fn(usize) -> (String, String)) -> std::path::PathBuf {
    let mut s = String::from("apiVersion: kubexm.io/v1alpha1\nkind: Cluster\nmetadata: {name: lab}\nspec:\n  hosts:\n");
    for (i, h) in lab.desc.hosts.iter().enumerate() {
        let (user, auth) = auth(i);
        s.push_str(&format!(
            "    - {{name: {}, address: {}, arch: {}, user: {user}, auth: {auth}}}\n",
            h.name, h.address, h.arch
        ));
    }
    s.push_str("  roleGroups: {etcd: [lab1], control-plane: [lab1]}\n  controlPlaneEndpoint: {mode: local-proxy}\n  kubernetes: {version: v1.33.4-lab}\n  bundle: {arches: [amd64]}\n");
    let p = dir.join("cluster.yaml");
    std::fs::write(&p, s).unwrap();
    p
}

fn facts(lab: &Lab, config: &Path, state: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(bin("kubexm-install"))
        .arg("facts")
        .arg("-f")
        .arg(config)
        .arg("--catalog")
        .arg(&lab.desc.fixture.catalog)
        .arg("--state")
        .arg(state)
        .args(["-o", "json"])
        .args(extra)
        .env("KUBEXM_LAB_PASSWORD", &lab.desc.ssh.password)
        .output()
        .unwrap()
}

#[test]
fn facts_from_five_hosts_by_key_password_and_sudo() {
    let Some(lab) = Lab::up(5, 0) else { return };
    let dir = tempfile::tempdir().unwrap();
    let key = lab.desc.ssh.key.display().to_string();
    let sudoer = lab.desc.ssh.sudo_user.clone();
    let cfg = config(&lab, dir.path(), |i| match i {
        3 => ("root".into(), "{password: {fromEnv: KUBEXM_LAB_PASSWORD}}".into()),
        4 => (sudoer.clone(), format!("{{privateKey: {{path: {key}}}}}")),
        _ => ("root".into(), format!("{{privateKey: {{path: {key}}}}}")),
    });
    let state = dir.path().join("state.db");
    let v: serde_json::Value = serde_json::from_str(&ok(facts(&lab, &cfg, &state, &[]), "facts")).unwrap();
    let got = v["facts"].as_array().unwrap();
    assert_eq!(got.len(), 5, "{v}");
    for f in got {
        assert_eq!(f["hostname"], f["host"], "{f}");
        assert_eq!(f["arch"], "amd64");
        assert_eq!(f["osId"], "debian");
        assert_eq!(f["uid"], 0, "commands must run as root (through sudo for {sudoer}): {f}");
        assert!(f["ports"].as_array().unwrap().contains(&serde_json::json!(22)), "{f}");
        assert!(f["clockOffsetMs"].as_i64().unwrap().abs() < 2000, "{f}");
        assert_eq!(f["hasCurl"], true);
    }
    let status = ok(
        Command::new(bin("kubexm-install"))
            .arg("status")
            .arg("--state")
            .arg(&state)
            .output()
            .unwrap(),
        "status",
    );
    assert!(
        status.contains("(facts of cluster lab): succeeded") && status.contains("lab5"),
        "{status}"
    );
    // The password never reaches the state database.
    let raw = std::fs::read(&state).unwrap();
    assert!(!String::from_utf8_lossy(&raw).contains(&lab.desc.ssh.password));
}

#[test]
fn a_changed_host_key_is_refused_until_accepted() {
    let Some(lab) = Lab::up(1, 0) else { return };
    let dir = tempfile::tempdir().unwrap();
    let key = lab.desc.ssh.key.display().to_string();
    let cfg = config(&lab, dir.path(), |_| ("root".into(), format!("{{privateKey: {{path: {key}}}}}")));
    let state = dir.path().join("state.db");
    ok(facts(&lab, &cfg, &state, &[]), "first contact pins the key");
    // The host is "reinstalled": new host keys.
    lab.ssh_ok("lab1", "rm -f /etc/ssh/ssh_host_* && ssh-keygen -q -A && systemctl restart ssh");
    let refused = facts(&lab, &cfg, &state, &[]);
    assert_eq!(refused.status.code(), Some(7), "{}", text(&refused.stderr));
    let err = text(&refused.stderr);
    assert!(
        err.contains("lab1") && err.contains("host key changed") && err.contains("--accept-new-host-key"),
        "{err}"
    );
    ok(facts(&lab, &cfg, &state, &["--accept-new-host-key"]), "accepting the new key");
    ok(facts(&lab, &cfg, &state, &[]), "the new key is pinned");
}
