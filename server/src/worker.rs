//! Workers: claim a job, run its operation on the engine (the same
//! operation the CLI runs), and write its current step and log lines into
//! the job database as they happen, holding the job with a lease renewed in
//! the background. A cancel stops the scheduling of new steps (running ones
//! finish); Ctrl-C of a foreground run gives the job back as Pending, so the
//! next claim resumes it and skips the steps already done.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kubexm_installer::engine::events::{Event, EventSink, Numbered};
use kubexm_installer::ops;
use kubexm_installer::ops::request::Request;

use crate::job_request::Local;

use crate::jobdb::writer::{LogSender, LogWriter};
use crate::jobdb::{Claim, JobDb, JobDbError, Status};

/// Where a worker runs the jobs that do not say (those created through the
/// API, and what the operator's flags left out): its flags, or the API
/// server's for its embedded worker.
#[derive(Debug, Clone)]
pub struct WorkerInstall {
    /// The bundles held by digest (`kubexm bundle add` on this machine).
    pub bundles: PathBuf,
    /// The address hosts reach this machine at (its file server); without
    /// it, API install jobs fail on this worker, saying so.
    pub advertise: Option<std::net::IpAddr>,
    /// The bundles' public key; none: installed without a signature check
    /// (`kubexm bundle add` checked it).
    pub pubkey: Option<PathBuf>,
    pub serve_port: u16,
    /// The installer's state root (unpacked bundles, PKI).
    pub root: PathBuf,
}

impl Default for WorkerInstall {
    fn default() -> WorkerInstall {
        WorkerInstall {
            bundles: crate::bundles::BUNDLES_DIR.into(),
            advertise: None,
            pubkey: None,
            serve_port: kubexm_installer::SERVE_PORT,
            root: kubexm_installer::ROOT.into(),
        }
    }
}

impl WorkerInstall {
    /// The settings job `id` runs with here: `local` (the operator's flags)
    /// over this worker's own; an install needs the address hosts reach
    /// this machine at.
    fn settings(&self, id: i64, request: &Request, local: &Local, engine: ops::EngineSettings) -> anyhow::Result<ops::session::Settings> {
        let advertise = local.advertise.or(self.advertise);
        let install = matches!(request, Request::Install(_) | Request::Apply(_) | Request::Upgrade(_));
        if install && advertise.is_none() {
            anyhow::bail!(
                "job {id} was created through the API and installs with this worker's options, but this worker has no --advertise: \
                 start `kubexm worker` (or the API server's embedded worker) with --advertise ADDR --pubkey FILE and create the job again"
            );
        }
        Ok(ops::session::Settings {
            engine,
            root: local.root.clone().unwrap_or_else(|| self.root.clone()),
            // The operator's job carries its own key (none: --allow-unsigned).
            pubkey: if local.bundle.is_some() {
                local.pubkey.clone()
            } else {
                self.pubkey.clone()
            },
            base: None,
            advertise,
            serve_port: local.serve_port.unwrap_or(self.serve_port),
            kubeconfig: local.kubeconfig.clone(),
            installer: None,
        })
    }

