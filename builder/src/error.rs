//! What a build's failure was, by kind: `kubexm-bundle` maps each kind to
//! its exit code (the README's table); the library never names one.

/// One build failure, by kind; the error inside says what happened and
/// what to do.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Bad flags or arguments (`--mirror`, a manifest reference).
    #[error("{0:#}")]
    Usage(anyhow::Error),
    /// cluster.yaml or a catalog cannot be served.
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
    /// Asks for something this release does not implement yet.
    #[error("{0:#}")]
    Unsupported(anyhow::Error),
}

/// `e` as a build failure of `kind`, ready for `?`.
pub fn build_err(kind: fn(anyhow::Error) -> BuildError, e: impl Into<anyhow::Error>) -> anyhow::Error {
    anyhow::Error::new(kind(e.into()))
}
