//! `kubexm-install`: the offline side of kubexm. Thin: flags in, one library
//! call, output or an error with its documented exit code.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Parser, Subcommand};
use kubexm_cli::{Class, Output, classified};
use kubexm_installer::{hosts, mirror, serve, unpack};

/// Install a Kubernetes cluster from a kubexm bundle, with no internet.
#[derive(Parser)]
#[command(
    name = "kubexm-install",
    version,
    about,
    long_about = None,
    args_conflicts_with_subcommands = true,
    after_help = "Exit codes: 0 ok, 1 bug, 2 usage, 3 invalid config, 4 file I/O, 5 fetch, 6 verification, 7 host, 8 not supported yet, 130 interrupted."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    install: InstallArgs,
    /// More log output on stderr (-v info, -vv debug).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
}

#[derive(Args)]
struct InstallArgs {
    /// The bundle (.tar.zst) built by kubexm-bundle.
    #[arg(long, value_name = "FILE")]
    bundle: Option<PathBuf>,
    /// The cluster config (cluster.yaml).
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    file: Option<PathBuf>,
    /// Extend or override the built-in catalog with this file. Repeatable.
    #[arg(long = "catalog", value_name = "FILE")]
    catalog: Vec<PathBuf>,
    /// The bundle's minisign public key.
    #[arg(long, value_name = "FILE")]
    pubkey: Option<PathBuf>,
    /// Accept a bundle without checking a signature (warns loudly).
    #[arg(long)]
    allow_unsigned: bool,
    /// The installer's state root (unpacked bundles, PKI).
    #[arg(long, value_name = "DIR", default_value = kubexm_installer::ROOT)]
    root: PathBuf,
    /// Phases to run, comma-separated, in order: preflight, os-packages, registry, etcd,
    /// loadbalancer, containerd, control-plane, workers, cni, addons, kubeconfig. Default: all.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    phases: Vec<String>,
    /// The address hosts reach this machine at; the file server listens there (port --serve-port).
    #[arg(long, value_name = "ADDR")]
    advertise: Option<std::net::IpAddr>,
    /// Port of the file server the installer runs during the install.
    #[arg(long, default_value_t = 5443)]
    serve_port: u16,
    /// Where to write the admin kubeconfig (mode 0600). Default: <root>/<cluster>.kubeconfig.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Print the plan and touch no host.
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    engine: EngineArgs,
}

#[derive(Args, Clone)]
struct TrustArgs {
    /// The bundle's minisign public key; `<bundle>.minisig` is checked before anything is decompressed.
    #[arg(long, value_name = "FILE", required_unless_present = "allow_unsigned")]
    pubkey: Option<PathBuf>,
    /// Accept a bundle without checking a signature (warns loudly).
    #[arg(long)]
    allow_unsigned: bool,
    /// The installer's state root.
    #[arg(long, value_name = "DIR", default_value = kubexm_installer::ROOT)]
    root: PathBuf,
}

#[derive(Args, Clone)]
struct EngineArgs {
    /// The state database.
    #[arg(long, value_name = "FILE", default_value = kubexm_bundle::STATE_DB)]
    state: PathBuf,
    /// Accept a host key that differs from the one pinned at first contact.
    #[arg(long)]
    accept_new_host_key: bool,
    /// Hosts worked on at once.
    #[arg(long, default_value_t = 20)]
    concurrency: usize,
}

