//! The one place an operation's failure becomes an exit code (the README's
//! "Exit codes" table). `kubexm` includes this file too: both binaries run
//! the same operations and must agree.

use kubexm_cli::Class;
use kubexm_installer::DeployError;
use kubexm_installer::ops::error::OpError;

/// The class of one cause in an error's chain that the installer's
/// libraries raised; `None` for the shared table in `kubexm_cli`.
pub fn kind(cause: &(dyn std::error::Error + 'static)) -> Option<Class> {
    if let Some(e) = cause.downcast_ref::<OpError>() {
        return Some(match e {
            OpError::Usage(_) => Class::Usage,
            OpError::Config(_) => Class::Config,
            OpError::Io(_) => Class::Io,
            OpError::Fetch(_) => Class::Fetch,
            OpError::Verify(_) => Class::Verify,
            OpError::Host(_) => Class::Host,
            OpError::Unsupported(_) => Class::Unsupported,
            OpError::Interrupted(_) => Class::Interrupted,
        });
    }
    cause.downcast_ref::<DeployError>().map(|e| match e {
        DeployError::NotSupported(_) => Class::Unsupported,
        DeployError::Config(_) => Class::Config,
    })
}

#[cfg(test)]
mod tests {
    /// Issue 26: every operation failure's exit code is the one the
    /// README's table gives for its meaning.
    #[test]
    fn op_errors_exit_with_the_readme_codes() -> Result<(), String> {
        let readme = include_str!("../../../../README.md");
        let table: Vec<(u8, &str)> = readme
            .lines()
            .skip_while(|l| !l.starts_with("## Exit codes"))
            .skip(1)
            .take_while(|l| !l.starts_with("## "))
            .filter_map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                Some((cells.get(1)?.parse().ok()?, *cells.get(2)?))
            })
            .collect();
        let meaning = [
            "bad flags or arguments",
            "invalid cluster config or catalog",
            "a local file cannot be read or written",
            "an upstream or registry could not be reached or answered wrongly",
            "a digest or signature did not match",
            "a host or deployment step failed",
            "the config asks for something not supported yet",
            "interrupted",
        ];
        for (make, want) in kubexm_installer::ops::error::KINDS.into_iter().zip(meaning) {
            let e = make(anyhow::anyhow!("x"));
            let code = super::kind(&e).map(|c| c as u8).ok_or("an OpError without a class")?;
            let row = table
                .iter()
                .find(|(c, _)| *c == code)
                .ok_or(format!("code {code} is not in the README's table"))?;
            if row.1 != want {
                return Err(format!("{e:?} exits {code}, which the README calls {:?}, not {want:?}", row.1));
            }
        }
        Ok(())
    }
}
