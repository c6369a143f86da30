//! What a run reports as it goes: job and step events, each numbered in
//! order within its job, handed to an [`EventSink`]. The engine never
//! prints; the CLI renders events as progress (bars or lines), and a job
//! database can persist the same events for clients that follow a job.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::state::Outcome;

/// One phase of a job: its nodes per host (a host is done with the phase
/// when its last node there finished).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhaseSize {
    pub module: String,
    pub nodes_per_host: Vec<(String, usize)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    JobStarted {
        phases: Vec<PhaseSize>,
    },
    StepStarted {
        node: String,
        module: String,
        host: String,
    },
    /// One line of a step's output (secrets redacted), emitted when the
    /// step ends, before its `StepFinished`.
    LogLine {
        node: String,
        host: String,
        line: String,
    },
    StepFinished {
        node: String,
        module: String,
        host: String,
        outcome: Outcome,
    },
    JobFinished {
        status: String,
    },
}

/// An event with its place in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Numbered {
    /// 1, 2, 3, ... within the job.
    pub seq: u64,
    pub job: i64,
    pub event: Event,
}

/// Receives a run's events, in order.
pub trait EventSink: Send + Sync {
    fn emit(&self, event: &Numbered);
}

/// Keeps every event (tests; a later job database).
#[derive(Default)]
pub struct Collect(pub Mutex<Vec<Numbered>>);

impl EventSink for Collect {
    fn emit(&self, event: &Numbered) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(event.clone());
    }
}

/// Numbers a job's events and hands them on; builds nothing without a sink.
pub(crate) struct Emitter {
    sink: Option<Arc<dyn EventSink>>,
    job: i64,
    seq: AtomicU64,
}

impl Emitter {
    pub(crate) fn new(sink: Option<Arc<dyn EventSink>>, job: i64) -> Emitter {
        Emitter {
            sink,
            job,
            seq: AtomicU64::new(0),
        }
    }

    /// Whether anyone listens (so per-line work is skipped otherwise).
    pub(crate) fn wanted(&self) -> bool {
        self.sink.is_some()
    }

    pub(crate) fn emit(&self, event: impl FnOnce() -> Event) {
        if let Some(sink) = &self.sink {
            let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
            sink.emit(&Numbered {
                seq,
                job: self.job,
                event: event(),
            });
        }
    }
}
