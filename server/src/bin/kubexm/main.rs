//! `kubexm`: clusters as jobs. Thin: flags in, one job operation, output
//! or an error with its documented exit code.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Parser;
use kubexm_cli::{Class, classified};
use kubexm_installer::ops::request::{
    CertsRequest, DeleteRequest, HostsRequest, RemoveRequest, RenewCertsRequest, Request, RestoreRequest, SnapshotRequest,
};
use kubexm_server::jobdb::{JobDb, LogLine, Scope};
use kubexm_server::{api, bundles, client, credentials, ops, worker};

mod admin;
mod args;
/// The exit codes kubexm-install maps the same operations' failures to.
#[path = "../../../../installer/src/bin/kubexm-install/exit_codes.rs"]
mod exit_codes;
mod print;
use admin::{credential, host_key, token};
use args::*;
use print::*;

fn main() -> ExitCode {
    let cli = Cli::parse();
    kubexm_cli::init_logging(cli.verbose);
    let done = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt.block_on(run(cli)),
        Err(e) => Err(classified(Class::Io, anyhow::anyhow!("starting the async runtime: {e}"))),
    };
    kubexm_cli::exit(done, exit_codes::kind)
}

/// Set on the first Ctrl-C; the second ends the process.
fn quit_flag() -> Arc<AtomicBool> {
    let quit = Arc::new(AtomicBool::new(false));
    let q = quit.clone();
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
            return;
        };
        rt.block_on(async {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("stopping: no new step starts; running ones finish (Ctrl-C again to leave now)");
                q.store(true, Ordering::Relaxed);
            }
            if tokio::signal::ctrl_c().await.is_ok() {
                std::process::exit(130);
            }
        });
    });
    quit
}

fn jobs_dir(db: &JobDb) -> PathBuf {
    db.jobs_dir()
}

/// The job database at `path`, opened.
async fn open(path: &std::path::Path) -> anyhow::Result<Arc<JobDb>> {
    refuse_password_in_url(path)?;
    Ok(Arc::new(JobDb::open(path).await.map_err(|e| classified(Class::Io, e))?))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Token { what } => token(&*open(&cli.db).await?, what).await,
        Command::ClientCert {
            what:
                ClientCertCmd::Create {
                    name,
                    out,
                    tls_dir,
                    scopes,
                    days,
                },
        } => {
            let scopes = Scope::parse_list(&scopes).map_err(|e| classified(Class::Usage, anyhow::anyhow!("--scopes: {e}")))?;
            let (crt, key) = api::tls::client_cert(&tls_dir, &name, &out, &scopes, days).map_err(|e| classified(Class::Usage, e))?;
            println!("{}\n{}", crt.display(), key.display());
            eprintln!(
                "signed by {} for {days} days, scopes {}: name them as clientCert and clientKey in the client config",
                tls_dir.join("ca.crt").display(),
                Scope::join(&scopes)
            );
            Ok(())
        }
        Command::ClientCert {
            what: ClientCertCmd::Revoke { cert },
        } => {
            let id = api::tls::CertIdentity::of_pem_file(&cert).map_err(|e| classified(Class::Usage, e))?;
            open(&cli.db).await?.revoke_cert(&id.fingerprint, &id.name).await?;
            eprintln!("client certificate {} (sha256 {}) revoked", id.name, id.fingerprint);
            Ok(())
        }
        Command::Bundle {
            what: BundleCmd::Add {
                file,
                pubkey,
                bundles: dir,
            },
        } => {
            let held = bundles::add(&file, &pubkey, &dir).map_err(|e| {
                let class = match &e {
                    bundles::BundleError::Base(d) if d.is_unsupported() => Class::Unsupported,
                    _ => Class::Verify,
                };
                classified(class, e)
            })?;
            println!("{}", held.digest);
            eprintln!(
                "held as {} (cluster {}, Kubernetes {}); jobs name it by this digest",
                held.path.display(),
                held.cluster,
                held.kubernetes
            );
            Ok(())
        }
        Command::Bundle {
            what: BundleCmd::List { bundles: dir },
        } => {
            for d in bundles::list(&dir)? {
                println!("{d}");
            }
            Ok(())
        }
        Command::Credential { what } => credential(&*open(&cli.db).await?, &key_path(&cli.db, cli.credential_key), what).await,
        Command::HostKey { what } => host_key(&*open(&cli.db).await?, what).await,
        Command::ControllerManager(a) => controller_manager(a).await,
        Command::ApiServer(a) => {
            let key = key_path(&cli.db, cli.credential_key);
            api_server(open(&cli.db).await?, a, key).await
        }
        Command::Worker(w) => {
            let db = open(&cli.db).await?;
            let mut o = worker::WorkerOptions::here(w.state, jobs_dir(&db));
            o.credential_key = key_path(&cli.db, cli.credential_key);
            o.retain = retention(w.retain_days);
            o.lease = std::time::Duration::from_secs(w.lease_seconds.max(3));
            o.install = w.install.worker();
            eprintln!("kubexm worker {} on {}: claiming jobs", o.name, db.path().display());
            let ran = worker::serve(&db, &o, quit_flag(), w.once).await?;
            eprintln!("kubexm worker {}: ran {ran} job(s)", o.name);
            Ok(())
        }
        command => {
            let config = cli
                .config
                .or_else(|| std::env::var_os("KUBEXM_CONFIG").map(PathBuf::from))
                .or_else(|| Some(PathBuf::from(client::CLIENT_CONFIG)).filter(|p| p.exists()));
            match config {
                Some(c) => remote(&client::ClientConfig::load(&c).map_err(|e| classified(Class::Usage, e))?, command).await,
                None => local(open(&cli.db).await?, command, key_path(&cli.db, cli.credential_key)).await,
            }
        }
    }
}