#[derive(Subcommand)]
enum Command {
    /// Verify a bundle and unpack it into <root>/bundles/<id>/ (a no-op if already there).
    Unpack {
        #[arg(long, value_name = "FILE")]
        bundle: PathBuf,
        #[command(flatten)]
        trust: TrustArgs,
        #[arg(short, long, value_enum, default_value = "text")]
        output: Output,
    },
    /// Serve an unpacked bundle as a read-only OCI registry and file server.
    Serve {
        /// The unpacked bundle (from `unpack`).
        #[arg(long, value_name = "DIR")]
        bundle_dir: PathBuf,
        /// Address and port to listen on.
        #[arg(long, value_name = "ADDR:PORT", default_value = "0.0.0.0:5443")]
        listen: std::net::SocketAddr,
        /// Serve this certificate (PEM) instead of issuing one from the installer's CA.
        #[arg(long, value_name = "FILE", requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        #[arg(long, value_name = "FILE", requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// A name or address the issued certificate must cover. Repeatable; the listen address is always included.
        #[arg(long = "tls-san", value_name = "NAME")]
        tls_sans: Vec<String>,
        /// Where the installer's registry CA lives.
        #[arg(long, value_name = "DIR", default_value = "/var/lib/kubexm/pki/registry")]
        pki_dir: PathBuf,
        /// Plain HTTP, no TLS.
        #[arg(long, conflicts_with_all = ["tls_cert", "tls_sans"])]
        plain_http: bool,
        /// Serve only the file server.
        #[arg(long, conflicts_with = "no_files")]
        no_registry: bool,
        /// Serve only the registry.
        #[arg(long)]
        no_files: bool,
    },
    /// Push the bundle's images into a site registry.
    Mirror {
        #[arg(long, value_name = "FILE")]
        bundle: PathBuf,
        #[command(flatten)]
        trust: TrustArgs,
        /// HOST[:PORT][/PREFIX] of the site registry.
        #[arg(long, value_name = "HOST[:PORT][/PREFIX]")]
        registry: String,
        /// Name images <prefix>/<repository>, without the upstream host; refused on collisions.
        #[arg(long)]
        flatten: bool,
        #[arg(long, value_name = "USER", requires = "password_stdin")]
        username: Option<String>,
        /// Read the password from standard input.
        #[arg(long, requires = "username")]
        password_stdin: bool,
        /// Trust this CA for the registry's certificate.
        #[arg(long, value_name = "FILE", conflicts_with = "insecure")]
        ca_file: Option<PathBuf>,
        /// Do not verify the registry's certificate.
        #[arg(long)]
        insecure: bool,
        /// Talk plain HTTP to the registry.
        #[arg(long)]
        plain_http: bool,
        /// Parallel uploads.
        #[arg(long, default_value_t = 8)]
        jobs: usize,
        #[arg(short, long, value_enum, default_value = "text")]
        output: Output,
    },
    /// Connect to every host of the config and gather its facts (OS, arch, ports, clock, leftovers).
    Facts {
        #[arg(short = 'f', long = "file", value_name = "FILE")]
        file: PathBuf,
        #[arg(long = "catalog", value_name = "FILE")]
        catalog: Vec<PathBuf>,
        #[command(flatten)]
        engine: EngineArgs,
        /// Print the plan and touch no host.
        #[arg(long)]
        dry_run: bool,
        /// Write the plan's DAG as Graphviz DOT to FILE.
        #[arg(long, value_name = "FILE")]
        graph: Option<PathBuf>,
        #[arg(short, long, value_enum, default_value = "text")]
        output: Output,
    },
    /// Install each host's OS packages (those its roles need) from a served bundle's Debian repositories.
    Packages {
        #[arg(short = 'f', long = "file", value_name = "FILE")]
        file: PathBuf,
        /// Extend or override the built-in catalog with this file. Repeatable.
        #[arg(long = "catalog", value_name = "FILE")]
        catalog: Vec<PathBuf>,
        /// The unpacked bundle (its lock lists the repositories).
        #[arg(long, value_name = "DIR")]
        bundle_dir: PathBuf,
        /// The file server as the hosts reach it (http(s)://HOST:PORT), e.g. `kubexm-install serve`.
        #[arg(long, value_name = "URL")]
        file_server: String,
        /// Path on the hosts of the file server's CA certificate (for https).
        #[arg(long, value_name = "PATH")]
        host_ca: Option<String>,
        /// Print the plan and touch no host.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Undo an install on every host of the config: services, files, binaries, the
    /// etcd data (packages stay). Without --yes it only says what it would do.
    Reset {
        #[arg(short = 'f', long = "file", value_name = "FILE")]
        file: PathBuf,
        /// Extend or override the built-in catalog with this file. Repeatable.
        #[arg(long = "catalog", value_name = "FILE")]
        catalog: Vec<PathBuf>,
        /// Really reset: this deletes the cluster, including its etcd data.
        #[arg(long)]
        yes: bool,
        /// The installer's state root (the admin kubeconfig written there is removed).
        #[arg(long, value_name = "DIR", default_value = kubexm_installer::ROOT)]
        root: PathBuf,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Show a job: each module and host, and the log tail of each failed step.
    Status {
        /// The job (default: the latest).
        #[arg(long)]
        job: Option<i64>,
        /// The state database.
        #[arg(long, value_name = "FILE", default_value = kubexm_bundle::STATE_DB)]
        state: PathBuf,
    },
    /// Write containerd hosts.toml files pointing every upstream of the bundle at a registry.
    HostsToml {
        #[arg(long, value_name = "DIR")]
        bundle_dir: PathBuf,
        /// HOST[:PORT][/PREFIX] of the registry nodes pull from.
        #[arg(long, value_name = "HOST[:PORT][/PREFIX]")]
        registry: String,
        #[arg(long)]
        flatten: bool,
        /// The CA certificate's path on the nodes.
        #[arg(long, value_name = "PATH")]
        ca: Option<String>,
        #[arg(long)]
        plain_http: bool,
        /// Output directory (containerd's config_path, e.g. /etc/containerd/certs.d).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    kubexm_cli::init_logging(cli.verbose.max(1));
    kubexm_cli::exit(run(cli).map_err(kubexm_installer::classify))
}

fn trust(t: &TrustArgs) -> unpack::Trust {
    match (&t.pubkey, t.allow_unsigned) {
        (Some(k), _) => unpack::Trust::PublicKey(k.clone()),
        (None, _) => {
            eprintln!(
                "WARNING: --allow-unsigned: this bundle's origin is NOT verified. Anyone who could change it could run code on every node."
            );
            unpack::Trust::Unsigned
        }
    }
}

fn unpack_err(e: unpack::UnpackError) -> anyhow::Error {
    let class = match &e {
        unpack::UnpackError::Io { .. } => Class::Io,
        _ => Class::Verify,
    };
    classified(class, e)
}

/// `host:port/prefix` → (`host:port`, `prefix`).
fn split_registry(r: &str) -> (String, Option<String>) {
    let r = r.trim_start_matches("https://").trim_start_matches("http://");
    match r.split_once('/') {
        Some((h, p)) => (h.to_string(), Some(p.trim_matches('/').to_string()).filter(|p| !p.is_empty())),
        None => (r.to_string(), None),
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let Some(command) = cli.command else { return install(cli.install) };
    match command {
        Command::Unpack { bundle, trust: t, output } => {
            let u = unpack::unpack(&bundle, &trust(&t), &t.root).map_err(unpack_err)?;
            match output {
                Output::Json => println!(
                    "{}",
                    serde_json::json!({"dir": u.dir, "fresh": u.fresh, "members": u.manifest.members.len() + 1})
                ),
                _ if u.fresh => println!(
                    "unpacked {} into {} ({} members verified)",
                    bundle.display(),
                    u.dir.display(),
                    u.manifest.members.len() + 1
                ),
                _ => println!("{} is already unpacked in {}; nothing to do", bundle.display(), u.dir.display()),
            }
            Ok(())
        }
        Command::Serve {
            bundle_dir,
            listen,
            tls_cert,
            tls_key,
            tls_sans,
            pki_dir,
            plain_http,
            no_registry,
            no_files,
        } => {
            let start = Instant::now();
            let tls = match (plain_http, tls_cert, tls_key) {
                (true, _, _) => serve::Tls::Plain,
                (false, Some(cert), Some(key)) => serve::Tls::Files { cert, key },
                _ => {
                    let mut names = tls_sans;
                    if !listen.ip().is_unspecified() {
                        names.insert(0, listen.ip().to_string());
                    }
                    if names.is_empty() {
                        return Err(classified(
                            Class::Usage,
                            anyhow::anyhow!(
                                "listening on {listen}: pass --tls-san with the address or name nodes use to reach this registry"
                            ),
                        ));
                    }
                    serve::Tls::Issued { pki_dir, names }
                }
            };
            let opts = serve::ServeOptions {
                bundle_dir,
                listen,
                tls,
                parts: serve::Parts {
                    registry: !no_registry,
                    files: !no_files,
                },
            };
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(serve::run(opts, |s, ca| {
                let scheme = if plain_http { "http" } else { "https" };
                println!(
                    "serving on {scheme}://{listen}: {} repositories, ready in {} ms",
                    s.repositories().len(),
                    start.elapsed().as_millis()
                );
                if let Some(ca) = ca {
                    println!("nodes must trust the CA {}", ca.display());
                }
            }))
        }
        Command::Mirror {
            bundle,
            trust: t,
            registry,
            flatten,
            username,
            password_stdin,
            ca_file,
            insecure,
            plain_http,
            jobs,
            output,
        } => {
            let password = if password_stdin {
                let mut p = String::new();
                std::io::stdin().read_to_string(&mut p)?;
                Some(p.trim_end_matches(['\n', '\r']).to_string())
            } else {
                None
            };
            let u = unpack::unpack(&bundle, &trust(&t), &t.root).map_err(unpack_err)?;
            let (registry, prefix) = split_registry(&registry);
            let opts = mirror::MirrorOptions {
                bundle_dir: u.dir,
                registry,
                prefix,
                flatten,
                username,
                password,
                ca_file,
                insecure,
                plain_http,
                jobs,
            };
            let rt = tokio::runtime::Runtime::new()?;
            let s = rt.block_on(mirror::mirror(&opts)).map_err(|e| match e {
                mirror::MirrorError::Collision { .. } => classified(Class::Usage, e),
                _ => classified(Class::Fetch, e),
            })?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&s)?),
                _ => println!(
                    "mirrored {} images ({} manifests) to {}: {} blobs uploaded ({} bytes), {} already present",
                    s.images, s.manifests, opts.registry, s.blobs_uploaded, s.bytes_uploaded, s.blobs_present
                ),
            }
            Ok(())
        }
        Command::Facts {
            file,
            catalog,
            engine,
            dry_run,
            graph,
            output,
        } => {
            let files: Vec<&std::path::Path> = catalog.iter().map(PathBuf::as_path).collect();
            let cat = kubexm_bom::catalog::Catalog::with_overrides(&files)?;
            let cluster = kubexm_bom::config::load_file(&file, &cat)?;
            if dry_run || graph.is_some() {
                let hosts = cluster.spec.hosts.iter().map(|h| h.name.clone()).collect();
                let plan = kubexm_installer::engine::jobs::facts_pipeline(hosts, Default::default()).plan()?;
                if let Some(g) = &graph {
                    let tmp = g.with_extension("dot.tmp");
                    fs_err::write(&tmp, plan.to_dot())?;
                    fs_err::rename(&tmp, g)?;
                }
                if dry_run {
                    print!("{}", plan.describe());
                    return Ok(());
                }
            }
            let (state, stop, rt) = engine_context(&cluster, &engine)?;
            let opts = kubexm_installer::engine::jobs::ConnectOptions {
                accept_new_host_key: engine.accept_new_host_key,
                concurrency: engine.concurrency,
            };
            let r = rt.block_on(kubexm_installer::engine::jobs::facts(&cluster, state, &opts, stop))?;
            match output {
                Output::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({"job": r.job, "facts": r.facts, "errors": r.errors}))?
                ),
                _ => {
                    println!(
                        "{:<12} {:<16} {:<10} {:<6} {:<18} {:>4} {:>7} {:>7}  LEFTOVERS",
                        "HOST", "HOSTNAME", "OS", "ARCH", "KERNEL", "CPUS", "MEM MB", "CLOCK"
                    );
                    for f in &r.facts {
                        println!(
                            "{:<12} {:<16} {:<10} {:<6} {:<18} {:>4} {:>7} {:>5}ms  {}",
                            f.host,
                            f.hostname,
                            format!("{} {}", f.os_id, f.os_version),
                            f.arch,
                            f.kernel,
                            f.cpus,
                            f.memory_mb,
                            f.clock_offset_ms,
                            if f.leftovers.is_empty() {
                                "-".to_string()
                            } else {
                                f.leftovers.join(" ")
                            }
                        );
                    }
                }
            }
            if !r.errors.is_empty() {
                return Err(classified(
                    Class::Host,
                    anyhow::anyhow!("{} host(s) failed (job {}):\n  {}", r.errors.len(), r.job, r.errors.join("\n  ")),
                ));
            }
            Ok(())
        }
        Command::Packages {
            file,
            catalog,
            bundle_dir,
            file_server,
            host_ca,
            dry_run,
            engine,
        } => packages(&file, &catalog, &bundle_dir, &file_server, host_ca, dry_run, &engine),
        Command::Reset {
            file,
            catalog,
            yes,
            root,
            engine,
        } => reset(&file, &catalog, yes, &root, &engine),
        Command::Status { job, state } => {
            if !state.exists() {
                return Err(classified(
                    Class::Io,
                    anyhow::anyhow!("no state database at {}; pass --state", state.display()),
                ));
            }
            let st = kubexm_installer::engine::state::State::open(&state, vec![])?;
            print!("{}", kubexm_installer::engine::jobs::describe(&st, job)?);
            Ok(())
        }
        Command::HostsToml {
            bundle_dir,
            registry,
            flatten,
            ca,
            plain_http,
            out,
        } => {
            let text = fs_err::read_to_string(bundle_dir.join(kubexm_bundle::manifest::MANIFEST_NAME))?;
            let m = kubexm_bundle::manifest::BundleManifest::from_yaml(&text)
                .map_err(|e| classified(Class::Verify, anyhow::anyhow!("{}: {e}", bundle_dir.display())))?;
            let (registry, prefix) = split_registry(&registry);
            let files = hosts::write_all(
                &out,
                &m,
                &hosts::Target {
                    registry,
                    prefix,
                    flatten,
                    ca,
                    plain_http,
                },
            )?;
            for f in files {
                println!("{}", f.display());
            }
            Ok(())
        }
    }
}

