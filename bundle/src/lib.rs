//! kubexm-bundle: the bundle format both sides share (layout, `bundle.yaml`,
//! OCI image layout, digests, signatures). It lands with the builder issue;
//! until then this crate only fixes the paths the architecture names.

/// Where the installer unpacks bundles: `<BUNDLES_DIR>/<bundle-digest>/`.
pub const BUNDLES_DIR: &str = "/var/lib/kubexm/bundles";
/// The installer's state database.
pub const STATE_DB: &str = "/var/lib/kubexm/state.db";
/// The CAs the installer generates, mode 0700.
pub const PKI_DIR: &str = "/var/lib/kubexm/pki";
