//! Clusters as jobs on the lab: `kubexm create cluster` stores a validated
//! job, `kubexm worker` runs it with the same install as kubexm-install (a
//! real one-node cluster), and `kubexm get job --follow` streams its log,
//! resumable by sequence number.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kubexm_e2e::{Lab, Reaped, bin, free_port, ok, signed_bundle, text};

/// `kubexm --db DIR/jobs.db ARGS`.
fn kubexm(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(bin("kubexm"));
    c.arg("--db").arg(dir.join("jobs.db")).args(args);
    c
}

fn job_json(dir: &Path, id: i64) -> serde_json::Value {
    serde_json::from_str(&ok(
        kubexm(dir, &["get", "job", &id.to_string(), "-o", "json"]).output().unwrap(),
        "get job -o json",
    ))
    .unwrap()
}

fn wait_status(dir: &Path, id: i64, want: &str, secs: u64) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let j = job_json(dir, id);
        if j["job"]["status"] == want {
            return j;
        }
        assert!(start.elapsed() < Duration::from_secs(secs), "job {id} not {want}: {j}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `config` as a request writes it: the lab's hosts log in with the
/// server-side credential `lab` (a request names no file on the worker).
fn as_request(lab: &Lab, config: &Path, out: &Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string(config).unwrap();
    let by_key = format!(
        "  hostDefaults:\n    auth:\n      privateKey: {{path: {}}}\n",
        lab.desc.ssh.key.display()
    );
    assert!(text.contains(&by_key), "the lab's config logs in by key:\n{text}");
    std::fs::write(out, text.replacen(&by_key, "  hostDefaults:\n    auth: {credential: lab}\n", 1)).unwrap();
    out.to_path_buf()
}

/// Lets a request's jobs reach the lab, as an operator would: the lab's
/// key as credential `lab` and its password as `lab-pw`, both offered to the
/// lab's network only, and every host's key pinned after a scan.
fn trust_lab(lab: &Lab, d: &Path, kubexm: impl Fn(&[&str]) -> Command) {
    let net = format!("{}.0/24", lab.desc.gateway.rsplit_once('.').unwrap().0);
    std::fs::write(d.join("lab-password"), &lab.desc.ssh.password).unwrap();
    let key = lab.desc.ssh.key.display().to_string();
    let pw = d.join("lab-password").display().to_string();
    for (name, secret) in [("lab", ["--ssh-key", &key]), ("lab-pw", ["--password-from-file", &pw])] {
        let mut args = vec!["credential", "create", name, "--hosts", &net];
        args.extend(secret);
        ok(kubexm(&args).output().unwrap(), "credential create");
    }
    let listed = ok(kubexm(&["credential", "list", "-o", "json"]).output().unwrap(), "credential list");
    assert!(
        listed.contains("\"lab-pw\"") && !listed.contains(&lab.desc.ssh.password),
        "{listed}"
    );
    for h in &lab.desc.hosts {
        let shown = ok(
            kubexm(&["host-key", "scan", &h.address, "--yes"]).output().unwrap(),
            "host-key scan",
        );
        assert!(shown.starts_with(&format!("{}:22 ssh-", h.address)), "{shown}");
    }
}

#[test]
fn create_cluster_runs_as_a_job_that_a_worker_claims_and_a_client_follows() {
    let Some(lab) = Lab::up(1, 0) else { return };
    // The worker runs kubexm-install's install and puts that binary on the registry host.
    bin("kubexm-install");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = lab.desc.main_job.clone();
    let b = signed_bundle(&lab, &config);
    let (root, state) = (d.join("root"), d.join("state.db"));
    let create = |extra: &[&str], config: &Path| {
        let port = free_port(&lab.desc.gateway).to_string();
        let mut c = kubexm(d, &["create", "cluster"]);
        c.arg("-f")
            .arg(config)
            .arg("--bundle")
            .arg(&b.bundle)
            .arg("--pubkey")
            .arg(&b.public_key)
            .args(["--advertise", &lab.desc.gateway, "--serve-port", &port])
            .arg("--root")
            .arg(&root)
            .arg("--state")
            .arg(&state)
            .args(extra);
        c
    };

    // A bad config: the validation errors with line:column, exit 3, nothing stored.
    let bad = d.join("bad.yaml");
    std::fs::write(
        &bad,
        std::fs::read_to_string(&config)
            .unwrap()
            .replace("podCIDR: 198.19.0.0/16", "podCIDR: 198.19.0.0/33"),
    )
    .unwrap();
    let refused = create(&[], &bad).output().unwrap();
    assert_eq!(refused.status.code(), Some(3), "{}", text(&refused.stderr));
    assert!(text(&refused.stderr).contains("bad.yaml:"), "{}", text(&refused.stderr));
    // --detach without a worker is refused.
    let detached = create(&["--detach"], &config).output().unwrap();
    assert_eq!(detached.status.code(), Some(2), "{}", text(&detached.stderr));
    assert!(
        text(&detached.stderr).contains("no worker is running"),
        "{}",
        text(&detached.stderr)
    );
    let listed = ok(kubexm(d, &["get", "jobs", "-o", "json"]).output().unwrap(), "get jobs");
    assert_eq!(listed.trim(), "[]", "a refused request stored a job");

    // A worker, frozen (SIGSTOP) right after it announced itself: the job stays Pending.
    let mut worker = Reaped(
        kubexm(d, &["worker", "--lease-seconds", "15"])
            .arg("--state")
            .arg(&state)
            .stderr(Stdio::from(std::fs::File::create(d.join("worker.log")).unwrap()))
            .spawn()
            .unwrap(),
    );
    let wpid = worker.id().to_string();
    std::thread::sleep(Duration::from_secs(2));
    ok(Command::new("kill").args(["-STOP", &wpid]).output().unwrap(), "SIGSTOP");
    let created = ok(create(&["--detach"], &config).output().unwrap(), "create cluster --detach");
    assert_eq!(created.trim(), "Job created with ID 1. Run 'kubexm get job 1' to check status.");
    assert_eq!(job_json(d, 1)["job"]["status"], "Pending");

    // A follower from the start, killed after 30 lines, reconnects from
    // the last sequence number it got (its line count: the numbers are 1, 2, ...).
    let follower = {
        let d = d.to_path_buf();
        std::thread::spawn(move || {
            use std::io::BufRead;
            let mut first = kubexm(&d, &["get", "job", "1", "--follow"]).stdout(Stdio::piped()).spawn().unwrap();
            let mut got: Vec<String> = Vec::new();
            for line in std::io::BufReader::new(first.stdout.take().unwrap()).lines() {
                got.push(line.unwrap());
                if got.len() == 30 {
                    break;
                }
            }
            first.kill().unwrap();
            let _ = first.wait();
            let rest = kubexm(&d, &["get", "job", "1", "--follow", "--from", &got.len().to_string()])
                .output()
                .unwrap();
            assert!(rest.status.success(), "{}", text(&rest.stderr));
            got.extend(text(&rest.stdout).lines().map(str::to_string));
            got
        })
    };
    ok(Command::new("kill").args(["-CONT", &wpid]).output().unwrap(), "SIGCONT");
    // Status and current step as the job runs.
    let mut steps = std::collections::BTreeSet::new();
    let mut statuses = vec!["Pending".to_string()];
    let start = Instant::now();
    let end = loop {
        let j = job_json(d, 1);
        let s = j["job"]["status"].as_str().unwrap().to_string();
        if statuses.last() != Some(&s) {
            statuses.push(s.clone());
        }
        if let Some(step) = j["job"]["current_step"].as_str() {
            steps.insert(step.to_string());
        }
        if s == "Success" || s == "Failed" {
            break j;
        }
        assert!(start.elapsed() < Duration::from_secs(900), "job 1 still {s}");
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(statuses, ["Pending", "Processing", "Success"], "{end}");
    assert!(steps.len() > 10, "the current step hardly changed: {steps:?}");
    let followed = follower.join().unwrap();
    // Every line exactly once, in order, as the database has them.
    let db_lines: Vec<String> = end["logs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["line"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(followed, db_lines);
    let seqs: Vec<i64> = end["logs"].as_array().unwrap().iter().map(|l| l["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as i64).collect::<Vec<_>>());
    assert!(db_lines.iter().any(|l| l.contains("installed phases")), "{db_lines:?}");
    // A reconnect from a sequence number gets exactly the rest.
    let half = seqs.len() / 2;
    let rest = ok(
        kubexm(d, &["get", "job", "1", "--follow", "--from", &half.to_string()])
            .output()
            .unwrap(),
        "follow --from",
    );
    assert_eq!(rest.lines().collect::<Vec<_>>(), db_lines[half..]);

    // The cluster is up: the node Ready through the handed-over kubeconfig.
    let node = lab.ssh_ok("lab1", "kubectl --kubeconfig /etc/kubernetes/admin.conf get node lab1 --no-headers");
    assert!(node.contains(" Ready "), "{node}");

    // A second create, with the worker running: followed here, 0 steps applied.
    let again = ok(create(&[], &config).output().unwrap(), "create cluster again");
    assert!(again.starts_with("Job created with ID 2."), "{again}");
    assert!(again.contains(": 0 steps applied"), "{again}");

    // Cancel: a job cancelled ends Cancelled; the next one completes.
    ok(create(&["--detach"], &config).output().unwrap(), "create 3");
    ok(kubexm(d, &["cancel", "job", "3"]).output().unwrap(), "cancel job 3");
    wait_status(d, 3, "Cancelled", 300);
    ok(create(&[], &config).output().unwrap(), "create 4 after a cancel");
    assert_eq!(job_json(d, 4)["job"]["status"], "Success");

    ok(Command::new("kill").args(["-INT", &wpid]).output().unwrap(), "SIGINT");
    let status = worker.wait().unwrap();
    assert!(status.success(), "{}", std::fs::read_to_string(d.join("worker.log")).unwrap());

    // The same cluster through the API server (its embedded worker, the
    // bundle held by digest, the install options from its flags), asked by
    // the `kubexm` command through a client config: a re-run, 0 steps applied.
    let held = ok(
        kubexm(d, &["bundle", "add"])
            .arg(&b.bundle)
            .arg("--pubkey")
            .arg(&b.public_key)
            .arg("--bundles")
            .arg(d.join("bundles"))
            .output()
            .unwrap(),
        "bundle add",
    );
    let digest = held.trim().to_string();
    assert!(digest.starts_with("sha256:") && digest.len() == 71, "{digest}");
    // The cluster was created here by the operator: a request may re-run
    // it only with the admin scope (any other principal gets 409).
    let token = ok(
        kubexm(d, &["token", "create", "--name", "lab", "--scopes", "admin"])
            .output()
            .unwrap(),
        "token create",
    );
    std::fs::write(d.join("token"), token.trim()).unwrap();
    let api_port = free_port("127.0.0.1");
    let serve_port = free_port(&lab.desc.gateway).to_string();
    let mut server = Reaped(
        kubexm(d, &["api-server", "--listen", &format!("127.0.0.1:{api_port}")])
            .args(["--advertise", &lab.desc.gateway, "--serve-port", &serve_port])
            .arg("--tls-dir")
            .arg(d.join("tls"))
            .arg("--bundles")
            .arg(d.join("bundles"))
            .arg("--pubkey")
            .arg(&b.public_key)
            .arg("--root")
            .arg(&root)
            .arg("--state")
            .arg(&state)
            .stderr(Stdio::from(std::fs::File::create(d.join("api-server.log")).unwrap()))
            .spawn()
            .unwrap(),
    );
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", api_port)).is_err() {
        assert!(start.elapsed() < Duration::from_secs(30), "the API server did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::write(
        d.join("client.yaml"),
        format!("server: https://127.0.0.1:{api_port}\nca: tls/ca.crt\ntokenFile: token\n"),
    )
    .unwrap();
    // A request names its hosts' credential; the operator made it and
    // pinned the hosts' keys (`kubexm credential create`, `host-key scan`).
    trust_lab(&lab, d, |a| kubexm(d, a));
    let request = as_request(&lab, &config, &d.join("request.yaml"));
    let refused = Command::new(bin("kubexm"))
        .arg("--config")
        .arg(d.join("client.yaml"))
        .args(["create", "cluster", "-f"])
        .arg(&config)
        .args(["--bundle", &digest])
        .output()
        .unwrap();
    assert!(
        !refused.status.success() && text(&refused.stderr).contains("spec.hostDefaults.auth.privateKey"),
        "a request naming a key file on the worker: {}",
        text(&refused.stderr)
    );
    let remote = Command::new(bin("kubexm"))
        .arg("--config")
        .arg(d.join("client.yaml"))
        .args(["create", "cluster", "-f"])
        .arg(&request)
        .args(["--bundle", &digest])
        .output()
        .unwrap();
    let remote_out = ok(remote, "create cluster through the API");
    assert!(remote_out.starts_with("Job created with ID 5."), "{remote_out}");
    assert!(remote_out.contains(": 0 steps applied"), "{remote_out}");
    assert_eq!(job_json(d, 5)["job"]["status"], "Success");
    // Issue 29: an etcd snapshot as a job through the API server, run by its
    // worker; the snapshot and its sidecars under the server's --root.
    let snap = Command::new(bin("kubexm"))
        .arg("--config")
        .arg(d.join("client.yaml"))
        .args(["create", "etcd-snapshot", "--keep", "1", "-f"])
        .arg(&request)
        .output()
        .unwrap();
    let snap = ok(snap, "create etcd-snapshot through the API");
    assert!(snap.contains("etcd snapshot of cluster lab"), "{snap}");
    assert_eq!(job_json(d, 6)["job"]["status"], "Success");
    let snapshots: Vec<String> = std::fs::read_dir(root.join("clusters/lab/snapshots"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(snapshots.iter().filter(|f| f.ends_with(".db")).count(), 1, "{snapshots:?}");
    assert!(snapshots.iter().any(|f| f.ends_with(".db.json")), "{snapshots:?}");
    ok(
        Command::new("kill").args(["-INT", &server.id().to_string()]).output().unwrap(),
        "SIGINT api-server",
    );
    let status = server.wait().unwrap();
    assert!(status.success(), "{}", std::fs::read_to_string(d.join("api-server.log")).unwrap());

    // No credential in the job database: the config names the SSH key's
    // file; the key itself (a line of its body) is in no table or log.
    // Neither is the API token (only its sha256).
    let db = std::fs::read(d.join("jobs.db")).unwrap();
    let key = std::fs::read_to_string(&lab.desc.ssh.key).unwrap();
    let body = key.lines().nth(2).unwrap();
    assert!(body.len() > 40);
    for (secret, what) in [(body, "the SSH key"), (token.trim(), "the API token")] {
        assert!(!db.windows(secret.len()).any(|w| w == secret.as_bytes()), "{what} is in jobs.db");
        for log in ["worker.log", "api-server.log"] {
            let text = std::fs::read_to_string(d.join(log)).unwrap();
            assert!(!text.contains(secret), "{what} is in {log}");
        }
    }

    // Leave the host clean for the next test.
    let reset = Command::new(bin("kubexm-install"))
        .arg("reset")
        .arg("-f")
        .arg(&config)
        .arg("--root")
        .arg(&root)
        .arg("--state")
        .arg(&state)
        .arg("--yes")
        .output()
        .unwrap();
    ok(reset, "reset");
}

/// `kubexm --db URL ARGS` (PostgreSQL).
fn kubexm_pg(url: &str, args: &[&str]) -> Command {
    let mut c = Command::new(bin("kubexm"));
    c.args(["--db", url]).args(args);
    c
}

#[test]
fn three_workers_on_postgresql_run_thirty_facts_jobs_over_ten_clusters() {
    let Some(lab) = Lab::up(2, 0) else { return };
    let pg = kubexm_server::testing::Postgres::start().unwrap();
    let Some(pg) = pg else {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "PostgreSQL is not installed");
        eprintln!("skipped: PostgreSQL is not installed (ci/test installs Debian's postgresql)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // lab1 by key, lab2 by password: server-side credentials (a shared
    // database's jobs name no file or variable on the worker).
    let keyfile = d.join("credential.key").display().to_string();
    trust_lab(&lab, d, |a| {
        let mut c = Command::new(bin("kubexm"));
        c.args(["--db", &pg.url, "--credential-key", &keyfile]).args(a);
        c
    });
    let base = crate::engine::config(&lab, d, |i| match i {
        1 => ("root".into(), "{credential: lab-pw}".into()),
        _ => ("root".into(), "{credential: lab}".into()),
    });
    let text = std::fs::read_to_string(base).unwrap();
    // Ten clusters naming the same lab hosts.
    let configs: Vec<std::path::PathBuf> = (0..10)
        .map(|i| {
            let p = d.join(format!("c{i}.yaml"));
            std::fs::write(
                &p,
                text.replacen("metadata: {name: lab}", &format!("metadata: {{name: facts{i}}}"), 1),
            )
            .unwrap();
            p
        })
        .collect();
    let mut workers = Vec::new();
    for w in 0..3 {
        let log = std::fs::File::create(d.join(format!("worker{w}.log"))).unwrap();
        workers.push(Reaped(
            kubexm_pg(&pg.url, &["worker", "--lease-seconds", "15", "--credential-key", &keyfile])
                .arg("--state")
                .arg(d.join("state.db"))
                .stderr(Stdio::from(log))
                .spawn()
                .unwrap(),
        ));
    }
    // The workers announce themselves (`--detach` needs one).
    let start = Instant::now();
    loop {
        let n = ok(
            Command::new("psql")
                .arg(&pg.url)
                .args(["-tAc", "SELECT count(*) FROM workers"])
                .output()
                .unwrap(),
            "psql",
        );
        if n.trim() == "3" {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{n} of 3 workers registered");
        std::thread::sleep(Duration::from_millis(100));
    }
    let start = Instant::now();
    for i in 0..30 {
        let out = kubexm_pg(&pg.url, &["create", "facts", "--detach", "-f"])
            .arg(&configs[i % 10])
            .output()
            .unwrap();
        ok(out, "create facts --detach");
    }
    let jobs = loop {
        let all: serde_json::Value = serde_json::from_str(&ok(
            kubexm_pg(&pg.url, &["get", "jobs", "-o", "json"]).output().unwrap(),
            "get jobs",
        ))
        .unwrap();
        let all = all.as_array().unwrap().clone();
        if all.len() == 30 && all.iter().all(|j| j["status"] == "Success" || j["status"] == "Failed") {
            break all;
        }
        assert!(start.elapsed() < Duration::from_secs(600), "not done: {all:?}");
        std::thread::sleep(Duration::from_millis(500));
    };
    let took = start.elapsed();
    for j in &jobs {
        assert_eq!(j["status"], "Success", "{j}");
        assert_eq!(j["attempt"], 1, "claimed more than once with no worker dying: {j}");
    }
    // The work was shared: every worker ran some.
    let by: std::collections::BTreeSet<String> = jobs.iter().map(|j| j["worker"].as_str().unwrap().to_string()).collect();
    assert_eq!(by.len(), 3, "{by:?}");
    // Every job's log names the hosts' facts.
    let one = ok(kubexm_pg(&pg.url, &["get", "job", "1"]).output().unwrap(), "get job 1");
    assert!(one.contains("facts of 2 host(s) gathered"), "{one}");
    for w in &mut workers {
        ok(Command::new("kill").args(["-INT", &w.id().to_string()]).output().unwrap(), "SIGINT");
    }
    for (i, w) in workers.iter_mut().enumerate() {
        let status = w.wait().unwrap();
        assert!(
            status.success(),
            "{}",
            std::fs::read_to_string(d.join(format!("worker{i}.log"))).unwrap()
        );
    }
    // The SSH password and key (and the key that seals them) are in no
    // table and no worker's log: the credentials table holds them sealed.
    let mut stored = String::new();
    for table in ["jobs", "job_logs", "clusters", "workers", "tokens", "credentials", "host_keys"] {
        stored.push_str(&ok(
            Command::new("psql")
                .arg(&pg.url)
                .args(["-tAc", &format!("SELECT * FROM {table}")])
                .output()
                .unwrap(),
            "psql",
        ));
    }
    assert!(stored.contains("facts of 2 host(s) gathered"), "{stored}");
    // The lab's password ("kubexm-lab") is also part of the key's path, which
    // the configs name: that path is taken out before looking.
    let stored = stored.replace(&lab.desc.ssh.key.display().to_string(), "<key path>");
    let key_body = std::fs::read_to_string(&lab.desc.ssh.key)
        .unwrap()
        .lines()
        .nth(2)
        .unwrap()
        .to_string();
    let seal = std::fs::read_to_string(&keyfile).unwrap().trim().to_string();
    assert!(stored.contains("lab-pw|password|"), "{stored}");
    for (secret, what) in [
        (lab.desc.ssh.password.as_str(), "the SSH password"),
        (key_body.as_str(), "the SSH key"),
        (seal.as_str(), "the credential key"),
    ] {
        assert!(!stored.contains(secret), "{what} is in the job database");
        for w in 0..3 {
            let log = std::fs::read_to_string(d.join(format!("worker{w}.log")))
                .unwrap()
                .replace(&lab.desc.ssh.key.display().to_string(), "<key path>");
            assert!(!log.contains(secret), "{what} is in worker{w}.log");
        }
    }
    eprintln!("30 facts jobs over 10 clusters by 3 workers on PostgreSQL in {took:?}");
}

/// The job's log lines, as the database has them.
fn pg_job(url: &str, id: i64) -> serde_json::Value {
    serde_json::from_str(&ok(
        kubexm_pg(url, &["get", "job", &id.to_string(), "-o", "json"]).output().unwrap(),
        "get job -o json",
    ))
    .unwrap()
}

fn log_lines(j: &serde_json::Value) -> Vec<String> {
    j["logs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["line"].as_str().unwrap().to_string())
        .collect()
}

/// Waits for a job to end; returns it.
fn pg_wait_end(url: &str, id: i64, secs: u64) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let j = pg_job(url, id);
        if ["Success", "Failed", "Cancelled"].contains(&j["job"]["status"].as_str().unwrap()) {
            return j;
        }
        assert!(start.elapsed() < Duration::from_secs(secs), "job {id} did not end: {}", j["job"]);
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn on_postgresql_a_killed_worker_s_install_is_finished_by_another_and_a_stopped_worker_is_fenced() {
    let Some(lab) = Lab::up(1, 0) else { return };
    bin("kubexm-install");
    let Some(pg) = kubexm_server::testing::Postgres::start().unwrap() else {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "PostgreSQL is not installed");
        eprintln!("skipped: PostgreSQL is not installed (ci/test installs Debian's postgresql)");
        return;
    };
    let url = pg.url.clone();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let b = signed_bundle(&lab, &lab.desc.main_job);
    // Every job of a shared database follows a request's rules.
    let keyfile = d.join("credential.key").display().to_string();
    // Global flags first: a command's arguments may end with a flag that
    // takes the next one (`-f FILE`).
    let kubexm_pg = |url: &str, args: &[&str]| {
        let mut c = Command::new(bin("kubexm"));
        c.args(["--db", url, "--credential-key", &keyfile]).args(args);
        c
    };
    trust_lab(&lab, d, |a| kubexm_pg(&url, a));
    let config = as_request(&lab, &lab.desc.main_job, &d.join("request.yaml"));
    let (root, state) = (d.join("root"), d.join("state.db"));
    // Workers on one machine, sharing its state database and root (the affinity the README describes).
    let worker = |name: &str| {
        Reaped(
            kubexm_pg(&url, &["worker", "--lease-seconds", "10"])
                .arg("--state")
                .arg(&state)
                .stderr(Stdio::from(std::fs::File::create(d.join(format!("{name}.log"))).unwrap()))
                .spawn()
                .unwrap(),
        )
    };
    let read_log = |name: &str| std::fs::read_to_string(d.join(format!("{name}.log"))).unwrap();

    // kill -9 of a worker mid-install.
    let mut a = worker("a");
    std::thread::sleep(Duration::from_secs(2));
    let port = free_port(&lab.desc.gateway).to_string();
    let created = ok(
        kubexm_pg(&url, &["create", "cluster", "--detach", "-f"])
            .arg(&config)
            .arg("--bundle")
            .arg(&b.bundle)
            .arg("--pubkey")
            .arg(&b.public_key)
            .args(["--advertise", &lab.desc.gateway, "--serve-port", &port])
            .arg("--root")
            .arg(&root)
            .arg("--state")
            .arg(&state)
            .output()
            .unwrap(),
        "create cluster --detach",
    );
    assert!(created.starts_with("Job created with ID 1."), "{created}");
    let start = Instant::now();
    let applied: Vec<String> = loop {
        let lines = log_lines(&pg_job(&url, 1));
        let applied: Vec<String> = lines
            .iter()
            .filter_map(|l| l.strip_suffix(" applied"))
            .map(str::to_string)
            .collect();
        if applied.len() >= 5 {
            break applied;
        }
        assert!(start.elapsed() < Duration::from_secs(300), "no 5 steps applied: {lines:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    ok(
        Command::new("kill").args(["-KILL", &a.id().to_string()]).output().unwrap(),
        "kill -9",
    );
    let _ = a.wait();
    let killed_at = Instant::now();
    let mut b_worker = worker("b");
    let end = pg_wait_end(&url, 1, 900);
    assert!(
        killed_at.elapsed() >= Duration::from_secs(5),
        "claimed again before the lease ended"
    );
    let job = &end["job"];
    assert_eq!(job["status"], "Success", "{}\n{}", job, read_log("b"));
    assert_eq!(job["attempt"], 2, "{job}");
    assert!(job["worker"].as_str().unwrap().ends_with(&format!(":{}", b_worker.id())), "{job}");
    let lines = log_lines(&end);
    let second = lines
        .iter()
        .position(|l| l.contains("(attempt 2)"))
        .unwrap_or_else(|| panic!("{lines:?}"));
    // Facts are gathered anew on every run; every other step done before
    // the kill is skipped.
    for step in applied.iter().filter(|s| !s.contains(": facts/")) {
        assert!(
            lines[second..].contains(&format!("{step} skipped")),
            "{step}, applied by the killed worker, is not skipped by the next: {:?}",
            &lines[second..]
        );
    }
    let node = lab.ssh_ok("lab1", "kubectl --kubeconfig /etc/kubernetes/admin.conf get node lab1 --no-headers");
    assert!(node.contains(" Ready "), "{node}");

    // SIGSTOP of a worker mid-reset, past its lease; another finishes the
    // job; the stopped one, continued, has its writes refused.
    let created = ok(
        kubexm_pg(&url, &["reset", "cluster", "--yes", "--detach", "-f"])
            .arg(&config)
            .arg("--root")
            .arg(&root)
            .arg("--state")
            .arg(&state)
            .output()
            .unwrap(),
        "reset cluster --detach",
    );
    assert!(created.starts_with("Job created with ID 2."), "{created}");
    let start = Instant::now();
    loop {
        let j = pg_job(&url, 2);
        if log_lines(&j).iter().any(|l| l.ends_with(" started")) {
            break;
        }
        assert_ne!(j["job"]["status"], "Success", "the reset ended before it could be stopped");
        assert!(start.elapsed() < Duration::from_secs(120), "the reset did not start: {j}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let bpid = b_worker.id().to_string();
    ok(Command::new("kill").args(["-STOP", &bpid]).output().unwrap(), "SIGSTOP");
    std::thread::sleep(Duration::from_secs(12));
    let mut c = worker("c");
    let end = pg_wait_end(&url, 2, 600);
    assert_eq!(end["job"]["status"], "Success", "{}\n{}", end["job"], read_log("c"));
    assert_eq!(end["job"]["attempt"], 2, "{}", end["job"]);
    ok(Command::new("kill").args(["-CONT", &bpid]).output().unwrap(), "SIGCONT");
    let fenced_at = Instant::now();
    while !read_log("b").contains("another worker holds it now") {
        assert!(
            fenced_at.elapsed() < Duration::from_secs(120),
            "the continued worker did not find itself fenced: {}",
            read_log("b")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let after = pg_job(&url, 2);
    assert_eq!(log_lines(&after), log_lines(&end), "the fenced worker wrote to the job");
    assert_eq!(after["job"]["status"], "Success");
    for (name, w) in [("b", &mut b_worker), ("c", &mut c)] {
        ok(Command::new("kill").args(["-INT", &w.id().to_string()]).output().unwrap(), "SIGINT");
        let status = w.wait().unwrap();
        assert!(status.success(), "worker {name}: {}", read_log(name));
    }
}
