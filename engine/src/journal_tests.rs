//! The journal's format: an installer's database as the handoff's seed,
//! cut into chunks and parts, read back into a new database, answers as
//! the installer's did.

use crate::journal::{Entry, Limits, chunks, replay, seed};
use crate::ssh::KnownHosts;
use crate::state::{Outcome, Record, State};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn record<'a>(node: &'a str, host: &'a str, outcome: Outcome) -> Record<'a> {
    Record {
        node,
        module: "m",
        host,
        outcome,
        ready: 5,
        started: 6,
        duration_ms: 7,
        after: None,
        waits: Some("the API server"),
        log: "secret-log",
    }
}

/// The seed of a database with a reset, an install, a removal, a record
/// and pins, read back: what is done, the record and the pins are the
/// installer's; nothing from before the reset, and no log.
#[test]
fn the_seed_read_back_answers_as_the_installer_s_database() -> Res<()> {
    let dir = tempfile::tempdir()?;
    let db = State::open(&dir.path().join("installer.db"), vec![])?;
    let before = db.begin_job("lab", "install")?;
    db.record_many(before, &[record("old@lab1", "lab1", Outcome::Applied)])?;
    db.finish_job(before, "succeeded")?;
    let reset = db.begin_job("lab", "reset")?;
    db.finish_job(reset, "succeeded")?;
    let install = db.begin_job("lab", "install")?;
    db.record_many(
        install,
        &[
            record("containerd@lab1", "lab1", Outcome::Applied),
            record("containerd@lab2", "lab2", Outcome::Skipped),
            record("join@lab2", "lab2", Outcome::Failed),
        ],
    )?;
    db.finish_job(install, "failed")?;
    let apply = db.begin_job("lab", "apply")?;
    db.record_many(apply, &[record("join@lab2", "lab2", Outcome::Applied)])?;
    let body = format!("{{\"nodes\": [\"{}\"]}}", "lab1 é ".repeat(400));
    db.put_record(apply, "lab", "succeeded", &body)?;
    db.finish_job(apply, "succeeded")?;
    let remove = db.begin_job("lab", "remove-node")?;
    db.put_removed(remove, "lab", &["lab3".to_string()])?;
    db.finish_job(remove, "succeeded")?;
    db.put("198.18.0.11:22", "ssh-ed25519 AAAA1");
    db.put("198.18.0.12:22", "ssh-ed25519 AAAA2");

    let entries = seed(&db, "lab")?;
    assert!(!entries.iter().any(|e| matches!(e, Entry::Job(j) if j.id <= reset)), "{entries:?}");
    let small = Limits { chunk: 1024, piece: 512 };
    let cut = chunks(&entries, small)?;
    assert!(cut.len() > 2, "{} chunks", cut.len());
    let mut read = Vec::new();
    for (name, data) in &cut {
        assert!(name.starts_with("kubexm-state-"), "{name}");
        assert!(data.values().map(String::len).sum::<usize>() <= small.chunk, "{name}");
        for (key, text) in data {
            assert!(!text.contains("secret-log"), "{text}");
            read.push((format!("{name}/{key}"), serde_json::from_str::<Entry>(text)?));
        }
    }
    let copy = State::open(&dir.path().join("copy.db"), vec![])?;
    replay(&copy, read).map_err(|e| e.to_string())?;
    assert_eq!(copy.done_steps("lab", "apply")?, db.done_steps("lab", "apply")?);
    assert!(copy.done_steps("lab", "apply")?.contains("join@lab2"));
    assert_eq!(copy.last_record("lab", true)?, Some((apply, body)));
    assert_eq!(copy.get("198.18.0.12:22").as_deref(), Some("ssh-ed25519 AAAA2"));
    assert_eq!(copy.removed_by(remove)?, ["lab3"]);
    assert_eq!(copy.installed("lab")?.map(|j| j.id), Some(apply));
    let steps = copy.steps(install)?;
    assert_eq!(steps.len(), 3);
    assert!(
        steps
            .iter()
            .all(|s| s.log.is_empty() && s.waits.as_deref() == Some("the API server"))
    );
    // A job begun on the copy is numbered after the installer's.
    assert_eq!(copy.begin_job("lab", "apply")?, remove + 1);
    Ok(())
}

/// A failed step keeps the end of its log, redacted; the others keep none.
#[test]
fn only_a_failed_step_keeps_its_log_redacted() -> Res<()> {
    let records = [
        Record {
            log: "password hunter2",
            ..record("a", "lab1", Outcome::Failed)
        },
        record("b", "lab1", Outcome::Applied),
    ];
    let Entry::Steps { steps, .. } = Entry::steps(1, &records, |l| l.replace("hunter2", "<redacted>")) else {
        return Err("not steps".into());
    };
    assert_eq!(steps[0].log, "password <redacted>");
    assert_eq!(steps[1].log, "");
    Ok(())
}

/// Parts are cut on character boundaries even when a part has room for
/// less than one character, and join back; parts out of order are named.
#[test]
fn parts_cut_on_characters_and_out_of_order_are_named() -> Res<()> {
    let entry = Entry::Forget { cluster: "é".repeat(40) };
    let tiny = crate::journal::pieces(&entry, 3)?;
    assert!(tiny.len() > 40, "{}", tiny.len());
    let read: Vec<(String, Entry)> = tiny
        .iter()
        .enumerate()
        .map(|(i, t)| Ok((format!("cm/{i}"), serde_json::from_str(t)?)))
        .collect::<Result<_, serde_json::Error>>()?;
    let dir = tempfile::tempdir()?;
    let db = State::open(&dir.path().join("a.db"), vec![])?;
    replay(&db, read.clone()).map_err(|e| e.to_string())?;
    let mut swapped = read;
    swapped.swap(1, 2);
    let err = match replay(&db, swapped) {
        Ok(()) => return Err("parts out of order were read".into()),
        Err(e) => e,
    };
    assert!(err.starts_with("cm/") && err.contains("out of order"), "{err}");
    Ok(())
}