/// Resolves on the first SIGINT or SIGTERM.
async fn interrupted() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

/// `kubexm controller-manager`: leads or waits to, until SIGINT or SIGTERM
/// (then a leader hands its Lease back) or until leadership is lost (an
/// error: only the new leader may act).
async fn controller_manager(a: ControllerManagerArgs) -> anyhow::Result<()> {
    let identity = match a.identity.or_else(|| std::env::var("POD_NAME").ok().filter(|v| !v.is_empty())) {
        Some(i) => i,
        None => format!("{}-{}", kubexm_operator::lease::this_machine(), std::process::id()),
    };
    let o = kubexm_operator::Options {
        kubeconfig: a.kubeconfig,
        namespace: a.namespace,
        identity,
        lease_name: a.lease_name,
        lease_duration: std::time::Duration::from_secs(a.lease_seconds),
        act: match (a.root, a.state) {
            (Some(root), Some(state)) => Some(kubexm_operator::act::ActOptions {
                root,
                state,
                advertise: a.advertise,
                serve_port: a.serve_port,
                concurrency: a.concurrency as usize,
                // Only a registry moved to a new host needs it.
                installer: kubexm_server::worker::installer_binary()
                    .map_err(|e| tracing::warn!("{e}: a change that moves the registry will fail"))
                    .ok(),
            }),
            _ => None,
        },
    };
    let stop = async {
        interrupted().await;
        eprintln!("stopping: a leader hands its Lease back");
    };
    eprintln!(
        "kubexm controller-manager {} in namespace {}, Lease {}",
        o.identity, o.namespace, o.lease_name
    );
    kubexm_operator::run(o, stop).await.map_err(|e| classified(Class::Host, e))
}

