//! The job database on its own: migrations, claims, one job per cluster,
//! leases and fencing, machine affinity, cancel.

use kubexm_server::jobdb::{Claim, JobDb, JobDbError, NewJob, Status};
fn job(cluster: &str) -> NewJob {
    NewJob {
        cluster: cluster.into(),
        kind: "install".into(),
        config: "apiVersion: kubexm.io/v1alpha1\n".into(),
        config_name: "cluster.yaml".into(),
        options: serde_json::json!({}),
        origin: kubexm_server::jobdb::Origin::Request,
        principal: None,
    }
}

#[tokio::test]
async fn migrations_run_once_and_a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("jobs.db");
    let a = JobDb::open(&p).await.unwrap();
    let id = a.create(&job("a")).await.unwrap();
    drop(a);
    let b = JobDb::open(&p).await.unwrap();
    assert_eq!(b.get(id).await.unwrap().unwrap().status, Status::Pending);
    rusqlite::Connection::open(&p)
        .unwrap()
        .pragma_update(None, "user_version", 99)
        .unwrap();
    drop(b);
    let err = JobDb::open(&p).await.err().unwrap().to_string();
    assert!(err.contains("schema version 99 is newer"), "{err}");
}

/// Issue 26: jobs stored before typed requests are rewritten by migration
/// 4 and read as requests (or, the operator's installs without a digest,
/// as an error naming what is missing).
#[tokio::test]
async fn jobs_stored_before_typed_requests_are_migrated() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("jobs.db");
    let db = JobDb::open(&p).await.unwrap();
    for j in kubexm_server::testing::jobs_before_requests() {
        db.create(&j).await.unwrap();
    }
    drop(db);
    // Back to version 3: the later migrations' tables go too.
    let conn = rusqlite::Connection::open(&p).unwrap();
    conn.execute_batch("DROP TABLE job_timelines").unwrap();
    conn.pragma_update(None, "user_version", 3).unwrap();
    drop(conn);
    let db = JobDb::open(&p).await.unwrap();
    kubexm_server::testing::check_migrated_requests(&db.list().await.unwrap()).unwrap();
}

#[tokio::test]
async fn one_job_per_cluster_runs_and_the_others_wait_blocked() {
    let dir = tempfile::tempdir().unwrap();
    let db = JobDb::open(&dir.path().join("jobs.db")).await.unwrap();
    let (a1, a2, b1) = (
        db.create(&job("a")).await.unwrap(),
        db.create(&job("a")).await.unwrap(),
        db.create(&job("b")).await.unwrap(),
    );
    let c1 = db.claim("w1", "m", 60_000, None).await.unwrap().unwrap();
    assert_eq!(c1, Claim { job: a1, attempt: 1 });
    let c2 = db.claim("w2", "m", 60_000, None).await.unwrap().unwrap();
    assert_eq!(c2.job, b1, "a's second job waits for its first");
    assert_eq!(db.get(a2).await.unwrap().unwrap().status, Status::Blocked);
    assert_eq!(db.claim("w3", "m", 60_000, None).await.unwrap(), None);
    db.finish(c1, Status::Success, None).await.unwrap();
    let c3 = db.claim("w3", "m", 60_000, None).await.unwrap().unwrap();
    assert_eq!(c3.job, a2);
}

#[tokio::test]
async fn an_expired_lease_is_claimed_again_and_the_stale_worker_is_fenced() {
    let dir = tempfile::tempdir().unwrap();
    let db = JobDb::open(&dir.path().join("jobs.db")).await.unwrap();
    let id = db.create(&job("a")).await.unwrap();
    let stale = db.claim("w1", "m", -1, None).await.unwrap().unwrap();
    db.append(stale, &["one".into()], Some("etcd/x@lab1")).await.unwrap();
    let fresh = db.claim("w2", "m", 60_000, None).await.unwrap().unwrap();
    assert_eq!(fresh, Claim { job: id, attempt: 2 });
    assert!(matches!(
        db.append(stale, &["late".into()], None).await,
        Err(JobDbError::Fenced { attempt: 1, .. })
    ));
    assert!(matches!(
        db.finish(stale, Status::Failed, Some("x")).await,
        Err(JobDbError::Fenced { .. })
    ));
    db.append(fresh, &["two".into(), "three".into()], None).await.unwrap();
    let lines: Vec<(i64, String)> = db.logs(id, 0).await.unwrap().into_iter().map(|l| (l.seq, l.line)).collect();
    assert_eq!(lines, [(1, "one".into()), (2, "two".into()), (3, "three".into())]);
    assert_eq!(db.logs(id, 2).await.unwrap().len(), 1);
    db.finish(fresh, Status::Success, None).await.unwrap();
    let j = db.get(id).await.unwrap().unwrap();
    assert_eq!((j.status, j.worker.as_deref(), j.attempt), (Status::Success, Some("w2"), 2));
}

