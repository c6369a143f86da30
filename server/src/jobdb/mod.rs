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
//!
//! [`JobDb`] is a thin handle over one async [`Backend`]: [`sqlite`] runs
//! its blocking calls on tokio's blocking threads, [`pg`] is sqlx on the
//! caller's runtime. What both run as written (tokens, audit, credentials,
//! host keys, workers) is SQL text in `$1` form through
//! [`Backend::execute`] and [`Backend::query`]; what differs (claims,
//! fencing, the Blocked status) is a method of each backend.

pub mod log_bounds;
mod pg;
mod principals;
mod sql;
mod sqlite;
mod timelines;
mod trust;
pub mod writer;

pub use principals::{AuditRow, Scope, TokenRow};

pub use trust::{CredentialKind, CredentialRow, HostKeyRow};

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use sql::{Cell, Param};

/// Where the job database lives unless told otherwise.
pub const JOBS_DB: &str = "/var/lib/kubexm/jobs.db";

/// The schema, one migration per version (`PRAGMA user_version`).
pub(crate) const MIGRATIONS: &[&str] = &[
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
    // 4: a job's options are its typed request (`job_request`).
    REQUESTS,
    // 5: a job's timeline (`timelines`).
    timelines::MIGRATION_SQLITE,
];

/// Migration 4 (SQLite): job options of the version before rewritten as
/// requests. An API install's `{"bundle_digest": D}` becomes `{"bundle": D}`;
/// the operator's install flags move under `local` (those jobs named no
/// bundle digest: one still pending fails, saying to create it again); a
/// reset's `root` moves under `local`.
const REQUESTS: &str = "UPDATE jobs SET options = json_object('bundle', json_extract(options, '$.bundle_digest'))
        WHERE kind = 'install' AND json_valid(options) AND json_type(options, '$.bundle_digest') = 'text';
    UPDATE jobs SET options = json_object('phases', json(coalesce(json_extract(options, '$.phases'), '[]')), 'local', json(options))
        WHERE kind = 'install' AND json_valid(options) AND json_type(options, '$.advertise') IS NOT NULL;
    UPDATE jobs SET options = json_object('local', json_object('root', json_extract(options, '$.root')))
        WHERE kind = 'reset' AND json_valid(options) AND json_type(options, '$.root') = 'text';
    UPDATE jobs SET options = '{}'
        WHERE kind = 'reset' AND json_valid(options) AND json_type(options, '$.root') = 'null';";

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

pub(crate) fn origin_str(o: Origin) -> &'static str {
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

    pub(crate) fn from_row<R: JobRow>(r: &R) -> Result<Job, R::Error> {
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

/// A backend call's future: boxed, so [`Backend`] stays object safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A backend call's result.
pub(crate) type Res<'a, T> = BoxFuture<'a, Result<T, JobDbError>>;

/// Where jobs are stored: SQLite ([`sqlite`]) or PostgreSQL ([`pg`]). Text
/// from requests and hosts arrives here already bounded and escaped.
pub(crate) trait Backend: Send + Sync {
    /// Whether other machines may share the database.
    fn shared(&self) -> bool;
    /// Where the files of jobs run here go.
    fn jobs_dir(&self) -> PathBuf;
    /// Waits up to `max` for a new or given-back job.
    fn wait_for_work(&self, max: Duration) -> BoxFuture<'_, ()>;
    /// Runs one statement of SQL both backends share (`$1`, `$2`, ...);
    /// the rows it changed.
    fn execute<'a>(&'a self, sql: &'a str, params: Vec<Param>) -> Res<'a, u64>;
    /// Runs statements of shared SQL in one transaction; the rows each changed.
    fn execute_all(&self, statements: Vec<(String, Vec<Param>)>) -> Res<'_, Vec<u64>>;
    /// The rows of one query of shared SQL.
    fn query<'a>(&'a self, sql: &'a str, params: Vec<Param>) -> Res<'a, Vec<Vec<Cell>>>;
    fn create<'a>(&'a self, job: &'a NewJob) -> Res<'a, i64>;
    fn get(&self, id: i64) -> Res<'_, Option<Job>>;
    fn list(&self) -> Res<'_, Vec<Job>>;
    fn logs(&self, job: i64, after: i64) -> Res<'_, Vec<LogLine>>;
    fn request_cancel(&self, id: i64) -> Res<'_, Option<Status>>;
    fn claim<'a>(&'a self, worker: &'a str, machine: &'a str, lease_ms: i64, only: Option<i64>) -> Res<'a, Option<Claim>>;
    /// Extends the lease; whether a cancel was asked for.
    fn renew(&self, claim: Claim, lease_ms: i64) -> Res<'_, bool>;
    fn append<'a>(&'a self, claim: Claim, lines: &'a [String], current_step: Option<&'a str>) -> Res<'a, ()>;
    fn finish<'a>(&'a self, claim: Claim, status: Status, error: Option<&'a str>) -> Res<'a, ()>;
    fn release(&self, claim: Claim) -> Res<'_, ()>;
}