/// `kubexm api-server`: serves until SIGINT or SIGTERM; the embedded worker
/// then starts no new step and gives its job back.
async fn api_server(db: Arc<JobDb>, a: ApiServerArgs, credential_key: PathBuf) -> anyhow::Result<()> {
    if !a.no_worker && a.install.advertise.is_none() {
        return Err(classified(
            Class::Usage,
            anyhow::anyhow!(
                "pass --advertise ADDR: the address hosts reach this machine at, for the file server of the embedded worker's install jobs (or --no-worker)"
            ),
        ));
    }
    if a.health_listen.is_some_and(|h| !h.ip().is_loopback()) {
        return Err(classified(
            Class::Usage,
            anyhow::anyhow!("--health-listen: plain HTTP without credentials listens on loopback only (127.0.0.1:PORT or [::1]:PORT)"),
        ));
    }
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    if let Ok(h) = fs_err::read_to_string("/etc/hostname") {
        names.push(h.trim().to_string());
    }
    if !a.listen.ip().is_unspecified() {
        names.push(a.listen.ip().to_string());
    }
    names.extend(a.san);
    names.retain(|n| !n.is_empty());
    names.dedup();
    let o = api::ApiOptions {
        listen: a.listen,
        tls_dir: a.tls_dir,
        names,
        bundles: a.install.bundles.clone(),
        max_connections: a.max_connections,
        health_listen: a.health_listen,
        worker: (!a.no_worker).then(Default::default),
        post_rate: a.post_rate,
        root: Some(a.install.root.clone()),
    };
    let quit = Arc::new(AtomicBool::new(false));
    let embedded = o.worker.clone().map(|health| {
        let mut w = worker::WorkerOptions::here(a.state, jobs_dir(&db));
        w.lease = std::time::Duration::from_secs(a.lease_seconds.max(3));
        w.install = a.install.worker();
        w.credential_key = credential_key;
        w.retain = retention(a.retain_days);
        let (db, quit) = (db.clone(), quit.clone());
        // Started again with backoff whenever the database fails under it.
        tokio::spawn(async move { worker::supervise(&db, &w, quit, &health).await })
    });
    let q = quit.clone();
    let stop = async move {
        interrupted().await;
        eprintln!("stopping: no new step starts; a running job is given back for the next claim");
        q.store(true, Ordering::Relaxed);
    };
    eprintln!(
        "kubexm api-server on https://{} (CA {}), job database {}{}",
        o.listen,
        o.tls_dir.join("ca.crt").display(),
        db.path().display(),
        if embedded.is_some() { ", embedded worker" } else { "" }
    );
    let handle = axum_server::Handle::new();
    let h = handle.clone();
    tokio::spawn(async move {
        stop.await;
        h.graceful_shutdown(Some(std::time::Duration::from_secs(5)));
    });
    let served = api::serve(db, o, handle).await;
    quit.store(true, Ordering::Relaxed);
    if let Some(w) = embedded {
        w.await.map_err(|_| anyhow::anyhow!("the embedded worker panicked"))?;
    }
    served
}

/// A PostgreSQL password never comes from the command line (every user of
/// the machine reads argv): it goes in ~/.pgpass or PGPASSFILE (0600).
fn refuse_password_in_url(db: &std::path::Path) -> anyhow::Result<()> {
    let url = db.to_string_lossy();
    if !kubexm_server::jobdb::is_postgres(db) {
        return Ok(());
    }
    let userinfo = url
        .split_once("://")
        .map(|(_, r)| r.split(['/', '?']).next().unwrap_or(""))
        .unwrap_or("");
    let in_userinfo = userinfo.rsplit_once('@').is_some_and(|(u, _)| u.contains(':'));
    let in_query = url
        .split_once('?')
        .is_some_and(|(_, q)| q.split('&').any(|p| p.starts_with("password=")));
    if in_userinfo || in_query {
        return Err(classified(
            Class::Usage,
            anyhow::anyhow!(
                "--db: the URL holds a password, which every user of this machine can read in the process list; \
                 put it in ~/.pgpass or the file PGPASSFILE names (mode 0600) and leave it out of the URL"
            ),
        ));
    }
    Ok(())
}

/// The credential key: given, beside a SQLite database, or the default.
fn key_path(db: &std::path::Path, given: Option<PathBuf>) -> PathBuf {
    given.unwrap_or_else(|| {
        if kubexm_server::jobdb::is_postgres(db) {
            PathBuf::from(credentials::CREDENTIAL_KEY)
        } else {
            db.parent().unwrap_or(std::path::Path::new(".")).join("credential.key")
        }
    })
}

/// The bundle a local job installs from: a file, or one held by digest.
fn bundle_file(given: &str, dir: &std::path::Path) -> anyhow::Result<PathBuf> {
    if given.starts_with("sha256:") {
        Ok(bundles::find(dir, given).map_err(|e| classified(Class::Usage, e))?)
    } else {
        Ok(PathBuf::from(given))
    }
}

