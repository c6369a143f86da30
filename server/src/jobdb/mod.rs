//! The job database: jobs (what was asked, its status, current step, lease
//! and claim attempt) and every job's log lines, numbered in order. Embedded
//! SQLite in WAL mode (`/var/lib/kubexm/jobs.db` by default); the engine's
//! step results stay in its state database, which the worker names.
//!
//! A worker claims a job in one transaction and holds it with a lease it
//! renews. Every write a worker makes names the claim attempt it holds, and
//! is refused once the job was claimed again (its lease ran out): a stale
//! worker cannot overwrite a newer one ("fencing"). One job per cluster runs
//! at a time; the others wait as Blocked. A cluster's jobs run on the machine
//! that first ran one (its PKI and unpacked bundle live there).
//!
//! The same database on PostgreSQL ([`pg`]) serves workers on several
//! machines: `--db postgres://user@host/db`.

pub mod log_bounds;
mod pg;
mod principals;
mod trust;

pub use principals::{AuditRow, Scope, TokenRow};
pub use trust::{CredentialKind, CredentialRow, HostKeyRow};

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

/// Where the job database lives unless told otherwise.
pub const JOBS_DB: &str = "/var/lib/kubexm/jobs.db";

/// The schema, one migration per version (`PRAGMA user_version`).
const MIGRATIONS: &[&str] = &[
    "CREATE TABLE jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        cluster TEXT NOT NULL,
        kind TEXT NOT NULL,
        status TEXT NOT NULL,
        config TEXT NOT NULL,
        config_name TEXT NOT NULL,
        options TEXT NOT NULL,
        created INTEGER NOT NULL,
        started INTEGER,
        finished INTEGER,
        current_step TEXT,
        error TEXT,
        worker TEXT,
        attempt INTEGER NOT NULL DEFAULT 0,
        lease_until INTEGER,
        cancel_requested INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX jobs_status ON jobs(status, id);
    CREATE TABLE job_logs (
        job INTEGER NOT NULL REFERENCES jobs(id),
        seq INTEGER NOT NULL,
        at INTEGER NOT NULL,
        line TEXT NOT NULL,
        PRIMARY KEY (job, seq)
    );
    CREATE TABLE clusters (name TEXT PRIMARY KEY, machine TEXT NOT NULL);
    CREATE TABLE workers (name TEXT PRIMARY KEY, machine TEXT NOT NULL, seen INTEGER NOT NULL);",
    // 2: API bearer tokens, only their sha256 kept.
    "CREATE TABLE tokens (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL,
        sha256 TEXT NOT NULL UNIQUE,
        created INTEGER NOT NULL
    );",
    // 3: who wrote a job's config (jobs from before are requests: the
    // stricter rules), named credentials (sealed) and pinned host keys.
    trust::MIGRATION,
];

#[derive(Debug, thiserror::Error)]
pub enum JobDbError {
    #[error("job database {path}: {source}")]
    Sql {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("job database {path}: {what}")]
    Invalid { path: String, what: String },
    /// This worker's claim was taken over (its lease ran out).
    #[error("job {job}: claim attempt {attempt} is no longer this job's (another worker claimed it after the lease ran out)")]
    Fenced { job: i64, attempt: i64 },
}

/// A job's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Status {
    Pending,
    /// Another job of the same cluster is running.
    Blocked,
    Processing,
    Success,
    Failed,
    Cancelled,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "Pending",
            Status::Blocked => "Blocked",
            Status::Processing => "Processing",
            Status::Success => "Success",
            Status::Failed => "Failed",
            Status::Cancelled => "Cancelled",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Status> {
        [
            Status::Pending,
            Status::Blocked,
            Status::Processing,
            Status::Success,
            Status::Failed,
            Status::Cancelled,
        ]
        .into_iter()
        .find(|x| x.as_str() == s)
    }

    /// Whether the job has ended.
    pub fn is_final(self) -> bool {
        matches!(self, Status::Success | Status::Failed | Status::Cancelled)
    }
}

