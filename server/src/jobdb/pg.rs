//! The job database on PostgreSQL, for workers on several machines: the
//! same tables and rules as the SQLite one. A claim takes the oldest
//! runnable job with `FOR UPDATE SKIP LOCKED` (workers never wait on each
//! other's candidate rows) and a transaction-scoped advisory lock on its
//! cluster (two jobs of one cluster are never claimed at once); a waiting
//! job of a busy cluster reads as Blocked. A new, ended or given-back job
//! is announced with `NOTIFY kubexm_jobs`, which idle workers `LISTEN` for.
//! Migrations run under an advisory lock: concurrent starts migrate once.
//! Every call is plain sqlx on the caller's runtime.

use std::path::PathBuf;
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool, PgPoolOptions, PgRow};
use sqlx::{Executor, Postgres, Row, Transaction, TypeInfo, ValueRef};

use super::sql::{Cell, Param};
use super::{Backend, BoxFuture, Claim, Job, JobDbError, JobRow, LogLine, NewJob, Res, Status, now_ms};

/// The schema, one migration per version (table `kubexm_schema`).
const MIGRATIONS: &[&str] = &[
    "CREATE TABLE jobs (
        id BIGSERIAL PRIMARY KEY,
        cluster TEXT NOT NULL,
        kind TEXT NOT NULL,
        status TEXT NOT NULL,
        config TEXT NOT NULL,
        config_name TEXT NOT NULL,
        options TEXT NOT NULL,
        created BIGINT NOT NULL,
        started BIGINT,
        finished BIGINT,
        current_step TEXT,
        error TEXT,
        worker TEXT,
        attempt BIGINT NOT NULL DEFAULT 0,
        lease_until BIGINT,
        cancel_requested BOOLEAN NOT NULL DEFAULT FALSE
    );
    CREATE INDEX jobs_status ON jobs(status, id);
    CREATE INDEX jobs_cluster ON jobs(cluster, status);
    CREATE TABLE job_logs (
        job BIGINT NOT NULL REFERENCES jobs(id),
        seq BIGINT NOT NULL,
        at BIGINT NOT NULL,
        line TEXT NOT NULL,
        PRIMARY KEY (job, seq)
    );
    CREATE TABLE clusters (name TEXT PRIMARY KEY, machine TEXT NOT NULL);
    CREATE TABLE workers (name TEXT PRIMARY KEY, machine TEXT NOT NULL, seen BIGINT NOT NULL);
    CREATE TABLE tokens (
        id BIGSERIAL PRIMARY KEY,
        name TEXT NOT NULL,
        sha256 TEXT NOT NULL UNIQUE,
        created BIGINT NOT NULL
    );",
    super::trust::MIGRATION_PG,
    // 3: a job's options are its typed request, as SQLite's migration 4.
    REQUESTS,
    // 4: a job's timeline.
    super::timelines::MIGRATION_PG,
];

/// Job options of the version before rewritten as requests (see SQLite's
/// migration 4 in `jobdb/mod.rs`); a row whose options are not JSON is left
/// as it is (listed with its error, as SQLite's `json_valid` leaves it).
const REQUESTS: &str = "CREATE FUNCTION pg_temp.kubexm_options(t text) RETURNS jsonb LANGUAGE plpgsql AS $$
        BEGIN RETURN t::jsonb; EXCEPTION WHEN others THEN RETURN NULL; END $$;
    UPDATE jobs SET options = jsonb_build_object('bundle', pg_temp.kubexm_options(options)->>'bundle_digest')::text
        WHERE kind = 'install' AND jsonb_typeof(pg_temp.kubexm_options(options)->'bundle_digest') = 'string';
    UPDATE jobs SET options = jsonb_build_object('phases', coalesce(pg_temp.kubexm_options(options)->'phases', '[]'::jsonb),
            'local', pg_temp.kubexm_options(options))::text
        WHERE kind = 'install' AND jsonb_exists(pg_temp.kubexm_options(options), 'advertise');
    UPDATE jobs SET options = jsonb_build_object('local', jsonb_build_object('root', pg_temp.kubexm_options(options)->'root'))::text
        WHERE kind = 'reset' AND jsonb_typeof(pg_temp.kubexm_options(options)->'root') = 'string';
    UPDATE jobs SET options = '{}'
        WHERE kind = 'reset' AND jsonb_typeof(pg_temp.kubexm_options(options)->'root') = 'null';
    DROP FUNCTION pg_temp.kubexm_options(text);";

