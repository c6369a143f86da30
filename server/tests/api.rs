//! The API server on loopback with its real TLS, tokens and job database:
//! authentication, validation answers, the log stream resumed by sequence
//! number, the committed OpenAPI document, a restart, and the `kubexm`
//! command as an API client. No worker runs: jobs are driven through the
//! job database as a worker would.

use std::path::Path;
use std::sync::Arc;

use kubexm_server::api;
use kubexm_server::jobdb::{JobDb, Status};

mod api_server;
mod common;

/// The scopes tokens had before scopes existed.
const RC: &[kubexm_server::jobdb::Scope] = &[kubexm_server::jobdb::Scope::Read, kubexm_server::jobdb::Scope::Create];
use api_server::Server;
use common::EXAMPLE;

#[tokio::test(flavor = "multi_thread")]
async fn a_valid_config_is_stored_as_a_pending_job_and_answers_202() {
    let s = Server::start().await;
    let r = s.post(&EXAMPLE).await;
    assert_eq!(r.status(), 202);
    let v: serde_json::Value = r.json().await.unwrap();
    let id = v["job_id"].as_i64().unwrap();
    let j = s.db.get(id).await.unwrap().unwrap();
    assert_eq!(
        (j.status, j.cluster.as_str(), j.kind.as_str()),
        (Status::Pending, "demo", "install")
    );
    assert_eq!(j.config, *EXAMPLE);
    // Only the bundle is the job's, by digest: the claiming worker's own
    // options and copy of the bundle complete it.
    let (request, local) = kubexm_server::job_request::read(&j.kind, &j.options).unwrap();
    assert_eq!(request.bundle(), Some(s.digest.as_str()));
    assert_eq!(local, None, "an API job names a path of the worker's machine");
    let got: serde_json::Value = s.get_json(s.url(&format!("/api/v1/jobs/{id}"))).await;
    assert_eq!(got["status"], "Pending");
    assert_eq!(got["id"], id);
    let list: serde_json::Value = s.get_json(s.url("/api/v1/jobs")).await;
    assert_eq!(list["jobs"].as_array().unwrap().len(), 1);
    s.handle.shutdown();
}

/// POSTs `body` as cluster.yaml to `path` with the server's token.
fn post_yaml(s: &Server, path: String, body: String) -> impl std::future::Future<Output = reqwest::Result<reqwest::Response>> {
    s.client()
        .post(s.url(&path))
        .bearer_auth(&s.token)
        .header("content-type", "application/yaml")
        .body(body)
        .send()
}

/// Issue 29: `POST /api/v1/clusters/apply` (`kubexm scale`) stores an
/// apply of the held bundle; a bad config or an unknown bundle stores nothing.
#[tokio::test(flavor = "multi_thread")]
async fn an_apply_job_is_stored_with_its_bundle_and_a_bad_one_is_not() {
    let s = Server::start().await;
    let post = |path: String, body: String| post_yaml(&s, path, body);
    let r = post("/api/v1/clusters/apply".into(), EXAMPLE.clone()).await.unwrap();
    assert_eq!(r.status(), 202);
    let v: serde_json::Value = r.json().await.unwrap();
    let j = s.db.get(v["job_id"].as_i64().unwrap()).await.unwrap().unwrap();
    assert_eq!((j.status, j.kind.as_str()), (Status::Pending, "apply"));
    let (request, local) = kubexm_server::job_request::read(&j.kind, &j.options).unwrap();
    assert_eq!(request.bundle(), Some(s.digest.as_str()));
    assert_eq!(local, None);
    let bad = EXAMPLE.replace("roleGroups:", "roleGroupz:");
    assert_eq!(post("/api/v1/clusters/apply".into(), bad).await.unwrap().status(), 422);
    let unknown = format!("/api/v1/clusters/apply?bundle=sha256:{}", "0".repeat(64));
    assert_eq!(post(unknown, EXAMPLE.clone()).await.unwrap().status(), 400);
    assert_eq!(s.db.list().await.unwrap().len(), 1, "a refused apply was stored");
    s.handle.shutdown();
}

