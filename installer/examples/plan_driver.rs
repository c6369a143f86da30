//! Lab test driver (not shipped): runs a real multi-step plan over SSH on
//! every host of a cluster config, so tests can kill it, stop hosts under it
//! and run it again. Steps per host: a marker directory, a file fetched from
//! a file server with its sha256 checked, a slow step, and a systemd unit.
//!
//! Usage: plan_driver CLUSTER_YAML CATALOG STATE_DB FILE_URL FILE_LOCAL SHA256 SLOW_SECONDS CONCURRENCY
//! Prints a JSON summary; exits 0 when every step succeeded, 7 otherwise.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use kubexm_installer::engine::inventory;
use kubexm_installer::engine::plan::{Module, Pipeline, Step, Task};
use kubexm_installer::engine::run::{EngineOptions, Policy, run};
use kubexm_installer::engine::state::{Outcome, State};
use kubexm_installer::engine::steps::{Distribute, Shell};

fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(
        a.len() == 8,
        "usage: plan_driver CLUSTER_YAML CATALOG STATE_DB FILE_URL FILE_LOCAL SHA256 SLOW_SECONDS CONCURRENCY"
    );
    let catalog = kubexm_bom::catalog::Catalog::with_overrides(&[std::path::Path::new(&a[1])])?;
    let cluster = kubexm_bom::config::load_file(std::path::Path::new(&a[0]), &catalog)?;
    let (targets, secrets) = inventory::targets(&cluster)?;
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
        Arc::new(Distribute {
            name: "payload".into(),
            url: a[3].clone(),
            local: a[4].clone().into(),
            sha256: a[5].clone(),
            dest: format!("{dir}/payload"),
            mode: 0o755,
            ca: None,
        }),
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
    let hosts: Vec<String> = targets.iter().map(|t| t.name.clone()).collect();
    let pipeline = Pipeline {
        name: "driver".into(),
        modules: vec![Module {
            name: "driver".into(),
            tasks: vec![Task {
                name: "all".into(),
                hosts,
                steps,
                after: vec![],
            }],
        }],
    };
    let plan = pipeline.plan()?;
    let rt = tokio::runtime::Runtime::new()?;
    let (report, connect_errors, job) = rt.block_on(async {
        let (transports, errors) = inventory::connect_all(&targets, state.clone(), false, concurrency).await;
        let job = state.begin_job(&cluster.metadata.name, "driver")?;
        let opts = EngineOptions {
            concurrency,
            policy: Policy::ContinueOtherHosts,
            attempts: 3,
        };
        anyhow::Ok((
            run(
                &plan,
                &transports,
                &state,
                &cluster.metadata.name,
                job,
                &opts,
                Arc::new(AtomicBool::new(false)),
            )
            .await,
            errors,
            job,
        ))
    })?;
    let failed: Vec<_> = report
        .failures()
        .iter()
        .map(|f| serde_json::json!({"id": f.id, "host": f.host, "log": f.log}))
        .collect();
    let summary = serde_json::json!({
        "job": job,
        "applied": report.count(Outcome::Applied),
        "skipped": report.count(Outcome::Skipped),
        "notRun": report.count(Outcome::NotRun),
        "failed": failed,
        "connectErrors": connect_errors.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
    });
    println!("{summary}");
    std::process::exit(if report.ok() && connect_errors.is_empty() { 0 } else { 7 });
}
