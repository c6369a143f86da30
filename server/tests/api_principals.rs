//! The API server's principals on loopback: token scopes, expiry and
//! revocation with every mutation audited, cluster names bound to their
//! first principal and hosts, a bad row listed with its error, and the
//! per-principal rate of posts.

use std::sync::Arc;

use kubexm_server::jobdb::JobDb;

mod api_server;
mod common;

use api_server::Server;
use common::{EXAMPLE, held_bundle};
use kubexm_server::api;

/// Issue 24, item 9: scopes (a read-only token creates nothing, a create
/// token cannot reset), expiry, revocation from the very next request, the
/// principal recorded on each job, client certificates' scopes and
/// revocation, and the audit log of mutating requests and refusals.
#[tokio::test(flavor = "multi_thread")]
async fn tokens_have_scopes_expiry_and_revocation_and_every_mutation_is_audited() {
    use kubexm_server::jobdb::Scope;
    let s = Server::start().await;
    let reader = s.db.create_token_scoped("reader", &[Scope::Read], None).await.unwrap();
    let expired = s.db.create_token_scoped("old", &[Scope::Admin], Some(1)).await.unwrap();
    let post = |token: String, path: &'static str| {
        let req = s
            .client()
            .post(s.url(path))
            .bearer_auth(token)
            .header("content-type", "application/yaml")
            .body(EXAMPLE.clone());
        async move { req.send().await.unwrap().status() }
    };
    let get = |token: String| {
        let req = s.client().get(s.url("/api/v1/jobs")).bearer_auth(token);
        async move { req.send().await.unwrap().status() }
    };
    assert_eq!(get(reader.clone()).await, 200);
    assert_eq!(post(reader.clone(), "/api/v1/clusters").await, 403);
    // A token made without --scopes (or before scopes existed): read,create.
    let rc = s.db.create_token("rc").await.unwrap();
    assert_eq!(
        post(rc.clone(), "/api/v1/clusters/reset?confirm=true").await,
        403,
        "read,create may not reset"
    );
    // Issue 29: a removal resets the hosts it takes out.
    assert_eq!(
        post(rc.clone(), "/api/v1/clusters/remove-node?hosts=worker1").await,
        403,
        "read,create may not remove a node"
    );
    assert_eq!(
        post(rc, "/api/v1/clusters/delete?confirm=true").await,
        403,
        "read,create may not delete a cluster"
    );
    assert_eq!(get(expired).await, 401);
    // The default token (read,create) creates; the job names who asked.
    let r = s.post(&EXAMPLE).await;
    assert_eq!(r.status(), 202);
    let id = r.json::<serde_json::Value>().await.unwrap()["job_id"].as_i64().unwrap();
    let j: serde_json::Value = s.get_json(s.url(&format!("/api/v1/jobs/{id}"))).await;
    assert!(j["principal"].as_str().unwrap().starts_with("token:test#"), "{j}");
    // Revoked: refused on the very next request.
    assert_eq!(s.db.revoke_token("reader").await.unwrap(), 1);
    assert_eq!(get(reader).await, 401);
    let rows = s.db.tokens().await.unwrap();
    let rc = rows.iter().find(|t| t.name == "rc").unwrap();
    assert_eq!(Scope::join(&rc.scopes), "read,create");
    assert!(rows.iter().find(|t| t.name == "reader").unwrap().revoked.is_some());

    // A certificate's scopes are in its subject; a revoked one is refused.
    let (crt, key) = api::tls::client_cert(&s.dir.path().join("tls"), "ro", &s.dir.path().join("client"), &[Scope::Read], 365).unwrap();
    let mut pem = std::fs::read(&crt).unwrap();
    pem.extend(std::fs::read(&key).unwrap());
    let c = reqwest::Client::builder()
        .tls_certs_only([s.ca()])
        .identity(reqwest::Identity::from_pem(&pem).unwrap())
        .build()
        .unwrap();
    assert_eq!(c.get(s.url("/api/v1/jobs")).send().await.unwrap().status(), 200);
    let r = c
        .post(s.url("/api/v1/clusters"))
        .header("content-type", "application/yaml")
        .body(EXAMPLE.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let id = api::tls::CertIdentity::of_pem_file(&crt).unwrap();
    assert_eq!((id.name.as_str(), id.scopes.as_slice()), ("ro", &[Scope::Read][..]));
    s.db.revoke_cert(&id.fingerprint, &id.name).await.unwrap();
    let c = reqwest::Client::builder()
        .tls_certs_only([s.ca()])
        .identity(reqwest::Identity::from_pem(&pem).unwrap())
        .build()
        .unwrap();
    assert_eq!(c.get(s.url("/api/v1/jobs")).send().await.unwrap().status(), 401);

    // The audit log: each mutation and each refusal, with its principal.
    let log = s.db.audit_log().await.unwrap();
    let seen = |p: &str, status: i64| log.iter().any(|a| a.principal.starts_with(p) && a.status == status);
    assert!(
        seen("token:reader#", 403) && seen("-", 401) && seen("token:test#", 202) && seen("cert:ro", 403),
        "{log:?}"
    );
    assert!(log.iter().any(|a| a.status == 202 && a.job == Some(id_of(&log))), "{log:?}");
    s.handle.shutdown();
}

