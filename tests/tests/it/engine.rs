//! The engine over real SSH: facts from several hosts at once by key,
//! password and a sudoer, and host keys pinned on first contact.

use std::path::Path;
use std::process::Command;

use kubexm_e2e::{Lab, bin, ok, text};

/// A cluster config for the running lab hosts; `auth` gives each host's
/// user and auth block by index.
pub(crate) fn config(lab: &Lab, dir: &Path, auth: impl Fn(usize) -> (String, String)) -> std::path::PathBuf {
    let mut s = String::from("apiVersion: kubexm.io/v1alpha1\nkind: Cluster\nmetadata: {name: lab}\nspec:\n  hosts:\n");
    for (i, h) in lab.desc.hosts.iter().enumerate() {
        let (user, auth) = auth(i);
        s.push_str(&format!(
            "    - {{name: {}, address: {}, arch: {}, user: {user}, auth: {auth}}}\n",
            h.name, h.address, h.arch
        ));
    }
    s.push_str("  roleGroups: {etcd: [lab1], control-plane: [lab1]}\n  controlPlaneEndpoint: {mode: local-proxy}\n  kubernetes: {version: v1.37.2}\n  bundle: {arches: [amd64]}\n");
    let p = dir.join("cluster.yaml");
    std::fs::write(&p, s).unwrap();
    p
}

/// `kubexm-install facts -o json` for `config`, with the lab password in the environment.
fn facts_command(lab: &Lab, config: &Path, state: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(bin("kubexm-install"));
    c.arg("facts")
        .arg("-f")
        .arg(config)
        .arg("--state")
        .arg(state)
        .args(["-o", "json"])
        .args(extra)
        .env("KUBEXM_LAB_PASSWORD", &lab.desc.ssh.password);
    c
}

fn facts(lab: &Lab, config: &Path, state: &Path, extra: &[&str]) -> std::process::Output {
    facts_command(lab, config, state, extra).output().unwrap()
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
    let status = kubexm_e2e::status(&state);
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

/// Runs the lab plan driver; returns its output.
fn driver(lab: &Lab, cfg: &Path, state: &Path, slow: u32, concurrency: u32) -> Command {
    let digests: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&lab.desc.fixture.digests).unwrap()).unwrap();
    let sha = digests["runc"]["v1.1.5"]["amd64"].as_str().unwrap().to_string();
    let rel = "github.com/opencontainers/runc/releases/download/v1.1.5/runc.amd64";
    let local = lab.desc.fixture.catalog.parent().unwrap().join("files").join(rel);
    let mut c = Command::new(kubexm_e2e::example("plan_driver"));
    c.arg(cfg)
        .arg(&lab.desc.fixture.catalog)
        .arg(state)
        .arg(format!("{}/{rel}", lab.desc.fixture.http))
        .arg(local)
        .arg(sha)
        .arg(slow.to_string())
        .arg(concurrency.to_string());
    c
}

fn summary(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("driver said: {}{}", text(&out.stdout), text(&out.stderr)))
}

