//! A job's timeline from a run on the fake transport with known step
//! durations: the SVG is well-formed XML with one lane per host, each bar
//! where its recorded times put it (within 1 px) and as long as its known
//! duration, the critical path the known one; the JSON carries the same
//! numbers. Past the fold, lanes become phase rows and the file stays small.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use futures_util::future::BoxFuture;
use kubexm_engine::fake::{Fake, Log};
use kubexm_engine::plan::{Check, Module, Pipeline, Scope, Step, StepError, Task};
use kubexm_engine::run::{EngineOptions, run};
use kubexm_engine::state::{Span, State, now_ms};
use kubexm_engine::timeline::svg::{FOLD_AT, Geometry, render};
use kubexm_engine::timeline::{PREAMBLE, Timeline};
use kubexm_engine::transport::Transport;

/// A step that takes a known time per host; a wait when it names what for.
struct Sleep {
    name: String,
    ms: HashMap<String, u64>,
    waits: Option<String>,
}

impl Step for Sleep {
    fn name(&self) -> &str {
        &self.name
    }
    fn check<'a>(&'a self, _: &'a dyn Transport) -> BoxFuture<'a, Result<Check, StepError>> {
        Box::pin(async { Ok(Check::Missing) })
    }
    fn apply<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<String, StepError>> {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(self.ms[t.host()])).await;
            Ok(String::new())
        })
    }
    fn waits(&self) -> Option<&str> {
        self.waits.as_deref()
    }
}

fn sleep(name: &str, ms: &[(&str, u64)], waits: Option<&str>) -> Arc<dyn Step> {
    Arc::new(Sleep {
        name: name.into(),
        ms: ms.iter().map(|(h, m)| (h.to_string(), *m)).collect(),
        waits: waits.map(str::to_string),
    })
}

/// Phase one on a and b (b slower), then phase two on a after every host
/// of phase one: a step and a wait. Known critical path: b's two steps,
/// then a's two of phase two.
fn pipeline() -> Pipeline {
    let hosts = vec!["a".to_string(), "b".to_string()];
    Pipeline {
        name: "p".into(),
        modules: vec![
            Module {
                name: "one".into(),
                tasks: vec![Task {
                    name: "t1".into(),
                    hosts: hosts.clone(),
                    steps: vec![
                        sleep("s1", &[("a", 100), ("b", 300)], None),
                        sleep("s2", &[("a", 100), ("b", 300)], None),
                    ],
                    after: vec![],
                }],
            },
            Module {
                name: "two".into(),
                tasks: vec![Task {
                    name: "t2".into(),
                    hosts: vec!["a".into()],
                    steps: vec![sleep("s3", &[("a", 300)], None), sleep("w", &[("a", 300)], Some("the thing"))],
                    after: vec![("t1".into(), Scope::AllHosts)],
                }],
            },
        ],
    }
}

/// Runs the pipeline after a 200 ms preamble; returns its timeline.
async fn timeline_of_a_run(dir: &tempfile::TempDir) -> Timeline {
    let st = State::open(&dir.path().join("state.db"), vec![]).unwrap();
    let log = Log::default();
    let ts: HashMap<String, Arc<dyn Transport>> = ["a", "b"]
        .iter()
        .map(|h| (h.to_string(), Arc::new(Fake::ok(h, log.clone())) as Arc<dyn Transport>))
        .collect();
    let before = now_ms();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let job = st.begin_job("c", "install").unwrap();
    st.record_spans(job, &[Span::since("unpack", before)]).unwrap();
    let plan = pipeline().plan().unwrap();
    let report = run(
        &plan,
        &ts,
        &st,
        "c",
        job,
        &EngineOptions::default(),
        Arc::new(AtomicBool::new(false)),
    )
    .await;
    assert!(report.ok());
    Timeline::load(&st, Some(job)).await.unwrap().unwrap()
}

fn num(n: roxmltree::Node, attr: &str) -> f64 {
    n.attribute(attr).unwrap().parse().unwrap()
}

