//! The state database: jobs, step results with timings and logs, and pinned
//! host keys. Embedded SQLite in WAL mode, so a crash loses at most the step
//! in flight and a re-run knows what was done. Secrets are redacted from
//! every log, and the log bounded ([`STEP_LOG_KEEP`]), before it is stored.

use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, params};

use crate::ssh::KnownHosts;

/// Why the state store failed: its SQLite database, or (for a store kept
/// elsewhere, such as the controller's journal) the place named.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state database {path}: {source}")]
    Sqlite {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("{place}: {message}")]
    Elsewhere { place: String, message: String },
}

impl StateError {
    /// An error of a store kept elsewhere than SQLite: `place` names it
    /// (an object, a file), `message` says why and what to do.
    pub fn elsewhere(place: &str, message: &str) -> StateError {
        StateError::Elsewhere {
            place: place.to_string(),
            message: message.to_string(),
        }
    }
}

/// How a step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Its check did not hold; it was applied.
    Applied,
    /// Its check held (or it was done in an earlier run); nothing was changed.
    Skipped,
    Failed,
    /// Not started: an earlier failure stopped it.
    NotRun,
}

impl Outcome {
    /// The outcome [`Outcome::as_str`] names.
    pub fn named(name: &str) -> Option<Outcome> {
        [Outcome::Applied, Outcome::Skipped, Outcome::Failed, Outcome::NotRun]
            .into_iter()
            .find(|o| o.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Applied => "applied",
            Outcome::Skipped => "skipped",
            Outcome::Failed => "failed",
            Outcome::NotRun => "not-run",
        }
    }
}

/// A step's result, to record.
pub struct Record<'a> {
    pub node: &'a str,
    pub module: &'a str,
    pub host: &'a str,
    pub outcome: Outcome,
    /// Milliseconds since the epoch: when everything it depends on was
    /// done (it may start later, when its host is free), and when it started.
    pub ready: i64,
    pub started: i64,
    pub duration_ms: i64,
    /// The node whose end made it ready (none for a node ready at the start).
    pub after: Option<&'a str>,
    /// What it waited for, when it is a wait (a poll until something is ready).
    pub waits: Option<&'a str>,
    pub log: &'a str,
}

/// A stretch of a job outside the engine's steps (verify, unpack, serve,
/// connect, facts, preflight: the preamble before the first step).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Span {
    pub name: String,
    /// Milliseconds since the epoch.
    pub started: i64,
    pub duration_ms: i64,
}

impl Span {
    /// A span from `started` (milliseconds since the epoch) until now.
    pub fn since(name: &str, started: i64) -> Span {
        Span {
            name: name.into(),
            started,
            duration_ms: now_ms() - started,
        }
    }
}

/// One recorded step (as the journal keeps it, too: [`crate::journal`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepRecord {
    pub node: String,
    pub module: String,
    pub host: String,
    pub status: String,
    /// Milliseconds since the epoch (0: recorded by a kubexm before timelines).
    pub ready: i64,
    pub started: i64,
    pub duration_ms: i64,
    pub after: Option<String>,
    pub waits: Option<String>,
    pub log: String,
}

/// A job as `status` shows it (and the journal keeps it).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobRecord {
    pub id: i64,
    pub cluster: String,
    pub kind: String,
    pub started: i64,
    /// Milliseconds since the epoch, once it ended.
    pub finished: Option<i64>,
    pub status: String,
}

/// Bytes kept of one step's log (head and tail, the rest counted): room for
/// one command's bounded stdout and stderr, so those are not cut twice.
pub const STEP_LOG_KEEP: usize = 2 * crate::output::KEEP + 4096;

pub struct State {
    conn: Mutex<Connection>,
    path: String,
    secrets: Vec<String>,
}

/// Milliseconds since the epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Makes `path` (the database) readable by its owner only before SQLite
/// opens it: step logs and pinned host keys are for the operator. Missing
/// directories are created 0711 (others may pass through to what lies
/// below, such as the registry's unpacked bundle, but not list them); an
/// existing database and its `-wal` and `-shm` files from an earlier
/// kubexm are made 0600. SQLite gives the
/// sidecars it creates the database's own mode.
fn private_file(path: &Path) {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
        let _ = std::fs::DirBuilder::new().recursive(true).mode(0o711).create(dir);
    }
    if !path.exists() {
        let _ = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path);
    }
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        if let Ok(m) = std::fs::metadata(&p)
            && m.permissions().mode() & 0o077 != 0
        {
            let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600));
        }
    }
}

