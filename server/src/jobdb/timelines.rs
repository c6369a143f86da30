//! A job's timeline (where its time went: `kubexm_engine::timeline`),
//! stored as JSON by the worker that ran it, when its run ends, whatever
//! its outcome; read by `GET /api/v1/jobs/{id}/timeline` and `kubexm get
//! job ID --timeline`. Pruned with its job.

use super::{JobDb, JobDbError};
use kubexm_engine::timeline::Timeline;

/// SQLite's migration 5.
pub(crate) const MIGRATION_SQLITE: &str = "CREATE TABLE job_timelines (
        job INTEGER PRIMARY KEY REFERENCES jobs(id),
        timeline TEXT NOT NULL
    );";

/// PostgreSQL's migration 4.
pub(crate) const MIGRATION_PG: &str = "CREATE TABLE job_timelines (
        job BIGINT PRIMARY KEY REFERENCES jobs(id),
        timeline TEXT NOT NULL
    );";

impl JobDb {
    /// Stores (replacing) the timeline of job `job`.
    pub async fn put_timeline(&self, job: i64, timeline: &Timeline) -> Result<(), JobDbError> {
        let json = serde_json::to_string(timeline).map_err(|e| self.invalid(format!("job {job}'s timeline: {e}")))?;
        let statements = vec![
            ("DELETE FROM job_timelines WHERE job = $1".to_string(), vec![job.into()]),
            (
                "INSERT INTO job_timelines (job, timeline) VALUES ($1, $2)".to_string(),
                vec![job.into(), json.into()],
            ),
        ];
        self.backend.execute_all(statements).await?;
        Ok(())
    }

    /// The timeline of job `job`, if its run stored one.
    pub async fn timeline(&self, job: i64) -> Result<Option<Timeline>, JobDbError> {
        let rows = self
            .backend
            .query("SELECT timeline FROM job_timelines WHERE job = $1", vec![job.into()])
            .await?;
        let Some(row) = rows.first() else { return Ok(None) };
        let text = self.text(row, 0)?;
        serde_json::from_str(&text).map(Some).map_err(|e| {
            self.invalid(format!(
                "job {job}'s stored timeline cannot be read ({e}); was it written by another kubexm version?"
            ))
        })
    }
}