/// `kubexm-install packages`: the OS packages step on every host.
fn packages(
    file: &std::path::Path,
    catalog: &[PathBuf],
    bundle_dir: &std::path::Path,
    file_server: &str,
    host_ca: Option<String>,
    dry_run: bool,
    engine: &EngineArgs,
) -> anyhow::Result<()> {
    use kubexm_installer::engine::plan::{Module, Pipeline, Task};
    use kubexm_installer::os_packages::{HostPackages, roles_of};
    let files: Vec<&std::path::Path> = catalog.iter().map(PathBuf::as_path).collect();
    let cat = kubexm_bom::catalog::Catalog::with_overrides(&files)?;
    let cluster = kubexm_bom::config::load_file(file, &cat)?;
    let mpath = bundle_dir.join(kubexm_bundle::manifest::MANIFEST_NAME);
    let manifest = kubexm_bundle::manifest::BundleManifest::from_yaml(&fs_err::read_to_string(&mpath)?)
        .map_err(|e| classified(Class::Io, anyhow::anyhow!("{}: {e}", mpath.display())))?;
    let repos = manifest.lock.os_repos;
    if repos.is_empty() {
        return Err(classified(
            Class::Config,
            anyhow::anyhow!(
                "the bundle in {} carries no OS package repositories; set bundle.osPackages in cluster.yaml and rebuild it",
                bundle_dir.display()
            ),
        ));
    }
    if !(file_server.starts_with("http://") || file_server.starts_with("https://")) {
        return Err(classified(
            Class::Usage,
            anyhow::anyhow!("--file-server {file_server}: expected http://HOST:PORT or https://HOST:PORT"),
        ));
    }
    // One task per set of roles: hosts with the same roles install the same packages.
    let pipeline = |hosts: Vec<String>| {
        let mut by_roles: BTreeMap<Vec<String>, Vec<String>> = BTreeMap::new();
        for h in hosts {
            by_roles.entry(roles_of(&cluster, &h)).or_default().push(h);
        }
        let tasks = by_roles
            .into_iter()
            .map(|(roles, hosts)| Task {
                name: if roles.is_empty() { "other".into() } else { roles.join("+") },
                hosts,
                steps: vec![std::sync::Arc::new(HostPackages {
                    repos: repos.clone(),
                    file_server: file_server.to_string(),
                    roles,
                    ca: host_ca.clone(),
                })],
                after: vec![],
            })
            .collect();
        Ok(Pipeline {
            name: "os-packages".into(),
            modules: vec![Module {
                name: "os-packages".into(),
                tasks,
            }],
        })
    };
    if dry_run {
        let hosts = cluster.spec.hosts.iter().map(|h| h.name.clone()).collect();
        print!("{}", pipeline(hosts)?.plan()?.describe());
        return Ok(());
    }
    let (state, stop, rt) = engine_context(&cluster, engine)?;
    let connect = kubexm_installer::engine::jobs::ConnectOptions {
        accept_new_host_key: engine.accept_new_host_key,
        concurrency: engine.concurrency,
    };
    let eo = kubexm_installer::engine::run::EngineOptions {
        concurrency: engine.concurrency,
        policy: kubexm_installer::engine::run::Policy::ContinueOtherHosts,
        progress: kubexm_installer::engine::progress::ProgressMode::for_stderr(),
        ..Default::default()
    };
    let ex = rt.block_on(kubexm_installer::engine::jobs::execute(
        &cluster,
        state,
        "os-packages",
        &connect,
        &eo,
        stop,
        &pipeline,
    ))?;
    for r in &ex.report.results {
        if let Some(installed) = r.log.split("installed:\n").nth(1) {
            println!("{}: {}", r.host, installed.trim().replace('\n', ", "));
        } else if r.outcome == kubexm_installer::engine::state::Outcome::Skipped {
            println!("{}: already installed", r.host);
        }
    }
    if !ex.ok() {
        let errors = ex.errors();
        return Err(classified(
            Class::Host,
            anyhow::anyhow!("{} host(s) failed (job {}):\n  {}", errors.len(), ex.job, errors.join("\n  ")),
        ));
    }
    Ok(())
}