/// The step columns a timeline needs, added to a database of a kubexm
/// before timelines (its steps read back with `ready` 0).
fn add_timing_columns(conn: &Connection) -> rusqlite::Result<()> {
    let has: bool = conn.query_row("SELECT COUNT(*) FROM pragma_table_info('steps') WHERE name = 'ready'", [], |r| {
        r.get::<_, i64>(0).map(|n| n > 0)
    })?;
    if !has {
        conn.execute_batch(
            "BEGIN;
             ALTER TABLE steps ADD COLUMN ready INTEGER NOT NULL DEFAULT 0;
             ALTER TABLE steps ADD COLUMN after TEXT;
             ALTER TABLE steps ADD COLUMN waits TEXT;
             COMMIT;",
        )?;
    }
    Ok(())
}

/// A `jobs` row of `SELECT id, cluster, kind, started, finished, status`.
fn job_row(r: &rusqlite::Row) -> rusqlite::Result<JobRecord> {
    Ok(JobRecord {
        id: r.get(0)?,
        cluster: r.get(1)?,
        kind: r.get(2)?,
        started: r.get(3)?,
        finished: r.get(4)?,
        status: r.get(5)?,
    })
}

/// What [`State::done_nodes`] and [`State::done_steps`] read: steps
/// completed by jobs of the cluster before job `?2` of operation `?3`, after
/// the cluster's last successful reset. An `apply` runs the install's
/// steps: the two are one operation here.
const DONE_STEPS: &str = "SELECT DISTINCT s.node FROM steps s JOIN jobs j ON j.id = s.job \
     WHERE j.cluster = ?1 AND j.id < ?2 \
     AND (CASE j.kind WHEN 'apply' THEN 'install' ELSE j.kind END) = (CASE ?3 WHEN 'apply' THEN 'install' ELSE ?3 END) \
     AND j.id > COALESCE((SELECT MAX(id) FROM jobs WHERE cluster = ?1 AND kind IN ('reset', 'delete-cluster') AND status = 'succeeded' AND id < ?2), 0) \
     AND s.status IN ('applied', 'skipped') \
     AND ?3 NOT IN ('remove-node', 'certs-check', 'certs-renew', 'etcd-restore') \
     AND NOT EXISTS (SELECT 1 FROM removed_hosts x WHERE x.cluster = ?1 AND x.host = s.host AND x.job >= j.id AND x.job < ?2)";