/// `--unreachable` is not sent to an API server yet: refused, not dropped.
fn remote_unreachable(h: &args::HostsJob) -> anyhow::Result<()> {
    if h.unreachable.is_empty() {
        return Ok(());
    }
    Err(classified(
        Class::Unsupported,
        anyhow::anyhow!(
            "--unreachable is not supported yet with an API server (the API takes only the config); run the job on the worker's machine without a client config"
        ),
    ))
}

/// `create cluster` (an install) or `scale` (`apply`: an apply) stored in
/// the local job database and, unless detached, run here.
/// Which job `create cluster`, `scale` and `upgrade cluster` store.
enum Stored {
    Install,
    Apply,
    /// With the NotReady workers to leave alone and the drains' time limit.
    Upgrade(Vec<String>, Option<u32>),
}

async fn create_here(db: &Arc<JobDb>, c: CreateCluster, key: PathBuf, quit: &Arc<AtomicBool>, what: Stored) -> anyhow::Result<()> {
    if c.allow_unsigned && c.pubkey.is_none() {
        eprintln!(
            "WARNING: --allow-unsigned: this bundle's origin is NOT verified. Anyone who could change it could run code on every node."
        );
    }
    if c.pubkey.is_none() && !c.allow_unsigned {
        return Err(classified(
            Class::Usage,
            anyhow::anyhow!("pass --pubkey FILE to verify the bundle's signature (or --allow-unsigned)"),
        ));
    }
    let Some(advertise) = c.advertise else {
        return Err(classified(
            Class::Usage,
            anyhow::anyhow!("pass --advertise ADDR: the address hosts reach the worker's machine at"),
        ));
    };
    let live = detachable(db, c.detach).await?;
    let local = kubexm_server::job_request::Local {
        bundle: Some(bundle_file(&c.bundle, &c.bundles)?),
        pubkey: c.pubkey,
        allow_unsigned: c.allow_unsigned,
        advertise: Some(advertise),
        serve_port: Some(c.serve_port),
        root: Some(c.root),
        kubeconfig: c.kubeconfig,
    };
    if !matches!(what, Stored::Install) && !c.phases.is_empty() {
        return Err(classified(
            Class::Usage,
            anyhow::anyhow!("--phases: scale and upgrade run what the change needs, not chosen phases"),
        ));
    }
    let id = match what {
        Stored::Apply => ops::create_apply(db, &c.file, local).await?,
        Stored::Upgrade(skip, drain) => ops::create_upgrade(db, &c.file, skip, drain, local).await?,
        Stored::Install => ops::create_cluster(db, &c.file, &c.phases, local).await?,
    };
    run_created(db, id, c.detach, &live, (c.state, key), quit).await
}

/// `create cluster` or `scale` stored through the API server at `server`.
async fn create_there(c: &client::Client, server: &str, cc: CreateCluster, what: Stored) -> anyhow::Result<()> {
    if !cc.bundle.starts_with("sha256:") {
        return Err(classified(
            Class::Usage,
            anyhow::anyhow!(
                "{}: with an API server ({}), name the bundle by digest: `kubexm bundle add FILE --pubkey KEY` on the server prints it",
                cc.bundle,
                server
            ),
        ));
    }
    let text = fs_err::read_to_string(&cc.file).map_err(|e| classified(Class::Io, e))?;
    if !matches!(what, Stored::Install) && !cc.phases.is_empty() {
        return Err(classified(
            Class::Usage,
            anyhow::anyhow!("--phases: scale and upgrade run what the change needs, not chosen phases"),
        ));
    }
    let id = match what {
        Stored::Apply => c.create_apply(text, Some(&cc.bundle)).await.map_err(api)?,
        Stored::Upgrade(skip, drain) => {
            let o = client::UpgradeOptions {
                skip_not_ready: &skip,
                drain_timeout: drain,
            };
            c.create_upgrade(text, Some(&cc.bundle), &o).await.map_err(api)?
        }
        Stored::Install => c.create_cluster(text, Some(&cc.bundle)).await.map_err(api)?,
    };
    follow_created(c, id, cc.detach).await
}

