//! The plan and the engine on the recording fake transport: order,
//! parallelism, skip on check, fail-fast versus continue, resume, cycles.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use kubexm_engine::fake::{Fake, Log, Script};
use kubexm_engine::plan::{Check, Module, Pipeline, PlanError, Scope, Step, StepError, Task};
use kubexm_engine::run::{EngineOptions, Policy, Report, run};
use kubexm_engine::state::{Outcome, State};
use kubexm_engine::steps::Shell;
use kubexm_engine::transport::{CmdOutput, Transport, TransportError};

fn hosts(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("h{i}")).collect()
}

fn step(name: &str, check: Option<&str>) -> Arc<dyn Step> {
    Arc::new(Shell::new(name, check, &format!("apply {name}")))
}

fn task(name: &str, hosts: &[String], steps: &[&str], after: &[(&str, Scope)]) -> Task {
    Task {
        name: name.into(),
        hosts: hosts.to_vec(),
        steps: steps.iter().map(|s| step(s, None)).collect(),
        after: after.iter().map(|(t, s)| (t.to_string(), *s)).collect(),
    }
}

/// One module `m` of `tasks`.
fn one_module(tasks: Vec<Task>) -> Pipeline {
    Pipeline {
        name: "p".into(),
        modules: vec![Module { name: "m".into(), tasks }],
    }
}

/// One module with one task of `steps` on `hs`.
fn single(hs: &[String], steps: &[&str]) -> Pipeline {
    Pipeline {
        name: "p".into(),
        modules: vec![Module {
            name: "m".into(),
            tasks: vec![task("t", hs, steps, &[])],
        }],
    }
}

fn transports(hs: &[String], log: &Log, script: Script, latency: Duration) -> HashMap<String, Arc<dyn Transport>> {
    hs.iter()
        .map(|h| {
            (
                h.clone(),
                Arc::new(Fake {
                    host: h.clone(),
                    script: script.clone(),
                    log: log.clone(),
                    latency,
                }) as Arc<dyn Transport>,
            )
        })
        .collect()
}

fn ok_script() -> Script {
    Arc::new(|_, _| {
        Ok(CmdOutput {
            code: Some(0),
            ..Default::default()
        })
    })
}

fn state(dir: &tempfile::TempDir) -> State {
    State::open(&dir.path().join("state.db"), vec!["hunter2-secret".into()]).unwrap()
}

async fn go(p: &Pipeline, ts: &HashMap<String, Arc<dyn Transport>>, st: &State, opts: EngineOptions) -> Report {
    let plan = p.plan().unwrap();
    let job = st.begin_job("c", "test").unwrap();
    run(&plan, ts, st, "c", job, &opts, Arc::new(AtomicBool::new(false))).await
}

/// An all-hosts dependency goes through one barrier: N + M edges, not N x
/// M, whatever the number of hosts; the barrier is neither a step nor reported.
#[tokio::test]
async fn an_all_hosts_dependency_costs_n_plus_m_edges_and_runs_in_order() {
    let hs = hosts(300);
    let p = one_module(vec![
        task("a", &hs, &["a1"], &[]),
        task("b", &hs, &["b1"], &[("a", Scope::AllHosts)]),
        task("c", &hs[..2], &["c1"], &[("a", Scope::AllHosts)]),
    ]);
    let plan = p.plan().unwrap();
    assert_eq!(plan.len(), 602);
    assert_eq!(plan.graph.edge_count(), 300 + 300 + 2, "one shared barrier after a");
    assert!(!plan.describe().contains("every host"), "{}", plan.describe());
    let log = Log::default();
    let dir = tempfile::tempdir().unwrap();
    let r = go(
        &p,
        &transports(&hs, &log, ok_script(), Duration::ZERO),
        &state(&dir),
        EngineOptions::default(),
    )
    .await;
    assert!(r.ok(), "{r:?}");
    assert_eq!(r.results.len(), 602);
    let calls = log.calls();
    let last_a = calls.iter().rposition(|(_, c)| c.contains("apply a1")).unwrap();
    let first_b = calls
        .iter()
        .position(|(_, c)| c.contains("apply b1") || c.contains("apply c1"))
        .unwrap();
    assert!(last_a < first_b, "b or c started before a finished on every host");
}