/// The advisory lock key migrations run under.
const MIGRATION_LOCK: i64 = 0x6b75_6265_786d; // "kubexm"

/// A job's columns; a Pending job of a cluster with a job running reads as
/// Blocked (computed, not stored: claims rewrite no other rows).
const COLUMNS: &str = "id, cluster, kind, \
    CASE WHEN status = 'Pending' AND EXISTS (SELECT 1 FROM jobs b WHERE b.cluster = jobs.cluster \
      AND b.status = 'Processing' AND b.lease_until >= (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT) \
      THEN 'Blocked' ELSE status END, \
    current_step, error, created, started, finished, worker, attempt, cancel_requested, config, config_name, options, origin, principal";

pub(super) struct Pg {
    pool: PgPool,
    /// The connection idle workers wait on for `NOTIFY kubexm_jobs`.
    listener: tokio::sync::Mutex<Option<PgListener>>,
    url: String,
}

/// The URL without its password or query (which may carry one), for messages.
pub(super) fn redact(url: &str) -> String {
    let (url, query) = match url.split_once('?') {
        Some((u, _)) => (u, "?***"),
        None => (url, ""),
    };
    let shown = match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            let user = creds.split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &url[..s + 3], &url[at..])
        }
        _ => url.to_string(),
    };
    format!("{shown}{query}")
}

/// A transaction's work under a held claim (see [`Pg::fenced`]).
type TxWork = Box<dyn for<'t> FnOnce(&'t mut Transaction<'static, Postgres>) -> BoxFuture<'t, Result<(), sqlx::Error>> + Send>;

impl Pg {
    fn err(&self, e: sqlx::Error) -> JobDbError {
        JobDbError::Invalid {
            path: self.url.clone(),
            what: e.to_string(),
        }
    }

