//! For tests and benchmarks only: a real PostgreSQL server (Debian's
//! binaries) in a temporary directory on loopback, started as the
//! `postgres` user when run as root, stopped by its pid when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running PostgreSQL server; `url` reaches it as superuser `kubexm`.
pub struct Postgres {
    pub url: String,
    data: PathBuf,
    bin: PathBuf,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = as_postgres(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["stop", "-m", "immediate"])
            .output();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether this process runs as root (PostgreSQL refuses to).
fn root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
}

/// `cmd`, run as the `postgres` user when we are root.
fn as_postgres(cmd: &Path) -> Command {
    if root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(cmd);
        c
    } else {
        Command::new(cmd)
    }
}

/// Debian's PostgreSQL binaries, if installed.
pub fn binaries() -> Option<PathBuf> {
    std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("bin"))
        .find(|b| b.join("initdb").exists())
}

impl Postgres {
    /// Starts a fresh server; `Ok(None)` when PostgreSQL is not installed.
    pub fn start() -> Result<Option<Postgres>, String> {
        let Some(bin) = binaries() else {
            return Ok(None);
        };
        let e = |what: &str| {
            let what = what.to_string();
            move |err: std::io::Error| format!("{what}: {err}")
        };
        let dir = tempfile::Builder::new()
            .prefix("kubexm-pg")
            .tempdir_in("/tmp")
            .map_err(e("a temporary directory"))?;
        let data = dir.path().join("data");
        if root() {
            Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .output()
                .map_err(e("chown"))?;
        }
        let init = as_postgres(&bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "kubexm", "--no-sync"])
            .output()
            .map_err(e("initdb"))?;
        if !init.status.success() {
            return Err(format!("initdb: {}", String::from_utf8_lossy(&init.stderr)));
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(e("a free port"))?
            .port();
        let log = std::fs::File::create(dir.path().join("postgres.log")).map_err(e("postgres.log"))?;
        let child = as_postgres(&bin.join("postgres"))
            .arg("-D")
            .arg(&data)
            .arg("-k")
            .arg(dir.path())
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(e("postgres"))?;
        let pg = Postgres {
            url: format!("postgres://kubexm@127.0.0.1:{port}/postgres"),
            data,
            bin,
            child,
            _dir: dir,
        };
        let start = Instant::now();
        loop {
            let ready = as_postgres(&pg.bin.join("pg_isready"))
                .args(["-h", "127.0.0.1", "-p", &port.to_string()])
                .output()
                .map_err(e("pg_isready"))?;
            if ready.status.success() {
                return Ok(Some(pg));
            }
            if start.elapsed() > Duration::from_secs(30) {
                return Err("PostgreSQL did not start within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Jobs as the version before typed requests stored them (job database
/// schema 3 on SQLite, 2 on PostgreSQL): an API install, an operator's
/// install, a reset with and without the operator's root, facts.
pub fn jobs_before_requests() -> Vec<crate::jobdb::NewJob> {
    let digest = format!("sha256:{}", "c".repeat(64));
    [
        ("install", serde_json::json!({ "bundle_digest": digest })),
        (
            "install",
            serde_json::json!({"bundle": "/srv/k.tar.zst", "pubkey": "/srv/k.pub", "allow_unsigned": false,
                "advertise": "10.0.0.9", "serve_port": 5443, "root": "/var/lib/kubexm", "phases": ["etcd"], "kubeconfig": null}),
        ),
        ("reset", serde_json::json!({ "root": "/var/lib/kubexm-a" })),
        ("reset", serde_json::json!({ "root": null })),
        ("facts", serde_json::json!({})),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (kind, options))| crate::jobdb::NewJob {
        cluster: format!("c{i}"),
        kind: kind.into(),
        config: "kind: Cluster\n".into(),
        config_name: "cluster.yaml".into(),
        options,
        origin: crate::jobdb::Origin::Request,
        principal: None,
    })
    .collect()
}

/// What [`jobs_before_requests`] must read as once migrated: the API
/// install asks for its digest, the resets and facts read (the operator's
/// root kept as `local`), and the operator's install, which named no
/// digest, keeps its flags under `local` and reads as an error naming the
/// missing bundle.
pub fn check_migrated_requests(jobs: &[crate::jobdb::Job]) -> Result<(), String> {
    use crate::job_request::read;
    use kubexm_installer::ops::request::{HostsRequest, Request};
    let by = |c: &str| jobs.iter().find(|j| j.cluster == c).ok_or(format!("job of {c} is gone"));
    let (api, _) = read("install", &by("c0")?.options).map_err(|e| format!("the API install: {e}"))?;
    if api.bundle() != Some(format!("sha256:{}", "c".repeat(64)).as_str()) {
        return Err(format!("the API install asks for {api:?}"));
    }
    let operator = by("c1")?;
    let err = read("install", &operator.options)
        .err()
        .ok_or("the operator's install without a digest read")?;
    if !err.to_string().contains("bundle") || operator.options["local"]["advertise"] != "10.0.0.9" {
        return Err(format!("the operator's install: {err}; {}", operator.options));
    }
    let reset = read("reset", &by("c2")?.options).map_err(|e| e.to_string())?;
    if reset.0 != Request::Reset(HostsRequest::default()) || reset.1.and_then(|l| l.root) != Some("/var/lib/kubexm-a".into()) {
        return Err(format!("the operator's reset: {}", by("c2")?.options));
    }
    for (c, kind) in [("c3", "reset"), ("c4", "facts")] {
        let (_, local) = read(kind, &by(c)?.options).map_err(|e| format!("{kind}: {e}"))?;
        if local.is_some() {
            return Err(format!("{kind} gained a local part: {}", by(c)?.options));
        }
    }
    Ok(())
}
