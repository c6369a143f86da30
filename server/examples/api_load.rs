//! Load generator for `ci/bench/api` (not a test): `CLIENTS` concurrent
//! clients each send `REQUESTS` requests of one kind to a running API server
//! over TLS and report the latency percentiles and the rate.
//!
//! `api_load URL CA TOKEN KIND CLIENTS REQUESTS [BODY_FILE]`, KIND one of
//! `health` (GET /healthz: the baseline), `get` (GET /api/v1/jobs/1),
//! `post` (POST /api/v1/clusters with BODY_FILE).
//! `api_load pg-claims URL JOBS WORKERS`: JOBS jobs over 10 clusters in the
//! PostgreSQL job database at URL, claimed and finished by WORKERS worker
//! threads (each its own connection pool, as separate processes); prints
//! the claims per second.
//! `api_load make-bundle DIR`: a small signed bundle carrying the built-in
//! catalog, held in `DIR/bundles` (the tests' fixture); prints its digest.

use std::time::{Duration, Instant};

#[path = "../tests/common/mod.rs"]
mod common;

fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() == 5 && a[1] == "pg-claims" {
        return tokio::runtime::Runtime::new()?.block_on(pg_claims(&a[2], a[3].parse()?, a[4].parse()?));
    }
    if a.len() == 3 && a[1] == "make-bundle" {
        let (digest, _) = common::held_bundle(std::path::Path::new(&a[2]));
        println!("{digest}");
        return Ok(());
    }
    tokio::runtime::Runtime::new()?.block_on(load(a))
}

async fn load(a: Vec<String>) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.len() >= 7,
        "usage: api_load URL CA TOKEN health|get|post CLIENTS REQUESTS [BODY_FILE]"
    );
    let (base, kind) = (a[1].clone(), a[4].clone());
    let ca = reqwest::Certificate::from_pem(&fs_err::read(&a[2])?)?;
    let token = a[3].clone();
    let (clients, requests): (usize, usize) = (a[5].parse()?, a[6].parse()?);
    let body = match a.get(7) {
        Some(f) => fs_err::read_to_string(f)?,
        None => String::new(),
    };
    let mut tasks = Vec::new();
    let started = Instant::now();
    for _ in 0..clients {
        // One connection per client, as 50 separate automation clients.
        let http = reqwest::Client::builder().tls_certs_only([ca.clone()]).build()?;
        let (base, kind, token, body) = (base.clone(), kind.clone(), token.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            let mut took = Vec::with_capacity(requests);
            for _ in 0..requests {
                let r = match kind.as_str() {
                    "health" => http.get(format!("{base}/healthz")),
                    "get" => http.get(format!("{base}/api/v1/jobs/1")).bearer_auth(&token),
                    _ => http
                        .post(format!("{base}/api/v1/clusters"))
                        .bearer_auth(&token)
                        .header("content-type", "application/yaml")
                        .body(body.clone()),
                };
                let t = Instant::now();
                let resp = r.send().await?;
                let status = resp.status();
                resp.bytes().await?;
                took.push(t.elapsed());
                anyhow::ensure!(status.is_success(), "{kind}: answered {status}");
            }
            Ok::<_, anyhow::Error>(took)
        }));
    }
    let mut all: Vec<Duration> = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let wall = started.elapsed();
    all.sort();
    let pct = |p: f64| all[((all.len() as f64 * p).ceil() as usize).clamp(1, all.len()) - 1].as_secs_f64() * 1000.0;
    println!(
        "{kind}: {} requests, {clients} clients: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, {:.0} requests/s",
        all.len(),
        pct(0.50),
        pct(0.99),
        pct(1.0),
        all.len() as f64 / wall.as_secs_f64()
    );
    Ok(())
}

async fn pg_claims(url: &str, jobs: usize, workers: usize) -> anyhow::Result<()> {
    use kubexm_server::jobdb::{JobDb, NewJob, Status};
    let db = JobDb::open(std::path::Path::new(url)).await?;
    for i in 0..jobs {
        db.create(&NewJob {
            cluster: format!("c{}", i % 10),
            kind: "facts".into(),
            config: String::new(),
            config_name: "cluster.yaml".into(),
            options: serde_json::json!({}),
            origin: kubexm_server::jobdb::Origin::Request,
            principal: None,
        })
        .await?;
    }
    let started = Instant::now();
    let threads: Vec<_> = (0..workers)
        .map(|w| {
            let url = url.to_string();
            tokio::spawn(async move {
                let db = JobDb::open(std::path::Path::new(&url)).await?;
                let (mut n, mut idle) = (0, 0);
                while idle < 3 {
                    match db.claim(&format!("w{w}"), "m", 30_000, None).await? {
                        Some(c) => {
                            idle = 0;
                            db.finish(c, Status::Success, None).await?;
                            n += 1;
                        }
                        None => idle += 1,
                    }
                }
                Ok::<_, anyhow::Error>(n)
            })
        })
        .collect();
    let mut claimed = 0;
    for t in threads {
        claimed += t.await.map_err(|_| anyhow::anyhow!("a worker task panicked"))??;
    }
    let took = started.elapsed().as_secs_f64();
    anyhow::ensure!(claimed == jobs, "{claimed} of {jobs} jobs claimed");
    println!(
        "pg-claims: {claimed} jobs, {workers} workers: {:.0} claims/s ({took:.2} s)",
        claimed as f64 / took
    );
    Ok(())
}
