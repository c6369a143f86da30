//! The controller's decisions on examples/ha.yaml's spec changed as kubectl
//! would change it, and the conditions they set.

use kubexm_bom::config::Cluster;
use kubexm_crd::{ClusterStatus, ConditionStatus, ConditionType};
use serde_json::{Value, json};

use crate::decide::{self, Decision, conditions_for, decide, status_for};

/// examples/ha.yaml's spec as the install's operator phase writes it into
/// the cluster (no login, nothing naming a file).
fn applied() -> Value {
    let text = include_str!("../../examples/ha.yaml");
    let c: Cluster = serde_saphyr::from_str(text).unwrap();
    kubexm_crd::in_cluster(&c.spec).unwrap()
}

fn decided(spec: &Value) -> Decision {
    decide("prod", spec, &applied(), "configmap kubexm-system/kubexm-applied-prod")
}

#[test]
fn the_applied_spec_asks_for_nothing_and_settings_read_off_the_cluster_neither() {
    assert_eq!(decided(&applied()), Decision::AsApplied);
    let mut s = applied();
    s["preflight"]["leftovers"] = "warn".into();
    assert_eq!(decided(&s), Decision::AsApplied);
}

#[test]
fn a_cidr_change_cannot_be_made_and_names_its_field() {
    let mut s = applied();
    s["kubernetes"]["podCIDR"] = "10.245.0.0/16".into();
    let Decision::CannotChange(p) = decided(&s) else {
        panic!("{:?}", decided(&s))
    };
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].path, "spec.kubernetes.podCIDR");
    assert!(
        p[0].message.contains("10.244.0.0/16") && p[0].message.contains("10.245.0.0/16"),
        "{p:?}"
    );
    let (sets, observed) = conditions_for(&decided(&s), "prod");
    assert!(observed);
    let ns = sets.iter().find(|c| c.type_ == ConditionType::NotSupported).unwrap();
    assert_eq!((ns.status, ns.reason.as_str()), (ConditionStatus::True, "CannotChange"));
    assert!(ns.message.starts_with("spec.kubernetes.podCIDR: "), "{}", ns.message);
    assert!(ns.message.contains("nothing was run"), "{}", ns.message);
}