/// The job database: a handle over its backend, cheap to clone.
#[derive(Clone)]
pub struct JobDb {
    backend: Arc<dyn Backend>,
    /// The file, or the URL without its password, for messages.
    path: String,
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

impl JobDb {
    /// Opens (creating and migrating) the database at `path`.
    pub async fn open(path: &Path) -> Result<JobDb, JobDbError> {
        if is_postgres(path) {
            let url = path.to_string_lossy().to_string();
            return Ok(JobDb {
                backend: Arc::new(pg::Pg::open(&url).await?),
                path: pg::redact(&url),
            });
        }
        Ok(JobDb {
            backend: Arc::new(sqlite::Sqlite::open(path).await?),
            path: path.display().to_string(),
        })
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from(&self.path)
    }

    /// Whether other machines may share this database (PostgreSQL): then
    /// every job follows a request's rules, whoever created it.
    pub fn shared(&self) -> bool {
        self.backend.shared()
    }

    /// Where the files of jobs run here go (`<dir>/<id>/`): beside a SQLite
    /// database, or `/var/lib/kubexm/jobs` for PostgreSQL.
    pub fn jobs_dir(&self) -> PathBuf {
        self.backend.jobs_dir()
    }

    /// Waits up to `max` for work: a `NOTIFY` of a new job on PostgreSQL,
    /// the time itself on SQLite.
    pub async fn wait_for_work(&self, max: Duration) {
        self.backend.wait_for_work(max).await
    }

    /// An error of this database saying `what`.
    fn invalid(&self, what: impl std::fmt::Display) -> JobDbError {
        JobDbError::Invalid {
            path: self.path.clone(),
            what: what.to_string(),
        }
    }

    /// Stores a job as Pending; returns its id.
    pub async fn create(&self, job: &NewJob) -> Result<i64, JobDbError> {
        if job.config.contains('\0') || job.config_name.contains('\0') {
            return Err(self.invalid("the job's config holds a NUL byte; nothing was stored"));
        }
        self.backend.create(job).await
    }

    pub async fn get(&self, id: i64) -> Result<Option<Job>, JobDbError> {
        self.backend.get(id).await
    }

    /// Every job, newest first; a row that cannot be read is listed as
    /// Failed with why (one bad row never hides the others).
    pub async fn list(&self) -> Result<Vec<Job>, JobDbError> {
        self.backend.list().await
    }

    /// Whether the database answers a query.
    pub async fn ping(&self) -> Result<(), JobDbError> {
        self.backend.query("SELECT 1", Vec::new()).await.map(|_| ())
    }

    /// A job's log lines after `after` (0: from the first), in order.
    pub async fn logs(&self, job: i64, after: i64) -> Result<Vec<LogLine>, JobDbError> {
        self.backend.logs(job, after).await
    }

