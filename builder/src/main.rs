//! `kubexm-bundle`: the online side of kubexm. Thin: flags in, one library
//! call, output or an error with its documented exit code.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use kubexm_cli::Output;

/// Resolve a cluster config into everything an offline install needs.
#[derive(Parser)]
#[command(name = "kubexm-bundle", version, about, long_about = None, after_help = "Exit codes: 0 ok, 1 bug, 2 usage, 3 invalid config, 4 file I/O, 5 fetch, 6 verification, 7 host, 8 not supported yet, 130 interrupted.")]
struct Cli {
    /// More log output on stderr (-v info, -vv debug).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check a cluster config and report every problem at once.
    Validate {
        #[command(flatten)]
        config: ConfigArgs,
        /// text: a summary; json: the diagnostics or the completed config; yaml: the completed config.
        #[arg(short, long, value_enum, default_value = "text")]
        output: Output,
    },
    /// Print the bill of materials a config resolves to.
    Bom {
        #[command(flatten)]
        config: ConfigArgs,
        /// Rewrite an upstream to a mirror: UPSTREAM=URL (host or host/path). Repeatable.
        #[arg(long = "mirror", value_name = "UPSTREAM=URL")]
        mirrors: Vec<String>,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Fetch and verify everything the config needs; write one signed bundle.
    Build {
        #[command(flatten)]
        config: ConfigArgs,
        /// The bundle to write (.tar.zst).
        #[arg(long, value_name = "FILE")]
        bundle: PathBuf,
        /// Sign with this minisign secret key (password from KUBEXM_KEY_PASSWORD or a prompt).
        #[arg(long, value_name = "FILE")]
        key: Option<PathBuf>,
        /// Rewrite an upstream to a mirror: UPSTREAM=URL (host or host/path). Repeatable.
        #[arg(long = "mirror", value_name = "UPSTREAM=URL")]
        mirrors: Vec<String>,
        /// Refuse any upstream without a mirror mapping.
        #[arg(long)]
        strict_mirrors: bool,
        /// The content-addressed cache shared by builds.
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
        /// Parallel downloads.
        #[arg(long, default_value_t = 8)]
        jobs: usize,
        /// Write a differential bundle: only the members this full bundle lacks. It is
        /// verified first with --pubkey; installs need it beside the new one.
        #[arg(long, value_name = "FILE", requires = "pubkey")]
        base: Option<PathBuf>,
        /// The minisign public key --base is verified with.
        #[arg(long, value_name = "FILE", requires = "base")]
        pubkey: Option<PathBuf>,
        /// With operator.enabled: true, the controller's image is made of the kubexm
        /// binary beside kubexm-bundle; this names one for ARCH (amd64, arm64)
        /// instead, or for another arch. Repeatable.
        #[arg(long = "controller-binary", value_name = "ARCH=FILE")]
        controller_binaries: Vec<String>,
        #[arg(short, long, value_enum, default_value = "text")]
        output: Output,
    },
    /// Write a minisign key pair for signing bundles.
    Keygen {
        #[arg(long, value_name = "FILE", default_value = "kubexm.key")]
        secret_key: PathBuf,
        #[arg(long, value_name = "FILE", default_value = "kubexm.pub")]
        public_key: PathBuf,
        /// An unencrypted secret key, for automation. Guard the file.
        #[arg(long)]
        no_password: bool,
        /// Replace existing key files.
        #[arg(long)]
        force: bool,
    },
    /// Check a bundle's signature and every member.
    Verify {
        #[arg(long, value_name = "FILE")]
        bundle: PathBuf,
        /// The minisign public key.
        #[arg(long, value_name = "FILE")]
        pubkey: PathBuf,
        /// A differential bundle's base: verify it too, and that it is the base the
        /// differential names and holds every member taken from it.
        #[arg(long, value_name = "FILE")]
        base: Option<PathBuf>,
        #[arg(short, long, value_enum, default_value = "text")]
        output: Output,
    },
    /// List a bundle's contents without unpacking it.
    Inspect {
        #[arg(long, value_name = "FILE")]
        bundle: PathBuf,
        #[arg(short, long, value_enum, default_value = "text")]
        output: Output,
        /// Print its software bill of materials instead (SPDX 2.3 or
        /// CycloneDX 1.6 JSON), as the bundle carries it.
        #[arg(long, value_enum, value_name = "FORMAT", conflicts_with = "output")]
        sbom: Option<SbomFormat>,
    },
    /// Write a commented example cluster config.
    Init {
        /// Where to write it.
        #[arg(short = 'f', long = "file", default_value = "cluster.yaml")]
        file: PathBuf,
        /// Overwrite an existing file.
        #[arg(long)]
        force: bool,
    },
}

/// The formats of `inspect --sbom`.
#[derive(Clone, Copy, clap::ValueEnum)]
enum SbomFormat {
    /// SPDX 2.3, JSON.
    Spdx,
    /// CycloneDX 1.6, JSON.
    Cyclonedx,
}

#[derive(Args)]
struct ConfigArgs {
    /// The cluster config (cluster.yaml).
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    file: PathBuf,
    /// Extend or override the built-in catalog with this file. Repeatable.
    #[arg(long = "catalog", value_name = "FILE")]
    catalog: Vec<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A build off a terminal reports its stages as log lines.
    let building = matches!(cli.command, Command::Build { .. }) && !std::io::IsTerminal::is_terminal(&std::io::stderr());
    kubexm_cli::init_logging(cli.verbose.max(u8::from(building)));
    kubexm_cli::exit(run(cli.command), exit_class)
}

/// The one place a build's failure becomes an exit code (the README's table).
fn exit_class(cause: &(dyn std::error::Error + 'static)) -> Option<kubexm_cli::Class> {
    use kubexm_builder::error::BuildError;
    use kubexm_cli::Class;
    cause.downcast_ref::<BuildError>().map(|e| match e {
        BuildError::Usage(_) => Class::Usage,
        BuildError::Config(_) => Class::Config,
        BuildError::Io(_) => Class::Io,
        BuildError::Fetch(_) => Class::Fetch,
        BuildError::Verify(_) => Class::Verify,
        BuildError::Unsupported(_) => Class::Unsupported,
    })
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Validate { config, output } => {
            let catalog = kubexm_builder::catalog(&config.catalog)?;
            print_validated(&config.file, kubexm_builder::validate(&config.file, &catalog), output)
        }
        Command::Bom { config, mirrors, output } => {
            let catalog = kubexm_builder::catalog(&config.catalog)?;
            let bom = kubexm_builder::bom(&config.file, &catalog, &mirrors)?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&bom)?),
                Output::Yaml => print!("{}", serde_saphyr::to_string(&bom)?),
                Output::Text | Output::Table => print!("{}", bom.to_table()),
            }
            Ok(())
        }
        Command::Build {
            config,
            bundle,
            key,
            mirrors,
            strict_mirrors,
            cache_dir,
            jobs,
            base,
            pubkey,
            controller_binaries,
            output,
        } => {
            let opts = kubexm_builder::build::BuildOptions {
                config: config.file,
                bundle,
                key,
                catalogs: config.catalog,
                mirrors,
                strict_mirrors,
                cache_dir: cache_dir.unwrap_or_else(kubexm_builder::cache::Cache::default_dir),
                jobs,
                base,
                pubkey,
                controller_binaries,
            };
            print_built(&kubexm_builder::build::build(&opts)?, output)
        }
        Command::Keygen {
            secret_key,
            public_key,
            no_password,
            force,
        } => {
            if no_password {
                eprintln!(
                    "warning: the secret key {} is not encrypted; anyone who can read it can sign bundles",
                    secret_key.display()
                );
            }
            kubexm_builder::sign::keygen(&secret_key, &public_key, no_password, force)?;
            println!(
                "wrote {} (secret, mode 0600) and {} (public)",
                secret_key.display(),
                public_key.display()
            );
            Ok(())
        }
        Command::Verify {
            bundle,
            pubkey,
            base,
            output,
        } => print_verified(&bundle, &pubkey, base.as_deref(), output),
        Command::Inspect { bundle, output, sbom } => {
            let m = kubexm_builder::inspect(&bundle)?;
            if let Some(format) = sbom {
                let format = match format {
                    SbomFormat::Spdx => kubexm_bundle::sbom::Format::Spdx,
                    SbomFormat::Cyclonedx => kubexm_bundle::sbom::Format::CycloneDx,
                };
                let bill = kubexm_builder::carried_bill(&bundle, &m, format)?;
                std::io::Write::write_all(&mut std::io::stdout(), &bill)?;
                return Ok(());
            }
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&m)?),
                Output::Yaml => print!("{}", m.to_yaml()?),
                _ => print!("{}", kubexm_builder::describe(&m)),
            }
            Ok(())
        }
        Command::Init { file, force } => {
            kubexm_builder::init(&file, force)?;
            eprintln!(
                "wrote {}; edit the hosts and run `kubexm-bundle validate -f {}`",
                file.display(),
                file.display()
            );
            Ok(())
        }
    }
}