/// create, get and cancel against the local job database.
async fn local(db: Arc<JobDb>, command: Command, key: PathBuf) -> anyhow::Result<()> {
    let quit = quit_flag();
    let command = match hosts_job(command)? {
        Ok((h, root, request)) => return hosts_job_here(&db, h, root, &request, key, &quit).await,
        Err(other) => other,
    };
    match command {
        Command::Create { what: Create::Cluster(c) } => create_here(&db, c, key, &quit, Stored::Install).await,
        Command::Scale(c) => create_here(&db, c, key, &quit, Stored::Apply).await,
        Command::Upgrade {
            what: UpgradeCmd::Cluster(u),
        } => create_here(&db, u.create, key, &quit, Stored::Upgrade(u.skip_not_ready, u.drain_timeout)).await,
        Command::Get {
            what:
                Get::Job {
                    id,
                    output,
                    timeline: Some(file),
                    ..
                },
        } => write_timeline(&ops::timeline(&db, id).await?, output, &file),
        Command::Get {
            what: Get::Job {
                id, output, follow, from, ..
            },
        } => {
            let head = ops::job(&db, id).await?;
            let mut logs = Vec::new();
            let mut p = JobPrinter::new(output, follow);
            p.head(&head)?;
            let j = ops::follow(&db, id, from, follow, &quit, |l| p.line(l, &mut logs)).await?;
            p.end(&j, logs)
        }
        Command::Get {
            what: Get::Jobs { output },
        } => print_jobs(&db.list().await?, output),
        Command::Cancel { what: Cancel::Job { id } } => match db.request_cancel(id).await? {
            None => Err(classified(Class::Usage, anyhow::anyhow!("no job {id} in {}", db.path().display()))),
            Some(s) => print_cancelled(id, s),
        },
        _ => Ok(()),
    }
}

/// The live workers; with `detach`, refused when there is none.
async fn detachable(db: &JobDb, detach: bool) -> anyhow::Result<Vec<String>> {
    let live = db.live_workers(10_000).await?;
    if detach && live.is_empty() {
        return Err(classified(
            Class::Usage,
            anyhow::anyhow!(
                "--detach: no worker is running on {}; start `kubexm worker` (or kubexm-worker.service), or drop --detach to run the job here",
                db.path().display()
            ),
        ));
    }
    Ok(live)
}

/// After a job is stored: return (`detach`), follow a running worker's run
/// of it, or run it here as a worker for this job while its log streams.
/// A hosts job's flags, the state root of a job run here, its request.
type HostsJobOf = (args::HostsJob, Option<PathBuf>, Request);

/// The job over the hosts of a config that `command` asks for: its flags,
/// the state root of a job run here (`None`: the worker's) and the
/// request, a destructive one confirmed first; any other command back.
fn hosts_job(command: Command) -> anyhow::Result<Result<HostsJobOf, Command>> {
    let job = match command {
        Command::Create {
            what: Create::EtcdSnapshot(e),
        } => {
            let request = Request::EtcdSnapshot(SnapshotRequest {
                unreachable: e.job.unreachable.clone(),
                keep: e.keep,
            });
            (e.job, Some(e.root), request)
        }
        Command::Create {
            what: Create::CertsCheck(c),
        } => {
            let request = Request::CertsCheck(CertsRequest {
                unreachable: c.job.unreachable.clone(),
                warn_days: c.warn_days,
            });
            (c.job, None, request)
        }
        Command::Create {
            what: Create::CertsRenew(c),
        } => {
            let request = Request::CertsRenew(RenewCertsRequest {
                unreachable: c.job.unreachable.clone(),
                within_days: c.within,
                all: c.all,
            });
            (c.job, Some(c.root), request)
        }
        Command::Create { what: Create::Facts(h) } => {
            let request = Request::Facts(HostsRequest {
                unreachable: h.unreachable.clone(),
            });
            (h, None, request)
        }
        Command::Reset {
            what: ResetCmd::Cluster { job: h, yes, root },
        } => {
            confirmed("reset", &h.file, yes)?;
            let request = Request::Reset(HostsRequest {
                unreachable: h.unreachable.clone(),
            });
            (h, Some(root), request)
        }
        Command::Delete {
            what: DeleteCmd::Cluster { job: h, yes, purge, root },
        } => {
            confirmed("delete", &h.file, yes)?;
            let request = Request::DeleteCluster(DeleteRequest {
                unreachable: h.unreachable.clone(),
                purge,
            });
            (h, Some(root), request)
        }
        Command::Remove {
            what:
                RemoveCmd::Node {
                    hosts,
                    job: h,
                    drain_timeout,
                    force_drain,
                    root,
                },
        } => {
            let request = Request::RemoveNode(RemoveRequest {
                hosts,
                unreachable: h.unreachable.clone(),
                drain_timeout,
                force_drain,
            });
            (h, Some(root), request)
        }
        Command::Restore {
            what:
                RestoreCmd::Etcd {
                    job: h,
                    snapshot,
                    yes,
                    root,
                },
        } => {
            if !yes {
                return Err(classified(
                    Class::Usage,
                    anyhow::anyhow!(
                        "restore puts the etcd of the cluster of {} back to {snapshot}: what changed since is lost; nothing was stored. Pass --yes to do it",
                        h.file.display()
                    ),
                ));
            }
            if !h.unreachable.is_empty() {
                return Err(classified(
                    Class::Usage,
                    anyhow::anyhow!(
                        "restore stops and restores every etcd member and API server: it takes no --unreachable; bring the hosts back first"
                    ),
                ));
            }
            let request = Request::EtcdRestore(RestoreRequest { snapshot });
            (h, Some(root), request)
        }
        other => return Ok(Err(other)),
    };
    Ok(Ok(job))
}

