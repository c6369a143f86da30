//! `kubexm`: clusters as jobs. Thin: flags in, one job operation, output
//! or an error with its documented exit code.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::{Args, Parser, Subcommand, ValueEnum};
use kubexm_cli::{Class, classified};
use kubexm_server::jobdb::{JOBS_DB, Job, JobDb, LogLine};
use kubexm_server::{ops, worker};

/// Clusters as jobs: `create cluster` stores a validated request as a job; a
/// worker runs it with the same operations and engine as kubexm-install,
/// writing its current step and log lines into the job database.
#[derive(Parser)]
#[command(
    name = "kubexm",
    version,
    after_help = "Exit codes: 0 ok, 1 bug, 2 usage, 3 invalid config, 4 file I/O, 5 fetch, 6 verification, 7 host or failed job, 8 not supported yet, 130 interrupted."
)]
struct Cli {
    /// The job database (SQLite).
    #[arg(long, global = true, value_name = "FILE", default_value = JOBS_DB)]
    db: PathBuf,
    /// More log output (-v info, -vv debug).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Store a job (create cluster: an install; a re-run of an existing cluster applies only what is missing).
    Create {
        #[command(subcommand)]
        what: Create,
    },
    /// Show a job (status, current step, times, log) or the jobs.
    Get {
        #[command(subcommand)]
        what: Get,
    },
    /// Cancel a job: one waiting ends at once; a running one starts no new step.
    Cancel {
        #[command(subcommand)]
        what: Cancel,
    },
    /// Claim and run jobs from the job database until stopped.
    Worker(WorkerArgs),
    /// The HTTP API (not supported yet).
    ApiServer,
    /// Bearer tokens for the API (not supported yet).
    Token,
    /// Bundles a worker holds by digest (not supported yet).
    Bundle,
}

#[derive(Subcommand)]
enum Create {
    /// A cluster from cluster.yaml and a bundle: validated, stored, run.
    Cluster(CreateCluster),
}

#[derive(Args)]
struct CreateCluster {
    /// cluster.yaml.
    #[arg(short, long, value_name = "FILE")]
    file: PathBuf,
    /// The bundle (built by kubexm-bundle).
    #[arg(long, value_name = "FILE")]
    bundle: PathBuf,
    /// The bundle's minisign public key.
    #[arg(long, value_name = "FILE", required_unless_present = "allow_unsigned")]
    pubkey: Option<PathBuf>,
    /// Accept a bundle without checking a signature (warns loudly).
    #[arg(long)]
    allow_unsigned: bool,
    /// The address hosts reach the worker's machine at (its file server).
    #[arg(long, value_name = "ADDR")]
    advertise: std::net::IpAddr,
    /// Port of the file server the worker runs during the install.
    #[arg(long, default_value_t = 5443)]
    serve_port: u16,
    /// The installer's state root on the worker's machine (unpacked bundles, PKI).
    #[arg(long, value_name = "DIR", default_value = kubexm_installer::ROOT)]
    root: PathBuf,
    /// Phases to run, comma-separated (default: all).
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    phases: Vec<String>,
    /// Where the worker writes the admin kubeconfig. Default: <root>/<cluster>.kubeconfig.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Store the job and return: a running `kubexm worker` runs it. Without it, and with
    /// no worker running, the job runs here in the foreground (Ctrl-C leaves it resumable).
    #[arg(long)]
    detach: bool,
    /// The engine's state database, for a job run here.
    #[arg(long, value_name = "FILE", default_value = kubexm_bundle::STATE_DB)]
    state: PathBuf,
}

#[derive(Subcommand)]
enum Get {
    /// One job: status, current step, times and log.
    Job {
        id: i64,
        #[arg(short, long, value_enum, default_value = "text")]
        output: Format,
        /// Stream the log until the job ends (each line once, in order).
        #[arg(long)]
        follow: bool,
        /// With --follow: start after this log sequence number (resume a stream).
        #[arg(long, value_name = "SEQ", default_value_t = 0)]
        from: i64,
    },
    /// Every job, newest first.
    Jobs {
        #[arg(short, long, value_enum, default_value = "text")]
        output: Format,
    },
}