    /// The file of the bundle job `id` asks for: the operator's, or the
    /// one held here under its digest.
    fn bundle(&self, id: i64, digest: &str, local: &Local) -> anyhow::Result<PathBuf> {
        if let Some(b) = &local.bundle {
            if local.pubkey.is_none() && !local.allow_unsigned {
                anyhow::bail!(
                    "job {id}: its bundle {} names no public key and was not created with --allow-unsigned; create it again",
                    b.display()
                );
            }
            return Ok(b.clone());
        }
        crate::bundles::find(&self.bundles, digest).map_err(|e| {
            anyhow::anyhow!(
                "job {id}: {e}; hold it on this worker's machine too: `kubexm bundle add FILE --pubkey KEY --bundles {}`",
                self.bundles.display()
            )
        })
    }
}

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// `host:pid`, shown on the jobs it claims.
    pub name: String,
    /// The machine (its `/etc/machine-id`): a cluster's jobs run where its first ran.
    pub machine: String,
    pub lease: Duration,
    /// The engine's state database (step results, pinned host keys).
    pub state: PathBuf,
    /// Where an earlier kubexm wrote each job's config (`<dir>/<id>/`);
    /// nothing is written there now, and a finished job's leftover is removed.
    pub jobs_dir: PathBuf,
    pub concurrency: usize,
    /// Where the jobs that do not say run (API jobs; what the operator's flags left out).
    pub install: WorkerInstall,
    /// The key that opens the database's credentials (a 0600 file).
    pub credential_key: PathBuf,
    /// One SSH connection attempt's time limit, and attempts per host.
    pub connect_timeout: Duration,
    pub connect_attempts: u32,
    /// Finished jobs (and their logs) older than this are deleted, looked
    /// for every hour; `None`: kept for ever.
    pub retain: Option<Duration>,
}

/// How long finished jobs are kept unless told otherwise.
pub const RETAIN_DAYS: u64 = 90;

impl WorkerOptions {
    /// This process on this machine.
    pub fn here(state: PathBuf, jobs_dir: PathBuf) -> WorkerOptions {
        let host = fs_err::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "localhost".into());
        let machine = fs_err::read_to_string("/etc/machine-id")
            .map(|m| m.trim().to_string())
            .ok()
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| host.clone());
        WorkerOptions {
            name: format!("{host}:{}", std::process::id()),
            machine,
            lease: Duration::from_secs(30),
            state,
            jobs_dir,
            concurrency: 20,
            install: WorkerInstall::default(),
            credential_key: crate::credentials::CREDENTIAL_KEY.into(),
            connect_timeout: ops::CONNECT_TIMEOUT,
            connect_attempts: ops::CONNECT_ATTEMPTS,
            retain: Some(Duration::from_secs(RETAIN_DAYS * 86_400)),
        }
    }
}

/// How a claimed job ended for its worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// With this status written.
    Final(Status),
    /// Given back as Pending (Ctrl-C).
    Released,
    /// Another worker holds it now; nothing more was written.
    Fenced,
}

/// Engine events rendered as log lines and sent to the job's one writer
/// ([`LogWriter`]), which appends them under the claim; a refused write
/// (fenced) stops the run.
struct DbSink {
    log: LogSender,
    fenced: Arc<AtomicBool>,
}

/// One event as a log line, and the step it makes current.
pub fn render(event: &Event) -> (String, Option<String>) {
    match event {
        Event::JobStarted { phases } => (
            format!("plan: {}", phases.iter().map(|p| p.module.as_str()).collect::<Vec<_>>().join(", ")),
            None,
        ),
        Event::StepStarted { node, module, host } => (format!("{host}: {module}/{node} started"), Some(format!("{module}/{node}"))),
        Event::LogLine { node, host, line } => (format!("{host}: {node}: {line}"), None),
        Event::StepFinished {
            node,
            module,
            host,
            outcome,
        } => (format!("{host}: {module}/{node} {}", outcome.as_str()), None),
        Event::JobFinished { status } => (format!("engine job {status}"), None),
    }
}

impl EventSink for DbSink {
    fn emit(&self, e: &Numbered) {
        if self.fenced.load(Ordering::Relaxed) {
            return;
        }
        let (line, step) = render(&e.event);
        self.log.send(line, step);
    }
}