/// What `validate` prints: the completed config (JSON, YAML) or a line; the
/// diagnostics as JSON too with `-o json`.
fn print_validated(file: &std::path::Path, result: anyhow::Result<kubexm_bom::config::Cluster>, output: Output) -> anyhow::Result<()> {
    match (result, output) {
        (Err(e), Output::Json) => {
            if let Some(kubexm_bom::config::LoadError::Invalid(d)) = e.downcast_ref() {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({"valid": false, "file": d.file, "diagnostics": d.diagnostics}))?
                );
            }
            Err(e)
        }
        (Err(e), _) => Err(e),
        (Ok(c), Output::Json) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({"valid": true, "config": c}))?
            );
            Ok(())
        }
        (Ok(c), Output::Yaml) => {
            print!("{}", serde_saphyr::to_string(&c)?);
            Ok(())
        }
        (Ok(c), _) => {
            let s = &c.spec;
            println!(
                "{}: valid: cluster {}, {} hosts, Kubernetes {}, endpoint {:?}, etcd {:?}, network {:?}",
                file.display(),
                c.metadata.name,
                s.hosts.len(),
                s.kubernetes.version,
                s.control_plane_endpoint.mode,
                s.etcd.mode,
                s.network.plugin
            );
            Ok(())
        }
    }
}

