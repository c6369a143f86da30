//! The journal's logic on an in-memory stand-in for the API server's
//! ConfigMaps (create, merge patch, list by label): a second leader reads back
//! what the first wrote. The real API server is the lab's.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use kubexm_installer::engine::ssh::KnownHosts;
use kubexm_installer::engine::state::{Outcome, Record, Span};
use kubexm_installer::engine::store::Store;
use serde_json::{Value, json};

use super::{Journaled, Limits};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// ConfigMaps by name, as the API server would keep them.
type Objects = Arc<Mutex<BTreeMap<String, Value>>>;

const NS: &str = "kubexm-system";

fn answer(status: u16, body: &Value) -> Res<http::Response<kube::client::Body>> {
    Ok(http::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(kube::client::Body::from(serde_json::to_vec(body)?))?)
}

fn conflict() -> (u16, Value) {
    (
        409,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409}),
    )
}

/// What the stand-in answers `method` on `path` with `body`: create (409
/// when the name is taken), merge patch of data and annotations (409 when
/// the patch's resourceVersion is not the object's), list; each write
/// moves the object's resourceVersion.
fn handle(objects: &Objects, method: &str, path: &str, mut body: Value) -> Res<(u16, Value)> {
    let mut all = objects.lock().map_err(|e| e.to_string())?;
    let version = all
        .values()
        .filter_map(|o| o["metadata"]["resourceVersion"].as_str()?.parse::<u64>().ok())
        .max()
        .unwrap_or(0)
        + 1;
    let collection = format!("/api/v1/namespaces/{NS}/configmaps");
    Ok(match method {
        "GET" if path == collection => {
            let items: Vec<Value> = all.values().cloned().collect();
            (
                200,
                json!({"apiVersion": "v1", "kind": "ConfigMapList", "metadata": {}, "items": items}),
            )
        }
        "POST" if path == collection => {
            let name = body["metadata"]["name"].as_str().ok_or("no name")?.to_string();
            if let std::collections::btree_map::Entry::Vacant(e) = all.entry(name) {
                body["metadata"]["resourceVersion"] = json!(version.to_string());
                e.insert(body.clone());
                (201, body)
            } else {
                conflict()
            }
        }
        "PATCH" => {
            let name = path.strip_prefix(&format!("{collection}/")).ok_or("not a ConfigMap")?;
            let object = all.get_mut(name).ok_or("patch of a missing ConfigMap")?;
            if let Some(v) = body["metadata"]["resourceVersion"].as_str()
                && Some(v) != object["metadata"]["resourceVersion"].as_str()
            {
                return Ok(conflict());
            }
            for at in [&["data"][..], &["metadata", "annotations"][..]] {
                let patch = at.iter().fold(&body, |v, k| &v[*k]);
                if let Some(map) = patch.as_object() {
                    let target = at.iter().fold(&mut *object, |v, k| &mut v[*k]);
                    for (k, v) in map {
                        target[k] = v.clone();
                    }
                }
            }
            object["metadata"]["resourceVersion"] = json!(version.to_string());
            (200, object.clone())
        }
        _ => (404, json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404})),
    })
}

fn api_server(objects: Objects) -> kube::Client {
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let objects = objects.clone();
        async move {
            let (method, path) = (req.method().to_string(), req.uri().path().to_string());
            let bytes = req.into_body().collect_bytes().await?;
            let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let (status, answer_body) = handle(&objects, &method, &path, body)?;
            answer(status, &answer_body)
        }
    });
    kube::Client::new(service, NS)
}

fn record<'a>(node: &'a str, host: &'a str, outcome: Outcome, log: &'a str) -> Record<'a> {
    Record {
        node,
        module: "kubeadm-join",
        host,
        outcome,
        ready: 1_000,
        started: 1_010,
        duration_ms: 250,
        after: Some("preflight@lab1"),
        waits: None,
        log,
    }
}

const SMALL: Limits = Limits { chunk: 2048, piece: 1024 };