/// Runs a claimed job to its end. `quit` is the caller's Ctrl-C flag: the
/// job stops scheduling steps and is given back as Pending.
pub async fn run(db: &Arc<JobDb>, claim: Claim, o: &WorkerOptions, quit: Arc<AtomicBool>) -> Result<Ended, JobDbError> {
    let job = match db.get(claim.job).await {
        Ok(Some(j)) => j,
        Ok(None) => {
            return Err(JobDbError::Invalid {
                path: db.path().display().to_string(),
                what: format!("job {} vanished", claim.job),
            });
        }
        // A row that cannot be read fails with its reason; the worker goes on.
        Err(e) => {
            let why = format!("this job's row cannot be read: {e}");
            tracing::warn!("job {}: {why}", claim.job);
            db.finish(claim, Status::Failed, Some(&why)).await?;
            return Ok(Ended::Final(Status::Failed));
        }
    };
    let fenced = Arc::new(AtomicBool::new(false));
    let cancelled = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    // This job's stop: a cancel, a lost claim or the caller's quit.
    let stop = Arc::new(AtomicBool::new(false));
    let flags = Flags {
        stop: stop.clone(),
        fenced: fenced.clone(),
        cancelled: cancelled.clone(),
        done: done.clone(),
        quit: quit.clone(),
    };
    let lease = tokio::spawn(hold_lease(db.clone(), claim, o.lease, flags));
    if let Err(e) = db
        .append(claim, &[format!("claimed by {} (attempt {})", o.name, claim.attempt)], None)
        .await
    {
        // The lease is not renewed for a job this worker cannot write to:
        // it runs out, and the next claim resumes the job.
        done.store(true, Ordering::Relaxed);
        let _ = lease.await;
        return Err(e);
    }
    let writer = {
        let (fenced, stop) = (fenced.clone(), stop.clone());
        LogWriter::start(db.clone(), claim, move || {
            fenced.store(true, Ordering::Relaxed);
            stop.store(true, Ordering::Relaxed);
        })
    };
    let sink = Arc::new(DbSink {
        log: writer.sender(),
        fenced: fenced.clone(),
    });
    let trust = trust(db, &job, o).await;
    // The operation blocks (the engine runs on its own runtime). A panic is
    // a failed job (with its message), never a worker that keeps renewing
    // the lease of a job nobody runs.
    let result = {
        let (job, o, stop) = (job.clone(), o.clone(), stop.clone());
        tokio::task::spawn_blocking(move || operate(&job, &o, sink, stop, trust)).await
    }
    .unwrap_or_else(|e| {
        let what = if e.is_panic() {
            kubexm_engine::run::panic_message(&*e.into_panic()).to_string()
        } else {
            e.to_string()
        };
        (Err(anyhow::anyhow!("this is a bug in kubexm: the worker panicked: {what}")), None)
    });
    let (result, timeline) = result;
    writer.close().await;
    if let Some(t) = timeline
        && let Err(e) = db.put_timeline(claim.job, &t).await
    {
        tracing::warn!("job {}: storing its timeline: {e}", claim.job);
    }
    done.store(true, Ordering::Relaxed);
    let _ = lease.await;
    // A copy of the config an earlier kubexm wrote for this job is not kept.
    let _ = fs_err::remove_dir_all(o.jobs_dir.join(claim.job.to_string()));
    if fenced.load(Ordering::Relaxed) {
        return Ok(Ended::Fenced);
    }
    let cancelled = cancelled.load(Ordering::Relaxed) || db.get(claim.job).await?.is_some_and(|j| j.cancel_requested);
    let interrupted = quit.load(Ordering::Relaxed) || stop.load(Ordering::Relaxed);
    match record(db, claim, result, cancelled, interrupted).await {
        Ok(ended) => Ok(ended),
        Err(JobDbError::Fenced { .. }) => Ok(Ended::Fenced),
        Err(e) => {
            // The job's outcome could not be stored (a line the database
            // refuses, a full disk): the job fails with that reason, and the
            // worker goes on with the next one.
            tracing::warn!("job {}: storing its outcome: {e}", claim.job);
            let why = format!("the worker could not store this job's log or outcome: {e}");
            match db.finish(claim, Status::Failed, Some(&why)).await {
                Ok(()) => Ok(Ended::Final(Status::Failed)),
                Err(JobDbError::Fenced { .. }) => Ok(Ended::Fenced),
                Err(e) => Err(e),
            }
        }
    }
}