    /// Asks a job to stop: one not started yet, or whose worker died, is
    /// Cancelled at once; a running one stops scheduling steps when its
    /// worker sees the request.
    /// Returns the job's status afterwards (`None`: no such job).
    pub async fn request_cancel(&self, id: i64) -> Result<Option<Status>, JobDbError> {
        self.backend.request_cancel(id).await
    }

    /// Records that `worker` on `machine` is alive (for `--detach`).
    pub async fn heartbeat(&self, worker: &str, machine: &str) -> Result<(), JobDbError> {
        let sql = "INSERT INTO workers (name, machine, seen) VALUES ($1, $2, $3) ON CONFLICT (name) DO UPDATE SET seen = excluded.seen";
        let params = vec![worker.into(), machine.into(), now_ms().into()];
        self.backend.execute(sql, params).await.map(|_| ())
    }

    /// Workers seen within `within_ms`.
    pub async fn live_workers(&self, within_ms: i64) -> Result<Vec<String>, JobDbError> {
        let sql = "SELECT name FROM workers WHERE seen >= $1 ORDER BY name";
        let rows = self.backend.query(sql, vec![(now_ms() - within_ms).into()]).await?;
        rows.iter().map(|r| self.text(r, 0)).collect()
    }

    pub async fn forget_worker(&self, worker: &str) -> Result<(), JobDbError> {
        let sql = "DELETE FROM workers WHERE name = $1";
        self.backend.execute(sql, vec![worker.into()]).await.map(|_| ())
    }

    /// Claims the oldest runnable job (`only`: that job only) for `worker`
    /// on `machine`, in one transaction: Pending, or Processing with its
    /// lease run out (a dead worker's), of a cluster no other job is running
    /// and whose jobs run on this machine (or no machine yet: this one is
    /// recorded). Pending jobs of busy clusters are marked Blocked, and
    /// Blocked ones of free clusters Pending again.
    pub async fn claim(&self, worker: &str, machine: &str, lease_ms: i64, only: Option<i64>) -> Result<Option<Claim>, JobDbError> {
        self.backend.claim(worker, machine, lease_ms, only).await
    }

    /// Extends the lease; returns whether a cancel was asked for.
    pub async fn renew(&self, claim: Claim, lease_ms: i64) -> Result<bool, JobDbError> {
        self.backend.renew(claim, lease_ms).await
    }

    /// Appends log lines (numbered after the job's last) and, if given, the
    /// current step.
    pub async fn append(&self, claim: Claim, lines: &[String], current_step: Option<&str>) -> Result<(), JobDbError> {
        // Text from a request or a host: never a NUL or a control character,
        // and bounded (log_bounds).
        let lines: Vec<String> = lines.iter().map(|l| log_bounds::line(l)).collect();
        let current_step = current_step.map(crate::text::line);
        self.backend.append(claim, &lines, current_step.as_deref()).await
    }

    /// Ends the job with `status` (and `error` when it failed).
    pub async fn finish(&self, claim: Claim, status: Status, error: Option<&str>) -> Result<(), JobDbError> {
        let error = error.map(crate::text::block);
        self.backend.finish(claim, status, error.as_deref()).await
    }

    /// A new API token named `name` with the scopes tokens had before
    /// scopes existed (`read,create`), never expiring; shown once.
    pub async fn create_token(&self, name: &str) -> Result<String, JobDbError> {
        self.create_token_scoped(name, &[Scope::Read, Scope::Create], None).await
    }

    /// Gives a job back unfinished (Ctrl-C of a foreground run): Pending
    /// again, so the next claim resumes it and skips the steps done.
    pub async fn release(&self, claim: Claim) -> Result<(), JobDbError> {
        self.backend.release(claim).await
    }

    /// Column `i` of `row` as text.
    fn text(&self, row: &[Cell], i: usize) -> Result<String, JobDbError> {
        sql::text(row, i).map_err(|e| self.invalid(e))
    }
}