/// A leader journals a job (steps, spans, a record larger than a piece, a
/// removal, a pin); a second one, on another working copy, reads the same
/// state back and goes on numbering after it.
#[tokio::test]
async fn a_new_leader_reads_back_what_the_last_one_journaled() -> Res<()> {
    let objects = Objects::default();
    let dir = tempfile::tempdir()?;
    let first = Journaled::open(
        api_server(objects.clone()),
        NS,
        "first",
        &dir.path().join("a.db"),
        vec!["hunter2".into()],
        SMALL,
    )
    .await?;
    let job = first.begin_job("lab", "apply").await?;
    let records = [
        record("join@lab6", "lab6", Outcome::Applied, "joined"),
        record("labels@lab6", "lab6", Outcome::Failed, "password hunter2 refused"),
    ];
    first.record_many(job, &records).await?;
    first
        .record_spans(
            job,
            &[Span {
                name: "connect".into(),
                started: 900,
                duration_ms: 80,
            }],
        )
        .await?;
    let body = format!("{{\"nodes\": \"{}é\"}}", "x".repeat(5000));
    first.put_record(job, "lab", "succeeded", &body).await?;
    first.put_removed(job, "lab", &["lab4".to_string()]).await?;
    first.put("198.18.0.16:22", "ssh-ed25519 AAAA");
    first.finish_job(job, "succeeded").await?;

    let chunks = objects.lock().map_err(|e| e.to_string())?.clone();
    assert!(chunks.len() > 2, "{} chunks", chunks.len());
    for (name, s) in &chunks {
        assert!(name.starts_with("kubexm-state-"), "{name}");
        assert_eq!(s["metadata"]["labels"]["kubexm.io/state"], "journal");
        let size: usize = s["data"]
            .as_object()
            .ok_or("no data")?
            .values()
            .filter_map(Value::as_str)
            .map(str::len)
            .sum();
        assert!(size <= SMALL.chunk, "{name}: {size}");
        assert!(!s.to_string().contains("hunter2"), "{name}");
    }

    let second = Journaled::open(api_server(objects.clone()), NS, "second", &dir.path().join("b.db"), vec![], SMALL).await?;
    let j = second.job(Some(job)).await?.ok_or("no job")?;
    assert_eq!(
        (j.cluster.as_str(), j.kind.as_str(), j.status.as_str()),
        ("lab", "apply", "succeeded")
    );
    assert!(j.finished.is_some());
    let steps = second.steps(job).await?;
    let got: Vec<(&str, &str, &str)> = steps.iter().map(|s| (s.node.as_str(), s.status.as_str(), s.log.as_str())).collect();
    assert_eq!(
        got,
        [
            ("join@lab6", "applied", ""),
            ("labels@lab6", "failed", "password <redacted> refused")
        ]
    );
    assert_eq!(steps[0].after.as_deref(), Some("preflight@lab1"));
    assert_eq!(second.spans(job).await?.len(), 1);
    assert_eq!(second.last_record("lab", true).await?, Some((job, body)));
    assert_eq!(second.get("198.18.0.16:22").as_deref(), Some("ssh-ed25519 AAAA"));
    // The applied step counts as done for the next apply; the failed one does not.
    let done = second.done_steps("lab", "apply").await?;
    assert!(done.contains("join@lab6") && !done.contains("labels@lab6"), "{done:?}");
    // The second leader goes on after the first's job and entries.
    let next = second.begin_job("lab", "apply").await?;
    assert_eq!(next, job + 1);
    let after = objects.lock().map_err(|e| e.to_string())?.clone();
    let keys = |m: &BTreeMap<String, Value>| -> usize { m.values().filter_map(|s| s["data"].as_object()).map(|d| d.len()).sum() };
    assert_eq!(keys(&after), keys(&chunks) + 1);
    Ok(())
}

