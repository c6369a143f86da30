//! kubexm-e2e: starts and stops the test lab (`ci/lab`) for Rust tests.
//!
//! A test calls [`Lab::up`] for the hosts it needs and gets a guard; the lab
//! goes down when the guard drops, also when the test panics, so a failed test
//! leaves no process, mount, link or namespace behind. Labs are serialized
//! across threads and processes by a lock file: there is one lab bridge per
//! `KUBEXM_LAB_ID` (0, the default; ci/test runs one more scenario beside
//! the main one on lab 1, its own bridge, network and run directory).
//!
//! Lab tests need root. Outside CI a test without root is skipped with a line
//! that says why; under `CI=true` that is a failure, never a silent skip.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};

use serde::Deserialize;

static IN_PROCESS: Mutex<()> = Mutex::new(());

/// The lab this process uses (`KUBEXM_LAB_ID`, as `ci/lab` reads it): its
/// lock file and its description.
fn lab_files() -> (String, String) {
    match std::env::var("KUBEXM_LAB_ID").ok().filter(|id| !id.is_empty() && id != "0") {
        None => ("/run/kubexm-lab.lock".into(), "/run/kubexm-lab/lab.json".into()),
        Some(id) => (format!("/run/kubexm-lab{id}.lock"), format!("/run/kubexm-lab{id}/lab.json")),
    }
}

/// The lab as `ci/lab up` describes it in `lab.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct Description {
    pub bridge: String,
    pub gateway: String,
    pub ssh: Ssh,
    pub hosts: Vec<Host>,
    pub fixture: Fixture,
    pub mirrors: serde_json::Map<String, serde_json::Value>,
    /// The lab's bundle-side cluster (the main job's with every addon and chart): for
    /// the builder, serve and OS tests.
    pub cluster: PathBuf,
    /// The main job's cluster: Kubernetes built from source, five hosts.
    pub main_job: PathBuf,
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
    /// Up, but in neither generated config (`ci/lab up --spare`): a host to add.
    #[serde(default)]
    pub spare: bool,
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
    /// When this test took the lab, for the run's record of where its minutes go.
    taken: f64,
}

/// Seconds since the epoch, as `ci/timeline-json` reads them.
fn epoch_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// Appends `lab/TEST LANE START END` to `$KUBEXM_CI_TIMES/lab-tests.log` when
/// ci/test asked for times: each lab test's share of a CI run, in the lane
/// of its lab (`lab`, `lab1` for `KUBEXM_LAB_ID=1`).
fn record_lab_time(taken: f64) {
    let Ok(dir) = std::env::var("KUBEXM_CI_TIMES") else {
        return;
    };
    let name = std::thread::current().name().unwrap_or("unnamed").replace(' ', "_");
    let lane = match std::env::var("KUBEXM_LAB_ID").ok().filter(|id| !id.is_empty() && id != "0") {
        Some(id) => format!("lab{id}"),
        None => "lab".into(),
    };
    let line = format!("lab/{name} {lane} {taken:.3} {:.3}\n", epoch_seconds());
    let path = Path::new(&dir).join("lab-tests.log");
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
    if let Err(e) = written {
        eprintln!("recording the lab test's time in {}: {e}", path.display());
    }
}

