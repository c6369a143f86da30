//! A job's timeline: every step as a bar on its host's lane (when it became
//! ready, when it started, when it ended), the preamble before the engine's
//! first step (verify, unpack, serve, connect, facts, preflight) on a lane
//! of its own, and the critical path: the chain of steps, each held by the
//! one before it, that ends last. Built from what the store recorded, so
//! `status` draws any earlier job; [`svg`] draws it, serde writes it as
//! JSON (the same numbers, for tools), [`Timeline::summary`] says it in
//! lines for the end of a run.

pub mod svg;

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::state::{JobRecord, Span, StateError, StepRecord};
use crate::store::Store;

/// The lane and phase of the preamble (what ran before the first step).
pub const PREAMBLE: &str = "preamble";

/// A start after its ready time by more than this waited for its host
/// (the host's previous step, or the concurrency limit), not for what
/// made it ready.
const SLACK_MS: i64 = 25;

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Timeline {
    pub job: i64,
    pub cluster: String,
    pub kind: String,
    pub status: String,
    /// Milliseconds since the epoch of the axis' 0: the first span's start,
    /// else the first step's ready time.
    pub origin: i64,
    /// From the origin to the last end, in milliseconds.
    pub total_ms: i64,
    /// Hosts in the order their first step started.
    pub hosts: Vec<String>,
    /// Phases (modules) in the order their first step started.
    pub phases: Vec<String>,
    /// The preamble's stretches, in order.
    pub preamble: Vec<Stretch>,
    pub steps: Vec<Bar>,
    /// Ids of the steps on the critical path, first to last.
    pub critical_path: Vec<String>,
    /// The critical path's length per phase ([`PREAMBLE`] first): each
    /// step on it counts from the end of the one before it, so the
    /// lengths add up to `total_ms`.
    pub critical_per_phase: Vec<PhaseTime>,
}

/// A stretch of the preamble, in milliseconds from the origin.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Stretch {
    pub name: String,
    pub start_ms: i64,
    pub end_ms: i64,
}

/// One step on one host, in milliseconds from the origin.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bar {
    pub id: String,
    pub phase: String,
    pub host: String,
    /// When everything it depends on was done.
    pub ready_ms: i64,
    pub start_ms: i64,
    pub end_ms: i64,
    /// applied, skipped, failed, not-run.
    pub outcome: String,
    /// What it waited for, when it is a wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waits: Option<String>,
    /// The step whose end made it ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    pub critical: bool,
}