/// A ConfigMap with the journal's label that is no chunk of it is named.
#[tokio::test]
async fn a_foreign_config_map_with_the_journal_s_label_is_named() -> Res<()> {
    let objects = Objects::default();
    objects.lock().map_err(|e| e.to_string())?.insert(
        "other".into(),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "other", "namespace": NS, "labels": {"kubexm.io/state": "journal"}}, "data": {}}),
    );
    let dir = tempfile::tempdir()?;
    let err = match Journaled::open(
        api_server(objects),
        NS,
        "first",
        &dir.path().join("a.db"),
        vec![],
        Limits::default(),
    )
    .await
    {
        Ok(_) => return Err("opened".into()),
        Err(e) => e,
    };
    assert!(err.contains("kubexm-system/other") && err.contains("no chunk"), "{err}");
    Ok(())
}

/// A new leader seals the last chunk it read: the replaced leader's next
/// write is refused (409), and so is every write after it; the new leader
/// numbers on, and a third leader reads both and seals the new one's.
#[tokio::test]
async fn a_replaced_leader_s_next_write_is_refused_and_it_stops_writing() -> Res<()> {
    let objects = Objects::default();
    let dir = tempfile::tempdir()?;
    let old = Journaled::open(api_server(objects.clone()), NS, "old", &dir.path().join("a.db"), vec![], SMALL).await?;
    let job = old.begin_job("lab", "apply").await?;
    let new = Journaled::open(api_server(objects.clone()), NS, "new", &dir.path().join("b.db"), vec![], SMALL).await?;
    let err = match old.record_many(job, &[record("join@lab6", "lab6", Outcome::Applied, "")]).await {
        Ok(()) => return Err("a replaced leader wrote into a sealed chunk".into()),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("kubexm-state-00001 was sealed by another leader") && err.contains("RBAC"),
        "{err}"
    );
    // Refused from then on, before any request.
    let again = match old.begin_job("lab", "apply").await {
        Ok(id) => return Err(format!("job {id} begun by a replaced leader").into()),
        Err(e) => e.to_string(),
    };
    assert!(again.contains("sealed by another leader"), "{again}");
    let next = new.begin_job("lab", "apply").await?;
    assert_eq!(next, job + 1);
    let all = objects.lock().map_err(|e| e.to_string())?.clone();
    assert_eq!(
        all.keys().cloned().collect::<Vec<_>>(),
        ["kubexm-state-00001", "kubexm-state-00002"]
    );
    assert_eq!(all["kubexm-state-00001"]["metadata"]["annotations"]["kubexm.io/sealed-by"], "new");
    let third = Journaled::open(api_server(objects.clone()), NS, "third", &dir.path().join("c.db"), vec![], SMALL).await?;
    assert!(third.steps(job).await?.is_empty());
    assert_eq!(third.job(None).await?.map(|j| j.id), Some(next));
    assert!(
        new.finish_job(next, "succeeded").await.is_err(),
        "the second leader wrote after the third sealed it"
    );
    Ok(())
}

/// A full chunk is closed before the next is made, so a sealed one stops
/// its writer even when its next entry would go into a new chunk.
#[tokio::test]
async fn a_sealed_writer_cannot_make_its_next_chunk() -> Res<()> {
    let objects = Objects::default();
    let dir = tempfile::tempdir()?;
    let old = Journaled::open(api_server(objects.clone()), NS, "old", &dir.path().join("a.db"), vec![], SMALL).await?;
    let job = old.begin_job("lab", "apply").await?;
    let _new = Journaled::open(api_server(objects.clone()), NS, "new", &dir.path().join("b.db"), vec![], SMALL).await?;
    let big = "y".repeat(SMALL.chunk);
    let err = match old.put_record(job, "lab", "failed", &big).await {
        Ok(()) => return Err("a sealed writer made a chunk".into()),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("sealed by another leader"), "{err}");
    assert_eq!(objects.lock().map_err(|e| e.to_string())?.len(), 1);
    Ok(())
}