/// A job to store.
#[derive(Debug, Clone)]
pub struct NewJob {
    pub cluster: String,
    /// install, ...
    pub kind: String,
    /// The cluster.yaml text, as given.
    pub config: String,
    /// The file it came from (errors name it).
    pub config_name: String,
    /// What the operation needs besides the config (JSON).
    pub options: serde_json::Value,
    /// Who wrote the config: the operator on this machine, or a request.
    pub origin: Origin,
    /// Who asked (`token:NAME#ID`, `cert:NAME`, or the local user).
    pub principal: Option<String>,
}

/// Who wrote a job's config, and so what its run may use of the worker's
/// machine: an operator's job on a SQLite database of the worker's own
/// machine may name files and variables there; a request's (the API), and
/// every job of a database other machines share, only named credentials
/// and pinned host keys.
pub use kubexm_bom::config::Origin;

fn origin_str(o: Origin) -> &'static str {
    match o {
        Origin::Operator => "operator",
        Origin::Request => "request",
    }
}

fn parse_origin(s: &str) -> Origin {
    if s == "operator" { Origin::Operator } else { Origin::Request }
}

/// A stored job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Job {
    pub id: i64,
    pub cluster: String,
    pub kind: String,
    pub status: Status,
    pub current_step: Option<String>,
    pub error: Option<String>,
    /// Milliseconds since the epoch.
    pub created: i64,
    pub started: Option<i64>,
    pub finished: Option<i64>,
    pub worker: Option<String>,
    pub attempt: i64,
    pub cancel_requested: bool,
    #[serde(skip)]
    pub config: String,
    #[serde(skip)]
    pub config_name: String,
    #[serde(skip)]
    pub options: serde_json::Value,
    #[serde(skip, default = "request")]
    pub origin: Origin,
    /// Who asked for it.
    pub principal: Option<String>,
}

fn request() -> Origin {
    Origin::Request
}

/// A row of `SELECT {COLUMNS} FROM jobs`, from either backend.
pub(crate) trait JobRow {
    type Error;
    fn text(&self, i: usize) -> Result<String, Self::Error>;
    fn maybe_text(&self, i: usize) -> Result<Option<String>, Self::Error>;
    fn int(&self, i: usize) -> Result<i64, Self::Error>;
    fn maybe_int(&self, i: usize) -> Result<Option<i64>, Self::Error>;
    fn flag(&self, i: usize) -> Result<bool, Self::Error>;
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

impl Job {
    /// A row that could not be read, listed as Failed with `why`.
    pub(crate) fn unreadable(id: i64, why: &dyn std::fmt::Display) -> Job {
        Job {
            id,
            cluster: "?".into(),
            kind: "?".into(),
            status: Status::Failed,
            current_step: None,
            error: Some(format!("this job's row cannot be read: {}", crate::text::line(&why.to_string()))),
            created: 0,
            started: None,
            finished: None,
            worker: None,
            attempt: 0,
            cancel_requested: false,
            config: String::new(),
            config_name: String::new(),
            options: serde_json::Value::Null,
            origin: Origin::Request,
            principal: None,
        }
    }

    fn from_row<R: JobRow>(r: &R) -> Result<Job, R::Error> {
        Ok(Job {
            id: r.int(0)?,
            cluster: r.text(1)?,
            kind: r.text(2)?,
            status: Status::parse(&r.text(3)?).unwrap_or(Status::Failed),
            current_step: r.maybe_text(4)?,
            error: r.maybe_text(5)?,
            created: r.int(6)?,
            started: r.maybe_int(7)?,
            finished: r.maybe_int(8)?,
            worker: r.maybe_text(9)?,
            attempt: r.int(10)?,
            cancel_requested: r.flag(11)?,
            config: r.text(12)?,
            config_name: r.text(13)?,
            options: serde_json::from_str(&r.text(14)?).unwrap_or_default(),
            origin: parse_origin(&r.text(15)?),
            principal: r.maybe_text(16)?,
        })
    }
}

/// One log line of a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogLine {
    pub seq: i64,
    /// Milliseconds since the epoch.
    pub at: i64,
    pub line: String,
}