fn id_of(log: &[kubexm_server::jobdb::AuditRow]) -> i64 {
    log.iter().find(|a| a.status == 202).and_then(|a| a.job).unwrap()
}

/// Issue 24, item 2: a cluster name is bound to the principal that first
/// named it and to its hosts: another token, or other hosts, get 409 and
/// nothing is stored.
#[tokio::test(flavor = "multi_thread")]
async fn another_principal_or_other_hosts_cannot_take_a_cluster_name() {
    let s = Server::start().await;
    assert_eq!(s.post(&EXAMPLE).await.status(), 202);
    let b = s.db.create_token("b").await.unwrap();
    let post_as = |token: String, body: String| {
        let req = s
            .client()
            .post(s.url(&format!("/api/v1/clusters?bundle={}", s.digest)))
            .bearer_auth(token)
            .header("content-type", "application/yaml")
            .body(body);
        async move { req.send().await.unwrap() }
    };
    let r = post_as(b.clone(), EXAMPLE.clone()).await;
    assert_eq!(r.status(), 409);
    assert!(r.text().await.unwrap().contains("another principal"));
    let r = post_as(s.token.clone(), EXAMPLE.replace("192.168.10.21", "192.168.10.99")).await;
    assert_eq!(r.status(), 409);
    assert!(r.text().await.unwrap().contains("192.168.10.99"));
    // An admin may act on any cluster (the operator's hand).
    let admin =
        s.db.create_token_scoped("admin", &[kubexm_server::jobdb::Scope::Admin], None)
            .await
            .unwrap();
    assert_eq!(post_as(admin, EXAMPLE.clone()).await.status(), 202);
    // B's own name is B's; B may not cancel A's job.
    assert_eq!(
        post_as(b.clone(), EXAMPLE.replace("name: demo", "name: demo-b")).await.status(),
        202
    );
    assert_eq!(s.db.list().await.unwrap().len(), 3);
    let first = s.db.list().await.unwrap().iter().map(|j| j.id).min().unwrap();
    let r = s
        .client()
        .post(s.url(&format!("/api/v1/jobs/{first}/cancel")))
        .bearer_auth(&b)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    s.handle.shutdown();
}

