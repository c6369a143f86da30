//! The Lease's steps on a clock of our own.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

use crate::{Seen, Step, step};

fn lease(holder: &str, renewed: &str) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(holder.into()),
        lease_duration_seconds: Some(15),
        renew_time: Some(MicroTime(renewed.parse().unwrap())),
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