/// A job a worker holds: its id and the claim attempt its writes name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub job: i64,
    pub attempt: i64,
}

pub struct JobDb {
    backend: Backend,
    path: String,
}

enum Backend {
    Sqlite(Mutex<Connection>),
    Postgres(pg::Pg),
}

/// Whether `db` names a PostgreSQL database rather than a SQLite file.
pub fn is_postgres(db: &Path) -> bool {
    let s = db.to_string_lossy();
    s.starts_with("postgres://") || s.starts_with("postgresql://")
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

const COLUMNS: &str = "id, cluster, kind, status, current_step, error, created, started, finished, worker, attempt, \
                       cancel_requested, config, config_name, options, origin, principal";

impl JobDb {
    /// Opens (creating and migrating) the database at `path`.
    pub fn open(path: &Path) -> Result<JobDb, JobDbError> {
        if is_postgres(path) {
            let url = path.to_string_lossy().to_string();
            return Ok(JobDb {
                backend: Backend::Postgres(pg::Pg::open(&url)?),
                path: pg::redact(&url),
            });
        }
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
        conn.busy_timeout(std::time::Duration::from_secs(10)).map_err(sql)?;
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
        Ok(JobDb {
            backend: Backend::Sqlite(Mutex::new(conn)),
            path: p,
        })
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from(&self.path)
    }

    /// Whether other machines may share this database (PostgreSQL): then
    /// every job follows a request's rules, whoever created it.
    pub fn shared(&self) -> bool {
        matches!(self.backend, Backend::Postgres(_))
    }

    /// Where the files of jobs run here go (`<dir>/<id>/`): beside a SQLite
    /// database, or `/var/lib/kubexm/jobs` for PostgreSQL.
    pub fn jobs_dir(&self) -> PathBuf {
        match &self.backend {
            Backend::Postgres(_) => PathBuf::from("/var/lib/kubexm/jobs"),
            Backend::Sqlite(_) => Path::new(&self.path)
                .parent()
                .map(|p| p.join("jobs"))
                .unwrap_or_else(|| PathBuf::from("jobs")),
        }
    }

    /// Waits up to `max` for work: a `NOTIFY` of a new job on PostgreSQL,
    /// the time itself on SQLite.
    pub fn wait_for_work(&self, max: std::time::Duration) {
        match &self.backend {
            Backend::Postgres(pg) => pg.wait_for_work(max),
            Backend::Sqlite(_) => std::thread::sleep(max),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>) -> Result<T, JobDbError> {
        let Backend::Sqlite(conn) = &self.backend else {
            return Err(JobDbError::Invalid {
                path: self.path.clone(),
                what: "not a SQLite database".into(),
            });
        };
        let mut c = conn.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut c).map_err(|source| JobDbError::Sql {
            path: self.path.clone(),
            source,
        })
    }

    /// Stores a job as Pending; returns its id.
    pub fn create(&self, job: &NewJob) -> Result<i64, JobDbError> {
        if job.config.contains('\0') || job.config_name.contains('\0') {
            return Err(JobDbError::Invalid {
                path: self.path.clone(),
                what: "the job's config holds a NUL byte; nothing was stored".into(),
            });
        }
        if let Backend::Postgres(pg) = &self.backend {
            return pg.create(job);
        }
        self.with(|c| {
            c.execute(
                "INSERT INTO jobs (cluster, kind, status, config, config_name, options, created, origin, principal) VALUES (?1, ?2, 'Pending', ?3, ?4, ?5, ?6, ?7, ?8)",
                params![job.cluster, job.kind, job.config, job.config_name, job.options.to_string(), now_ms(), origin_str(job.origin), job.principal],
            )?;
            Ok(c.last_insert_rowid())
        })
    }

    fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Job> {
        Job::from_row(r)
    }

    pub fn get(&self, id: i64) -> Result<Option<Job>, JobDbError> {
        if let Backend::Postgres(pg) = &self.backend {
            return pg.get(id);
        }
        self.with(|c| {
            c.query_row(&format!("SELECT {COLUMNS} FROM jobs WHERE id = ?1"), [id], Self::row)
                .optional()
        })
    }

    /// Every job, newest first; a row that cannot be read is listed as
    /// Failed with why (one bad row never hides the others).
    pub fn list(&self) -> Result<Vec<Job>, JobDbError> {
        if let Backend::Postgres(pg) = &self.backend {
            return pg.list();
        }
        self.with(|c| {
            let mut st = c.prepare(&format!("SELECT {COLUMNS} FROM jobs ORDER BY id DESC"))?;
            st.query_map([], |r| {
                Ok(Self::row(r).unwrap_or_else(|e| Job::unreadable(r.get(0).unwrap_or(-1), &e)))
            })?
            .collect()
        })
    }

    /// Whether the database answers a query.
    pub fn ping(&self) -> Result<(), JobDbError> {
        if let Backend::Postgres(pg) = &self.backend {
            return pg.run(async { sqlx::query("SELECT 1").execute(&pg.pool).await.map(|_| ()) });
        }
        self.with(|c| c.query_row("SELECT 1", [], |_| Ok(())))
    }

    /// A job's log lines after `after` (0: from the first), in order.
    pub fn logs(&self, job: i64, after: i64) -> Result<Vec<LogLine>, JobDbError> {
        if let Backend::Postgres(pg) = &self.backend {
            return pg.logs(job, after);
        }
        self.with(|c| {
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

    /// Asks a job to stop: one not started yet, or whose worker died, is
    /// Cancelled at once; a running one stops scheduling steps when its
    /// worker sees the request.
    /// Returns the job's status afterwards (`None`: no such job).
    pub fn request_cancel(&self, id: i64) -> Result<Option<Status>, JobDbError> {
        if let Backend::Postgres(pg) = &self.backend {
            return pg.request_cancel(id);
        }
        self.with(|c| {
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

    /// Records that `worker` on `machine` is alive (for `--detach`).
    pub fn heartbeat(&self, worker: &str, machine: &str) -> Result<(), JobDbError> {
        if let Backend::Postgres(pg) = &self.backend {
            return pg.heartbeat(worker, machine);
        }
        self.with(|c| {
            c.execute(
                "INSERT INTO workers (name, machine, seen) VALUES (?1, ?2, ?3) ON CONFLICT(name) DO UPDATE SET seen = ?3",
                params![worker, machine, now_ms()],
            )?;
            Ok(())
        })
    }

    /// Workers seen within `within_ms`.
    pub fn live_workers(&self, within_ms: i64) -> Result<Vec<String>, JobDbError> {
        if let Backend::Postgres(pg) = &self.backend {
            return pg.live_workers(within_ms);
        }
        self.with(|c| {
            let mut st = c.prepare("SELECT name FROM workers WHERE seen >= ?1 ORDER BY name")?;
            st.query_map([now_ms() - within_ms], |r| r.get(0))?.collect()
        })
    }

    pub fn forget_worker(&self, worker: &str) -> Result<(), JobDbError> {
        if let Backend::Postgres(pg) = &self.backend {
            return pg.forget_worker(worker);
        }
        self.with(|c| c.execute("DELETE FROM workers WHERE name = ?1", [worker]).map(|_| ()))
    }

    /// Claims the oldest runnable job (`only`: that job only) for `worker`
    /// on `machine`, in one transaction: Pending, or Processing with its
    /// lease run out (a dead worker's), of a cluster no other job is running
    /// and whose jobs run on this machine (or no machine yet: this one is
    /// recorded). Pending jobs of busy clusters are marked Blocked, and
    /// Blocked ones of free clusters Pending again.
    pub fn claim(&self, worker: &str, machine: &str, lease_ms: i64, only: Option<i64>) -> Result<Option<Claim>, JobDbError> {
        if let Backend::Postgres(pg) = &self.backend {
            return pg.claim(worker, machine, lease_ms, only);
        }
        self.with(|c| {
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

    /// Runs `f` on the job's row only while `claim` still holds it.
    fn fenced(&self, claim: Claim, f: impl FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<()>) -> Result<(), JobDbError> {
        let held = self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let held: bool = tx
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
        })?;
        if held {
            Ok(())
        } else {
            Err(JobDbError::Fenced {
                job: claim.job,
                attempt: claim.attempt,
            })
        }
    }

    /// Extends the lease; returns whether a cancel was asked for.
    pub fn renew(&self, claim: Claim, lease_ms: i64) -> Result<bool, JobDbError> {
        if let Backend::Postgres(pg) = &self.backend {
            return pg.renew(claim, lease_ms);
        }
        self.fenced(claim, |tx| {
            tx.execute(
                "UPDATE jobs SET lease_until = ?2 WHERE id = ?1",
                params![claim.job, now_ms() + lease_ms],
            )
            .map(|_| ())
        })?;
        Ok(self.get(claim.job)?.is_some_and(|j| j.cancel_requested))
    }

    /// Appends log lines (numbered after the job's last) and, if given, the
    /// current step.
    pub fn append(&self, claim: Claim, lines: &[String], current_step: Option<&str>) -> Result<(), JobDbError> {
        // Text from a request or a host: never a NUL or a control character,
        // and bounded (log_bounds).
        let lines: Vec<String> = lines.iter().map(|l| log_bounds::line(l)).collect();
        let lines = lines.as_slice();
        let current_step = current_step.map(crate::text::line);
        let current_step = current_step.as_deref();
        if let Backend::Postgres(pg) = &self.backend {
            return pg.append(claim, lines, current_step);
        }
        self.fenced(claim, |tx| {
            let last: i64 = tx.query_row("SELECT COALESCE(MAX(seq), 0) FROM job_logs WHERE job = ?1", [claim.job], |r| {
                r.get(0)
            })?;
            let now = now_ms();
            let mut st = tx.prepare_cached("INSERT INTO job_logs (job, seq, at, line) VALUES (?1, ?2, ?3, ?4)")?;
            for (i, l) in log_bounds::capped(last, lines).iter().enumerate() {
                st.execute(params![claim.job, last + 1 + i as i64, now, l])?;
            }
            if let Some(s) = current_step {
                tx.execute("UPDATE jobs SET current_step = ?2 WHERE id = ?1", params![claim.job, s])?;
            }
            Ok(())
        })
    }

    /// Ends the job with `status` (and `error` when it failed).
    pub fn finish(&self, claim: Claim, status: Status, error: Option<&str>) -> Result<(), JobDbError> {
        let error = error.map(crate::text::block);
        let error = error.as_deref();
        if let Backend::Postgres(pg) = &self.backend {
            return pg.finish(claim, status, error);
        }
        self.fenced(claim, |tx| {
            tx.execute(
                "UPDATE jobs SET status = ?2, error = ?3, finished = ?4, lease_until = NULL,
                   current_step = CASE WHEN ?2 = 'Success' THEN NULL ELSE current_step END WHERE id = ?1",
                params![claim.job, status.as_str(), error, now_ms()],
            )
            .map(|_| ())
        })
    }

    /// A new API token named `name` with the scopes tokens had before
    /// scopes existed (`read,create`), never expiring; shown once.
    pub fn create_token(&self, name: &str) -> Result<String, JobDbError> {
        self.create_token_scoped(name, &[Scope::Read, Scope::Create], None)
    }

    /// Gives a job back unfinished (Ctrl-C of a foreground run): Pending
    /// again, so the next claim resumes it and skips the steps done.
    pub fn release(&self, claim: Claim) -> Result<(), JobDbError> {
        if let Backend::Postgres(pg) = &self.backend {
            return pg.release(claim);
        }
        self.fenced(claim, |tx| {
            tx.execute(
                "UPDATE jobs SET status = 'Pending', lease_until = NULL, worker = NULL WHERE id = ?1",
                [claim.job],
            )
            .map(|_| ())
        })
    }
}
