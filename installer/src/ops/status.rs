//! `kubexm-install status`: a job from the state database, each module and
//! host, and the log tail of each failed step; or its timeline, written as
//! an SVG picture or as JSON; or a cluster's record (what its last job
//! applied).

use std::path::Path;

use crate::engine::state::State;
use crate::engine::timeline::{Timeline, svg};
use crate::ops::error::{OpError, op};

/// The state database at `state`, refused when there is none.
fn open(state: &Path) -> anyhow::Result<State> {
    if !state.exists() {
        return Err(op(
            OpError::Io,
            anyhow::anyhow!("no state database at {}; pass --state", state.display()),
        ));
    }
    Ok(State::open(state, vec![])?)
}

/// The description of `job` (the latest when `None`) in the state database at `state`.
pub fn status(state: &Path, job: Option<i64>) -> anyhow::Result<String> {
    crate::engine::jobs::describe(&open(state)?, job)
}

/// The record of `cluster` in the state database at `state`: what its
/// last job applied, whatever the job's result.
pub fn record(state: &Path, cluster: &str) -> anyhow::Result<kubexm_bom::record::ClusterRecord> {
    let st = open(state)?;
    let Some((job, body)) = st.last_record(cluster, false)? else {
        let known = st.recorded_clusters()?;
        let known = if known.is_empty() {
            "none has a record yet".to_string()
        } else {
            format!("clusters with a record: {}", known.join(", "))
        };
        return Err(op(
            OpError::Usage,
            anyhow::anyhow!(
                "no record of cluster {cluster} in the state database {} ({known}): it was never installed with \
                 this database, or `delete cluster` forgot it; a cluster installed before kubexm kept records gets \
                 one when its install is run again (done steps are skipped)",
                state.display()
            ),
        ));
    };
    parse_record(cluster, job, &body)
}

/// A record's JSON (`body`, of `job`) read back.
pub fn parse_record(cluster: &str, job: i64, body: &str) -> anyhow::Result<kubexm_bom::record::ClusterRecord> {
    serde_json::from_str(body).map_err(|e| {
        op(
            OpError::Usage,
            anyhow::anyhow!(
                "the record of cluster {cluster} (job {job}) in the state database is not one this kubexm reads ({e}); \
                 run the install again with this kubexm to write a new one"
            ),
        )
    })
}

/// How a timeline is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimelineFormat {
    Svg,
    Json,
}

/// The timeline of `job` (the latest when `None`) in the state database at `state`.
pub fn timeline(state: &Path, job: Option<i64>) -> anyhow::Result<Timeline> {
    let st = open(state)?;
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    match rt.block_on(Timeline::load(&st, job))? {
        Some(t) => Ok(t),
        None => Err(op(
            OpError::Usage,
            anyhow::anyhow!(match job {
                Some(id) => format!(
                    "no job {id} in the state database {}; `kubexm-install status` lists the latest",
                    state.display()
                ),
                None => format!("no jobs yet in the state database {}", state.display()),
            }),
        )),
    }
}

/// A timeline written earlier as JSON.
pub fn read_timeline(file: &Path) -> anyhow::Result<Timeline> {
    let text = fs_err::read_to_string(file).map_err(|e| op(OpError::Io, anyhow::anyhow!("{e}")))?;
    serde_json::from_str(&text).map_err(|e| {
        op(
            OpError::Usage,
            anyhow::anyhow!(
                "{}: not a kubexm timeline (line {}, column {}): {e}",
                file.display(),
                e.line(),
                e.column()
            ),
        )
    })
}

/// A timeline as the bytes of `format`.
pub fn render(t: &Timeline, format: TimelineFormat) -> anyhow::Result<Vec<u8>> {
    Ok(match format {
        TimelineFormat::Svg => svg::render(t).into_bytes(),
        TimelineFormat::Json => {
            let mut v = serde_json::to_vec_pretty(t)?;
            v.push(b'\n');
            v
        }
    })
}

/// Writes a timeline to `file`, whole or not at all.
pub fn write_timeline(t: &Timeline, format: TimelineFormat, file: &Path) -> anyhow::Result<()> {
    kubexm_bundle::files::write_atomic(file, &render(t, format)?)
        .map_err(|e| op(OpError::Io, anyhow::anyhow!("writing the timeline to {}: {e}", file.display())))
}
