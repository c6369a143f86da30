//! Issue 24, item 1: a request names no file, variable, key path or agent
//! on the worker; its hosts log in with sealed, server-side credentials
//! offered only inside their allow-list, and only to hosts whose key an
//! operator pinned. A test double (a TCP listener recording every byte it
//! is sent, standing in for an attacker's SSH server) must receive no
//! connection from a job naming an unpinned or disallowed host, and no
//! byte of any secret at all.

use std::io::Read;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use kubexm_server::credentials::{self, NewSecret, SealKey};
use kubexm_server::jobdb::{JobDb, NewJob, Origin, Status};
use kubexm_server::worker::{self, WorkerOptions};

mod common;
use common::{EXAMPLE, held_bundle};

/// A listener that accepts, records what it is sent, and hangs up.
struct Trap {
    port: u16,
    connections: Arc<AtomicUsize>,
    received: Arc<Mutex<Vec<u8>>>,
}

impl Trap {
    fn start() -> Trap {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let (connections, received) = (Arc::new(AtomicUsize::new(0)), Arc::new(Mutex::new(Vec::new())));
        let (c, r) = (connections.clone(), received.clone());
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                c.fetch_add(1, Ordering::SeqCst);
                // An SSH server speaks first; say something that is not SSH.
                let _ = std::io::Write::write_all(&mut s, b"SSH-2.0-trap\r\n");
                s.set_read_timeout(Some(std::time::Duration::from_millis(500))).unwrap();
                let mut buf = [0u8; 65536];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    r.lock().unwrap().extend_from_slice(&buf[..n]);
                }
            }
        });
        Trap {
            port,
            connections,
            received,
        }
    }
}

fn config(port: u16, auth: &str) -> String {
    format!(
        "apiVersion: kubexm.io/v1alpha1
kind: Cluster
metadata: {{name: victim}}
spec:
  hosts:
    - {{name: n1, address: 127.0.0.1, port: {port}, auth: {auth}}}
  roleGroups: {{etcd: [n1], control-plane: [n1], worker: [n1], loadbalancer: [n1]}}
  controlPlaneEndpoint: {{mode: haproxy-keepalived, address: 10.9.9.9}}
"
    )
}

/// Runs one facts job with `config` (stored as `origin`) on a worker; its end.
async fn run(db: &Arc<JobDb>, dir: &std::path::Path, config: String, origin: Origin) -> kubexm_server::jobdb::Job {
    let id = db
        .create(&NewJob {
            cluster: "victim".into(),
            kind: "facts".into(),
            config,
            config_name: "cluster.yaml".into(),
            options: serde_json::json!({}),
            origin,
            principal: None,
        })
        .await
        .unwrap();
    let mut o = WorkerOptions::here(dir.join("state.db"), dir.join("jobs"));
    o.credential_key = dir.join("credential.key");
    worker::serve(db, &o, Arc::new(AtomicBool::new(false)), true).await.unwrap();
    db.get(id).await.unwrap().unwrap()
}

/// Every row of every table of a SQLite database, as text.
fn every_table(db: &std::path::Path) -> String {
    let c = rusqlite::Connection::open(db).unwrap();
    let tables: Vec<String> = c
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut out = String::new();
    for t in tables {
        let mut st = c.prepare(&format!("SELECT * FROM {t}")).unwrap();
        let n = st.column_count();
        let mut rows = st.query([]).unwrap();
        while let Some(r) = rows.next().unwrap() {
            out.push_str(&t);
            for i in 0..n {
                let v: rusqlite::types::Value = r.get(i).unwrap();
                out.push_str(&format!(" {v:?}"));
            }
            out.push('\n');
        }
    }
    out
}