/// A running job's flags, shared by its run and its lease.
struct Flags {
    stop: Arc<AtomicBool>,
    fenced: Arc<AtomicBool>,
    cancelled: Arc<AtomicBool>,
    /// The run has ended: the lease is no longer renewed.
    done: Arc<AtomicBool>,
    quit: Arc<AtomicBool>,
}

/// Holds the lease until the run is done: renewed at a third of its length
/// and every second at least (a cancel is looked for then: it stops the
/// job within about a second); a lost claim or a quit stops the job.
async fn hold_lease(db: Arc<JobDb>, claim: Claim, lease: Duration, f: Flags) {
    let (every, ms) = ((lease / 3).min(Duration::from_secs(1)), lease.as_millis() as i64);
    while !f.done.load(Ordering::Relaxed) {
        match db.renew(claim, ms).await {
            Ok(true) => {
                f.cancelled.store(true, Ordering::Relaxed);
                f.stop.store(true, Ordering::Relaxed);
            }
            Ok(false) => {}
            Err(JobDbError::Fenced { .. }) => {
                f.fenced.store(true, Ordering::Relaxed);
                f.stop.store(true, Ordering::Relaxed);
                return;
            }
            Err(e) => tracing::warn!("job {}: renewing the lease: {e}", claim.job),
        }
        let mut slept = Duration::ZERO;
        while slept < every && !f.done.load(Ordering::Relaxed) {
            if f.quit.load(Ordering::Relaxed) {
                f.stop.store(true, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            slept += Duration::from_millis(100);
        }
    }
}

/// Writes how a job's operation ended: its last log lines and its status.
async fn record(db: &JobDb, claim: Claim, result: anyhow::Result<String>, cancelled: bool, interrupted: bool) -> Result<Ended, JobDbError> {
    Ok(match result {
        _ if cancelled => {
            db.append(claim, &["cancelled: no new step was started after the request".into()], None)
                .await?;
            db.finish(claim, Status::Cancelled, Some("cancelled")).await?;
            Ended::Final(Status::Cancelled)
        }
        Ok(report) => {
            let lines: Vec<String> = report.lines().map(str::to_string).collect();
            db.append(claim, &lines, None).await?;
            db.finish(claim, Status::Success, None).await?;
            Ended::Final(Status::Success)
        }
        Err(_) if interrupted => {
            db.append(
                claim,
                &["interrupted: the job is Pending again; the next claim skips the steps done".into()],
                None,
            )
            .await?;
            db.release(claim).await?;
            Ended::Released
        }
        Err(e) => {
            let text = format!("{e:#}");
            let lines: Vec<String> = text.lines().map(|l| format!("error: {l}")).collect();
            db.append(claim, &lines, None).await?;
            db.finish(claim, Status::Failed, Some(&text)).await?;
            Ended::Final(Status::Failed)
        }
    })
}

/// What a job's run may use of this machine: an operator's job on a
/// database of this machine alone reads the files and variables its config
/// names; a request's, or any job of a shared database, only the database's
/// named credentials and pinned host keys.
async fn trust(db: &JobDb, job: &crate::jobdb::Job, o: &WorkerOptions) -> kubexm_installer::engine::trust::Trust {
    if job.origin == crate::jobdb::Origin::Operator && !db.shared() {
        kubexm_installer::engine::trust::Trust::Local
    } else {
        crate::credentials::untrusted(db, &o.credential_key).await
    }
}

/// The job's operation, as the CLI would run it: its request run on a
/// session opened on the job's config text (no file written); the report
/// becomes the job's last lines. With it, the timeline of the engine job it
/// ran, whatever its outcome.
fn operate(
    job: &crate::jobdb::Job,
    o: &WorkerOptions,
    sink: Arc<DbSink>,
    stop: Arc<AtomicBool>,
    trust: kubexm_installer::engine::trust::Trust,
) -> (anyhow::Result<String>, Option<kubexm_engine::timeline::Timeline>) {
    match open(job, o, sink, stop, trust) {
        Ok((mut session, request)) => {
            let result = ops::request::run(&mut session, &request).map(|r| r.to_string());
            (result, session.last_timeline())
        }
        Err(e) => (Err(e), None),
    }
}

/// The session a job runs on, and its request.
fn open(
    job: &crate::jobdb::Job,
    o: &WorkerOptions,
    sink: Arc<DbSink>,
    stop: Arc<AtomicBool>,
    trust: kubexm_installer::engine::trust::Trust,
) -> anyhow::Result<(ops::session::Session, ops::request::Request)> {
    if ![
        "install",
        "apply",
        "reset",
        "facts",
        "etcd-snapshot",
        "remove-node",
        "delete-cluster",
        "certs-check",
        "certs-renew",
        "etcd-restore",
        "upgrade",
    ]
    .contains(&job.kind.as_str())
    {
        return Err(ops::error::op(
            ops::error::OpError::Unsupported,
            anyhow::anyhow!("job kind {} is not supported yet by this worker", crate::text::line(&job.kind)),
        ));
    }
    // A restore's steps all run again when it is resumed: a second restore
    // would lose what was written since the first. It is not resumed.
    if job.kind == "etcd-restore" && job.attempt > 1 {
        return Err(ops::error::op(
            ops::error::OpError::Usage,
            anyhow::anyhow!(
                "job {}: an etcd restore that was interrupted is not resumed (its cluster may be restored already, \
                 and a second restore would lose what was written since); check the cluster and create the job again if it must run",
                job.id
            ),
        ));
    }
    let (request, local) = crate::job_request::read(&job.kind, &job.options).map_err(|e| {
        anyhow::anyhow!(
            "job {}: its request cannot be read ({e}); was it written by another kubexm version? Create the job again with this one",
            job.id
        )
    })?;
    let local = local.unwrap_or_default();
    let engine = ops::EngineSettings {
        state: o.state.clone(),
        accept_new_host_key: false,
        concurrency: o.concurrency,
        events: Some(sink),
        stop: Some(stop),
        trust,
        connect_timeout: o.connect_timeout,
        connect_attempts: o.connect_attempts,
        owner: ops::owner::Ownership::Take {
            identity: format!("kubexm worker {} job {}", kubexm_bom::text::line(&o.name), job.id),
        },
    };
    let mut settings = o.install.settings(job.id, &request, &local, engine)?;
    let bundle = request.bundle().map(|d| o.install.bundle(job.id, d, &local)).transpose()?;
    if let Some(b) = &bundle {
        settings.installer = Some(installer_binary()?);
        settings.base = held_base(&o.install.bundles, b, &settings)?;
    }
    let config = ops::session::Config::Text {
        name: job.config_name.clone(),
        text: job.config.clone(),
    };
    let session = ops::session::Session::open(&config, bundle.as_deref(), None, settings)?;
    Ok((session, request))
}

/// A differential bundle's base, when `bundle` is one held in `dir`,
/// checked to fit it: the install verifies and unpacks it with the bundle,
/// and gives its file to the registry host (which verifies it again: the
/// worker needs its --pubkey for that).
fn held_base(dir: &std::path::Path, bundle: &std::path::Path, settings: &ops::session::Settings) -> anyhow::Result<Option<PathBuf>> {
    let m = kubexm_bundle::verify::read_manifest(bundle)?;
    let Some(base) = crate::bundles::base_of(dir, bundle, &m)? else {
        return Ok(None);
    };
    if settings.pubkey.is_none() {
        anyhow::bail!(
            "{} is a differential bundle: the registry host verifies its base {} with the bundles' public key, \
             and there is none (the worker's --pubkey, or the job's own): a differential bundle is never installed unsigned",
            bundle.display(),
            base.display()
        );
    }
    Ok(Some(base))
}

/// The kubexm-install binary beside this one: an install puts it on the
/// registry host, which runs it as its registry service.
pub fn installer_binary() -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe()?;
    let dir = me.parent().unwrap_or(std::path::Path::new("/"));
    let p = dir.join("kubexm-install");
    if !p.is_file() {
        anyhow::bail!(
            "{} is missing: an install job puts kubexm-install on the registry host (it serves the bundle there); \
             install kubexm-install beside kubexm in {}",
            p.display(),
            dir.display()
        );
    }
    Ok(p)
}

/// What an embedded worker is doing, for `/healthz` and `/readyz`.
#[derive(Debug, Default)]
pub struct WorkerHealth(std::sync::Mutex<(bool, Option<String>)>);

impl WorkerHealth {
    /// Whether it is claiming jobs, and the error it last restarted after.
    pub fn state(&self) -> (bool, Option<String>) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, running: bool, error: Option<String>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = (running, error);
    }
}

