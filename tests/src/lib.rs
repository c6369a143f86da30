//! kubexm-e2e: starts and stops the test lab (`ci/lab`) for Rust tests.
//!
//! A test calls [`Lab::up`] for the hosts it needs and gets a guard; the lab
//! goes down when the guard drops, also when the test panics, so a failed test
//! leaves no process, mount, link or namespace behind. Labs are serialized
//! across threads and processes by a lock file: there is one lab bridge.
//!
//! Lab tests need root. Outside CI a test without root is skipped with a line
//! that says why; under `CI=true` that is a failure, never a silent skip.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};

use serde::Deserialize;

static IN_PROCESS: Mutex<()> = Mutex::new(());
const LOCK: &str = "/run/kubexm-lab.lock";

/// The lab as `ci/lab up` describes it in `lab.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct Description {
    pub bridge: String,
    pub gateway: String,
    pub ssh: Ssh,
    pub hosts: Vec<Host>,
    pub fixture: Fixture,
    pub mirrors: serde_json::Map<String, serde_json::Value>,
    pub cluster: PathBuf,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ssh {
    pub key: PathBuf,
    pub user: String,
    pub password: String,
    pub sudo_user: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Host {
    pub name: String,
    pub address: String,
    pub arch: String,
    pub netns: String,
    pub root: PathBuf,
    pub pid: u32,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Fixture {
    pub http: String,
    pub registry: String,
    pub catalog: PathBuf,
    pub digests: PathBuf,
    pub images: PathBuf,
}

/// A running lab; dropping it brings the lab down.
pub struct Lab {
    pub desc: Description,
    _lock: File,
    _guard: MutexGuard<'static, ()>,
}

/// The repository root (this crate lives in `tests/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Why the lab cannot run here, if it cannot.
pub fn unavailable() -> Option<String> {
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if uid.as_deref() != Some("0") {
        return Some("the lab needs root (network namespaces, overlay mounts, systemd-nspawn)".into());
    }
    if !Path::new("/usr/bin/systemd-nspawn").exists() && !repo_root().join("ci/lab").exists() {
        return Some("ci/lab or systemd-nspawn is missing".into());
    }
    None
}

/// A kubexm binary built from this workspace (built on first use if missing).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/<test> → target/<profile>/<name>
    let dir = exe.parent().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_default();
    let path = dir.join(name);
    if !path.exists() {
        let package = match name {
            "kubexm-bundle" => "kubexm-builder",
            _ => "kubexm-installer",
        };
        let status = Command::new(env!("CARGO"))
            .args(["build", "-q", "-p", package, "--bin", name])
            .status()
            .expect("running cargo build");
        assert!(status.success(), "building {name} failed");
    }
    path
}

/// The fixture server's request counters.
pub fn fixture_stats(lab: &Lab) -> serde_json::Value {
    let out = Command::new("curl")
        .args(["-sf", &format!("{}/_lab/stats", lab.desc.fixture.http)])
        .output()
        .expect("curl");
    serde_json::from_slice(&out.stdout).expect("fixture stats are JSON")
}

/// POSTs JSON to a fixture control endpoint (`stats/reset`, `fault`).
pub fn fixture_control(lab: &Lab, endpoint: &str, body: &str) {
    let url = format!("{}/_lab/{endpoint}", lab.desc.fixture.http);
    let out = Command::new("curl")
        .args(["-sf", "-XPOST", "-d", body, &url])
        .output()
        .expect("curl");
    assert!(out.status.success(), "POST {url} failed");
}

/// Runs `ci/lab ARGS`, failing with its output if it fails.
pub fn lab_cmd(args: &[&str]) -> Output {
    let out = Command::new(repo_root().join("ci/lab"))
        .args(args)
        .output()
        .expect("running ci/lab");
    assert!(
        out.status.success(),
        "ci/lab {} failed ({}):\n{}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

impl Lab {
    /// Brings up `hosts` hosts, the last `arm64` of them emulated arm64.
    /// Returns `None` (after saying why) when the lab cannot run outside CI.
    pub fn up(hosts: usize, arm64: usize) -> Option<Lab> {
        if let Some(why) = unavailable() {
            assert!(!in_ci(), "CI=true but the lab cannot run: {why}");
            eprintln!("SKIP lab test: {why}");
            return None;
        }
        let guard = IN_PROCESS.lock().unwrap_or_else(|e| e.into_inner());
        let lock = File::create(LOCK).expect("creating the lab lock file");
        lock.lock().expect("taking the lab lock");
        // A lab left by a killed run is taken down first.
        lab_cmd(&["down"]);
        lab_cmd(&["prepare"]);
        lab_cmd(&["up", &hosts.to_string(), "--arm64", &arm64.to_string()]);
        let path = std::env::var("KUBEXM_LAB").unwrap_or_else(|_| "/run/kubexm-lab/lab.json".into());
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
        let desc = serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {path}: {e}"));
        Some(Lab {
            desc,
            _lock: lock,
            _guard: guard,
        })
    }

    pub fn host(&self, name: &str) -> &Host {
        self.desc
            .hosts
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("no lab host {name}"))
    }

    /// Runs a shell command on a host as root over SSH with the lab key.
    pub fn ssh(&self, host: &str, command: &str) -> Output {
        let h = self.host(host);
        Command::new("ssh")
            .args(["-i", &self.desc.ssh.key.to_string_lossy()])
            .args([
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "LogLevel=ERROR",
                "-o",
                "BatchMode=yes",
            ])
            .arg(format!("root@{}", h.address))
            .arg(command)
            .output()
            .expect("running ssh")
    }

    /// Like [`Lab::ssh`], asserting success and returning stdout.
    pub fn ssh_ok(&self, host: &str, command: &str) -> String {
        let out = self.ssh(host, command);
        assert!(
            out.status.success(),
            "`{command}` on {host} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let out = Command::new(repo_root().join("ci/lab")).arg("down").output();
        if let Ok(o) = out
            && !o.status.success()
        {
            eprintln!("ci/lab down failed: {}", String::from_utf8_lossy(&o.stderr));
        }
    }
}