impl State {
    /// Opens (creating if needed) the database at `path`; `secrets` are redacted from logs.
    pub fn open(path: &Path, secrets: Vec<String>) -> Result<State, StateError> {
        let p = path.display().to_string();
        let err = |source| StateError::Sqlite { path: p.clone(), source };
        private_file(path);
        let conn = Connection::open(path).map_err(err)?;
        conn.execute_batch(
            "PRAGMA journal_mode=WAL;
             PRAGMA synchronous=NORMAL;
             PRAGMA busy_timeout=5000;
             CREATE TABLE IF NOT EXISTS jobs(id INTEGER PRIMARY KEY, cluster TEXT NOT NULL, kind TEXT NOT NULL, started INTEGER NOT NULL, finished INTEGER, status TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS steps(job INTEGER NOT NULL, node TEXT NOT NULL, module TEXT NOT NULL, host TEXT NOT NULL, status TEXT NOT NULL,
                 started INTEGER NOT NULL, duration_ms INTEGER NOT NULL, log TEXT NOT NULL, PRIMARY KEY(job, node));
             CREATE INDEX IF NOT EXISTS steps_node ON steps(node, status);
             CREATE TABLE IF NOT EXISTS spans(job INTEGER NOT NULL, name TEXT NOT NULL, started INTEGER NOT NULL, duration_ms INTEGER NOT NULL, PRIMARY KEY(job, name));
             CREATE TABLE IF NOT EXISTS known_hosts(endpoint TEXT PRIMARY KEY, key TEXT NOT NULL, first_seen INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS records(job INTEGER PRIMARY KEY, cluster TEXT NOT NULL, status TEXT NOT NULL, body TEXT NOT NULL);
             CREATE INDEX IF NOT EXISTS records_cluster ON records(cluster, job);
             CREATE TABLE IF NOT EXISTS removed_hosts(job INTEGER NOT NULL, cluster TEXT NOT NULL, host TEXT NOT NULL, PRIMARY KEY(job, host));",
        )
        .map_err(err)?;
        add_timing_columns(&conn).map_err(err)?;
        let secrets = secrets.into_iter().filter(|s| s.len() >= 4).collect();
        Ok(State {
            conn: Mutex::new(conn),
            path: p,
            secrets,
        })
    }

    fn err(&self, source: rusqlite::Error) -> StateError {
        StateError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Removes every secret from a log.
    pub fn redact(&self, log: &str) -> String {
        self.secrets
            .iter()
            .fold(log.to_string(), |l, s| l.replace(s.as_str(), "<redacted>"))
    }

    pub fn begin_job(&self, cluster: &str, kind: &str) -> Result<i64, StateError> {
        let c = self.conn();
        c.execute(
            "INSERT INTO jobs(cluster, kind, started, status) VALUES (?1, ?2, ?3, 'running')",
            params![cluster, kind, now_ms()],
        )
        .map_err(|e| self.err(e))?;
        Ok(c.last_insert_rowid())
    }

    /// Writes `job` as it is (its id, times and status), replacing the
    /// row of that id: a journal kept elsewhere read back.
    pub fn restore_job(&self, job: &JobRecord) -> Result<(), StateError> {
        self.conn()
            .execute(
                "INSERT OR REPLACE INTO jobs(id, cluster, kind, started, finished, status) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![job.id, job.cluster, job.kind, job.started, job.finished, job.status],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    pub fn finish_job(&self, job: i64, status: &str) -> Result<(), StateError> {
        self.conn()
            .execute(
                "UPDATE jobs SET finished = ?1, status = ?2 WHERE id = ?3",
                params![now_ms(), status, job],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Records a step's result (replacing an earlier one of the same job).
    pub fn record(&self, job: i64, r: &Record) -> Result<(), StateError> {
        self.record_many(job, std::slice::from_ref(r))
    }

    /// Records several results in one transaction: results that finished
    /// together are written together, before anything depending on them starts.
    pub fn record_many(&self, job: i64, records: &[Record]) -> Result<(), StateError> {
        let mut c = self.conn();
        let tx = c.transaction().map_err(|e| self.err(e))?;
        {
            let mut stmt = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO steps(job, node, module, host, status, ready, started, duration_ms, after, waits, log) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                )
                .map_err(|e| self.err(e))?;
            for r in records {
                let log = self.redact(r.log);
                let log = crate::output::bound(&log, STEP_LOG_KEEP);
                stmt.execute(params![
                    job,
                    r.node,
                    r.module,
                    r.host,
                    r.outcome.as_str(),
                    r.ready,
                    r.started,
                    r.duration_ms,
                    r.after,
                    r.waits,
                    log
                ])
                .map_err(|e| self.err(e))?;
            }
        }
        tx.commit().map_err(|e| self.err(e))
    }

    /// Records the stretches of a job outside its steps (replacing earlier
    /// ones of the same name).
    pub fn record_spans(&self, job: i64, spans: &[Span]) -> Result<(), StateError> {
        let mut c = self.conn();
        let tx = c.transaction().map_err(|e| self.err(e))?;
        {
            let mut stmt = tx
                .prepare_cached("INSERT OR REPLACE INTO spans(job, name, started, duration_ms) VALUES (?1, ?2, ?3, ?4)")
                .map_err(|e| self.err(e))?;
            for s in spans {
                stmt.execute(params![job, s.name, s.started, s.duration_ms])
                    .map_err(|e| self.err(e))?;
            }
        }
        tx.commit().map_err(|e| self.err(e))
    }

    /// A job's spans, in order.
    pub fn spans(&self, job: i64) -> Result<Vec<Span>, StateError> {
        let c = self.conn();
        let mut stmt = c
            .prepare("SELECT name, started, duration_ms FROM spans WHERE job = ?1 ORDER BY started, name")
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(params![job], |r| {
                Ok(Span {
                    name: r.get(0)?,
                    started: r.get(1)?,
                    duration_ms: r.get(2)?,
                })
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }

    /// Every node an earlier job of the same operation as `job` (its kind)
    /// completed on this cluster since the cluster's last successful reset:
    /// a later operation's steps with the same id are not masked by an
    /// install's, and install, reset, install runs every step again.
    pub fn done_nodes(&self, cluster: &str, job: i64) -> Result<std::collections::HashSet<String>, StateError> {
        let kind: Option<String> = self
            .conn()
            .query_row("SELECT kind FROM jobs WHERE id = ?1", params![job], |r| r.get(0))
            .optional()
            .map_err(|e| self.err(e))?;
        match kind {
            Some(kind) => self.done_before(cluster, job, &kind),
            None => Ok(Default::default()),
        }
    }

    /// Every step a job of operation `kind` on `cluster` would skip if it
    /// started now (what a dry run leaves out of its plan).
    pub fn done_steps(&self, cluster: &str, kind: &str) -> Result<std::collections::HashSet<String>, StateError> {
        self.done_before(cluster, i64::MAX, kind)
    }

    fn done_before(&self, cluster: &str, job: i64, kind: &str) -> Result<std::collections::HashSet<String>, StateError> {
        let c = self.conn();
        let mut stmt = c.prepare_cached(DONE_STEPS).map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(params![cluster, job, kind], |r| r.get::<_, String>(0))
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }

    /// The latest successful install (or apply, or upgrade) of `cluster`
    /// since its last successful reset, if any.
    pub fn installed(&self, cluster: &str) -> Result<Option<JobRecord>, StateError> {
        self.conn()
            .query_row(
                "SELECT id, cluster, kind, started, finished, status FROM jobs \
                 WHERE cluster = ?1 AND kind IN ('install', 'apply', 'upgrade') AND status = 'succeeded' \
                 AND id > COALESCE((SELECT MAX(id) FROM jobs WHERE cluster = ?1 AND kind IN ('reset', 'delete-cluster') AND status = 'succeeded'), 0) \
                 ORDER BY id DESC LIMIT 1",
                params![cluster],
                job_row,
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    /// Keeps `body` (a cluster record, JSON the engine does not read) as
    /// what `job` left `cluster` as, with the job's `status`.
    pub fn put_record(&self, job: i64, cluster: &str, status: &str, body: &str) -> Result<(), StateError> {
        self.conn()
            .execute(
                "INSERT OR REPLACE INTO records(job, cluster, status, body) VALUES (?1, ?2, ?3, ?4)",
                params![job, cluster, status, body],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Notes that `job` took `hosts` out of `cluster`: what earlier jobs
    /// did on them is no longer done (a host added again gets every step).
    pub fn put_removed(&self, job: i64, cluster: &str, hosts: &[String]) -> Result<(), StateError> {
        let c = self.conn();
        for h in hosts {
            c.execute(
                "INSERT OR REPLACE INTO removed_hosts(job, cluster, host) VALUES (?1, ?2, ?3)",
                params![job, cluster, h],
            )
            .map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    /// Forgets `cluster`'s records (after `delete cluster`): no status, no
    /// apply, until it is installed again. Its jobs stay, as history.
    pub fn forget_cluster(&self, cluster: &str) -> Result<(), StateError> {
        let c = self.conn();
        for table in ["records", "removed_hosts"] {
            c.execute(&format!("DELETE FROM {table} WHERE cluster = ?1"), params![cluster])
                .map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    /// The latest record of `cluster` (of a succeeded job only, when
    /// `succeeded`): its job and body.
    pub fn last_record(&self, cluster: &str, succeeded: bool) -> Result<Option<(i64, String)>, StateError> {
        let q = if succeeded {
            "SELECT job, body FROM records WHERE cluster = ?1 AND status = 'succeeded' ORDER BY job DESC LIMIT 1"
        } else {
            "SELECT job, body FROM records WHERE cluster = ?1 ORDER BY job DESC LIMIT 1"
        };
        self.conn()
            .query_row(q, params![cluster], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()
            .map_err(|e| self.err(e))
    }

    /// The names of the clusters with a record.
    pub fn recorded_clusters(&self) -> Result<Vec<String>, StateError> {
        let c = self.conn();
        let mut stmt = c
            .prepare("SELECT DISTINCT cluster FROM records ORDER BY cluster")
            .map_err(|e| self.err(e))?;
        let rows = stmt.query_map([], |r| r.get::<_, String>(0)).map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }

    /// Forgets every record of `cluster` (its jobs and steps stay).
    pub fn forget_records(&self, cluster: &str) -> Result<(), StateError> {
        self.conn()
            .execute("DELETE FROM records WHERE cluster = ?1", params![cluster])
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    pub fn job(&self, id: Option<i64>) -> Result<Option<JobRecord>, StateError> {
        let c = self.conn();
        let row = job_row;
        let q = match id {
            Some(id) => c.query_row(
                "SELECT id, cluster, kind, started, finished, status FROM jobs WHERE id = ?1",
                params![id],
                row,
            ),
            None => c.query_row(
                "SELECT id, cluster, kind, started, finished, status FROM jobs ORDER BY id DESC LIMIT 1",
                [],
                row,
            ),
        };
        q.optional().map_err(|e| self.err(e))
    }

    /// The latest job of `kind` for `cluster`, whatever its status (a job
    /// killed mid-run stays `running`).
    pub fn last_job(&self, cluster: &str, kind: &str) -> Result<Option<JobRecord>, StateError> {
        self.conn()
            .query_row(
                "SELECT id, cluster, kind, started, finished, status FROM jobs WHERE cluster = ?1 AND kind = ?2 ORDER BY id DESC LIMIT 1",
                params![cluster, kind],
                job_row,
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    /// Every pinned host key, by endpoint.
    pub fn pins(&self) -> Result<Vec<(String, String)>, StateError> {
        let c = self.conn();
        let mut stmt = c
            .prepare("SELECT endpoint, key FROM known_hosts ORDER BY endpoint")
            .map_err(|e| self.err(e))?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }

    /// `cluster`'s jobs since its last successful reset (or delete), in order.
    pub fn jobs_since_reset(&self, cluster: &str) -> Result<Vec<JobRecord>, StateError> {
        let c = self.conn();
        let mut stmt = c
            .prepare(
                "SELECT id, cluster, kind, started, finished, status FROM jobs WHERE cluster = ?1 \
                 AND id > COALESCE((SELECT MAX(id) FROM jobs WHERE cluster = ?1 AND kind IN ('reset', 'delete-cluster') AND status = 'succeeded'), 0) \
                 ORDER BY id",
            )
            .map_err(|e| self.err(e))?;
        let rows = stmt.query_map(params![cluster], job_row).map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }

    /// The hosts `job` took out of its cluster.
    pub fn removed_by(&self, job: i64) -> Result<Vec<String>, StateError> {
        let c = self.conn();
        let mut stmt = c
            .prepare("SELECT host FROM removed_hosts WHERE job = ?1 ORDER BY host")
            .map_err(|e| self.err(e))?;
        let rows = stmt.query_map(params![job], |r| r.get(0)).map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }

    pub fn steps(&self, job: i64) -> Result<Vec<StepRecord>, StateError> {
        self.read_steps(job, "log")
    }

    /// A job's step results without their logs (a timeline's input).
    pub fn step_times(&self, job: i64) -> Result<Vec<StepRecord>, StateError> {
        self.read_steps(job, "''")
    }

    /// A job's step results, `log` the column (or empty text) read as the log.
    fn read_steps(&self, job: i64, log: &str) -> Result<Vec<StepRecord>, StateError> {
        let c = self.conn();
        let mut stmt = c
            .prepare(&format!(
                "SELECT node, module, host, status, ready, started, duration_ms, after, waits, {log} FROM steps WHERE job = ?1 ORDER BY started, node"
            ))
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map(params![job], |r| {
                Ok(StepRecord {
                    node: r.get(0)?,
                    module: r.get(1)?,
                    host: r.get(2)?,
                    status: r.get(3)?,
                    ready: r.get(4)?,
                    started: r.get(5)?,
                    duration_ms: r.get(6)?,
                    after: r.get(7)?,
                    waits: r.get(8)?,
                    log: r.get(9)?,
                })
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }
}

impl KnownHosts for State {
    fn get(&self, endpoint: &str) -> Option<String> {
        self.conn()
            .query_row("SELECT key FROM known_hosts WHERE endpoint = ?1", params![endpoint], |r| r.get(0))
            .optional()
            .ok()
            .flatten()
    }

    fn put(&self, endpoint: &str, key: &str) {
        let _ = self.conn().execute(
            "INSERT INTO known_hosts(endpoint, key, first_seen) VALUES (?1, ?2, ?3) ON CONFLICT(endpoint) DO UPDATE SET key = excluded.key",
            params![endpoint, key, now_ms()],
        );
    }
}
