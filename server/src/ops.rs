//! The job operations every trigger shares (the `kubexm` CLI and the API
//! server): store a job asking a validated, typed request, read one, follow
//! its log, cancel it. None prints.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kubexm_installer::ops::error::{OpError, op};

use crate::jobdb::{Job, JobDb, LogLine, NewJob, Origin};
use kubexm_installer::ops::request::{ApplyRequest, InstallRequest, Request, UpgradeRequest};

use crate::job_request::{self, Local};

/// `create cluster`: `file` validated against the catalog of the bundle
/// `local` names (the same errors, with line and column, as an install or
/// `kubexm-bundle validate`), then stored as a Pending install request of
/// that bundle's digest, `local` saying where it runs. Nothing is stored
/// when it is invalid.
pub async fn create_cluster(db: &JobDb, file: &Path, phases: &[String], local: Local) -> anyhow::Result<i64> {
    let phases = kubexm_installer::pipelines::install::parse(phases).map_err(|e| op(OpError::Usage, anyhow::anyhow!("--phases: {e}")))?;
    bundle_job(db, file, local, |bundle| Request::Install(InstallRequest { bundle, phases })).await
}

/// `scale`: as [`create_cluster`], stored as an apply of the installed
/// cluster (what the config adds, checked against its record by the worker).
pub async fn create_apply(db: &JobDb, file: &Path, local: Local) -> anyhow::Result<i64> {
    bundle_job(db, file, local, |bundle| Request::Apply(ApplyRequest { bundle })).await
}

/// `upgrade cluster`: as [`create_cluster`], stored as an upgrade of the
/// installed cluster to the version `file` names (the hosts in
/// `skip_not_ready` are the config's, or nothing is stored).
pub async fn create_upgrade(
    db: &JobDb,
    file: &Path,
    skip_not_ready: Vec<String>,
    drain_timeout: Option<u32>,
    local: Local,
) -> anyhow::Result<i64> {
    let cluster = kubexm_bom::config::load_file_hosts(file)?;
    kubexm_installer::ops::session::check_hosts(&cluster, &skip_not_ready)?;
    bundle_job(db, file, local, |bundle| {
        Request::Upgrade(UpgradeRequest {
            bundle,
            skip_not_ready,
            drain_timeout,
        })
    })
    .await
}

/// Stores the job `make` asks of the bundle `local` names, `file` validated
/// against that bundle's catalog.
async fn bundle_job(db: &JobDb, file: &Path, local: Local, make: impl FnOnce(String) -> Request) -> anyhow::Result<i64> {
    let local = local.absolute()?;
    let Some(bundle) = local.bundle.as_deref() else {
        return Err(op(
            OpError::Usage,
            anyhow::anyhow!("pass --bundle k.tar.zst (built by kubexm-bundle)"),
        ));
    };
    let (opened, cluster) =
        kubexm_installer::ops::session::validate(&kubexm_installer::ops::session::Config::File(file.to_path_buf()), bundle)?;
    // The file's own digest: what the worker checks the bundle it unpacks against.
    let request = make(opened.file_digest);
    store_operators(db, file, &cluster, &request, Some(&local)).await
}

/// Stores the operator's job asking `request` of the cluster of `file`.
async fn store_operators(
    db: &JobDb,
    file: &Path,
    cluster: &kubexm_bom::config::Cluster,
    request: &Request,
    local: Option<&Local>,
) -> anyhow::Result<i64> {
    let text = fs_err::read_to_string(file)?;
    let origin = origin_of(db, &text, file)?;
    let options = job_request::options(request, local);
    let name = file.display().to_string();
    Ok(store_job(db, cluster, text, name, request.kind(), options, By::operator(origin)).await?)
}

/// Who a job the operator creates here counts as written by: the operator,
/// on a SQLite database of this machine; a request on a database other
/// machines share (any worker may claim it), held to a request's rules now.
fn origin_of(db: &JobDb, text: &str, file: &Path) -> anyhow::Result<Origin> {
    if !db.shared() {
        return Ok(Origin::Operator);
    }
    kubexm_bom::config::load_str_as(text, &file.display().to_string(), None, Origin::Request).map_err(|e| {
        op(
            OpError::Config,
            anyhow::anyhow!(
                "{e}\n{} is shared by workers on other machines: its jobs name hosts' credentials only as server-side credentials",
                db.path().display()
            ),
        )
    })?;
    Ok(Origin::Request)
}

/// A request's config text (the API) validated, the errors naming `name`:
/// against `catalog` (the bundle's) for an install, without one for facts
/// and reset. CPU work, which the API runs off its async threads.
pub fn validate_text(
    text: &str,
    name: &str,
    catalog: Option<&kubexm_bom::catalog::Catalog>,
) -> Result<kubexm_bom::config::Cluster, CreateError> {
    Ok(kubexm_bom::config::load_str_as(text, name, catalog, Origin::Request)?)
}

/// Who a stored job is by: its origin, principal, and whether it may act
/// on any cluster name.
struct By {
    origin: Origin,
    principal: Option<String>,
    admin: bool,
    root: Option<std::path::PathBuf>,
}

impl By {
    fn request(who: Requester<'_>) -> By {
        By {
            origin: Origin::Request,
            principal: Some(who.name.to_string()),
            admin: who.admin,
            root: who.root.map(Path::to_path_buf),
        }
    }

    /// A job the operator creates on this machine (a request's rules on a
    /// shared database, `origin`).
    fn operator(origin: Origin) -> By {
        By {
            origin,
            principal: local_user(),
            admin: false,
            root: None,
        }
    }
}