#[tokio::test]
async fn a_request_reads_nothing_on_the_worker_and_reaches_no_unpinned_or_disallowed_host() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let db = Arc::new(JobDb::open(&d.join("jobs.db")).await.unwrap());
    let trap = Trap::start();
    // Secrets of the worker's machine a hostile config names.
    let secret = "s3cret-of-the-worker";
    std::fs::write(d.join("ca.key"), secret).unwrap();
    let path_var = std::env::var("PATH").unwrap();
    for auth in [
        format!("{{password: {{fromFile: {}}}}}", d.join("ca.key").display()),
        "{password: {fromEnv: PATH}}".to_string(),
        format!("{{privateKey: {{path: {}}}}}", d.join("ca.key").display()),
        "{agent: true}".to_string(),
    ] {
        // A row that skipped the API's validation (a shared database).
        let j = run(&db, d, config(trap.port, &auth), Origin::Request).await;
        assert_eq!(j.status, Status::Failed, "{auth}");
        assert!(j.error.as_deref().unwrap().contains("a request may not"), "{auth}: {j:?}");
    }
    assert_eq!(trap.connections.load(Ordering::SeqCst), 0, "a request's host was connected to");

    // A credential: sealed in the database, opened only by the worker's key.
    let password = d.join("pw");
    std::fs::write(&password, "the-ssh-password\n").unwrap();
    let key = SealKey::load_or_create(&d.join("credential.key")).unwrap();
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(d.join("credential.key")).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    credentials::create(
        &db,
        &key,
        "ops",
        NewSecret::Password { file: password.clone() },
        &["127.0.0.1/32".into()],
    )
    .await
    .unwrap();
    credentials::create(&db, &key, "far", NewSecret::Password { file: password }, &["10.0.0.0/8".into()])
        .await
        .unwrap();
    // Outside its allow-list: refused before any connection.
    let j = run(&db, d, config(trap.port, "{credential: far}"), Origin::Request).await;
    assert!(j.error.as_deref().unwrap().contains("may not be offered to 127.0.0.1"), "{j:?}");
    // No pinned host key: never connected to.
    let j = run(&db, d, config(trap.port, "{credential: ops}"), Origin::Request).await;
    assert!(j.error.as_deref().unwrap().contains("no host key is pinned"), "{j:?}");
    assert_eq!(trap.connections.load(Ordering::SeqCst), 0, "an unpinned host was connected to");
    // Pinned: connected to, and the key exchange fails (the key differs): no secret sent.
    db.pin_host_key(
        &format!("127.0.0.1:{}", trap.port),
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl",
    )
    .await
    .unwrap();
    let j = run(&db, d, config(trap.port, "{credential: ops}"), Origin::Request).await;
    assert_eq!(j.status, Status::Failed);
    assert!(trap.connections.load(Ordering::SeqCst) > 0);
    let got = String::from_utf8_lossy(&trap.received.lock().unwrap()).to_string();
    for s in [secret, "the-ssh-password", path_var.as_str()] {
        assert!(!got.contains(s), "the trap received {s}");
    }
    // No table holds a secret: the credential is sealed.
    let text = every_table(&d.join("jobs.db"));
    assert!(text.contains("credentials") && text.contains("ops"), "{text}");
    for s in [secret, "the-ssh-password", path_var.as_str()] {
        assert!(!text.contains(s), "{s} is in jobs.db");
    }
    for c in db.credentials().await.unwrap() {
        let json = serde_json::to_string(&c).unwrap();
        assert!(!json.contains("sealed") && !json.contains("the-ssh-password"), "{json}");
        assert!(!c.sealed.contains("the-ssh-password"));
    }
}

/// An operator's own job on a database of this machine keeps reading the
/// files its config names (the operator typed it).
#[tokio::test]
async fn an_operators_job_on_a_local_database_reads_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let db = Arc::new(JobDb::open(&d.join("jobs.db")).await.unwrap());
    let trap = Trap::start();
    std::fs::write(d.join("pw"), "local-pw").unwrap();
    let auth = format!("{{password: {{fromFile: {}}}}}", d.join("pw").display());
    let j = run(&db, d, config(trap.port, &auth), Origin::Operator).await;
    assert_eq!(j.status, Status::Failed);
    assert!(!j.error.as_deref().unwrap().contains("a request may not"), "{j:?}");
    assert!(trap.connections.load(Ordering::SeqCst) > 0, "the operator's host was not tried");
}