#[tokio::test]
async fn order_follows_same_host_and_all_hosts_edges() {
    let hs = hosts(3);
    let p = Pipeline {
        name: "p".into(),
        modules: vec![
            Module {
                name: "infra".into(),
                tasks: vec![
                    task("a", &hs, &["a1", "a2"], &[]),
                    task("b", &hs, &["b1"], &[("a", Scope::SameHost)]),
                ],
            },
            Module {
                name: "cp".into(),
                tasks: vec![task("c", &hs[..1], &["c1"], &[("b", Scope::AllHosts)])],
            },
        ],
    };
    let log = Log::default();
    let dir = tempfile::tempdir().unwrap();
    let r = go(
        &p,
        &transports(&hs, &log, ok_script(), Duration::from_millis(5)),
        &state(&dir),
        EngineOptions::default(),
    )
    .await;
    assert!(r.ok(), "{r:?}");
    let calls = log.calls();
    let pos = |h: &str, c: &str| {
        calls
            .iter()
            .position(|(hh, cc)| hh == h && cc == c)
            .unwrap_or_else(|| panic!("{c} on {h} not run"))
    };
    for h in &hs {
        assert!(pos(h, "apply a1") < pos(h, "apply a2") && pos(h, "apply a2") < pos(h, "apply b1"));
    }
    for h in &hs {
        assert!(pos(h, "apply b1") < pos("h1", "apply c1"), "c1 started before b1 finished on {h}");
    }
}

#[tokio::test]
async fn independent_hosts_run_in_parallel_within_the_concurrency_bound() {
    let hs = hosts(10);
    let p = single(&hs, &["s1", "s2"]);
    let dir = tempfile::tempdir().unwrap();
    let st = state(&dir);
    let latency = Duration::from_millis(100);
    let ts = transports(&hs, &Log::default(), ok_script(), latency);
    let t0 = Instant::now();
    assert!(
        go(
            &p,
            &ts,
            &st,
            EngineOptions {
                concurrency: 10,
                ..Default::default()
            }
        )
        .await
        .ok()
    );
    let wide = t0.elapsed();
    let t1 = Instant::now();
    let dir2 = tempfile::tempdir().unwrap();
    assert!(
        go(
            &p,
            &ts,
            &state(&dir2),
            EngineOptions {
                concurrency: 2,
                ..Default::default()
            }
        )
        .await
        .ok()
    );
    let narrow = t1.elapsed();
    // 10 hosts x 2 steps: about 2 latencies wide open, about 10 with 2 hosts at a time.
    assert!(wide < latency * 5, "wide run took {wide:?}");
    assert!(narrow >= latency * 9, "narrow run took only {narrow:?}: more than 2 hosts at once?");
}

#[tokio::test]
async fn a_step_whose_check_holds_is_skipped_and_not_applied() {
    let hs = hosts(2);
    let t = Task {
        name: "t".into(),
        hosts: hs.clone(),
        steps: vec![Arc::new(Shell::new("s", Some("check s"), "apply s"))],
        after: vec![],
    };
    let p = Pipeline {
        name: "p".into(),
        modules: vec![Module {
            name: "m".into(),
            tasks: vec![t],
        }],
    };
    let script: Script = Arc::new(|host, cmd| {
        Ok(CmdOutput {
            code: Some(if cmd == "check s" && host == "h1" {
                0
            } else if cmd == "check s" {
                1
            } else {
                0
            }),
            ..Default::default()
        })
    });
    let log = Log::default();
    let dir = tempfile::tempdir().unwrap();
    let r = go(
        &p,
        &transports(&hs, &log, script, Duration::ZERO),
        &state(&dir),
        EngineOptions::default(),
    )
    .await;
    let by_host: HashMap<_, _> = r.results.iter().map(|x| (x.host.clone(), x.outcome)).collect();
    assert_eq!(by_host["h1"], Outcome::Skipped);
    assert_eq!(by_host["h2"], Outcome::Applied);
    assert!(!log.calls().contains(&("h1".into(), "apply s".into())));
}