#[test]
fn fan_out_resume_after_sigkill_and_a_host_stopped_mid_run() {
    let Some(lab) = Lab::up(5, 0) else { return };
    let dir = tempfile::tempdir().unwrap();
    let key = lab.desc.ssh.key.display().to_string();
    let cfg = config(&lab, dir.path(), |_| ("root".into(), format!("{{privateKey: {{path: {key}}}}}")));
    let state = dir.path().join("state.db");

    // 1. The installer is killed with SIGKILL mid-run; a re-run resumes and completes.
    let mut child = driver(&lab, &cfg, &state, 3, 2)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(5));
    child.kill().unwrap();
    let _ = child.wait();
    let resumed = driver(&lab, &cfg, &state, 3, 2).output().unwrap();
    let r = summary(&resumed);
    assert!(resumed.status.success(), "{r}");
    assert!(
        r["skipped"].as_u64().unwrap() >= 2,
        "the re-run redid work finished before the kill: {r}"
    );
    assert!(r["applied"].as_u64().unwrap() >= 1, "the kill came after everything was done: {r}");
    let status = kubexm_e2e::status(&state);
    assert!(status.contains("succeeded") && status.contains("skipped"), "{status}");

    // 2. Every check now holds: nothing is applied.
    let again = summary(&driver(&lab, &cfg, &state, 3, 5).output().unwrap());
    assert_eq!(
        (again["applied"].as_u64(), again["skipped"].as_u64()),
        (Some(0), Some(20)),
        "{again}"
    );

    // 3. One host stopped mid-run: the others finish, the error names the host and the step; a re-run completes once it is back.
    for h in ["lab1", "lab2", "lab3", "lab4", "lab5"] {
        // The unit keeps running (its check holds); the files go, so those steps run again.
        lab.ssh_ok(h, "rm -rf /var/lib/kubexm-test");
    }
    let run = driver(&lab, &cfg, &state, 6, 5)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(3));
    kubexm_e2e::lab_cmd(&["stop", "lab3"]);
    let out = run.wait_with_output().unwrap();
    let s = summary(&out);
    assert_eq!(out.status.code(), Some(7), "{s}");
    let failed = s["failed"].as_array().unwrap();
    assert!(
        !failed.is_empty()
            && failed
                .iter()
                .all(|f| f["host"] == "lab3" && f["id"].as_str().unwrap().ends_with("@lab3")),
        "{s}"
    );
    // The other four hosts finish (three steps applied, the running unit skipped); lab3 stops at the failed step.
    assert!(s["applied"].as_u64().unwrap() >= 12, "the other four hosts finish: {s}");
    assert_eq!(failed.len(), 1, "{s}");
    let total = ["applied", "skipped", "notRun"].iter().map(|k| s[k].as_u64().unwrap()).sum::<u64>() + failed.len() as u64;
    assert_eq!(total, 20, "every step is accounted for: {s}");
    kubexm_e2e::lab_cmd(&["start", "lab3"]);
    let back = driver(&lab, &cfg, &state, 1, 5).output().unwrap();
    let b = summary(&back);
    assert!(back.status.success(), "{b}");
}

/// Agent auth, and hosts reachable only through a bastion: lab2 and lab3
/// accept SSH from lab1's address alone, so the direct path is refused and
/// only the jump through lab1 works.
#[test]
fn facts_by_agent_and_through_a_bastion() {
    let Some(lab) = Lab::up(3, 0) else { return };
    let dir = tempfile::tempdir().unwrap();
    let key = lab.desc.ssh.key.display().to_string();
    let bastion = lab.desc.hosts[0].address.clone();
    for h in ["lab2", "lab3"] {
        lab.ssh_ok(
            h,
            &format!("echo 'AllowUsers root@{bastion}' > /etc/ssh/sshd_config.d/zz-only-bastion.conf && systemctl reload ssh"),
        );
    }
    let sock = dir.path().join("agent.sock");
    let agent = Command::new("ssh-agent").arg("-a").arg(&sock).arg("-s").output().unwrap();
    assert!(agent.status.success(), "ssh-agent: {}", text(&agent.stderr));
    let pid: String = text(&agent.stdout)
        .split("SSH_AGENT_PID=")
        .nth(1)
        .and_then(|s| s.split(';').next())
        .unwrap()
        .to_string();
    struct Kill(String);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = Command::new("kill").arg(&self.0).status();
        }
    }
    let _agent = Kill(pid);
    let added = Command::new("ssh-add").arg(&key).env("SSH_AUTH_SOCK", &sock).output().unwrap();
    assert!(added.status.success(), "ssh-add: {}", text(&added.stderr));
    let cfg = config(&lab, dir.path(), |i| match i {
        0 => ("root".into(), "{agent: true}".into()),
        _ => (
            "root".into(),
            format!("{{privateKey: {{path: {key}}}}}, bastion: {{address: {bastion}, user: root, auth: {{agent: true}}}}"),
        ),
    });
    let state = dir.path().join("state.db");
    let by_agent = facts_command(&lab, &cfg, &state, &[]).env("SSH_AUTH_SOCK", &sock).output().unwrap();
    let v: serde_json::Value = serde_json::from_str(&ok(by_agent, "facts by agent and bastion")).unwrap();
    let got: Vec<&str> = v["facts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["hostname"].as_str().unwrap())
        .collect();
    assert_eq!(got, ["lab1", "lab2", "lab3"], "{v}");
    // The direct path really is closed: without the bastion, lab2 is refused.
    let direct = config(&lab, dir.path(), |_| ("root".into(), format!("{{privateKey: {{path: {key}}}}}")));
    let refused = facts(&lab, &direct, &dir.path().join("direct.db"), &[]);
    assert_eq!(refused.status.code(), Some(7), "{}", text(&refused.stderr));
    assert!(text(&refused.stderr).contains("lab2"), "{}", text(&refused.stderr));
}
