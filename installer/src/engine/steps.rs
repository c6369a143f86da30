//! Steps built from shell commands: the building block of most phases.

use std::time::Duration;

use futures_util::future::BoxFuture;

use super::plan::{Check, Step, StepError};
use super::transport::Transport;

/// A step whose check and apply are shell commands. The check holds when it
/// exits 0; without a check, the state database decides.
pub struct Shell {
    pub name: String,
    pub check: Option<String>,
    pub apply: String,
    pub timeout: Duration,
}

impl Shell {
    pub fn new(name: &str, check: Option<&str>, apply: &str) -> Shell {
        Shell {
            name: name.into(),
            check: check.map(str::to_string),
            apply: apply.into(),
            timeout: Duration::from_secs(300),
        }
    }
}

impl Step for Shell {
    fn name(&self) -> &str {
        &self.name
    }

    fn check<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<Check, StepError>> {
        Box::pin(async move {
            match &self.check {
                None => Ok(Check::Unknown),
                Some(c) => Ok(if t.run(c, self.timeout).await?.success() {
                    Check::Holds
                } else {
                    Check::Missing
                }),
            }
        })
    }

    fn apply<'a>(&'a self, t: &'a dyn Transport) -> BoxFuture<'a, Result<String, StepError>> {
        Box::pin(async move {
            let out = t.run(&self.apply, self.timeout).await?;
            let log = format!("{}{}", out.stdout, out.stderr);
            if out.success() {
                Ok(log)
            } else {
                Err(StepError::Failed(format!(
                    "`{}` exited with {:?}: {}",
                    self.apply.chars().take(200).collect::<String>(),
                    out.code,
                    out.stderr.trim()
                )))
            }
        })
    }
}