impl Bar {
    pub fn duration_ms(&self) -> i64 {
        self.end_ms - self.start_ms
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PhaseTime {
    pub phase: String,
    pub ms: i64,
}

impl Timeline {
    /// The timeline of job `job` (the latest when `None`) in `store`;
    /// `None` when there is no such job.
    pub async fn load(store: &dyn Store, job: Option<i64>) -> Result<Option<Timeline>, StateError> {
        let Some(j) = store.job(job).await? else {
            return Ok(None);
        };
        let steps = store.step_times(j.id).await?;
        let spans = store.spans(j.id).await?;
        Ok(Some(Timeline::of(&j, &spans, steps)))
    }

    /// The timeline of a job from its records (their text moved, not copied:
    /// a 5,000-host job has 300,000).
    pub fn of(job: &JobRecord, spans: &[Span], steps: Vec<StepRecord>) -> Timeline {
        // Steps not run have no time on the axis.
        let ran: Vec<StepRecord> = steps.into_iter().filter(|s| s.status != "not-run").collect();
        let origin = spans
            .iter()
            .map(|s| s.started)
            .chain(
                ran.iter()
                    .map(|s: &StepRecord| if s.ready > 0 { s.ready.min(s.started) } else { s.started }),
            )
            .min()
            .unwrap_or(job.started);
        let preamble: Vec<Stretch> = spans
            .iter()
            .map(|s| Stretch {
                name: s.name.clone(),
                start_ms: s.started - origin,
                end_ms: s.started - origin + s.duration_ms,
            })
            .collect();
        let mut steps: Vec<Bar> = ran
            .into_iter()
            .map(|s| Bar {
                ready_ms: if s.ready > 0 { s.ready - origin } else { s.started - origin },
                start_ms: s.started - origin,
                end_ms: s.started - origin + s.duration_ms,
                id: s.node,
                phase: s.module,
                host: s.host,
                outcome: s.status,
                waits: s.waits,
                after: s.after,
                critical: false,
            })
            .collect();
        steps.sort_by(|a, b| (a.start_ms, &a.host, &a.id).cmp(&(b.start_ms, &b.host, &b.id)));
        let total_ms = preamble
            .iter()
            .map(|s| s.end_ms)
            .chain(steps.iter().map(|b| b.end_ms))
            .max()
            .unwrap_or(0)
            .max(0);
        let mut t = Timeline {
            job: job.id,
            cluster: job.cluster.clone(),
            kind: job.kind.clone(),
            status: job.status.clone(),
            origin,
            total_ms,
            hosts: first_seen(steps.iter().map(|b| b.host.as_str())),
            phases: first_seen(steps.iter().map(|b| b.phase.as_str())),
            preamble,
            steps,
            critical_path: Vec::new(),
            critical_per_phase: Vec::new(),
        };
        t.find_critical_path();
        t
    }

    /// Walks back from the step that ended last: each step was held either
    /// by its host (it started later than it was ready: the host's step
    /// before it) or by the step whose end made it ready.
    fn find_critical_path(&mut self) {
        let index: HashMap<&str, usize> = self.steps.iter().enumerate().map(|(i, b)| (b.id.as_str(), i)).collect();
        let mut on_host: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, b) in self.steps.iter().enumerate() {
            on_host.entry(b.host.as_str()).or_default().push(i);
        }
        let Some(last) = (0..self.steps.len()).max_by_key(|&i| (self.steps[i].end_ms, std::cmp::Reverse(i))) else {
            self.critical_per_phase = vec![PhaseTime {
                phase: PREAMBLE.into(),
                ms: self.total_ms,
            }];
            return;
        };
        let mut chain = vec![last];
        let mut seen = vec![false; self.steps.len()];
        seen[last] = true;
        loop {
            let b = &self.steps[chain[chain.len() - 1]];
            let held_by = if b.start_ms - b.ready_ms > SLACK_MS {
                // The host's step before it (steps on a host run one at a time, sorted by start).
                on_host
                    .get(b.host.as_str())
                    .and_then(|list| list.iter().rev().find(|&&j| self.steps[j].start_ms < b.start_ms).copied())
            } else {
                b.after.as_deref().and_then(|a| index.get(a).copied())
            };
            match held_by {
                Some(p) if !seen[p] && self.steps[p].end_ms <= b.start_ms + SLACK_MS => {
                    seen[p] = true;
                    chain.push(p);
                }
                _ => break,
            }
        }
        chain.reverse();
        // The preamble holds the path until its first step: up to the end of
        // the last stretch that ended before that step started.
        let first = &self.steps[chain[0]];
        let preamble_end = self
            .preamble
            .iter()
            .map(|s| s.end_ms)
            .filter(|&e| e <= first.start_ms + SLACK_MS)
            .max()
            .unwrap_or(0)
            .min(first.start_ms)
            .max(0);
        let mut per: Vec<PhaseTime> = vec![PhaseTime {
            phase: PREAMBLE.into(),
            ms: preamble_end,
        }];
        let mut prev_end = preamble_end;
        for &i in &chain {
            let b = &self.steps[i];
            let ms = (b.end_ms - prev_end).max(0);
            prev_end = prev_end.max(b.end_ms);
            match per.iter_mut().find(|p| p.phase == b.phase) {
                Some(p) => p.ms += ms,
                None => per.push(PhaseTime {
                    phase: b.phase.clone(),
                    ms,
                }),
            }
        }
        // Whatever ran after the path's last step (a span after the engine).
        if self.total_ms > prev_end
            && let Some(p) = per.first_mut()
        {
            p.ms += self.total_ms - prev_end;
        }
        self.critical_path = chain.iter().map(|&i| self.steps[i].id.clone()).collect();
        for &i in &chain {
            self.steps[i].critical = true;
        }
        self.critical_per_phase = per;
    }

    /// The critical path's length per phase, in words (`preamble 4.1 s, etcd 9.0 s`).
    pub fn critical_by_phase(&self) -> String {
        let per: Vec<String> = self
            .critical_per_phase
            .iter()
            .filter(|p| p.ms > 0)
            .map(|p| format!("{} {}", p.phase, secs(p.ms)))
            .collect();
        per.join(", ")
    }

    /// The `n` longest steps, longest first.
    pub fn longest(&self, n: usize) -> Vec<&Bar> {
        let mut bars: Vec<&Bar> = self.steps.iter().collect();
        bars.sort_by_key(|b| (std::cmp::Reverse(b.duration_ms()), b.start_ms));
        bars.truncate(n);
        bars
    }

    /// What a person wants at the end of a run: the job's length, the
    /// critical path's length per phase and the five longest steps.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "timeline of job {} ({} of {}): {} in all",
            self.job,
            self.kind,
            self.cluster,
            secs(self.total_ms)
        );
        let _ = writeln!(out, "  critical path by phase: {}", self.critical_by_phase());
        let _ = writeln!(out, "  longest steps:");
        for b in self.longest(5) {
            let waited = b.waits.as_deref().map(|w| format!(" (waiting for {w})")).unwrap_or_default();
            let _ = writeln!(out, "    {:>8}  {}{waited}", secs(b.duration_ms()), b.id);
        }
        out
    }
}

/// Milliseconds as seconds, one decimal.
pub fn secs(ms: i64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

/// Distinct names in order of first appearance.
fn first_seen<'a>(names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    names.filter(|n| seen.insert(*n)).map(str::to_string).collect()
}
