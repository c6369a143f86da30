//! Where the engine keeps jobs and step results, behind one async trait so
//! every trigger (the CLI, API workers) and every backend share the engine:
//! embedded SQLite ([`State`]) now; a PostgreSQL store with job queueing
//! implements the same trait later. Pinned host keys come with it
//! ([`KnownHosts`]).

use std::collections::HashSet;

use futures_util::future::BoxFuture;

use crate::ssh::KnownHosts;
use crate::state::{JobRecord, Record, Span, State, StateError, StepRecord};

pub trait Store: KnownHosts + Send + Sync {
    /// Starts a job of `kind` for `cluster`; returns its id.
    fn begin_job<'a>(&'a self, cluster: &'a str, kind: &'a str) -> BoxFuture<'a, Result<i64, StateError>>;
    /// Ends a job with `status` (succeeded, failed, interrupted).
    fn finish_job<'a>(&'a self, job: i64, status: &'a str) -> BoxFuture<'a, Result<(), StateError>>;
    /// Records step results, all or none.
    fn record_many<'a>(&'a self, job: i64, records: &'a [Record<'a>]) -> BoxFuture<'a, Result<(), StateError>>;
    /// Records the stretches of a job outside its steps (its preamble).
    fn record_spans<'a>(&'a self, job: i64, spans: &'a [Span]) -> BoxFuture<'a, Result<(), StateError>>;
    /// A job's spans.
    fn spans(&self, job: i64) -> BoxFuture<'_, Result<Vec<Span>, StateError>>;
    /// Every node an earlier job of `cluster` of the same operation as
    /// `job` completed, since the cluster's last successful reset.
    fn done_nodes<'a>(&'a self, cluster: &'a str, job: i64) -> BoxFuture<'a, Result<HashSet<String>, StateError>>;
    /// Every step a job of operation `kind` on `cluster` would skip if it started now.
    fn done_steps<'a>(&'a self, cluster: &'a str, kind: &'a str) -> BoxFuture<'a, Result<HashSet<String>, StateError>>;
    /// A job by id, or the latest.
    fn job(&self, id: Option<i64>) -> BoxFuture<'_, Result<Option<JobRecord>, StateError>>;
    /// The latest job of `kind` for `cluster`, whatever its status.
    fn last_job<'a>(&'a self, cluster: &'a str, kind: &'a str) -> BoxFuture<'a, Result<Option<JobRecord>, StateError>>;
    /// A job's step results.
    fn steps(&self, job: i64) -> BoxFuture<'_, Result<Vec<StepRecord>, StateError>>;
    /// A job's step results without their logs (what a timeline reads).
    fn step_times(&self, job: i64) -> BoxFuture<'_, Result<Vec<StepRecord>, StateError>>;
    /// `log` with every secret the store knows replaced.
    fn redact(&self, log: &str) -> String;
    /// Keeps a cluster record (JSON) as what `job` left `cluster` as.
    fn put_record<'a>(&'a self, job: i64, cluster: &'a str, status: &'a str, body: &'a str) -> BoxFuture<'a, Result<(), StateError>>;
    /// Notes that `job` took `hosts` out of `cluster`: no step done on them
    /// before counts as done after.
    fn put_removed<'a>(&'a self, job: i64, cluster: &'a str, hosts: &'a [String]) -> BoxFuture<'a, Result<(), StateError>>;
    /// Forgets `cluster`'s records (its jobs stay).
    fn forget_cluster<'a>(&'a self, cluster: &'a str) -> BoxFuture<'a, Result<(), StateError>>;
    /// The latest record of `cluster` (of a succeeded job, when `succeeded`): its job and body.
    fn last_record<'a>(&'a self, cluster: &'a str, succeeded: bool) -> BoxFuture<'a, Result<Option<(i64, String)>, StateError>>;
}

impl Store for State {
    fn begin_job<'a>(&'a self, cluster: &'a str, kind: &'a str) -> BoxFuture<'a, Result<i64, StateError>> {
        Box::pin(async move { State::begin_job(self, cluster, kind) })
    }
    fn finish_job<'a>(&'a self, job: i64, status: &'a str) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(async move { State::finish_job(self, job, status) })
    }
    fn record_many<'a>(&'a self, job: i64, records: &'a [Record<'a>]) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(async move { State::record_many(self, job, records) })
    }
    fn record_spans<'a>(&'a self, job: i64, spans: &'a [Span]) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(async move { State::record_spans(self, job, spans) })
    }
    fn spans(&self, job: i64) -> BoxFuture<'_, Result<Vec<Span>, StateError>> {
        Box::pin(async move { State::spans(self, job) })
    }
    fn done_nodes<'a>(&'a self, cluster: &'a str, job: i64) -> BoxFuture<'a, Result<HashSet<String>, StateError>> {
        Box::pin(async move { State::done_nodes(self, cluster, job) })
    }
    fn done_steps<'a>(&'a self, cluster: &'a str, kind: &'a str) -> BoxFuture<'a, Result<HashSet<String>, StateError>> {
        Box::pin(async move { State::done_steps(self, cluster, kind) })
    }
    fn job(&self, id: Option<i64>) -> BoxFuture<'_, Result<Option<JobRecord>, StateError>> {
        Box::pin(async move { State::job(self, id) })
    }
    fn last_job<'a>(&'a self, cluster: &'a str, kind: &'a str) -> BoxFuture<'a, Result<Option<JobRecord>, StateError>> {
        Box::pin(async move { State::last_job(self, cluster, kind) })
    }
    fn steps(&self, job: i64) -> BoxFuture<'_, Result<Vec<StepRecord>, StateError>> {
        Box::pin(async move { State::steps(self, job) })
    }
    fn step_times(&self, job: i64) -> BoxFuture<'_, Result<Vec<StepRecord>, StateError>> {
        Box::pin(async move { State::step_times(self, job) })
    }
    fn redact(&self, log: &str) -> String {
        State::redact(self, log)
    }
    fn put_record<'a>(&'a self, job: i64, cluster: &'a str, status: &'a str, body: &'a str) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(async move { State::put_record(self, job, cluster, status, body) })
    }
    fn forget_cluster<'a>(&'a self, cluster: &'a str) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(async move { State::forget_cluster(self, cluster) })
    }
    fn put_removed<'a>(&'a self, job: i64, cluster: &'a str, hosts: &'a [String]) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(async move { State::put_removed(self, job, cluster, hosts) })
    }
    fn last_record<'a>(&'a self, cluster: &'a str, succeeded: bool) -> BoxFuture<'a, Result<Option<(i64, String)>, StateError>> {
        Box::pin(async move { State::last_record(self, cluster, succeeded) })
    }
}