#[derive(Subcommand)]
enum Cancel {
    Job { id: i64 },
}

#[derive(Args)]
struct WorkerArgs {
    /// The engine's state database (step results, pinned host keys).
    #[arg(long, value_name = "FILE", default_value = kubexm_bundle::STATE_DB)]
    state: PathBuf,
    /// Run at most one job, or none if none is waiting, then exit.
    #[arg(long)]
    once: bool,
    /// Seconds a claim holds without renewal before another worker may take the job.
    #[arg(long, default_value_t = 30)]
    lease_seconds: u64,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
    Yaml,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    kubexm_cli::init_logging(cli.verbose);
    kubexm_cli::exit(run(cli).map_err(kubexm_installer::classify))
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
    db.path().parent().map(|p| p.join("jobs")).unwrap_or_else(|| PathBuf::from("jobs"))
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let unsupported = |what: &str| {
        Err(classified(
            Class::Unsupported,
            anyhow::anyhow!(
                "{what} is not supported yet; this release runs jobs from the local job database (create cluster, get, cancel, worker)"
            ),
        ))
    };
    match cli.command {
        Command::ApiServer => return unsupported("kubexm api-server"),
        Command::Token => return unsupported("kubexm token"),
        Command::Bundle => return unsupported("kubexm bundle"),
        _ => {}
    }
    let db = Arc::new(JobDb::open(&cli.db).map_err(|e| classified(Class::Io, e))?);
    let quit = quit_flag();
    match cli.command {
        Command::Create { what: Create::Cluster(c) } => {
            if c.allow_unsigned && c.pubkey.is_none() {
                eprintln!(
                    "WARNING: --allow-unsigned: this bundle's origin is NOT verified. Anyone who could change it could run code on every node."
                );
            }
            let live = db.live_workers(10_000)?;
            if c.detach && live.is_empty() {
                return Err(classified(
                    Class::Usage,
                    anyhow::anyhow!(
                        "--detach: no worker is running on {}; start `kubexm worker` (or kubexm-worker.service), or drop --detach to run the job here",
                        db.path().display()
                    ),
                ));
            }
            let job = worker::InstallJob {
                bundle: c.bundle,
                pubkey: c.pubkey,
                allow_unsigned: c.allow_unsigned,
                advertise: c.advertise,
                serve_port: c.serve_port,
                root: c.root,
                phases: c.phases,
                kubeconfig: c.kubeconfig,
            };
            let id = ops::create_cluster(&db, &c.file, &job)?;
            println!("Job created with ID {id}. Run 'kubexm get job {id}' to check status.");
            if c.detach {
                return Ok(());
            }
            let mut out = std::io::stdout().lock();
            let mut print = |l: &LogLine| {
                let _ = writeln!(out, "{}", l.line);
            };
            if !live.is_empty() {
                // A worker runs it; follow it here.
                let j = ops::follow(&db, id, 0, true, &quit, &mut print)?;
                return ops::outcome(&j);
            }
            // No worker: this process is one, for this job, while the log streams here.
            let o = worker::WorkerOptions::here(c.state, jobs_dir(&db));
            let claim = db
                .claim(&o.name, &o.machine, o.lease.as_millis() as i64, Some(id))?
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
                std::thread::spawn(move || worker::run(&db, claim, &o, quit))
            };
            let mut after = 0;
            while !runner.is_finished() {
                ops::follow(&db, id, after, false, &quit, |l| {
                    print(l);
                    after = l.seq;
                })?;
                std::thread::sleep(std::time::Duration::from_millis(250));
            }
            runner.join().map_err(|_| anyhow::anyhow!("the job's worker thread panicked"))??;
            let never = Arc::new(AtomicBool::new(false));
            let j = ops::follow(&db, id, after, false, &never, print)?;
            ops::outcome(&j)
        }
        Command::Get {
            what: Get::Job { id, output, follow, from },
        } => {
            let mut out = std::io::stdout().lock();
            match output {
                Format::Text => {
                    let j = ops::job(&db, id)?;
                    if !follow {
                        write!(out, "{}", describe(&j))?;
                        writeln!(out, "Log:")?;
                    }
                    let j = ops::follow(&db, id, from, follow, &quit, |l| {
                        let _ = writeln!(
                            out,
                            "{}",
                            if follow {
                                l.line.clone()
                            } else {
                                format!("  {:>5}  {}", l.seq, l.line)
                            }
                        );
                    })?;
                    if follow { ops::outcome(&j) } else { Ok(()) }
                }
                Format::Json | Format::Yaml => {
                    let mut logs = Vec::new();
                    let j = ops::follow(&db, id, from, follow, &quit, |l| logs.push(l.clone()))?;
                    let v = serde_json::json!({"job": j, "logs": logs});
                    match output {
                        Format::Json => writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?,
                        _ => write!(out, "{}", serde_saphyr::to_string(&v)?)?,
                    }
                    Ok(())
                }
            }
        }
        Command::Get {
            what: Get::Jobs { output },
        } => {
            let jobs = db.list()?;
            let mut out = std::io::stdout().lock();
            match output {
                Format::Json => writeln!(out, "{}", serde_json::to_string_pretty(&jobs)?)?,
                Format::Yaml => write!(out, "{}", serde_saphyr::to_string(&jobs)?)?,
                Format::Text => {
                    writeln!(
                        out,
                        "{:<6} {:<16} {:<8} {:<10} {:<20} CURRENT STEP",
                        "ID", "CLUSTER", "KIND", "STATUS", "CREATED"
                    )?;
                    for j in &jobs {
                        writeln!(
                            out,
                            "{:<6} {:<16} {:<8} {:<10} {:<20} {}",
                            j.id,
                            j.cluster,
                            j.kind,
                            j.status.as_str(),
                            utc(j.created),
                            j.current_step.as_deref().unwrap_or("-")
                        )?;
                    }
                }
            }
            Ok(())
        }
        Command::Cancel { what: Cancel::Job { id } } => match db.request_cancel(id)? {
            None => Err(classified(Class::Usage, anyhow::anyhow!("no job {id} in {}", db.path().display()))),
            Some(s) if s.as_str() == "Processing" => {
                println!("job {id}: cancel requested; its worker starts no new step and marks it Cancelled");
                Ok(())
            }
            Some(s) => {
                println!("job {id}: {}", s.as_str());
                Ok(())
            }
        },
        Command::Worker(w) => {
            let mut o = worker::WorkerOptions::here(w.state, jobs_dir(&db));
            o.lease = std::time::Duration::from_secs(w.lease_seconds.max(3));
            eprintln!("kubexm worker {} on {}: claiming jobs", o.name, db.path().display());
            let ran = worker::serve(&db, &o, quit, w.once)?;
            eprintln!("kubexm worker {}: ran {ran} job(s)", o.name);
            Ok(())
        }
        Command::ApiServer | Command::Token | Command::Bundle => Ok(()),
    }
}

/// A job for people.
fn describe(j: &Job) -> String {
    let t = |v: Option<i64>| v.map(utc).unwrap_or_else(|| "-".into());
    format!(
        "ID:           {}\nCluster:      {}\nKind:         {}\nStatus:       {}\nCurrent step: {}\nCreated:      {}\nStarted:      {}\nFinished:     {}\nAttempt:      {}{}\n{}",
        j.id,
        j.cluster,
        j.kind,
        j.status.as_str(),
        j.current_step.as_deref().unwrap_or("-"),
        utc(j.created),
        t(j.started),
        t(j.finished),
        j.attempt,
        j.worker.as_deref().map(|w| format!(" (worker {w})")).unwrap_or_default(),
        j.error.as_deref().map(|e| format!("Error:        {e}\n")).unwrap_or_default(),
    )
}

/// Milliseconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ`.
fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_formats_epoch_milliseconds() {
        assert_eq!(super::utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::utc(1_700_000_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(super::utc(951_782_400_000), "2000-02-29T00:00:00Z");
    }
}