/// Issue 24, item 2: a cluster installed on the server's machine outside
/// the API (kubexm-install, or before names were bound) is not handed to
/// the first request that names it.
#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_installed_outside_the_api_is_not_bound_to_a_request() {
    let dir = tempfile::tempdir().unwrap();
    let (digest, _) = held_bundle(dir.path());
    let db = Arc::new(JobDb::open(&dir.path().join("jobs.db")).await.unwrap());
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("demo.kubeconfig"), "").unwrap();
    let mut o = Server::options(dir.path());
    o.root = Some(root);
    let handle = axum_server::Handle::new();
    tokio::spawn(api::serve(db.clone(), o, handle.clone()));
    let addr = handle.listening().await.unwrap();
    let ca = reqwest::Certificate::from_pem(&std::fs::read(dir.path().join("tls/ca.crt")).unwrap()).unwrap();
    let c = reqwest::Client::builder().tls_certs_only([ca]).build().unwrap();
    let post = |token: String| {
        c.post(format!("https://127.0.0.1:{}/api/v1/clusters?bundle={digest}", addr.port()))
            .bearer_auth(token)
            .header("content-type", "application/yaml")
            .body(EXAMPLE.clone())
            .send()
    };
    let r = post(db.create_token("x").await.unwrap()).await.unwrap();
    assert_eq!(r.status(), 409);
    assert!(r.text().await.unwrap().contains("already exists on the server's machine"));
    let admin = db
        .create_token_scoped("a", &[kubexm_server::jobdb::Scope::Admin], None)
        .await
        .unwrap();
    assert_eq!(post(admin).await.unwrap().status(), 202);
    handle.shutdown();
}

/// Issue 24, item 8: a job row that cannot be read is listed with its error
/// (the list does not answer 500) and failed by a worker that goes on;
/// `/healthz` and `/readyz` report the database's state.
#[tokio::test(flavor = "multi_thread")]
async fn a_bad_row_is_listed_with_its_error_and_skipped_and_health_reports_the_database() {
    let s = Server::start().await;
    let id = s.create_job().await;
    let good = s.post(&EXAMPLE.replace("name: demo", "name: other")).await.status();
    assert_eq!(good, 202);
    rusqlite::Connection::open(s.dir.path().join("jobs.db"))
        .unwrap()
        .execute("UPDATE jobs SET created = 'not a number' WHERE id = ?1", [id])
        .unwrap();
    let r = s.client().get(s.url("/api/v1/jobs")).bearer_auth(&s.token).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    let bad = v["jobs"].as_array().unwrap().iter().find(|j| j["id"] == id).unwrap().clone();
    assert_eq!(bad["status"], "Failed");
    assert!(bad["error"].as_str().unwrap().contains("cannot be read"), "{bad}");
    // A worker claims it, fails it with the reason, and is still there.
    let db = s.db.clone();
    let (state, jobs) = (s.dir.path().join("state.db"), s.dir.path().join("jobs"));
    let o = kubexm_server::worker::WorkerOptions::here(state, jobs);
    let ran = kubexm_server::worker::serve(&db, &o, Arc::new(std::sync::atomic::AtomicBool::new(false)), true).await;
    assert!(ran.is_ok(), "{ran:?}");
    let h: serde_json::Value = s.client().get(s.url("/healthz")).send().await.unwrap().json().await.unwrap();
    assert_eq!(
        (h["status"].as_str(), h["database"].as_str(), h["worker"].as_str()),
        (Some("ok"), Some("ok"), Some("none"))
    );
    assert_eq!(s.client().get(s.url("/readyz")).send().await.unwrap().status(), 200);
    s.handle.shutdown();
}

/// Issue 24, item 10: a principal's changing requests are rate limited
/// (a burst of 20, then --post-rate a minute): one more answers 429.
/// One a minute, so that a slow CI machine's seconds between the requests
/// do not refill the bucket.
#[tokio::test(flavor = "multi_thread")]
async fn a_principal_flooding_posts_gets_429() {
    let s = Server::start_with(1).await;
    let mut codes = Vec::new();
    for _ in 0..25 {
        let r = s
            .client()
            .post(s.url("/api/v1/jobs/999999/cancel"))
            .bearer_auth(&s.token)
            .send()
            .await
            .unwrap();
        codes.push(r.status().as_u16());
    }
    assert!(codes[..20].iter().all(|c| *c == 404), "{codes:?}");
    assert!(codes[20..].iter().all(|c| *c == 429), "{codes:?}");
    // Reads are not limited.
    assert_eq!(
        s.client()
            .get(s.url("/api/v1/jobs"))
            .bearer_auth(&s.token)
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    s.handle.shutdown();
}
