//! The job database on a real PostgreSQL server (Debian's, started by the
//! test in a temporary directory on loopback and stopped by its pid):
//! migrations once under concurrent starts, three workers claiming thirty
//! jobs over ten clusters (each claimed once, never two of one cluster at
//! a time), fencing of a worker whose lease ran out, and `NOTIFY` waking an
//! idle worker.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kubexm_server::jobdb::{Claim, JobDb, JobDbError, NewJob, Status};
use kubexm_server::testing::Postgres;

/// A server for one test, or `None` (skipped) where PostgreSQL is not installed.
fn start() -> Option<Postgres> {
    let pg = Postgres::start().unwrap();
    if pg.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "PostgreSQL is not installed (/usr/lib/postgresql/*/bin/initdb): ci/test installs Debian's postgresql"
        );
        eprintln!("skipped: PostgreSQL is not installed (ci/test installs Debian's postgresql)");
    }
    pg
}

async fn open(pg: &Postgres) -> Arc<JobDb> {
    Arc::new(JobDb::open(Path::new(&pg.url)).await.unwrap())
}

fn job(cluster: &str) -> NewJob {
    NewJob {
        cluster: cluster.into(),
        kind: "facts".into(),
        config: "kind: Cluster\n".into(),
        config_name: "cluster.yaml".into(),
        options: serde_json::json!({}),
        origin: kubexm_server::jobdb::Origin::Request,
        principal: None,
    }
}

