//! `kubexm-install`: the offline side of kubexm.
//!
//! This release validates the cluster config exactly as the builder does, so
//! an operator can check a config inside the air gap, and then refuses the
//! install itself: verifying, serving and deploying are not built yet, and a
//! feature that is not built is refused, never faked.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use kubexm_cli::{Class, classified};

/// Install a Kubernetes cluster from a kubexm bundle, with no internet.
#[derive(Parser)]
#[command(name = "kubexm-install", version, about, long_about = None, after_help = "Exit codes: 0 ok, 1 bug, 2 usage, 3 invalid config, 4 file I/O, 5 fetch, 6 verification, 7 host, 8 not supported yet, 130 interrupted.")]
struct Cli {
    /// The bundle (.tar.zst) built by kubexm-bundle.
    #[arg(long, value_name = "FILE")]
    bundle: Option<PathBuf>,
    /// The cluster config (cluster.yaml).
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    file: PathBuf,
    /// Extend or override the built-in catalog with this file. Repeatable.
    #[arg(long = "catalog", value_name = "FILE")]
    catalog: Vec<PathBuf>,
    /// More log output on stderr (-v info, -vv debug).
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    kubexm_cli::init_logging(cli.verbose);
    kubexm_cli::exit(run(cli))
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let files: Vec<&std::path::Path> = cli.catalog.iter().map(PathBuf::as_path).collect();
    let catalog = kubexm_bom::catalog::Catalog::with_overrides(&files)?;
    let cluster = kubexm_bom::config::load_file(&cli.file, &catalog)?;
    let bundle = cli.bundle.map(|b| format!(" from {}", b.display())).unwrap_or_default();
    Err(classified(
        Class::Unsupported,
        anyhow::anyhow!(
            "{}: config valid (cluster {}); installing{bundle} is not supported yet: bundle verification, the registry and the deployment phases are still being built",
            cli.file.display(),
            cluster.metadata.name
        ),
    ))
}
