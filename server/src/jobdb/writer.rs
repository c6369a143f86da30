//! One log writer per claimed job. The engine reports its events
//! synchronously, from its own runtime's threads, and a host may print
//! thousands of lines a second: a database write per line would hold the
//! engine's scheduler on the database. So a line is only sent into a
//! channel ([`LogSender::send`] never waits), and one task appends what has
//! arrived in batches, each in one transaction naming the claim, refused
//! once the job was claimed again ([`JobDbError::Fenced`]).

use std::sync::Arc;

use tokio::sync::mpsc;

use super::{Claim, JobDb, JobDbError};

/// Lines appended in one transaction at most.
const BATCH: usize = 512;

enum Entry {
    /// A log line, and the step it makes current.
    Line(String, Option<String>),
    /// Every line before this one is sent: append them and stop.
    End,
}

/// Where a job's log lines are sent; cheap to clone, usable from any thread.
#[derive(Clone)]
pub struct LogSender(mpsc::UnboundedSender<Entry>);

impl LogSender {
    /// Queues `line` (and `step` as the job's current step) for the writer.
    /// Unbounded: the engine is never held up; the writer's batches keep
    /// up with any host, and the stored log is capped ([`super::log_bounds`]).
    pub fn send(&self, line: String, step: Option<String>) {
        // A writer that has stopped (fenced) takes no more lines.
        let _ = self.0.send(Entry::Line(line, step));
    }
}

/// The writer task of one claimed job.
pub struct LogWriter {
    sender: LogSender,
    task: tokio::task::JoinHandle<()>,
}

impl LogWriter {
    /// Starts the writer of `claim` on the current runtime; `on_fenced` is
    /// called once if the job was claimed again (then nothing more is written).
    pub fn start(db: Arc<JobDb>, claim: Claim, on_fenced: impl FnOnce() + Send + 'static) -> LogWriter {
        let (tx, rx) = mpsc::unbounded_channel();
        LogWriter {
            sender: LogSender(tx),
            task: tokio::spawn(write(db, claim, rx, on_fenced)),
        }
    }

    /// A sender of this job's lines.
    pub fn sender(&self) -> LogSender {
        self.sender.clone()
    }

    /// Appends every line sent so far and stops the writer.
    pub async fn close(self) {
        let _ = self.sender.0.send(Entry::End);
        if let Err(e) = self.task.await
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

/// Appends what has arrived, in batches, until [`Entry::End`] (or every
/// sender is gone, or the claim was lost).
async fn write(db: Arc<JobDb>, claim: Claim, mut rx: mpsc::UnboundedReceiver<Entry>, on_fenced: impl FnOnce()) {
    let mut end = false;
    while !end {
        let Some(first) = rx.recv().await else { return };
        let (mut lines, mut step) = (Vec::new(), None);
        end = !take(first, &mut lines, &mut step);
        while !end && lines.len() < BATCH {
            match rx.try_recv() {
                Ok(e) => end = !take(e, &mut lines, &mut step),
                Err(_) => break,
            }
        }
        if lines.is_empty() {
            continue;
        }
        match db.append(claim, &lines, step.as_deref()).await {
            Ok(()) => {}
            Err(JobDbError::Fenced { .. }) => {
                on_fenced();
                return;
            }
            Err(e) => tracing::warn!("job {}: {e}", claim.job),
        }
    }
}

/// Adds a line to the batch (its step, if any, the batch's current step);
/// false at [`Entry::End`].
fn take(e: Entry, lines: &mut Vec<String>, step: &mut Option<String>) -> bool {
    match e {
        Entry::Line(l, s) => {
            lines.push(l);
            if s.is_some() {
                *step = s;
            }
            true
        }
        Entry::End => false,
    }
}