/// The repository root (this crate lives in `tests/`).
pub fn repo_root() -> PathBuf {
    Path::new(&manifest_dir()).parent().map(Path::to_path_buf).unwrap_or_default()
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

static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// A kubexm binary of this workspace, built (once per test process) so it
/// matches the source: a stale binary would test old code.
pub fn bin(name: &str) -> PathBuf {
    let package = match name {
        "kubexm-bundle" => "kubexm-builder",
        "kubexm" => "kubexm-server",
        _ => "kubexm-installer",
    };
    built(package, "--bin", name, name)
}

/// A lab test driver from `installer/examples/`, built like [`bin`].
pub fn example(name: &str) -> PathBuf {
    built("kubexm-installer", "--example", name, &format!("examples/{name}"))
}

fn built(package: &str, kind: &str, name: &str, rel: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/<test> → target/<profile>/<rel>
    let dir = exe.parent().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_default();
    let mut done = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if !done.iter().any(|b| b == rel) {
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "-q", "-p", package, kind, name]);
        // The installer's fault points (never in a release build) for the
        // lab tests that crash it on purpose; the job server runs it too.
        match package {
            "kubexm-installer" => cmd.args(["--features", "fault-injection"]),
            "kubexm-server" => cmd.args(["--features", "kubexm-installer/fault-injection"]),
            _ => &mut cmd,
        };
        if dir.file_name().is_some_and(|p| p == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("running cargo build");
        assert!(status.success(), "building {name} failed");
        done.push(rel.to_string());
    }
    dir.join(rel)
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
        Lab::up_with_spares(hosts, arm64, 0)
    }

    /// [`Lab::up`], and `spare` amd64 hosts after them that neither
    /// generated config names (hosts a day-2 test adds).
    pub fn up_with_spares(hosts: usize, arm64: usize, spare: usize) -> Option<Lab> {
        if let Some(why) = unavailable() {
            assert!(!in_ci(), "CI=true but the lab cannot run: {why}");
            eprintln!("SKIP lab test: {why}");
            return None;
        }
        let guard = IN_PROCESS.lock().unwrap_or_else(|e| e.into_inner());
        let (lock_file, description) = lab_files();
        let lock = File::create(&lock_file).expect("creating the lab lock file");
        lock.lock().expect("taking the lab lock");
        // A lab left by a killed run is taken down first, and bundles and
        // caches earlier test processes left in the temp directory go.
        lab_cmd(&["down"]);
        remove_bundles_of_ended_processes();
        lab_cmd(&["prepare"]);
        lab_cmd(&[
            "up",
            &hosts.to_string(),
            "--arm64",
            &arm64.to_string(),
            "--spare",
            &spare.to_string(),
        ]);
        let path = std::env::var("KUBEXM_LAB").unwrap_or(description);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
        let desc = serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {path}: {e}"));
        Some(Lab {
            desc,
            _lock: lock,
            _guard: guard,
            taken: epoch_seconds(),
        })
    }

    pub fn host(&self, name: &str) -> &Host {
        self.desc
            .hosts
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("no lab host {name}"))
    }

    /// An `ssh` command to a host as root with the lab key, ready for its arguments.
    pub fn ssh_command(&self, host: &str) -> Command {
        let h = self.host(host);
        let mut c = Command::new("ssh");
        c.args(["-i", &self.desc.ssh.key.to_string_lossy()])
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
            .arg(format!("root@{}", h.address));
        c
    }

    /// Runs a shell command on a host as root over SSH with the lab key.
    pub fn ssh(&self, host: &str, command: &str) -> Output {
        self.ssh_command(host).arg(command).output().expect("running ssh")
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
        record_lab_time(self.taken);
        let out = Command::new(repo_root().join("ci/lab")).arg("down").output();
        if let Ok(o) = out
            && !o.status.success()
        {
            eprintln!("ci/lab down failed: {}", String::from_utf8_lossy(&o.stderr));
        }
    }
}

/// A signed bundle of the lab cluster, built once per test process.
#[derive(Debug, Clone)]
pub struct LabBundle {
    pub bundle: PathBuf,
    pub public_key: PathBuf,
}

/// `kubexm-install status --state STATE`, asserting success; its output.
pub fn status(state: &Path) -> String {
    ok(
        Command::new(bin("kubexm-install"))
            .arg("status")
            .arg("--state")
            .arg(state)
            .output()
            .expect("running status"),
        "status",
    )
}

/// `kubexm-bundle build -f CONFIG` with the lab catalog, `--strict-mirrors`, a cache and an output.
pub fn build_command(lab: &Lab, config: &Path, cache: &Path, bundle: &Path) -> Command {
    let mut c = Command::new(bin("kubexm-bundle"));
    c.arg("build")
        .arg("-f")
        .arg(config)
        .arg("--catalog")
        .arg(&lab.desc.fixture.catalog)
        .arg("--strict-mirrors")
        .arg("--cache-dir")
        .arg(cache)
        .arg("--bundle")
        .arg(bundle);
    c
}