fn failing_on(host: &'static str, cmd: &'static str) -> Script {
    Arc::new(move |h, c| {
        Ok(CmdOutput {
            code: Some(if h == host && c == cmd { 1 } else { 0 }),
            stderr: "boom".into(),
            ..Default::default()
        })
    })
}

#[tokio::test]
async fn fail_fast_stops_everything_continue_finishes_other_hosts() {
    let hs = hosts(4);
    let p = || single(&hs, &["s1", "s2", "s3"]);
    let dir = tempfile::tempdir().unwrap();
    let st = state(&dir);
    let cont = go(
        &p(),
        &transports(&hs, &Log::default(), failing_on("h2", "apply s1"), Duration::from_millis(20)),
        &st,
        EngineOptions {
            policy: Policy::ContinueOtherHosts,
            ..Default::default()
        },
    )
    .await;
    let fail = cont.failures();
    assert_eq!(fail.len(), 1);
    assert!(fail[0].id == "m/t/s1@h2" && fail[0].log.contains("boom"), "{fail:?}");
    assert_eq!(cont.count(Outcome::Applied), 9, "the other three hosts finish");
    assert_eq!(cont.count(Outcome::NotRun), 2, "h2's s2 and s3 cannot run");

    let dir2 = tempfile::tempdir().unwrap();
    let fast = go(
        &p(),
        &transports(&hs, &Log::default(), failing_on("h2", "apply s1"), Duration::from_millis(20)),
        &state(&dir2),
        EngineOptions {
            policy: Policy::FailFast,
            ..Default::default()
        },
    )
    .await;
    assert!(
        fast.count(Outcome::Applied) < 9,
        "fail-fast kept starting steps: {}",
        fast.count(Outcome::Applied)
    );
    assert_eq!(fast.results.len(), 12, "every node is accounted for");
}

/// A host lost mid-run under fail-fast: nothing more runs on it or on what
/// waits on it, every other host goes on, and each node not done says why.
#[tokio::test]
async fn a_lost_host_stops_every_other_host_and_reads_as_a_library_error() {
    let hs = hosts(3);
    // t1 on every host, then a gate on h1 after t1 everywhere, then t2 on every host.
    let p = one_module(vec![
        task("t1", &hs, &["a", "b"], &[]),
        task("gate", &hs[..1], &["g"], &[("t1", Scope::AllHosts)]),
        task("t2", &hs, &["c"], &[("t1", Scope::SameHost)]),
    ]);
    let script: Script = Arc::new(|h, c| {
        if h == "h3" && c == "apply b" {
            return Err(TransportError::Lost {
                host: h.into(),
                why: "Channel send error".into(),
            });
        }
        Ok(CmdOutput {
            code: Some(0),
            ..Default::default()
        })
    });
    let dir = tempfile::tempdir().unwrap();
    let log = Log::default();
    let r = go(
        &p,
        &transports(&hs, &log, script, Duration::from_millis(5)),
        &state(&dir),
        EngineOptions {
            policy: Policy::FailFast,
            ..Default::default()
        },
    )
    .await;
    let fail = r.failures();
    assert_eq!(fail.len(), 1, "{fail:?}");
    assert!(fail[0].log.contains("h3: the host became unreachable"), "{}", fail[0].log);
    assert!(!fail[0].log.contains('\u{0}'), "{:?}", fail[0].log);
    let outcome = |id: &str| r.results.iter().find(|x| x.id == id).map(|x| (x.outcome, x.log.clone())).unwrap();
    // The other hosts went on with what does not wait on h3, despite fail-fast.
    for id in ["m/t1/b@h1", "m/t1/b@h2", "m/t2/c@h1", "m/t2/c@h2"] {
        assert_eq!(outcome(id).0, Outcome::Applied, "{id}");
    }
    assert_eq!(outcome("m/t2/c@h3"), (Outcome::NotRun, "not done: h3 became unreachable".into()));
    assert_eq!(
        outcome("m/gate/g@h1"),
        (Outcome::NotRun, "not done: it waits on h3, which became unreachable".into())
    );
    assert!(!log.calls().iter().any(|(h, c)| h == "h3" && c == "apply c"));
    assert_eq!(r.results.len(), 10, "every node is accounted for");
}

