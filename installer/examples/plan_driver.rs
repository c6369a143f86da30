//! Lab test driver (not shipped): runs a real multi-step plan over SSH on
//! every host of a cluster config, so tests can kill it, stop hosts under it
//! and run it again. Steps per host: a marker directory, a file fetched from
//! a file server with its sha256 checked, a slow step, and a systemd unit.
//!
//! Usage: plan_driver CLUSTER_YAML CATALOG STATE_DB FILE_URL FILE_LOCAL SHA256 SLOW_SECONDS CONCURRENCY
//! Prints a JSON summary; exits 0 when every step succeeded, 7 otherwise.

use std::sync::Arc;

use kubexm_installer::engine::inventory;
use kubexm_installer::engine::jobs::{run_steps_blocking, summary};
use kubexm_installer::engine::plan::Step;
use kubexm_installer::engine::run::Policy;
use kubexm_installer::engine::state::State;
use kubexm_installer::engine::steps::{Distribute, FileCopy, Shell};

fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(
        a.len() == 8,
        "usage: plan_driver CLUSTER_YAML CATALOG STATE_DB FILE_URL FILE_LOCAL SHA256 SLOW_SECONDS CONCURRENCY"
    );
    let catalog = kubexm_bom::catalog::Catalog::with_overrides(&[std::path::Path::new(&a[1])])?;
    let cluster = kubexm_bom::config::load_file(std::path::Path::new(&a[0]), &catalog)?;
    let (_, secrets) = inventory::targets(&cluster, &Default::default())?;
    let state = Arc::new(State::open(std::path::Path::new(&a[2]), secrets)?);
    let concurrency: usize = a[7]
        .parse()
        .map_err(|_| anyhow::anyhow!("CONCURRENCY must be a number, not {:?}", a[7]))?;
    let dir = "/var/lib/kubexm-test";
    let steps: Vec<Arc<dyn Step>> = vec![
        Arc::new(Shell::new(
            "marker",
            Some(&format!("test -f {dir}/marker")),
            &format!("mkdir -p {dir} && echo ok > {dir}/marker"),
        )),
        Arc::new(Distribute::one(
            "payload",
            FileCopy {
                url: a[3].clone(),
                local: a[4].clone().into(),
                sha256: a[5].clone(),
                dest: format!("{dir}/payload"),
                mode: 0o755,
            },
        )),
        Arc::new(Shell::new(
            "slow",
            Some(&format!("test -f {dir}/slow-done")),
            &format!("sleep {} && touch {dir}/slow-done", a[6]),
        )),
        Arc::new(Shell::new(
            "unit",
            Some("systemctl is-active -q kubexm-test"),
            "systemctl reset-failed kubexm-test 2>/dev/null; systemd-run --collect --unit=kubexm-test sleep 3600 >/dev/null",
        )),
    ];
    let ex = run_steps_blocking(&cluster, state, "driver", steps, concurrency, Policy::ContinueOtherHosts)?;
    println!("{}", summary(&ex));
    std::process::exit(if ex.ok() { 0 } else { 7 });
}
