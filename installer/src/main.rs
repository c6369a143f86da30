//! `kubexm-install`: the offline side of kubexm. Thin: flags in, one library
//! call, output or an error with its documented exit code.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Parser, Subcommand};
use kubexm_cli::{Class, Output, classified};
use kubexm_installer::{hosts, mirror, ops, serve, unpack};

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
    e.classified()
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
            let (state, stop, rt) = ops::engine_context(&cluster, &engine.settings())?;
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
        } => {
            let opts = ops::packages::PackagesOptions {
                file,
                catalog,
                bundle_dir,
                file_server,
                host_ca,
                dry_run,
                engine: engine.settings(),
            };
            let report = ops::packages::packages(&opts)?;
            print!("{}", report.text);
            match report.errors {
                None => Ok(()),
                Some(e) => Err(classified(Class::Host, anyhow::anyhow!(e))),
            }
        }
        Command::Reset {
            file,
            catalog,
            yes,
            root,
            engine,
        } => match ops::reset::reset(&file, &catalog, yes, &root, &engine.settings())? {
            ops::reset::ResetReport::NotConfirmed { plan, refusal } => {
                print!("{plan}");
                Err(classified(Class::Usage, anyhow::anyhow!(refusal)))
            }
            ops::reset::ResetReport::Done(line) => {
                println!("{line}");
                Ok(())
            }
        },
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

impl EngineArgs {
    fn settings(&self) -> ops::EngineSettings {
        ops::EngineSettings {
            state: self.state.clone(),
            accept_new_host_key: self.accept_new_host_key,
            concurrency: self.concurrency,
        }
    }
}

/// The install: one operation, its report printed.
fn install(args: InstallArgs) -> anyhow::Result<()> {
    if args.pubkey.is_none() && args.allow_unsigned {
        // The same loud warning as every other command taking a bundle.
        let _ = trust(&TrustArgs {
            pubkey: None,
            allow_unsigned: true,
            root: args.root.clone(),
        });
    }
    let opts = ops::install::InstallOptions {
        bundle: args.bundle,
        file: args.file,
        catalog: args.catalog,
        pubkey: args.pubkey,
        allow_unsigned: args.allow_unsigned,
        root: args.root,
        phases: args.phases,
        advertise: args.advertise,
        serve_port: args.serve_port,
        kubeconfig: args.kubeconfig,
        dry_run: args.dry_run,
        engine: args.engine.settings(),
    };
    match ops::install::install(&opts)? {
        ops::install::InstallReport::Plan(text) | ops::install::InstallReport::Installed(text) => print!("{text}"),
    }
    Ok(())
}