/// `kubexm-install unpack --bundle B --pubkey K --root R`.
pub fn unpack_command(bundle: &Path, pubkey: &Path, root: &Path) -> Command {
    let mut c = Command::new(bin("kubexm-install"));
    c.arg("unpack")
        .arg("--bundle")
        .arg(bundle)
        .arg("--pubkey")
        .arg(pubkey)
        .arg("--root")
        .arg(root);
    c
}

/// `kubexm-install --bundle -f CONFIG` (the bundle's lock carries the lab catalog), the root and
/// state under `dir`, served on the lab gateway, optionally some phases only.
pub fn install_command(lab: &Lab, config: &Path, bundle: &Path, pubkey: &Path, dir: &Path, phases: Option<&str>) -> Command {
    let mut c = Command::new(bin("kubexm-install"));
    c.arg("-f")
        .arg(config)
        .arg("--bundle")
        .arg(bundle)
        .arg("--pubkey")
        .arg(pubkey)
        .arg("--root")
        .arg(dir.join("root"))
        .arg("--state")
        .arg(dir.join("state.db"))
        .args(["--advertise", &lab.desc.gateway, "--serve-port"])
        .arg(free_port(&lab.desc.gateway).to_string());
    if let Some(p) = phases {
        c.args(["--phases", p]);
    }
    c
}

/// Removes `kubexm-e2e-bundle-<pid>-*` and `kubexm-e2e-bundle-cache-<pid>`
/// left in the temp directory by test processes that have ended.
fn remove_bundles_of_ended_processes() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("kubexm-e2e-bundle-") else {
            continue;
        };
        let pid = rest.strip_prefix("cache-").unwrap_or(rest);
        let pid = pid.split('-').next().unwrap_or("");
        if !pid.is_empty() && pid.chars().all(|c| c.is_ascii_digit()) && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Signed bundles built in this process, by the text of their config.
static BUNDLES: Mutex<Vec<(String, LabBundle)>> = Mutex::new(Vec::new());

/// The builder cache the tests' bundles share (one per test process).
pub fn bundle_cache() -> PathBuf {
    std::env::temp_dir().join(format!("kubexm-e2e-bundle-cache-{}", std::process::id()))
}

/// The lab cluster's bundle, built once per test process and lab shape (the
/// fixture is the same for every lab; the roles, hence the OS packages, are not).
pub fn lab_bundle(lab: &Lab) -> LabBundle {
    signed_bundle(lab, &lab.desc.cluster)
}