#[tokio::test]
async fn a_clusters_jobs_run_on_the_machine_that_first_ran_one() {
    let dir = tempfile::tempdir().unwrap();
    let db = JobDb::open(&dir.path().join("jobs.db")).await.unwrap();
    let first = db.claim("w1", "m1", 60_000, None).await.unwrap();
    assert_eq!(first, None);
    db.create(&job("a")).await.unwrap();
    let c = db.claim("w1", "m1", 60_000, None).await.unwrap().unwrap();
    db.finish(c, Status::Success, None).await.unwrap();
    db.create(&job("a")).await.unwrap();
    assert_eq!(
        db.claim("w2", "m2", 60_000, None).await.unwrap(),
        None,
        "another machine took a's job"
    );
    assert!(db.claim("w1", "m1", 60_000, None).await.unwrap().is_some());
}

#[tokio::test]
async fn cancel_ends_a_waiting_job_and_flags_a_running_one() {
    let dir = tempfile::tempdir().unwrap();
    let db = JobDb::open(&dir.path().join("jobs.db")).await.unwrap();
    let (a, b) = (db.create(&job("a")).await.unwrap(), db.create(&job("b")).await.unwrap());
    assert_eq!(db.request_cancel(a).await.unwrap(), Some(Status::Cancelled));
    let c = db.claim("w", "m", 60_000, None).await.unwrap().unwrap();
    assert_eq!(c.job, b);
    assert!(!db.renew(c, 60_000).await.unwrap());
    assert_eq!(db.request_cancel(b).await.unwrap(), Some(Status::Processing));
    assert!(db.renew(c, 60_000).await.unwrap(), "the worker sees the request");
    assert_eq!(db.request_cancel(999).await.unwrap(), None);
}

/// Issue 24, item 6: a NUL or terminal control characters in a log line or
/// an error (text from a request or a host) are stored as visible escapes,
/// so PostgreSQL can store them and no terminal obeys them.
#[tokio::test]
async fn log_lines_and_errors_are_stored_without_nul_or_control_characters() {
    let dir = tempfile::tempdir().unwrap();
    let db = JobDb::open(&dir.path().join("jobs.db")).await.unwrap();
    let id = db.create(&job("a")).await.unwrap();
    let claim = db.claim("w", "m", 30_000, None).await.unwrap().unwrap();
    db.append(claim, &["X\0Y \x1b[2J\rfake".into()], Some("s\x1b")).await.unwrap();
    db.finish(claim, Status::Failed, Some("environment variable X\0Y is not set\nnext"))
        .await
        .unwrap();
    let line = &db.logs(id, 0).await.unwrap()[0].line;
    assert_eq!(line, "X\\u{0}Y \\u{1b}[2J\\u{d}fake");
    let j = db.get(id).await.unwrap().unwrap();
    assert_eq!(j.error.as_deref(), Some("environment variable X\\u{0}Y is not set\nnext"));
    assert_eq!(j.current_step.as_deref(), Some("s\\u{1b}"));
    let mut nul = job("b");
    nul.config.push('\0');
    assert!(db.create(&nul).await.unwrap_err().to_string().contains("NUL"));
}

/// Issue 24, item 10: the job database is readable by its owner only.
#[tokio::test]
async fn the_job_database_is_made_mode_0600() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("jobs.db");
    JobDb::open(&p).await.unwrap();
    assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
}

/// Issue 24, item 10: a running job whose worker died (its lease ran out)
/// is cancelled at once, and that worker's later writes are refused.
#[tokio::test]
async fn a_job_whose_worker_died_can_be_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let db = JobDb::open(&dir.path().join("jobs.db")).await.unwrap();
    let id = db.create(&job("a")).await.unwrap();
    let claim = db.claim("dead", "m", 1, None).await.unwrap().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(db.request_cancel(id).await.unwrap(), Some(Status::Cancelled));
    assert!(matches!(
        db.append(claim, &["late".into()], None).await,
        Err(JobDbError::Fenced { .. })
    ));
    assert!(matches!(
        db.finish(claim, Status::Success, None).await,
        Err(JobDbError::Fenced { .. })
    ));
    assert_eq!(db.get(id).await.unwrap().unwrap().status, Status::Cancelled);
}

