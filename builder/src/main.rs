//! `kubexm-bundle`: the online side of kubexm. Thin: flags in, one library
//! call, output or an error with its documented exit code.

use std::path::PathBuf;
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
    kubexm_cli::init_logging(cli.verbose);
    kubexm_cli::exit(run(cli.command))
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Validate { config, output } => {
            let catalog = kubexm_builder::catalog(&config.catalog)?;
            match (kubexm_builder::validate(&config.file, &catalog), output) {
                (Err(e), Output::Json) => {
                    if let Some(kubexm_bom::config::LoadError::Invalid(d)) = e.downcast_ref() {
                        println!(
                            "{}",
                            serde_json::to_string_pretty(
                                &serde_json::json!({"valid": false, "file": d.file, "diagnostics": d.diagnostics})
                            )?
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
                        config.file.display(),
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
