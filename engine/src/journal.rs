//! The state database as a journal of writes, for a store kept where the
//! database file cannot be (the controller inside the cluster keeps it in
//! ConfigMaps: kubexm-operator's `journal`). Each write the engine makes
//! (a job begun or finished, step results, spans, a cluster record, hosts
//! taken out, a pin) is an [`Entry`]; read back in order into a new
//! database ([`replay`]) they give the same answers to every query. An
//! entry larger than a chunk allows is written in parts ([`pieces`]).
//! [`seed`] is an installer's database as entries, for the handoff: what
//! the cluster's controller needs of it (pins, jobs and steps since the
//! last reset, the last record), without logs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ssh::KnownHosts;
use crate::state::{JobRecord, Outcome, Record, Span, State, StateError, StepRecord};

/// The label every chunk of the journal carries (`kubexm.io/state=journal`).
pub const LABEL: &str = "kubexm.io/state";

/// The chunks' name: `kubexm-state-NNNNN`.
pub const PREFIX: &str = "kubexm-state-";

/// Bytes of a failed step's log the journal keeps (its end).
pub const FAILED_LOG_KEEP: usize = 4096;

/// How large chunks and entries get.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes of entries in one chunk (a ConfigMap holds at most 1 MiB).
    pub chunk: usize,
    /// Bytes of one entry; a larger one is written in parts.
    pub piece: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            chunk: 256 * 1024,
            piece: 192 * 1024,
        }
    }
}

/// One write to the state database, as the journal keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum Entry {
    /// A job as it is now (begun, or finished).
    Job(JobRecord),
    /// Step results (a failed step's log only).
    Steps {
        job: i64,
        steps: Vec<StepRecord>,
    },
    Spans {
        job: i64,
        spans: Vec<Span>,
    },
    Record {
        job: i64,
        cluster: String,
        status: String,
        body: String,
    },
    Removed {
        job: i64,
        cluster: String,
        hosts: Vec<String>,
    },
    Forget {
        cluster: String,
    },
    Pin {
        endpoint: String,
        key: String,
    },
    /// Piece `n` (from 1) of `of` of an entry too large for one: the text
    /// of its JSON.
    Part {
        n: u32,
        of: u32,
        text: String,
    },
}

/// A chunk's name.
pub fn chunk_name(n: u32) -> String {
    format!("{PREFIX}{n:05}")
}

/// An entry's key in its chunk: its number, so that keys sort as written.
pub fn entry_key(n: u64) -> String {
    format!("e{n:012}")
}

/// `entry` as the pieces written for it: its JSON, or parts of it when
/// larger than `piece` bytes (cut on character boundaries; each part's
/// text at most half of `piece`, since escaping it again at most doubles it).
pub fn pieces(entry: &Entry, piece: usize) -> Result<Vec<String>, String> {
    let json = serde_json::to_string(entry).map_err(|e| e.to_string())?;
    if json.len() <= piece {
        return Ok(vec![json]);
    }
    let room = (piece / 2).max(1);
    let mut texts = Vec::new();
    let mut rest = json.as_str();
    while !rest.is_empty() {
        // Forward to a boundary: never an empty part, whatever `piece`.
        let mut cut = room.min(rest.len());
        while !rest.is_char_boundary(cut) {
            cut += 1;
        }
        let (head, tail) = rest.split_at(cut);
        texts.push(head);
        rest = tail;
    }
    let of = u32::try_from(texts.len()).map_err(|e| e.to_string())?;
    texts
        .into_iter()
        .zip(1..)
        .map(|(text, n)| serde_json::to_string(&Entry::Part { n, of, text: text.into() }).map_err(|e| e.to_string()))
        .collect()
}

/// Writes `entries` into `db`, in order, each with the place it was read
/// from (named in an error); parts are joined first, and must come in
/// order (1 to `of`, nothing between): a part out of order is an error, a
/// last entry in parts cut short (a writer stopped mid-entry) is left out.
pub fn replay(db: &State, entries: Vec<(String, Entry)>) -> Result<(), String> {
    let mut parts: Option<(u32, u32, String)> = None;
    for (place, entry) in entries {
        let entry = match entry {
            Entry::Part { n, of, text } => {
                // A first part starts anew (parts before it were cut short).
                let joined = match parts.take() {
                    _ if n == 1 => text,
                    Some((last, total, mut so_far)) if n == last + 1 && of == total => {
                        so_far.push_str(&text);
                        so_far
                    }
                    _ => {
                        return Err(format!(
                            "{place}: part {n} of {of} of an entry out of order: the journal was written by two writers at once"
                        ));
                    }
                };
                if n < of {
                    parts = Some((n, of, joined));
                    continue;
                }
                serde_json::from_str(&joined).map_err(|e| format!("{place}: an entry in {of} parts: {e}"))?
            }
            // An entry cut short by its writer's stop, then another writer's.
            e => {
                parts = None;
                e
            }
        };
        apply(db, entry).map_err(|e| format!("{place}: {e}"))?;
    }
    Ok(())
}

