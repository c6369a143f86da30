//! Benchmark body for `ci/bench/engine-scale`: the engine on the fake
//! transport, state database included, with simulated per-command latency.
//! Prints plan-building time, wall time and the simulated wait it contained.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use kubexm_installer::engine::fake::{Fake, Log};
use kubexm_installer::engine::plan::{Module, Pipeline, Scope, Step, Task};
use kubexm_installer::engine::run::{EngineOptions, Policy, run};
use kubexm_installer::engine::state::State;
use kubexm_installer::engine::steps::Shell;
use kubexm_installer::engine::transport::Transport;

fn main() -> anyhow::Result<()> {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (hosts, steps, latency_ms, concurrency) = (
        args.first().copied().unwrap_or(1000),
        args.get(1).copied().unwrap_or(50),
        args.get(2).copied().unwrap_or(2),
        args.get(3).copied().unwrap_or(250),
    );
    let names: Vec<String> = (0..hosts).map(|i| format!("host{i:04}")).collect();
    let t0 = Instant::now();
    // Five modules of steps/5 steps each, the later ones after the earlier on the same host,
    // and one all-hosts barrier between the second and third module.
    let per = (steps / 5).max(1);
    let modules: Vec<Module> = (0..5)
        .map(|m| {
            let steps: Vec<Arc<dyn Step>> = (0..per)
                .map(|s| Arc::new(Shell::new(&format!("s{s}"), None, &format!("apply m{m} s{s}"))) as Arc<dyn Step>)
                .collect();
            let after = match m {
                0 => vec![],
                2 => vec![(format!("t{}", m - 1), Scope::AllHosts)],
                _ => vec![(format!("t{}", m - 1), Scope::SameHost)],
            };
            Module {
                name: format!("m{m}"),
                tasks: vec![Task {
                    name: format!("t{m}"),
                    hosts: names.clone(),
                    steps,
                    after,
                }],
            }
        })
        .collect();
    let plan = Pipeline {
        name: "scale".into(),
        modules,
    }
    .plan()?;
    let plan_time = t0.elapsed();
    // The fake keeps no call log: the engine is measured, not the fake.
    let log = Log::off();
    let latency = Duration::from_millis(latency_ms as u64);
    let transports: HashMap<String, Arc<dyn Transport>> = names
        .iter()
        .map(|h| {
            (
                h.clone(),
                Arc::new(Fake {
                    latency,
                    ..Fake::ok(h, log.clone())
                }) as Arc<dyn Transport>,
            )
        })
        .collect();
    let dir = std::env::temp_dir().join(format!("kubexm-engine-scale-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let state = State::open(&dir.join("state.db"), vec![])?;
    let job = state.begin_job("scale", "bench")?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let t1 = Instant::now();
    let report = rt.block_on(run(
        &plan,
        &transports,
        &state,
        "scale",
        job,
        &EngineOptions {
            concurrency,
            policy: Policy::FailFast,
            attempts: 1,
            ..Default::default()
        },
        Arc::new(AtomicBool::new(false)),
    ));
    let wall = t1.elapsed();
    anyhow::ensure!(report.ok(), "the run failed: {:?}", report.failures());
    // Each host runs its steps one after another; hosts run `concurrency` at a time.
    let waves = hosts.div_ceil(concurrency) as u32;
    let simulated = latency * (per * 5) as u32 * waves;
    println!(
        "nodes {} ({hosts} hosts x {} steps), concurrency {concurrency}, latency {latency_ms} ms",
        plan.len(),
        per * 5
    );
    println!("plan building: {:.3} s", plan_time.as_secs_f64());
    println!(
        "run wall time: {:.2} s (simulated waits at least {:.2} s)",
        wall.as_secs_f64(),
        simulated.as_secs_f64()
    );
    if std::env::args().nth(5).as_deref() != Some("timeline") {
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    // The run's timeline, read back, its critical path found and drawn.
    let t2 = Instant::now();
    let timeline = rt
        .block_on(kubexm_installer::engine::timeline::Timeline::load(&state, Some(job)))?
        .ok_or_else(|| anyhow::anyhow!("no job {job}"))?;
    let loaded = t2.elapsed();
    let svg = kubexm_installer::engine::timeline::svg::render(&timeline);
    let svg_path = dir.join("timeline.svg");
    kubexm_bundle::files::write_atomic(&svg_path, svg.as_bytes())?;
    println!(
        "timeline: read and critical path {:.2} s, SVG written in {:.2} s, {:.2} MB ({} steps on its critical path)",
        loaded.as_secs_f64(),
        (t2.elapsed() - loaded).as_secs_f64(),
        svg.len() as f64 / 1e6,
        timeline.critical_path.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
