//! `mirror`: verify and unpack a bundle, then push its images into a site
//! registry (for sites that run their own registry instead of kubexm's).

use std::path::PathBuf;

use crate::ops::error::{OpError, op};

use crate::mirror::{MirrorError, MirrorOptions, MirrorSummary, Push};
use crate::unpack::Trust;

/// What to mirror where.
#[derive(Debug, Clone)]
pub struct MirrorRequest {
    pub bundle: PathBuf,
    pub trust: Trust,
    /// The installer's state root (the bundle is unpacked under it).
    pub root: PathBuf,
    /// `host[:port][/prefix]`, with or without a scheme.
    pub registry: String,
    pub push: Push,
}

/// What a mirror run did, and to which registry.
#[derive(Debug, Clone)]
pub struct MirrorReport {
    /// `host[:port]`.
    pub registry: String,
    pub summary: MirrorSummary,
}

pub fn mirror(r: MirrorRequest) -> anyhow::Result<MirrorReport> {
    let u = super::unpack(&r.bundle, &r.trust, &r.root)?;
    let (registry, prefix) = super::split_registry(&r.registry);
    let opts = MirrorOptions {
        bundle_dir: u.dir,
        registry: registry.clone(),
        prefix,
        push: r.push,
    };
    let rt = tokio::runtime::Runtime::new()?;
    let summary = rt.block_on(crate::mirror::mirror(&opts)).map_err(|e| match e {
        MirrorError::Collision { .. } => op(OpError::Usage, e),
        _ => op(OpError::Fetch, e),
    })?;
    Ok(MirrorReport { registry, summary })
}