    /// Connects to `url` and migrates.
    pub(super) async fn open(url: &str) -> Result<Pg, JobDbError> {
        let shown = redact(url);
        let bad = |e: &dyn std::fmt::Display| JobDbError::Invalid {
            path: shown.clone(),
            what: e.to_string(),
        };
        // A worker stopped inside a transaction (SIGSTOP, a frozen VM)
        // would hold its job's row lock and hide the job from every other
        // worker's claim: the server ends such a session after 10 s.
        let options = url
            .parse::<sqlx::postgres::PgConnectOptions>()
            .map_err(|e| bad(&e))?
            .options([("idle_in_transaction_session_timeout", "10s")]);
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options)
            .await
            .map_err(|e| bad(&format!("{e}; is PostgreSQL running and the URL right?")))?;
        let pg = Pg {
            pool,
            url: shown,
            listener: tokio::sync::Mutex::new(None),
        };
        pg.migrate().await?;
        Ok(pg)
    }

    async fn migrate(&self) -> Result<(), JobDbError> {
        let newer = async {
            let mut tx = self.pool.begin().await?;
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(MIGRATION_LOCK)
                .execute(&mut *tx)
                .await?;
            sqlx::query("CREATE TABLE IF NOT EXISTS kubexm_schema (version INTEGER NOT NULL)")
                .execute(&mut *tx)
                .await?;
            let version: Option<i32> = sqlx::query_scalar("SELECT version FROM kubexm_schema")
                .fetch_optional(&mut *tx)
                .await?;
            let version = version.unwrap_or(0).max(0) as usize;
            if version > MIGRATIONS.len() {
                return Ok(Some(version));
            }
            for m in MIGRATIONS.iter().skip(version) {
                // Through the Executor trait: RawSql's own `execute` is an
                // async fn whose future the compiler cannot prove `Send`.
                (&mut *tx).execute(sqlx::raw_sql(m)).await?;
            }
            sqlx::query("DELETE FROM kubexm_schema").execute(&mut *tx).await?;
            sqlx::query("INSERT INTO kubexm_schema (version) VALUES ($1)")
                .bind(MIGRATIONS.len() as i32)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(None)
        }
        .await
        .map_err(|e| self.err(e))?;
        newer.map_or(Ok(()), |v| {
            Err(JobDbError::Invalid {
                path: self.url.clone(),
                what: format!(
                    "schema version {v} is newer than this kubexm knows ({}); use the kubexm that wrote it",
                    MIGRATIONS.len()
                ),
            })
        })
    }

    /// `f`'s result, its sqlx error named with the (redacted) URL.
    fn run<'a, T: Send + 'a>(&'a self, f: impl Future<Output = Result<T, sqlx::Error>> + Send + 'a) -> Res<'a, T> {
        Box::pin(async move { f.await.map_err(|e| self.err(e)) })
    }

    /// Runs `f` on the job's row only while `claim` still holds it (the row
    /// locked for the transaction).
    fn fenced(&self, claim: Claim, f: TxWork) -> Res<'_, ()> {
        Box::pin(async move {
            let held = self
                .run(async {
                    let mut tx = self.pool.begin().await?;
                    let held: Option<i64> =
                        sqlx::query_scalar("SELECT id FROM jobs WHERE id = $1 AND attempt = $2 AND status = 'Processing' FOR UPDATE")
                            .bind(claim.job)
                            .bind(claim.attempt)
                            .fetch_optional(&mut *tx)
                            .await?;
                    if held.is_some() {
                        f(&mut tx).await?;
                    }
                    tx.commit().await?;
                    Ok(held.is_some())
                })
                .await?;
            if held {
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

/// Binds shared SQL's parameters.
fn bind<'q>(
    mut q: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    params: Vec<Param>,
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    for p in params {
        q = match p {
            Param::Int(v) => q.bind(v),
            Param::Text(v) => q.bind(v),
        };
    }
    q
}

/// A row of shared SQL, its cells by their column's type.
fn cells(r: &PgRow) -> Result<Vec<Cell>, sqlx::Error> {
    (0..r.len())
        .map(|i| {
            let raw = r.try_get_raw(i)?;
            if raw.is_null() {
                return Ok(Cell::Null);
            }
            let kind = raw.type_info().name().to_string();
            Ok(match kind.as_str() {
                "INT8" => Cell::Int(r.try_get(i)?),
                "INT4" => Cell::Int(r.try_get::<i32, _>(i)?.into()),
                "INT2" => Cell::Int(r.try_get::<i16, _>(i)?.into()),
                "BOOL" => Cell::Int(r.try_get::<bool, _>(i)?.into()),
                _ => Cell::Text(r.try_get(i)?),
            })
        })
        .collect()
}

impl Backend for Pg {
    fn shared(&self) -> bool {
        true
    }

    fn jobs_dir(&self) -> PathBuf {
        PathBuf::from("/var/lib/kubexm/jobs")
    }

    /// Waits up to `max` for a `NOTIFY kubexm_jobs` (a new or released job).
    fn wait_for_work(&self, max: Duration) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let mut slot = self.listener.lock().await;
            let listener = match slot.take() {
                Some(l) => Some(l),
                None => {
                    async {
                        let mut l = PgListener::connect_with(&self.pool).await.ok()?;
                        l.listen("kubexm_jobs").await.ok()?;
                        Some(l)
                    }
                    .await
                }
            };
            let Some(mut l) = listener else {
                tokio::time::sleep(max).await;
                return;
            };
            if tokio::time::timeout(max, l.recv()).await.map_or(true, |r| r.is_ok()) {
                *slot = Some(l);
            }
        })
    }

    fn execute<'a>(&'a self, sql: &'a str, params: Vec<Param>) -> Res<'a, u64> {
        self.run(async move { bind(sqlx::query(sql), params).execute(&self.pool).await.map(|r| r.rows_affected()) })
    }

    fn execute_all(&self, statements: Vec<(String, Vec<Param>)>) -> Res<'_, Vec<u64>> {
        self.run(async move {
            let mut tx = self.pool.begin().await?;
            let mut changed = Vec::new();
            for (sql, params) in &statements {
                changed.push(bind(sqlx::query(sql), params.clone()).execute(&mut *tx).await?.rows_affected());
            }
            tx.commit().await?;
            Ok(changed)
        })
    }

    fn query<'a>(&'a self, sql: &'a str, params: Vec<Param>) -> Res<'a, Vec<Vec<Cell>>> {
        self.run(async move {
            let rows = bind(sqlx::query(sql), params).fetch_all(&self.pool).await?;
            rows.iter().map(cells).collect()
        })
    }

    fn create<'a>(&'a self, job: &'a NewJob) -> Res<'a, i64> {
        self.run(async move {
            let mut tx = self.pool.begin().await?;
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO jobs (cluster, kind, status, config, config_name, options, created, origin, principal)
                 VALUES ($1, $2, 'Pending', $3, $4, $5, $6, $7, $8) RETURNING id",
            )
            .bind(&job.cluster)
            .bind(&job.kind)
            .bind(&job.config)
            .bind(&job.config_name)
            .bind(job.options.to_string())
            .bind(now_ms())
            .bind(super::origin_str(job.origin))
            .bind(&job.principal)
            .fetch_one(&mut *tx)
            .await?;
            sqlx::query("NOTIFY kubexm_jobs").execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(id)
        })
    }

    fn get(&self, id: i64) -> Res<'_, Option<Job>> {
        self.run(async move {
            let r = sqlx::query(&format!("SELECT {COLUMNS} FROM jobs WHERE id = $1"))
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
            r.as_ref().map(Job::from_row).transpose()
        })
    }

    fn list(&self) -> Res<'_, Vec<Job>> {
        self.run(async move {
            let rows = sqlx::query(&format!("SELECT {COLUMNS} FROM jobs ORDER BY id DESC"))
                .fetch_all(&self.pool)
                .await?;
            Ok(rows
                .iter()
                .map(|r| Job::from_row(r).unwrap_or_else(|e| Job::unreadable(r.try_get(0).unwrap_or(-1), &e)))
                .collect())
        })
    }

    fn logs(&self, job: i64, after: i64) -> Res<'_, Vec<LogLine>> {
        self.run(async move {
            let rows = sqlx::query("SELECT seq, at, line FROM job_logs WHERE job = $1 AND seq > $2 ORDER BY seq")
                .bind(job)
                .bind(after)
                .fetch_all(&self.pool)
                .await?;
            rows.iter()
                .map(|r| {
                    Ok(LogLine {
                        seq: r.try_get(0)?,
                        at: r.try_get(1)?,
                        line: r.try_get(2)?,
                    })
                })
                .collect()
        })
    }

    fn request_cancel(&self, id: i64) -> Res<'_, Option<Status>> {
        self.run(async move {
            let mut tx = self.pool.begin().await?;
            sqlx::query(
                "UPDATE jobs SET status = 'Cancelled', finished = $2, current_step = NULL WHERE id = $1 AND status IN ('Pending', 'Blocked')",
            )
            .bind(id)
            .bind(now_ms())
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "UPDATE jobs SET status = 'Cancelled', finished = $2, current_step = NULL, lease_until = NULL, attempt = attempt + 1
                 WHERE id = $1 AND status = 'Processing' AND lease_until < $2",
            )
            .bind(id)
            .bind(now_ms())
            .execute(&mut *tx)
            .await?;
            sqlx::query("UPDATE jobs SET cancel_requested = TRUE WHERE id = $1 AND status = 'Processing'")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            let s: Option<String> = sqlx::query_scalar("SELECT status FROM jobs WHERE id = $1")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(s.and_then(|s| Status::parse(&s)))
        })
    }

    fn claim<'a>(&'a self, worker: &'a str, machine: &'a str, lease_ms: i64, only: Option<i64>) -> Res<'a, Option<Claim>> {
        self.run(async move {
            let now = now_ms();
            let busy = "SELECT cluster FROM jobs WHERE status = 'Processing' AND lease_until >= $1";
            let mut tx = self.pool.begin().await?;
            let found = sqlx::query(&format!(
                "SELECT j.id, j.cluster, j.attempt FROM jobs j LEFT JOIN clusters k ON k.name = j.cluster
                 WHERE (j.status = 'Pending' OR (j.status = 'Processing' AND j.lease_until < $1))
                   AND (k.machine IS NULL OR k.machine = $2)
                   AND ($3::BIGINT IS NULL OR j.id = $3)
                   AND j.cluster NOT IN ({busy})
                 ORDER BY j.id LIMIT 1 FOR UPDATE OF j SKIP LOCKED"
            ))
            .bind(now)
            .bind(machine)
            .bind(only)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(r) = found else {
                return Ok(None);
            };
            let (id, cluster, attempt): (i64, String, i64) = (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
            // One claimer per cluster at a time; then, with the lock held,
            // no other job of it may be running (committed since our read).
            let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(hashtext('kubexm-cluster:' || $1))")
                .bind(&cluster)
                .fetch_one(&mut *tx)
                .await?;
            let running: Option<i64> = sqlx::query_scalar(
                "SELECT id FROM jobs WHERE cluster = $1 AND id <> $2 AND status = 'Processing' AND lease_until >= $3 LIMIT 1",
            )
            .bind(&cluster)
            .bind(id)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await?;
            if !locked || running.is_some() {
                tx.rollback().await?;
                return Ok(None);
            }
            let attempt = attempt + 1;
            sqlx::query(
                "UPDATE jobs SET status = 'Processing', worker = $2, attempt = $3, lease_until = $4,
                   started = COALESCE(started, $5) WHERE id = $1",
            )
            .bind(id)
            .bind(worker)
            .bind(attempt)
            .bind(now + lease_ms)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            sqlx::query("INSERT INTO clusters (name, machine) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING")
                .bind(&cluster)
                .bind(machine)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(Some(Claim { job: id, attempt }))
        })
    }

    fn renew(&self, claim: Claim, lease_ms: i64) -> Res<'_, bool> {
        Box::pin(async move {
            let work: TxWork = Box::new(move |tx| {
                Box::pin(async move {
                    sqlx::query("UPDATE jobs SET lease_until = $2 WHERE id = $1")
                        .bind(claim.job)
                        .bind(now_ms() + lease_ms)
                        .execute(&mut **tx)
                        .await
                        .map(|_| ())
                })
            });
            self.fenced(claim, work).await?;
            Ok(self.get(claim.job).await?.is_some_and(|j| j.cancel_requested))
        })
    }

    fn append<'a>(&'a self, claim: Claim, lines: &'a [String], current_step: Option<&'a str>) -> Res<'a, ()> {
        let lines = lines.to_vec();
        let step = current_step.map(str::to_string);
        self.fenced(
            claim,
            Box::new(move |tx| {
                Box::pin(async move {
                    let last: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0)::BIGINT FROM job_logs WHERE job = $1")
                        .bind(claim.job)
                        .fetch_one(&mut **tx)
                        .await?;
                    let now = now_ms();
                    for (i, l) in super::log_bounds::capped(last, &lines).iter().enumerate() {
                        sqlx::query("INSERT INTO job_logs (job, seq, at, line) VALUES ($1, $2, $3, $4)")
                            .bind(claim.job)
                            .bind(last + 1 + i as i64)
                            .bind(now)
                            .bind(l.as_ref())
                            .execute(&mut **tx)
                            .await?;
                    }
                    if let Some(s) = step {
                        sqlx::query("UPDATE jobs SET current_step = $2 WHERE id = $1")
                            .bind(claim.job)
                            .bind(s)
                            .execute(&mut **tx)
                            .await?;
                    }
                    Ok(())
                })
            }),
        )
    }

    fn finish<'a>(&'a self, claim: Claim, status: Status, error: Option<&'a str>) -> Res<'a, ()> {
        let error = error.map(str::to_string);
        self.fenced(
            claim,
            Box::new(move |tx| {
                Box::pin(async move {
                    sqlx::query(
                        "UPDATE jobs SET status = $2, error = $3, finished = $4, lease_until = NULL,
                           current_step = CASE WHEN $2 = 'Success' THEN NULL ELSE current_step END WHERE id = $1",
                    )
                    .bind(claim.job)
                    .bind(status.as_str())
                    .bind(error)
                    .bind(now_ms())
                    .execute(&mut **tx)
                    .await?;
                    notify(tx).await
                })
            }),
        )
    }

    fn release(&self, claim: Claim) -> Res<'_, ()> {
        self.fenced(
            claim,
            Box::new(move |tx| {
                Box::pin(async move {
                    sqlx::query("UPDATE jobs SET status = 'Pending', lease_until = NULL, worker = NULL WHERE id = $1")
                        .bind(claim.job)
                        .execute(&mut **tx)
                        .await?;
                    notify(tx).await
                })
            }),
        )
    }
}