/// Issue 24, item 10: finished jobs older than the retention go with their
/// logs; running and waiting ones stay.
#[tokio::test]
async fn finished_jobs_past_the_retention_are_deleted_with_their_logs() {
    let dir = tempfile::tempdir().unwrap();
    let db = JobDb::open(&dir.path().join("jobs.db")).await.unwrap();
    let done = db.create(&job("a")).await.unwrap();
    let waiting = db.create(&job("b")).await.unwrap();
    let c = db.claim("w", "m", 30_000, Some(done)).await.unwrap().unwrap();
    db.append(c, &["x".into()], None).await.unwrap();
    db.finish(c, Status::Success, None).await.unwrap();
    assert_eq!(
        db.prune(kubexm_server::jobdb::now_ms() - 60_000).await.unwrap(),
        0,
        "a job finished now is kept"
    );
    assert_eq!(db.prune(kubexm_server::jobdb::now_ms() + 1).await.unwrap(), 1);
    assert!(db.get(done).await.unwrap().is_none() && db.logs(done, 0).await.unwrap().is_empty());
    assert!(db.get(waiting).await.unwrap().is_some());
}

/// Issue 24, item 8: a write lock held on jobs.db past the 10 s busy
/// timeout (a backup, a VACUUM) no longer ends a supervised worker: it
/// reports itself restarting, then claims jobs again once the lock is gone.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_outlives_a_long_write_lock_and_says_so_meanwhile() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("jobs.db");
    let db = Arc::new(JobDb::open(&p).await.unwrap());
    let health = Arc::new(kubexm_server::worker::WorkerHealth::default());
    let quit = Arc::new(AtomicBool::new(false));
    let runner = {
        let (db, health, quit, d) = (db.clone(), health.clone(), quit.clone(), dir.path().to_path_buf());
        tokio::spawn(async move {
            let o = kubexm_server::worker::WorkerOptions::here(d.join("state.db"), d.join("jobs"));
            kubexm_server::worker::supervise(&db, &o, quit, &health).await;
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let locker = rusqlite::Connection::open(&p).unwrap();
    locker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let start = std::time::Instant::now();
    while health.state().0 {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "the worker never noticed the lock"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert!(health.state().1.is_some_and(|e| e.contains("locked")), "{:?}", health.state());
    locker.execute_batch("COMMIT").unwrap();
    drop(locker);
    let start = std::time::Instant::now();
    while !health.state().0 {
        assert!(start.elapsed() < std::time::Duration::from_secs(30), "the worker did not come back");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    quit.store(true, Ordering::Relaxed);
    runner.await.unwrap();
}

/// Issue 25, item 4: a host that prints without end had every line of it
/// stored, however long, for as long as it printed.
#[tokio::test]
async fn a_jobs_stored_log_is_capped_in_lines_and_line_length_with_the_cuts_said() {
    use kubexm_server::jobdb::log_bounds::{MAX_LINE, MAX_LINES};
    let dir = tempfile::tempdir().unwrap();
    let db = JobDb::open(&dir.path().join("jobs.db")).await.unwrap();
    let id = db.create(&job("a")).await.unwrap();
    let claim = db.claim("w", "m", 30_000, None).await.unwrap().unwrap();
    db.append(claim, &["x".repeat(1 << 20)], None).await.unwrap();
    let batch: Vec<String> = (0..10_000).map(|i| format!("line {i}")).collect();
    for _ in 0..6 {
        db.append(claim, &batch, None).await.unwrap();
    }
    db.finish(claim, Status::Failed, Some("the host printed too much")).await.unwrap();
    let logs = db.logs(id, 0).await.unwrap();
    assert_eq!(logs.len() as i64, MAX_LINES);
    assert!(logs[0].line.len() <= MAX_LINE + 60, "{} bytes", logs[0].line.len());
    assert!(
        logs[0]
            .line
            .ends_with(&format!("[kubexm: a line of {} bytes, cut to {MAX_LINE}]", 1 << 20))
    );
    assert!(
        logs.last().unwrap().line.contains("reached its cap of"),
        "{}",
        logs.last().unwrap().line
    );
    let j = db.get(id).await.unwrap().unwrap();
    assert_eq!(j.error.as_deref(), Some("the host printed too much"));
}