#[test]
fn a_version_change_is_not_supported_yet_and_an_added_worker_not_run_yet() {
    let mut s = applied();
    s["kubernetes"]["version"] = "v1.34.1".into();
    let Decision::NotSupportedYet(p) = decided(&s) else {
        panic!("{:?}", decided(&s))
    };
    assert_eq!(p[0].path, "spec.kubernetes.version");

    let mut s = applied();
    s["hosts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "worker4", "address": "192.168.10.24"}));
    s["roleGroups"]["worker"].as_array_mut().unwrap().push("worker4".into());
    assert_eq!(decided(&s), Decision::NotRunYet("adds worker4".into()));
    let (sets, _) = conditions_for(&decided(&s), "prod");
    let ns = sets.iter().find(|c| c.type_ == ConditionType::NotSupported).unwrap();
    assert_eq!(ns.reason, "ControllerDoesNotApplyYet");
    assert!(ns.message.contains("apply -f cluster.yaml"), "{}", ns.message);
}

#[test]
fn a_host_taken_out_is_a_change_the_controller_runs_before_one_added() -> Result<(), Box<dyn std::error::Error>> {
    let mut s = applied();
    let hosts = s["hosts"].as_array_mut().ok_or("no hosts")?;
    hosts.retain(|h| h["name"] != "worker3");
    hosts.push(json!({"name": "worker4", "address": "192.168.10.24", "arch": "amd64"}));
    let workers = s["roleGroups"]["worker"].as_array_mut().ok_or("no workers")?;
    workers.retain(|w| w != "worker3");
    workers.push("worker4".into());
    assert_eq!(decided(&s), Decision::NotRunYet("removes worker3 and adds worker4".into()));
    let (sets, _) = conditions_for(&decided(&s), "prod");
    let ns = sets
        .iter()
        .find(|c| c.type_ == ConditionType::NotSupported)
        .ok_or("no NotSupported")?;
    assert!(ns.message.contains("remove node HOST"), "{}", ns.message);
    // A host's address changed under the same name is still refused.
    let mut s = applied();
    s["hosts"][6]["address"] = "192.168.10.99".into();
    assert!(matches!(decided(&s), Decision::CannotChange(_)), "{:?}", decided(&s));
    Ok(())
}

#[test]
fn paused_decides_nothing_and_leaves_the_generation_unobserved() {
    let mut s = applied();
    s["kubernetes"]["podCIDR"] = "10.245.0.0/16".into();
    s["paused"] = true.into();
    assert_eq!(decided(&s), Decision::Paused);
    let (sets, observed) = conditions_for(&Decision::Paused, "prod");
    assert!(!observed);
    assert_eq!(sets[0].reason, "Paused");
}

#[test]
fn a_spec_that_does_not_read_or_names_a_file_here_is_invalid_by_path() {
    let mut s = applied();
    s["kubernetes"]["proxyMode"] = "carrier-pigeon".into();
    let Decision::Invalid(p) = decided(&s) else {
        panic!("{:?}", decided(&s))
    };
    assert!(p.iter().any(|p| p.path == "spec.kubernetes.proxyMode"), "{p:?}");

    // Pruned by the API server's schema; refused here all the same.
    let mut s = applied();
    s["hosts"][0]["auth"] = json!({"privateKey": {"path": "/root/.ssh/id_ed25519"}});
    let Decision::Invalid(p) = decided(&s) else {
        panic!("{:?}", decided(&s))
    };
    assert!(p.iter().any(|p| p.path == "spec.hosts[0].auth.privateKey"), "{p:?}");
}

#[test]
fn an_applied_spec_that_does_not_read_is_an_error_naming_where_it_is() {
    let d = decide(
        "prod",
        &applied(),
        &json!({"hosts": 3}),
        "configmap kubexm-system/kubexm-applied-prod",
    );
    let Decision::AppliedUnreadable(e) = d else { panic!("{d:?}") };
    assert!(e.to_string().contains("configmap kubexm-system/kubexm-applied-prod"), "{e}");
}

#[test]
fn conditions_keep_their_transition_time_while_their_status_holds() {
    let mut s = applied();
    s["kubernetes"]["podCIDR"] = "10.245.0.0/16".into();
    let (sets, observed) = conditions_for(&decided(&s), "prod");
    let first = status_for(&ClusterStatus::default(), &sets, observed, 2, "2026-11-28T10:00:00Z");
    assert_eq!(first.observed_generation, Some(2));
    let again = status_for(&first, &sets, observed, 3, "2026-11-28T11:00:00Z");
    let ns = |st: &ClusterStatus| {
        st.conditions
            .iter()
            .find(|c| c.type_ == ConditionType::NotSupported)
            .cloned()
            .unwrap()
    };
    assert_eq!(ns(&again).last_transition_time.as_deref(), Some("2026-11-28T10:00:00Z"));
    assert_eq!(ns(&again).observed_generation, Some(3));
    let (back, observed) = conditions_for(&Decision::AsApplied, "prod");
    let fixed = status_for(&again, &back, observed, 4, "2026-11-28T12:00:00Z");
    assert_eq!(ns(&fixed).status, ConditionStatus::False);
    assert_eq!(ns(&fixed).last_transition_time.as_deref(), Some("2026-11-28T12:00:00Z"));
    assert!(decide::event_for(&Decision::AsApplied, &back).is_none());
}

#[test]
fn a_refusal_after_an_invalid_spec_clears_failed_and_the_other_way_round() {
    let mut bad = applied();
    bad["kubernetes"]["proxyMode"] = "carrier-pigeon".into();
    let mut cidr = applied();
    cidr["kubernetes"]["podCIDR"] = "10.245.0.0/16".into();
    let status_of = |st: &ClusterStatus, t: ConditionType| st.conditions.iter().find(|c| c.type_ == t).map(|c| c.status);
    let (s1, o1) = conditions_for(&decided(&bad), "prod");
    let first = status_for(&ClusterStatus::default(), &s1, o1, 2, "t1");
    assert_eq!(status_of(&first, ConditionType::Failed), Some(ConditionStatus::True));
    let (s2, o2) = conditions_for(&decided(&cidr), "prod");
    let second = status_for(&first, &s2, o2, 3, "t2");
    assert_eq!(status_of(&second, ConditionType::Failed), Some(ConditionStatus::False));
    assert_eq!(status_of(&second, ConditionType::NotSupported), Some(ConditionStatus::True));
    let third = status_for(&second, &s1, o1, 4, "t3");
    assert_eq!(status_of(&third, ConditionType::NotSupported), Some(ConditionStatus::False));
}

#[test]
fn with_a_field_that_never_changes_every_problem_is_named_that_one_first() {
    let mut s = applied();
    s["kubernetes"]["version"] = "v1.34.1".into();
    s["kubernetes"]["serviceCIDR"] = "10.97.0.0/16".into();
    let Decision::CannotChange(p) = decided(&s) else {
        panic!("{:?}", decided(&s))
    };
    let paths: Vec<&str> = p.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(paths, ["spec.kubernetes.serviceCIDR", "spec.kubernetes.version"]);
    // A missing applied spec leaves the generation unobserved.
    let (_, observed) = conditions_for(&Decision::AppliedUnreadable("gone".into()), "prod");
    assert!(!observed);
}

#[test]
fn an_added_host_needs_its_key_pinned_and_the_hosts_there_keep_the_install_s_pins() -> Result<(), Box<dyn std::error::Error>> {
    use kubexm_installer::engine::ssh::KnownHosts;
    use kubexm_installer::engine::state::State;

    use crate::act::{self, ActOptions};
    let old = decide::load_applied("prod", &applied())?;
    let mut s = applied();
    let hosts = s["hosts"].as_array_mut().ok_or("no hosts")?;
    hosts.push(json!({"name": "worker9", "address": "192.168.10.29", "arch": "amd64"}));
    let i = hosts.len() - 1;
    s["roleGroups"]["worker"].as_array_mut().ok_or("no workers")?.push("worker9".into());
    let new = decide::load_spec("prod", &s)?;
    assert_eq!(act::added(&old, &new), ["worker9"]);
    let dir = std::env::temp_dir().join(format!("kubexm-operator-pins-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let o = ActOptions {
        root: dir.clone(),
        state: dir.join("state.db"),
        advertise: Some("127.0.0.1".parse()?),
        serve_port: 1,
        concurrency: 1,
        installer: None,
    };
    // No state database: refused, never made.
    let e = act::pins(&o, &old, &new).err().unwrap_or_default();
    assert!(e[0].contains("is not there"), "{e:?}");
    assert!(!o.state.exists());
    // The install's pins for every host there but worker1.
    let state = State::open(&o.state, Vec::new())?;
    for h in old.spec.hosts.iter().filter(|h| h.name != "worker1") {
        state.put(&format!("{}:22", h.address), &format!("ssh-ed25519 AAAA{}", h.name));
    }
    // A stale pin of the added host's address (an earlier machine).
    state.put("192.168.10.29:22", "ssh-ed25519 AAAAstale");
    drop(state);
    let missing = act::pins(&o, &old, &new).err().unwrap_or_default();
    assert_eq!(missing.len(), 2, "{missing:?}");
    assert!(
        missing[0].starts_with("spec.hosts[5]: host worker1 has no host key pinned"),
        "{missing:?}"
    );
    assert!(
        missing[1].starts_with(&format!("spec.hosts[{i}].hostKey: host worker9 is added")),
        "{missing:?}"
    );
    // The added host's key from the spec (never the stale pin), without its
    // comment; a key in the spec for a host there changes nothing.
    let key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl";
    s["hosts"][i]["hostKey"] = format!("{key} root@worker9").into();
    s["hosts"][5]["hostKey"] = key.into();
    State::open(&o.state, Vec::new())?.put("192.168.10.21:22", "ssh-ed25519 AAAAworker1");
    let new = decide::load_spec("prod", &s)?;
    let pins = act::pins(&o, &old, &new).map_err(|m| m.join("; "))?;
    assert_eq!(pins.all.get("192.168.10.29:22").map(String::as_str), Some(key));
    assert_eq!(
        pins.all.get("192.168.10.21:22").map(String::as_str),
        Some("ssh-ed25519 AAAAworker1")
    );
    assert_eq!(pins.added.keys().collect::<Vec<_>>(), ["192.168.10.29:22"]);
    // Kept once the run succeeded, as first contact would.
    act::remember(&o, &pins.added)?;
    assert_eq!(State::open(&o.state, Vec::new())?.get("192.168.10.29:22").as_deref(), Some(key));
    // The config the job runs logs in with the controller's credential.
    assert!(decide::config_text("prod", &s).contains(r#""auth":{"credential":"kubexm-ssh"}"#));
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