/// Issue 26: jobs stored before typed requests are rewritten by migration 3.
#[tokio::test(flavor = "multi_thread")]
async fn jobs_stored_before_typed_requests_are_migrated() {
    let Some(pg) = start() else { return };
    let db = open(&pg).await;
    for j in kubexm_server::testing::jobs_before_requests() {
        db.create(&j).await.unwrap();
    }
    drop(db);
    let pool = sqlx::PgPool::connect(&pg.url).await.unwrap();
    // Back to version 2: the later migrations' tables go too.
    sqlx::query("DROP TABLE job_timelines").execute(&pool).await.unwrap();
    sqlx::query("UPDATE kubexm_schema SET version = 2").execute(&pool).await.unwrap();
    pool.close().await;
    let db = open(&pg).await;
    kubexm_server::testing::check_migrated_requests(&db.list().await.unwrap()).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_starts_migrate_once() {
    let Some(pg) = start() else { return };
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let url = pg.url.clone();
            tokio::spawn(async move { JobDb::open(Path::new(&url)).await.map(|_| ()) })
        })
        .collect();
    for h in handles {
        h.await.unwrap().unwrap();
    }
    let out = Command::new("psql")
        .arg(&pg.url)
        .args(["-tAc", "SELECT count(*), max(version) FROM kubexm_schema"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1|4");
}

#[tokio::test(flavor = "multi_thread")]
async fn three_workers_claim_thirty_jobs_each_once_and_never_two_of_one_cluster_at_a_time() {
    let Some(pg) = start() else { return };
    let db = open(&pg).await;
    let mut ids: Vec<i64> = Vec::new();
    for i in 0..30 {
        ids.push(db.create(&job(&format!("c{}", i % 10))).await.unwrap());
    }
    let started = Instant::now();
    let workers: Vec<_> = (0..3)
        .map(|w| {
            let url = pg.url.clone();
            tokio::spawn(async move {
                // Each worker its own connection pool, as separate processes.
                let db = JobDb::open(Path::new(&url)).await.unwrap();
                let mut mine = Vec::new();
                let mut idle = 0;
                while idle < 20 {
                    match db.claim(&format!("w{w}"), "m", 30_000, None).await.unwrap() {
                        Some(c) => {
                            idle = 0;
                            let j = db.get(c.job).await.unwrap().unwrap();
                            // Nothing else of its cluster runs while it does.
                            let others = db
                                .list()
                                .await
                                .unwrap()
                                .into_iter()
                                .filter(|o| o.cluster == j.cluster && o.id != j.id && o.status == Status::Processing)
                                .count();
                            assert_eq!(others, 0, "two jobs of {} at once", j.cluster);
                            db.append(c, &[format!("w{w} ran it")], Some("facts/gather")).await.unwrap();
                            tokio::time::sleep(Duration::from_millis(30)).await;
                            db.finish(c, Status::Success, None).await.unwrap();
                            mine.push(c);
                        }
                        None => {
                            idle += 1;
                            db.wait_for_work(Duration::from_millis(50)).await;
                        }
                    }
                }
                mine
            })
        })
        .collect();
    let mut claims: Vec<Claim> = Vec::new();
    for h in workers {
        claims.extend(h.await.unwrap());
    }
    let took = started.elapsed();
    let mut claimed: Vec<i64> = claims.iter().map(|c| c.job).collect();
    claimed.sort();
    assert_eq!(claimed, ids, "each job claimed exactly once");
    assert!(claims.iter().all(|c| c.attempt == 1));
    for j in db.list().await.unwrap() {
        assert_eq!(j.status, Status::Success, "{j:?}");
        assert_eq!(db.logs(j.id, 0).await.unwrap().len(), 1);
    }
    eprintln!("30 jobs by 3 workers in {took:?}");
}

#[tokio::test]
async fn a_worker_whose_lease_ran_out_has_its_writes_refused() {
    let Some(pg) = start() else { return };
    let db = open(&pg).await;
    let id = db.create(&job("c")).await.unwrap();
    let stale = db.claim("stalled", "m", 200, None).await.unwrap().unwrap();
    db.append(stale, &["before the stop".into()], None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let fresh = db.claim("other", "m", 30_000, None).await.unwrap().unwrap();
    assert_eq!((fresh.job, fresh.attempt), (id, 2));
    for r in [
        db.append(stale, &["after".into()], None).await,
        db.finish(stale, Status::Failed, Some("x")).await,
        db.renew(stale, 1000).await.map(|_| ()),
    ] {
        assert!(matches!(r, Err(JobDbError::Fenced { job, attempt: 1 }) if job == id), "{r:?}");
    }
    db.finish(fresh, Status::Success, None).await.unwrap();
    let lines: Vec<String> = db.logs(id, 0).await.unwrap().into_iter().map(|l| l.line).collect();
    assert_eq!(lines, ["before the stop"]);
    assert_eq!(db.get(id).await.unwrap().unwrap().status, Status::Success);
}

/// The engine emits its events from its scheduler task: the store is
/// written from inside another tokio runtime (a worker hung on this). The
/// event goes to the job's writer, which appends it on the worker's runtime.
#[tokio::test(flavor = "multi_thread")]
async fn events_written_from_inside_another_runtime_are_stored() {
    let Some(pg) = start() else { return };
    let db = open(&pg).await;
    let id = db.create(&job("c")).await.unwrap();
    let claim = db.claim("w", "m", 30_000, None).await.unwrap().unwrap();
    let writer = kubexm_server::jobdb::writer::LogWriter::start(db.clone(), claim, || {});
    let inner = writer.sender();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async move { inner.send("from a task".into(), Some("step 1".into())) })
    })
    .join()
    .unwrap();
    writer.close().await;
    let j = db.get(id).await.unwrap().unwrap();
    assert_eq!(j.current_step.as_deref(), Some("step 1"));
    assert_eq!(db.logs(id, 0).await.unwrap().last().unwrap().line, "from a task");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_job_wakes_an_idle_worker_at_once() {
    let Some(pg) = start() else { return };
    let db = open(&pg).await;
    // The listener is connected on the first wait.
    db.wait_for_work(Duration::from_millis(10)).await;
    let waiter = {
        let db = db.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            db.wait_for_work(Duration::from_secs(20)).await;
            t.elapsed()
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let other = open(&pg).await;
    other.create(&job("c")).await.unwrap();
    let waited = waiter.await.unwrap();
    assert!(waited < Duration::from_secs(5), "woke after {waited:?}");
}

#[tokio::test]
async fn a_password_in_the_url_is_not_shown() {
    let Some(pg) = start() else { return };
    let url = pg.url.replace("kubexm@", "kubexm:s3cret-pw@").replace("/postgres", "/nonexistent");
    let err = JobDb::open(Path::new(&url)).await.err().expect("a missing database opens");
    let text = err.to_string();
    assert!(!text.contains("s3cret-pw"), "{text}");
    assert!(text.contains("kubexm:***@"), "{text}");
    // Issue 24, item 10: nor in the query string.
    let url = format!("{url}?password=s3cret-pw");
    let text = JobDb::open(Path::new(&url))
        .await
        .err()
        .expect("a missing database opens")
        .to_string();
    assert!(!text.contains("s3cret-pw") && text.contains("?***"), "{text}");
}

#[tokio::test]
async fn a_waiting_job_of_a_busy_cluster_reads_as_blocked_and_is_not_claimed() {
    let Some(pg) = start() else { return };
    let db = open(&pg).await;
    let first = db.create(&job("c")).await.unwrap();
    let second = db.create(&job("c")).await.unwrap();
    let other = db.create(&job("d")).await.unwrap();
    let c = db.claim("w1", "m", 30_000, None).await.unwrap().unwrap();
    assert_eq!(c.job, first);
    assert_eq!(db.get(second).await.unwrap().unwrap().status, Status::Blocked);
    // The next claim skips the busy cluster.
    let d = db.claim("w2", "m", 30_000, None).await.unwrap().unwrap();
    assert_eq!(d.job, other);
    assert!(db.claim("w3", "m", 30_000, None).await.unwrap().is_none());
    db.finish(c, Status::Success, None).await.unwrap();
    assert_eq!(db.get(second).await.unwrap().unwrap().status, Status::Pending);
    assert_eq!(db.claim("w3", "m", 30_000, None).await.unwrap().unwrap().job, second);
    // A cluster's jobs run on the machine that ran its first.
    let again = db.create(&job("d")).await.unwrap();
    db.finish(d, Status::Success, None).await.unwrap();
    assert!(db.claim("w4", "elsewhere", 30_000, Some(again)).await.unwrap().is_none());
    assert_eq!(db.claim("w4", "m", 30_000, Some(again)).await.unwrap().unwrap().job, again);
}

mod common;

#[tokio::test(flavor = "multi_thread")]
async fn the_api_server_stores_and_serves_jobs_in_postgres() {
    let Some(pg) = tokio::task::spawn_blocking(start).await.unwrap() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    let (digest, _) = common::held_bundle(&d);
    let url = pg.url.clone();
    let db = Arc::new(JobDb::open(Path::new(&url)).await.unwrap());
    let token = db.create_token("t").await.unwrap();
    let handle = axum_server::Handle::new();
    let o = kubexm_server::api::ApiOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        tls_dir: d.join("tls"),
        names: vec!["127.0.0.1".into()],
        bundles: d.join("bundles"),
        max_connections: kubexm_server::api::limits::MAX_CONNECTIONS,
        health_listen: None,
        worker: None,
        post_rate: kubexm_server::api::POST_RATE,
        root: None,
    };
    tokio::spawn(kubexm_server::api::serve(db.clone(), o, handle.clone()));
    let addr = handle.listening().await.unwrap();
    let ca = reqwest::Certificate::from_pem(&std::fs::read(d.join("tls/ca.crt")).unwrap()).unwrap();
    let c = reqwest::Client::builder().tls_certs_only([ca]).build().unwrap();
    let base = format!("https://127.0.0.1:{}", addr.port());
    let r = c
        .post(format!("{base}/api/v1/clusters?bundle={digest}"))
        .bearer_auth(&token)
        .header("content-type", "application/yaml")
        .body(common::EXAMPLE.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let id = r.json::<serde_json::Value>().await.unwrap()["job_id"].as_i64().unwrap();
    let j: serde_json::Value = c
        .get(format!("{base}/api/v1/jobs/{id}"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(j["status"], "Pending");
    let bad = c.get(format!("{base}/api/v1/jobs")).bearer_auth("kxm_wrong").send().await.unwrap();
    assert_eq!(bad.status(), 401);
    let logs = c
        .get(format!("{base}/api/v1/jobs/{id}/logs"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(logs.contains("event: end") && logs.contains("Pending"), "{logs}");
    handle.shutdown();
    tokio::task::spawn_blocking(move || drop((db, pg))).await.unwrap();
}

/// Issue 24, item 6: an error holding a NUL (`fromEnv: "X\0Y"`) is stored
/// on PostgreSQL (it used to be refused, killing every worker that claimed
/// the job), as a visible escape.
#[tokio::test]
async fn a_nul_in_a_log_line_or_error_is_stored_escaped() {
    let Some(pg) = start() else { return };
    let db = open(&pg).await;
    let id = db.create(&job("nul")).await.unwrap();
    let claim = db.claim("w", "m", 30_000, None).await.unwrap().unwrap();
    db.append(claim, &["environment variable X\0Y is not set".into()], None)
        .await
        .unwrap();
    db.finish(claim, Status::Failed, Some("X\0Y\r\x1b[31m")).await.unwrap();
    assert_eq!(db.logs(id, 0).await.unwrap()[0].line, "environment variable X\\u{0}Y is not set");
    assert_eq!(
        db.get(id).await.unwrap().unwrap().error.as_deref(),
        Some("X\\u{0}Y\\u{d}\\u{1b}[31m")
    );
}

/// Credentials and pinned host keys on PostgreSQL: stored sealed, replaced
/// by name, listed without their secret, deleted.
#[tokio::test]
async fn credentials_and_host_keys_are_kept_replaced_and_deleted() {
    let Some(pg) = start() else { return };
    let db = open(&pg).await;
    let dir = tempfile::tempdir().unwrap();
    let key = kubexm_server::credentials::SealKey::load_or_create(&dir.path().join("k")).unwrap();
    std::fs::write(dir.path().join("pw"), "pg-secret-pw").unwrap();
    for hosts in [["10.0.0.0/8".to_string()], ["198.18.0.0/24".to_string()]] {
        let file = dir.path().join("pw");
        kubexm_server::credentials::create(&db, &key, "ops", kubexm_server::credentials::NewSecret::Password { file }, &hosts)
            .await
            .unwrap();
    }
    let all = db.credentials().await.unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].hosts, ["198.18.0.0/24"]);
    assert!(!all[0].sealed.contains("pg-secret-pw"));
    db.pin_host_key("10.0.0.5:22", "ssh-ed25519 AAAA1").await.unwrap();
    db.pin_host_key("10.0.0.5:22", "ssh-ed25519 AAAA2").await.unwrap();
    assert_eq!(db.host_key("10.0.0.5:22").await.unwrap().as_deref(), Some("ssh-ed25519 AAAA2"));
    assert_eq!(db.host_keys().await.unwrap().len(), 1);
    assert!(db.delete_host_key("10.0.0.5:22").await.unwrap() && !db.delete_host_key("10.0.0.5:22").await.unwrap());
    assert!(db.delete_credential("ops").await.unwrap() && db.credential("ops").await.unwrap().is_none());
}