fn reset(file: &std::path::Path, catalog: &[PathBuf], yes: bool, root: &std::path::Path, engine: &EngineArgs) -> anyhow::Result<()> {
    use kubexm_installer::engine::{jobs, progress::ProgressMode, run};
    let files: Vec<&std::path::Path> = catalog.iter().map(PathBuf::as_path).collect();
    let cat = kubexm_bom::catalog::Catalog::with_overrides(&files)?;
    let cluster = kubexm_bom::config::load_file(file, &cat)?;
    let pipeline = kubexm_installer::deploy::reset_pipeline(&cluster)?;
    if !yes {
        print!("{}", pipeline.plan()?.describe());
        return Err(classified(
            Class::Usage,
            anyhow::anyhow!(
                "reset deletes cluster {} on {} host(s), etcd data included; nothing was touched. Pass --yes to do it",
                cluster.metadata.name,
                cluster.spec.hosts.len()
            ),
        ));
    }
    let (state, stop, rt) = engine_context(&cluster, engine)?;
    let connect = jobs::ConnectOptions {
        accept_new_host_key: engine.accept_new_host_key,
        concurrency: engine.concurrency,
    };
    let eo = run::EngineOptions {
        concurrency: engine.concurrency,
        policy: run::Policy::ContinueOtherHosts,
        progress: ProgressMode::for_stderr(),
        ..Default::default()
    };
    let ex = rt.block_on(jobs::execute(&cluster, state, "reset", &connect, &eo, stop, |_| Ok(pipeline)))?;
    if !ex.ok() {
        let errors = ex.errors();
        return Err(classified(
            Class::Host,
            anyhow::anyhow!(
                "reset failed on {} host(s) (job {}); run it again:\n  {}",
                errors.len(),
                ex.job,
                errors.join("\n  ")
            ),
        ));
    }
    let kubeconfig = root.join(format!("{}.kubeconfig", cluster.metadata.name));
    if kubeconfig.exists() {
        fs_err::remove_file(&kubeconfig)?;
    }
    println!(
        "reset cluster {} on {} hosts (job {})",
        cluster.metadata.name,
        cluster.spec.hosts.len(),
        ex.job
    );
    Ok(())
}