/// Stores a job of `request` for the hosts of `h`'s config, run here with
/// `root` as its state root (`None`: the worker's), and follows it.
async fn hosts_job_here(
    db: &Arc<JobDb>,
    h: args::HostsJob,
    root: Option<PathBuf>,
    request: &Request,
    key: PathBuf,
    quit: &Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let live = detachable(db, h.detach).await?;
    let local = root.map(|root| kubexm_server::job_request::Local {
        root: Some(root),
        ..Default::default()
    });
    let id = ops::create_hosts_job(db, &h.file, request, local).await?;
    run_created(db, id, h.detach, &live, (h.state, key), quit).await
}

async fn run_created(
    db: &Arc<JobDb>,
    id: i64,
    detach: bool,
    live: &[String],
    (state, credential_key): (PathBuf, PathBuf),
    quit: &Arc<AtomicBool>,
) -> anyhow::Result<()> {
    println!("Job created with ID {id}. Run 'kubexm get job {id}' to check status.");
    if detach {
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    let mut print = |l: &LogLine| {
        let _ = writeln!(out, "{}", l.line);
    };
    if !live.is_empty() {
        // A worker runs it; follow it here.
        let j = ops::follow(db, id, 0, true, quit, &mut print).await?;
        return ops::outcome(&j);
    }
    // No worker: this process is one, for this job, while the log streams here.
    let mut o = worker::WorkerOptions::here(state, jobs_dir(db));
    o.credential_key = credential_key;
    let claim = db
        .claim(&o.name, &o.machine, o.lease.as_millis() as i64, Some(id))
        .await?
        .ok_or_else(|| {
            classified(
                Class::Host,
                anyhow::anyhow!(
                    "job {id} cannot run here now: another job of its cluster is running, or its cluster's jobs run on another machine; `kubexm get job {id}` shows it"
                ),
            )
        })?;
    let runner = {
        let (db, quit) = (db.clone(), quit.clone());
        tokio::spawn(async move { worker::run(&db, claim, &o, quit).await })
    };
    let mut after = 0;
    while !runner.is_finished() {
        ops::follow(db, id, after, false, quit, |l| {
            print(l);
            after = l.seq;
        })
        .await?;
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    runner.await.map_err(|_| anyhow::anyhow!("the job's worker task panicked"))??;
    let never = Arc::new(AtomicBool::new(false));
    let j = ops::follow(db, id, after, false, &never, print).await?;
    ops::outcome(&j)
}

/// create, get and cancel against the API server the client config names.
async fn remote(config: &client::ClientConfig, command: Command) -> anyhow::Result<()> {
    let c = client::Client::new(config).map_err(|e| classified(Class::Usage, e))?;
    let command = match hosts_job(command)? {
        Ok((h, _, request)) => {
            // Only a removal and a delete take hosts named unreachable through the API.
            if !matches!(request, Request::RemoveNode(_) | Request::DeleteCluster(_)) {
                remote_unreachable(&h)?;
            }
            let text = fs_err::read_to_string(&h.file).map_err(|e| classified(Class::Io, e))?;
            let id = c.create_hosts_job(text, &request).await.map_err(api)?;
            return follow_created(&c, id, h.detach).await;
        }
        Err(other) => other,
    };
    match command {
        Command::Create { what: Create::Cluster(cc) } => create_there(&c, &config.server, cc, Stored::Install).await,
        Command::Scale(cc) => create_there(&c, &config.server, cc, Stored::Apply).await,
        Command::Upgrade {
            what: UpgradeCmd::Cluster(u),
        } => create_there(&c, &config.server, u.create, Stored::Upgrade(u.skip_not_ready, u.drain_timeout)).await,
        Command::Get {
            what:
                Get::Job {
                    id,
                    output,
                    timeline: Some(file),
                    ..
                },
        } => write_timeline(&c.timeline(id).await.map_err(api)?, output, &file),
        Command::Get {
            what: Get::Job {
                id, output, follow, from, ..
            },
        } => {
            let head = c.job(id).await.map_err(api)?;
            let mut logs = Vec::new();
            let mut p = JobPrinter::new(output, follow);
            p.head(&head)?;
            c.follow(id, from, follow, |l| p.line(l, &mut logs)).await.map_err(api)?;
            let j = if follow { c.job(id).await.map_err(api)? } else { head };
            p.end(&j, logs)
        }
        Command::Get {
            what: Get::Jobs { output },
        } => print_jobs(&c.jobs().await.map_err(api)?, output),
        Command::Cancel { what: Cancel::Job { id } } => print_cancelled(id, c.cancel(id).await.map_err(api)?),
        _ => Ok(()),
    }
}

/// Writes a job's timeline to `file` (an SVG, or JSON with -o json),
/// whole or not at all, and prints where the time went.
fn write_timeline(t: &kubexm_engine::timeline::Timeline, output: Format, file: &std::path::Path) -> anyhow::Result<()> {
    use kubexm_installer::ops::status::{TimelineFormat, write_timeline};
    let format = match output {
        Format::Text => TimelineFormat::Svg,
        Format::Json => TimelineFormat::Json,
        Format::Yaml => {
            return Err(classified(
                Class::Usage,
                anyhow::anyhow!("--timeline writes an SVG (-o text) or JSON (-o json), not YAML"),
            ));
        }
    };
    write_timeline(t, format, file)?;
    eprintln!("wrote the timeline of job {} to {}", t.job, file.display());
    print!("{}", t.summary());
    Ok(())
}

/// A reset is stored only when confirmed.
fn confirmed(what: &str, file: &std::path::Path, yes: bool) -> anyhow::Result<()> {
    if yes {
        return Ok(());
    }
    Err(classified(
        Class::Usage,
        anyhow::anyhow!(
            "{what} deletes the cluster of {} on its hosts, etcd data included; nothing was stored. Pass --yes to do it",
            file.display()
        ),
    ))
}

/// Prints the created job's id; unless `detach`, follows its log to the
/// end and returns its outcome.
async fn follow_created(c: &client::Client, id: i64, detach: bool) -> anyhow::Result<()> {
    println!("Job created with ID {id}. Run 'kubexm get job {id}' to check status.");
    if detach {
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    c.follow(id, 0, true, |l| {
        let _ = writeln!(out, "{}", l.line);
    })
    .await
    .map_err(api)?;
    ops::outcome(&c.job(id).await.map_err(api)?)
}

/// An API client's error, classified for its exit code.
fn api(e: client::ClientError) -> anyhow::Error {
    match e {
        client::ClientError::Invalid(_) => classified(Class::Config, e),
        client::ClientError::Refused { status: 404, .. } | client::ClientError::Refused { status: 400, .. } => classified(Class::Usage, e),
        e => classified(Class::Fetch, e),
    }
}
