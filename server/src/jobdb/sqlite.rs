//! The job database in one SQLite file (WAL, a 10 s busy timeout, mode
//! 0600, migrated by `PRAGMA user_version`). rusqlite blocks: every call
//! runs on tokio's blocking threads, one at a time on the one connection,
//! so an async caller never waits on the file on its own thread.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, OptionalExtension, ToSql, params};

use super::sql::{Cell, Param};
use super::{Backend, BoxFuture, Claim, Job, JobDbError, JobRow, LogLine, MIGRATIONS, NewJob, Res, Status, log_bounds, now_ms};

const COLUMNS: &str = "id, cluster, kind, status, current_step, error, created, started, finished, worker, attempt, \
                       cancel_requested, config, config_name, options, origin, principal";

pub(super) struct Sqlite {
    conn: Arc<Mutex<Connection>>,
    path: String,
}

impl Sqlite {
    /// Opens (creating and migrating) the file at `path`.
    pub(super) async fn open(path: &Path) -> Result<Sqlite, JobDbError> {
        let (file, p) = (path.to_path_buf(), path.display().to_string());
        let conn = tokio::task::spawn_blocking(move || open(&file))
            .await
            .map_err(|e| JobDbError::Invalid {
                path: p.clone(),
                what: e.to_string(),
            })??;
        Ok(Sqlite {
            conn: Arc::new(Mutex::new(conn)),
            path: p,
        })
    }

    /// Runs `f` on the connection on a blocking thread.
    fn with<T: Send + 'static>(&self, f: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static) -> Res<'_, T> {
        let conn = self.conn.clone();
        Box::pin(async move {
            let r = tokio::task::spawn_blocking(move || f(&mut conn.lock().unwrap_or_else(|e| e.into_inner()))).await;
            match r {
                Ok(r) => r.map_err(|source| JobDbError::Sql {
                    path: self.path.clone(),
                    source,
                }),
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => Err(JobDbError::Invalid {
                    path: self.path.clone(),
                    what: e.to_string(),
                }),
            }
        })
    }

    /// Runs `f` on the job's row only while `claim` still holds it.
    fn fenced(&self, claim: Claim, f: impl FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<()> + Send + 'static) -> Res<'_, ()> {
        let held = self.with(move |c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let held = tx
                .query_row(
                    "SELECT 1 FROM jobs WHERE id = ?1 AND attempt = ?2 AND status = 'Processing'",
                    params![claim.job, claim.attempt],
                    |_| Ok(()),
                )
                .optional()?
                .is_some();
            if held {
                f(&tx)?;
            }
            tx.commit()?;
            Ok(held)
        });
        Box::pin(async move {
            if held.await? {
                Ok(())
            } else {
                Err(JobDbError::Fenced {
                    job: claim.job,
                    attempt: claim.attempt,
                })
            }
        })
    }
}

/// Opens the file: 0600 before the first byte, WAL, migrated.
fn open(path: &Path) -> Result<Connection, JobDbError> {
    let p = path.display().to_string();
    let sql = |source| JobDbError::Sql { path: p.clone(), source };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs_err::create_dir_all(dir).map_err(|e| JobDbError::Invalid {
            path: p.clone(),
            what: e.to_string(),
        })?;
    }
    // Configs and logs are for the operators: 0600 before the first byte.
    if !path.exists() {
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path);
    } else if let Ok(m) = std::fs::metadata(path) {
        // A database made by an earlier kubexm: its owner only, from now on.
        use std::os::unix::fs::PermissionsExt;
        if m.permissions().mode() & 0o077 != 0 {
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
        }
    }
    let mut conn = Connection::open(path).map_err(sql)?;
    conn.busy_timeout(Duration::from_secs(10)).map_err(sql)?;
    conn.pragma_update(None, "journal_mode", "WAL").map_err(sql)?;
    conn.pragma_update(None, "synchronous", "NORMAL").map_err(sql)?;
    // Concurrent starts migrate once: the version is read and raised
    // inside one write transaction.
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(sql)?;
    let version: i64 = tx.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(sql)?;
    let version = usize::try_from(version).unwrap_or(usize::MAX);
    if version > MIGRATIONS.len() {
        return Err(JobDbError::Invalid {
            path: p,
            what: format!(
                "schema version {version} is newer than this kubexm knows ({}); use the kubexm that wrote it",
                MIGRATIONS.len()
            ),
        });
    }
    for (i, m) in MIGRATIONS.iter().enumerate().skip(version) {
        tx.execute_batch(m).map_err(sql)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64).map_err(sql)?;
    }
    tx.commit().map_err(sql)?;
    Ok(conn)
}

/// Shared SQL (`$1`) in SQLite's spelling (`?1`).
fn sqlite_sql(sql: &str) -> String {
    sql.replace('$', "?")
}

fn cell(v: ValueRef<'_>) -> Cell {
    match v {
        ValueRef::Null => Cell::Null,
        ValueRef::Integer(i) => Cell::Int(i),
        ValueRef::Real(f) => Cell::Text(f.to_string()),
        ValueRef::Text(t) | ValueRef::Blob(t) => Cell::Text(String::from_utf8_lossy(t).into_owned()),
    }
}