/// Wakes idle workers: a job ended or was given back.
async fn notify(tx: &mut Transaction<'static, Postgres>) -> Result<(), sqlx::Error> {
    sqlx::query("NOTIFY kubexm_jobs").execute(&mut **tx).await.map(|_| ())
}

impl Drop for Pg {
    fn drop(&mut self) {
        // A listener's drop spawns its UNLISTEN on the current runtime; with
        // none (a handle dropped after its runtime ended) it is let go as is.
        if tokio::runtime::Handle::try_current().is_err()
            && let Some(l) = self.listener.get_mut().take()
        {
            std::mem::forget(l);
        }
    }
}

impl JobRow for PgRow {
    type Error = sqlx::Error;
    fn text(&self, i: usize) -> Result<String, sqlx::Error> {
        self.try_get(i)
    }
    fn maybe_text(&self, i: usize) -> Result<Option<String>, sqlx::Error> {
        self.try_get(i)
    }
    fn int(&self, i: usize) -> Result<i64, sqlx::Error> {
        self.try_get(i)
    }
    fn maybe_int(&self, i: usize) -> Result<Option<i64>, sqlx::Error> {
        self.try_get(i)
    }
    fn flag(&self, i: usize) -> Result<bool, sqlx::Error> {
        self.try_get(i)
    }
}