/// A signed bundle built from `config` with the lab catalog, reused while the config's text is the same.
pub fn signed_bundle(lab: &Lab, config: &Path) -> LabBundle {
    let text = std::fs::read_to_string(config).expect("reading the cluster config");
    let mut built = BUNDLES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, b)) = built.iter().find(|(t, _)| *t == text) {
        return b.clone();
    }
    let dir = std::env::temp_dir().join(format!("kubexm-e2e-bundle-{}-{}", std::process::id(), built.len()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating the bundle directory");
    let (key, public) = (dir.join("k.key"), dir.join("k.pub"));
    let kg = Command::new(bin("kubexm-bundle"))
        .args(["keygen", "--no-password", "--secret-key"])
        .arg(&key)
        .arg("--public-key")
        .arg(&public)
        .output()
        .expect("running kubexm-bundle keygen");
    assert!(kg.status.success(), "keygen: {}", String::from_utf8_lossy(&kg.stderr));
    let bundle = dir.join("lab.tar.zst");
    let out = build_command(lab, config, &bundle_cache(), &bundle)
        .arg("--key")
        .arg(&key)
        .output()
        .expect("running kubexm-bundle build");
    assert!(
        out.status.success(),
        "building the bundle of {}: {}",
        config.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let b = LabBundle {
        bundle,
        public_key: public,
    };
    built.push((text, b.clone()));
    b
}

/// A free TCP port on `ip`.
pub fn free_port(ip: &str) -> u16 {
    std::net::TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A child process killed (SIGKILL, even when stopped) when dropped, so a
/// failing test leaves nothing running: a process left behind keeps the
/// test harness's output pipe open, and `ci/test` waiting on it.
pub struct Reaped(pub Child);

impl std::ops::Deref for Reaped {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A background process stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Background {
    pub child: Child,
    /// Its first line of output, once it said it was ready.
    pub ready_line: String,
    stderr: std::sync::Arc<Mutex<Vec<u8>>>,
}

impl Background {
    /// Starts `cmd` and polls `probe` until it holds (up to 20 s).
    pub fn start_probe(mut cmd: Command, probe: impl Fn() -> bool) -> Background {
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting a background process");
        let stderr = drain(child.stderr.take().expect("piped stderr"));
        for _ in 0..200 {
            if probe() {
                return Background {
                    child,
                    ready_line: String::new(),
                    stderr,
                };
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("the process exited ({status}) before it was ready: {}", tail(&stderr));
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = child.kill();
        panic!("the process was not ready within 20 s: {}", tail(&stderr));
    }

    /// Starts `cmd` and waits for a stdout line containing `ready` (up to 20 s).
    pub fn start(mut cmd: Command, ready: &str) -> Background {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting a background process");
        let stderr = drain(child.stderr.take().expect("piped stderr"));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        let want = ready.to_string();
        // Keep reading stdout for the process's whole life: a full pipe would block it.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.contains(&want) {
                    let _ = tx.send(line);
                }
            }
        });
        match rx.recv_timeout(std::time::Duration::from_secs(20)) {
            Ok(line) => Background {
                child,
                ready_line: line,
                stderr,
            },
            Err(_) => {
                let _ = child.kill();
                panic!("the process never said {ready:?}: {}", tail(&stderr));
            }
        }
    }

    /// The last part of what the process wrote to stderr.
    pub fn stderr_tail(&self) -> String {
        tail(&self.stderr)
    }
}

/// Reads a pipe to its end in a thread, keeping the last 64 KiB: an unread
/// pipe fills up and blocks the process writing to it.
fn drain(mut pipe: impl std::io::Read + Send + 'static) -> std::sync::Arc<Mutex<Vec<u8>>> {
    let buf = std::sync::Arc::new(Mutex::new(Vec::new()));
    let out = buf.clone();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        while let Ok(n) = pipe.read(&mut chunk) {
            if n == 0 {
                break;
            }
            let mut b = out.lock().unwrap_or_else(|e| e.into_inner());
            b.extend_from_slice(&chunk[..n]);
            let excess = b.len().saturating_sub(64 * 1024);
            b.drain(..excess);
        }
    });
    buf
}

fn tail(buf: &Mutex<Vec<u8>>) -> String {
    String::from_utf8_lossy(&buf.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg(self.child.id().to_string()).status();
        for _ in 0..50 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Lab {
    /// Copies a local file to a host (over the SSH connection, no scp needed).
    pub fn copy_to(&self, host: &str, local: &Path, remote: &str) {
        let f = File::open(local).unwrap_or_else(|e| panic!("{}: {e}", local.display()));
        let out = self
            .ssh_command(host)
            .arg(format!("mkdir -p \"$(dirname '{remote}')\" && cat > '{remote}'"))
            .stdin(f)
            .output()
            .expect("running ssh");
        assert!(
            out.status.success(),
            "copying {} to {host}:{remote}: {}",
            local.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Bytes as text, lossily.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Asserts a command succeeded; returns its stdout.
pub fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The package's folder, read when the test runs: a test binary reused from a
/// checkout elsewhere (a shared CARGO_TARGET_DIR) must not point there.
fn manifest_dir() -> String {
    std::env::var("CARGO_MANIFEST_DIR").expect("cargo test sets CARGO_MANIFEST_DIR")
}