/// [`serve`] until `quit`, started again with backoff (1 s doubling to
/// 30 s) whenever the database fails under it (a lock held past its
/// timeout, a lost connection): a worker never ends silently.
pub async fn supervise(db: &Arc<JobDb>, o: &WorkerOptions, quit: Arc<AtomicBool>, health: &WorkerHealth) {
    let mut pause = Duration::from_secs(1);
    while !quit.load(Ordering::Relaxed) {
        health.set(true, health.state().1);
        match serve(db, o, quit.clone(), false).await {
            Ok(_) => break,
            Err(e) => {
                tracing::error!("the worker stopped: {e}; starting it again in {} s", pause.as_secs());
                health.set(false, Some(crate::text::line(&e.to_string()).into_owned()));
                let until = std::time::Instant::now() + pause;
                while std::time::Instant::now() < until && !quit.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                pause = (pause * 2).min(Duration::from_secs(30));
            }
        }
    }
    health.set(false, health.state().1);
}

/// Claims and runs jobs until `quit` is set (checked between jobs and
/// every poll); `once`: returns after the first job or when none is waiting.
pub async fn serve(db: &Arc<JobDb>, o: &WorkerOptions, quit: Arc<AtomicBool>, once: bool) -> Result<usize, JobDbError> {
    let mut ran = 0;
    let mut pruned: Option<std::time::Instant> = None;
    while !quit.load(Ordering::Relaxed) {
        db.heartbeat(&o.name, &o.machine).await?;
        if let Some(keep) = o.retain
            && pruned.is_none_or(|p| p.elapsed() > Duration::from_secs(3600))
        {
            pruned = Some(std::time::Instant::now());
            let n = db.prune(crate::jobdb::now_ms() - keep.as_millis() as i64).await?;
            if n > 0 {
                tracing::info!(
                    "{n} finished job(s) older than {} days deleted with their logs",
                    keep.as_secs() / 86_400
                );
            }
        }
        match db.claim(&o.name, &o.machine, o.lease.as_millis() as i64, None).await? {
            Some(claim) => {
                tracing::info!("job {} claimed (attempt {})", claim.job, claim.attempt);
                let ended = match run(db, claim, o, quit.clone()).await {
                    Ok(ended) => ended,
                    Err(e) => {
                        // The database failed under this job (locked past its
                        // timeout, gone): the job's lease runs out and another
                        // claim resumes it; this worker goes on after a pause.
                        tracing::warn!("job {}: {e}; the job is resumed once its lease runs out", claim.job);
                        tokio::time::sleep(o.lease.min(Duration::from_secs(5))).await;
                        continue;
                    }
                };
                if ended == Ended::Fenced {
                    tracing::warn!(
                        "job {} (attempt {}): another worker holds it now (this worker's lease ran out); nothing more was written",
                        claim.job,
                        claim.attempt
                    );
                } else {
                    tracing::info!("job {}: {ended:?}", claim.job);
                }
                ran += 1;
                if once {
                    break;
                }
            }
            None if once => break,
            None => db.wait_for_work(Duration::from_millis(500)).await,
        }
    }
    db.forget_worker(&o.name).await?;
    Ok(ran)
}
