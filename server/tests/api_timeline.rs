//! A job's timeline through the API and the `kubexm` command: none until a
//! run stored one (404 saying so), then JSON and an SVG served so that a
//! browser runs nothing in it, with a host name full of markup escaped;
//! `kubexm get job ID --timeline FILE` writes it through the API and from a
//! local job database.

use kubexm_engine::state::{JobRecord, StepRecord};
use kubexm_engine::timeline::Timeline;

mod api_server;
mod common;

use api_server::Server;

/// A timeline whose one host's name is hostile markup.
fn hostile_timeline() -> Timeline {
    let job = JobRecord {
        id: 3,
        cluster: "demo".into(),
        kind: "install".into(),
        started: 1_000,
        finished: Some(9_000),
        status: "succeeded".into(),
    };
    let step = |node: &str, host: &str, started: i64| StepRecord {
        node: format!("{node}@{host}"),
        module: "etcd".into(),
        host: host.into(),
        status: "applied".into(),
        ready: started,
        started,
        duration_ms: 2_000,
        after: None,
        waits: Some("x\"><script>alert(1)</script>".into()),
        log: String::new(),
    };
    let steps = vec![
        step("etcd/a/s", "</text><script>alert(1)</script>", 1_000),
        step("etcd/a/t", "b&c", 3_000),
    ];
    Timeline::of(&job, &[], steps)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stored_timeline_is_served_as_json_and_as_an_svg_that_runs_nothing() {
    let s = Server::start().await;
    let id = s.create_job().await;
    let c = s.client();
    let get = |q: &str| c.get(s.url(&format!("/api/v1/jobs/{id}/timeline{q}"))).bearer_auth(&s.token).send();
    let r = get("").await.unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.text().await.unwrap().contains("has no timeline yet"));

    let t = hostile_timeline();
    s.db.put_timeline(id, &t).await.unwrap();
    let r = get("").await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Timeline>().await.unwrap(), t);

    let r = get("?format=svg").await.unwrap();
    assert_eq!(r.status(), 200);
    let h = r.headers().clone();
    assert_eq!(h["content-type"], "image/svg+xml");
    assert!(h["content-security-policy"].to_str().unwrap().contains("default-src 'none'"));
    assert_eq!(h["x-content-type-options"], "nosniff");
    let svg = r.text().await.unwrap();
    let doc = roxmltree::Document::parse(&svg).expect("well-formed");
    assert!(doc.descendants().all(|n| n.tag_name().name() != "script"), "no script element");
    let lanes: Vec<&str> = doc
        .descendants()
        .filter(|n| n.attribute("class") == Some("lane"))
        .filter_map(|n| n.text())
        .collect();
    assert!(
        lanes.contains(&"</text><script>alert(1)</script>") && lanes.contains(&"b&c"),
        "{lanes:?}"
    );

    assert_eq!(get("?format=xml").await.unwrap().status(), 400);
    let r = c
        .get(s.url("/api/v1/jobs/999/timeline"))
        .bearer_auth(&s.token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = c.get(s.url(&format!("/api/v1/jobs/{id}/timeline"))).send().await.unwrap();
    assert_eq!(r.status(), 401);

    // kubexm get job ID --timeline, through the API and from the local database.
    let d = s.dir.path();
    std::fs::write(d.join("token"), &s.token).unwrap();
    std::fs::write(
        d.join("client.yaml"),
        format!("server: https://127.0.0.1:{}\nca: tls/ca.crt\ntokenFile: token\n", s.addr.port()),
    )
    .unwrap();
    let id = id.to_string();
    let kubexm = |args: &[&str]| assert_cmd::Command::cargo_bin("kubexm").unwrap().args(args).output().unwrap();
    let client = d.join("client.yaml");
    let svg_file = d.join("t.svg");
    let out = kubexm(&[
        "--config",
        client.to_str().unwrap(),
        "get",
        "job",
        &id,
        "--timeline",
        svg_file.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("critical path by phase"));
    roxmltree::Document::parse(&std::fs::read_to_string(&svg_file).unwrap()).unwrap();
    let json_file = d.join("t.json");
    let db = d.join("jobs.db");
    let out = kubexm(&[
        "--db",
        db.to_str().unwrap(),
        "get",
        "job",
        &id,
        "--timeline",
        json_file.to_str().unwrap(),
        "-o",
        "json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let back: Timeline = serde_json::from_str(&std::fs::read_to_string(&json_file).unwrap()).unwrap();
    assert_eq!(back, t);
    let out = kubexm(&[
        "--db",
        db.to_str().unwrap(),
        "get",
        "job",
        "999",
        "--timeline",
        json_file.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    s.handle.shutdown();
}
