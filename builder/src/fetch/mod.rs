//! Getting content from upstreams: files over HTTP, images from registries,
//! charts from repositories. Everything lands in the [`crate::cache::Cache`]
//! verified, or not at all.

pub mod charts;
pub mod checksum;
pub mod debian;
pub mod http;
pub mod images;
pub mod scan;

/// Why a fetch failed. Each variant names what the user needs to act.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{artifact}: {url} answered HTTP {status}{hint}")]
    Status {
        artifact: String,
        url: String,
        status: u16,
        hint: String,
    },
    #[error("{artifact}: cannot reach {url} after {attempts} attempts: {why}")]
    Network {
        artifact: String,
        url: String,
        attempts: u32,
        why: String,
    },
    #[error(
        "{artifact}: sha256 mismatch for {url}: expected {expected}, got {actual}. The download or the catalog is wrong; nothing was kept"
    )]
    BadDigest {
        artifact: String,
        url: String,
        expected: String,
        actual: String,
    },
    #[error("{artifact}: the checksum file {url} lists no sha256 for {file}")]
    NoChecksum { artifact: String, url: String, file: String },
    #[error("{artifact}: {url} has no mirror mapping, and --strict-mirrors refuses it; add --mirror {host}=URL")]
    Unmapped { artifact: String, url: String, host: String },
    #[error("{artifact}: {why}")]
    Image { artifact: String, why: String },
    #[error("{artifact}: {why}")]
    Chart { artifact: String, why: String },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl FetchError {
    pub fn io(path: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> FetchError {
        let path = path.to_string();
        move |source| FetchError::Io { path, source }
    }
}

pub use kubexm_bom::diag::error_chain;
