//! The Lease's steps on a clock of our own.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

use crate::{Seen, Step, step};

fn lease(holder: &str, renewed: &str) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(holder.into()),
        lease_duration_seconds: Some(15),
        renew_time: Some(MicroTime(renewed.parse().unwrap_or_default())),
        ..Default::default()
    }
}

#[test]
fn the_lease_is_taken_over_only_after_its_holder_stopped_renewing_it_for_its_duration_on_our_clock() {
    let d = Duration::from_secs(15);
    let t0 = Instant::now();
    let mut seen = Seen::default();
    assert_eq!(step(None, "b", &mut seen, t0, d), Step::Create);
    let a = lease("a", "2026-11-28T10:00:00Z");
    assert_eq!(step(Some(&lease("b", "2026-11-28T10:00:00Z")), "b", &mut seen, t0, d), Step::Renew);
    let wait = Step::Wait { holder: "a".into() };
    assert_eq!(step(Some(&a), "b", &mut seen, t0, d), wait);
    assert_eq!(step(Some(&a), "b", &mut seen, t0 + Duration::from_secs(10), d), wait);
    // Renewed: the clock starts again, whatever the holder's clock says.
    let renewed = lease("a", "2026-11-28T09:00:00Z");
    assert_eq!(step(Some(&renewed), "b", &mut seen, t0 + Duration::from_secs(14), d), wait);
    assert_eq!(step(Some(&renewed), "b", &mut seen, t0 + Duration::from_secs(28), d), wait);
    assert_eq!(
        step(Some(&renewed), "b", &mut seen, t0 + Duration::from_secs(30), d),
        Step::TakeOver
    );
    // Handed back: taken at once.
    let mut free = a.clone();
    free.holder_identity = None;
    assert_eq!(step(Some(&free), "b", &mut Seen::default(), t0, d), Step::TakeOver);
}

#[test]
fn a_lease_deleted_under_its_holder_is_made_again_only_after_its_duration() {
    let d = Duration::from_secs(15);
    let t0 = Instant::now();
    let mut seen = Seen::default();
    let a = lease("a", "2026-11-28T10:00:00Z");
    assert_eq!(step(Some(&a), "b", &mut seen, t0, d), Step::Wait { holder: "a".into() });
    assert_eq!(
        step(None, "b", &mut seen, t0 + Duration::from_secs(5), d),
        Step::Wait { holder: "a".into() }
    );
    assert_eq!(step(None, "b", &mut seen, t0 + Duration::from_secs(16), d), Step::Create);
}

/// A mock API server for one Lease (logic only): answers each request
/// with the next of `answers` (status, body) and records each request's
/// method and body.
type Recorded = std::sync::Arc<std::sync::Mutex<Vec<(String, serde_json::Value)>>>;

fn mock(answers: Vec<(u16, serde_json::Value)>) -> (kube::Client, Recorded) {
    let recorded = Recorded::default();
    let answers = std::sync::Arc::new(std::sync::Mutex::new(std::collections::VecDeque::from(answers)));
    let seen = recorded.clone();
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let (seen, answers) = (seen.clone(), answers.clone());
        async move {
            let method = req.method().to_string();
            let bytes = req.into_body().collect_bytes().await?;
            let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
            seen.lock().map_err(|e| e.to_string())?.push((method, body));
            let (status, answer) = answers.lock().map_err(|e| e.to_string())?.pop_front().ok_or("no answer left")?;
            let response = http::Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(kube::client::Body::from(serde_json::to_vec(&answer)?))?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(response)
        }
    });
    (kube::Client::new(service, "kubexm-system"), recorded)
}

fn lease_object(holder: Option<&str>, version: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "kubexm-controller-manager", "namespace": "kubexm-system", "resourceVersion": version},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
    })
}

fn conflict() -> (u16, serde_json::Value) {
    (
        409,
        serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409, "message": "the object has been modified"}),
    )
}

fn holding(client: kube::Client, version: &str) -> Result<crate::Elector, serde_json::Error> {
    let mut e = crate::Elector::new(
        client,
        crate::LeaseConfig::new("kubexm-system", "kubexm-controller-manager", "me", Duration::from_secs(15)),
    );
    e.held = Some(serde_json::from_value(lease_object(Some("me"), version))?);
    Ok(e)
}

/// A renewal cut off by the stop was written after all: the copy held is
/// a version behind, the hand-back conflicts, and the Lease read again
/// (still ours) is handed back.
#[tokio::test]
async fn a_hand_back_that_conflicts_reads_the_lease_again_and_hands_it_back() -> Result<(), Box<dyn std::error::Error>> {
    let (client, recorded) = mock(vec![
        conflict(),
        (200, lease_object(Some("me"), "3")),
        (200, lease_object(None, "4")),
    ]);
    holding(client, "1")?.release().await;
    let recorded = recorded.lock().map_err(|e| e.to_string())?.clone();
    let methods: Vec<&str> = recorded.iter().map(|(m, _)| m.as_str()).collect();
    assert_eq!(methods, ["PUT", "GET", "PUT"]);
    assert_eq!(recorded[2].1["metadata"]["resourceVersion"], "3");
    assert!(recorded[2].1["spec"]["holderIdentity"].is_null(), "{}", recorded[2].1);
    Ok(())
}

/// Read again after a conflict, the Lease is another replica's: it is
/// left alone.
#[tokio::test]
async fn a_hand_back_that_conflicts_leaves_another_holder_s_lease_alone() -> Result<(), Box<dyn std::error::Error>> {
    let (client, recorded) = mock(vec![conflict(), (200, lease_object(Some("other"), "3"))]);
    holding(client, "1")?.release().await;
    let methods: Vec<String> = recorded.lock().map_err(|e| e.to_string())?.iter().map(|(m, _)| m.clone()).collect();
    assert_eq!(methods, ["PUT", "GET"]);
    Ok(())
}