/// Who asks, through the API: recorded on the job; `admin` may act on
/// any cluster name (another principal's too).
#[derive(Debug, Clone, Copy)]
pub struct Requester<'a> {
    pub name: &'a str,
    pub admin: bool,
    /// The installer's state root on the server's machine: a cluster found
    /// there without a binding is not bound to a request.
    pub root: Option<&'a Path>,
}

/// Why a job was not created from config text.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error(transparent)]
    Invalid(#[from] kubexm_bom::config::LoadError),
    /// The cluster name belongs to another principal, or to other hosts.
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Store(anyhow::Error),
}

/// A facts or reset job for the hosts of `file` (validated as those
/// operations read it: no catalog needed). Nothing is stored when it is invalid.
pub async fn create_hosts_job(db: &JobDb, file: &Path, request: &Request, local: Option<Local>) -> anyhow::Result<i64> {
    let cluster = kubexm_bom::config::load_file_hosts(file)?;
    kubexm_installer::ops::session::check_hosts(&cluster, &request.named_hosts())?;
    let local = local.map(Local::absolute).transpose()?;
    store_operators(db, file, &cluster, request, local.as_ref()).await
}

/// A job asking `request` from config text (the API), `cluster` its
/// validation ([`validate_text`]: against the bundle's catalog for an
/// install, without one for facts and reset, as [`create_hosts_job`]
/// validates a file). An install names only the bundle's digest: the
/// claiming worker's own options complete it.
pub async fn create_job_text(
    db: &JobDb,
    cluster: &kubexm_bom::config::Cluster,
    text: &str,
    name: &str,
    request: &Request,
    who: Requester<'_>,
) -> Result<i64, CreateError> {
    let options = job_request::options(request, None);
    store_job(
        db,
        cluster,
        text.to_string(),
        name.to_string(),
        request.kind(),
        options,
        By::request(who),
    )
    .await
}

async fn store_job(
    db: &JobDb,
    cluster: &kubexm_bom::config::Cluster,
    text: String,
    name: String,
    kind: &str,
    options: serde_json::Value,
    by: By,
) -> Result<i64, CreateError> {
    let By {
        origin,
        principal,
        admin,
        root,
    } = by;
    let cname = &cluster.metadata.name;
    let exists = root.is_some_and(|r| r.join(format!("{cname}.kubeconfig")).exists() || r.join("clusters").join(cname).exists());
    // A request's cluster name is bound to its first principal and hosts
    // before anything of that cluster is read; the operator's own jobs
    // record a missing binding (so no request can take their cluster).
    let hosts: Vec<String> = cluster.spec.hosts.iter().map(|h| h.address.clone()).collect();
    let who = principal.clone().unwrap_or_else(|| "local".into());
    db.bind_cluster(cname, &who, &hosts, origin == Origin::Request && !admin, exists)
        .await
        .map_err(|e| CreateError::Store(e.into()))?
        .map_err(CreateError::Conflict)?;
    db.create(&NewJob {
        cluster: cluster.metadata.name.clone(),
        kind: kind.into(),
        config: text,
        config_name: name,
        options,
        origin,
        principal,
    })
    .await
    .map_err(|e| CreateError::Store(e.into()))
}

/// The principal of a job created on this machine: `local:<user>`.
fn local_user() -> Option<String> {
    let user = std::env::var("SUDO_USER")
        .or_else(|_| std::env::var("USER"))
        .unwrap_or_else(|_| "root".into());
    Some(format!("local:{}", crate::text::line(&user)))
}

/// A job by id, or a usage error naming it.
pub async fn job(db: &JobDb, id: i64) -> anyhow::Result<Job> {
    db.get(id).await?.ok_or_else(|| {
        op(
            OpError::Usage,
            anyhow::anyhow!("no job {id} in {}; `kubexm get jobs` lists them", db.path().display()),
        )
    })
}

/// The timeline job `id`'s run stored; refused when the job is unknown or
/// has none yet.
pub async fn timeline(db: &JobDb, id: i64) -> anyhow::Result<kubexm_engine::timeline::Timeline> {
    job(db, id).await?;
    db.timeline(id).await?.ok_or_else(|| {
        op(
            OpError::Usage,
            anyhow::anyhow!("job {id} has no timeline yet: it has not run, or is running; `kubexm get job {id}` says how far it is"),
        )
    })
}

/// Hands `line` every log line of job `id` after `after`, in order and
/// each once, until the job has ended (`follow`) or until the lines
/// written so far are read; returns the job as it ended (or is).
pub async fn follow(
    db: &JobDb,
    id: i64,
    mut after: i64,
    follow: bool,
    quit: &Arc<AtomicBool>,
    mut line: impl FnMut(&LogLine),
) -> anyhow::Result<Job> {
    loop {
        // The status first: once final, the lines read next are all there are.
        let j = job(db, id).await?;
        for l in db.logs(id, after).await? {
            line(&l);
            after = l.seq;
        }
        if !follow || j.status.is_final() || quit.load(Ordering::Relaxed) {
            return Ok(j);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A job that ended other than in Success, as an error with what to do.
pub fn outcome(j: &Job) -> anyhow::Result<()> {
    use crate::jobdb::Status;
    match j.status {
        Status::Success => Ok(()),
        Status::Failed => Err(op(
            OpError::Host,
            anyhow::anyhow!(
                "job {} failed: {}\nfix the cause and create the job again: the steps done are skipped",
                j.id,
                j.error.as_deref().unwrap_or("(no error recorded)")
            ),
        )),
        Status::Cancelled => Err(op(OpError::Host, anyhow::anyhow!("job {} was cancelled", j.id))),
        s => Err(op(
            OpError::Interrupted,
            anyhow::anyhow!(
                "job {} is {}: `kubexm worker` resumes it (the steps done are skipped); `kubexm get job {} --follow` watches it",
                j.id,
                s.as_str(),
                j.id
            ),
        )),
    }
}