impl ToSql for Param {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        match self {
            Param::Int(v) => v.to_sql(),
            Param::Text(v) => v.to_sql(),
        }
    }
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Job> {
    Job::from_row(r)
}

impl Backend for Sqlite {
    fn shared(&self) -> bool {
        false
    }

    fn jobs_dir(&self) -> PathBuf {
        Path::new(&self.path)
            .parent()
            .map(|p| p.join("jobs"))
            .unwrap_or_else(|| PathBuf::from("jobs"))
    }

    fn wait_for_work(&self, max: Duration) -> BoxFuture<'_, ()> {
        Box::pin(tokio::time::sleep(max))
    }

    fn execute<'a>(&'a self, sql: &'a str, params: Vec<Param>) -> Res<'a, u64> {
        let sql = sqlite_sql(sql);
        self.with(move |c| c.execute(&sql, rusqlite::params_from_iter(params)).map(|n| n as u64))
    }

    fn execute_all(&self, statements: Vec<(String, Vec<Param>)>) -> Res<'_, Vec<u64>> {
        self.with(move |c| {
            let tx = c.transaction()?;
            let mut changed = Vec::new();
            for (sql, params) in statements {
                changed.push(tx.execute(&sqlite_sql(&sql), rusqlite::params_from_iter(params))? as u64);
            }
            tx.commit()?;
            Ok(changed)
        })
    }

    fn query<'a>(&'a self, sql: &'a str, params: Vec<Param>) -> Res<'a, Vec<Vec<Cell>>> {
        let sql = sqlite_sql(sql);
        self.with(move |c| {
            let mut st = c.prepare(&sql)?;
            let n = st.column_count();
            st.query_map(rusqlite::params_from_iter(params), |r| {
                (0..n).map(|i| r.get_ref(i).map(cell)).collect()
            })?
            .collect()
        })
    }

    fn create<'a>(&'a self, job: &'a NewJob) -> Res<'a, i64> {
        let job = job.clone();
        self.with(move |c| {
            c.execute(
                "INSERT INTO jobs (cluster, kind, status, config, config_name, options, created, origin, principal) VALUES (?1, ?2, 'Pending', ?3, ?4, ?5, ?6, ?7, ?8)",
                params![job.cluster, job.kind, job.config, job.config_name, job.options.to_string(), now_ms(), super::origin_str(job.origin), job.principal],
            )?;
            Ok(c.last_insert_rowid())
        })
    }

    fn get(&self, id: i64) -> Res<'_, Option<Job>> {
        self.with(move |c| {
            c.query_row(&format!("SELECT {COLUMNS} FROM jobs WHERE id = ?1"), [id], row)
                .optional()
        })
    }

    fn list(&self) -> Res<'_, Vec<Job>> {
        self.with(|c| {
            let mut st = c.prepare(&format!("SELECT {COLUMNS} FROM jobs ORDER BY id DESC"))?;
            st.query_map([], |r| Ok(row(r).unwrap_or_else(|e| Job::unreadable(r.get(0).unwrap_or(-1), &e))))?
                .collect()
        })
    }

    fn logs(&self, job: i64, after: i64) -> Res<'_, Vec<LogLine>> {
        self.with(move |c| {
            let mut st = c.prepare("SELECT seq, at, line FROM job_logs WHERE job = ?1 AND seq > ?2 ORDER BY seq")?;
            st.query_map(params![job, after], |r| {
                Ok(LogLine {
                    seq: r.get(0)?,
                    at: r.get(1)?,
                    line: r.get(2)?,
                })
            })?
            .collect()
        })
    }

    fn request_cancel(&self, id: i64) -> Res<'_, Option<Status>> {
        self.with(move |c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            tx.execute(
                "UPDATE jobs SET status = 'Cancelled', finished = ?2, current_step = NULL WHERE id = ?1 AND status IN ('Pending', 'Blocked')",
                params![id, now_ms()],
            )?;
            // A running job whose worker died (its lease ran out) ends now;
            // the claim attempt moves on, so that worker's writes are refused.
            tx.execute(
                "UPDATE jobs SET status = 'Cancelled', finished = ?2, current_step = NULL, lease_until = NULL, attempt = attempt + 1
                 WHERE id = ?1 AND status = 'Processing' AND lease_until < ?2",
                params![id, now_ms()],
            )?;
            tx.execute(
                "UPDATE jobs SET cancel_requested = 1 WHERE id = ?1 AND status = 'Processing'",
                [id],
            )?;
            let s: Option<String> = tx.query_row("SELECT status FROM jobs WHERE id = ?1", [id], |r| r.get(0)).optional()?;
            tx.commit()?;
            Ok(s.and_then(|s| Status::parse(&s)))
        })
    }

    fn claim<'a>(&'a self, worker: &'a str, machine: &'a str, lease_ms: i64, only: Option<i64>) -> Res<'a, Option<Claim>> {
        let (worker, machine) = (worker.to_string(), machine.to_string());
        self.with(move |c| {
            let now = now_ms();
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let busy = "SELECT cluster FROM jobs WHERE status = 'Processing' AND lease_until >= ?1";
            tx.execute(
                &format!("UPDATE jobs SET status = 'Blocked' WHERE status = 'Pending' AND cluster IN ({busy})"),
                [now],
            )?;
            tx.execute(
                &format!("UPDATE jobs SET status = 'Pending' WHERE status = 'Blocked' AND cluster NOT IN ({busy})"),
                [now],
            )?;
            let found: Option<(i64, String, i64)> = tx
                .query_row(
                    &format!(
                        "SELECT j.id, j.cluster, j.attempt FROM jobs j LEFT JOIN clusters k ON k.name = j.cluster
                         WHERE (j.status = 'Pending' OR (j.status = 'Processing' AND j.lease_until < ?1))
                           AND (k.machine IS NULL OR k.machine = ?2)
                           AND (?3 IS NULL OR j.id = ?3)
                           AND j.cluster NOT IN ({busy})
                         ORDER BY j.id LIMIT 1"
                    ),
                    params![now, machine, only],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .optional()?;
            let Some((id, cluster, attempt)) = found else {
                tx.commit()?;
                return Ok(None);
            };
            let attempt = attempt + 1;
            tx.execute(
                "UPDATE jobs SET status = 'Processing', worker = ?2, attempt = ?3, lease_until = ?4,
                   started = COALESCE(started, ?5) WHERE id = ?1",
                params![id, worker, attempt, now + lease_ms, now],
            )?;
            tx.execute(
                "INSERT INTO clusters (name, machine) VALUES (?1, ?2) ON CONFLICT(name) DO NOTHING",
                params![cluster, machine],
            )?;
            tx.commit()?;
            Ok(Some(Claim { job: id, attempt }))
        })
    }

    fn renew(&self, claim: Claim, lease_ms: i64) -> Res<'_, bool> {
        Box::pin(async move {
            self.fenced(claim, move |tx| {
                tx.execute(
                    "UPDATE jobs SET lease_until = ?2 WHERE id = ?1",
                    params![claim.job, now_ms() + lease_ms],
                )
                .map(|_| ())
            })
            .await?;
            Ok(self.get(claim.job).await?.is_some_and(|j| j.cancel_requested))
        })
    }

    fn append<'a>(&'a self, claim: Claim, lines: &'a [String], current_step: Option<&'a str>) -> Res<'a, ()> {
        let (lines, current_step) = (lines.to_vec(), current_step.map(str::to_string));
        self.fenced(claim, move |tx| {
            let last: i64 = tx.query_row("SELECT COALESCE(MAX(seq), 0) FROM job_logs WHERE job = ?1", [claim.job], |r| {
                r.get(0)
            })?;
            let now = now_ms();
            let mut st = tx.prepare_cached("INSERT INTO job_logs (job, seq, at, line) VALUES (?1, ?2, ?3, ?4)")?;
            for (i, l) in log_bounds::capped(last, &lines).iter().enumerate() {
                st.execute(params![claim.job, last + 1 + i as i64, now, l])?;
            }
            if let Some(s) = current_step {
                tx.execute("UPDATE jobs SET current_step = ?2 WHERE id = ?1", params![claim.job, s])?;
            }
            Ok(())
        })
    }

    fn finish<'a>(&'a self, claim: Claim, status: Status, error: Option<&'a str>) -> Res<'a, ()> {
        let error = error.map(str::to_string);
        self.fenced(claim, move |tx| {
            tx.execute(
                "UPDATE jobs SET status = ?2, error = ?3, finished = ?4, lease_until = NULL,
                   current_step = CASE WHEN ?2 = 'Success' THEN NULL ELSE current_step END WHERE id = ?1",
                params![claim.job, status.as_str(), error, now_ms()],
            )
            .map(|_| ())
        })
    }

    fn release(&self, claim: Claim) -> Res<'_, ()> {
        self.fenced(claim, move |tx| {
            tx.execute(
                "UPDATE jobs SET status = 'Pending', lease_until = NULL, worker = NULL WHERE id = ?1",
                [claim.job],
            )
            .map(|_| ())
        })
    }
}

impl JobRow for rusqlite::Row<'_> {
    type Error = rusqlite::Error;
    fn text(&self, i: usize) -> rusqlite::Result<String> {
        self.get(i)
    }
    fn maybe_text(&self, i: usize) -> rusqlite::Result<Option<String>> {
        self.get(i)
    }
    fn int(&self, i: usize) -> rusqlite::Result<i64> {
        self.get(i)
    }
    fn maybe_int(&self, i: usize) -> rusqlite::Result<Option<i64>> {
        self.get(i)
    }
    fn flag(&self, i: usize) -> rusqlite::Result<bool> {
        Ok(self.get::<_, i64>(i)? != 0)
    }
}
