//! Hosts that work against the worker (issue 25): one that prints without end.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kubexm_e2e::{Lab, bin, ok, text};

/// The peak resident memory (VmHWM) of a running process, in KiB.
fn peak_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A host whose facts command (`hostname`) prints 2 GB (on stderr, as a broken or hostile
/// program would): the job fails saying why, the worker that ran it stays
/// small, and the job's stored log is a few lines. Before the bound the
/// worker held the whole output in memory (for up to 30 minutes).
#[test]
fn a_host_printing_2_gb_fails_its_job_quickly_and_the_worker_stays_small() {
    let Some(lab) = Lab::up(1, 0) else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    lab.ssh_ok(
        "lab1",
        "printf '#!/bin/sh\\nhead -c 2G /dev/zero >&2\\nexec /bin/hostname \"$@\"\\n' > /usr/local/bin/hostname && chmod 755 /usr/local/bin/hostname",
    );
    let key = lab.desc.ssh.key.display().to_string();
    let cfg = crate::engine::config(&lab, d, |_| ("root".into(), format!("{{privateKey: {{path: {key}}}}}")));
    let kubexm = |args: &[&str]| {
        let mut c = Command::new(bin("kubexm"));
        c.arg("--db").arg(d.join("jobs.db")).args(args);
        c
    };
    // Built before the clock starts.
    kubexm(&["--help"]).output().unwrap();
    // The job runs in this process (no --detach): its peak memory is the worker's.
    let start = Instant::now();
    let mut run = kubexm(&["create", "facts", "-f"])
        .arg(&cfg)
        .arg("--state")
        .arg(d.join("state.db"))
        .stdout(Stdio::from(std::fs::File::create(d.join("out")).unwrap()))
        .stderr(Stdio::from(std::fs::File::create(d.join("err")).unwrap()))
        .spawn()
        .unwrap();
    let mut peak = 0;
    let status = loop {
        if let Some(kb) = peak_kb(run.id()) {
            peak = peak.max(kb);
        }
        if let Some(s) = run.try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed() < Duration::from_secs(300), "the job still runs");
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = start.elapsed();
    let err = std::fs::read_to_string(d.join("err")).unwrap();
    eprintln!(
        "2 GB printed by the host: the job ended in {took:.1?}, the worker's peak RSS {} MB",
        peak / 1024
    );
    assert!(!status.success(), "{err}");
    assert!(peak < 150 * 1024, "peak RSS {peak} KiB");
    let job: serde_json::Value =
        serde_json::from_str(&ok(kubexm(&["get", "job", "1", "-o", "json"]).output().unwrap(), "get job -o json")).unwrap();
    assert_eq!(job["job"]["status"], "Failed", "{job}");
    let error = job["job"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("printed more than 64 MiB"), "{job}");
    let log: Vec<String> = job["logs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["line"].as_str().unwrap().to_string())
        .collect();
    let stored: usize = log.iter().map(String::len).sum();
    assert!(log.iter().any(|l| l.contains("closed its channel")), "{log:?}");
    assert!(stored < 64 << 10, "{stored} bytes of log stored: {log:?}");
    // The host is not left printing: closing the channel ended the command.
    std::thread::sleep(Duration::from_secs(1));
    let left = lab.ssh("lab1", "pgrep -x head || true");
    assert_eq!(text(&left.stdout).trim(), "", "head still runs on the host");
    lab.ssh_ok("lab1", "rm -f /usr/local/bin/hostname");
}