#[tokio::test]
async fn the_timeline_of_a_run_draws_each_step_where_and_as_long_as_it_ran() {
    let dir = tempfile::tempdir().unwrap();
    let t = timeline_of_a_run(&dir).await;

    // The known durations, as recorded (a sleep takes at least its time).
    let known: HashMap<&str, i64> = [
        ("one/t1/s1@a", 100),
        ("one/t1/s2@a", 100),
        ("one/t1/s1@b", 300),
        ("one/t1/s2@b", 300),
        ("two/t2/s3@a", 300),
        ("two/t2/w@a", 300),
    ]
    .into();
    assert_eq!(t.steps.len(), known.len());
    for b in &t.steps {
        let k = known[b.id.as_str()];
        assert!(
            b.duration_ms() >= k && b.duration_ms() < k + 80,
            "{}: {} ms, known {k}",
            b.id,
            b.duration_ms()
        );
    }
    assert_eq!(
        t.critical_path,
        ["one/t1/s1@b", "one/t1/s2@b", "two/t2/s3@a", "two/t2/w@a"],
        "the critical path is b's phase one, then a's phase two"
    );
    // s3 waited for the slower host (made ready by b's last step), not for a.
    let s3 = t.steps.iter().find(|b| b.id == "two/t2/s3@a").unwrap();
    assert_eq!(s3.after.as_deref(), Some("one/t1/s2@b"));
    assert_eq!(
        t.steps.iter().find(|b| b.id == "two/t2/w@a").unwrap().waits.as_deref(),
        Some("the thing")
    );
    assert_eq!(t.preamble.len(), 1);
    let per: HashMap<&str, i64> = t.critical_per_phase.iter().map(|p| (p.phase.as_str(), p.ms)).collect();
    assert_eq!(per.values().sum::<i64>(), t.total_ms, "the path's phases add up to the job");
    assert!((200..300).contains(&per[PREAMBLE]), "{per:?}");
    assert!((600..700).contains(&per["one"]) && (600..700).contains(&per["two"]), "{per:?}");

    // The SVG: well-formed, one lane per host, every bar within 1 px.
    let svg = render(&t);
    let doc = roxmltree::Document::parse(&svg).expect("the SVG is well-formed XML");
    let g = Geometry::of(&t);
    let lanes: Vec<&str> = doc
        .descendants()
        .filter(|n| n.attribute("class") == Some("lane"))
        .map(|n| n.text().unwrap())
        .collect();
    // Hosts in the order their first step started: a and b start at once,
    // so either may come first on a loaded machine.
    assert_eq!(lanes.first(), Some(&"kubexm (preamble)"));
    assert_eq!(lanes[1..], t.hosts.iter().map(String::as_str).collect::<Vec<_>>());
    let mut hosts = lanes[1..].to_vec();
    hosts.sort_unstable();
    assert_eq!(hosts, ["a", "b"]);
    let bars: Vec<roxmltree::Node> = doc
        .descendants()
        .filter(|n| n.attribute("class").is_some_and(|c| c.starts_with("bar")))
        .collect();
    assert_eq!(bars.len(), t.steps.len());
    let px_per_ms = g.plot_w / t.total_ms as f64;
    for n in &bars {
        let b = t.steps.iter().find(|b| Some(b.id.as_str()) == n.attribute("data-id")).unwrap();
        let lane = 1 + t.hosts.iter().position(|h| *h == b.host).unwrap();
        assert!((num(*n, "x") - g.x(b.start_ms)).abs() <= 1.0, "{}: x", b.id);
        assert!((num(*n, "y") - g.lane_y(lane)).abs() <= 1.0, "{}: lane", b.id);
        let known_px = known[b.id.as_str()] as f64 * px_per_ms;
        assert!(
            num(*n, "width") >= known_px - 1.0,
            "{}: width {} < {known_px}",
            b.id,
            num(*n, "width")
        );
        assert!(
            (num(*n, "width") - b.duration_ms() as f64 * px_per_ms).abs() <= 1.0,
            "{}: width",
            b.id
        );
        assert_eq!(
            n.attribute("class") == Some("bar critical"),
            t.critical_path.contains(&b.id),
            "{}",
            b.id
        );
    }
    assert_eq!(doc.descendants().filter(|n| n.attribute("class") == Some("wait")).count(), 1);

    // The JSON: the same numbers.
    let json = serde_json::to_string(&t).unwrap();
    let back: Timeline = serde_json::from_str(&json).unwrap();
    assert_eq!(back, t);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["steps"].as_array().unwrap().len(), bars.len());
    assert_eq!(v["criticalPath"].as_array().unwrap().len(), 4);
    assert!(t.summary().contains("critical path by phase: preamble"));
}

/// Past the fold, one row per phase; 500 hosts' SVG is small.
#[test]
fn many_hosts_fold_into_phase_rows() {
    use kubexm_engine::state::{JobRecord, StepRecord};
    let hosts = 500;
    let job = JobRecord {
        id: 1,
        cluster: "big".into(),
        kind: "install".into(),
        started: 1_000,
        finished: Some(100_000),
        status: "succeeded".into(),
    };
    let mut steps = Vec::new();
    for h in 0..hosts {
        for (i, phase) in ["one", "two", "three"].iter().enumerate() {
            for s in 0..20 {
                let started = 1_000 + (i as i64 * 20 + s) * 500 + h as i64;
                steps.push(StepRecord {
                    node: format!("{phase}/t/s{s}@h{h}"),
                    module: phase.to_string(),
                    host: format!("h{h}"),
                    status: "applied".into(),
                    ready: started,
                    started,
                    duration_ms: 400,
                    after: None,
                    waits: None,
                    log: String::new(),
                });
            }
        }
    }
    let t = Timeline::of(&job, &[], steps);
    assert!(t.hosts.len() > FOLD_AT);
    let svg = render(&t);
    let doc = roxmltree::Document::parse(&svg).unwrap();
    let lanes: Vec<&str> = doc
        .descendants()
        .filter(|n| n.attribute("class") == Some("lane"))
        .map(|n| n.text().unwrap())
        .collect();
    assert_eq!(lanes, ["one (500 hosts)", "two (500 hosts)", "three (500 hosts)"]);
    assert!(svg.len() < 1_000_000, "{} bytes", svg.len());
}
