//! What an operation's failure was, for whoever triggered it: the binaries
//! map each kind to their exit code (the README's table), the API server to
//! a job's failure. The libraries name the kind of failure, never a process
//! exit code.

/// One operation's failure, by kind; the error inside says what happened
/// and what to do.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    /// The request itself is wrong (flags, arguments, options).
    #[error("{0:#}")]
    Usage(anyhow::Error),
    /// cluster.yaml or a catalog is invalid for what was asked.
    #[error("{0:#}")]
    Config(anyhow::Error),
    /// A local file or directory cannot be read or written.
    #[error("{0:#}")]
    Io(anyhow::Error),
    /// An upstream or registry could not be reached or answered wrongly.
    #[error("{0:#}")]
    Fetch(anyhow::Error),
    /// A digest or signature did not match.
    #[error("{0:#}")]
    Verify(anyhow::Error),
    /// A host or deployment step failed.
    #[error("{0:#}")]
    Host(anyhow::Error),
    /// Asks for something this release does not implement yet.
    #[error("{0:#}")]
    Unsupported(anyhow::Error),
    /// Stopped before it finished (Ctrl-C, a cancel, a worker gone).
    #[error("{0:#}")]
    Interrupted(anyhow::Error),
}

/// Every kind, one example each (the binaries' exit-code tables are tested
/// against this list).
pub const KINDS: [fn(anyhow::Error) -> OpError; 8] = [
    OpError::Usage,
    OpError::Config,
    OpError::Io,
    OpError::Fetch,
    OpError::Verify,
    OpError::Host,
    OpError::Unsupported,
    OpError::Interrupted,
];

/// `e` as a failure of `kind` (`op(OpError::Host, e)`), ready for `?`.
pub fn op(kind: fn(anyhow::Error) -> OpError, e: impl Into<anyhow::Error>) -> anyhow::Error {
    anyhow::Error::new(kind(e.into()))
}

impl OpError {
    /// The first operation failure in `err`'s chain.
    pub fn find(err: &anyhow::Error) -> Option<&OpError> {
        err.chain().find_map(|c| c.downcast_ref::<OpError>())
    }
}