/// Issue 30: `POST /api/v1/clusters/upgrade` (`kubexm upgrade cluster`)
/// stores an upgrade of the held bundle with the workers to skip; a host the
/// config lacks, an unknown query field, a bad config or an unknown bundle
/// stores nothing.
#[tokio::test(flavor = "multi_thread")]
async fn an_upgrade_job_is_stored_with_its_bundle_and_hosts_to_skip_and_a_bad_one_is_not() {
    let s = Server::start().await;
    let post = |path: String, body: String| post_yaml(&s, path, body);
    for (q, status) in [
        ("?skipNotReady=ghost".to_string(), 400),
        ("?hopBundles=%2Ftmp%2Fx".to_string(), 400),
        (format!("?bundle=sha256:{}", "0".repeat(64)), 400),
        ("?drainTimeout=0".to_string(), 400),
    ] {
        let r = post(format!("/api/v1/clusters/upgrade{q}"), EXAMPLE.clone()).await.unwrap();
        assert_eq!(r.status(), status, "{q}");
    }
    let bad = EXAMPLE.replace("roleGroups:", "roleGroupz:");
    assert_eq!(post("/api/v1/clusters/upgrade".into(), bad).await.unwrap().status(), 422);
    assert!(s.db.list().await.unwrap().is_empty(), "a refused upgrade was stored");
    let r = post(
        "/api/v1/clusters/upgrade?skipNotReady=worker1&drainTimeout=120".into(),
        EXAMPLE.clone(),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 202);
    let v: serde_json::Value = r.json().await.unwrap();
    let j = s.db.get(v["job_id"].as_i64().unwrap()).await.unwrap().unwrap();
    assert_eq!((j.status, j.kind.as_str()), (Status::Pending, "upgrade"));
    assert_eq!(
        j.options,
        serde_json::json!({"bundle": s.digest, "skipNotReady": ["worker1"], "drainTimeout": 120})
    );
    s.handle.shutdown();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_config_answers_422_with_the_errors_and_positions_of_validate_and_stores_nothing() {
    let s = Server::start().await;
    let bad = EXAMPLE
        .replace("name: demo ", "name: Demo_1 ")
        .replace("port: 22", "port: 99999")
        .replace("roleGroups:", "roleGroupz:");
    let r = s.post(&bad).await;
    assert_eq!(r.status(), 422);
    let v: serde_json::Value = r.json().await.unwrap();
    // The same diagnostics, in the same order and at the same positions, as
    // `kubexm-bundle validate` (the same loader, the bundle's catalog).
    let expected = kubexm_bom::config::load_str(&bad, "cluster.yaml", &kubexm_bom::catalog::Catalog::builtin().unwrap()).unwrap_err();
    let kubexm_bom::config::LoadError::Invalid(d) = expected else {
        panic!("{expected}")
    };
    assert!(d.diagnostics.len() >= 3, "{d}");
    assert_eq!(v["errors"], serde_json::to_value(&d.diagnostics).unwrap());
    assert_eq!(v["error"], d.to_string());
    for e in v["errors"].as_array().unwrap() {
        assert!(e["line"].as_u64().unwrap() > 0 && e["column"].as_u64().unwrap() > 0, "{e}");
    }
    assert!(s.db.list().await.unwrap().is_empty(), "a job was stored");
    // Not YAML at all, and an unknown bundle: refused, nothing stored.
    assert_eq!(s.post("{ nope: [").await.status(), 422);
    let r = s
        .client()
        .post(s.url(&format!("/api/v1/clusters?bundle=sha256:{}", "0".repeat(64))))
        .bearer_auth(&s.token)
        .header("content-type", "application/yaml")
        .body(EXAMPLE.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // Issue 24, item 10: a body of another media type is refused with 415.
    for t in [None, Some("text/plain"), Some("application/x-www-form-urlencoded")] {
        let mut req = s
            .client()
            .post(s.url("/api/v1/clusters"))
            .bearer_auth(&s.token)
            .body(EXAMPLE.clone());
        if let Some(t) = t {
            req = req.header("content-type", t);
        }
        assert_eq!(req.send().await.unwrap().status(), 415, "{t:?}");
    }
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(v["error"].as_str().unwrap().contains("kubexm bundle add"), "{v}");
    assert!(s.db.list().await.unwrap().is_empty(), "a job was stored");
    s.handle.shutdown();
}

#[tokio::test(flavor = "multi_thread")]
async fn facts_and_confirmed_reset_jobs_are_stored_and_an_unconfirmed_reset_or_a_bad_config_is_not() {
    let s = Server::start().await;
    let post = |path: &str, body: String| {
        s.client()
            .post(s.url(path))
            .bearer_auth(&s.token)
            .header("content-type", "application/yaml")
            .body(body)
            .send()
    };
    // Refused, nothing stored: a reset not confirmed, a config with bad hosts.
    let r = post("/api/v1/clusters/reset", EXAMPLE.to_string()).await.unwrap();
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(v["error"].as_str().unwrap().contains("?confirm=true"), "{v}");
    let bad = EXAMPLE.replace("port: 22", "port: 99999");
    let r = post("/api/v1/clusters/etcd-snapshot?keep=0", EXAMPLE.to_string()).await.unwrap();
    assert_eq!(r.status(), 400);
    // A removal names hosts of the config, at least one; its drain takes time.
    for (q, says) in [
        ("hosts=", "no host to remove"),
        ("hosts=worker1&drainTimeout=0", "drainTimeout"),
        ("hosts=worker1,nobody", "nobody is not a host of cluster demo"),
        ("hosts=worker1&unreachable=x%27%3Brm", "is not a host of cluster demo"),
    ] {
        let r = post(&format!("/api/v1/clusters/remove-node?{q}"), EXAMPLE.to_string())
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{q}");
        let v: serde_json::Value = r.json().await.unwrap();
        assert!(v["error"].as_str().unwrap().contains(says), "{q}: {v}");
    }
    for (q, says) in [("", "?confirm=true"), ("confirm=true&unreachable=cp1,ghost", "ghost is not a host")] {
        let r = post(&format!("/api/v1/clusters/delete?{q}"), EXAMPLE.to_string()).await.unwrap();
        assert_eq!(r.status(), 400, "{q}");
        let v: serde_json::Value = r.json().await.unwrap();
        assert!(v["error"].as_str().unwrap().contains(says), "{q}: {v}");
    }
    for path in [
        "/api/v1/clusters/facts",
        "/api/v1/clusters/reset?confirm=true",
        "/api/v1/clusters/etcd-snapshot",
        "/api/v1/clusters/remove-node?hosts=worker1",
        "/api/v1/clusters/delete?confirm=true",
        "/api/v1/clusters/certs-check",
    ] {
        let r = post(path, bad.clone()).await.unwrap();
        assert_eq!(r.status(), 422, "{path}");
        let v: serde_json::Value = r.json().await.unwrap();
        let e = &v["errors"][0];
        assert!(
            e["line"].as_u64().unwrap() > 0 && e["path"].as_str().unwrap().contains("port"),
            "{v}"
        );
    }
    assert!(s.db.list().await.unwrap().is_empty(), "a job was stored");
    // Stored: the kinds, the reset with the server's root.
    for (path, kind) in [
        ("/api/v1/clusters/facts", "facts"),
        ("/api/v1/clusters/reset?confirm=true", "reset"),
        ("/api/v1/clusters/etcd-snapshot?keep=3", "etcd-snapshot"),
        (
            "/api/v1/clusters/remove-node?hosts=worker1,lb2&unreachable=lb2&drainTimeout=30&forceDrain=true",
            "remove-node",
        ),
        ("/api/v1/clusters/delete?confirm=true&purge=true&unreachable=cp3", "delete-cluster"),
        ("/api/v1/clusters/certs-check?warnDays=400", "certs-check"),
    ] {
        let r = post(path, EXAMPLE.to_string()).await.unwrap();
        assert_eq!(r.status(), 202, "{path}");
        let id = r.json::<serde_json::Value>().await.unwrap()["job_id"].as_i64().unwrap();
        let j = s.db.get(id).await.unwrap().unwrap();
        assert_eq!((j.kind.as_str(), j.cluster.as_str()), (kind, "demo"));
        if kind == "reset" {
            // The claiming worker's --root.
            assert_eq!(j.options["root"], serde_json::Value::Null);
        }
        if kind == "etcd-snapshot" {
            assert_eq!(j.options["keep"], 3, "{}", j.options);
        }
        if kind == "certs-check" {
            assert_eq!(j.options, serde_json::json!({"warnDays": 400}));
        }
        if kind == "delete-cluster" {
            assert_eq!(j.options, serde_json::json!({"unreachable": ["cp3"], "purge": true}));
        }
        if kind == "remove-node" {
            assert_eq!(
                j.options,
                serde_json::json!({"hosts": ["worker1", "lb2"], "unreachable": ["lb2"], "drainTimeout": 30, "forceDrain": true})
            );
        }
    }
    s.handle.shutdown();
}

/// Issue 29: a renewal and a restore are stored with their options (a
/// restore names a snapshot by its file name, confirmed); refused and not
/// stored: a restore unconfirmed or naming a path or shell text, a host
/// named unreachable that the config lacks, a bad config.
#[tokio::test(flavor = "multi_thread")]
async fn certs_renew_and_etcd_restore_jobs_are_stored_and_refused_as_asked() {
    let s = Server::start().await;
    let post = |path: &str, body: String| {
        s.client()
            .post(s.url(&format!("/api/v1/clusters/{path}")))
            .bearer_auth(&s.token)
            .header("content-type", "application/yaml")
            .body(body)
            .send()
    };
    for (q, says) in [
        ("etcd-restore?snapshot=demo-1.db", "?confirm=true"),
        ("etcd-restore?confirm=true&snapshot=..%2Fx.db", "not a snapshot's file name"),
        ("etcd-restore?confirm=true&snapshot=a%3Bb.db", "not a snapshot's file name"),
        ("certs-renew?unreachable=ghost", "ghost is not a host"),
    ] {
        let r = post(q, EXAMPLE.to_string()).await.unwrap();
        assert_eq!(r.status(), 400, "{q}");
        let v: serde_json::Value = r.json().await.unwrap();
        assert!(v["error"].as_str().unwrap().contains(says), "{q}: {v}");
    }
    let bad = EXAMPLE.replace("port: 22", "port: 99999");
    for q in ["certs-renew", "etcd-restore?confirm=true&snapshot=demo-1.db"] {
        let r = post(q, bad.clone()).await.unwrap();
        assert_eq!(r.status(), 422, "{q}");
    }
    assert!(s.db.list().await.unwrap().is_empty(), "a job was stored");
    for (q, kind, options) in [
        (
            "certs-renew?withinDays=60&all=true&unreachable=cp3",
            "certs-renew",
            serde_json::json!({"unreachable": ["cp3"], "withinDays": 60, "all": true}),
        ),
        (
            "etcd-restore?confirm=true&snapshot=demo-20261127T001200.000Z.db",
            "etcd-restore",
            serde_json::json!({"snapshot": "demo-20261127T001200.000Z.db"}),
        ),
    ] {
        let r = post(q, EXAMPLE.to_string()).await.unwrap();
        assert_eq!(r.status(), 202, "{q}");
        let id = r.json::<serde_json::Value>().await.unwrap()["job_id"].as_i64().unwrap();
        let j = s.db.get(id).await.unwrap().unwrap();
        assert_eq!((j.kind.as_str(), &j.options), (kind, &options));
    }
    s.handle.shutdown();
}

#[tokio::test(flavor = "multi_thread")]
async fn without_credentials_or_with_an_unknown_token_every_job_route_answers_401() {
    let s = Server::start().await;
    let c = s.client();
    for (m, p) in [
        (reqwest::Method::GET, "/api/v1/jobs"),
        (reqwest::Method::GET, "/api/v1/jobs/1"),
        (reqwest::Method::GET, "/api/v1/jobs/1/logs"),
        (reqwest::Method::POST, "/api/v1/jobs/1/cancel"),
        (reqwest::Method::POST, "/api/v1/clusters"),
        (reqwest::Method::POST, "/api/v1/clusters/apply"),
        (reqwest::Method::POST, "/api/v1/clusters/upgrade"),
        (reqwest::Method::POST, "/api/v1/clusters/facts"),
        (reqwest::Method::POST, "/api/v1/clusters/reset"),
        (reqwest::Method::POST, "/api/v1/clusters/etcd-snapshot"),
        (reqwest::Method::POST, "/api/v1/clusters/remove-node"),
        (reqwest::Method::POST, "/api/v1/clusters/delete"),
        (reqwest::Method::POST, "/api/v1/clusters/certs-check"),
    ] {
        let r = c.request(m.clone(), s.url(p)).send().await.unwrap();
        assert_eq!(r.status(), 401, "{m} {p}");
        assert_eq!(r.headers()["www-authenticate"], "Bearer");
        let r = c.request(m.clone(), s.url(p)).bearer_auth("kxm_not-a-token").send().await.unwrap();
        assert_eq!(r.status(), 401, "{m} {p}");
    }
    // The token is stored only as its sha256.
    let conn = rusqlite::Connection::open(s.dir.path().join("jobs.db")).unwrap();
    let stored: String = conn.query_row("SELECT sha256 FROM tokens", [], |r| r.get(0)).unwrap();
    assert_eq!(stored, kubexm_bundle::digest::sha256_hex(s.token.as_bytes()));
    assert!(!stored.contains(&s.token));
    assert_eq!(c.get(s.url("/healthz")).send().await.unwrap().status(), 200);
    s.handle.shutdown();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_certificate_from_the_servers_ca_authenticates_and_one_from_another_ca_is_refused() {
    let s = Server::start().await;
    // Issue 24, item 10: no name escapes --out, and the server's own CA and
    // certificate are never overwritten.
    let tls = s.dir.path().join("tls");
    for (name, out) in [
        ("../evil", s.dir.path().join("client")),
        ("ca", s.dir.path().join("client")),
        ("ci", tls.clone()),
    ] {
        assert!(
            api::tls::client_cert(&tls, name, &out, RC, 365).is_err(),
            "{name} in {}",
            out.display()
        );
    }
    let (crt, key) = api::tls::client_cert(&s.dir.path().join("tls"), "ci", &s.dir.path().join("client"), RC, 365).unwrap();
    let identity = |crt: &Path, key: &Path| {
        let mut pem = std::fs::read(crt).unwrap();
        pem.extend(std::fs::read(key).unwrap());
        reqwest::Identity::from_pem(&pem).unwrap()
    };
    let ours = reqwest::Client::builder()
        .tls_certs_only([s.ca()])
        .identity(identity(&crt, &key))
        .build()
        .unwrap();
    assert_eq!(ours.get(s.url("/api/v1/jobs")).send().await.unwrap().status(), 200);
    // A certificate signed by another CA: the handshake fails.
    let other = tempfile::tempdir().unwrap();
    let (crt, key) = api::tls::client_cert(&other.path().join("tls"), "intruder", other.path(), RC, 365).unwrap();
    let theirs = reqwest::Client::builder()
        .tls_certs_only([s.ca()])
        .identity(identity(&crt, &key))
        .build()
        .unwrap();
    let r = theirs.get(s.url("/api/v1/jobs")).send().await;
    assert!(r.is_err() || r.as_ref().is_ok_and(|r| r.status() == 401), "{r:?}");
    s.handle.shutdown();
}

/// Reads server-sent events from `r` until `stop_after` lines (then drops
/// the connection, as a killed client) or the end event.
async fn events(r: reqwest::Response, stop_after: Option<usize>) -> (Vec<(i64, String)>, Option<String>) {
    use futures_util::StreamExt;
    let mut body = r.bytes_stream();
    let (mut buf, mut lines, mut end) = (Vec::new(), Vec::new(), None);
    'read: while let Some(chunk) = body.next().await {
        buf.extend_from_slice(&chunk.unwrap());
        while let Some(at) = buf.windows(2).position(|w| w == b"\n\n") {
            let ev: Vec<u8> = buf.drain(..at + 2).collect();
            let ev = String::from_utf8(ev).unwrap();
            let field = |k: &str| ev.lines().find_map(|l| l.strip_prefix(k).map(|v| v.trim_start().to_string()));
            match (field("event:"), field("id:"), field("data:")) {
                (Some(e), _, d) if e == "end" => {
                    end = d;
                    break 'read;
                }
                (None, Some(id), Some(d)) => lines.push((id.parse().unwrap(), d)),
                _ => {}
            }
            if stop_after.is_some_and(|n| lines.len() >= n) {
                break 'read;
            }
        }
    }
    (lines, end)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_log_stream_broken_off_and_resumed_from_its_last_sequence_number_misses_and_repeats_nothing() {
    let s = Server::start().await;
    let id = s.create_job().await;
    let claim = s.db.claim("w", "m", 60_000, None).await.unwrap().unwrap();
    // A worker writing 300 lines in batches while clients read.
    let writer = {
        let db = s.db.clone();
        tokio::spawn(async move {
            for b in 0..30 {
                let lines: Vec<String> = (0..10).map(|i| format!("line {} of batch {b}", b * 10 + i + 1)).collect();
                db.append(claim, &lines, Some(&format!("step {b}"))).await.unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            db.finish(claim, Status::Success, None).await.unwrap();
        })
    };
    let c = s.client();
    let logs = |from: i64| {
        c.get(s.url(&format!("/api/v1/jobs/{id}/logs?follow=true&from={from}")))
            .bearer_auth(&s.token)
            .send()
    };
    let mut got = Vec::new();
    let mut from = 0;
    // Killed three times mid-stream, reconnecting each time after the last line it had.
    for n in [7, 55, 101] {
        let (lines, end) = events(logs(from).await.unwrap(), Some(n)).await;
        assert!(end.is_none());
        from = lines.last().unwrap().0;
        got.extend(lines);
    }
    let (lines, end) = events(logs(from).await.unwrap(), None).await;
    got.extend(lines);
    writer.await.unwrap();
    let end: serde_json::Value = serde_json::from_str(&end.expect("no end event")).unwrap();
    assert_eq!(end["status"], "Success");
    let stored: Vec<(i64, String)> = s.db.logs(id, 0).await.unwrap().into_iter().map(|l| (l.seq, l.line)).collect();
    assert_eq!(stored.len(), 300);
    assert_eq!(got, stored, "missed or repeated lines");
    // The Last-Event-ID header resumes as `from` does; without follow the
    // stream ends after the lines written.
    let r = c
        .get(s.url(&format!("/api/v1/jobs/{id}/logs")))
        .header("last-event-id", "290")
        .bearer_auth(&s.token)
        .send()
        .await
        .unwrap();
    let (lines, _) = events(r, None).await;
    assert_eq!(lines, stored[290..].to_vec());
    s.handle.shutdown();
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_ends_a_waiting_job_and_unknown_jobs_answer_404() {
    let s = Server::start().await;
    let id = s.create_job().await;
    let c = s.client();
    let r = c
        .post(s.url(&format!("/api/v1/jobs/{id}/cancel")))
        .bearer_auth(&s.token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<serde_json::Value>().await.unwrap()["status"], "Cancelled");
    for p in ["/api/v1/jobs/999", "/api/v1/jobs/999/logs"] {
        assert_eq!(c.get(s.url(p)).bearer_auth(&s.token).send().await.unwrap().status(), 404, "{p}");
    }
    let r = c.post(s.url("/api/v1/jobs/999/cancel")).bearer_auth(&s.token).send().await.unwrap();
    assert_eq!(r.status(), 404);
    s.handle.shutdown();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_served_openapi_document_is_the_committed_one() {
    let s = Server::start().await;
    let served = s
        .client()
        .get(s.url("/api/v1/openapi.json"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let committed = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/api/openapi.json")).unwrap();
    assert_eq!(served, committed);
    s.handle.shutdown();
}

#[tokio::test(flavor = "multi_thread")]
async fn restarting_the_api_server_loses_no_job_and_no_log_line() {
    let s = Server::start().await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            s.post(&EXAMPLE).await.json::<serde_json::Value>().await.unwrap()["job_id"]
                .as_i64()
                .unwrap(),
        );
    }
    let claim = s.db.claim("w", "m", 60_000, None).await.unwrap().unwrap();
    let lines: Vec<String> = (1..=50).map(|i| format!("line {i}")).collect();
    s.db.append(claim, &lines, Some("etcd")).await.unwrap();
    s.handle.shutdown();
    // A new server process over the same database file.
    let db = Arc::new(JobDb::open(&s.dir.path().join("jobs.db")).await.unwrap());
    let (handle, addr) = Server::serve(&db, s.dir.path()).await;
    let url = |p: &str| format!("https://127.0.0.1:{}{p}", addr.port());
    let list = s.get_json(url("/api/v1/jobs")).await;
    let mut listed: Vec<i64> = list["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_i64().unwrap()).collect();
    listed.sort();
    assert_eq!(listed, ids);
    let r = s
        .client()
        .get(url(&format!("/api/v1/jobs/{}/logs", claim.job)))
        .bearer_auth(&s.token)
        .send()
        .await
        .unwrap();
    let (got, _) = events(r, None).await;
    assert_eq!(got.into_iter().map(|(_, l)| l).collect::<Vec<_>>(), lines);
    handle.shutdown();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_kubexm_command_reads_jobs_and_cancels_through_the_api_with_a_client_config() {
    let s = Server::start().await;
    let id = s.create_job().await;
    let d = s.dir.path();
    std::fs::write(d.join("token"), &s.token).unwrap();
    std::fs::write(
        d.join("client.yaml"),
        format!("server: https://127.0.0.1:{}\nca: tls/ca.crt\ntokenFile: token\n", s.addr.port()),
    )
    .unwrap();
    let kubexm = |args: &[&str]| {
        let out = assert_cmd::Command::cargo_bin("kubexm")
            .unwrap()
            .args(["--config", d.join("client.yaml").to_str().unwrap(), "--db", "/nonexistent/jobs.db"])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, out, err) = tokio::task::block_in_place(|| kubexm(&["get", "jobs"]));
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("demo") && out.contains("Pending"), "{out}");
    let (code, out, err) = tokio::task::block_in_place(|| kubexm(&["get", "job", &id.to_string(), "-o", "json"]));
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["job"]["id"], id);
    // A bad config: refused with its positions, exit 3, nothing stored.
    std::fs::write(d.join("bad.yaml"), EXAMPLE.replace("port: 22", "port: 99999")).unwrap();
    let bad = d.join("bad.yaml").to_str().unwrap().to_string();
    let create = |bundle: &str| {
        let args = ["create", "cluster", "-f", &bad, "--bundle", bundle, "--detach"];
        tokio::task::block_in_place(|| kubexm(&args))
    };
    let (code, _, err) = create(&s.digest);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("cluster.yaml:") && err.contains("port"), "{err}");
    let (code, out, err) = create("k.tar.zst");
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(err.contains("by digest"), "{err}");
    let (code, out, err) = tokio::task::block_in_place(|| kubexm(&["cancel", "job", &id.to_string()]));
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("Cancelled"), "{out}");
    assert_eq!(s.db.list().await.unwrap().len(), 1);
    // Facts and reset jobs through the API; a reset without --yes stores nothing.
    std::fs::write(d.join("good.yaml"), &*EXAMPLE).unwrap();
    let good = d.join("good.yaml").to_str().unwrap().to_string();
    let (code, _, err) = tokio::task::block_in_place(|| kubexm(&["reset", "cluster", "-f", &good, "--detach"]));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--yes"), "{err}");
    for (args, id) in [
        (vec!["create", "facts", "-f", &good, "--detach"], 2),
        (vec!["reset", "cluster", "-f", &good, "--yes", "--detach"], 3),
    ] {
        let (code, out, err) = tokio::task::block_in_place(|| kubexm(&args));
        assert_eq!(code, Some(0), "{args:?}: {err}");
        assert_eq!(
            out.trim(),
            format!("Job created with ID {id}. Run 'kubexm get job {id}' to check status.")
        );
    }
    let kinds: Vec<String> = s.db.list().await.unwrap().into_iter().map(|j| j.kind).collect();
    assert_eq!(kinds, ["reset", "facts", "install"]);
    // Without credentials the command says so.
    std::fs::write(d.join("token"), "kxm_wrong").unwrap();
    let (code, _, err) = tokio::task::block_in_place(|| kubexm(&["get", "jobs"]));
    assert_ne!(code, Some(0));
    assert!(err.contains("401"), "{err}");
    s.handle.shutdown();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_api_install_job_fails_on_a_worker_without_its_install_options_saying_what_to_pass() {
    let s = Server::start().await;
    let d = s.dir.path();
    let run_one = |install: kubexm_server::worker::WorkerInstall| {
        let r = s.post(&EXAMPLE);
        let db = s.db.clone();
        let (state, jobs) = (d.join("state.db"), d.join("jobs"));
        async move {
            let id = r.await.json::<serde_json::Value>().await.unwrap()["job_id"].as_i64().unwrap();
            let mut o = kubexm_server::worker::WorkerOptions::here(state, jobs);
            o.install = install;
            let quit = Arc::new(std::sync::atomic::AtomicBool::new(false));
            assert_eq!(kubexm_server::worker::serve(&db, &o, quit, true).await.unwrap(), 1);
            db.get(id).await.unwrap().unwrap()
        }
    };
    // No --advertise on this worker.
    let j = run_one(kubexm_server::worker::WorkerInstall::default()).await;
    assert_eq!(j.status, Status::Failed);
    assert!(j.error.as_deref().unwrap().contains("--advertise ADDR --pubkey FILE"), "{j:?}");
    // The bundle not held on this worker's machine.
    let elsewhere = kubexm_server::worker::WorkerInstall {
        advertise: Some("127.0.0.1".parse().unwrap()),
        bundles: d.join("other-bundles"),
        ..Default::default()
    };
    let j = run_one(elsewhere).await;
    assert_eq!(j.status, Status::Failed);
    let e = j.error.unwrap();
    assert!(e.contains(&s.digest[7..]) && e.contains("kubexm bundle add"), "{e}");
    s.handle.shutdown();
}

/// Issue 24, item 7: a body of empty hosts answers at most 100 errors and
/// how many more, never megabytes of them; past 5,000 hosts one error says so.
#[tokio::test(flavor = "multi_thread")]
async fn a_body_of_empty_hosts_answers_at_most_100_errors_and_counts_the_rest() {
    let s = Server::start().await;
    for (hosts, listed) in [(4_000usize, 100usize), (93_000, 1)] {
        let body = EXAMPLE.replacen("  hosts:\n", &format!("  hosts:\n{}", "    - {}\n".repeat(hosts)), 1);
        let r = s.post(&body).await;
        assert_eq!(r.status(), 422);
        let text = r.text().await.unwrap();
        assert!(text.len() < 64 * 1024, "{hosts} hosts: a {} byte answer", text.len());
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["errors"].as_array().unwrap().len(), listed, "{hosts} hosts");
        if listed == 100 {
            assert!(v["more"].as_u64().unwrap() > 4_000, "{v:?}");
            assert!(v["error"].as_str().unwrap().contains("more (fix these first)"));
        } else {
            assert!(v["error"].as_str().unwrap().contains("at most 5000 hosts"), "{}", v["error"]);
        }
    }
    assert!(s.db.list().await.unwrap().is_empty(), "a job was stored");
    s.handle.shutdown();
}