/// The state database, a Ctrl-C flag and a runtime for an engine job.
fn engine_context(
    cluster: &kubexm_bom::config::Cluster,
    engine: &EngineArgs,
) -> anyhow::Result<(
    std::sync::Arc<kubexm_installer::engine::state::State>,
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    tokio::runtime::Runtime,
)> {
    let (_, secrets) = kubexm_installer::engine::inventory::targets(cluster).map_err(|e| classified(Class::Config, e))?;
    let state = std::sync::Arc::new(kubexm_installer::engine::state::State::open(&engine.state, secrets)?);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rt = tokio::runtime::Runtime::new()?;
    let stopper = stop.clone();
    rt.spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            stopper.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    Ok((state, stop, rt))
}

fn install(args: InstallArgs) -> anyhow::Result<()> {
    use kubexm_installer::deploy;
    use kubexm_installer::engine::{jobs, progress::ProgressMode, run};
    let Some(file) = args.file.clone() else {
        return Err(classified(
            Class::Usage,
            anyhow::anyhow!("nothing to do: pass -f cluster.yaml --bundle k.tar.zst to install, or a subcommand (see --help)"),
        ));
    };
    let files: Vec<&std::path::Path> = args.catalog.iter().map(PathBuf::as_path).collect();
    let catalog = kubexm_bom::catalog::Catalog::with_overrides(&files)?;
    let cluster = kubexm_bom::config::load_file(&file, &catalog)?;
    let asked: Vec<String> = if args.phases.is_empty() {
        deploy::PHASES.iter().map(|p| p.to_string()).collect()
    } else {
        args.phases.clone()
    };
    let (phases, missing) = deploy::select(&asked).map_err(|e| classified(Class::Usage, anyhow::anyhow!("--phases: {e}")))?;
    if !missing.is_empty() {
        return Err(classified(
            Class::Unsupported,
            anyhow::anyhow!(
                "{}: config valid (cluster {}); phase(s) {} are not supported yet, and nothing was touched. \
                 This release deploys --phases {}",
                file.display(),
                cluster.metadata.name,
                missing.join(", "),
                deploy::IMPLEMENTED.join(",")
            ),
        ));
    }
    let Some(bundle) = &args.bundle else {
        return Err(classified(
            Class::Usage,
            anyhow::anyhow!("pass --bundle k.tar.zst (built by kubexm-bundle)"),
        ));
    };
    if args.pubkey.is_none() && !args.allow_unsigned {
        return Err(classified(
            Class::Usage,
            anyhow::anyhow!("pass --pubkey FILE to verify the bundle's signature (or --allow-unsigned)"),
        ));
    }
    let t = trust(&TrustArgs {
        pubkey: args.pubkey.clone(),
        allow_unsigned: args.allow_unsigned,
        root: args.root.clone(),
    });
    // A dry run verifies the bundle and plans from it in memory: it writes
    // nothing anywhere (no unpack, no PKI, no state); values made at apply
    // time print as <generated>.
    let (bom, bundle_dir, members) = if args.dry_run {
        let p = unpack::read_for_plan(bundle, &t, &args.root).map_err(unpack_err)?;
        (p.manifest.lock, p.dir, Some(p.members))
    } else {
        let u = unpack::unpack(bundle, &t, &args.root).map_err(unpack_err)?;
        (u.manifest.lock, u.dir, None)
    };
    let pki_dir = args.root.join("pki");
    let pki = if args.dry_run {
        kubexm_installer::pki::Pki::DryRun
    } else {
        kubexm_installer::pki::Pki::Dir(pki_dir.clone())
    };
    let Some(advertise) = args.advertise else {
        return Err(classified(
            Class::Usage,
            anyhow::anyhow!("pass --advertise ADDR: the address the hosts reach this machine at, for the file server"),
        ));
    };
    let file_server = format!("https://{}", std::net::SocketAddr::new(advertise, args.serve_port));
    let ca_pem = pki.ca("registry", "kubexm registry CA")?.cert_pem;
    let installer = anyhow::Context::context(std::env::current_exe(), "finding the installer binary")?;
    let kubeadm_api = catalog
        .minor(&cluster.spec.kubernetes.version)
        .map(|m| m.kubeadm_api_version.clone())
        .ok_or_else(|| anyhow::anyhow!("the catalog has no kubeadm API for Kubernetes {}", cluster.spec.kubernetes.version))?;
    let kubeconfig = args
        .kubeconfig
        .clone()
        .unwrap_or_else(|| args.root.join(format!("{}.kubeconfig", cluster.metadata.name)));
    let plan_for = |arches: &BTreeMap<String, String>| {
        deploy::pipeline(&deploy::Inputs {
            bundle,
            pubkey: args.pubkey.as_deref(),
            installer: &installer,
            cluster: &cluster,
            bom: &bom,
            bundle_dir: &bundle_dir,
            file_server: &file_server,
            ca_pem: &ca_pem,
            pki: &pki,
            members: members.as_ref(),
            arches,
            phases: &phases,
            kubeadm_api: &kubeadm_api,
            kubeconfig: &kubeconfig,
        })
    };
    if args.dry_run {
        let arches = cluster
            .spec
            .hosts
            .iter()
            .map(|h| (h.name.clone(), h.arch.clone().unwrap_or_else(|| "amd64".into())))
            .collect();
        print!("{}", plan_for(&arches)?.plan()?.describe());
        return Ok(());
    }
    let (state, stop, rt) = engine_context(&cluster, &args.engine)?;
    // The file server runs for the install's duration.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let opts = serve::ServeOptions {
        bundle_dir: bundle_dir.clone(),
        listen: std::net::SocketAddr::new(advertise, args.serve_port),
        tls: serve::Tls::Issued {
            pki_dir: pki_dir.join("registry"),
            names: vec![advertise.to_string()],
        },
        parts: serve::Parts {
            registry: true,
            files: true,
        },
    };
    let server = rt.spawn(serve::run(opts, move |_, _| {
        let _ = ready_tx.send(());
    }));
    if ready_rx.recv_timeout(std::time::Duration::from_secs(20)).is_err() {
        server.abort();
        return Err(classified(
            Class::Io,
            anyhow::anyhow!("the file server did not start on {file_server}; is the port free and the address this machine's?"),
        ));
    }
    let connect = jobs::ConnectOptions {
        accept_new_host_key: args.engine.accept_new_host_key,
        concurrency: args.engine.concurrency,
    };
    let facts = rt.block_on(jobs::facts(&cluster, state.clone(), &connect, stop.clone()))?;
    if !facts.errors.is_empty() {
        server.abort();
        return Err(classified(
            Class::Host,
            anyhow::anyhow!(
                "cannot gather facts from {} host(s):\n  {}",
                facts.errors.len(),
                facts.errors.join("\n  ")
            ),
        ));
    }
    if phases.iter().any(|p| p == "preflight") {
        let mut refused = deploy::preflight(&cluster, &bom, &facts.facts, &phases);
        refused.extend(kubexm_installer::endpoint::preflight(&cluster));
        if cluster.spec.preflight.leftovers == kubexm_bom::config::model::LeftoverPolicy::Warn {
            for f in facts.facts.iter().filter(|f| f.managed.is_empty() && !f.leftovers.is_empty()) {
                eprintln!(
                    "warning: {}: leftovers of an earlier install kubexm did not make: {} (preflight.leftovers: warn)",
                    f.host,
                    f.leftovers.join(" ")
                );
            }
        }
        if !refused.is_empty() {
            server.abort();
            return Err(classified(
                Class::Host,
                anyhow::anyhow!("preflight refused the install:\n  {}", refused.join("\n  ")),
            ));
        }
    }
    let arches = facts.facts.iter().map(|f| (f.host.clone(), f.arch.clone())).collect();
    let pipeline = plan_for(&arches)?;
    let eo = run::EngineOptions {
        concurrency: args.engine.concurrency,
        policy: run::Policy::FailFast,
        progress: ProgressMode::for_stderr(),
        ..Default::default()
    };
    let ex = rt.block_on(jobs::execute(&cluster, state, "install", &connect, &eo, stop, |_| Ok(pipeline)));
    server.abort();
    let ex = ex?;
    let skipped = ex.report.count(kubexm_installer::engine::state::Outcome::Skipped);
    let applied = ex.report.count(kubexm_installer::engine::state::Outcome::Applied);
    if !ex.ok() {
        let errors = ex.errors();
        return Err(classified(
            Class::Host,
            anyhow::anyhow!(
                "install failed (job {}; {applied} steps applied, {skipped} skipped); fix and run again, done steps are skipped:\n  {}",
                ex.job,
                errors.join("\n  ")
            ),
        ));
    }
    println!(
        "installed phases {} on {} hosts (job {}): {applied} steps applied, {skipped} already in place",
        phases.join(", "),
        cluster.spec.hosts.len(),
        ex.job
    );
    print!("{}", summary(&cluster, &phases, &kubeconfig));
    Ok(())
}