/// The API refuses every field that names a secret, path or capability on
/// the worker, each at its line:column, and stores nothing.
#[tokio::test(flavor = "multi_thread")]
async fn the_api_refuses_worker_files_variables_keys_and_the_agent_at_their_positions() {
    let dir = tempfile::tempdir().unwrap();
    let (digest, _) = held_bundle(dir.path());
    let db = Arc::new(JobDb::open(&dir.path().join("jobs.db")).await.unwrap());
    let token = db.create_token("t").await.unwrap();
    let handle = axum_server::Handle::new();
    let o = kubexm_server::api::ApiOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        tls_dir: dir.path().join("tls"),
        names: vec!["127.0.0.1".into()],
        bundles: dir.path().join("bundles"),
        max_connections: kubexm_server::api::limits::MAX_CONNECTIONS,
        health_listen: None,
        worker: None,
        post_rate: kubexm_server::api::POST_RATE,
        root: None,
    };
    tokio::spawn(kubexm_server::api::serve(db.clone(), o, handle.clone()));
    let addr = handle.listening().await.unwrap();
    let ca = reqwest::Certificate::from_pem(&std::fs::read(dir.path().join("tls/ca.crt")).unwrap()).unwrap();
    let client = reqwest::Client::builder().tls_certs_only([ca]).build().unwrap();
    let hostile = EXAMPLE.replace(
        "    auth: {credential: ops}\n",
        "    auth: {password: {fromFile: /var/lib/kubexm/api/ca.key}}\n    bastion: {address: 10.1.1.1, auth: {agent: true}}\n",
    );
    let hostile = hostile.replacen(
        "  containerRuntime:\n",
        "  containerRuntime:\n    auths: [{registry: r.example, username: u, password: {fromEnv: AWS_SECRET}}]\n",
        1,
    );
    let r = client
        .post(format!("https://127.0.0.1:{}/api/v1/clusters?bundle={digest}", addr.port()))
        .bearer_auth(&token)
        .header("content-type", "application/yaml")
        .body(hostile.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    let v: serde_json::Value = r.json().await.unwrap();
    let paths: Vec<&str> = v["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    for p in [
        "spec.hostDefaults.auth.password",
        "spec.hostDefaults.bastion.auth.agent",
        "spec.containerRuntime.auths[0].password",
    ] {
        assert!(paths.contains(&p), "{p} not refused: {paths:?}\n{hostile}");
    }
    for e in v["errors"].as_array().unwrap() {
        assert!(e["line"].as_u64().unwrap() > 0, "{e}");
    }
    assert!(db.list().await.unwrap().is_empty(), "a job was stored");
    handle.shutdown();
}

/// Issue 24, item 4: a cancel stops a job whose 40 hosts never answer
/// within 2 s (it held the only worker about 100 s), and more hosts than a
/// cluster may have are refused before any is contacted.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_stops_the_connect_phase_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let db = Arc::new(JobDb::open(&d.join("jobs.db")).await.unwrap());
    // 40 hosts that accept and never say a word, on loopback only.
    let mut listeners = Vec::new();
    let mut hosts = String::new();
    for i in 1..=40 {
        let l = TcpListener::bind(format!("127.0.1.{i}:0")).unwrap();
        hosts.push_str(&format!(
            "    - {{name: n{i}, address: 127.0.1.{i}, port: {}, auth: {{password: {{fromFile: {}}}}}}}\n",
            l.local_addr().unwrap().port(),
            d.join("pw").display()
        ));
        listeners.push(l);
    }
    std::fs::write(d.join("pw"), "x").unwrap();
    let config = format!(
        "apiVersion: kubexm.io/v1alpha1\nkind: Cluster\nmetadata: {{name: mute}}\nspec:\n  hosts:\n{hosts}  roleGroups: {{etcd: [n1], control-plane: [n1], loadbalancer: [n1, n2]}}\n  controlPlaneEndpoint: {{mode: haproxy-keepalived, address: 10.9.9.9}}\n"
    );
    let id = db
        .create(&NewJob {
            cluster: "mute".into(),
            kind: "facts".into(),
            config,
            config_name: "cluster.yaml".into(),
            options: serde_json::json!({}),
            origin: Origin::Operator,
            principal: None,
        })
        .await
        .unwrap();
    let runner = {
        let (db, d) = (db.clone(), d.to_path_buf());
        tokio::spawn(async move {
            let mut o = WorkerOptions::here(d.join("state.db"), d.join("jobs"));
            o.lease = std::time::Duration::from_secs(3);
            worker::serve(&db, &o, Arc::new(AtomicBool::new(false)), true).await.unwrap();
        })
    };
    while db.get(id).await.unwrap().unwrap().status != Status::Processing {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let asked = std::time::Instant::now();
    db.request_cancel(id).await.unwrap();
    runner.await.unwrap();
    let took = asked.elapsed();
    eprintln!("cancelled while connecting to 40 mute hosts: the worker was free after {took:?}");
    assert!(took < std::time::Duration::from_secs(2), "{took:?}");
    let j = db.get(id).await.unwrap().unwrap();
    assert_eq!(j.status, Status::Cancelled, "{j:?}");
    drop(listeners);
}