#[tokio::test]
async fn a_rerun_resumes_from_the_state_database() {
    let hs = hosts(2);
    let p = single(&hs, &["s1", "s2"]);
    let dir = tempfile::tempdir().unwrap();
    let st = state(&dir);
    let first = go(
        &p,
        &transports(&hs, &Log::default(), failing_on("h1", "apply s2"), Duration::ZERO),
        &st,
        EngineOptions {
            policy: Policy::ContinueOtherHosts,
            ..Default::default()
        },
    )
    .await;
    assert!(!first.ok());
    let log = Log::default();
    let second = go(
        &p,
        &transports(&hs, &log, ok_script(), Duration::ZERO),
        &st,
        EngineOptions::default(),
    )
    .await;
    assert!(second.ok(), "{second:?}");
    // Steps completed earlier (no check of their own) are not run again; only the failed one is.
    assert_eq!(log.calls(), vec![("h1".to_string(), "apply s2".to_string())]);
    assert_eq!(second.count(Outcome::Skipped), 3);
    let job = st.job(None).unwrap().unwrap();
    assert_eq!(job.status, "succeeded");
}

/// At 5,000 hosts: a run stopped halfway (as by Ctrl-C) and resumed skips
/// exactly the nodes the first run completed and runs exactly the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_stopped_halfway_at_5000_hosts_resumes_with_exactly_the_rest() {
    let hs: Vec<String> = (0..5000).map(|i| format!("host{i:04}")).collect();
    let steps: Vec<String> = (0..60).map(|i| format!("s{i}")).collect();
    let names: Vec<&str> = steps.iter().map(String::as_str).collect();
    let p = one_module(vec![
        task("a", &hs, &names[..30], &[]),
        task("b", &hs, &names[30..], &[("a", Scope::AllHosts)]),
    ]);
    let total = 5000 * 60;
    let dir = tempfile::tempdir().unwrap();
    let st = state(&dir);
    let stop = Arc::new(AtomicBool::new(false));
    let applied = Arc::new(AtomicU32::new(0));
    let (stop2, applied2) = (stop.clone(), applied.clone());
    let half: Script = Arc::new(move |_, _| {
        if applied2.fetch_add(1, Ordering::SeqCst) + 1 == total as u32 / 2 {
            stop2.store(true, Ordering::SeqCst);
        }
        Ok(CmdOutput {
            code: Some(0),
            ..Default::default()
        })
    });
    let plan = p.plan().unwrap();
    let log = Log::default();
    let job = st.begin_job("c", "test").unwrap();
    let opts = EngineOptions {
        concurrency: 250,
        ..Default::default()
    };
    let first = run(&plan, &transports(&hs, &log, half, Duration::ZERO), &st, "c", job, &opts, stop).await;
    assert!(first.interrupted);
    let done: std::collections::HashSet<String> = first
        .results
        .iter()
        .filter(|r| r.outcome == Outcome::Applied)
        .map(|r| r.id.clone())
        .collect();
    // Stopped near half: what was running when it stopped finished and was recorded.
    assert!(done.len() >= total / 2 && done.len() < total / 2 + 300, "{}", done.len());
    assert_eq!(first.count(Outcome::NotRun), total - done.len());
    let again = Log::default();
    let job = st.begin_job("c", "test").unwrap();
    let second = run(
        &plan,
        &transports(&hs, &again, ok_script(), Duration::ZERO),
        &st,
        "c",
        job,
        &opts,
        Arc::new(AtomicBool::new(false)),
    )
    .await;
    assert!(second.ok());
    assert_eq!(second.count(Outcome::Skipped), done.len());
    assert_eq!(second.count(Outcome::Applied), total - done.len());
    for r in &second.results {
        assert_eq!(r.outcome == Outcome::Skipped, done.contains(&r.id), "{}", r.id);
    }
    assert_eq!(again.calls().len(), total - done.len(), "a completed node ran again");
}