/// What the user has now, after a successful install.
fn summary(cluster: &kubexm_bom::config::Cluster, phases: &[String], kubeconfig: &std::path::Path) -> String {
    use kubexm_installer::{addons, endpoint};
    let g = &cluster.spec.role_groups;
    let has = |p: &str| phases.iter().any(|x| x == p);
    let mut s = String::new();
    s.push_str(&format!(
        "cluster {}:
",
        cluster.metadata.name
    ));
    if has("control-plane") {
        s.push_str(&format!(
            "  control plane: {} (endpoint {}, mode {})
",
            g.control_plane.join(", "),
            endpoint::endpoint(cluster),
            serde_json::to_value(cluster.spec.control_plane_endpoint.mode)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default()
        ));
        let mode = serde_json::to_value(cluster.spec.etcd.mode)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        s.push_str(&format!(
            "  etcd: {} ({mode}, TLS)
",
            g.etcd.join(", ")
        ));
    }
    if has("workers") {
        s.push_str(&format!(
            "  nodes: {}
",
            g.worker.join(", ")
        ));
    }
    for phase in ["cni", "addons"] {
        if has(phase)
            && let Ok(list) = addons::enabled(cluster, phase)
            && !list.is_empty()
        {
            s.push_str(&format!(
                "  {phase}: {}
",
                list.join(", ")
            ));
        }
    }
    if let Some(r) = kubexm_installer::deploy::registry_address(cluster).filter(|_| has("registry")) {
        s.push_str(&format!(
            "  registry: https://{r} (CA /etc/kubexm/pki/registry-ca.crt on every host)
"
        ));
    }
    if has("kubeconfig") {
        s.push_str(&format!(
            "  kubeconfig: {} (server {}); try: kubectl --kubeconfig {} get nodes
",
            kubeconfig.display(),
            endpoint::external_server(cluster),
            kubeconfig.display()
        ));
    }
    s
}
