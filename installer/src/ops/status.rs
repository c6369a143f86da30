//! `kubexm-install status`: a job from the state database, each module and
//! host, and the log tail of each failed step.

use std::path::Path;

use crate::ops::error::{OpError, op};

/// The description of `job` (the latest when `None`) in the state database at `state`.
pub fn status(state: &Path, job: Option<i64>) -> anyhow::Result<String> {
    if !state.exists() {
        return Err(op(
            OpError::Io,
            anyhow::anyhow!("no state database at {}; pass --state", state.display()),
        ));
    }
    let st = crate::engine::state::State::open(state, vec![])?;
    crate::engine::jobs::describe(&st, job)
}