#[tokio::test]
async fn transient_transport_failures_are_retried() {
    let hs = hosts(1);
    let p = single(&hs, &["s1"]);
    let n = Arc::new(AtomicU32::new(0));
    let n2 = n.clone();
    let script: Script = Arc::new(move |h, _| {
        if n2.fetch_add(1, Ordering::SeqCst) == 0 {
            Err(TransportError::Session {
                host: h.into(),
                why: "connection reset".into(),
            })
        } else {
            Ok(CmdOutput {
                code: Some(0),
                ..Default::default()
            })
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let r = go(
        &p,
        &transports(&hs, &Log::default(), script, Duration::ZERO),
        &state(&dir),
        EngineOptions::default(),
    )
    .await;
    assert!(r.ok(), "{r:?}");
    assert_eq!(n.load(Ordering::SeqCst), 2);
}

#[test]
fn cycles_and_unknown_tasks_are_refused() {
    let hs = hosts(1);
    let p = one_module(vec![
        task("a", &hs, &["x"], &[("b", Scope::SameHost)]),
        task("b", &hs, &["y"], &[("a", Scope::SameHost)]),
    ]);
    assert!(matches!(p.plan(), Err(PlanError::Cycle(_))));
    let q = Pipeline {
        name: "p".into(),
        modules: vec![Module {
            name: "m".into(),
            tasks: vec![task("a", &hs, &["x"], &[("nope", Scope::AllHosts)])],
        }],
    };
    assert!(matches!(q.plan(), Err(PlanError::UnknownTask { .. })));
}

#[test]
fn dry_run_description_and_dot() {
    let hs = hosts(2);
    let p = Pipeline {
        name: "p".into(),
        modules: vec![Module {
            name: "infra".into(),
            tasks: vec![task("a", &hs, &["a1", "a2"], &[])],
        }],
    };
    let plan = p.plan().unwrap();
    let d = plan.describe();
    assert!(d.starts_with("infra\n") && d.contains("  h1: infra/a/a1, infra/a/a2"), "{d}");
    assert!(plan.to_dot().contains("->"));
}

#[tokio::test]
async fn secrets_never_reach_the_state_database() {
    let hs = hosts(1);
    let p = single(&hs, &["s1"]);
    let script: Script = Arc::new(|_, _| {
        Ok(CmdOutput {
            code: Some(0),
            stdout: "password is hunter2-secret".into(),
            ..Default::default()
        })
    });
    let dir = tempfile::tempdir().unwrap();
    let st = state(&dir);
    go(
        &p,
        &transports(&hs, &Log::default(), script, Duration::ZERO),
        &st,
        EngineOptions::default(),
    )
    .await;
    let job = st.job(None).unwrap().unwrap();
    let steps = st.steps(job.id).unwrap();
    assert!(
        steps[0].log.contains("<redacted>") && !steps[0].log.contains("hunter2"),
        "{}",
        steps[0].log
    );
    drop(st);
    let raw = std::fs::read(dir.path().join("state.db")).unwrap();
    assert!(!String::from_utf8_lossy(&raw).contains("hunter2-secret"));
}

/// A step that runs `f` as its apply (for defects in the engine itself).
struct Hook<F: Fn() + Send + Sync>(&'static str, F);

impl<F: Fn() + Send + Sync> Step for Hook<F> {
    fn name(&self) -> &str {
        self.0
    }
    fn check<'a>(&'a self, _: &'a dyn Transport) -> futures_util::future::BoxFuture<'a, Result<Check, StepError>> {
        Box::pin(async { Ok(Check::Missing) })
    }
    fn apply<'a>(&'a self, _: &'a dyn Transport) -> futures_util::future::BoxFuture<'a, Result<String, StepError>> {
        Box::pin(async move {
            (self.1)();
            Ok("done".into())
        })
    }
}

fn hooked(hs: &[String], hook: Arc<dyn Step>) -> Pipeline {
    Pipeline {
        name: "p".into(),
        modules: vec![Module {
            name: "m".into(),
            tasks: vec![Task {
                name: "t".into(),
                hosts: hs.to_vec(),
                steps: vec![step("s1", None), hook, step("s3", None)],
                after: vec![],
            }],
        }],
    }
}

#[tokio::test]
async fn a_step_that_panics_is_reported_as_the_run_stopped_before_it() {
    let hs = hosts(1);
    let p = hooked(&hs, Arc::new(Hook("boom", || panic!("the step's own bug"))));
    let dir = tempfile::tempdir().unwrap();
    let r = go(
        &p,
        &transports(&hs, &Log::default(), ok_script(), Duration::ZERO),
        &state(&dir),
        EngineOptions::default(),
    )
    .await;
    let fail = r.failures();
    assert_eq!(fail.len(), 1, "{r:?}");
    assert_eq!(fail[0].id, "m/t/boom@h1");
    assert!(fail[0].log.contains("the step panicked: the step's own bug"), "{}", fail[0].log);
    assert_eq!(r.results.len(), 3, "every node is accounted for");
}

#[tokio::test]
async fn a_failed_state_write_is_dropped_by_the_scheduler() {
    let hs = hosts(1);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    // The hook breaks the state database under the engine: its next write fails.
    let path = db.clone();
    let p = hooked(
        &hs,
        Arc::new(Hook("break-state", move || {
            let c = rusqlite::Connection::open(&path).unwrap();
            c.execute_batch("ALTER TABLE steps RENAME TO steps_gone").unwrap();
        })),
    );
    let log = Log::default();
    let r = go(
        &p,
        &transports(&hs, &log, ok_script(), Duration::ZERO),
        &state(&dir),
        EngineOptions::default(),
    )
    .await;
    assert!(!r.ok());
    let e = r.state_error.as_deref().unwrap_or_default();
    assert!(e.contains("recording step results"), "{r:?}");
    // The run stopped: the step after it never ran.
    assert!(!log.calls().iter().any(|(_, c)| c == "apply s3"), "{:?}", log.calls());
}

/// The engine prints nothing: it emits numbered events, which a printer or
/// a job database consumes.
#[tokio::test]
async fn events_are_numbered_in_order_from_job_start_to_job_end() {
    use kubexm_engine::events::{Collect, Event};
    let hs = hosts(2);
    let p = single(&hs, &["s1", "s2"]);
    let dir = tempfile::tempdir().unwrap();
    let sink = Arc::new(Collect::default());
    let r = go(
        &p,
        &transports(&hs, &Log::default(), failing_on("h2", "apply s1"), Duration::ZERO),
        &state(&dir),
        EngineOptions {
            policy: Policy::ContinueOtherHosts,
            events: Some(sink.clone()),
            ..Default::default()
        },
    )
    .await;
    assert!(!r.ok());
    let events = sink.0.lock().unwrap().clone();
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>());
    assert!(matches!(&events[0].event, Event::JobStarted { phases } if phases.len() == 1 && phases[0].nodes_per_host.len() == 2));
    assert!(matches!(&events.last().unwrap().event, Event::JobFinished { status } if status == "failed"));
    let finished = |node: &str| {
        events.iter().find_map(|e| match &e.event {
            Event::StepFinished { node: n, outcome, .. } if n == node => Some((e.seq, *outcome)),
            _ => None,
        })
    };
    let started = |node: &str| {
        events
            .iter()
            .find(|e| matches!(&e.event, Event::StepStarted { node: n, .. } if n == node))
            .map(|e| e.seq)
    };
    assert!(started("m/t/s1@h1").unwrap() < finished("m/t/s1@h1").unwrap().0);
    assert_eq!(finished("m/t/s1@h2").unwrap().1, Outcome::Failed);
    assert_eq!(finished("m/t/s2@h2").unwrap().1, Outcome::NotRun);
    assert_eq!(started("m/t/s2@h2"), None, "a step not run never started");
}

/// A step's output reaches the sink as numbered log lines (secrets
/// redacted), between the step's start and its finish.
#[tokio::test]
async fn a_steps_output_arrives_as_log_line_events_before_it_finishes() {
    use kubexm_engine::events::{Collect, Event};
    let hs = hosts(2);
    let p = single(&hs, &["s1", "s2"]);
    let dir = tempfile::tempdir().unwrap();
    let sink = Arc::new(Collect::default());
    let r = go(
        &p,
        &transports(&hs, &Log::default(), failing_on("h2", "apply s1"), Duration::ZERO),
        &state(&dir),
        EngineOptions {
            policy: Policy::ContinueOtherHosts,
            events: Some(sink.clone()),
            ..Default::default()
        },
    )
    .await;
    let events = sink.0.lock().unwrap().clone();
    let node = "m/t/s1@h2";
    let seq_of = |f: &dyn Fn(&Event) -> bool| events.iter().find(|e| f(&e.event)).map(|e| e.seq);
    let started = seq_of(&|e| matches!(e, Event::StepStarted { node: n, .. } if n == node)).unwrap();
    let finished = seq_of(&|e| matches!(e, Event::StepFinished { node: n, .. } if n == node)).unwrap();
    let lines: Vec<(u64, String)> = events
        .iter()
        .filter_map(|e| match &e.event {
            Event::LogLine { node: n, line, .. } if n == node => Some((e.seq, line.clone())),
            _ => None,
        })
        .collect();
    assert!(!lines.is_empty(), "no log line for {node}: {events:?}");
    assert!(lines.iter().all(|(s, _)| *s > started && *s < finished), "{lines:?}");
    let log = r.results.iter().find(|x| x.id == node).unwrap().log.clone();
    assert_eq!(
        lines.iter().map(|(_, l)| l.as_str()).collect::<Vec<_>>(),
        log.lines().collect::<Vec<_>>()
    );
}

/// Issue 26: the engine's state is keyed by operation. A step without a
/// check that an install completed is skipped by the next install only:
/// another operation with the same step id runs it, and after a successful
/// reset the cluster's state is forgotten (install, reset, install runs
/// every step again).
#[tokio::test]
async fn operations_sharing_step_ids_keep_separate_state_and_a_reset_forgets_it() {
    let dir = tempfile::tempdir().unwrap();
    let st = state(&dir);
    let hs = hosts(1);
    let log = Log::default();
    let ts = transports(&hs, &log, ok_script(), Duration::ZERO);
    let applied = || log.calls().iter().filter(|(_, c)| c == "apply s1").count();
    let op = async |kind: &str, steps: &[&str]| {
        let plan = single(&hs, steps).plan().unwrap();
        let job = st.begin_job("c", kind).unwrap();
        run(
            &plan,
            &ts,
            &st,
            "c",
            job,
            &EngineOptions::default(),
            Arc::new(AtomicBool::new(false)),
        )
        .await
    };
    op("install", &["s1"]).await;
    assert_eq!(applied(), 1);
    op("os-packages", &["s1"]).await;
    assert_eq!(applied(), 2, "another operation's step with the same id was masked");
    op("install", &["s1"]).await;
    assert_eq!(applied(), 2, "a re-run of the same operation skips what it completed");
    op("reset", &["r1"]).await;
    op("install", &["s1"]).await;
    assert_eq!(applied(), 3, "after a successful reset, install runs every step again");
    // Issue 29: an apply runs the install's steps: it skips what installs
    // did, and an install after it skips what it did; a dry run's plan
    // leaves out the same steps.
    let done = st.done_steps("c", "apply").unwrap();
    assert!(done.len() == 1 && done.iter().all(|n| n.contains("/s1@")), "{done:?}");
    op("apply", &["s1"]).await;
    assert_eq!(applied(), 3, "an apply ran a step an install did");
    op("apply", &["s1", "s2"]).await;
    let s2 = || log.calls().iter().filter(|(_, c)| c == "apply s2").count();
    assert_eq!(s2(), 1);
    op("install", &["s1", "s2"]).await;
    assert_eq!((applied(), s2()), (3, 1), "an install ran a step an apply did");
    // Issue 29: a host taken out of the cluster (remove node) and added
    // again gets every step: what was done on it before no longer counts.
    let removal = st.begin_job("c", "remove-node").unwrap();
    st.finish_job(removal, "succeeded").unwrap();
    st.put_removed(removal, "c", &[hs[0].clone()]).unwrap();
    assert!(
        st.done_steps("c", "apply").unwrap().is_empty(),
        "steps on a removed host count as done"
    );
    op("apply", &["s1", "s2"]).await;
    assert_eq!(
        (applied(), s2()),
        (4, 2),
        "a host added again skipped a step done before its removal"
    );
    // A removal checks each of its steps again, whatever an earlier one did.
    op("remove-node", &["s1"]).await;
    op("remove-node", &["s1"]).await;
    assert_eq!(applied(), 6, "a removal skipped a step an earlier removal did");
}