/// One entry written into `db`.
fn apply(db: &State, entry: Entry) -> Result<(), StateError> {
    match entry {
        Entry::Job(job) => db.restore_job(&job),
        Entry::Steps { job, steps } => {
            let records: Vec<Record> = steps
                .iter()
                .map(|s| Record {
                    node: &s.node,
                    module: &s.module,
                    host: &s.host,
                    outcome: Outcome::named(&s.status).unwrap_or(Outcome::Failed),
                    ready: s.ready,
                    started: s.started,
                    duration_ms: s.duration_ms,
                    after: s.after.as_deref(),
                    waits: s.waits.as_deref(),
                    log: &s.log,
                })
                .collect();
            db.record_many(job, &records)
        }
        Entry::Spans { job, spans } => db.record_spans(job, &spans),
        Entry::Record {
            job,
            cluster,
            status,
            body,
        } => db.put_record(job, &cluster, &status, &body),
        Entry::Removed { job, cluster, hosts } => db.put_removed(job, &cluster, &hosts),
        Entry::Forget { cluster } => db.forget_cluster(&cluster),
        Entry::Pin { endpoint, key } => {
            db.put(&endpoint, &key);
            Ok(())
        }
        // Joined by `replay`; a lone part is a journal cut short.
        Entry::Part { .. } => Ok(()),
    }
}

impl Entry {
    /// `records` of `job` as the journal keeps them: a failed step's log
    /// (`redact`ed, [`FAILED_LOG_KEEP`] bytes of it), no other's.
    pub fn steps(job: i64, records: &[Record], redact: impl Fn(&str) -> String) -> Entry {
        let steps = records
            .iter()
            .map(|r| StepRecord {
                node: r.node.into(),
                module: r.module.into(),
                host: r.host.into(),
                status: r.outcome.as_str().into(),
                ready: r.ready,
                started: r.started,
                duration_ms: r.duration_ms,
                after: r.after.map(Into::into),
                waits: r.waits.map(Into::into),
                log: if r.outcome == Outcome::Failed {
                    crate::output::bound(&redact(r.log), FAILED_LOG_KEEP).into_owned()
                } else {
                    String::new()
                },
            })
            .collect();
        Entry::Steps { job, steps }
    }
}

/// What the controller of `cluster` needs of the installer's database `db`,
/// as entries: every pin, the cluster's jobs since its last successful
/// reset with their steps (no logs: the installer keeps them) and spans,
/// the hosts taken out since, and its last record.
pub fn seed(db: &State, cluster: &str) -> Result<Vec<Entry>, StateError> {
    let mut out: Vec<Entry> = db.pins()?.into_iter().map(|(endpoint, key)| Entry::Pin { endpoint, key }).collect();
    for job in db.jobs_since_reset(cluster)? {
        let id = job.id;
        out.push(Entry::Job(job));
        // step_times: the steps without their logs.
        let steps = db.step_times(id)?;
        if !steps.is_empty() {
            out.push(Entry::Steps { job: id, steps });
        }
        let spans = db.spans(id)?;
        if !spans.is_empty() {
            out.push(Entry::Spans { job: id, spans });
        }
        let removed = db.removed_by(id)?;
        if !removed.is_empty() {
            out.push(Entry::Removed {
                job: id,
                cluster: cluster.into(),
                hosts: removed,
            });
        }
    }
    if let Some((job, body)) = db.last_record(cluster, true)? {
        out.push(Entry::Record {
            job,
            cluster: cluster.into(),
            status: "succeeded".into(),
            body,
        });
    }
    Ok(out)
}

/// A chunk: its name and its entries by key.
pub type Chunk = (String, BTreeMap<String, String>);

/// `entries` as chunks of at most `limits.chunk` bytes (parts of at most
/// `limits.piece`), numbered from 1, as `(name, data)`: what a writer that
/// makes the journal at once (the handoff) creates.
pub fn chunks(entries: &[Entry], limits: Limits) -> Result<Vec<Chunk>, String> {
    let mut out: Vec<Chunk> = Vec::new();
    let (mut size, mut next) = (usize::MAX, 1u64);
    for entry in entries {
        for piece in pieces(entry, limits.piece)? {
            if size.saturating_add(piece.len()) > limits.chunk {
                let n = u32::try_from(out.len() + 1).map_err(|e| e.to_string())?;
                out.push((chunk_name(n), BTreeMap::new()));
                size = 0;
            }
            size += piece.len();
            if let Some((_, data)) = out.last_mut() {
                data.insert(entry_key(next), piece);
            }
            next += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
#[path = "journal_tests.rs"]
mod tests;