/// `verify`: the bundle (and a differential's base) checked; what it prints.
fn print_verified(bundle: &Path, pubkey: &Path, base: Option<&Path>, output: Output) -> anyhow::Result<()> {
    let (c, base) = match base {
        Some(b) => {
            let (c, full) = kubexm_builder::verify_pair(bundle, b, pubkey)?;
            (c, Some(full))
        }
        None => (kubexm_builder::verify(bundle, pubkey)?, None),
    };
    let m = &c.manifest;
    let carried = m.carried().count() + 1;
    match output {
        Output::Json => println!(
            "{}",
            serde_json::json!({"valid": true, "bundle": bundle, "trustedComment": c.comment, "members": carried,
                "contentBytes": m.carried_size(), "base": m.base.as_ref().map(|b| &b.digest), "baseVerified": base.is_some()})
        ),
        _ => {
            println!(
                "{}: signature good ({}); {carried} members verified, {} bytes",
                bundle.display(),
                c.comment,
                m.carried_size()
            );
            match (&m.base, base) {
                (Some(b), Some(_)) => println!(
                    "differential bundle of base {}: the base's signature is good and it holds the {} members ({} bytes) taken from it",
                    b.digest,
                    m.members.len() + 1 - carried,
                    m.total_size() - m.carried_size()
                ),
                (Some(b), None) => println!(
                    "differential bundle of base {}: pass --base FILE to verify the base and the chain too",
                    b.digest
                ),
                (None, _) => {}
            }
        }
    }
    Ok(())
}

/// What `build` prints: its summary (JSON, or lines for people).
fn print_built(s: &kubexm_builder::build::BuildSummary, output: Output) -> anyhow::Result<()> {
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&s)?),
        _ => {
            println!(
                "wrote {} ({} bytes): {} files, {} manifests, {} images ({} blobs), {} charts, {} bytes of content in {:.1}s",
                s.bundle.display(),
                s.bundle_size,
                s.files,
                s.manifests,
                s.images,
                s.blobs,
                s.charts,
                s.content_bytes,
                s.seconds
            );
            if let Some(base) = &s.base {
                println!(
                    "differential bundle of base {base}: {} more members ({} bytes) are taken from the base",
                    s.from_base_members, s.from_base_bytes
                );
            }
            match &s.signature {
                Some(sig) => println!("signed: {}", sig.display()),
                None => println!("not signed: pass --key to sign (kubexm-install refuses unsigned bundles unless told otherwise)"),
            }
            println!(
                "downloaded {} bytes in {} upstream requests (plus registry pulls)",
                s.downloaded_bytes, s.upstream_requests
            );
        }
    }
    Ok(())
}
