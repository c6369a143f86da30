//! Bench driver for `ci/bench/fanout` (not shipped): distributes every file
//! of an unpacked bundle's `files/` folder to each host of a cluster config,
//! each fetched from the file server with its sha256 checked, then starts a
//! systemd unit; the real engine over SSH, as the installer runs it.
//!
//! Usage: fanout CLUSTER_YAML STATE_DB BUNDLE_DIR FILE_SERVER_URL CONCURRENCY
//! Prints a JSON summary; exits 0 when every step succeeded, 7 otherwise.

use std::path::Path;
use std::sync::Arc;

use kubexm_bundle::manifest::{BundleManifest, MANIFEST_NAME};
use kubexm_installer::engine::inventory;
use kubexm_installer::engine::jobs::{run_steps_blocking, summary};
use kubexm_installer::engine::plan::Step;
use kubexm_installer::engine::run::Policy;
use kubexm_installer::engine::state::State;
use kubexm_installer::engine::steps::{Distribute, FileCopy, Shell};

fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(
        a.len() == 5,
        "usage: fanout CLUSTER_YAML STATE_DB BUNDLE_DIR FILE_SERVER_URL CONCURRENCY"
    );
    let catalog = kubexm_bom::catalog::Catalog::with_overrides(&[])?;
    let cluster = kubexm_bom::config::load_file(Path::new(&a[0]), &catalog)?;
    let (_, secrets) = inventory::targets(&cluster, &Default::default())?;
    let state = Arc::new(State::open(Path::new(&a[1]), secrets)?);
    let dir = Path::new(&a[2]);
    let manifest = BundleManifest::from_yaml(&fs_err::read_to_string(dir.join(MANIFEST_NAME))?).map_err(anyhow::Error::msg)?;
    let concurrency: usize = a[4]
        .parse()
        .map_err(|_| anyhow::anyhow!("CONCURRENCY must be a number, not {:?}", a[4]))?;
    let dest = "/var/lib/kubexm-bench";
    // All files in one step: a host fetches them in parallel.
    let files = manifest
        .members
        .iter()
        .filter(|m| m.path.starts_with("files/"))
        .map(|m| FileCopy {
            url: format!("{}/{}", a[3].trim_end_matches('/'), m.path),
            local: dir.join(&m.path),
            sha256: m.sha256.clone(),
            dest: format!("{dest}/{}", m.path.rsplit('/').next().unwrap_or(&m.path)),
            mode: 0o644,
        })
        .collect();
    let mut steps: Vec<Arc<dyn Step>> = vec![Arc::new(Distribute {
        name: "files".into(),
        files,
        ca: None,
    })];
    steps.push(Arc::new(Shell::new(
        "unit",
        Some("systemctl is-active -q kubexm-bench"),
        "systemctl reset-failed kubexm-bench 2>/dev/null; systemd-run --collect --unit=kubexm-bench sleep 3600 >/dev/null",
    )));
    let ex = run_steps_blocking(&cluster, state, "fanout", steps, concurrency, Policy::FailFast)?;
    println!("{}", summary(&ex));
    std::process::exit(if ex.ok() { 0 } else { 7 });
}
